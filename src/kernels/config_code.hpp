#pragma once

// A KernelConfig packed into one integer, and back. __global__ templates take this
// code instead of the config itself: nvcc's host stubs cannot spell a class-type
// template argument (seen with nvcc 13.0).

#include "flash_attention/kernel_config.hpp"

namespace flash_attention {

inline constexpr int k_config_fields = 19;
inline constexpr int k_field_bits[k_config_fields] = {1, 2, 10, 9, 9, 5, 1, 1, 1, 4,
                                                      4, 4, 1,  1, 3, 1, 1, 1, 1};  // 60 bits

constexpr unsigned long long pack(const KernelConfig& c) {
    const int fields[k_config_fields] = {static_cast<int>(c.family),
                                         static_cast<int>(c.dtype),
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
                                         int(c.optimized_softmax),
                                         c.stages,
                                         int(c.intra_warpgroup_overlap),
                                         int(c.pingpong),
                                         int(c.persistent),
                                         int(c.q_in_registers)};
    unsigned long long code = 0;
    for (int i = 0; i < k_config_fields; ++i) {
        code = (code << k_field_bits[i]) |
               (static_cast<unsigned long long>(fields[i]) & ((1ull << k_field_bits[i]) - 1));
    }
    return code;
}

constexpr KernelConfig unpack(unsigned long long code) {
    int f[k_config_fields] = {};
    for (int i = k_config_fields - 1; i >= 0; --i) {
        f[i] = static_cast<int>(code & ((1ull << k_field_bits[i]) - 1));
        code >>= k_field_bits[i];
    }
    return {.family = static_cast<Family>(f[0]),
            .dtype = static_cast<DType>(f[1]),
            .d_head = f[2],
            .B_r = f[3],
            .B_c = f[4],
            .n_warps = f[5],
            .async_copy = f[6] != 0,
            .eager_load_blocks = f[7] != 0,
            .swizzled = f[8] != 0,
            .Q_mma_load_K_tiles = f[9],
            .K_mma_load_K_tiles = f[10],
            .V_mma_load_K_tiles = f[11],
            .mma_double_buffer_loads = f[12] != 0,
            .optimized_softmax = f[13] != 0,
            .stages = f[14],
            .intra_warpgroup_overlap = f[15] != 0,
            .pingpong = f[16] != 0,
            .persistent = f[17] != 0,
            .q_in_registers = f[18] != 0};
}

}  // namespace flash_attention
