#pragma once

// A KernelConfig packed into two 64-bit words, and back, field by field in the order and
// widths of the field table (FLASH_ATTENTION_CONFIG_FIELDS). __global__ templates take this
// code, as two template arguments, instead of the config itself: nvcc's host stubs cannot spell
// a class-type template argument, and they spell an unsigned __int128 one as a decimal literal
// that the host compiler truncates to 64 bits past 2^64, registering another kernel than the
// one launched (seen with nvcc 13.0).

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
static_assert(code_bits() <= 128, "the code fits two 64-bit words");

constexpr bool field_widths_valid() {
    for (const FieldInfo& f : k_config_fields) {
        if (f.bits < 1 || f.bits > 30)
            return false;
    }
    return true;
}
static_assert(field_widths_valid(), "every field 1 to 30 bits: field_max's int, pack's shifts");

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

// The fields as one 128-bit number, the table's last field in the lowest bits: `hi` holds its
// top 64 bits, `lo` the rest.
struct ConfigCode {
    unsigned long long hi = 0;
    unsigned long long lo = 0;
};

constexpr ConfigCode pack(const KernelConfig& c) {
    ConfigCode code;
    for (int i = 0; i < k_config_field_count; ++i) {
        const int bits = k_config_fields[i].bits;  // 1 to 30 (field_widths_valid)
        code.hi = (code.hi << bits) | (code.lo >> (64 - bits));
        code.lo = (code.lo << bits) |
                  (static_cast<unsigned long long>(field_value(c, i)) & ((1ull << bits) - 1));
    }
    return code;
}

constexpr KernelConfig unpack(unsigned long long hi, unsigned long long lo) {
    KernelConfig c;
    for (int i = k_config_field_count - 1; i >= 0; --i) {
        const int bits = k_config_fields[i].bits;
        set_field_value(c, i, static_cast<int>(lo & ((1ull << bits) - 1)));
        lo = (lo >> bits) | (hi << (64 - bits));
        hi >>= bits;
    }
    return c;
}

constexpr KernelConfig unpack(const ConfigCode& code) {
    return unpack(code.hi, code.lo);
}

}  // namespace flash_attention
