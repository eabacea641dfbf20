#pragma once

// A dense problem's mask as a policy type: which (query, key) pairs are visible, asked from
// either side. The forward walks a query tile's keys; the backward's dK/dV kernel walks a key
// block's queries, and its dQ kernel a query tile's keys again. Causal at either alignment
// (through the diagonal's query length, masking.cuh), keys past seq_k, queries past seq_q.

#include "kernels/primitives/masking.cuh"

namespace flash_attention {

struct CausalMask {
    int seq_q;
    int seq_k;
    int diagonal_seq_q;  // diagonal_queries(seq_q, seq_k, top_left)
    bool causal;

    // Query q sees keys [0, key_end(q)).
    __host__ __device__ constexpr int key_end(int q) const {
        return keys_seen(q, diagonal_seq_q, seq_k, causal);
    }

    // Key k (< seq_k) is seen by queries [query_begin(k), seq_q): key_end(q) > k exactly
    // when q >= k + diagonal_seq_q - seq_k. Lengths stay below 2^30, so no sum overflows.
    __host__ __device__ constexpr int query_begin(int k) const {
        const int first = k - (seq_k - diagonal_seq_q);
        return causal && first > 0 ? first : 0;
    }

    // Whether every pair of the query rows [q0, q0 + rows) and keys [k0, k0 + cols) is visible
    // and inside both sequences: such a tile needs no mask.
    __host__ __device__ constexpr bool whole(int q0, int rows, int k0, int cols) const {
        return q0 + rows <= seq_q && k0 + cols <= key_end(q0);
    }

    // A warp's m16n8 score tiles whose rows are queries first_query + [0, 16 * MT) and
    // columns keys first_key + [0, 8 * NT): invisible scores become -inf.
    template <int MT, int NT>
    __device__ __forceinline__ void mask_query_rows(float (&s)[MT][NT][4], int first_query,
                                                    int first_key) const {
        mask_scores_by(s, first_query, first_key, [&](int q) { return key_end(q); });
    }

    // The transposed tiles: rows are keys first_key + [0, 16 * MT), columns queries
    // first_query + [0, 8 * NT). A key past seq_k sees no query.
    template <int MT, int NT>
    __device__ __forceinline__ void mask_key_rows(float (&s)[MT][NT][4], int first_key,
                                                  int first_query) const {
        mask_scores_band(s, first_key, first_query, [&](int k) {
            return k < seq_k ? KeySpan{query_begin(k), seq_q} : KeySpan{0, 0};
        });
    }
};

}  // namespace flash_attention
