#pragma once

// A KernelConfig packed into one integer, and back, field by field in the order and
// widths of the field table (FLASH_ATTENTION_CONFIG_FIELDS). __global__ templates take
// this code instead of the config itself: nvcc's host stubs cannot spell a class-type
// template argument (seen with nvcc 13.0).

#include "flash_attention/kernel_config.hpp"

namespace flash_attention {

// The largest value a field of `bits` bits holds.
constexpr int field_max(int bits) {
    return (1 << bits) - 1;
}

constexpr int code_bits() {
    int total = 0;
    for (const FieldInfo& f : k_config_fields)
        total += f.bits;
    return total;
}
static_assert(code_bits() <= 64, "the code fits one 64-bit integer");

// Whether every field fits its bits, so that pack() loses nothing and the size formulas
// (smem_bytes(c), c.n_threads()) cannot overflow.
constexpr bool fields_in_range(const KernelConfig& c) {
    for (int i = 0; i < k_config_field_count; ++i) {
        const int value = field_value(c, i);
        if (value < 0 || value > field_max(k_config_fields[i].bits))
            return false;
    }
    return true;
}

constexpr unsigned long long pack(const KernelConfig& c) {
    unsigned long long code = 0;
    for (int i = 0; i < k_config_field_count; ++i) {
        const int bits = k_config_fields[i].bits;
        code = (code << bits) |
               (static_cast<unsigned long long>(field_value(c, i)) & ((1ull << bits) - 1));
    }
    return code;
}

constexpr KernelConfig unpack(unsigned long long code) {
    KernelConfig c;
    for (int i = k_config_field_count - 1; i >= 0; --i) {
        const int bits = k_config_fields[i].bits;
        set_field_value(c, i, static_cast<int>(code & ((1ull << bits) - 1)));
        code >>= bits;
    }
    return c;
}

}  // namespace flash_attention
