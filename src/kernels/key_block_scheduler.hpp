#pragma once

// The sm90 backward's grid order (sm90/backward_kernel.cuh): which key block of which K/V head
// and sequence a CTA takes, and the order of the query blocks its walk visits (QueryWalk).
// constexpr, so that host code (the launch's grid size, the host tests) and device code
// (--expt-relaxed-constexpr) share it.

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/blocks.hpp"
#include "kernels/kernel_args.hpp"
#include "kernels/masks.hpp"
#include "kernels/tile_order.hpp"

namespace flash_attention::sm90 {

// Highest first: the key blocks adding to query block m are 0 .. L(m): key block n walks the query
// blocks from the one holding its first key's first query (causal masking removes only keys after a
// query's) unless no query sees it (QueryBlocks), so it sees m when n B_c - (seq_k -
// diagonal_seq_q) < min((m + 1) B_r, seq_q). Key block n's add
// therefore comes after L(m) - n others. A causal walk waits only where key blocks start at one
// query block (the first ones of a bottom-right diagonal with seq_k > seq_q): otherwise key block
// n reaches query block m B_c / B_r steps after key block n + 1 did, which starts no later.
// Causal problems only (the scheduler's descending order is theirs).
constexpr int adds_from_above(const BackwardArgs& a, int key_block, int query_block, int B_r,
                              int B_c) {
    const int key_blocks = blocks_covering(a.seq_k, B_c);
    const std::int64_t end = std::min<std::int64_t>(std::int64_t{query_block + 1} * B_r, a.seq_q) +
                             (a.seq_k - a.diagonal_seq_q);
    const std::int64_t seeing =
        end <= 0 ? 0 : std::min<std::int64_t>(key_blocks, (end + B_c - 1) / B_c);
    return static_cast<int>(seeing) - 1 - key_block;
}

// One CTA a key block of one (K/V head, sequence) pair, numbered in sections of pairs
// (balanced_section_position, tile_order.hpp: a section's pairs all take one key block before any
// takes the next; the sections' sizes differ by one at most). Without a mask, or with a sliding
// window or packed sequences (whose walks are as long as the window or the sequence), a section is
// one pair: the key blocks of a head are neighbours, and the CTAs running together walk the same Q,
// dO and dQ rows, which stay in L2. Causal, a key block's walk shrinks with its index, and a
// section holds the pairs of about two waves of CTAs (at most two; as many sections as that takes,
// evenly filled: against two-wave sections and a smaller last one, GQA 32/8 causal 8k +4-10% and
// the causal grid's cells +1-7%, H100, 2026-12-07): longest first within it (a short tail), few
// enough pairs that their rows stay in L2 (every pair's first key blocks at once, one CTA a pair,
// streamed each its own rows from HBM: −20-30% at 1k-2k), enough that a grid of few heads still
// starts its longest walks first (GQA 32/8 at 8k: −11% with a pair a section; H200, 2026-12-02).
//
// Ordered dQ (deterministic) fixes the order of each query block's adds (adds_before), and the
// grid order must start every CTA a CTA waits on before it. A window keeps key-block order.
// Without GQA a causal problem runs each section's key blocks highest first, the order its walks
// reach each query block: the shortest walks first, and none waits (adds_from_above). With GQA a
// walk covers the group's heads, and the shortest-first order's tail (the longest walks start
// last) cost 39% (32/8 at 8k: 312 against 516), so those problems keep key-block order with every
// pair in one section: a key block waits for the lower ones before its first head's first add
// only, a small part of a walk the group's heads long (−4% against the unordered kernel; in
// sections of two waves −25%: 384 against 514). Both orders depend only on the heads and lengths,
// never the batch, so a row's dQ is the same at any batch size.
struct KeyBlockScheduler {
    int key_blocks;
    int heads_kv;
    int batch;
    int sections;     // of (K/V head, sequence) pairs (balanced_section_position)
    bool descending;  // ordered dQ: a pair's highest key block first, and adds in that order

    static constexpr KeyBlockScheduler of(const BackwardArgs& a, int B_c, bool ordered) {
        const int key_blocks = blocks_covering(a.seq_k, B_c);
        const std::int64_t pairs = std::int64_t{a.heads_kv} * a.batch;
        const std::int64_t two_waves = std::max(1, blocks_covering(2 * a.sm_count, key_blocks));
        // Dense tensors whose band is causal masking alone (ALiBi runs the band kernels) walk as
        // the causal kernels do: in key-block order the ordered kernel's adds waited in a
        // staircase, and d_head 64's causal backward with ALiBi ran at half the speed (H200,
        // 2026-12-03).
        const bool causal =
            a.causal &&
            (!a.banded || (a.cu_seqlens_q == nullptr && a.band.left == k_unbounded_window));
        const bool descending = ordered && causal && a.heads == a.heads_kv;
        const std::int64_t sections = !causal || pairs == 0 ? std::max<std::int64_t>(pairs, 1)
                                      : ordered && !descending
                                          ? 1
                                          : (pairs + two_waves - 1) / two_waves;
        return {key_blocks, a.heads_kv, a.batch,
                static_cast<int>(std::min<std::int64_t>(sections, std::numeric_limits<int>::max())),
                descending};
    }
    constexpr std::int64_t count() const { return std::int64_t{key_blocks} * heads_kv * batch; }

    struct Tile {
        int key_block, kv_head, batch;
    };
    // index in [0, count()), which the launch keeps below 2^31.
    constexpr Tile tile(int index) const {
        const SectionPosition at =
            balanced_section_position(index, key_blocks, sections, heads_kv * batch);
        return {descending ? key_blocks - 1 - at.rank : at.rank, at.unit % heads_kv,
                at.unit / heads_kv};
    }
    // Ordered dQ: the adds to query block `query_block` before key block `key_block`'s, the
    // value its semaphore reaches first. In key-block order, every lower key block from the
    // first that reaches it adds to it (without a window, from key block 0).
    template <class Mask>
    constexpr int adds_before(const BackwardArgs& a, const Mask& mask, int key_block,
                              int query_block, int B_r, int B_c) const {
        return descending ? adds_from_above(a, key_block, query_block, B_r, B_c)
                          : key_block - first_key_block_seeing(mask, query_block, B_r, B_c);
    }
};

// The query blocks of one CTA's walk, in order: for each query head of its K/V head, the blocks
// that see a key of the block (QueryBlocks), those at the ends masked, and every block of a key
// block that runs past seq_k (below). Queries past seq_q need no mask: their LSE is +inf, so P is
// 0. Rotated (BackwardTraits::rotate_walks): each head's blocks from `start` to the end, then from
// the first, the sequence's key blocks' starts spread evenly over the blocks.
struct QueryWalk {
    QueryBlocks blocks;  // of each head
    int group;           // query heads of the K/V head
    int start;           // the block each head's walk begins with

    template <class Mask>
    static constexpr QueryWalk of(const BackwardArgs& a, const Mask& mask, int k0, int B_r, int B_c,
                                  bool rotate) {
        QueryWalk w{QueryBlocks::of(mask, k0, std::min(k0 + B_c, mask.seq_k) - 1, B_r),
                    a.heads / a.heads_kv, 0};
        w.start = w.blocks.first;
        if (rotate && w.per_head() > 1) {
            const int key_blocks = blocks_covering(mask.seq_k, B_c);
            w.start +=
                static_cast<int>(static_cast<std::int64_t>(k0 / B_c) * w.per_head() / key_blocks);
        }
        return w;
    }
    constexpr int per_head() const { return blocks.end - blocks.first; }
    constexpr int steps() const { return group * per_head(); }

    // A step's query head (within the group) and block, advanced step by step: a division of
    // the step's index by per_head() took the consumers about 40 instructions of a step's ~480
    // (SASS, d_head 128, CUDA 13.0). Rotated (BackwardTraits::rotate_walks) a compile-time flag,
    // so that the kernels that never rotate keep their code.
    struct Step {
        int head, block;
        template <bool Rotated>
        constexpr void advance(const QueryWalk& walk) {
            const bool wrap = ++block == walk.blocks.end;
            if (wrap)
                block = walk.blocks.first;
            if (Rotated ? block == walk.start : wrap)
                ++head;
        }
    };
    template <bool Rotated>
    constexpr Step first() const {
        return {0, Rotated ? start : blocks.first};
    }
};

}  // namespace flash_attention::sm90
