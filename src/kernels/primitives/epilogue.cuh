#pragma once

// The end of a tile, shared by both families: each row's log-sum-exp, and O's
// accumulators rounded to 16 bits into a shared-memory tile, then to GMEM (sm90 writes
// its own tile type and stores it with TMA: sm90/epilogue.cuh).

#include <cstdint>

#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/ptx.cuh"

namespace flash_attention {

// Stores the log-sum-exp of a warp's rows first_row + [0, 16 * MT) that lie below seq_q
// into lse[row]. Called by one lane of each quad: the four hold the same rows' statistics.
template <int MT, class Softmax>
__device__ __forceinline__ void store_lse(float* lse, int first_row, int seq_q,
                                          const Softmax& softmax) {
    const int lane = threadIdx.x % warp_size;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = first_row + mt * mma_m + lane / 4 + 8 * h;
            if (row < seq_q)
                lse[row] = softmax.log_sum_exp(mt, h);
        }
    }
}

// A quad's 4 x 4 transpose of 32-bit words: lane i of each quad holds v[c] = a[i][c] and ends
// with v[c] = a[c][i]. Two rounds of two shuffles: the off-diagonal 2 x 2 blocks swap between
// lanes i and i ^ 2, then each block's off-diagonal words between lanes i and i ^ 1. Every lane
// of the warp takes part.
__device__ __forceinline__ void quad_transpose(std::uint32_t (&v)[4]) {
    const int lane = threadIdx.x % warp_size;
#pragma unroll
    for (int round = 0; round < 2; ++round) {
        const int bit = round == 0 ? 2 : 1;  // the lane's and the word index's bit this round
        const bool high = (lane & bit) != 0;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            // The word of the block this lane gives away: index bit `bit` the lane's opposite,
            // the other bit k.
            const int keep = round == 0 ? k : 2 * k;          // index with that bit clear
            const int give = round == 0 ? k + 2 : 2 * k + 1;  // index with it set
            const std::uint32_t sent = high ? v[keep] : v[give];
            const std::uint32_t got = __shfl_xor_sync(0xffffffffu, sent, bit);
            if (high)
                v[keep] = got;
            else
                v[give] = got;
        }
    }
}

// Stores the first NT n8 tiles of a warp's m16n8 fp32 accumulators (one m16 tile: a quad's
// rows lane / 4 and + 8), scaled and rounded to 16 bits, straight to global memory as whole
// 16-byte pieces: a quad holds 2 x 16 bits of each of 4 consecutive n8 tiles a lane, which
// quad_transpose turns into all 8 columns of one tile a lane. row_out(h) is the first element
// of the lane's row h (16-byte aligned), or nullptr where that row is not stored; a quad's
// lanes share their rows. Every lane of the warp takes part. Against each lane's 4-byte stores
// (16 bytes of each of 8 rows a warp instruction: half sectors) FP8's bf16 O ran +12-24% faster
// at 512 keys (H100, 2026-12-07).
template <DType dtype, int NT, int N, class RowOut>
__device__ __forceinline__ void store_accumulator_rows(const float (&acc)[N][4], float scale,
                                                       const RowOut& row_out) {
    static_assert(NT % 4 == 0 && NT <= N, "the accumulators' columns in groups of 4 n8 tiles");
    const int lane = threadIdx.x % warp_size;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        auto* const out = row_out(h);
#pragma unroll
        for (int g = 0; g < NT / 4; ++g) {
            std::uint32_t w[4];
#pragma unroll
            for (int c = 0; c < 4; ++c)
                w[c] = ptx::pack_rn<dtype>(acc[4 * g + c][2 * h] * scale,
                                           acc[4 * g + c][2 * h + 1] * scale);
            quad_transpose(w);
            if (out != nullptr)
                ptx::st_global_16(out + (4 * g + lane % 4) * 8, uint4{w[0], w[1], w[2], w[3]});
        }
    }
}

// Stores a warp's m16n8 fp32 accumulators, rounded to 16 bits, into its rows of a
// shared-memory tile. A quad writes one 16-byte chunk per row; with the swizzle the
// 8 rows of a store land in distinct bank groups.
template <DType dtype, class Tile, int MT, int NT>
__device__ __forceinline__ void store_accumulators_RF2SM(const float (&o)[MT][NT][4],
                                                         std::uint32_t tile_base, int warp_row0) {
    const int lane = threadIdx.x % warp_size;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int row = warp_row0 + mt * mma_m + lane / 4;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const std::uint32_t col_bytes = (lane % 4) * 4;
            ptx::st_shared_4(tile_base + Tile::chunk_offset(row, nt) + col_bytes,
                             ptx::pack_rn<dtype>(o[mt][nt][0], o[mt][nt][1]));
            ptx::st_shared_4(tile_base + Tile::chunk_offset(row + 8, nt) + col_bytes,
                             ptx::pack_rn<dtype>(o[mt][nt][2], o[mt][nt][3]));
        }
    }
}

// Copies the first `valid_rows` of `Rows` rows of a shared-memory tile, starting at
// row0, to GMEM with one warp; row r goes to gmem_row(r), a T*. Going through SMEM turns
// the accumulators' scattered 4-byte pieces into 16-byte stores that cover whole rows:
// fully coalesced writes. Each row's first RowChunks 16-byte chunks (O narrower than the Q
// tile it is staged in: V's head dim below Q's).
template <class Tile, int Rows, int RowChunks = Tile::chunks_per_row, class GmemRow>
__device__ __forceinline__ void copy_rows_SM2GM(std::uint32_t tile_base, int row0,
                                                const GmemRow& gmem_row, int valid_rows) {
    static_assert(RowChunks <= Tile::chunks_per_row, "chunks of the tile's rows");
    constexpr int chunks = Rows * RowChunks;
    static_assert(chunks % warp_size == 0, "every lane stores the same number of chunks");
    const int lane = threadIdx.x % warp_size;
#pragma unroll
    for (int i = 0; i < chunks / warp_size; ++i) {
        const int c = lane + warp_size * i;
        const int r = c / RowChunks;
        const int chunk = c % RowChunks;
        if (r < valid_rows) {
            const uint4 v = ptx::ld_shared_16(tile_base + Tile::chunk_offset(row0 + r, chunk));
            ptx::st_global_16(gmem_row(r) + chunk * 8, v);
        }
    }
}

}  // namespace flash_attention
