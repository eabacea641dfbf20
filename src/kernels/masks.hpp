#pragma once

// Which (query, key) pairs are visible: the index arithmetic of every kernel's mask, constexpr,
// so that host code (the backward's add counts, the host tests) and device code
// (--expt-relaxed-constexpr) share it. The score tiles' masking is primitives/masking.cuh's and
// primitives/mask.cuh's.
//
// The backward's masks are policy types, asked from either side: its kernels walk a key block's
// queries (the dK/dV side) and a query tile's keys (sm80's dQ kernel), and each is written once
// for either mask. CausalMask: causal at either alignment (through the diagonal's query length,
// diagonal_queries) or none; BandMask: a sliding window (KeyBand, causal included), both ends of
// which need masking.

#include <algorithm>

#include "kernels/blocks.hpp"
#include "kernels/kernel_args.hpp"

namespace flash_attention {

// Keys row `row` sees (before the key-length mask): all seq_k, or with causal masking
// those below row + 1 + seq_k - seq_q, summed so that nothing passes 2^31.
constexpr int keys_seen(int row, int seq_q, int seq_k, bool causal) {
    return causal ? seq_k + std::min(0, row + 1 - seq_q) : seq_k;
}

// The variant kernels' mask (KernelArgs::band): row r sits at diagonal position r + shift
// (shift = seq_k - diagonal queries) and sees keys [lo, hi).
struct KeySpan {
    int lo, hi;
};

// Rows reach seq_q + B_r and |shift| < 2^30, so position +- a window of at most
// k_unbounded_window stays inside an int; hi is cut to seq_k before the sum could pass it.
constexpr KeySpan band_keys(int row, int shift, KeyBand band, int seq_k) {
    const int pos = row + shift;
    return {std::max(0, pos - band.left), pos >= seq_k - band.right ? seq_k : pos + band.right + 1};
}

struct CausalMask {
    int seq_q;
    int seq_k;
    int diagonal_seq_q;  // diagonal_queries(seq_q, seq_k, top_left)
    bool causal;

    static constexpr CausalMask of(const BackwardArgs& a) {
        return {a.seq_q, a.seq_k, a.diagonal_seq_q, a.causal};
    }
    // One sequence of a packed batch, its own lengths aligned as the call's (top_left).
    static constexpr CausalMask of(const BackwardArgs& a, int seq_q, int seq_k) {
        return {seq_q, seq_k, diagonal_queries(seq_q, seq_k, a.top_left), a.causal};
    }

    // Query q sees keys [key_begin(q), key_end(q)); a prefix (mask.cuh masks one end only).
    static constexpr bool prefix = true;
    constexpr int key_begin(int) const { return 0; }
    constexpr int key_end(int q) const { return keys_seen(q, diagonal_seq_q, seq_k, causal); }

    // Key k (< seq_k) is seen by queries [query_begin(k), query_end(k)): key_end(q) > k exactly
    // when q >= k + diagonal_seq_q - seq_k. Lengths stay below 2^30, so no sum overflows.
    constexpr int query_begin(int k) const {
        const int first = k - (seq_k - diagonal_seq_q);
        return causal && first > 0 ? first : 0;
    }
    constexpr int query_end(int) const { return seq_q; }

    // Whether every pair of the query rows [q0, q0 + rows) and keys [k0, k0 + cols) is visible
    // and inside both sequences: such a tile needs no mask.
    constexpr bool whole(int q0, int rows, int k0, int cols) const {
        return q0 + rows <= seq_q && k0 + cols <= key_end(q0);
    }
};

// Row q sees keys band_keys(q, shift, band, seq_k), so key k is seen by the queries
// [k - shift - right, k - shift + left] cut to [0, seq_q).
struct BandMask {
    int seq_q;
    int seq_k;
    int shift;  // seq_k - diagonal_seq_q
    KeyBand band;

    static constexpr BandMask of(const BackwardArgs& a) {
        return {a.seq_q, a.seq_k, a.seq_k - a.diagonal_seq_q, a.band};
    }
    static constexpr BandMask of(const BackwardArgs& a, int seq_q, int seq_k) {
        return {seq_q, seq_k, band_shift(seq_q, seq_k, a.top_left), a.band};
    }

    static constexpr bool prefix = false;
    constexpr int key_begin(int q) const { return band_keys(q, shift, band, seq_k).lo; }
    constexpr int key_end(int q) const { return band_keys(q, shift, band, seq_k).hi; }
    // k < seq_k < 2^30 and |shift| < 2^30: k - shift stays inside an int, and a side is added
    // only where the sum cannot pass seq_q.
    constexpr int query_begin(int k) const { return std::max(0, k - shift - band.right); }
    constexpr int query_end(int k) const {
        const int pos = k - shift;
        return pos >= seq_q - 1 - band.left ? seq_q : std::max(0, pos + band.left + 1);
    }

    // key_begin and key_end never decrease with the row: the last row bounds the start, the
    // first the end.
    constexpr bool whole(int q0, int rows, int k0, int cols) const {
        return q0 + rows <= seq_q && k0 >= key_begin(q0 + rows - 1) && k0 + cols <= key_end(q0);
    }
};

// The blocks of B_r queries a key block's walk visits, [first, end): those holding a query
// that sees one of its keys [k0, last_key] (last_key < seq_k). Of them, [unmasked_first,
// unmasked_end) need no mask: each of their queries below seq_q sees every key (queries past
// seq_q need none, their LSE being +inf). A key's queries are a range whose ends never decrease
// with the key, and neighbouring keys' ranges overlap or touch, so a block's are one range too.
struct QueryBlocks {
    int first, end;
    int unmasked_first, unmasked_end;

    template <class Mask>
    static constexpr QueryBlocks of(const Mask& m, int k0, int last_key, int B_r) {
        const int begin = m.query_begin(k0), stop = m.query_end(last_key);
        if (begin >= stop)
            return {0, 0, 0, 0};  // keys past every query's window
        const int end = blocks_covering(stop, B_r);
        const int seen_by_all = m.query_end(k0);
        return {begin / B_r, end, blocks_covering(m.query_begin(last_key), B_r),
                seen_by_all >= m.seq_q ? end : seen_by_all / B_r};
    }
    constexpr bool masked(int block) const {
        return block < unmasked_first || block >= unmasked_end;
    }
};

// The lowest key block whose walk reaches query block m: the one holding the block's first
// row's first key (each later row's keys begin no earlier). Every key block from there up to
// the last that reaches m does (QueryBlocks' ranges never decrease with the key).
template <class Mask>
constexpr int first_key_block_seeing(const Mask& m, int query_block, int B_r, int B_c) {
    return m.key_begin(query_block * B_r) / B_c;
}

}  // namespace flash_attention
