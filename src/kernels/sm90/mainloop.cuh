#pragma once

// The sm90 main loop: the producer warpgroup's TMA copies of Q, K and V through a
// `stages`-deep ring, the ping-pong GEMM turns, and a consumer warpgroup's steps over the
// K/V blocks of one tile (consume() is the algorithm; docs/design.md describes it).

#include <cstdint>
#include <type_traits>

#include "kernels/fp8.hpp"
#include "kernels/primitives/masking.cuh"
#include "kernels/primitives/online_softmax.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm80/warp_gemm.cuh"
#include "kernels/primitives/sm90/ptx.cuh"
#include "kernels/primitives/sm90/tma.cuh"
#include "kernels/primitives/sm90/warpgroup_gemm.cuh"
#include "kernels/sm90/epilogue.cuh"
#include "kernels/sm90/tensor_maps.hpp"
#include "kernels/sm90/tile_scheduler.cuh"
#include "kernels/sm90/traits.cuh"

namespace flash_attention::sm90 {

// The first W tiles of a register tile array (S's accumulators, P's fragments) as an array of
// their own, in the same registers: a half block's softmax and P·V take them (consume()).
template <int W, class T, int N>
__device__ __forceinline__ auto first_tiles(T (&tiles)[1][N][4]) -> T (&)[1][W][4] {
    static_assert(W <= N, "a prefix of the tiles");
    return reinterpret_cast<T(&)[1][W][4]>(tiles);
}

// The Q buffer of the `iteration`-th tile a CTA works on, and its barriers' parity.
template <class Tr>
struct QSlot {
    int buffer;
    std::uint32_t parity;
    __device__ __forceinline__ explicit QSlot(int iteration)
        : buffer(iteration % Tr::q_buffers),
          parity(static_cast<std::uint32_t>((iteration / Tr::q_buffers) & 1)) {}
};

// This producer lane's share of a paged K/V block: run `lane` of its page_copy_rows-row
// runs (a run never crosses a page), at (row in page, page id). Keys past the sequence's
// end read no table entry and copy page -1, which TMA fills with zeros, as it does a page
// id outside the cache: neither is ever dereferenced. The lanes read their ids together,
// and K and V share them: one thread reading a block's ids one after another (each copy
// waiting on its read) ran chunked prefill on 16-row pages at 55% of the contiguous
// cache's speed, its warps stalled on those reads (ncu, H100, 2026-11-24, docs/PERF.md).
struct PageRun {
    int tile_row;  // the run's first row in the block; B_c or more: this lane has none
    int row;       // its first row in the page
    int id;        // its page, or -1
};

template <class Tr>
__device__ __forceinline__ PageRun page_run(const SequenceArgs& seqs, const Tile& t, int key_row,
                                            int lane) {
    // Runs are at least 16 rows (page sizes and B_c are multiples of 16): a lane for each.
    static_assert(Tr::B_c <= 16 * warp_size, "a producer lane for every run of a block");
    PageRun run{lane * seqs.page_copy_rows, 0, -1};
    if (run.tile_row < Tr::B_c) {
        const int key = key_row + run.tile_row;
        const int page = key / seqs.k_view_seq;
        run.row = key - page * seqs.k_view_seq;
        if (key < t.k.len)
            run.id = __ldg(seqs.block_table + t.k.entry * seqs.block_table_stride + page);
    }
    return run;
}

// K or V block rows [key_row, key_row + B_c) of tile t into a stage (Block: Traits::KTile or
// VTile, PagedBlock its paged form): one copy a sub-tile (64 or 32 columns) of the whole block, or
// (paged) one copy of this lane's run, all its columns. Transposed (FP8's V): the block's keys
// of V's transposed copy, whose rows are V's columns and whose 16-bit columns pairs of keys.
template <class Block, class PagedBlock, bool Paged, bool Transposed = false>
__device__ __forceinline__ void load_kv_block(unsigned char* stage, const CUtensorMap* map,
                                              const Tile& t, int key_row, const PageRun& run,
                                              tma::Barrier& full) {
    static_assert(!(Paged && Transposed), "FP8 reads no paged cache");
    if constexpr (Transposed) {
        tma::load_tile_at<Block>(stage, map, key_row / 2, 0, t.kv_head, t.k.entry, full);
    } else if constexpr (!Paged) {
        tma::load_tile<Block>(stage, map, key_row, t.kv_head, t.k.entry, full);
    } else if (run.tile_row < PagedBlock::rows) {
        tma::load_group_rows<PagedBlock>(stage, run.tile_row, map, run.row, t.kv_head, run.id,
                                         full);
    }
}

// transpose_v: the staging barriers (Traits::v_staging_barrier_offset).
template <class Tr>
__device__ __forceinline__ VStagingBarriers<Tr::stages>& v_staging_barriers(unsigned char* smem) {
    return *reinterpret_cast<VStagingBarriers<Tr::stages>*>(smem + Tr::v_staging_barrier_offset);
}

// The producer: one thread issues every copy, tile after tile (paged: the whole warp, lane 0
// alone doing all but the K/V copies). It refills a K/V stage once every consumer warp has
// emptied it, so up to `stages` blocks are in flight ahead (across tiles too), and loads a
// tile's Q once the consumers have stored the previous tile's O from that buffer (or, O
// staged apart, handed the buffer back after their last S GEMM: the load is then hidden, and
// an L2 prefetch of the next tile's Q measured level to -1.5% at d_head 256, H200,
// 2026-11-26, docs/PERF.md). Paged is a separate instantiation, so the page walk's
// registers never press on the dense loop (the producer has 24 or 32: in one loop the dense
// kernels spilled 16-44 bytes). Variants: a sliding window's tiles start at their first
// visited block.
template <class Tr, bool PerSequence, bool Paged, bool Variants, class Scheduler>
__device__ __forceinline__ void produce(const Params& params, unsigned char* smem,
                                        Barriers<Tr::q_pairs, Tr::stages>& bars,
                                        const Scheduler& scheduler) {
    const KernelArgs& args = params.args;
    const int lane = Paged ? static_cast<int>(threadIdx.x % warp_size) : 0;
    const bool leader = lane == 0;
    // Lane 0's claim, seen by every lane (the tile loop is the warp's).
    const auto claim = [&] {
        const int claimed = leader ? scheduler.claim() : 0;
        return Paged ? __shfl_sync(0xffffffffu, claimed, 0) : claimed;
    };
    int ring = 0;  // K/V blocks loaded so far: the ring position of the next
    int iteration = 0;
    int index = scheduler.first();
    int claimed = 0;
    for (; index < scheduler.count(args); index = scheduler.next(index, claimed)) {
        const Tile t = scheduler.template tile<PerSequence, Variants>(args, index);
        if (t.empty()) {  // a number the packed numbering leaves unused
            claimed = claim();
            continue;
        }
        // Q buffers are a ring too. Parity ^ 1: the first pass finds each buffer empty. With
        // a pair of barriers per consumer (Traits::q_split) each consumer's rows load as soon
        // as that consumer is done with them, in the consumers' order.
        const QSlot<Tr> q(iteration++);
        for (int w0 = 0; w0 < Tr::consumers; w0 += Tr::consumers_per_q_pair) {
            tma::Barrier& full = bars.q_full[Tr::q_pair(q.buffer, w0)];
            bars.q_empty[Tr::q_pair(q.buffer, w0)].wait(q.parity ^ 1);
            if (!leader)
                continue;
            if (w0 == 0)  // the pairs' arrivals that follow make it visible
                scheduler.publish(q, index);
            full.arrive_expect_tx(Tr::q_pair_bytes);
            for (int w = w0; w < w0 + Tr::consumers_per_q_pair; ++w) {
                unsigned char* const rows =
                    smem + Tr::q_offset + q.buffer * Tr::q_buffer_bytes + w * Tr::QTile::bytes;
                const int row = t.q_row0 + w * Tr::rows_per_consumer;  // in the sequence
                if constexpr (Tr::pack_gqa) {
                    // A consumer's 64 rows are whole positions: the group's heads divide 64.
                    tma::load_packed_tile<typename Tr::QTile>(
                        rows, &params.maps.q, t.q.row0 + row_position<Tr>(args, row), t.kv_head,
                        t.q.entry, full);
                } else {
                    tma::load_tile<typename Tr::QTile>(rows, &params.maps.q, t.q.row0 + row, t.head,
                                                       t.q.entry, full);
                }
            }
        }
        claimed = claim();
        // Walks the ring position and the key row together: as many live registers as
        // before tiles carried a row offset (the producer has 24 or 32).
        const int ring_end = ring + t.visited;
        for (int key_row = t.k.row0 + t.first * Tr::B_c; ring < ring_end;
             ++ring, key_row += Tr::B_c) {
            const RingSlot<Tr::stages> slot(ring);
            PageRun run{};
            if constexpr (Paged)
                run = page_run<Tr>(args.seqs, t, key_row, lane);  // read while the stage drains
            bars.k_empty[slot.stage].wait(slot.parity ^ 1);
            if (leader)
                bars.k_full[slot.stage].arrive_expect_tx(Tr::KTile::bytes);
            load_kv_block<typename Tr::KTile, typename Tr::PagedKTile, Paged>(
                smem + Tr::k_offset + slot.stage * Tr::KTile::bytes, &params.maps.k, t, key_row,
                run, bars.k_full[slot.stage]);
            if constexpr (Tr::transpose_v) {
                // V as stored, into the stage's staging tile; the transposers fill the V tile.
                static_assert(!Paged, "FP8 reads no paged cache");
                VStagingBarriers<Tr::stages>& vs = v_staging_barriers<Tr>(smem);
                vs.empty[slot.stage].wait(slot.parity ^ 1);
                if (leader)
                    vs.full[slot.stage].arrive_expect_tx(Tr::VStagingTile::bytes);
                load_kv_block<typename Tr::VStagingTile, typename Tr::PagedVTile, false>(
                    smem + Tr::v_staging_offset + slot.stage * Tr::VStagingTile::bytes,
                    &params.maps.v, t, key_row, run, vs.full[slot.stage]);
            } else {
                bars.v_empty[slot.stage].wait(slot.parity ^ 1);
                if (leader)
                    bars.v_full[slot.stage].arrive_expect_tx(Tr::VTile::bytes);
                load_kv_block<typename Tr::VTile, typename Tr::PagedVTile, Paged, Tr::fp8>(
                    smem + Tr::v_offset + slot.stage * Tr::VTile::bytes, &params.maps.v, t, key_row,
                    run, bars.v_full[slot.stage]);
            }
        }
    }
    if (leader)
        scheduler.finish(QSlot<Tr>(iteration), bars, index);
    if constexpr (Tr::transpose_v) {
        // No block follows: once the transposers have read the block that last used the next
        // slot's staging tile, its end word, then an arrival without bytes on its full barrier.
        VStagingBarriers<Tr::stages>& vs = v_staging_barriers<Tr>(smem);
        const RingSlot<Tr::stages> slot(ring);
        vs.empty[slot.stage].wait(slot.parity ^ 1);
        vs.end[slot.stage].ring = static_cast<std::uint32_t>(ring);
        vs.full[slot.stage].arrive();
    }
}

// transpose_v: a lane's load and store offsets at group 0 and k-step 0, which
// transpose_v_block moves by whole 8-row groups and chunk XORs.
template <class Tr>
__device__ constexpr std::uint32_t transpose_v_load_lane(int lane) {
    return static_cast<std::uint32_t>(Tr::VStagingTile::chunk_offset(fp8_vt_load_key(0, lane), 0));
}
template <class Tr>
__device__ constexpr std::uint32_t transpose_v_store_lane(int lane) {
    return static_cast<std::uint32_t>(
        Tr::VTile::chunk_offset(fp8_vt_store_row(0, lane), fp8_vt_store_chunk(0, lane)));
}

// transpose_v: one warp's share of a V block's transpose, from the staging tile into the V tile
// in V's transposed copy's key order (kernels/fp8.hpp: fp8_vt_load_key and the rest say how):
// 16-column groups cg = warp, warp + transposers, ..., each as k_steps units of 32 keys. The
// swizzle repeats every 8 rows and XORs only a chunk's bits, so a unit's addresses are a
// lane's offsets (load_lane, store_lane: hoisted) moved by whole 8-row groups and chunk XORs:
// per group an XOR and an add each side, per unit immediates (g unrolled), leaving 7
// instructions a unit, 6 of them moving data. Computed from the indices per unit (47
// instructions of signed index arithmetic), the three warps took about 3000 cycles for a
// 16 KB block and held FP8 d_head 128 at 600 TFLOP/s (ncu source counters, H100, 2026-12-06).
template <class Tr>
__device__ __forceinline__ void transpose_v_block(std::uint32_t staging, std::uint32_t vt,
                                                  unsigned warp, std::uint32_t load_lane,
                                                  std::uint32_t store_lane, unsigned first,
                                                  unsigned second) {
    using Staging = typename Tr::VStagingTile;
    using VTile = typename Tr::VTile;
    constexpr int k_steps = Tr::B_c / fp8_k_step_keys;
    constexpr unsigned groups = Tr::d_v / 16, transposers = Tr::transposer_threads / warp_size;
#pragma unroll 1  // the groups' loop rolled: the producer warpgroup has 24 registers
    for (unsigned cg = warp; cg < groups; cg += transposers) {
        const int group = static_cast<int>(cg);
        // Key rows fp8_vt_load_key(g, lane) = 32 g + lane at chunk cg; V's columns
        // fp8_vt_store_row(cg, lane) = 16 cg + that of group 0, at chunk fp8_vt_store_chunk(g,
        // lane) = 2 g + that of g = 0.
        const std::uint32_t load = Staging::chunk_offset_from(staging + load_lane, group);
        const std::uint32_t store = vt + VTile::group_offset(16 * group) + store_lane;
#pragma unroll
        for (int g = 0; g < k_steps; ++g) {
            std::uint32_t r[4];
            ptx::ldmatrix_x4_trans(r, load + Staging::group_offset(fp8_k_step_keys * g));
            const std::uint32_t out[4] = {
                __byte_perm(r[0], r[1], first), __byte_perm(r[0], r[1], second),
                __byte_perm(r[2], r[3], first), __byte_perm(r[2], r[3], second)};
            ptx::stmatrix_x4(VTile::chunk_offset_from(store, 2 * g), out);
        }
    }
}

// transpose_v_block's addresses against each unit's by the definitions (fp8_vt_load_key and the
// rest, through chunk_offset) for every lane, group and k-step, relative to the tiles' bases
// (which sit on the swizzle's period: the XORs move no base bit). Checked as the kernel compiles.
template <class Tr>
__device__ constexpr bool transpose_v_addresses_hold() {
    using Staging = typename Tr::VStagingTile;
    using VTile = typename Tr::VTile;
    for (int lane = 0; lane < warp_size; ++lane) {
        const std::uint32_t load_lane = transpose_v_load_lane<Tr>(lane),
                            store_lane = transpose_v_store_lane<Tr>(lane);
        for (int cg = 0; cg < Tr::d_v / 16; ++cg) {
            for (int g = 0; g < Tr::B_c / fp8_k_step_keys; ++g) {
                const std::uint32_t load = Staging::chunk_offset_from(load_lane, cg) +
                                           Staging::group_offset(fp8_k_step_keys * g);
                const std::uint32_t store =
                    VTile::chunk_offset_from(VTile::group_offset(16 * cg) + store_lane, 2 * g);
                if (load != static_cast<std::uint32_t>(
                                Staging::chunk_offset(fp8_vt_load_key(g, lane), cg)) ||
                    store != static_cast<std::uint32_t>(VTile::chunk_offset(
                                 fp8_vt_store_row(cg, lane), fp8_vt_store_chunk(g, lane))))
                    return false;
            }
        }
    }
    return true;
}

// transpose_v: the producer warpgroup's other warps (transposer_threads), block after block in
// the producer's ring order until its last (VStagingBarriers::end): wait for V's block in
// the staging tile and for the consumers to free the stage's V tile, transpose, fence the
// writes to the async proxy that wgmma reads through, then each thread arrives on v_full and
// on the staging tile's empty barrier: each reader's own arrival orders its reads of the tile
// and the end word before the producer's next writes (racecheck follows an mbarrier from
// arrival to wait, not through __syncwarp: with a lane 0 a warp arriving it reported the end
// word's accesses, H100, 2026-12-06).
template <class Tr>
__device__ __forceinline__ void transpose_v_blocks(unsigned char* smem,
                                                   Barriers<Tr::q_pairs, Tr::stages>& bars) {
    static_assert(transpose_v_addresses_hold<Tr>(), "hoisted addresses are each unit's");
    static_assert(Tr::VTile::bytes % 1024 == 0 && Tr::VStagingTile::bytes % 1024 == 0,
                  "every stage's tiles on the swizzle's period");
    VStagingBarriers<Tr::stages>& vs = v_staging_barriers<Tr>(smem);
    const unsigned thread = threadIdx.x - warp_size;  // warps 1.. of warpgroup 0
    const unsigned warp = thread / warp_size;
    const int lane = static_cast<int>(thread % warp_size);
    const std::uint32_t load_lane = transpose_v_load_lane<Tr>(lane),
                        store_lane = transpose_v_store_lane<Tr>(lane);
    const unsigned first = fp8_vt_selector(lane, false), second = fp8_vt_selector(lane, true);
    const std::uint32_t staging0 = ptx::smem_address(smem + Tr::v_staging_offset);
    const std::uint32_t vt0 = ptx::smem_address(smem + Tr::v_offset);
    for (int ring = 0;; ++ring) {
        const RingSlot<Tr::stages> slot(ring);
        vs.full[slot.stage].wait(slot.parity);
        if (static_cast<std::uint32_t>(ring) == vs.end[slot.stage].ring)
            return;
        bars.v_empty[slot.stage].wait(slot.parity ^ 1);
        transpose_v_block<Tr>(staging0 + slot.stage * Tr::VStagingTile::bytes,
                              vt0 + slot.stage * Tr::VTile::bytes, warp, load_lane, store_lane,
                              first, second);
        tma::fence_shared_to_async_proxy();
        bars.v_full[slot.stage].arrive();
        vs.empty[slot.stage].arrive();
    }
}

// Ping-pong: consumer w may issue GEMMs only while it holds the turn, which passes
// w -> w + 1 -> ... -> 0 through named barriers of 256 threads (the waiting warpgroup
// and the one handing over). The last consumer opens the first turn (at its first
// acquire, so a CTA without GEMMs leaves every barrier untouched); every consumer hands
// over as often as it takes the turn, and finish() lets consumer 0 absorb the last
// consumer's final hand-over, so no barrier is left half-arrived at exit.
template <class Tr, bool Enabled>
struct GemmTurns {
    int consumer;
    bool started = false;
    __device__ __forceinline__ void acquire() {
        if constexpr (Enabled) {
            if (!started && consumer == Tr::consumers - 1)
                ptx::named_barrier_arrive(Tr::barrier_id(NamedBarrier::gemm_turn, 0),
                                          2 * warpgroup_threads);
            started = true;
            ptx::named_barrier_sync(Tr::barrier_id(NamedBarrier::gemm_turn, consumer),
                                    2 * warpgroup_threads);
        }
    }
    __device__ __forceinline__ void release() const {
        if constexpr (Enabled) {
            ptx::named_barrier_arrive(
                Tr::barrier_id(NamedBarrier::gemm_turn, (consumer + 1) % Tr::consumers),
                2 * warpgroup_threads);
        }
    }
    // Takes the turn and hands it on at once: a consumer with nothing to issue keeps the
    // rotation in step (pass()).
    __device__ __forceinline__ void skip() {
        acquire();
        release();
    }
    __device__ __forceinline__ void finish() const {
        if (Enabled && started && consumer == 0)
            ptx::named_barrier_sync(Tr::barrier_id(NamedBarrier::gemm_turn, 0),
                                    2 * warpgroup_threads);
    }
};

// A consumer warpgroup's state and steps; consume() below is the algorithm.
// PerSequence: the instantiation for varlen batches and KV caches (tile_at); the dense one
// masks with the call's lengths and never zeroes V rows. Variants (a per-sequence
// instantiation): a sliding window's band mask on the blocks at both of its ends, and the
// logit softcap (KernelArgs::band, softcap_prescale). Paged (a per-sequence instantiation):
// K and V come from a paged cache, in group-major tiles. Alibi (on Variants): ALiBi's bias
// (KernelArgs::alibi_slopes), an instance of its own: as a runtime branch in the window and
// softcap kernels it cost them 1.5-2% (d_head 64 window, d_head 128 B_c 80 softcap; H200,
// 2026-12-03, docs/PERF.md).
template <class Tr, bool PerSequence, bool Variants = false, bool Paged = false, bool Alibi = false>
struct Consumer {
    static_assert(Variants || !Alibi, "ALiBi runs on the variant body");
    static constexpr DType dtype = Tr::dtype;
    // K and V blocks as the producer lays them out (a paged cache's: group-major).
    using KTile = std::conditional_t<Paged, typename Tr::PagedKTile, typename Tr::KTile>;
    using VTile = std::conditional_t<Paged, typename Tr::PagedVTile, typename Tr::VTile>;
    static constexpr int s_tiles = Tr::B_c / 8;
    static constexpr int o_tiles = Tr::o_cols / 8;
    // Whether a last block whose keys this consumer's rows see all lie in its first half
    // runs as a half block (half_last): the half_blocks knob, in trimmed tiles of B_c 128,
    // where each consumer's blocks end with its own rows' keys. The code costs the loop
    // itself: d_head 64's causal tile gains 2.2-3.6% with it at 512 keys, is level at 1k-4k
    // and loses 1.3-2.8% at 8k-16k, and non-causal (where no block is half) 1-2% at 512-1k
    // (H200, docs/PERF.md, 2026-11-28). The block's first rows must be a prefix of the stage
    // (not so in a paged tile), and a window's blocks are masked at their start too.
    static constexpr bool half_blocks = Tr::half_blocks && !Variants && !Paged;

    const KernelArgs& args;
    // Of the tile, only what the main loop needs: the rest is recomputed for the epilogue
    // (forward_kernel.cuh).
    int visited;  // K/V blocks this consumer computes (trim_blocks: up to its own rows' keys)
    int passed;   // the tile's blocks after those (trim_blocks: pass())
    int last_block_keys;  // Tile::last_block_keys
    Barriers<Tr::q_pairs, Tr::stages>& bars;
    std::uint32_t q_smem, k_smem, v_smem;  // shared-state-space addresses
    int consumer;                          // 0 .. consumers - 1
    int first_row;                         // of this warp, in the sequence
    int unmasked;                          // blocks before this one need no mask here
    // The last block's keys that this consumer's rows see lie in its first B_c / 2 (or it
    // sees none there): with half_blocks, the softmax and P·V of that block cover only
    // those keys (consume()). Causal tiles of 64-row consumers and B_c 128 end so on every
    // other consumer: a tenth of the blocks at 512 keys (docs/PERF.md, 2026-11-26).
    bool half_last;
    // Row r of the sequence sees keys below r + 1 + key_bound (causal at the bottom right:
    // the sequence's keys minus its queries), below min(r + 1, key_bound) (causal at the top
    // left: its keys) or below key_bound (not causal: its keys): one register across the
    // main loop instead of both lengths (two cost d_head 128's dynamic kernel a spill).
    // Rows past the sequence's end see more, but are never stored. pack_gqa: rows are
    // (position, head) pairs, and the mask reads their positions (row_position()).
    // Variants: the sequence's keys, and row r's diagonal position is r + band_shift.
    int key_bound;
    // Block j is block first + j of the keys (a window's start, a stream-K piece's; else 0),
    // and with Variants blocks before masked_head need the mask too (a window's start).
    int first;
    int masked_head;
    int band_shift;
    float alibi_slope;            // Alibi: the tile's ALiBi slope in S's units (alibi_slope())
    int ring;                     // ring position of the tile's block 0
    int q_pair;                   // the barriers of this consumer's Q rows (Traits::q_pair())
    PendingStore& pending_store;  // the previous tile's O store
    // Q as A fragments when the config holds it in registers (else unused, and dropped).
    std::uint32_t q_frags[Tr::q_cols / 16][4];
    // FP8: each block's P·V in accumulators of its own (Traits::pv_parts of O's columns
    // taking turns in pv_buffers), added to O in fp32 once retired (retire_pv). Hopper's FP8
    // MMA adds into its accumulator at about 14 bits, so a growing O lost the smaller terms
    // of later blocks: with V of one sign over 16k keys, O was 0.36 off at d_head 128 (H100,
    // 2026-12-06, docs/PERF.md). Unused (and dropped) elsewhere.
    float pv_block[Tr::fp8 ? Tr::pv_buffers : 1][Tr::fp8 ? Tr::pv_cols / 8 : 1][4];

    __device__ __forceinline__ RingSlot<Tr::stages> slot(int j) const {
        return RingSlot<Tr::stages>(ring + j);
    }

    __device__ __forceinline__ std::uint32_t k_stage(int stage) const {
        return k_smem + stage * KTile::bytes;
    }
    __device__ __forceinline__ std::uint32_t v_stage(int stage) const {
        return v_smem + stage * VTile::bytes;
    }

    // Waits for K_j (V_j) to land; done before taking a GEMM turn, so a warpgroup never
    // holds the turn while it waits for memory.
    __device__ __forceinline__ void wait_k(int j) {
        bars.k_full[slot(j).stage].wait(slot(j).parity);
    }
    __device__ __forceinline__ void wait_v(int j) {
        bars.v_full[slot(j).stage].wait(slot(j).parity);
    }

    // Issues S = Q·K_jᵀ. The operand fences pin S's registers on both sides of the
    // asynchronous GEMM, so nothing reads or moves them before the matching wait.
    __device__ __forceinline__ void issue_qk(float (&s)[1][s_tiles][4], int j) {
        ptx::fence_operands(s[0]);
        ptx::wgmma_fence();
        if constexpr (Tr::q_in_registers) {
            warpgroup_gemm_qk<dtype, KTile>(s[0], q_frags, k_stage(slot(j).stage));
        } else {
            warpgroup_gemm_qk<dtype, typename Tr::QTile, KTile>(s[0], q_smem,
                                                                k_stage(slot(j).stage));
        }
        ptx::wgmma_commit_group();
        ptx::fence_operands(s[0]);
    }

    // Issues O += P·V_j over the block's first 16 KT keys (p_in_smem: P from this consumer's
    // P tile, which hand_p() filled; FP8: 32 KT keys, V from its transposed copy, the first
    // pv_buffers parts into pv_block, which retire_pv() adds to O and issues the rest). Each
    // FP8 part is a commit group of its own: pv_groups of them in flight.
    static constexpr int pv_groups = Tr::fp8 ? Tr::pv_buffers : 1;
    template <int KT>
    __device__ __forceinline__ void issue_pv(float (&o)[1][o_tiles][4],
                                             const std::uint32_t (&p)[1][KT][4], int j) {
        if constexpr (Tr::fp8) {
#pragma unroll
            for (int part = 0; part < Tr::pv_buffers; ++part)
                issue_pv_part(part, p, j);
        } else {
            ptx::fence_operands(o[0]);
            ptx::wgmma_fence();
            if constexpr (Tr::p_in_smem) {
                warpgroup_gemm_pv<dtype, typename Tr::PTile, VTile, 16 * KT>(
                    o[0], p_tile(), v_stage(slot(j).stage));
            } else {
                warpgroup_gemm_pv<dtype, VTile, 16 * KT>(o[0], p[0], v_stage(slot(j).stage));
            }
            ptx::wgmma_commit_group();
            ptx::fence_operands(o[0]);
        }
    }

    // FP8: pv_block[part % pv_buffers] = P·V_j over O's columns of `part` (V's transposed
    // copy: those rows of it).
    template <int KT>
    __device__ __forceinline__ void issue_pv_part(int part, const std::uint32_t (&p)[1][KT][4],
                                                  int j) {
        float(&block)[Tr::pv_cols / 8][4] = pv_block[part % Tr::pv_buffers];
        ptx::fence_operands(block);
        ptx::wgmma_fence();
        warpgroup_gemm_pv_e4m3<VTile, Tr::pv_cols, 32 * KT>(
            block, p[0], v_stage(slot(j).stage) + VTile::group_offset(part * Tr::pv_cols), false);
        ptx::wgmma_commit_group();
        ptx::fence_operands(block);
    }

    // p_in_smem: this consumer's P tile (Traits::p_offset), from the K stages' address rather
    // than a member of its own, so that the other kernels' consumers stay as they are.
    __device__ __forceinline__ std::uint32_t p_tile() const {
        return k_smem - Tr::k_offset + Tr::p_offset + consumer * Tr::PTile::bytes;
    }

    // p_in_smem: P's fragments into the P tile for the next P·V (whose GEMM before it has
    // retired: the tile is free), fenced to the async proxy the wgmma reads through, and the
    // warpgroup synced so that every warp's rows are there. Else nothing: P·V reads the
    // registers.
    template <int KT>
    __device__ __forceinline__ void hand_p(const std::uint32_t (&p)[1][KT][4]) const {
        if constexpr (Tr::p_in_smem) {
            store_a_fragments<typename Tr::PTile>(p[0], p_tile(), warp_in_warpgroup() * mma_m);
            tma::fence_shared_to_async_proxy();
            ptx::named_barrier_sync(Tr::barrier_id(NamedBarrier::epilogue, consumer),
                                    warpgroup_threads);
        }
    }

    // After a wait that retires an S GEMM: keeps Q's fragments (which it read
    // asynchronously) in their registers until then.
    __device__ __forceinline__ void keep_q() {
        if constexpr (Tr::q_in_registers)
            ptx::fence_operands(q_frags);
    }

    // Each warp tells the producer it has finished reading a stage (after its wgmma wait).
    __device__ __forceinline__ void release_k(int j) {
        __syncwarp();
        if (threadIdx.x % warp_size == 0)
            bars.k_empty[slot(j).stage].arrive();
    }
    __device__ __forceinline__ void release_v(int j) {
        __syncwarp();
        if (threadIdx.x % warp_size == 0)
            bars.v_empty[slot(j).stage].arrive();
    }

    // O staged apart (Traits::o_apart): each warp hands Q's buffer back to the producer once
    // no GEMM of its reads Q again (after its last S GEMM's wait and a possible rescore, or
    // once Q is in registers), so the next tile's Q loads during this one's last steps.
    __device__ __forceinline__ void release_q() {
        if constexpr (Tr::o_apart) {
            __syncwarp();
            if (threadIdx.x % warp_size == 0)
                bars.q_empty[q_pair].arrive();
        }
    }

    // S_j once more, for a lazy step whose rows did not all keep their references (K_j is
    // still held): out of turn, and it waits for every GEMM of this warpgroup, P·V_{j-1}'s
    // too. Rare (a thread's probabilities of a row adding up to more than 2^12 in one
    // block), so ping-pong can afford it. Masked: as the step's scores().
    template <bool Masked>
    __device__ __forceinline__ void rescore(float (&s)[1][s_tiles][4], int j) {
        issue_qk(s, j);
        ptx::wgmma_wait<0>();
        ptx::fence_operands(s[0]);
        keep_q();
        softcap(s);
        alibi(s, j);
        if constexpr (Masked)
            mask(s, j);
    }

    // Whether `value` holds in every thread of this consumer warpgroup (its named barrier).
    __device__ __forceinline__ bool warpgroup_all(bool value) const {
        return ptx::named_barrier_all(Tr::barrier_id(NamedBarrier::vote, consumer),
                                      warpgroup_threads, value);
    }

    // Zeroes V_j's rows past the sequence's keys when they hold another sequence's or
    // unused memory (Tile::last_block_keys), before P·V_j reads them. Both consumers write
    // the same zeros; each fences its writes to the async proxy wgmma reads through and
    // syncs its warpgroup, so its own GEMM sees them.
    __device__ __forceinline__ void zero_v_tail(int j) const {
        if (!PerSequence || j != visited - 1 || (Tr::trim_blocks && passed != 0) ||
            last_block_keys == Tr::B_c)
            return;
        constexpr int chunks = Tr::o_cols / 8;  // 16-byte chunks of a row (its padding too)
        const std::uint32_t base = v_stage(slot(j).stage);
        for (int i = last_block_keys * chunks + static_cast<int>(threadIdx.x) % warpgroup_threads;
             i < Tr::B_c * chunks; i += warpgroup_threads) {
            ptx::st_shared_16(base + VTile::chunk_offset(i / chunks, i % chunks), uint4{});
        }
        tma::fence_shared_to_async_proxy();
        ptx::named_barrier_sync(Tr::barrier_id(NamedBarrier::epilogue, consumer),
                                warpgroup_threads);
    }

    // Variants: the logit softcap, on the raw scores before the mask (tanh(-inf) would be
    // -1, not -inf); a uniform branch, so window-only calls skip it.
    __device__ __forceinline__ void softcap(float (&s)[1][s_tiles][4]) const {
        if constexpr (Variants) {
            if (args.softcap_prescale != 0.0f)
                softcap_scores(s, args.softcap_prescale);
        }
    }

    // ALiBi: every block's row maxima, not kept references. Its bias raises a row's scores block
    // after block towards the diagonal (by slope x B_c, tens of units, a block), so a kept
    // reference fails and S is computed again nearly every block: with them the forward ran at
    // 0.5-0.6 of the plain kernel's speed (H200, 2026-12-03).
    static constexpr bool takes_row_max = Alibi;

    // ALiBi's bias, after the softcap, on every block (the blocks every row sees whole too).
    __device__ __forceinline__ void alibi(float (&s)[1][s_tiles][4], int j) const {
        if constexpr (Alibi)
            alibi_scores(s, AlibiTile(alibi_slope, first_row + band_shift, (first + j) * Tr::B_c));
    }

    template <int NT>
    __device__ __forceinline__ void mask(float (&s)[1][NT][4], int j) const {
        if constexpr (Variants) {
            if (j >= masked_head && j < unmasked)
                return;
            const int shift = band_shift;
            const KeyBand band = args.band;
            const int keys = key_bound;
            mask_scores_band(s, first_row, (first + j) * Tr::B_c,
                             [=](int row) { return band_keys(row, shift, band, keys); });
            return;
        }
        if (j < unmasked)
            return;
        if constexpr (PerSequence) {
            const bool causal = args.causal;
            const bool top_left = args.top_left;
            const int bound = key_bound;
            const KernelArgs& a = args;
            mask_scores_by(s, first_row, j * Tr::B_c, [=, &a](int row) {
                const int q = row_position<Tr>(a, row);
                return !causal ? bound : top_left ? min(q + 1, bound) : q + 1 + bound;
            });
        } else {
            mask_scores(s, first_row, (first + j) * Tr::B_c, args.diagonal_seq_q, args.seq_k,
                        args.causal);
        }
    }
};

// S_j = Q·K_jᵀ, masked; with WithPv, O += P_{j-1}·V_{j-1} is issued in the same GEMM turn
// and left running. K_j (and V_{j-1}) are waited for before the turn is taken, so a
// warpgroup never holds it while it waits for memory; returns once S_j is done, K_j handed
// back unless HoldK (exponentiate() may need it again).
// W: the tiles of S the softmax takes, B_c / 8 or a half block's B_c / 16 (the mask
// needs no more). Masked: whether the step carries the mask's code (consume(): a block before
// Consumer::unmasked needs none).
template <bool WithPv, bool HoldK = false, int W, bool Masked = true, class Tr, bool P, bool V,
          bool Pg, bool A, class Turns>
__device__ __forceinline__ void scores(Consumer<Tr, P, V, Pg, A>& c, Turns& turns,
                                       float (&s)[1][Tr::B_c / 8][4],
                                       float (&o)[1][Tr::o_cols / 8][4],
                                       std::uint32_t (&p)[1][Tr::p_steps][4], int j) {
    c.wait_k(j);
    if constexpr (WithPv)
        c.wait_v(j - 1);
    turns.acquire();
    c.issue_qk(s, j);
    if constexpr (WithPv)
        c.issue_pv(o, p, j - 1);
    turns.release();
    ptx::wgmma_wait<WithPv ? Consumer<Tr, P, V, Pg, A>::pv_groups : 0>();
    ptx::fence_operands(s[0]);
    c.keep_q();
    if constexpr (!HoldK)
        c.release_k(j);
    c.softcap(s);
    c.alibi(s, j);
    if constexpr (Masked)
        c.mask(first_tiles<W>(s), j);
}

// S_j becomes probabilities, K_j handed back. Kept: first against the references the rows
// hold, without the row max; a warpgroup in which a row outgrew its reference computes S_j
// again and takes the row max (exponentiate_kept()). Random inputs at the default scale do
// not take that path after a row's first block; a row of a real model moves its reference a
// few times.
template <bool Kept, int W, bool Masked = true, class Tr, bool P, bool V, bool Pg, bool A,
          class Softmax>
__device__ __forceinline__ void exponentiate(Consumer<Tr, P, V, Pg, A>& c, Softmax& softmax,
                                             float (&s)[1][Tr::B_c / 8][4], int j) {
    auto& sw = first_tiles<W>(s);
    if constexpr (Kept) {
        if (j == 0 || c.takes_row_max) {
            softmax.exponentiate(sw);  // no reference yet, or ALiBi's
        } else if (!softmax.exponentiate_kept(sw,
                                              [&c](bool kept) { return c.warpgroup_all(kept); })) {
            c.template rescore<Masked>(s, j);
            softmax.exponentiate_to_max(sw);
        }
        c.release_k(j);
    } else {
        softmax.exponentiate(sw);
    }
}

// Waits for O += P·V_j to finish and hands V_j's stage back to the producer. FP8: adds each
// part's block accumulator to O as its GEMM retires, issuing the part that takes its
// accumulator next, so that one part's GEMM runs while the one before it is added (with
// ping-pong those later parts go out of turn: the turns' count stays, their order loosens).
template <class Tr, bool P, bool V, bool Pg, bool A, int KT>
__device__ __forceinline__ void retire_pv(Consumer<Tr, P, V, Pg, A>& c,
                                          float (&o)[1][Tr::o_cols / 8][4],
                                          std::uint32_t (&p)[1][KT][4], int j) {
    if constexpr (Tr::fp8) {
        constexpr int tiles = Tr::pv_cols / 8;
#pragma unroll
        for (int part = 0; part < Tr::pv_parts; ++part) {
            // The parts after this one in flight: up to pv_buffers - 1.
            if (part + Tr::pv_buffers <= Tr::pv_parts)
                ptx::wgmma_wait<Tr::pv_buffers - 1>();
            else
                ptx::wgmma_wait<0>();
            if (part == Tr::pv_parts - 1) {  // every GEMM of the block has read P and V_j
                ptx::fence_operands(o[0]);
                ptx::fence_operands(p[0]);
                c.release_v(j);
            }
            float(&block)[tiles][4] = c.pv_block[part % Tr::pv_buffers];
            ptx::fence_operands(block);
#pragma unroll
            for (int t = 0; t < tiles; ++t) {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    o[0][part * tiles + t][e] += block[t][e];
            }
            if (part + Tr::pv_buffers < Tr::pv_parts)
                c.issue_pv_part(part + Tr::pv_buffers, p, j);
        }
    } else {
        ptx::wgmma_wait<0>();
        ptx::fence_operands(o[0]);
        if constexpr (!Tr::p_in_smem)  // held for the GEMM; else its registers are free
            ptx::fence_operands(p[0]);
        c.release_v(j);
    }
}

// O += P·V_j, from waiting for V_j to retiring the GEMM.
template <class Tr, bool P, bool V, bool Pg, bool A, class Turns, int KT>
__device__ __forceinline__ void accumulate(Consumer<Tr, P, V, Pg, A>& c, Turns& turns,
                                           float (&o)[1][Tr::o_cols / 8][4],
                                           std::uint32_t (&p)[1][KT][4], int j) {
    c.wait_v(j);
    c.zero_v_tail(j);
    turns.acquire();
    c.issue_pv(o, p, j);
    turns.release();
    retire_pv(c, o, p, j);
}

// P = S rounded to 16 bits as the A fragments of P·V; the softmax counts P as rounded where
// its sums need it (OnlineSoftmax::add_rounded()). FP8: S in e4m3, which the softmax made 2^8
// times the probabilities (fp8_p_offset_log2), its sums too, unrounded.
template <DType dtype, class Softmax, int NT, int KT>
__device__ __forceinline__ void to_a_fragments(Softmax& softmax, const float (&s)[1][NT][4],
                                               std::uint32_t (&p)[1][KT][4]) {
    if constexpr (dtype == DType::E4M3) {
        accumulators_to_e4m3_fragments(s[0], p[0]);
    } else {
        accumulators_to_a_fragments<dtype>(s, p);
        softmax.template add_rounded<dtype>(p);
    }
}

// trim_blocks: the tile's blocks after this consumer's own (`passed` of them) hold no key
// its rows see (causal: the rows of the tile's later consumers reach further; or rows past
// the sequence). It computes nothing there, hands each stage back as it lands, and passes
// the GEMM turns it would have taken, so the ping-pong rotation stays in step: one a block
// with overlap (plus block 0's S turn when it computed none), two without. At B_r 192 and
// B_c 128 a causal tile's first consumer passes a block a tile on average and the second
// half of one: 6% of the work at 2k keys (docs/PERF.md, 2026-11-26). A knob, not always on:
// the extra count moved ptxas's schedule of some main loops, d_head 128's by 1-1.5%.
template <bool Overlap, class Tr, bool P, bool V, bool Pg, bool A, class Turns>
__device__ __forceinline__ void pass(Consumer<Tr, P, V, Pg, A>& c, Turns& turns) {
    if constexpr (Tr::trim_blocks) {  // else a consumer computes every block of its tile
        for (int j = c.visited; j < c.visited + c.passed; ++j) {
            c.wait_k(j);
            c.release_k(j);
            if (!Overlap || j == 0)
                turns.skip();
            c.wait_v(j);
            c.release_v(j);
            turns.skip();
        }
    }
}

// One tile's main loop for one consumer warpgroup: the algorithm. Softmax: an
// OnlineSoftmax of the config's row reference (or a fixed one, softcap variants).
template <class Tr, bool Overlap, bool Pingpong, bool P, bool V, bool Pg, bool A, class Softmax>
__device__ __forceinline__ void consume(Consumer<Tr, P, V, Pg, A>& c,
                                        GemmTurns<Tr, Pingpong>& turns,
                                        float (&o)[1][Tr::o_cols / 8][4], Softmax& softmax) {
    constexpr int s_tiles = Tr::B_c / 8;
    const int n = c.visited;
    float s[1][s_tiles][4];
    std::uint32_t p[1][Tr::p_steps][4];
    // Q in shared memory is read for the last time by S_{n-1} (or its rescore).
    const auto q_read = [&c] {
        if constexpr (!Tr::q_in_registers)
            c.release_q();
    };
    if (n == 0) {
        q_read();
        pass<Overlap>(c, turns);
        return;
    }
    if constexpr (!Overlap) {
        // The row max every block: d_head 256's one-stage tile, the only 16-bit one without
        // overlap the table takes, spilled and lost 3.6% with kept references (H200,
        // docs/PERF.md, 2026-11-26); FP8 keeps no references (below).
        for (int j = 0; j < n; ++j) {
            scores<false, false, s_tiles>(c, turns, s, o, p, j);
            if (j == 0)
                c.pending_store.hand_back();  // the previous O store read its buffer meanwhile
            if (j == n - 1)
                q_read();
            softmax.update(s, o);
            to_a_fragments<Tr::dtype>(softmax, s, p);
            c.hand_p(p);
            accumulate(c, turns, o, p, j);
        }
    } else {
        // Lazy steps exponentiate against the kept references first (exponentiate()):
        // +1-10% from d_head 64 to 256 where the consumers ping-pong, +3-7% at d_head 128's
        // two consumers without it, but -8-10% at d_head 256's (why is not known; the loop
        // does not spill; H200, docs/PERF.md, 2026-11-26).
        // FP8 takes no kept references: their probabilities may reach 2^12, beyond e4m3 once
        // offset (fp8_lazy_rescale_log2).
        constexpr bool kept = Softmax::lazy && !Tr::fp8 && (Pingpong || Tr::d_head < 256);
        // A half block (Consumer::half_last, only ever a consumer's last) runs the mask, the
        // softmax and P·V on the first W tiles of S and P, while S stays one GEMM of the whole
        // block, and takes the row max, not the kept references. Each is what ptxas accepts:
        // S GEMMs of two widths, a kept step at half width (its rescore leaves half of S dead)
        // and a half block's P flowing into the loop (a tile whose only block is half: it runs
        // its own steps below) each made it serialize every wgmma of a kernel (docs/PERF.md,
        // 2026-11-26). Without half blocks W is the whole block and the loops are the plain ones.
        constexpr int W = Consumer<Tr, P, V, Pg, A>::half_blocks ? s_tiles / 2 : s_tiles;
        const bool half = Consumer<Tr, P, V, Pg, A>::half_blocks && c.half_last;
        const int whole = half ? n - 1 : n;  // blocks at the whole width
        // The width a step runs at, as a type: `whole_width` or `half_width`.
        using whole_width = std::integral_constant<int, s_tiles>;
        using half_width = std::integral_constant<int, W>;
        // Block 0's scores first; then each step issues S_j with O += P_{j-1}·V_{j-1} (a
        // whole block's: only the last can be half) and exponentiates S_j while the P·V GEMM
        // runs; the last P·V closes the tile.
        // Kept references at the whole width only; a kept step holds K_j until it has
        // exponentiated (its rescore may need it), any other hands it back at once.
        const auto first = [&](auto width) {
            constexpr int w = decltype(width)::value;
            constexpr bool kept_here = kept && w == s_tiles;
            scores<false, kept_here, w>(c, turns, s, o, p, 0);
            c.pending_store.hand_back();  // the previous O store read its buffer meanwhile
            exponentiate<kept_here, w>(c, softmax, s, 0);  // O is still zero: nothing to rescale
            to_a_fragments<Tr::dtype>(softmax, first_tiles<w>(s),
                                      first_tiles<Tr::p_steps_of(w)>(p));
            c.hand_p(first_tiles<Tr::p_steps_of(w)>(p));
        };
        // A step before Consumer::unmasked runs without the mask's code: the code alone, never
        // run, cost d_head 64's static tile 2-3% at 2k-16k keys; peeled, the rest level (H200,
        // docs/PERF.md, 2026-11-28). A window's blocks are masked at their start too: every
        // step of the variant kernels keeps it.
        const auto step = [&](auto width, auto masked, int j) {
            constexpr int w = decltype(width)::value;
            constexpr bool kept_here = kept && w == s_tiles;
            scores<true, kept_here, w, decltype(masked)::value>(c, turns, s, o, p, j);
            exponentiate<kept_here, w, decltype(masked)::value>(c, softmax, s, j);
            retire_pv(c, o, p, j - 1);
            softmax.rescale(o);
            to_a_fragments<Tr::dtype>(softmax, first_tiles<w>(s),
                                      first_tiles<Tr::p_steps_of(w)>(p));
            c.hand_p(first_tiles<Tr::p_steps_of(w)>(p));
        };
        if (half && n == 1) {
            first(half_width{});
            q_read();
            accumulate(c, turns, o, first_tiles<Tr::p_steps_of(W)>(p), 0);
        } else {
            first(whole_width{});
            const int plain_end = V ? 1 : max(1, min(c.unmasked, whole));
            for (int j = 1; j < plain_end; ++j)
                step(whole_width{}, std::false_type{}, j);
            for (int j = plain_end; j < whole; ++j)
                step(whole_width{}, std::true_type{}, j);
            if (half)
                step(half_width{}, std::true_type{}, n - 1);
            q_read();
            if (half)
                accumulate(c, turns, o, first_tiles<Tr::p_steps_of(W)>(p), n - 1);
            else
                accumulate(c, turns, o, p, n - 1);
        }
    }
    pass<Overlap>(c, turns);
}

}  // namespace flash_attention::sm90
