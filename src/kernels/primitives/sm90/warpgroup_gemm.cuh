#pragma once

// The two GEMMs of attention as warpgroup MMAs (wgmma, sm_90a) on swizzled shared-memory
// tiles (SwizzledTile, as tma::load_tile() lays them out).
// Accumulators are a warpgroup's m64 tile, each warp holding 16 rows as m16n8 tiles
// (float[N / 8][4], the layout of mma.sync's accumulators), so the online softmax and
// the masks of the sm80 family apply to them unchanged.

#include <cstdint>

#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm90/ptx.cuh"
#include "kernels/primitives/sm90/swizzled_tile.cuh"

namespace flash_attention {

// S (64 x N) = Q (this warpgroup's 64 rows x D) · K (N x D)ᵀ, both operands in shared
// memory; overwrites S. Issued, not waited for: the caller commits and waits.
template <DType dtype, class QTile, class KTile>
__device__ __forceinline__ void warpgroup_gemm_qk(float (&s)[KTile::rows / 8][4],
                                                  std::uint32_t q_smem, std::uint32_t k_smem) {
    static_assert(QTile::rows == 64 && QTile::cols == KTile::cols, "Q (64 x D), K (N x D)");
#pragma unroll
    for (int kk = 0; kk < QTile::cols / 16; ++kk) {
        const std::uint64_t a = QTile::k_major(q_smem, kk);
        const std::uint64_t b = KTile::k_major(k_smem, kk);
        ptx::wgmma_ss<dtype, KTile::rows, false>(s, a, b, kk > 0);
    }
}

// This warp's 16 rows of a warpgroup's 64 x D tile as m16k16 A fragments (ldmatrix.x4:
// lanes 0-15 address rows 0-15 at the k-tile's first 8 columns, lanes 16-31 at its last
// 8). A phase's 8 lanes read 8 rows whose chunks the swizzle spreads over 8 bank groups.
template <class Tile>
__device__ __forceinline__ void load_a_fragments(std::uint32_t (&a)[Tile::cols / 16][4],
                                                 std::uint32_t tile_smem, int warp_row0) {
    const int lane = threadIdx.x % warp_size;
    const int row = warp_row0 + lane % 16;
#pragma unroll
    for (int kk = 0; kk < Tile::cols / 16; ++kk) {
        ptx::ldmatrix_x4(a[kk], tile_smem + Tile::chunk_offset(row, kk * 2 + lane / 16));
    }
}

// S (64 x N) = Q (this warp's rows as register fragments) · K (N x D)ᵀ, K from shared
// memory: the same GEMM as above with shared memory serving only K.
template <DType dtype, class KTile>
__device__ __forceinline__ void warpgroup_gemm_qk(float (&s)[KTile::rows / 8][4],
                                                  const std::uint32_t (&q)[KTile::cols / 16][4],
                                                  std::uint32_t k_smem) {
#pragma unroll
    for (int kk = 0; kk < KTile::cols / 16; ++kk) {
        ptx::wgmma_rs<dtype, KTile::rows, false>(s, q[kk], KTile::k_major(k_smem, kk), kk > 0);
    }
}

// O (64 x D) += P (64 x K, this warp's rows as m16k16 register fragments) · V (K x D),
// V MN-major in shared memory: one wgmma of N = D a k-step. At D = 256 that is half the
// instructions of two N = 128 halves, each of which read P's fragments again: 0.6-1.3%
// faster where every round agreed (16k keys non-causal, 1k both ways), level inside the
// rounds' spread elsewhere (H200, 2026-11-26, docs/PERF.md). K may stop short of V's rows:
// the block's first K keys (a half block's, mainloop.cuh).
template <DType dtype, class VTile, int K = VTile::rows>
__device__ __forceinline__ void warpgroup_gemm_pv(float (&o)[VTile::cols / 8][4],
                                                  const std::uint32_t (&p)[K / 16][4],
                                                  std::uint32_t v_smem) {
    static_assert(K <= VTile::rows, "P covers at most V's rows");
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk)
        ptx::wgmma_rs<dtype, VTile::cols, true>(o, p[kk], VTile::mn_major(v_smem, kk), true);
}

// The same with P from shared memory (PTile: this warpgroup's 64 rows x K keys, K-major, as
// store_a_fragments() writes them): shared memory serves both operands.
template <DType dtype, class PTile, class VTile, int K = VTile::rows>
__device__ __forceinline__ void warpgroup_gemm_pv(float (&o)[VTile::cols / 8][4],
                                                  std::uint32_t p_smem, std::uint32_t v_smem) {
    static_assert(K <= VTile::rows && K <= PTile::cols, "P covers at most V's rows");
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
        ptx::wgmma_ss<dtype, VTile::cols, true>(o, PTile::k_major(p_smem, kk),
                                                VTile::mn_major(v_smem, kk), true);
    }
}

// FP8: O (64 x N) += P (64 x K e4m3, this warp's rows as m16k32 register fragments, the keys
// of each k-step in kernels/fp8.hpp's order) · V's N columns from vt_smem on, read K-major
// from its transposed copy (VtTile: V's columns as rows of K keys, 16-bit columns counting
// pairs of keys): 8-bit wgmma reads no MN-major operand. accumulate = false: O = P·V.
template <class VtTile, int N = VtTile::rows, int K = 2 * VtTile::cols>
__device__ __forceinline__ void warpgroup_gemm_pv_e4m3(float (&o)[N / 8][4],
                                                       const std::uint32_t (&p)[K / 32][4],
                                                       std::uint32_t vt_smem, bool accumulate) {
    static_assert(K <= 2 * VtTile::cols && N <= VtTile::rows, "P and O within the copy");
#pragma unroll
    for (int kk = 0; kk < K / 32; ++kk) {
        ptx::wgmma_rs<DType::E4M3, N, false>(o, p[kk], VtTile::k_major(vt_smem, kk),
                                             kk > 0 || accumulate);
    }
}

// FP8: S's fp32 accumulators (this thread's NT n8 tiles) as P's e4m3 A fragments of NT / 4
// k-steps of 32 keys, packed in the accumulators' own key order (kernels/fp8.hpp): register i
// of k-step kt from tiles 4 kt + 2 (i / 2) and the next, the rows of i % 2.
template <int NT>
__device__ __forceinline__ void accumulators_to_e4m3_fragments(const float (&s)[NT][4],
                                                               std::uint32_t (&p)[NT / 4][4]) {
#pragma unroll
    for (int kt = 0; kt < NT / 4; ++kt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int t = 4 * kt + 2 * (i / 2), e = 2 * (i % 2);
            p[kt][i] = ptx::pack_e4m3x4(s[t][e], s[t][e + 1], s[t + 1][e], s[t + 1][e + 1]);
        }
    }
}

// This warp's 16 rows of m16k16 A fragments into a warpgroup's 64 x D tile: the inverse of
// load_a_fragments() (stmatrix.x4: register i of k-tile kk is matrix i, rows 8 (i % 2) and
// columns 16 kk + 8 (i / 2), whose 16-byte rows lanes 8i..8i+7 address).
template <class Tile, int KT>
__device__ __forceinline__ void store_a_fragments(const std::uint32_t (&a)[KT][4],
                                                  std::uint32_t tile_smem, int warp_row0) {
    const int lane = threadIdx.x % warp_size;
    const int row = warp_row0 + lane % 16;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
        ptx::stmatrix_x4(tile_smem + Tile::chunk_offset(row, kk * 2 + lane / 16), a[kk]);
}

}  // namespace flash_attention
