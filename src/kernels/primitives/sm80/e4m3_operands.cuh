#pragma once

// mma.sync operands read from tiles of e4m3 bytes (an FP8 KV cache's K and V, FP8 Q) and
// converted exactly to fp16 on the way into registers, for warp_gemm's fp16 MMAs: e4m3's
// values (3 mantissa bits, exponents 2^-9 to 2^8) are all fp16 values, so S = Q·Kᵀ and
// O = P·V accumulate in fp32 on the dequantised inputs with P in fp16, as precise as the
// 16-bit kernels. Decoding reads half the bytes of a 16-bit cache, and its tensor work
// is small beside them.
//
// The tiles are SmemTile<Rows, Cols / 2, true>: rows of Cols bytes, one 16-byte chunk
// holding 16 e4m3 values. ldmatrix on such a chunk gives lane (g = lane / 4, q = lane % 4)
// the four bytes 4q .. 4q + 3 of row g, so:
//  - Q·Kᵀ (k = the head dim): within each k16 tile (one chunk), the fragments' k positions
//    2q, 2q + 1 hold bytes 4q, 4q + 1 and k positions 2q + 8, 2q + 9 hold bytes 4q + 2,
//    4q + 3. A and B take the same order, so the dot products are the same sums.
//  - P·V (k = the keys, n = V's columns): the keys' order is fixed by P, so each lane reads
//    four bytes (four consecutive columns) of each of its four keys and the columns are
//    permuted instead: n position g of n8 tile 4m + i is column 32m + 4g + i
//    (the column order). O's accumulators then hold, for row lane / 4 (+ 8), the eight
//    consecutive columns 32m + 8q .. 32m + 8q + 7 of each m (e4m3_output_run).
// The conversion is cuda_fp8.h's (cvt.rn.f16x2.e4m3x2 on sm_89 and later).

#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm80/warp_gemm.cuh"
#include "kernels/primitives/smem_tile.cuh"

namespace flash_attention {

// Two e4m3 values (the low 16 bits, the lower byte first) as one f16x2 register, exactly.
__device__ __forceinline__ std::uint32_t e4m3x2_to_f16x2(std::uint32_t pair) {
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
    return std::uint32_t{h.x} | (std::uint32_t{h.y} << 16);
}

// The A operand (m16 x k16 tiles) of S = Q·Kᵀ from an e4m3 tile: SmemA's lanes and
// fragments, but each ldmatrix.x4 reads two k16 tiles (two chunks) of 16 rows.
template <class Tile, int MTiles>
struct E4m3SmemA : SmemA<Tile, MTiles> {
    using SmemA<Tile, MTiles>::SmemA;
    template <int Step>
    using Frags = typename SmemA<Tile, MTiles>::template Frags<Step>;

    template <int Step>
    __device__ __forceinline__ void load(Frags<Step>& f, int step) const {
        static_assert(Step % 2 == 0, "an ldmatrix.x4 reads two k16 tiles");
#pragma unroll
        for (int mt = 0; mt < MTiles; ++mt) {
#pragma unroll
            for (int kt = 0; kt < Step; kt += 2) {
                std::uint32_t x[4];  // rows 0-7 / 8-15 of chunk kt, then of chunk kt + 1
                ptx::ldmatrix_x4(x, this->lane_row.at(mt * 16, step * Step + kt));
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    std::uint32_t(&a)[4] = f.r[mt][kt + half];
                    a[0] = e4m3x2_to_f16x2(x[2 * half]);
                    a[1] = e4m3x2_to_f16x2(x[2 * half + 1]);
                    a[2] = e4m3x2_to_f16x2(x[2 * half] >> 16);
                    a[3] = e4m3x2_to_f16x2(x[2 * half + 1] >> 16);
                }
            }
        }
    }
};

// The B operand of S = Q·Kᵀ from an e4m3 (n x k) tile, K's: ldmatrix.x4 reads two n8 tiles
// of two k16 tiles, matrix m being n8 tile m / 2 and chunk m % 2 (SmemB's lanes).
template <class Tile, int NTiles>
struct E4m3SmemB {
    static_assert(NTiles % 2 == 0, "ldmatrix.x4 loads n8 tiles in pairs");
    LaneRowPointer<Tile> lane_row;

    __device__ __forceinline__ explicit E4m3SmemB(std::uint32_t tile_base)
        : lane_row(tile_base, (lane_id() / 16) * 8 + lane_id() % 8, lane_id() / 8 % 2) {}

    template <int Step>
    struct Frags {
        std::uint32_t r[Step][NTiles][2];
    };

    template <int Step>
    __device__ __forceinline__ void load(Frags<Step>& f, int step) const {
        static_assert(Step % 2 == 0, "an ldmatrix.x4 reads two k16 tiles");
#pragma unroll
        for (int kt = 0; kt < Step; kt += 2) {
#pragma unroll
            for (int pair = 0; pair < NTiles / 2; ++pair) {
                std::uint32_t x[4];  // (n tile, chunk): (0, 0), (0, 1), (1, 0), (1, 1)
                ptx::ldmatrix_x4(x, lane_row.at(16 * pair, step * Step + kt));
#pragma unroll
                for (int m = 0; m < 4; ++m) {
                    std::uint32_t(&b)[2] = f.r[kt + m % 2][2 * pair + m / 2];
                    b[0] = e4m3x2_to_f16x2(x[m]);
                    b[1] = e4m3x2_to_f16x2(x[m] >> 16);
                }
            }
        }
    }
};

// The B operand of O = P·V from an e4m3 (k x n) tile, V's (keys by rows): lane (g, q) reads
// the four bytes at column 32m + 4g of keys 2q, 2q + 1, 2q + 8 and 2q + 9 of each k16 tile
// and pairs them by key with prmt (__byte_perm), giving n8 tiles 4m .. 4m + 3 (the column order
// above). Under the swizzle of rows of 128 bytes or more the 32 lanes' words fall in 32 distinct
// banks; on d_head 64's 64-byte rows (SmemTile's (row / 2) % 4 swizzle) two lanes share a bank.
template <class Tile, int NTiles>
struct E4m3SmemValues {
    static_assert(NTiles % 4 == 0, "a lane's word of a key covers four n8 tiles");
    std::uint32_t tile_base;

    __device__ __forceinline__ explicit E4m3SmemValues(std::uint32_t base) : tile_base(base) {}

    template <int Step>
    struct Frags {
        std::uint32_t r[Step][NTiles][2];
    };

    template <int Step>
    __device__ __forceinline__ void load(Frags<Step>& f, int step) const {
        const int g = lane_id() / 4, q = lane_id() % 4;
#pragma unroll
        for (int kt = 0; kt < Step; ++kt) {
            const int key0 = 16 * (step * Step + kt) + 2 * q;
#pragma unroll
            for (int m = 0; m < NTiles / 4; ++m) {
                const int byte = 32 * m + 4 * g;
                std::uint32_t w[4];  // keys key0, key0 + 1, key0 + 8, key0 + 9
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int key = key0 + j % 2 + 8 * (j / 2);
                    w[j] = ptx::ld_shared_4(tile_base + Tile::chunk_offset(key, byte / 16) +
                                            byte % 16);
                }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    // Bytes i of both keys side by side: {lo key, hi key} per column.
                    const std::uint32_t cols01 = __byte_perm(w[2 * h], w[2 * h + 1], 0x5140);
                    const std::uint32_t cols23 = __byte_perm(w[2 * h], w[2 * h + 1], 0x7362);
                    f.r[kt][4 * m][h] = e4m3x2_to_f16x2(cols01);
                    f.r[kt][4 * m + 1][h] = e4m3x2_to_f16x2(cols01 >> 16);
                    f.r[kt][4 * m + 2][h] = e4m3x2_to_f16x2(cols23);
                    f.r[kt][4 * m + 3][h] = e4m3x2_to_f16x2(cols23 >> 16);
                }
            }
        }
    }
};

// The eight consecutive columns 32m + 8q .. + 7 of P·V's accumulators (the order above)
// that lane q (= lane % 4) holds for row half h (row lane / 4 + 8h), in column order.
template <int NT>
__device__ __forceinline__ void e4m3_output_run(const float (&o)[NT][4], int m, int h,
                                                float (&run)[8]) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
            run[4 * e + i] = o[4 * m + i][2 * h + e];
    }
}

}  // namespace flash_attention
