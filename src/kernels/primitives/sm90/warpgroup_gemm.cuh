#pragma once

// The two GEMMs of attention as warpgroup MMAs (wgmma, sm_90a) on 128-byte-swizzled
// shared-memory tiles laid out by tma::load_tile(): [d_head / 64][rows][64] sub-tiles.
// Accumulators are a warpgroup's m64 tile, each warp holding 16 rows as m16n8 tiles
// (float[N / 8][4], the layout of mma.sync's accumulators), so the online softmax and
// the masks of the sm80 family apply to them unchanged.

#include <cstdint>

#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm90/ptx.cuh"

namespace flash_attention {

// PTX ISA "Matrix Descriptor Format" (wgmma): start address, leading and stride byte
// offsets (all in 16-byte units), and the swizzle mode, 1 = 128-byte.
__device__ __forceinline__ std::uint64_t smem_descriptor_128b(std::uint32_t address,
                                                              std::uint32_t leading_bytes,
                                                              std::uint32_t stride_bytes) {
    return static_cast<std::uint64_t>((address & 0x3FFFF) >> 4) |
           static_cast<std::uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16 |
           static_cast<std::uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32 | std::uint64_t{1} << 62;
}

// A K-major operand (rows of k contiguous): 8-row core-matrix groups are 1024 bytes apart;
// the leading offset is unused with swizzling. Within a 64-wide sub-tile, k-step kk
// starts 32 bytes (16 elements) further into each 128-byte row: the hardware applies the
// swizzle to the full address, so the shifted start stays consistent with TMA's layout.
__device__ __forceinline__ std::uint64_t k_major_descriptor(std::uint32_t address) {
    return smem_descriptor_128b(address, 16, 1024);
}

// An MN-major operand (rows of n contiguous, e.g. V as the B of P·V): 8 k-rows of 128
// bytes form a 1024-byte group; the next 64 columns of n are a sub-tile further on.
__device__ __forceinline__ std::uint64_t mn_major_descriptor(std::uint32_t address,
                                                             std::uint32_t sub_tile_bytes) {
    return smem_descriptor_128b(address, sub_tile_bytes, 1024);
}

// S (64 x N) = Q (this warpgroup's 64 rows x D) · K (N x D)ᵀ, both operands in shared
// memory; overwrites S. Issued, not waited for: the caller commits and waits.
template <DType dtype, int D, int N>
__device__ __forceinline__ void warpgroup_gemm_qk(float (&s)[N / 8][4], std::uint32_t q_smem,
                                                  std::uint32_t k_smem) {
    static_assert(D % 64 == 0, "whole 64-column sub-tiles");
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const std::uint32_t column = (kk % 4) * 32;  // bytes into the 128-byte row
        const std::uint64_t a = k_major_descriptor(q_smem + (kk / 4) * (64 * 128) + column);
        const std::uint64_t b = k_major_descriptor(k_smem + (kk / 4) * (N * 128) + column);
        ptx::wgmma_ss<dtype, N, false>(s, a, b, kk > 0);
    }
}

// This warp's 16 rows of a warpgroup's 64 x D tile in TMA's 128-byte-swizzled layout, as
// m16k16 A fragments (ldmatrix.x4: lanes 0-15 address rows 0-15 at the k-tile's first 8
// columns, lanes 16-31 at its last 8). A phase's 8 lanes read 8 rows whose 16-byte chunks
// the swizzle puts in 8 different bank groups: no conflicts.
template <int D>
__device__ __forceinline__ void load_a_fragments_128b(std::uint32_t (&a)[D / 16][4],
                                                      std::uint32_t tile_smem, int warp_row0) {
    const int lane = threadIdx.x % 32;
    const int row = warp_row0 + lane % 16;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int chunk = (kk % 4) * 2 + lane / 16;
        ptx::ldmatrix_x4(
            a[kk], tile_smem + (kk / 4) * (64 * 128) + row * 128 + ((chunk ^ (row % 8)) * 16));
    }
}

// S (64 x N) = Q (this warp's rows as register fragments) · K (N x D)ᵀ, K from shared
// memory: the same GEMM as above with shared memory serving only K.
template <DType dtype, int D, int N>
__device__ __forceinline__ void warpgroup_gemm_qk(float (&s)[N / 8][4],
                                                  const std::uint32_t (&q)[D / 16][4],
                                                  std::uint32_t k_smem) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const std::uint64_t b = k_major_descriptor(k_smem + (kk / 4) * (N * 128) + (kk % 4) * 32);
        ptx::wgmma_rs<dtype, N, false>(s, q[kk], b, kk > 0);
    }
}

// O (64 x D) += P (64 x K, this warp's rows as m16k16 register fragments) · V (K x D),
// V MN-major in shared memory. N of one wgmma is at most 128 here: D = 256 takes two.
template <DType dtype, int D, int K>
__device__ __forceinline__ void warpgroup_gemm_pv(float (&o)[D / 8][4],
                                                  const std::uint32_t (&p)[K / 16][4],
                                                  std::uint32_t v_smem) {
    constexpr int N = D < 128 ? D : 128;
    constexpr int sub_tile_bytes = K * 128;
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
        for (int n0 = 0; n0 < D; n0 += N) {
            const std::uint64_t b = mn_major_descriptor(
                v_smem + (n0 / 64) * sub_tile_bytes + kk * (16 * 128), sub_tile_bytes);
            auto& o_part = reinterpret_cast<float(&)[N / 8][4]>(o[n0 / 8]);
            ptx::wgmma_rs<dtype, N, true>(o_part, p[kk], b, true);
        }
    }
}

}  // namespace flash_attention
