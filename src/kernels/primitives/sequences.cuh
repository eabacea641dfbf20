#pragma once

// Where one sequence of a batch lies in its tensor, for the calls whose sequences have
// their own lengths (varlen batches, KV caches). Offsets and lengths come from device
// memory the host never checked without a synchronisation: a sequence is cut at its
// view's end rather than read or written past it.

#include <cstdint>

namespace flash_attention {

// A sequence's rows in its tensor view: entry `entry`, rows [row0, row0 + len).
struct Span {
    int entry;
    int row0;
    int len;
};

__device__ __forceinline__ int clamp_to(int x, int lo, int hi) {
    return min(max(x, lo), hi);
}

// Sequence b of a (view_batch, view_seq) tensor. With cu_seqlens (batch + 1 offsets) its
// rows are [cu[b], cu[b + 1]) of entry 0, unless the rows come through a page table
// (paged_capacity > 0: entry b's rows [0, paged_capacity) address its pages, and
// cu_seqlens gives only the length); without, all of entry b. With seqused, only the
// first seqused[b] + seqused_add rows are used.
__device__ __forceinline__ Span sequence_span(const std::int32_t* cu_seqlens,
                                              const std::int32_t* seqused, int seqused_add, int b,
                                              int view_seq, int paged_capacity = 0) {
    Span s{b, 0, 0};
    int capacity = paged_capacity > 0 ? paged_capacity : view_seq;
    // 64-bit: a corrupt length near 2^31 plus the appended tokens must not wrap.
    std::int64_t len = capacity;
    if (cu_seqlens != nullptr) {
        len = std::int64_t{cu_seqlens[b + 1]} - cu_seqlens[b];
        if (paged_capacity == 0) {
            s.entry = 0;
            s.row0 = clamp_to(cu_seqlens[b], 0, view_seq);
            capacity = view_seq - s.row0;
        }
    }
    if (seqused != nullptr)
        len = std::int64_t{seqused[b]} + seqused_add;
    s.len = static_cast<int>(min(max(len, std::int64_t{0}), std::int64_t{capacity}));
    return s;
}

}  // namespace flash_attention
