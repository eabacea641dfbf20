#pragma once

// The backward's masks (kernels/masks.hpp) on a warp's m16n8 score tiles, either way round:
// invisible scores become -inf.

#include "kernels/masks.hpp"
#include "kernels/primitives/masking.cuh"

namespace flash_attention {

// Rows are queries first_query + [0, 16 * MT), columns keys first_key + [0, 8 * NT). A prefix
// mask compares one end (mask_scores_by).
template <class Mask, int MT, int NT>
__device__ __forceinline__ void mask_query_rows(const Mask& mask, float (&s)[MT][NT][4],
                                                int first_query, int first_key) {
    if constexpr (Mask::prefix) {
        mask_scores_by(s, first_query, first_key, [&](int q) { return mask.key_end(q); });
    } else {
        mask_scores_band(s, first_query, first_key, [&](int q) {
            return KeySpan{mask.key_begin(q), mask.key_end(q)};
        });
    }
}

// The queries key k sees; none past seq_k.
template <class Mask>
__device__ __forceinline__ KeySpan queries_seeing(const Mask& mask, int k) {
    return k < mask.seq_k ? KeySpan{mask.query_begin(k), mask.query_end(k)} : KeySpan{0, 0};
}

// The transposed tiles: rows are keys first_key + [0, 16 * MT), columns queries
// first_query + [0, 8 * NT).
template <class Mask, int MT, int NT>
__device__ __forceinline__ void mask_key_rows(const Mask& mask, float (&s)[MT][NT][4],
                                              int first_key, int first_query) {
    mask_scores_band(s, first_key, first_query, [&](int k) { return queries_seeing(mask, k); });
}

// A warp's 16 key rows from first_key, whose query spans a thread computes once where its rows
// stay the same for a whole walk (the sm90 backward's consumers): four registers where the mask's
// fields and arithmetic took more (the softcap's band kernel at d_head 64 spilled 260 bytes).
struct KeyRowQueries {
    KeySpan spans[1][2];  // rows lane / 4 and lane / 4 + 8

    template <class Mask>
    __device__ static KeyRowQueries of(const Mask& mask, int first_key) {
        const int row = first_key + threadIdx.x % warp_size / 4;
        return {{{queries_seeing(mask, row), queries_seeing(mask, row + 8)}}};
    }
    template <int NT>
    __device__ __forceinline__ void apply(float (&s)[1][NT][4], int first_query) const {
        mask_scores_spans(s, spans, first_query);
    }
};

}  // namespace flash_attention
