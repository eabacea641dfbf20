#pragma once

// The automatic choice's built-in table: for each dtype and head dim, the kernels to run
// when the tuning cache has no entry, in preference order. The `release` kernel set is
// exactly these configs, so the default build holds every kernel the table names.
// Host code only.

#include <cstdint>
#include <span>

#include "flash_attention/kernel_config.hpp"
#include "flash_attention/tools.hpp"

namespace flash_attention::space {

// The most queries a problem may have for the pack_gqa rows (and a tuned pack_gqa config) to
// serve it: beyond, one head's queries fill tiles of their own. The tuning cache keeps such
// problems' winners apart (tuning::Lengths).
inline constexpr std::int64_t k_packed_max_seq_q = tuning::k_few_queries;
// The most keys of the short-key rows (cross-attention on a text encoder's outputs), whose
// winners the tuning cache keeps apart too.
inline constexpr std::int64_t k_short_max_seq_k = tuning::k_short_keys;

struct BuiltinChoice {
    KernelConfig config;
    // Only when max(seq_q, seq_k) is at most this (0: any length).
    std::int64_t max_seq = 0;
    // Only for causal problems.
    bool causal_only = false;
    // Only for grouped-query problems (more query heads than K/V heads) of at most this many
    // queries (0: any problem): pack_gqa rows.
    std::int64_t max_grouped_seq_q = 0;
    // Only for problems of at most this many keys (0: any): short keys, as cross-attention on a
    // text encoder's outputs has, where the longest length is the queries'.
    std::int64_t max_seq_k = 0;

    // Whether the row may serve a problem of this longest length, mask, queries, query heads a
    // K/V head and keys (the backward's rows read only the first two).
    constexpr bool admits(std::int64_t seq, bool causal, std::int64_t seq_q = 0,
                          std::int64_t group = 1, std::int64_t seq_k = 0) const {
        return (max_seq == 0 || seq <= max_seq) && (!causal_only || causal) &&
               (max_grouped_seq_q == 0 || (group > 1 && seq_q <= max_grouped_seq_q)) &&
               (max_seq_k == 0 || (seq_k > 0 && seq_k <= max_seq_k));
    }
};

// Every row, in preference order: the first row that matches the problem's dtype and
// head dim, admits it (length, mask) and runs on the device is the choice.
std::span<const BuiltinChoice> builtin_choices();

}  // namespace flash_attention::space
