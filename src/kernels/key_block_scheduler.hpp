#pragma once

// The sm90 backward's grid order (sm90/backward_kernel.cuh): which key block of which K/V head
// and sequence a CTA takes, and the order of the query blocks its walk visits (QueryWalk).
// constexpr, so that host code (the launch's grid size, the host tests) and device code
// (--expt-relaxed-constexpr) share it.

#include <algorithm>
#include <cstddef>
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

// Stream-K (BackwardTraits::stream_k: persistent CTAs on the dynamic schedule, dense non-causal
// problems, whose walks all take `walk` steps). A grid of T key blocks on C CTAs leaves its last
// round T mod C key blocks, so that a part of the CTAs idles through a whole walk while the rest
// end it (non-causal grid cells: 15.5 or 31.03 rounds of 132, a spread of 0.970,
// bench/tile_order.py
// --backward). Instead, the counter hands out the first `whole` key blocks whole, then numbers
// ranges: the steps of the last `blocks` key blocks, one after another, cut into C equal ranges
// (where the last round holds under a third of C, the last C + T mod C key blocks: ranges of a
// few steps each would pay a walk's fixed costs for little). A range is a piece of each key
// block it touches: the end of one, at most a whole one, the start of the next (a range holds
// at most 4/3 of a walk). A piece that is not a whole walk stores its dK and dV (fp32, unscaled)
// in its slot and counts itself on its key block's counter; the piece that counts last adds the
// others' slots to its own and stores the key block's dK and dV. No piece waits for another, so
// the order the counter hands ranges out in cannot deadlock. dQ needs nothing: its adds are per
// step already. Not with ordered dQ (whose adds follow the key blocks' order), a mask, a window
// or packed sequences (walks of unequal length).
struct BackwardStreamK {
    // A key block's pieces at most (the merge's loads are unrolled over the others').
    static constexpr int k_max_pieces = 4;
    int whole = 0;   // key blocks handed out whole: the counter's numbers [0, whole)
    int blocks = 0;  // key blocks after them, in ranges: numbers [whole, whole + ranges)
    int walk = 0;    // steps of every walk
    int ranges = 0;  // the CTAs; 0: no split

    // The split of a launch of `ctas` CTAs (the kernel's gridDim.x), or none where its last
    // round is full, the problem's walks are not all alike, no whole round of key blocks stays
    // whole (the first round is every CTA's own), or a range would hold no step.
    static constexpr BackwardStreamK of(const BackwardArgs& a, int B_r, int B_c,
                                        std::int64_t ctas) {
        if (a.causal || a.banded || a.cu_seqlens_q != nullptr || ctas <= 0 || ctas > 1 << 16)
            return {};
        const std::int64_t key_blocks = KeyBlockScheduler::of(a, B_c, false).count();
        const std::int64_t walk =
            std::int64_t{a.heads / a.heads_kv} * blocks_covering(a.seq_q, B_r);
        std::int64_t tail = key_blocks % ctas;
        if (tail == 0)
            return {};
        if (3 * tail < ctas)
            tail += ctas;
        const std::int64_t whole = key_blocks - tail;
        // (The kernel's ints: range_of's products, units x ctas, stay below 2^31. A key block's
        // pieces: at most k_max_pieces, which its ranges of at least units / ctas steps
        // ensure where walk - 1 <= 3 x that.)
        const std::int64_t units = tail * walk;
        if (whole < ctas || units < ctas || units > std::numeric_limits<int>::max() / ctas ||
            walk - 1 > (k_max_pieces - 1) * (units / ctas))
            return {};
        return {static_cast<int>(whole), static_cast<int>(tail), static_cast<int>(walk),
                static_cast<int>(ctas)};
    }
    constexpr bool splits() const { return ranges > 0; }
    // What follows is the kernels' arithmetic, in ints (of() bounds units x ranges below 2^31):
    // 64-bit divisions took the d_head 128 kernel's 24-register producer and dQ warps hundreds
    // of bytes of spills (ptxas, CUDA 13.0).
    // The memory it takes: two slots a range of B_c x `columns` floats (dK's and dV's), and the
    // split key blocks' counters.
    constexpr std::size_t bytes(int B_c, int columns) const {
        return splits()
                   ? 4 * (2 * static_cast<std::size_t>(ranges) * static_cast<std::size_t>(B_c) *
                              static_cast<std::size_t>(columns) +
                          static_cast<std::size_t>(blocks))
                   : 0;
    }
    // The counter's numbers: key blocks, then ranges.
    constexpr int count() const { return whole + ranges; }

    constexpr int units() const { return blocks * walk; }
    // Range r's first step (of the split key blocks' steps, one walk after another).
    constexpr int start(int r) const { return r * units() / ranges; }
    // The range holding step u: the last r with start(r) <= u, i.e. r x units < (u + 1) ranges.
    constexpr int range_of(int u) const { return ((u + 1) * ranges - 1) / units(); }
    // Pieces of range r: one for each split key block it touches.
    constexpr int pieces_in(int r) const { return (start(r + 1) - 1) / walk - start(r) / walk + 1; }
    // The ranges holding split key block b's pieces, first and last.
    constexpr int first_range(int b) const { return range_of(b * walk); }
    constexpr int last_range(int b) const { return range_of((b + 1) * walk - 1); }
    // Piece j of split key block b's slot: two a range, the range's first piece's, then the one
    // that starts inside it (only a block's first piece can).
    constexpr int slot(int b, int j) const {
        const int r = first_range(b) + j;
        return 2 * r + (j == 0 && start(r) != b * walk ? 1 : 0);
    }

    struct Piece {
        int block;  // split key block b: the schedule's key block whole + b
        int first;  // its first step in the walk
        int steps;
        int pieces;  // of block b (1: the whole walk, no slot)
        int index;   // among them, in step order
    };
    // Piece p (0 .. pieces_in(r) - 1) of range r.
    constexpr Piece piece(int r, int p) const {
        const int s = start(r), e = start(r + 1);
        const int b = s / walk + p;
        const int block0 = b * walk;
        const int at = p == 0 ? s : block0;
        const int first = first_range(b);
        return {b, at - block0, std::min(e, block0 + walk) - at, last_range(b) - first + 1,
                r - first};
    }
};

// The query blocks of one CTA's walk, in order: for each query head of its K/V head, the blocks
// that see a key of the block (QueryBlocks), those at the ends masked, and every block of a key
// block that runs past seq_k (below). Queries past seq_q need no mask: their LSE is +inf, so P is
// 0. Rotated (BackwardTraits::rotate_walks): each head's blocks from `start` to the end, then from
// the first, the sequence's key blocks' starts spread evenly over the blocks.
//
// A stream-K piece (BackwardStreamK) walks steps [begin, begin + length) of its key block's walk.
struct QueryWalk {
    QueryBlocks blocks;  // of each head
    int group;           // query heads of the K/V head
    int start;           // the block each head's walk begins with
    int begin;           // the first step walked
    int length;          // the steps walked

    template <class Mask>
    static constexpr QueryWalk of(const BackwardArgs& a, const Mask& mask, int k0, int B_r, int B_c,
                                  bool rotate) {
        QueryWalk w{QueryBlocks::of(mask, k0, std::min(k0 + B_c, mask.seq_k) - 1, B_r),
                    a.heads / a.heads_kv, 0, 0, 0};
        w.start = w.blocks.first;
        w.length = w.group * w.per_head();
        if (rotate && w.per_head() > 1) {
            const int key_blocks = blocks_covering(mask.seq_k, B_c);
            w.start +=
                static_cast<int>(static_cast<std::int64_t>(k0 / B_c) * w.per_head() / key_blocks);
        }
        return w;
    }
    constexpr int per_head() const { return blocks.end - blocks.first; }
    // The steps walked. Pieces (BackwardTraits::stream_k, a compile-time flag, so that the
    // kernels without it keep their code): [begin, begin + length), else the whole walk.
    template <bool Pieces = false>
    constexpr int steps() const {
        return Pieces ? length : group * per_head();
    }
    // Only steps [first, first + count) of the walk (a stream-K piece).
    constexpr void restrict(int first, int count) {
        begin = first;
        length = count;
    }

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
    // The first step walked: its head and block (a division only for a piece that starts
    // inside the walk).
    template <bool Rotated, bool Pieces = false>
    constexpr Step first() const {
        if (!Pieces || begin == 0)
            return {0, Rotated ? start : blocks.first};
        const int head = begin / per_head();
        int block = (Rotated ? start : blocks.first) + (begin - head * per_head());
        if (block >= blocks.end)
            block -= per_head();
        return {head, block};
    }
};

}  // namespace flash_attention::sm90
