#pragma once

// Compile-time expansion of a KernelConfig into the sm80 kernel's tile shapes,
// shared-memory layout and fragment counts.

#include "config/config_code.hpp"
#include "config/resources.hpp"
#include "flash_attention/kernel_config.hpp"
#include "kernels/primitives/element.cuh"
#include "kernels/primitives/smem_tile.cuh"

namespace flash_attention::sm80 {

template <KernelConfig C>
struct Traits {
    static_assert(unpack(pack(C)) == C, "every field fits the packed kernel parameter");
    using T = typename Element<C.dtype>::type;
    static constexpr DType dtype = C.dtype;
    static constexpr int d_head = C.d_head;     // Q's and K's columns
    static constexpr int d_v = C.v_head_dim();  // V's and O's
    static constexpr int B_r = C.B_r;
    static constexpr int B_c = C.B_c;
    static constexpr int threads = C.n_threads();

    // Each warp owns rows_per_warp consecutive query rows: m_tiles m16 MMA tiles.
    static constexpr int rows_per_warp = C.rows_per_warp();
    static constexpr int m_tiles = rows_per_warp / 16;

    // S = Q·Kᵀ: (rows_per_warp x B_c) over k = d_head.
    static constexpr int qk_k_tiles = d_head / 16;
    static constexpr int qk_n_tiles = B_c / 8;
    static constexpr int qk_step =
        C.sm80.K_mma_load_K_tiles == 0 ? qk_k_tiles : C.sm80.K_mma_load_K_tiles;
    static constexpr bool q_held_in_registers = C.sm80.Q_mma_load_K_tiles == 0;

    // O += P·V: (rows_per_warp x d_v) over k = B_c.
    static constexpr int pv_k_tiles = B_c / 16;
    static constexpr int pv_n_tiles = d_v / 8;
    static constexpr int pv_step =
        C.sm80.V_mma_load_K_tiles == 0 ? pv_k_tiles : C.sm80.V_mma_load_K_tiles;

    // Q's tile also stages O at the end, in the first d_v columns of each warp's own rows
    // (d_v <= d_head): another warp may still read its Q rows.
    using QTile = SmemTile<B_r, d_head, C.sm80.swizzled>;
    using KTile = SmemTile<B_c, d_head, C.sm80.swizzled>;
    using VTile = SmemTile<B_c, d_v, C.sm80.swizzled>;
    static constexpr int q_smem_offset = 0;
    static constexpr int k_smem_offset = QTile::bytes;
    static constexpr int v_smem_offset = QTile::bytes + KTile::bytes;
    static constexpr int smem_bytes = QTile::bytes + KTile::bytes + VTile::bytes;

    static_assert(smem_bytes == flash_attention::smem_bytes(C), "smem_bytes(C) matches the layout");
    static_assert(rows_per_warp == 16 || rows_per_warp == 32, "16 or 32 query rows per warp");
    static_assert(d_head % 16 == 0 && d_v % 16 == 0 && B_c % 16 == 0, "whole k16 MMA tiles");
    static_assert(d_v <= d_head, "O is staged in Q's tile");
    static_assert(qk_k_tiles % qk_step == 0 && pv_k_tiles % pv_step == 0,
                  "load steps divide the k extents");
    static_assert(q_held_in_registers || C.sm80.Q_mma_load_K_tiles == C.sm80.K_mma_load_K_tiles,
                  "streamed Q fragments arrive in step with K's");
    static_assert(!C.sm80.eager_load_blocks || C.sm80.async_copy, "eager loading needs cp.async");
};

}  // namespace flash_attention::sm80
