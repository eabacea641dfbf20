#pragma once

// The automatic choice's built-in table: for each dtype and head dim, the kernels to run
// when the tuning cache has no entry, in preference order. The `release` kernel set is
// exactly these configs, so the default build holds every kernel the table names.
// Host code only.

#include <cstdint>
#include <span>

#include "flash_attention/kernel_config.hpp"

namespace flash_attention::space {

struct BuiltinChoice {
    KernelConfig config;
    // Only when max(seq_q, seq_k) is at most this (0: any length).
    std::int64_t max_seq = 0;
    // Only for causal problems.
    bool causal_only = false;

    // Whether the row may serve a problem of this longest length and mask.
    constexpr bool admits(std::int64_t seq, bool causal) const {
        return (max_seq == 0 || seq <= max_seq) && (!causal_only || causal);
    }
};

// Every row, in preference order: the first row that matches the problem's dtype and
// head dim, admits it (length, mask) and runs on the device is the choice.
std::span<const BuiltinChoice> builtin_choices();

}  // namespace flash_attention::space
