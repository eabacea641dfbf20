#pragma once

// The sm90 forward kernel (FlashAttention-3's structure): a producer warpgroup streams Q,
// K and V with TMA, and each consumer warpgroup computes 64 query rows with wgmma, the
// online softmax running on the accumulators in registers. Needs sm_90a (wgmma,
// setmaxnreg). This body sets up shared memory and the barriers, splits the warpgroups
// into roles, and walks the tiles the scheduler (tile_scheduler.cuh) hands the CTA: load Q,
// run the main loop (mainloop.cuh: the producer, the GEMM turns, the consumer's steps),
// store the LSE and run the epilogue (epilogue.cuh). A persistent CTA walks several
// tiles; the K/V ring and the Q buffers carry on from tile to tile. docs/design.md describes
// the roles and the pipeline.

#include <cstdint>

#include "kernels/fp8.hpp"
#include "kernels/primitives/epilogue.cuh"
#include "kernels/primitives/geometry.cuh"
#include "kernels/sm90/epilogue.cuh"
#include "kernels/sm90/mainloop.cuh"
#include "kernels/sm90/tile_scheduler.cuh"

namespace flash_attention::sm90 {

// A consumer warpgroup's share of the tiles: one tile per CTA, or with `persistent` one
// CTA per SM walking the tiles (the static schedule's stride, or the tile the producer
// published for the dynamic one). PerSequence: varlen batches and KV caches (tile_at);
// Variants: sliding window and softcap (KernelArgs::variants), on the per-sequence body;
// Paged: a paged KV cache (group-major K/V tiles), on the per-sequence body; Alibi: ALiBi's
// bias, on the variant body.
template <KernelConfig C, class Tr, bool PerSequence, bool Variants, bool Paged, bool Alibi,
          class Scheduler>
__device__ __forceinline__ void consume_tiles(const Params& params, unsigned char* smem,
                                              Barriers<Tr::q_pairs, Tr::stages>& bars,
                                              const Scheduler& scheduler, int consumer) {
    constexpr float log2e_f = 1.4426950408889634f;
    constexpr bool split = Scheduler::split_tiles;  // stream-K pieces (tile_scheduler.cuh)
    const KernelArgs& args = params.args;
    const int smem_base = static_cast<int>(ptx::smem_address(smem));
    GemmTurns<Tr, C.sm90.pingpong> turns{consumer};
    int ring = 0;  // K/V blocks consumed so far, in step with the producer
    int iteration = 0;
    PendingStore pending_store;  // the previous tile's O store (epilogue.cuh)
    for (int index = scheduler.first();
         (index = scheduler.consumer_tile(index, QSlot<Tr>(iteration), consumer, bars)) <
         scheduler.count(args);
         index += gridDim.x) {
        const Tile tile = scheduler.template tile<PerSequence, Variants>(args, index);
        if (tile.empty())
            continue;  // the static schedule's share of the unused numbers (the dynamic
                       // schedule's producer publishes none)
        const int tile_number = iteration++;  // of this CTA's non-empty tiles
        const QSlot<Tr> q(tile_number);
        const int q_pair = Tr::q_pair(q.buffer, consumer);  // its barriers
        unsigned char* q_region =
            smem + Tr::q_offset + q.buffer * Tr::q_buffer_bytes + consumer * Tr::QTile::bytes;
        const int consumer_row0 = tile.q_row0 + consumer * Tr::rows_per_consumer;
        // The query length the causal diagonal is aligned to (masking.cuh).
        const int diagonal = PerSequence ? diagonal_queries(tile.q.len, tile.k.len, args.top_left)
                                         : args.diagonal_seq_q;
        // Variants: the consumer's own rows' band blocks, relative to the tile's first.
        const int consumer_rows = max(1, min(Tr::rows_per_consumer, tile.q_rows - consumer_row0));
        const int shift = tile.k.len - diagonal;
        BandBlocks band{};
        if constexpr (Variants)
            band = band_blocks(shift, args.band, tile.k.len, consumer_row0, consumer_rows, Tr::B_c);
        const KeyBlocks own =
            row_key_blocks<Tr>(args, diagonal, tile.k.len, consumer_row0, consumer_rows);
        // With trim_blocks this consumer's blocks end where its own rows' keys do (rows past
        // the sequence are never stored: none); the tile's may go on for later rows. Blocks
        // count from the tile's first (a window's start, a stream-K piece's; else 0).
        const int own_blocks =
            Variants ? max(0, band.end - tile.first) : min(own.visited - tile.first, tile.visited);
        const int computed = !Tr::trim_blocks               ? tile.visited
                             : consumer_row0 >= tile.q_rows ? 0
                                                            : own_blocks;
        using ConsumerT = Consumer<Tr, PerSequence, Variants, Paged, Alibi>;
        // The keys this consumer's last row sees (a row past the sequence: all of them).
        const int last_row_keys =
            keys_seen(row_position<Tr>(args, consumer_row0 + consumer_rows - 1), diagonal,
                      tile.k.len, args.causal);
        ConsumerT c{
            .args = args,
            .visited = computed,
            .passed = tile.visited - computed,
            .last_block_keys = tile.last_block_keys,
            .bars = bars,
            .q_smem = ptx::smem_address(q_region),
            .k_smem = static_cast<std::uint32_t>(smem_base + Tr::k_offset),
            .v_smem = static_cast<std::uint32_t>(smem_base + Tr::v_offset),
            .consumer = consumer,
            .first_row = consumer_row0 + warp_in_warpgroup() * mma_m,
            // This consumer's own rows may need fewer masked blocks than the tile's.
            .unmasked = (Variants ? band.unmasked_end : own.unmasked) - tile.first,
            .half_last = ConsumerT::half_blocks && computed > 0 &&
                         last_row_keys - (tile.first + computed - 1) * Tr::B_c <= Tr::B_c / 2,
            .key_bound =
                args.causal && !args.top_left && !Variants ? tile.k.len - tile.q.len : tile.k.len,
            .first = tile.first,
            .masked_head = band.unmasked_first - tile.first,
            .band_shift = shift,
            .alibi_slope = Alibi ? alibi_slope(args.alibi_slopes, args.alibi_batch_stride,
                                               tile.sequence, tile.head, args.scale_log2)
                                 : 0.0f,
            .ring = ring,
            .q_pair = q_pair,
            .pending_store = pending_store,
        };

        // FP8: the descales of the tile's (sequence, K/V head).
        const std::int64_t descale_pair =
            Tr::fp8 ? std::int64_t{tile.sequence} * args.heads_kv + tile.kv_head : 0;
        float o[1][Tr::o_cols / 8][4];
        zero(o);
        // The main loop and the epilogue for one softmax: the config's, or in the variant
        // kernels a fixed reference where the softcap bounds the scores (KernelArgs).
        const auto run = [&](auto softmax) -> int {
            bars.q_full[q_pair].wait(q.parity);
            if constexpr (Tr::q_in_registers) {
                load_a_fragments<typename Tr::QTile>(c.q_frags, c.q_smem,
                                                     warp_in_warpgroup() * mma_m);
                c.release_q();  // the S GEMMs read Q from registers
            }
            consume<Tr, C.sm90.intra_warpgroup_overlap>(c, turns, o, softmax);
            pending_store.hand_back();  // a tile without GEMMs hands it back here
            if constexpr (!Variants)
                softmax.finalize(o);
            if constexpr (Tr::fp8) {  // V's descale
                const float v_scale = __ldg(args.v_descale + descale_pair);
#pragma unroll
                for (int nt = 0; nt < Tr::o_cols / 8; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        o[0][nt][e] *= v_scale;
                }
            }

            // Per sequence, the tile again, recomputed rather than held across the main loop
            // (the shuffle hides that it is the same): the three-consumer kernels have 160
            // registers a thread, and holding the sequence's offsets and lengths through it
            // cost d_head 64 4-5% (H100, 2026-11-24, docs/PERF.md).
            const Tile done = PerSequence ? tile_at<Tr, PerSequence, Variants>(
                                                args, __shfl_sync(0xffffffffu, index, 0))
                                          : tile;
            if constexpr (Variants) {
                // Attention sinks: one per head, the same for every row of the tile. Only here:
                // in the plain kernels even this epilogue code moved ptxas's schedule of the main
                // loop (SASS), which the plain kernels keep as measured.
                const float sink =
                    args.sinks != nullptr ? __ldg(args.sinks + done.head) * log2e_f : -INFINITY;
                softmax.finalize(o, [sink](int, int) { return sink; });
            }
            // The tile's rows of the LSE output (this thread's rows: store_lse()).
            const auto lse_rows = [&] {
                return args.lse +
                       (std::int64_t{done.q.entry} * args.heads + done.head) *
                           args.seqs.q_view_seq +
                       done.q.row0;
            };
            // Stream-K: a piece that does not end its tile leaves O and the LSE as a partial
            // result and writes neither; the piece that ends it merges the others' first.
            bool write = true;
            if constexpr (split) {
                RowLse rows = RowLse::of(softmax);
                if (done.part == Part::partial) {
                    store_partial<Tr>(params.split, consumer, o, rows);
                    write = false;
                } else if (done.part == Part::merging) {
                    merge_partials<Tr>(params.split, consumer,
                                       stream_k_first_owner<Tr>(args, params.split), o, rows);
                }
                if (write && args.lse != nullptr && threadIdx.x % 4 == 0)
                    store_lse<1>(lse_rows(), c.first_row, done.q.len, rows);
            } else if (args.lse != nullptr && threadIdx.x % 4 == 0) {
                if constexpr (Tr::pack_gqa)
                    store_packed_lse<Tr>(args, done, c.first_row, softmax);
                else
                    store_lse<1>(lse_rows(), c.first_row, done.q.len, softmax);
            }
            // Every wgmma reading this consumer's Q has completed (consume() ends on a wait),
            // and no other warpgroup reads these rows: O may overwrite them, unless staged
            // apart (its region's uses: each tile's consumers in turn).
            store_output<Tr, PerSequence>(
                params, done, consumer, o,
                OStaging<Tr>{Tr::o_apart ? smem + Tr::o_offset : q_region,
                             Tr::o_apart ? o_region_empty<Tr>(smem) : &bars.q_empty[q_pair],
                             tile_number * Tr::consumers + consumer},
                pending_store, write);
            return done.visited;
        };
        if constexpr (Variants && !Alibi) {  // ALiBi's bias unbounds the scores
            if (args.softcap_fixed) {
                ring += run(OnlineSoftmax<1, true, RowReference::fixed>(
                    args.softmax_scale, args.scale_log2, args.softcap_reference));
                continue;
            }
        }
        if constexpr (Tr::fp8) {
            ring += run(
                OnlineSoftmax<1, true, Tr::row_reference, fp8_lazy_rescale_log2, fp8_p_offset_log2>(
                    fp8_descaled(args.softmax_scale, args, descale_pair),
                    fp8_descaled(args.scale_log2, args, descale_pair)));
        } else {
            ring +=
                run(OnlineSoftmax<1, true, Tr::row_reference>(args.softmax_scale, args.scale_log2));
        }
    }
    pending_store.hand_back();  // shared memory must outlive the last store's read
    turns.finish();
}

// PerSequence: varlen batches and KV caches (SequenceArgs) run their own kernel, so the
// dense one keeps its code and registers as they were: one kernel with both bodies
// behind a branch cost forward()'s non-persistent d_head 128 causal kernel 5-6%
// (H100, 2026-11-24, docs/PERF.md). Variants (sliding window, softcap) are a
// third instantiation of the per-sequence body, dense calls with them included, for the
// same reason: the plain kernels' main loops stay as they were; ALiBi (with or without the
// others) is a fourth. Paged caches, with and without variants or ALiBi, are
// instantiations of their own: their K/V tiles are laid out
// differently (Traits::PagedKTile, PagedVTile), and their producer is a warp walking pages.
template <unsigned long long CodeHi, unsigned long long CodeLo, bool PerSequence,
          bool Variants = false, bool Paged = false, bool Alibi = false>
__global__ void __launch_bounds__(Traits<unpack(CodeHi, CodeLo)>::threads, 1)
    forward_kernel(const __grid_constant__ Params params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = Traits<unpack(CodeHi, CodeLo)>;
    constexpr KernelConfig C = unpack(CodeHi, CodeLo);

    extern __shared__ unsigned char smem_raw[];
    // TMA's 128-byte swizzle repeats every 1024 bytes and wgmma assumes tiles start on
    // that period; dynamic shared memory is only guaranteed 16-byte alignment.
    unsigned char* smem = smem_raw + ((1024 - ptx::smem_address(smem_raw) % 1024) % 1024);
    auto& bars = *reinterpret_cast<Barriers<Tr::q_pairs, Tr::stages>*>(smem + Tr::barrier_offset);

    static_assert(PerSequence || !Tr::pack_gqa, "pack_gqa tiles run the per-sequence body");
    // Stream-K splits only forward()'s dense problems (launch.cuh).
    const TileScheduler<Tr, Tr::dynamic_schedule, Tr::stream_k && !PerSequence> scheduler{
        params.tile_counter,
        reinterpret_cast<TileSlots<Tr::q_buffers>*>(smem + Tr::tile_slot_offset), params.split};

    // Broadcast from lane 0, so the compiler knows it is warp-uniform: what derives from it
    // (the consumer's Q region, hence the wgmma descriptors of every step) then stays in
    // uniform registers instead of being rebuilt with vector ops and R2UR moves (release
    // set: R2UR 497 -> 308, d_head 256's main loop 966 -> 924 instructions; +0.8% over the
    // grid in the median, up to +3%, H100, 2026-11-24, docs/PERF.md).
    const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / warpgroup_threads, 0);
    if (threadIdx.x == 0) {
        for (int b = 0; b < Tr::q_pairs; ++b) {
            bars.q_full[b].init(1);
            bars.q_empty[b].init(Tr::q_empty_arrivals);
        }
        for (int s = 0; s < Tr::stages; ++s) {
            bars.k_full[s].init(1);
            // transpose_v: every transposer thread arrives once its writes are fenced.
            bars.v_full[s].init(Tr::transpose_v ? Tr::transposer_threads : 1);
            // One arrival per consumer warp, each after its own wgmma wait.
            bars.k_empty[s].init(4 * Tr::consumers);
            bars.v_empty[s].init(4 * Tr::consumers);
        }
        if constexpr (Tr::o_apart)
            o_region_empty<Tr>(smem)->init(1);  // the storing thread, after the store's read
        if constexpr (Tr::transpose_v) {
            VStagingBarriers<Tr::stages>& vs = v_staging_barriers<Tr>(smem);
            for (int s = 0; s < Tr::stages; ++s) {
                vs.full[s].init(1);
                vs.empty[s].init(Tr::transposer_threads);
                vs.end[s].ring = ~0u;
            }
        }
        scheduler.init();
        tma::fence_barrier_init();
    }
    __syncthreads();

    if (warpgroup == 0) {
        ptx::setmaxnreg_dec<Tr::producer_registers>();
        // One thread produces; a paged cache's producer is the whole first warp (produce()).
        // transpose_v: the other warps transpose V's blocks.
        static_assert(PerSequence || !Paged, "a paged cache runs the per-sequence body");
        if (threadIdx.x < (Paged ? warp_size : 1))
            produce<Tr, PerSequence, Paged, Variants>(params, smem, bars, scheduler);
        else if constexpr (Tr::transpose_v) {
            if (threadIdx.x >= warp_size)
                transpose_v_blocks<Tr>(smem, bars);
        }
        return;
    }

    ptx::setmaxnreg_inc<Tr::consumer_registers>();
    consume_tiles<C, Tr, PerSequence, Variants, Paged, Alibi>(params, smem, bars, scheduler,
                                                              warpgroup - 1);
#else
    // Built for sm_90a only (the family's CMake target); other targets get an empty body.
    (void)params;
#endif
}

}  // namespace flash_attention::sm90
