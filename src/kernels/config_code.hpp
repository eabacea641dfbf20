#pragma once

// A KernelConfig packed into one integer, and back. __global__ templates take this
// code instead of the config itself: nvcc's host stubs cannot spell a class-type
// template argument (seen with nvcc 13.0).

#include "flash_attention/kernel_config.hpp"

namespace flash_attention {

// Bits of each field in the code: every value a config may hold (the parser and the
// config space's "fields" rule bound them by these).
namespace field_bits {
inline constexpr int family = 1, dtype = 2, d_head = 10, B_r = 9, B_c = 9, n_warps = 5, flag = 1,
                     load_tiles = 4, stages = 3;
}  // namespace field_bits

// The largest value a field of `bits` bits holds.
constexpr int field_max(int bits) {
    return (1 << bits) - 1;
}

inline constexpr int k_config_fields = 19;
inline constexpr int k_field_bits[k_config_fields] = {
    field_bits::family, field_bits::dtype,      field_bits::d_head,     field_bits::B_r,
    field_bits::B_c,    field_bits::n_warps,    field_bits::flag,       field_bits::flag,
    field_bits::flag,   field_bits::load_tiles, field_bits::load_tiles, field_bits::load_tiles,
    field_bits::flag,   field_bits::flag,       field_bits::stages,     field_bits::flag,
    field_bits::flag,   field_bits::flag,       field_bits::flag};  // 60 bits

// Whether every field fits its bits, so that pack() loses nothing and the size formulas
// (smem_bytes(), n_threads()) cannot overflow.
constexpr bool fields_in_range(const KernelConfig& c) {
    const auto in = [](int value, int bits) { return value >= 0 && value <= field_max(bits); };
    return in(static_cast<int>(c.family), field_bits::family) &&
           in(static_cast<int>(c.dtype), field_bits::dtype) && in(c.d_head, field_bits::d_head) &&
           in(c.B_r, field_bits::B_r) && in(c.B_c, field_bits::B_c) &&
           in(c.n_warps, field_bits::n_warps) && in(c.Q_mma_load_K_tiles, field_bits::load_tiles) &&
           in(c.K_mma_load_K_tiles, field_bits::load_tiles) &&
           in(c.V_mma_load_K_tiles, field_bits::load_tiles) && in(c.stages, field_bits::stages);
}

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
