#pragma once

// Compile-time expansion of a KernelConfig into the sm80 kernel's tile shapes,
// shared-memory layout and fragment counts.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flash_attention/kernel_config.hpp"
#include "kernels/primitives/smem_tile.cuh"

namespace flash_attention::sm80 {

template <DType dtype>
struct Element;
template <>
struct Element<DType::FP16> {
    using type = __half;
};
template <>
struct Element<DType::BF16> {
    using type = __nv_bfloat16;
};

// __global__ templates take the config packed into one integer: nvcc's host stubs
// cannot spell a class-type template argument (seen with nvcc 13.0).
inline constexpr int k_field_bits[13] = {2, 10, 9, 9, 5, 1, 1, 1, 4, 4, 4, 1, 1};  // 52 bits

constexpr unsigned long long pack(const KernelConfig& c) {
    const int fields[13] = {static_cast<int>(c.dtype),
                            c.d_head,
                            c.B_r,
                            c.B_c,
                            c.n_warps,
                            int(c.async_copy),
                            int(c.eager_load_blocks),
                            int(c.swizzled),
                            c.Q_mma_load_K_tiles,
                            c.K_mma_load_K_tiles,
                            c.V_mma_load_K_tiles,
                            int(c.mma_double_buffer_loads),
                            int(c.optimized_softmax)};
    unsigned long long code = 0;
    for (int i = 0; i < 13; ++i) {
        code = (code << k_field_bits[i]) |
               (static_cast<unsigned long long>(fields[i]) & ((1ull << k_field_bits[i]) - 1));
    }
    return code;
}

constexpr KernelConfig unpack(unsigned long long code) {
    int f[13] = {};
    for (int i = 12; i >= 0; --i) {
        f[i] = static_cast<int>(code & ((1ull << k_field_bits[i]) - 1));
        code >>= k_field_bits[i];
    }
    return {static_cast<DType>(f[0]),
            f[1],
            f[2],
            f[3],
            f[4],
            f[5] != 0,
            f[6] != 0,
            f[7] != 0,
            f[8],
            f[9],
            f[10],
            f[11] != 0,
            f[12] != 0};
}

template <KernelConfig C>
struct Traits {
    static_assert(unpack(pack(C)) == C, "every field fits the packed kernel parameter");
    using T = typename Element<C.dtype>::type;
    static constexpr DType dtype = C.dtype;
    static constexpr int d_head = C.d_head;
    static constexpr int B_r = C.B_r;
    static constexpr int B_c = C.B_c;
    static constexpr int threads = C.n_threads();

    // Each warp owns rows_per_warp consecutive query rows: m_tiles m16 MMA tiles.
    static constexpr int rows_per_warp = C.rows_per_warp();
    static constexpr int m_tiles = rows_per_warp / 16;

    // S = Q·Kᵀ: (rows_per_warp x B_c) over k = d_head.
    static constexpr int qk_k_tiles = d_head / 16;
    static constexpr int qk_n_tiles = B_c / 8;
    static constexpr int qk_step = C.K_mma_load_K_tiles == 0 ? qk_k_tiles : C.K_mma_load_K_tiles;
    static constexpr bool q_held_in_registers = C.Q_mma_load_K_tiles == 0;

    // O += P·V: (rows_per_warp x d_head) over k = B_c.
    static constexpr int pv_k_tiles = B_c / 16;
    static constexpr int pv_n_tiles = d_head / 8;
    static constexpr int pv_step = C.V_mma_load_K_tiles == 0 ? pv_k_tiles : C.V_mma_load_K_tiles;

    using QTile = SmemTile<B_r, d_head, C.swizzled>;  // also stages O at the end
    using KTile = SmemTile<B_c, d_head, C.swizzled>;
    using VTile = SmemTile<B_c, d_head, C.swizzled>;
    static constexpr int q_smem_offset = 0;
    static constexpr int k_smem_offset = QTile::bytes;
    static constexpr int v_smem_offset = QTile::bytes + KTile::bytes;
    static constexpr int smem_bytes = QTile::bytes + KTile::bytes + VTile::bytes;

    static_assert(smem_bytes == C.smem_bytes(), "KernelConfig::smem_bytes() matches the layout");
    static_assert(rows_per_warp == 16 || rows_per_warp == 32, "16 or 32 query rows per warp");
    static_assert(d_head % 16 == 0 && B_c % 16 == 0, "whole k16 MMA tiles");
    static_assert(qk_k_tiles % qk_step == 0 && pv_k_tiles % pv_step == 0,
                  "load steps divide the k extents");
    static_assert(q_held_in_registers || C.Q_mma_load_K_tiles == C.K_mma_load_K_tiles,
                  "streamed Q fragments arrive in step with K's");
    static_assert(!C.eager_load_blocks || C.async_copy, "eager loading needs cp.async");
};

}  // namespace flash_attention::sm80
