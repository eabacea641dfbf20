#pragma once

// The sm90 backward pass (TMA, wgmma, warp specialisation; sm_90a), after the preprocess
// (backward_preprocess.cuh):
//  - main kernel: one CTA per (key block, K/V head, batch) keeps its B_c rows of K and V in
//    shared memory and walks every query block that sees them, for each query head of the K/V
//    head (GQA sums dK and dV without expanding K and V). A producer warp streams Q and dO
//    blocks through a `stages`-deep pipeline; each consumer warpgroup owns 64 keys and
//    computes, with the keys as rows (the transposed scores, so that Pᵀ and dSᵀ are A operands
//    straight from registers; each step's LSE and D rows staged in shared memory a step ahead,
//    or with lag_dq copied with its Q tile):
//        Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, Pᵀ = exp2(Sᵀ·scale·log2e - LSE₂), dSᵀ = Pᵀ ∘ (dPᵀ - D),
//        dV += Pᵀ·dO, dK += dSᵀ·Q, and its share of dQ = dS·K (dS through shared memory);
//    with lag_dq, dQ a step behind: each step computes the previous step's, whose dS every
//    consumer stored a while ago, so that no consumer waits within a step for the other's dS.
//    d_head 256 (split_head): both consumers on the CTA's 64 keys, each computing Sᵀ and dPᵀ
//    for half of the step's queries; Pᵀ and dSᵀ go through shared memory, and each consumer
//    runs dV, dK and dQ for half of d_head's columns over every query. d_head 192 and
//    DeepSeek's 192/128 (split_gradients): the same, but consumer 0 runs dK and consumer 1 dV
//    over every column, and dQ's 64-column parts are shared 1 : 2. d_head 96: d_head 128's
//    kernel on tiles of 96 columns (the 64-byte swizzle), dQ's columns split 64 + 32.
//    A second producer warp adds each step's dQ to an fp32 accumulator in global memory with
//    TMA's bulk reduce-add (cp.reduce.async.bulk), from a staging buffer the consumers fill.
//  - dQ conversion: the accumulator, scaled and rounded to 16 bits, into dQ.
// FlashAttention-3's and -4's sm90 designs (hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp,
// flash_bwd_sm90.py) are the references: the same GEMM split as their d_head 128 configurations
// (Sᵀ split over the consumers' keys, dQ over d_head's columns).

#include <cstddef>
#include <cstdint>
#include <cuda/atomic>
#include <cuda/ptx>
#include <type_traits>

#include "config/config_code.hpp"
#include "config/resources.hpp"
#include "kernels/backward_preprocess.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/key_block_scheduler.hpp"
#include "kernels/primitives/element.cuh"
#include "kernels/primitives/epilogue.cuh"
#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/mask.cuh"
#include "kernels/primitives/masking.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm80/warp_gemm.cuh"
#include "kernels/primitives/sm90/ptx.cuh"
#include "kernels/primitives/sm90/swizzled_tile.cuh"
#include "kernels/primitives/sm90/tma.cuh"
#include "kernels/primitives/sm90/warpgroup_gemm.cuh"
#include "kernels/sm90/tensor_maps.hpp"

namespace flash_attention::sm90 {

template <KernelConfig C>
struct BackwardTraits {
    static_assert(unpack(pack(C)) == C, "every field fits the packed kernel parameter");
    static_assert(C.backward && C.family == Family::sm90, "an sm90 backward config");
    using T = typename Element<C.dtype>::type;
    static constexpr DType dtype = C.dtype;
    static constexpr int d_head = C.d_head;
    static constexpr int B_r = C.B_r;  // queries a step: the N of Sᵀ's wgmma
    static constexpr int B_c = C.B_c;  // keys a CTA, 64 a consumer (a wgmma's M) or shared
    static constexpr int stages = C.sm90.stages;
    static constexpr bool ordered_dq = C.sm90.ordered_dq;
    static constexpr int threads = C.n_threads();
    static constexpr int consumers = consumer_warpgroups(C);
    // Consumers of 64 keys each; or, d_head 256 (whose dK and dV, 64 x 256 fp32 each, a
    // consumer cannot hold), every consumer on the CTA's 64 keys: each computes Sᵀ and dPᵀ for
    // step_queries of the step's queries, writes its Pᵀ and dSᵀ to shared memory, and holds dK
    // and dV for head_cols of d_head's columns, whose GEMMs read every consumer's Pᵀ and dSᵀ.
    static constexpr bool split_head = sm90_backward_split_head(C);
    static_assert(B_c == 64 * consumers || split_head, "64 keys a consumer warpgroup");
    // split_head at d_head 192 (sm90_backward_split_gradients): consumer 0 holds dK and
    // consumer 1 dV, each over every column, as 96 columns a consumer would start mid-way
    // through a swizzle atom.
    static constexpr bool split_gradients = sm90_backward_split_gradients(C);
    static_assert(!split_gradients || consumers == 2, "one consumer for dK, one for dV");
    // The tiles' columns: whole sub-tiles of their swizzle, as the forward's (tile_columns():
    // 64 columns of the 128-byte swizzle, or at d_head 96 three of 32 of the 64-byte one), so
    // that the GEMMs whose N is d_head (dV, dK, dQ; their B operands Q, dO and K read MN-major in
    // whole swizzle atoms) compute no padding.
    static constexpr int cols = tile_columns(d_head);
    static constexpr int swizzle = tile_swizzle_bytes(d_head);
    // V's, dO's and dV's (DeepSeek's MLA: 128 with d_head 192; else d_head's).
    static constexpr int d_v = C.v_head_dim();
    static constexpr int v_cols = tile_columns(d_v);
    static constexpr int v_swizzle = tile_swizzle_bytes(d_v);
    static_assert(d_v == d_head || split_gradients, "V's own head dim: split_gradients");
    // The columns of dK and of dV the consumer of `role` holds (split_gradients: consumer 0 dK's,
    // consumer 1 dV's; a role of -1 is any consumer of the other kernels).
    static constexpr int head_cols = split_head && !split_gradients ? d_head / consumers : cols;
    static constexpr int dk_cols(int role) { return split_gradients && role != 0 ? 0 : head_cols; }
    static constexpr int dv_cols(int role) {
        return !split_gradients ? head_cols : role == 1 ? v_cols : 0;
    }
    static constexpr int key_rows_of(int consumer) { return split_head ? 0 : 64 * consumer; }
    // The first of the consumer's columns of dK and dV (split_head at d_head 256: its half).
    static constexpr int head_col0(int consumer) {
        return split_head && !split_gradients ? consumer * head_cols : 0;
    }
    static constexpr int step_queries = split_head ? B_r / consumers : B_r;  // Sᵀ's wgmma N
    static constexpr int query_col0(int consumer) {
        return split_head ? consumer * step_queries : 0;
    }
    static_assert(step_queries % 16 == 0, "whole k-tiles of queries a consumer");
    // dQ = dS·K (B_r x d_head) over the consumers: 64-row groups of queries, then d_head's
    // columns, in parts of 64 rows x 64 columns (64 x 64 floats each in the staging and the
    // accumulator, the parts of a row group's columns in order; at d_head 96 the last part of a
    // row is 64 x 32). split_gradients: consumer 0 (dK's GEMM) takes the first part, consumer 1
    // the others. uneven_dq (d_head 96, sm90_backward_uneven_dq()): consumer 0 the first 64
    // columns, consumer 1 the last 32.
    static constexpr bool uneven_dq = sm90_backward_uneven_dq(C);
    // The consumers' walks are compiled for each one's role where they differ in their
    // accumulators: split_gradients (dK or dV) and uneven_dq (dQ's width).
    static constexpr bool per_role = split_gradients || uneven_dq;
    static constexpr int dq_row_groups = B_r / 64;
    static constexpr int dq_part_floats = 64 * 64;
    static constexpr int dq_parts = dq_row_groups * ((cols + 63) / 64);
    static constexpr int dq_floats = B_r * cols;  // a step's: the staging, an accumulator block
    static constexpr int dq_first_part(int consumer) {
        return split_gradients ? (consumer == 0 ? 0 : 1) : consumer * dq_parts / consumers;
    }
    static constexpr int dq_parts_of(int consumer) {
        return split_gradients ? (consumer == 0 ? 1 : dq_parts - 1) : dq_parts / consumers;
    }
    // N of dQ's wgmma where the consumers are alike (not per_role).
    static constexpr int dq_cols = cols * dq_row_groups / consumers;
    // The N of consumer `consumer`'s dQ GEMM (-1: any consumer, where all are alike), and the
    // floats of its share of the staging.
    static constexpr int dq_cols_of(int consumer) {
        return split_gradients ? 64 * dq_parts_of(consumer)
               : uneven_dq     ? (consumer == -1  ? -1
                                  : consumer == 0 ? 64
                                                  : cols - 64)
                               : dq_cols;
    }
    static constexpr int dq_share_floats(int consumer) { return 64 * dq_cols_of(consumer); }
    // The first column of consumer `consumer`'s dQ share.
    static constexpr int dq_col0(int consumer) {
        return split_gradients ? dq_part_col(dq_first_part(consumer))
               : uneven_dq     ? 64 * consumer
                               : consumer / dq_row_groups * dq_cols;
    }
    // Part p's first row (of the step's B_r queries) and column.
    static constexpr int dq_part_row(int p) {
        return 64 * (p / (dq_parts / consumers) % dq_row_groups);
    }
    static constexpr int dq_part_col(int p) {
        constexpr int per_consumer = dq_parts / consumers;
        // One row group: every consumer's parts in column order.
        return dq_row_groups == 1
                   ? 64 * p
                   : p / per_consumer / dq_row_groups * dq_cols + 64 * (p % per_consumer);
    }
    static_assert(B_r % 64 == 0 && consumers % dq_row_groups == 0 &&
                      (dq_cols % 64 == 0 || split_gradients || uneven_dq),
                  "whole dQ sub-tiles");
    static_assert(dq_share_floats(0) * (per_role ? 1 : consumers) +
                          (per_role ? dq_share_floats(1) : 0) ==
                      dq_floats,
                  "the consumers' shares fill a step's dQ");
    static_assert(!split_head || B_r == 64, "split_head: dQ's columns in GEMMs of 64");
    // The producer warpgroup's two warps need few registers; the consumers hold dK and dV
    // (64 x head_cols fp32 each) through the loop and Sᵀ and dPᵀ (64 x step_queries) in each
    // step.
    static constexpr int producer_registers = 24;
    static constexpr int consumer_registers = flash_attention::consumer_registers(C);

    // d_head 128's descriptors advance by 64-bit adds (Swizzle128Tile's WideAdvance): its loop
    // sheds 31 of ~500 SASS instructions a step (uniform moves of the descriptors' constant high
    // words; CUDA 13.0) and ran 1.6% faster at 8k non-causal, level to +0.4% elsewhere (bf16,
    // three interleaved rounds, H200, 2026-12-04). d_head 64's lagdq kernel lost 0.8-2.7% with
    // it (measured together with one other change), and d_head 256's loop grows with it.
    static constexpr bool wide = cols == 128;
    using QTile = SwizzledTile<B_r, cols, swizzle, false, wide>;
    using KTile = SwizzledTile<B_c, cols, swizzle, false, wide>;
    using DoTile = SwizzledTile<B_r, v_cols, v_swizzle, false, wide>;
    using VTile = SwizzledTile<B_c, v_cols, v_swizzle, false, wide>;
    // A consumer's columns of Q and dO (whole sub-tiles: the B of its dK and dV GEMMs).
    using QCols = SwizzledTile<B_r, head_cols, swizzle, false, wide>;
    using DoCols = SwizzledTile<B_r, split_gradients ? v_cols : head_cols, v_swizzle, false, wide>;
    // dS (and with split_head P): queries x keys.
    using DsTile = Swizzle128Tile<B_r, B_c, false, wide>;
    // Score tiles a step: dS; with split_head P too, after it (the A of every consumer's dV).
    static constexpr int score_tiles = split_head ? 2 : 1;
    // K lands with the first step's Q, on its barrier, and V with its dO (FlashAttention-4's
    // order: the first Sᵀ GEMM waits for K and Q alone); d_head 256 (split_head) loads both first,
    // on kv_full. Against both first (bf16 1k-8k, CLI A/Bs, H200, 2026-12-03): d_head 128
    // +1.2-1.8% in every one of three rounds (+2.1-3.4% in an earlier call), d_head 64 -1.0 to
    // +2.8% (the spread), d_head 256 -6 to -10% (its SASS differs only in order and registers;
    // the cause was not found).
    static constexpr bool kv_with_first_step = !split_head;
    // dQ a step behind (lag_dq): one dS barrier a step held both consumers in step, so that
    // they took their exponentials together with no GEMM in flight (ncu: tensor pipe 66%
    // against FA4's 79%, d_head 128, H200, 2026-12-02). Each step then computes the previous
    // step's dQ, from a dS buffer every consumer filled a step before (mbarriers per buffer),
    // and a consumer may run most of a step ahead of the other: d_head 64 +3.9% at 2k and
    // +7.1% at 8k (bf16 non-causal; causal GQA up to +9%), d_head 128 -1 to -5% (H200,
    // 2026-12-04). Two consumers of 64 keys.
    static constexpr bool lag_dq = C.sm90.lag_dq;
    static_assert(!lag_dq || !split_head, "lag_dq: consumers of 64 keys each");
    // Persistent: sm_count CTAs, each walking one key block of each round of sm_count in the
    // schedule (for_each_key_block). A CTA's dK and dV tiles are staged over its dS tiles and dQ
    // staging (the walk's scratch, free once the walk ends), so that the next key block's K and V
    // load while they are stored, and no CTA launch comes between two key blocks. (Not with ordered
    // dQ: a key block's adds may wait on a lower key block that a fixed share of the schedule has
    // not started yet.)
    static constexpr bool persistent = C.sm90.persistent;
    static_assert(!persistent || (kv_with_first_step && !ordered_dq),
                  "persistent: consumers of 64 keys each, dQ unordered");
    // Persistent on the dynamic schedule: after its first round a CTA takes its next key block
    // from a global counter (BackwardArgs::tile_counter), in the schedule's order, so that
    // causal walks of unequal length balance as a grid of one CTA a key block does. The
    // producer's thread takes it and hands it to the other roles through shared memory.
    static constexpr bool dynamic = C.sm90.dynamic_schedule;
    static_assert(!dynamic || persistent, "dynamic: persistent CTAs");
    // Non-causal walks rotated (QueryWalk), so that a head's CTAs do not all read the same Q and
    // dO block and add to the same dQ rows at once, as they do walking from the first block:
    // d_head 256 (a step's dQ 64 KB, twice the others' for its GEMMs' work) +4.3-6.6% at 1k-16k
    // non-causal, but causal -3.4% at 1k to +0.7% at 16k, d_head 64 and 128 -0.6 to -2.5%
    // causal or not (bf16, three rounds, H200, 2026-12-04). Never with ordered dQ, whose adds
    // follow the key blocks' order.
    static constexpr bool rotate_walks = split_head && !ordered_dq;
    // lag_dq: a step's statistics come with its Q tile, bulk-copied by the producer into the Q
    // stage's rows of Smem::stats (FlashAttention-4's design), so that the consumers load none
    // and no consumer waits for another's copy; otherwise the consumers stage them (StepStats).
    static constexpr bool stats_in_stages = lag_dq;
    // Stream-K (BackwardStreamK): a dense non-causal problem's last round of key blocks handed
    // out as ranges of steps. A range's pieces come one after another within a round of the
    // dynamic schedule's ring, so the consumers stage no statistics across rounds (lag_dq's
    // come with Q); the partial slots hold the two consumers' like accumulators (not per_role).
    static constexpr bool stream_k = C.sm90.stream_k;
    static_assert(!stream_k || (dynamic && lag_dq && !per_role),
                  "stream_k: persistent CTAs on the dynamic schedule, lag_dq, like consumers");
    // lag_dq, by dS buffer: every consumer warp's dS of the step is stored (full), and every
    // consumer warp's dQ GEMM has read it (empty).
    struct DsBarriers {
        tma::Barrier full[2], empty[2];
    };
    struct NoDsBarriers {};
    // dynamic: each round's key block, in two slots alternating by round; full once the
    // producer has written it, empty once every consumer thread and the dQ warp have read it.
    struct KeyBlockRing {
        int index[2];
        tma::Barrier full[2], empty[2];
    };
    struct NoKeyBlockRing {};
    static constexpr int ring_readers = consumers * warpgroup_threads + warp_size;

    struct Smem {
        alignas(1024) unsigned char k[KTile::bytes];
        alignas(1024) unsigned char v[VTile::bytes];
        alignas(1024) unsigned char q[stages][QTile::bytes];
        alignas(1024) unsigned char d_o[stages][DoTile::bytes];
        // The walk's scratch; persistent, after the walk, dK's and dV's 16-bit tiles for their
        // TMA stores (K and V then take the next key block's rows).
        union Scratch {
            struct Walk {
                // Two, alternating by step: a consumer writes the next step's dS while another
                // may still read this one's in its dQ GEMM.
                alignas(1024) unsigned char ds[2][score_tiles * DsTile::bytes];
                // Every consumer's dQ parts (dq_first_part), in the accumulators' order.
                alignas(16) float dq[dq_floats];
            } walk;
            alignas(1024) unsigned char gradients[2][KTile::bytes];  // dK, dV
        } scratch;
        static_assert(sizeof(typename Scratch::Walk) >= 2 * KTile::bytes,
                      "dK and dV fit in the walk's scratch (which sets its size)");
        // A step's query rows' LSE (base 2) then D: stats_in_stages, step i's in its Q stage's
        // row; otherwise alternating by step, the consumers copying the next step's from global
        // memory while they run this one (StepStats).
        alignas(16) float stats[stats_in_stages ? stages : 2][2 * B_r];
        tma::Barrier kv_full;   // K and V, unless kv_with_first_step
        tma::Barrier kv_empty;  // persistent: every consumer warp's last GEMM of K and V is done
        tma::Barrier q_full[stages], q_empty[stages];
        tma::Barrier d_o_full[stages], d_o_empty[stages];
        std::conditional_t<lag_dq, DsBarriers, NoDsBarriers> ds_barriers;
        std::conditional_t<dynamic, KeyBlockRing, NoKeyBlockRing> key_blocks;
    };
    // Dynamic shared memory: the struct, aligned in the kernel to 1024 bytes.
    static constexpr int smem_bytes = static_cast<int>(sizeof(Smem)) + 1024;
    static_assert(smem_bytes == static_cast<int>(flash_attention::smem_bytes(C)),
                  "smem_bytes(C) matches the layout");

    // Named barriers (bar.sync ids; 0 is __syncthreads): every consumer's dS is in shared
    // memory; consumer w's dQ staging is full (for the dQ warp) and empty again (its bulk
    // reduce has read it).
    static constexpr int ds_ready_barrier = 1;
    static constexpr int dq_full_barrier(int w) { return 2 + w; }
    static constexpr int dq_empty_barrier(int w) { return 2 + consumers + w; }
    static constexpr int dq_barrier_threads = warpgroup_threads + warp_size;
    // Persistent, where dV's tile reaches past the dS tiles into the dQ staging: the dQ warp's
    // last bulk reduce of a walk has read the staging.
    static constexpr int ds_bytes = 2 * score_tiles * DsTile::bytes;  // Walk::ds
    static constexpr bool gradients_reach_dq = 2 * KTile::bytes > ds_bytes;
    static constexpr bool staging_free_wait = persistent && gradients_reach_dq;
    static constexpr int staging_free_barrier = 2 + 2 * consumers;
    static constexpr int staging_free_threads = consumers * warpgroup_threads + warp_size;
    static_assert(staging_free_barrier < 16, "16 named barriers per CTA");
};

// Where a consumer's dQ accumulator element lives in its staging share (and in the global
// accumulator's block): its thread's float4 of n8 tile `nt` (accumulator registers e = 0..3),
// the 128 threads' float4s of one tile side by side, so that the staging stores are 16 bytes
// a lane and conflict-free. Element e of tile nt of thread t is row 16 (t / 32) + (t % 32) / 4
// + 8 (e / 2), column 8 nt + 2 (t % 4) + e % 2 of the consumer's share (query rows by d_head
// columns): its 64 x 64 parts (BackwardTraits::dq_first_part) in order, n8 tiles 8 j to 8 j + 7
// the share's part j.
__host__ __device__ constexpr int dq_index(int nt, int thread, int e) {
    return (nt * warpgroup_threads + thread) * 4 + e;
}

struct BackwardLaunch {
    BackwardArgs args;
    BackwardTensorMaps maps;
};

// The producer's thread: K and V (BackwardTraits::kv_with_first_step: with the first step's Q and
// dO, on their barriers; a walk of no steps then loads neither, its dK and dV being zeros), then
// every step's Q and dO. step0: the walk's first step in the CTA's pipeline
// (persistent: the steps of its earlier key blocks); walks: the CTA's earlier key blocks with
// steps, whose last one's K and V the consumers release (kv_empty) before this one's load over
// them. A walk of no steps neither loads nor releases: its release could complete the barrier's
// next phase before the producer's wait for the one before, and a parity wait cannot tell a
// phase from the one two before it (a hang).
template <class Tr>
__device__ __forceinline__ void produce_backward(const BackwardLaunch& launch,
                                                 typename Tr::Smem& smem, const QueryWalk& walk,
                                                 const BackwardSequence& seq, int k0, int kv_head,
                                                 int step0, int walks) {
    const int batch = seq.entry;
    if constexpr (!Tr::kv_with_first_step) {
        smem.kv_full.arrive_expect_tx(Tr::KTile::bytes + Tr::VTile::bytes);
        tma::load_tile<typename Tr::KTile>(smem.k, &launch.maps.k, seq.k_row0 + k0, kv_head, batch,
                                           smem.kv_full);
        tma::load_tile<typename Tr::VTile>(smem.v, &launch.maps.v, seq.k_row0 + k0, kv_head, batch,
                                           smem.kv_full);
    }
    QueryWalk::Step at = walk.first<Tr::rotate_walks, Tr::stream_k>();
    for (int i = 0; i < walk.steps<Tr::stream_k>(); ++i, at.advance<Tr::rotate_walks>(walk)) {
        const RingSlot<Tr::stages> slot(step0 + i);
        const int head = kv_head * walk.group + at.head;
        const int q0 = seq.q_row0 + at.block * Tr::B_r;
        const bool first = Tr::kv_with_first_step && i == 0;
        const std::uint32_t k_bytes = first ? Tr::KTile::bytes : 0;
        const std::uint32_t v_bytes = first ? Tr::VTile::bytes : 0;
        // K (and V) ahead of Q (dO); persistent, after them: this walk's first Q and dO may
        // land while the last walk's GEMMs still read K and V.
        const auto load_kv = [&](auto tile_type, void* tile, const void* map,
                                 tma::Barrier& barrier) {
            tma::load_tile<typename decltype(tile_type)::type>(tile, map, seq.k_row0 + k0, kv_head,
                                                               batch, barrier);
        };
        constexpr std::type_identity<typename Tr::KTile> k_tile;
        constexpr std::type_identity<typename Tr::VTile> v_tile;
        // The step's LSE then D rows (stats_in_stages), with Q. The preprocess's rows of a head
        // are padded to whole blocks of 128, so a block's rows are whole and 16-byte aligned.
        constexpr std::uint32_t row_bytes = Tr::B_r * sizeof(float);
        constexpr std::uint32_t stats_bytes = Tr::stats_in_stages ? 2 * row_bytes : 0;
        smem.q_empty[slot.stage].wait(slot.parity ^ 1);
        smem.q_full[slot.stage].arrive_expect_tx(Tr::QTile::bytes + k_bytes + stats_bytes);
        if (first && !Tr::persistent)
            load_kv(k_tile, smem.k, &launch.maps.k, smem.q_full[slot.stage]);
        tma::load_tile<typename Tr::QTile>(smem.q[slot.stage], &launch.maps.q, q0, head, batch,
                                           smem.q_full[slot.stage]);
        if (first && Tr::persistent) {
            if (walks > 0)
                smem.kv_empty.wait((walks - 1) & 1);
            load_kv(k_tile, smem.k, &launch.maps.k, smem.q_full[slot.stage]);
        }
        if constexpr (Tr::stats_in_stages) {
            // The rows are the preprocess's, which this kernel may overlap (a programmatic
            // dependent launch): the CTA's first copy waits for that grid, after the first Q and
            // K loads (the caller's tensors) are issued.
            if (step0 + i == 0)
                ptx::wait_for_previous_grid();
            const std::int64_t row0 = seq.ws(launch.args, head, at.block * Tr::B_r);
            float* stats = smem.stats[slot.stage];
            tma::load_bytes(stats, launch.args.lse2 + row0, row_bytes, smem.q_full[slot.stage]);
            tma::load_bytes(stats + Tr::B_r, launch.args.d + row0, row_bytes,
                            smem.q_full[slot.stage]);
        }
        smem.d_o_empty[slot.stage].wait(slot.parity ^ 1);
        smem.d_o_full[slot.stage].arrive_expect_tx(Tr::DoTile::bytes + v_bytes);
        if (first && !Tr::persistent)
            load_kv(v_tile, smem.v, &launch.maps.v, smem.d_o_full[slot.stage]);
        tma::load_tile<typename Tr::DoTile>(smem.d_o[slot.stage], &launch.maps.d_o, q0, head, batch,
                                            smem.d_o_full[slot.stage]);
        if (first && Tr::persistent)
            load_kv(v_tile, smem.v, &launch.maps.v, smem.d_o_full[slot.stage]);
    }
}

// The dQ warp: each step, every consumer's staged dQ added to the global accumulator by one bulk
// reduce-add each; a consumer's staging is handed back once its reduce has read it. Ordered
// (deterministic): a query block's additions go in the scheduler's key-block order, each CTA
// waiting for its block's semaphore to count the adds before its own (adds_before) and advancing
// it once its reduces have completed. A CTA waits only on key blocks of its pair that the
// scheduler launches before it: the wait always ends.
template <class Tr, class Mask>
__device__ __forceinline__ void add_dq(const BackwardArgs& a, const Mask& mask,
                                       typename Tr::Smem& smem, const QueryWalk& walk,
                                       const KeyBlockScheduler& scheduler,
                                       const BackwardSequence& seq, int key_block, int kv_head) {
    constexpr bool ordered = Tr::ordered_dq;
    const bool leader = threadIdx.x % warp_size == 0;
    QueryWalk::Step at = walk.first<Tr::rotate_walks, Tr::stream_k>();
    for (int i = 0; i < walk.steps<Tr::stream_k>(); ++i, at.advance<Tr::rotate_walks>(walk)) {
        if (leader && !ordered)
            tma::wait_stores_read();  // ordered: completed at the end of the last step
        __syncwarp();
#pragma unroll
        for (int w = 0; w < Tr::consumers; ++w)
            ptx::named_barrier_arrive(Tr::dq_empty_barrier(w), Tr::dq_barrier_threads);
        const int head = kv_head * walk.group + at.head;
        const std::int64_t row0 = seq.ws(a, head, at.block * Tr::B_r);
        float* block = a.dq_accum + row0 * Tr::cols;
        if constexpr (ordered) {
            if (leader) {
                const cuda::atomic_ref<int, cuda::thread_scope_device> semaphore(
                    a.dq_semaphores[seq.semaphore(a, head, at.block * Tr::B_r)]);
                const int before =
                    scheduler.adds_before(a, mask, key_block, at.block, Tr::B_r, Tr::B_c);
                while (semaphore.load(cuda::memory_order_acquire) != before) {
                }
                // The earlier blocks' reduces, seen through the acquire, before ours.
                cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
            }
            // bar.sync below is .aligned: the warp reconverges after the leader's spin.
            __syncwarp();
        }
#pragma unroll
        for (int w = 0; w < Tr::consumers; ++w) {
            ptx::named_barrier_sync(Tr::dq_full_barrier(w), Tr::dq_barrier_threads);
            if (leader) {
                const int part = Tr::dq_first_part(w) * Tr::dq_part_floats;
                cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared,
                                                cuda::ptx::op_add, block + part,
                                                smem.scratch.walk.dq + part,
                                                Tr::dq_share_floats(w) * sizeof(float));
                cuda::ptx::cp_async_bulk_commit_group();
            }
        }
        if constexpr (ordered) {
            if (leader) {
                tma::wait_stores_done();
                cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
                cuda::atomic_ref<int, cuda::thread_scope_device>(
                    a.dq_semaphores[seq.semaphore(a, head, at.block * Tr::B_r)])
                    .fetch_add(1, cuda::memory_order_release);
            }
        }
    }
    // Every reduce has read its shared memory before the CTA exits. Their writes need no wait:
    // the dQ conversion's wait for this grid (griddepcontrol.wait) sees the grid's memory
    // operations completed, bulk reduces included.
    if (leader)
        tma::wait_stores_read();
}

// A step's query rows' statistics from the preprocess, the LSE (base 2) and D, staged in shared
// memory one step ahead by the consumers themselves (outside lag_dq), so that their latency hides
// behind the step's GEMMs: each thread loads its share of the next step's rows from global memory
// as a step begins and stores it before the step's dSᵀ barrier, which every consumer passes before
// the next step reads them (plain loads and stores ordered by a named barrier need no proxy
// fence). lag_dq, whose consumers pass no common barrier each step, has the producer copy them
// with the step's Q instead (BackwardTraits::stats_in_stages).
// (Read from global memory at use, each step waited on L2 and d_head 64 spilled.)
template <class Tr>
struct StepStats {
    static constexpr int floats = 2 * Tr::B_r;  // the LSE rows, then D's
    static constexpr int threads = Tr::consumers * warpgroup_threads;
    static constexpr int per_thread = (floats + threads - 1) / threads;
    float v[per_thread];

    // Consumer thread t takes floats t, t + threads, ...
    __device__ __forceinline__ void load(const BackwardArgs& a, std::int64_t row0) {
        const int t = threadIdx.x - warpgroup_threads;
#pragma unroll
        for (int j = 0; j < per_thread; ++j) {
            const int f = t + j * threads;
            if (f < floats)
                v[j] = __ldg(f < Tr::B_r ? a.lse2 + row0 + f : a.d + row0 + (f - Tr::B_r));
        }
    }
    __device__ __forceinline__ void store(float* stats) const {
        const int t = threadIdx.x - warpgroup_threads;
#pragma unroll
        for (int j = 0; j < per_thread; ++j) {
            const int f = t + j * threads;
            if (f < floats)
                stats[f] = v[j];
        }
    }
};

// A consumer's accumulator of a gradient that another consumer holds (split_gradients).
struct NoGradient {};
template <int NT>
using GradientTiles = std::conditional_t<(NT > 0), float[1][(NT > 0 ? NT : 1)][4], NoGradient>;

// A consumer warpgroup: 64 keys' dK and dV (split_head: head_cols of their columns;
// split_gradients: Role 0 dK's, Role 1 dV's, every column), accumulated over the walk. Role -1:
// any consumer of the other kernels.
template <class Tr, int Role = -1>
struct BackwardConsumer {
    using Smem = typename Tr::Smem;
    static constexpr DType dtype = Tr::dtype;
    static constexpr int s_tiles = Tr::step_queries / 8;  // of Sᵀ and dPᵀ (n8 tiles of queries)
    static constexpr int dk_tiles = Tr::dk_cols(Role) / 8;
    static constexpr int dv_tiles = Tr::dv_cols(Role) / 8;
    static constexpr int dq_tiles = Tr::dq_cols_of(Role) / 8;
    using QTile = typename Tr::QTile;
    using KTile = typename Tr::KTile;
    using DoTile = typename Tr::DoTile;
    using VTile = typename Tr::VTile;
    using DsTile = typename Tr::DsTile;

    Smem& smem;
    const BackwardArgs& args;
    std::uint32_t smem_base;  // smem's shared-memory address
    int consumer;
    float scale_log2;
    KeyRowQueries mask;  // of this thread's key rows
    int first_key;       // this warp's first key row
    int dq_row_group;    // its dQ rows: 64 queries of the step's B_r
    int alibi_shift;     // ALiBi: a query's diagonal position is its index plus this
    GradientTiles<dk_tiles> dk;
    GradientTiles<dv_tiles> dv;

    // One query block: all five GEMMs, the probabilities and dS, dQ staged for the dQ warp;
    // outside lag_dq, the next step's statistics (its rows from next_row0; none if negative)
    // staged meanwhile.
    // Alibi: the step's head's slope in Sᵀ's units (alibi_slope()) biases the exponent.
    // Previous (lag_dq): whether a previous step's dQ is to be computed (every step but the
    // first), a compile-time flag: wgmmas issued under a branch were serialized and spilled
    // hundreds of bytes (ptxas, CUDA 13.0).
    template <bool Masked, bool Softcap, bool Alibi = false, bool Previous = true>
    __device__ __forceinline__ void step(int i, int q0, std::int64_t next_row0,
                                         float alibi_slope = 0.0f) {
        const RingSlot<Tr::stages> slot(i);
        const int lane = threadIdx.x % warp_size;
        StepStats<Tr> next;
        if constexpr (!Tr::stats_in_stages) {
            if (next_row0 >= 0)
                next.load(args, next_row0);
        }
        // This consumer's queries of the step: [query_col0, query_col0 + step_queries).
        const int query_col0 = Tr::query_col0(consumer);
        const float* stats = smem.stats[Tr::stats_in_stages ? slot.stage : i % 2];
        const float* lse2 = stats + query_col0;
        const float* d = stats + Tr::B_r + query_col0;
        // A column's LSE or D (its float2 pair of columns of n8 tile nt). Both are read before
        // the GEMM wait that precedes their use (the waits order memory: their asm clobbers it)
        // where the registers allow ("early"); at B_r 128 the 32 the LSE takes beside Sᵀ and
        // dPᵀ spilled (ptxas, CUDA 13.0), and each tile's reads come with its use, as with a
        // softcap, whose Pᵀ fragments are live across dPᵀ's wait (early: 80 bytes spilled at
        // d_head 128, late: 40).
        constexpr bool early = s_tiles <= 8 && !Softcap;
        const auto column_pair = [&](const float* rows, int nt) {
            return *reinterpret_cast<const float2*>(rows + nt * 8 + 2 * (lane % 4));
        };
        const auto load_early = [&](float2(&ahead)[early ? s_tiles : 1], const float* rows) {
            if constexpr (early) {
#pragma unroll
                for (int nt = 0; nt < s_tiles; ++nt)
                    ahead[nt] = column_pair(rows, nt);
            }
        };
        const auto column = [&](const float2(&ahead)[early ? s_tiles : 1], const float* rows,
                                int nt) {
            if constexpr (early)
                return ahead[nt];
            else
                return column_pair(rows, nt);
        };
        float2 l[early ? s_tiles : 1];
        if constexpr (!Tr::stats_in_stages)
            load_early(l, lse2);
        const std::uint32_t base = opaque_base();
        const std::uint32_t q_s = base + offsetof(Smem, q) + slot.stage * QTile::bytes;
        const std::uint32_t d_o_s = base + offsetof(Smem, d_o) + slot.stage * DoTile::bytes;
        const std::uint32_t ds_s = ds_tile(base, i);
        const std::uint32_t p_s = ds_s + DsTile::bytes;  // split_head's P tile
        // This consumer's 64 rows of K and V, and K's columns of its dQ share (dQ's B).
        const int key_rows = Tr::key_rows_of(consumer);
        const std::uint32_t k_rows = base + offsetof(Smem, k) + KTile::group_offset(key_rows);
        const std::uint32_t v_rows = base + offsetof(Smem, v) + VTile::group_offset(key_rows);
        // Its columns of Q and dO for dK and dV.
        const std::uint32_t cols =
            Tr::head_col0(consumer) / QTile::sub_tile_cols * QTile::sub_tile_stride;
        const std::uint32_t k_dq = dq_k_cols(base);

        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (this consumer's queries), issued back to back.
        const int query_rows = QTile::group_offset(query_col0);
        float s[1][s_tiles][4], dp[1][s_tiles][4];
        smem.q_full[slot.stage].wait(slot.parity);
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Tr::d_head / 16; ++kk) {
            ptx::wgmma_ss<dtype, Tr::step_queries, false>(
                s[0], KTile::k_major(k_rows, kk), QTile::k_major(q_s + query_rows, kk), kk > 0);
        }
        ptx::wgmma_commit_group();
        if constexpr (Tr::stats_in_stages)
            load_early(l, lse2);  // landed with Q
        smem.d_o_full[slot.stage].wait(slot.parity);
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Tr::d_v / 16; ++kk) {
            ptx::wgmma_ss<dtype, Tr::step_queries, false>(
                dp[0], VTile::k_major(v_rows, kk), DoTile::k_major(d_o_s + query_rows, kk), kk > 0);
        }
        ptx::wgmma_commit_group();

        // Pᵀ, each column (query) against its row's LSE. A softcap first, as the forward's, before
        // the mask (tanh(-inf) would be -1): t = tanh(S · prescale); Pᵀ goes to its 16-bit A
        // fragments at once and Sᵀ's registers keep Pᵀ ∘ (1 - t²), tanh's derivative, for dSᵀ
        // (0 where masked: t is -inf there), so that t needs no registers of its own.
        ptx::wgmma_wait<1>();
        ptx::fence_operands(s[0]);
        std::uint32_t p[1][s_tiles / 2][4], ds[1][s_tiles / 2][4];
        if constexpr (Softcap)
            softcap_scores(s, args.softcap_prescale);
        if constexpr (Masked)
            mask.apply(s, q0 + query_col0);
        // ALiBi joins the exponent only: the softcap's derivative is the tanh's. Keys are the rows.
        const AlibiTile bias(alibi_slope, first_key, q0 + query_col0 + alibi_shift);
#pragma unroll
        for (int kt = 0; kt < s_tiles / 2; ++kt) {
            float probabilities[2][4];
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int nt = 2 * kt + half;
                const float2 lse = column(l, lse2, nt);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float t = s[0][nt][e];
                    const float u = Alibi ? t + bias(0, nt, e) : t;
                    probabilities[half][e] = ptx::ex2(u * scale_log2 - (e % 2 ? lse.y : lse.x));
                    s[0][nt][e] = Softcap ? probabilities[half][e] * fmaxf(1.0f - t * t, 0.0f)
                                          : probabilities[half][e];
                }
            }
            if constexpr (Softcap)
                a_fragment<dtype>(probabilities[0], probabilities[1], p[0][kt]);
        }
        // dSᵀ = Pᵀ ∘ (dPᵀ - D) (∘ (1 - t²) with a softcap).
        float2 dd[early ? s_tiles : 1];
        load_early(dd, d);
        ptx::wgmma_wait<0>();
        ptx::fence_operands(dp[0]);
        // A k-tile at a time, so that its Sᵀ and dPᵀ registers die as its 16-bit fragments are
        // made: all of them at once spilled twice as much in the softcap instances (40 bytes
        // against 20 at d_head 128, ptxas, CUDA 13.0).
#pragma unroll
        for (int kt = 0; kt < s_tiles / 2; ++kt) {
#pragma unroll
            for (int nt = 2 * kt; nt < 2 * kt + 2; ++nt) {
                const float2 dnt = column(dd, d, nt);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dp[0][nt][e] = s[0][nt][e] * (dp[0][nt][e] - (e % 2 ? dnt.y : dnt.x));
            }
            if constexpr (!Softcap)
                a_fragment<dtype>(s[0][2 * kt], s[0][2 * kt + 1], p[0][kt]);
            a_fragment<dtype>(dp[0][2 * kt], dp[0][2 * kt + 1], ds[0][kt]);
        }

        if constexpr (Tr::split_head) {
            split_head_gemms(slot, p, ds, ds_s, p_s, q_s, d_o_s, cols, k_dq, [&] {
                if (next_row0 >= 0)
                    next.store(smem.stats[(i + 1) % 2]);
            });
        } else if constexpr (Tr::lag_dq) {
            // dSᵀ to shared memory, announced (full);
            // then the previous step's dQ = dS·K (its buffer announced by every consumer a step
            // ago), dV += Pᵀ·dO and dK += dSᵀ·Q. This buffer last held dS two steps back: every
            // consumer's dQ has read it (empty); persistent, i counts the CTA's earlier walks'
            // steps too, and a walk's first step may reuse the last walk's buffer.
            auto& barriers = smem.ds_barriers;
            if ((Previous || Tr::persistent) && i >= 2)
                barriers.empty[i % 2].wait(((i - 2) / 2) & 1);
            store_scores(ds, ds_s);
            tma::fence_shared_to_async_proxy();
            arrive_warp(barriers.full[i % 2]);
            float dq[1][dq_tiles][4];
            if constexpr (Previous) {
                barriers.full[(i - 1) % 2].wait(((i - 1) / 2) & 1);
                // Its addresses from a fresh opaque base, as in the measured kernel (from the
                // step's `base` its PTX differed; not measured).
                const std::uint32_t fresh = opaque_base();
                gemm_dq(dq, ds_tile(fresh, i - 1), dq_k_cols(fresh));
            }
            ptx::wgmma_commit_group();  // empty in the first step
            ptx::fence_operands(dv[0]);
            ptx::wgmma_fence();
            warpgroup_gemm_pv<dtype, typename Tr::DoCols, Tr::B_r>(dv[0], p[0], d_o_s + cols);
            ptx::wgmma_commit_group();
            ptx::fence_operands(dk[0]);
            ptx::wgmma_fence();
            warpgroup_gemm_pv<dtype, typename Tr::QCols, Tr::B_r>(dk[0], ds[0], q_s + cols);
            ptx::wgmma_commit_group();
            ptx::wgmma_wait<2>();  // the previous step's dQ
            if constexpr (Previous) {
                ptx::fence_operands(dq[0]);
                arrive_warp(barriers.empty[(i - 1) % 2]);
                stage_dq(dq, 0, true, true);
            }
            ptx::wgmma_wait<1>();  // dV's GEMM: dO and Pᵀ are free
            ptx::fence_operands(dv[0]);
            ptx::fence_operands(p[0]);
            release(smem.d_o_empty[slot.stage]);
            ptx::wgmma_wait<0>();  // dK's GEMM: Q and dS are free
            ptx::fence_operands(dk[0]);
            ptx::fence_operands(ds[0]);
            release_q(smem.q_empty[slot.stage]);
        } else {
            // The next step's statistics staged and dV += Pᵀ·dO issued; then the barrier: every
            // consumer's dSᵀ is in shared memory for dQ.
            // dSᵀ to shared memory before dV's GEMM is issued: stored after it, the stores
            // queued behind its register-sourced wgmmas and the fence before the dS barrier
            // waited for them (7.8% of d_head 64's stall samples against FA4's 3.9%, ncu, H200,
            // 2026-12-02).
            store_scores(ds, ds_s);
            if (next_row0 >= 0)
                next.store(smem.stats[(i + 1) % 2]);
            ptx::fence_operands(dv[0]);
            ptx::wgmma_fence();
            warpgroup_gemm_pv<dtype, typename Tr::DoCols, Tr::B_r>(dv[0], p[0], d_o_s + cols);
            ptx::wgmma_commit_group();
            tma::fence_shared_to_async_proxy();
            ptx::named_barrier_sync(Tr::ds_ready_barrier, Tr::consumers * warpgroup_threads);

            // This consumer's share of dQ = dS·K; then dK += dSᵀ·Q.
            float dq[1][dq_tiles][4];
            gemm_dq(dq, ds_s, k_dq);
            ptx::wgmma_commit_group();
            ptx::wgmma_wait<1>();  // dV's GEMM (dQ's still running): dO and Pᵀ are free
            ptx::fence_operands(dv[0]);
            ptx::fence_operands(p[0]);
            release(smem.d_o_empty[slot.stage]);
            ptx::fence_operands(dk[0]);
            ptx::wgmma_fence();
            warpgroup_gemm_pv<dtype, typename Tr::QCols, Tr::B_r>(dk[0], ds[0], q_s + cols);
            ptx::wgmma_commit_group();
            ptx::wgmma_wait<1>();  // dQ's GEMM
            ptx::fence_operands(dq[0]);
            stage_dq(dq, 0, true, true);
            ptx::wgmma_wait<0>();  // dK's GEMM: Q and dS are free
            ptx::fence_operands(dk[0]);
            ptx::fence_operands(ds[0]);
            release_q(smem.q_empty[slot.stage]);
        }
    }

    // smem's shared-memory address, opaque to the compiler, so that every operand address is
    // computed anew where it is used: hoisted out of the loop, the GEMMs' 40 descriptors of K
    // and V took 64-bit registers for the whole loop, and d_head 128 spilled (ptxas, CUDA 13.0).
    __device__ std::uint32_t opaque_base() const {
        std::uint32_t base = smem_base;
        asm volatile("" : "+r"(base));
        return base;
    }
    // Step i's dS tile (and split_head's P tile after it), of shared memory at `base`.
    __device__ static std::uint32_t ds_tile(std::uint32_t base, int i) {
        return base + offsetof(Smem, scratch.walk.ds) + (i % 2) * Tr::score_tiles * DsTile::bytes;
    }
    // K's columns of this consumer's dQ share (dQ's B; split_gradients: of its first part).
    __device__ std::uint32_t dq_k_cols(std::uint32_t base) const {
        return base + offsetof(Smem, k) +
               Tr::dq_col0(consumer) / KTile::sub_tile_cols * KTile::sub_tile_stride;
    }

    // This consumer's share of a step's dQ = dS·K (its 64 query rows of the dS tile at ds_s; K's
    // columns at k_dq, read MN-major), issued, not committed.
    __device__ __forceinline__ void gemm_dq(float (&dq)[1][dq_tiles][4], std::uint32_t ds_s,
                                            std::uint32_t k_dq) const {
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Tr::B_c / 16; ++kk) {
            ptx::wgmma_ss<dtype, 8 * dq_tiles, true>(
                dq[0], DsTile::k_major(ds_s + DsTile::group_offset(64 * dq_row_group), kk),
                KTile::mn_major(k_dq, kk), kk > 0);
        }
    }

    // lag_dq, after a walk of `steps` steps ending before step `end` (of the CTA's pipeline):
    // its last step's dQ, staged; persistent, its dS buffer is then released to the next walk.
    __device__ __forceinline__ void finish_dq(int end, int steps) const {
        if (steps == 0)
            return;
        float dq[1][dq_tiles][4];
        smem.ds_barriers.full[(end - 1) % 2].wait(((end - 1) / 2) & 1);
        const std::uint32_t base = opaque_base();
        gemm_dq(dq, ds_tile(base, end - 1), dq_k_cols(base));
        ptx::wgmma_commit_group();
        ptx::wgmma_wait<0>();
        ptx::fence_operands(dq[0]);
        if constexpr (Tr::persistent)
            arrive_warp(smem.ds_barriers.empty[(end - 1) % 2]);
        stage_dq(dq, 0, true, true);
    }

    // split_head's GEMMs after its scores: each consumer's Pᵀ and dSᵀ (its queries' columns)
    // to shared memory, the step's statistics staged (`stage_stats`) and the dS barrier; then
    // dV += Pᵀ·dO and dK += dSᵀ·Q for this consumer's columns over every query (Pᵀ and dSᵀ
    // read MN-major from the queries x keys tiles; split_gradients: its role's one of them),
    // and its parts of dQ = dS·K, GEMMs of 64 columns each staged as it completes (64
    // accumulators at once beside dK and dV serialized ptxas's wgmmas at d_head 256, CUDA
    // 13.0).
    template <class StageStats>
    __device__ __forceinline__ void split_head_gemms(const RingSlot<Tr::stages>& slot,
                                                     const std::uint32_t (&p)[1][s_tiles / 2][4],
                                                     const std::uint32_t (&ds)[1][s_tiles / 2][4],
                                                     std::uint32_t ds_s, std::uint32_t p_s,
                                                     std::uint32_t q_s, std::uint32_t d_o_s,
                                                     std::uint32_t cols, std::uint32_t k_dq,
                                                     const StageStats& stage_stats) {
        constexpr int parts = Tr::dq_parts_of(Role);
        static_assert(parts == 1 || parts == 2, "one or two parts of dQ a consumer");
        constexpr int gradient_gemms = (dv_tiles > 0) + (dk_tiles > 0);
        store_scores(p, p_s);
        store_scores(ds, ds_s);
        stage_stats();
        tma::fence_shared_to_async_proxy();
        ptx::named_barrier_sync(Tr::ds_ready_barrier, Tr::consumers * warpgroup_threads);
        // dQ's first part, then the gradients' GEMMs behind it: the part is staged while they
        // run, and a second part issued behind them.
        float dq[1][8][4];
        const auto gemm_dq = [&](int part) {
            ptx::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < Tr::B_c / 16; ++kk) {
                ptx::wgmma_ss<dtype, 64, true>(
                    dq[0], DsTile::k_major(ds_s, kk),
                    KTile::mn_major(k_dq + part * KTile::sub_tile_stride, kk), kk > 0);
            }
            ptx::wgmma_commit_group();
        };
        if constexpr (dv_tiles > 0)
            ptx::fence_operands(dv[0]);
        if constexpr (dk_tiles > 0)
            ptx::fence_operands(dk[0]);
        gemm_dq(0);
        if constexpr (dv_tiles > 0) {
#pragma unroll
            for (int kk = 0; kk < Tr::B_r / 16; ++kk) {
                ptx::wgmma_ss<dtype, 8 * dv_tiles, true, true>(
                    dv[0], DsTile::mn_major(p_s, kk), Tr::DoCols::mn_major(d_o_s + cols, kk), true);
            }
            ptx::wgmma_commit_group();
        }
        if constexpr (dk_tiles > 0) {
#pragma unroll
            for (int kk = 0; kk < Tr::B_r / 16; ++kk) {
                ptx::wgmma_ss<dtype, 8 * dk_tiles, true, true>(
                    dk[0], DsTile::mn_major(ds_s, kk), Tr::QCols::mn_major(q_s + cols, kk), true);
            }
            ptx::wgmma_commit_group();
        }
        ptx::wgmma_wait<gradient_gemms>();  // dQ's first part
        ptx::fence_operands(dq[0]);
        stage_dq(dq, 0, true, parts == 1);
        if constexpr (parts == 2)
            gemm_dq(1);
        ptx::wgmma_wait<parts - 1>();  // the gradients' GEMMs: Q and dO are free
        if constexpr (dv_tiles > 0)
            ptx::fence_operands(dv[0]);
        if constexpr (dk_tiles > 0)
            ptx::fence_operands(dk[0]);
        release(smem.d_o_empty[slot.stage]);
        release_q(smem.q_empty[slot.stage]);
        if constexpr (parts == 2) {
            ptx::wgmma_wait<0>();
            ptx::fence_operands(dq[0]);
            stage_dq(dq, 8, false, true);
        }
    }

    // k-tile kt of dSᵀ's (or Pᵀ's) 16-bit A fragments, transposed, into this warp's 16 key
    // columns of the step's dS (P) tile, at this consumer's queries (queries x keys, keys
    // contiguous: K-major for dQ's GEMM), one stmatrix: register r of k-tile kt holds key row lane
    // / 4 + 8 (r % 2), query columns 16 kt + 8 (r / 2) + 2 (lane % 4) + {0, 1}, so it is matrix r
    // of the 16 x 16 block; stored transposed, its column (query) j is the 16-byte chunk lane 8 r +
    // j addresses.
    __device__ __forceinline__ void store_score_tile(const std::uint32_t (&frag)[4],
                                                     std::uint32_t tile, int kt) const {
        const int lane = threadIdx.x % warp_size;
        const int matrix = lane / 8;
        const int key_chunk = first_key % Tr::B_c / 8 + matrix % 2;
        const int query = Tr::query_col0(consumer) + 16 * kt + 8 * (matrix / 2) + lane % 8;
        ptx::stmatrix_x4_trans(tile + DsTile::chunk_offset(query, key_chunk), frag);
    }
    // Every k-tile of them.
    __device__ __forceinline__ void store_scores(const std::uint32_t (&frags)[1][s_tiles / 2][4],
                                                 std::uint32_t tile) const {
#pragma unroll
        for (int kt = 0; kt < s_tiles / 2; ++kt)
            store_score_tile(frags[0][kt], tile, kt);
    }

    // This consumer's dQ share into its staging buffer once the dQ warp has handed it back, then
    // handed to the dQ warp.
    // (Tiles [first_tile, first_tile + NT) of the share; `first` waits for the buffer, `last`
    // hands it over.)
    template <int NT>
    __device__ __forceinline__ void stage_dq(const float (&dq)[1][NT][4], int first_tile,
                                             bool first, bool last) const {
        if (first)
            ptx::named_barrier_sync(Tr::dq_empty_barrier(consumer), Tr::dq_barrier_threads);
        float4* staging = reinterpret_cast<float4*>(
            smem.scratch.walk.dq + Tr::dq_first_part(consumer) * Tr::dq_part_floats);
        const int thread = threadIdx.x % warpgroup_threads;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            staging[dq_index(first_tile + nt, thread, 0) / 4] =
                float4{dq[0][nt][0], dq[0][nt][1], dq[0][nt][2], dq[0][nt][3]};
        }
        if (last) {
            tma::fence_shared_to_async_proxy();
            ptx::named_barrier_arrive(Tr::dq_full_barrier(consumer), Tr::dq_barrier_threads);
        }
    }

    // Each warp tells the producer it has finished reading a stage (after its wgmma wait).
    __device__ __forceinline__ static void release(tma::Barrier& empty) {
        arrive_warp(empty);
    }
    // Q's stage. With its statistics (stats_in_stages), which every lane has read with plain
    // loads, every consumer thread arrives, after a proxy fence that orders its reads before the
    // producer's next bulk copy into the stage (the async proxy). One arrival a warp after
    // __syncwarp orders them as well by the PTX memory model, but compute-sanitizer 2025.3's
    // racecheck does not follow that order from the other lanes and reports each of their reads
    // as a hazard against the copy.
    __device__ __forceinline__ static void release_q(tma::Barrier& empty) {
        if constexpr (Tr::stats_in_stages) {
            tma::fence_shared_to_async_proxy();
            empty.arrive();
        } else {
            arrive_warp(empty);
        }
    }
    // One arrival for the warp, once every lane is here: the barriers of consumer warps count
    // warps (their lanes' earlier shared-memory accesses ordered by __syncwarp, then released by
    // the arrival).
    __device__ __forceinline__ static void arrive_warp(tma::Barrier& barrier) {
        __syncwarp();
        if (threadIdx.x % warp_size == 0)
            barrier.arrive();
    }

    // Stream-K (BackwardTraits::stream_k): the consumers' dK and dV accumulators, unscaled, in a
    // piece's slot of BackwardArgs::streamk_partials: consumer after consumer, each its dK tiles
    // then its dV tiles, each tile its 128 threads' float4s side by side (a warp's 512 bytes
    // whole). In L2 (.cg): another SM's CTA reads them.
    static constexpr int partial_tiles = dk_tiles + dv_tiles;
    static constexpr int partial_floats = Tr::consumers * partial_tiles * warpgroup_threads * 4;
    static_assert(!Tr::stream_k || partial_floats == Tr::B_c * (Tr::cols + Tr::v_cols),
                  "a slot is BackwardStreamK::bytes()'s B_c x (d_head + d_v) floats");
    __device__ __forceinline__ float4* partial(float* slots, int slot, int t) const {
        return reinterpret_cast<float4*>(slots + std::int64_t{slot} * partial_floats) +
               (consumer * partial_tiles + t) * warpgroup_threads + threadIdx.x % warpgroup_threads;
    }
    template <class F>
    __device__ __forceinline__ void for_each_gradient_tile(F&& f) {
#pragma unroll
        for (int nt = 0; nt < dk_tiles; ++nt)
            f(nt, dk[0][nt]);
#pragma unroll
        for (int nt = 0; nt < dv_tiles; ++nt)
            f(dk_tiles + nt, dv[0][nt]);
    }
    // Stored where `store` (a predicate on the stores alone: the accumulators are read on every
    // path, see stage_gradient_rows).
    __device__ __forceinline__ void store_partial(float* slots, int slot, bool store) {
        for_each_gradient_tile([&](int t, const float(&g)[4]) {
            const float4 x = make_float4(g[0], g[1], g[2], g[3]);
            if (store)
                __stcg(partial(slots, slot, t), x);
        });
    }
    // The other pieces' partials of a split key block, for the piece that merges them: their
    // tile 0 (a tile's are warpgroup_threads float4s further), and whether each is one (the
    // first `pieces` - 1; none where `pieces` is 0). Fixed in number and found before the
    // staging, so that its unrolled loads need no index arithmetic.
    struct Merge {
        const float4* from[BackwardStreamK::k_max_pieces - 1];
        bool valid[BackwardStreamK::k_max_pieces - 1];

        __device__ __forceinline__ float4 sum(int t) const {
            float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int k = 0; k < BackwardStreamK::k_max_pieces - 1; ++k) {
                if (valid[k]) {
                    const float4 x = __ldcg(from[k] + t * warpgroup_threads);
                    s.x += x.x;
                    s.y += x.y;
                    s.z += x.z;
                    s.w += x.w;
                }
            }
            return s;
        }
    };
    // Piece `index` of split key block b's merge over its `pieces` (0: nothing to merge).
    __device__ __forceinline__ Merge merge_of(float* slots, const BackwardStreamK& split, int b,
                                              int pieces, int index) const {
        Merge m;
#pragma unroll
        for (int k = 0; k < BackwardStreamK::k_max_pieces - 1; ++k) {
            const int j = k < index ? k : k + 1;
            m.valid[k] = j < pieces;
            m.from[k] = partial(slots, m.valid[k] ? split.slot(b, j) : 0, 0);
        }
        return m;
    }
};

// Zeros rows [first, Tile::rows) of a swizzled tile at shared address `tile`, Threads threads
// sharing its 16-byte chunks.
template <class Tile, int Threads>
__device__ __forceinline__ void zero_tile_rows(std::uint32_t tile, int first, int thread) {
    constexpr int chunks = Tile::cols / 8;  // 16 bytes each
    for (int c = max(first, 0) * chunks + thread; c < Tile::rows * chunks; c += Threads)
        ptx::st_shared_16(tile + Tile::chunk_offset(c / chunks, c % chunks), uint4{});
}

// Stores a warp's 16 rows of a 64 x d_head gradient, scaled and rounded to 16 bits, at rows
// row0 + [0, 16) of a (seq, d_head) slice; rows from `rows` on are not stored.
template <DType dtype, int NT>
__device__ __forceinline__ void store_gradient_rows(const float (&g)[1][NT][4], float scale,
                                                    typename Element<dtype>::type* out,
                                                    std::int64_t row_stride, int row0, int rows) {
    const int lane = threadIdx.x % warp_size;
    store_accumulator_rows<dtype, NT>(g[0], scale, [&](int h) {
        const int row = row0 + lane / 4 + 8 * h;
        return row < rows ? out + row * row_stride : nullptr;
    });
}

// A warp's 16 rows of a 64 x d_head gradient (its m16n8 accumulators), scaled and rounded to
// 16 bits, into rows row0 + [0, 16), columns col0 on, of a Tile in TMA's swizzled layout
// (tma::store_tile's input): one stmatrix per two n8 tiles, matrices {tile nt, rows 0-7 and
// 8-15; tile nt + 1, the same}; lane l gives row l % 8 of matrix l / 8. A matrix's 8 rows sit
// in 8 different 16-byte chunks of shared memory's banks (the swizzle, 128- or 64-byte): no
// bank conflicts.
// Extra (stream-K's merge): extra(nt), a float4 added to tile nt's accumulators before the
// scale, in temporaries: the accumulators themselves are not written (ptxas serialized the
// kernel's wgmmas where a data-dependent path wrote them, C7520, CUDA 13.0). NoExtra: none.
struct NoExtra {};
template <DType dtype, class Tile, int NT, class Extra = NoExtra>
__device__ __forceinline__ void stage_gradient_rows(const float (&g)[1][NT][4], float scale,
                                                    std::uint32_t tile, int row0, int col0,
                                                    Extra extra = {}) {
    static_assert(NT % 2 == 0, "n8 tiles in pairs");
    constexpr bool extras = !std::is_same_v<Extra, NoExtra>;
    const int lane = threadIdx.x % warp_size;
    const int matrix = lane / 8;
    const int row = row0 + lane % 8 + 8 * (matrix % 2);
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
        float4 x[2];
        if constexpr (extras) {
            x[0] = extra(nt);
            x[1] = extra(nt + 1);
        }
        // Tile nt + h's element e, with its extra.
        const auto at = [&](int h, int e) {
            if constexpr (extras)
                return g[0][nt + h][e] + (e == 0   ? x[h].x
                                          : e == 1 ? x[h].y
                                          : e == 2 ? x[h].z
                                                   : x[h].w);
            else
                return g[0][nt + h][e];
        };
        const std::uint32_t r[4] = {ptx::pack_rn<dtype>(at(0, 0) * scale, at(0, 1) * scale),
                                    ptx::pack_rn<dtype>(at(0, 2) * scale, at(0, 3) * scale),
                                    ptx::pack_rn<dtype>(at(1, 0) * scale, at(1, 1) * scale),
                                    ptx::pack_rn<dtype>(at(1, 2) * scale, at(1, 3) * scale)};
        ptx::stmatrix_x4(tile + Tile::chunk_offset(row, col0 / 8 + nt + matrix / 2), r);
    }
}

// Mask: CausalMask (the plain kernels) or BandMask (a sliding window, BackwardArgs::band).
// Softcap: P = exp2(tanh(S · softcap_prescale) · scale_log2 - lse2) (BackwardArgs), and dSᵀ
// carries tanh's derivative 1 - t². Alibi (with BandMask): ALiBi's bias in P's exponent.
template <unsigned long long CodeHi, unsigned long long CodeLo, class Mask, bool Softcap,
          bool Alibi = false>
__global__ void __launch_bounds__(BackwardTraits<unpack(CodeHi, CodeLo)>::threads, 1)
    backward_kernel(const __grid_constant__ BackwardLaunch launch) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = BackwardTraits<unpack(CodeHi, CodeLo)>;
    using T = typename Tr::T;
    const BackwardArgs& a = launch.args;

    extern __shared__ unsigned char smem_raw[];
    // TMA's 128-byte swizzle repeats every 1024 bytes and wgmma assumes tiles start on that
    // period; dynamic shared memory is only guaranteed 16-byte alignment.
    auto& smem = *reinterpret_cast<typename Tr::Smem*>(
        smem_raw + ((1024 - ptx::smem_address(smem_raw) % 1024) % 1024));

    const auto scheduler = KeyBlockScheduler::of(a, Tr::B_c, Tr::ordered_dq);
    // Packed sequences run on the band kernels (their mask takes any causal flag): the plain
    // kernels keep their dense code.
    constexpr bool packable = std::is_same_v<Mask, BandMask>;
    // Stream-K's split of this launch (BackwardStreamK), where the launch gave it slots: the
    // plain kernels only (dense, no window), whose instances alone hold its code.
    constexpr bool streamable = Tr::stream_k && std::is_same_v<Mask, CausalMask>;
    const BackwardStreamK split = streamable && a.streamk_partials != nullptr
                                      ? BackwardStreamK::of(a, Tr::B_r, Tr::B_c, gridDim.x)
                                      : BackwardStreamK{};
    // The dynamic schedule's numbers: key blocks, then (stream-K) ranges of steps. (Evaluated
    // where used: as a variable it changed the other kernels' register allocation, ptxas 13.0.)
    const auto work_count = [&]() -> std::int64_t {
        if constexpr (streamable)
            return split.splits() ? split.count() : scheduler.count();
        else
            return scheduler.count();
    };
    // One key block's work: its place in the schedule, its sequence, mask and walk; none for a
    // key block past a packed sequence shorter than the grid's. Stream-K: a piece of the walk,
    // `split_block` its key block among the split ones (-1: the whole walk).
    struct Work {
        KeyBlockScheduler::Tile tile;
        int k0;
        BackwardSequence seq;
        Mask mask;
        QueryWalk walk;
        bool some;
        BackwardStreamK::Piece piece;
        int split_block;
    };
    const auto work_of = [&](int index) {
        const KeyBlockScheduler::Tile tile = scheduler.tile(index);
        const int k0 = tile.key_block * Tr::B_c;
        const BackwardSequence seq =
            packable ? BackwardSequence::of(a, tile.batch) : BackwardSequence::dense(a, tile.batch);
        const Mask mask = packable ? Mask::of(a, seq.q_len, seq.k_len) : Mask::of(a);
        bool rotate = false;
        if constexpr (std::is_same_v<Mask, CausalMask>)
            rotate = Tr::rotate_walks && !mask.causal;
        QueryWalk walk = QueryWalk::of(a, mask, k0, Tr::B_r, Tr::B_c, rotate);
        // A key block that runs past seq_k masks its keys there in every step. Their K rows are
        // zeros (or a packed sequence's next keys), so unmasked their P would be 2^-LSE₂, which
        // overflows where a row's scores all lie far below 0 (fp16 dS becomes inf, and inf · 0 in
        // dQ's GEMM NaN: flash_attn's test_flash_attn_bwd_overflow, seq 1 and 2, q·5, k·3).
        if (k0 + Tr::B_c > seq.k_len)
            walk.blocks.unmasked_end = walk.blocks.unmasked_first;
        return Work{tile, k0, seq, mask, walk, k0 < seq.k_len, {}, -1};
    };
    // Stream-K: piece p of range r (the counter's number split.whole + r).
    const auto piece_of = [&](int r, int p) {
        const BackwardStreamK::Piece piece = split.piece(r, p);
        Work w = work_of(split.whole + piece.block);
        w.walk.restrict(piece.first, piece.steps);
        w.piece = piece;
        w.split_block = piece.pieces > 1 ? piece.block : -1;
        return w;
    };
    // The key block of the CTA's round `round` (persistent; past the schedule's end once none is
    // left). Static: one of each round of gridDim.x in the schedule's order, taken forwards in
    // even rounds and backwards in odd ones, so that a CTA given one of a causal round's longest
    // walks gets one of the next round's shortest. Dynamic: the CTA's own in the first round,
    // then the counter's, which the producer's thread takes (`taker`) and hands to the other
    // roles' threads (ring_readers) through the ring: each takes every round's once, in order
    // (`take`), and may look at the next one's before (its slot is not written again until every
    // reader has taken it). Nothing is kept in registers across a walk, and the readers' code
    // holds no copy of the taker's: with one function for both, branching on the thread, the
    // d_head 64 lagdq kernel spilled 192 bytes instead of 72 and serialized its wgmmas (ptxas
    // C7520, CUDA 13.0).
    const auto key_block_index = [&](auto taker, int round, bool take) -> std::int64_t {
        const std::int64_t g = gridDim.x;
        if constexpr (!Tr::dynamic) {
            return round * g + (round % 2 ? g - 1 - blockIdx.x : blockIdx.x);
        } else {
            auto& ring = smem.key_blocks;
            const int slot = round % 2;
            if constexpr (decltype(taker)::value) {
                if (round == 1)
                    ptx::wait_for_previous_grid();  // the preprocess zeroes the counter
                // (Clamped: the counter runs past the schedule's end by a round.)
                std::int64_t index =
                    round == 0 ? std::int64_t{blockIdx.x} : g + atomicAdd(a.tile_counter, 1);
                if (index > work_count())
                    index = work_count();
                if (round >= 2)
                    ring.empty[slot].wait(((round - 2) / 2) & 1);
                ring.index[slot] = static_cast<int>(index);
                ring.full[slot].arrive();
                return index;
            } else {
                ring.full[slot].wait((round / 2) & 1);
                const int index = ring.index[slot];
                if (take)
                    ring.empty[slot].arrive();
                return index;
            }
        }
    };
    // Every role of the CTA walks the same key blocks; f(work, round). On the dynamic schedule
    // two orders keep the ring free of deadlock: the producer publishes a round before it waits
    // (kv_empty) to load that round's K, and only the consumers look a round ahead (outside
    // lag_dq; the dQ warp never does). A kernel of one key block finds it before the roles part:
    // found in each role, the d_head 64 kernels' softcap instances spilled 96 bytes instead of 4
    // (ptxas, CUDA 13.0).
    const Work first = work_of(static_cast<int>(blockIdx.x));
    // Stream-K: a range's pieces one after another in its round, through the one call of f (a
    // second inlined copy of the walk spilled hundreds of bytes and serialized its wgmmas).
    const auto for_each_key_block = [&](auto taker, auto&& f) {
        if constexpr (Tr::persistent) {
            for (int round = 0;; ++round) {
                const std::int64_t index = key_block_index(taker, round, true);
                if (index >= work_count())
                    break;
                if constexpr (streamable) {
                    const bool ranged = split.splits() && index >= split.whole;
                    const int r = static_cast<int>(index - split.whole);
                    const int pieces = ranged ? split.pieces_in(r) : 1;
                    for (int p = 0; p < pieces; ++p) {
                        const Work w = ranged ? piece_of(r, p) : work_of(static_cast<int>(index));
                        if (w.some)
                            f(w, round);
                    }
                } else {
                    const Work w = work_of(static_cast<int>(index));
                    if (w.some)
                        f(w, round);
                }
            }
        } else if (first.some) {
            f(first, 0);
        }
    };

    if (threadIdx.x == 0) {
        smem.kv_full.init(1);
        // One arrival per consumer warp, each after its own wgmma wait.
        smem.kv_empty.init(4 * Tr::consumers);
        for (int s = 0; s < Tr::stages; ++s) {
            smem.q_full[s].init(1);
            smem.d_o_full[s].init(1);
            smem.q_empty[s].init(Tr::stats_in_stages ? Tr::consumers * warpgroup_threads
                                                     : 4 * Tr::consumers);
            smem.d_o_empty[s].init(4 * Tr::consumers);
        }
        if constexpr (Tr::lag_dq) {
            for (int b = 0; b < 2; ++b) {
                smem.ds_barriers.full[b].init(4 * Tr::consumers);
                smem.ds_barriers.empty[b].init(4 * Tr::consumers);
            }
        }
        if constexpr (Tr::dynamic) {
            for (int b = 0; b < 2; ++b) {
                smem.key_blocks.full[b].init(1);
                smem.key_blocks.empty[b].init(Tr::ring_readers);
            }
        }
        tma::fence_barrier_init();
    }
    __syncthreads();
    // The dQ conversion (a programmatic dependent launch) may be scheduled once every CTA has
    // started; it waits for this grid's writes itself.
    ptx::launch_dependents();

    const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / warpgroup_threads, 0);
    if (warpgroup == 0) {
        ptx::setmaxnreg_dec<Tr::producer_registers>();
        const int warp = threadIdx.x / warp_size;
        if (threadIdx.x == 0) {
            int step0 = 0, walks = 0;  // of the CTA's earlier key blocks (walks: with steps)
            for_each_key_block(std::true_type{}, [&](const Work& w, int) {
                produce_backward<Tr>(launch, smem, w.walk, w.seq, w.k0, w.tile.kv_head, step0,
                                     walks);
                step0 += w.walk.steps<Tr::stream_k>();
                walks += w.walk.steps<Tr::stream_k>() > 0;
            });
        } else if (warp == 1) {
            // This kernel may start before the preprocess ends (a programmatic dependent
            // launch): dQ's accumulator (and the ordered semaphores) are the preprocess's to
            // zero first. (The producer's Q, K, V and dO loads read the caller's tensors; its
            // copies of the statistics wait in produce_backward.)
            ptx::wait_for_previous_grid();
            for_each_key_block(std::false_type{}, [&](const Work& w, int) {
                add_dq<Tr>(a, w.mask, smem, w.walk, scheduler, w.seq, w.tile.key_block,
                           w.tile.kv_head);
                // Its last reduce has read the staging. Not after a walk of no steps (no reduce):
                // arrivals for walks the consumers have not synchronised on would complete the
                // barrier's next use early.
                if (Tr::staging_free_wait && w.walk.steps<Tr::stream_k>() > 0) {
                    __syncwarp();
                    ptx::named_barrier_arrive(Tr::staging_free_barrier, Tr::staging_free_threads);
                }
            });
        }
        return;
    }

    ptx::setmaxnreg_inc<Tr::consumer_registers>();
    const int consumer = warpgroup - 1;
    const int consumer_thread = threadIdx.x - warpgroup_threads;
    constexpr int consumer_threads = Tr::consumers * warpgroup_threads;
    ptx::wait_for_previous_grid();  // the preprocess's LSE and D (a programmatic launch)
    // A step's first row in the preprocess's per-row arrays.
    const auto stats_row0 = [&](const Work& w, QueryWalk::Step at) {
        return w.seq.ws(a, w.tile.kv_head * w.walk.group + at.head, at.block * Tr::B_r);
    };
    // A walk's first step's statistics, staged in the copy of its step of the CTA's pipeline: in
    // the walk's prologue, or (persistent) at the end of the walk before it, so that their load
    // runs beside that walk's epilogue instead of after it.
    const auto stage_first_stats = [&](const Work& w, int step) {
        if (Tr::stats_in_stages || w.walk.steps<Tr::stream_k>() == 0)
            return;
        StepStats<Tr> stats;
        stats.load(a, stats_row0(w, w.walk.first<Tr::rotate_walks, Tr::stream_k>()));
        stats.store(smem.stats[step % 2]);
    };
    // The consumers' walks; per_role, compiled for each consumer's role (the gradient it holds,
    // or its width of dQ), so that neither holds the other's accumulators and no wgmma is issued
    // under a branch on the role.
    const auto consume = [&](auto role) {
        using Consumer = BackwardConsumer<Tr, decltype(role)::value>;
        int step0 = 0;          // the walk's first step in the CTA's pipeline
        int staged_round = -1;  // persistent: the round whose first statistics are staged
        for_each_key_block(std::false_type{}, [&](const Work& w, int round) {
            const KeyBlockScheduler::Tile& tile = w.tile;
            const int k0 = w.k0;
            const BackwardSequence& seq = w.seq;
            const QueryWalk& walk = w.walk;
            Consumer c{
                .smem = smem,
                .args = a,
                .smem_base = ptx::smem_address(&smem),
                .consumer = consumer,
                .scale_log2 = a.scale_log2,
                .mask = KeyRowQueries::of(
                    w.mask, k0 + Tr::key_rows_of(consumer) + warp_in_warpgroup() * mma_m),
                .first_key = k0 + Tr::key_rows_of(consumer) + warp_in_warpgroup() * mma_m,
                .dq_row_group = consumer % Tr::dq_row_groups,
                .alibi_shift = band_shift(seq.q_len, seq.k_len, a.top_left),
            };
            if constexpr (Consumer::dk_tiles > 0)
                zero(c.dk);
            if constexpr (Consumer::dv_tiles > 0)
                zero(c.dv);
            if (!Tr::persistent || staged_round != round)
                stage_first_stats(w, step0);
            ptx::named_barrier_sync(Tr::ds_ready_barrier, consumer_threads);
            if constexpr (!Tr::kv_with_first_step)
                smem.kv_full.wait(0);
            if constexpr (packable) {
                // Rows past a packed sequence are another sequence's or nobody's (a buffer's
                // unwritten tail may hold NaN): masking makes their P 0, but 0 · NaN in the GEMMs
                // is NaN, so they are zeros in shared memory before any GEMM reads them, as the
                // forward zeroes V's tail.
                if (a.cu_seqlens_q != nullptr && k0 + Tr::B_c > seq.k_len &&
                    walk.steps<Tr::stream_k>() > 0) {
                    if constexpr (Tr::kv_with_first_step) {
                        const RingSlot<Tr::stages> slot(step0);
                        smem.q_full[slot.stage].wait(slot.parity);    // K, with the first Q
                        smem.d_o_full[slot.stage].wait(slot.parity);  // V, with the first dO
                    }
                    zero_tile_rows<typename Tr::KTile, consumer_threads>(
                        ptx::smem_address(smem.k), seq.k_len - k0, consumer_thread);
                    zero_tile_rows<typename Tr::VTile, consumer_threads>(
                        ptx::smem_address(smem.v), seq.k_len - k0, consumer_thread);
                    tma::fence_shared_to_async_proxy();
                    ptx::named_barrier_sync(Tr::ds_ready_barrier, consumer_threads);
                }
            }
            // A window with a softcap masks every step: with a masked and an unmasked copy of the
            // step the d_head 128 kernel spilled 224 bytes, with one 16 (ptxas, CUDA 13.0). So does
            // ALiBi, whose instances hold one copy of their step too.
            static_assert(!Alibi || packable, "ALiBi runs on the band kernels");
            // Step i of the walk, at `at` (step0 + i of the CTA's pipeline). First (lag_dq, a
            // compile-time flag): the first step, which has no previous step's dQ to compute and
            // runs the masked step (which masks an unmasked block to no effect); it is peeled off
            // the loop: a copy of the step for it inside the loop spilled 104 bytes in d_head 64's
            // softcap kernel (ptxas, CUDA 13.0).
            const auto run_step = [&](int i, QueryWalk::Step at, auto first) {
                constexpr bool First = decltype(first)::value;
                const int block = at.block;
                const int pipeline_step = step0 + i;
                // The next step's rows, whose statistics this step stages; -1 past the walk.
                QueryWalk::Step next = at;
                next.advance<Tr::rotate_walks>(walk);
                const std::int64_t next_row0 =
                    i + 1 < walk.steps<Tr::stream_k>() ? stats_row0(w, next) : -1;
                if constexpr (packable) {
                    // The sequence's last query block: Q's and dO's rows past it zeroed likewise,
                    // once both have landed and before either consumer's first GEMM of the step.
                    if (a.cu_seqlens_q != nullptr && (block + 1) * Tr::B_r > seq.q_len) {
                        const RingSlot<Tr::stages> slot(pipeline_step);
                        smem.q_full[slot.stage].wait(slot.parity);
                        smem.d_o_full[slot.stage].wait(slot.parity);
                        const int valid = seq.q_len - block * Tr::B_r;
                        zero_tile_rows<typename Tr::QTile, consumer_threads>(
                            ptx::smem_address(smem.q[slot.stage]), valid, consumer_thread);
                        zero_tile_rows<typename Tr::DoTile, consumer_threads>(
                            ptx::smem_address(smem.d_o[slot.stage]), valid, consumer_thread);
                        tma::fence_shared_to_async_proxy();
                        ptx::named_barrier_sync(Tr::ds_ready_barrier, consumer_threads);
                    }
                }
                if constexpr (Alibi) {  // the step's head's slope
                    c.template step<true, Softcap, true, !First>(
                        pipeline_step, block * Tr::B_r, next_row0,
                        alibi_slope(a.alibi_slopes, a.alibi_batch_stride, seq.index,
                                    tile.kv_head * walk.group + at.head, a.scale_log2));
                } else if constexpr (First) {
                    c.template step<true, Softcap, false, false>(pipeline_step, block * Tr::B_r,
                                                                 next_row0);
                } else if ((Softcap && std::is_same_v<Mask, BandMask>) ||
                           walk.blocks.masked(block)) {
                    c.template step<true, Softcap>(pipeline_step, block * Tr::B_r, next_row0);
                } else {
                    c.template step<false, Softcap>(pipeline_step, block * Tr::B_r, next_row0);
                }
            };
            QueryWalk::Step at = walk.first<Tr::rotate_walks, Tr::stream_k>();
            if constexpr (Tr::lag_dq) {
                if (walk.steps<Tr::stream_k>() > 0) {
                    run_step(0, at, std::true_type{});
                    at.advance<Tr::rotate_walks>(walk);
                }
                for (int i = 1; i < walk.steps<Tr::stream_k>();
                     ++i, at.advance<Tr::rotate_walks>(walk))
                    run_step(i, at, std::false_type{});
                c.finish_dq(step0 + walk.steps<Tr::stream_k>(), walk.steps<Tr::stream_k>());
            } else {
                for (int i = 0; i < walk.steps<Tr::stream_k>();
                     ++i, at.advance<Tr::rotate_walks>(walk))
                    run_step(i, at, std::false_type{});
            }
            step0 += walk.steps<Tr::stream_k>();
            if constexpr (Tr::persistent) {
                // The next round's first statistics: their copy was last read two steps back (with
                // the statistics in the stages, none to stage and no look ahead to wait for).
                if constexpr (!Tr::stats_in_stages) {
                    if (const std::int64_t index =
                            key_block_index(std::false_type{}, round + 1, false);
                        index < work_count()) {
                        const Work next = work_of(static_cast<int>(index));
                        if (next.some) {
                            stage_first_stats(next, step0);
                            staged_round = round + 1;
                        }
                    }
                }
                // K and V to the producer for the next key block (every GEMM of the walk has been
                // waited for; a walk of no steps read neither: produce_backward), and the dQ
                // warp's last reduce has read the staging.
                if (walk.steps<Tr::stream_k>() > 0) {
                    Consumer::arrive_warp(smem.kv_empty);
                    if constexpr (Tr::staging_free_wait)
                        ptx::named_barrier_sync(Tr::staging_free_barrier, Tr::staging_free_threads);
                }
            }

            // dK = scale · dSᵀ·Q and dV, this warp's 16 rows (split_head: its consumer's columns).
            // The sequence read again rather than held across the loop (registers).
            const BackwardSequence out = packable ? BackwardSequence::of(a, tile.batch)
                                                  : BackwardSequence::dense(a, tile.batch);
            const int col0 = Tr::head_col0(consumer);
            // Through shared memory and TMA: 16-byte swizzled stores that one thread hands to the
            // TMA unit, whose stores drop rows past the view's end. The register path (then 4-byte
            // stores) cost a d_head 128 CTA about 5 µs against its ~90 µs walk at 2k keys (per-CTA
            // timestamps, H200, 2026-12-02); through TMA the backward ran 2-5% faster at 2k and
            // 4.5-10% at 1k (H200, 2026-12-03). The tiles: K's and V's, or (persistent) the walk's
            // scratch, which the next walk reuses only once the stores have read it. A packed
            // sequence's key block that runs past its end would overwrite the next sequence's rows:
            // it stores its rows itself.
            if (!packable || a.cu_seqlens_q == nullptr || k0 + Tr::B_c <= out.k_len) {
                unsigned char* dk_tile = Tr::persistent ? smem.scratch.gradients[0] : smem.k;
                unsigned char* dv_tile = Tr::persistent ? smem.scratch.gradients[1] : smem.v;
                // Every consumer's last GEMMs have read K and V (dQ's reads every key's K) and the
                // dS tiles.
                ptx::named_barrier_sync(Tr::ds_ready_barrier, consumer_threads);
                const int row0 = Tr::key_rows_of(consumer) + warp_in_warpgroup() * mma_m;
                bool store = true;  // stream-K: whether this piece stores the key block's
                if constexpr (streamable) {
                    // A piece of a split key block: its partial into its slot, then counted on
                    // the key block's counter (each thread's stores fenced before the count); the
                    // piece that counts last adds the others' partials as it stages the key
                    // block's dK and dV, and stores them. Every path stages (a partial piece's
                    // staging is not stored): the accumulators are read on every path.
                    const int b = w.split_block;
                    int merged = 0;  // pieces whose partials are added, or 0
                    c.store_partial(a.streamk_partials, b >= 0 ? split.slot(b, w.piece.index) : 0,
                                    b >= 0);
                    if (b >= 0) {
                        __threadfence();
                        ptx::named_barrier_sync(Tr::ds_ready_barrier, consumer_threads);
                        bool last = false;
                        if (consumer_thread == 0) {
                            const cuda::atomic_ref<int, cuda::thread_scope_device> counter(
                                a.streamk_counters[b]);
                            last = counter.fetch_add(1, cuda::memory_order_acq_rel) ==
                                   w.piece.pieces - 1;
                        }
                        __syncwarp();  // bar.red below is .aligned
                        store =
                            ptx::named_barrier_any(Tr::ds_ready_barrier, consumer_threads, last);
                        if (store) {
                            __threadfence();
                            merged = w.piece.pieces;
                        }
                    }
                    const typename Consumer::Merge merge =
                        c.merge_of(a.streamk_partials, split, b, merged, w.piece.index);
                    stage_gradient_rows<Tr::dtype, typename Tr::KTile>(
                        c.dk, a.softmax_scale, ptx::smem_address(dk_tile), row0, col0,
                        [&](int nt) { return merge.sum(nt); });
                    stage_gradient_rows<Tr::dtype, typename Tr::VTile>(
                        c.dv, 1.0f, ptx::smem_address(dv_tile), row0, col0,
                        [&](int nt) { return merge.sum(Consumer::dk_tiles + nt); });
                } else {
                    if constexpr (Consumer::dk_tiles > 0) {
                        stage_gradient_rows<Tr::dtype, typename Tr::KTile>(
                            c.dk, a.softmax_scale, ptx::smem_address(dk_tile), row0, col0);
                    }
                    if constexpr (Consumer::dv_tiles > 0) {
                        stage_gradient_rows<Tr::dtype, typename Tr::VTile>(
                            c.dv, 1.0f, ptx::smem_address(dv_tile), row0, col0);
                    }
                }
                tma::fence_shared_to_async_proxy();
                ptx::named_barrier_sync(Tr::ds_ready_barrier, consumer_threads);
                if (consumer_thread == 0 && store) {
                    tma::store_tile<typename Tr::KTile>(dk_tile, &launch.maps.dk, out.k_row0 + k0,
                                                        tile.kv_head, out.entry);
                    tma::store_tile<typename Tr::VTile>(dv_tile, &launch.maps.dv, out.k_row0 + k0,
                                                        tile.kv_head, out.entry);
                    tma::wait_stores_read();  // before the CTA's shared memory goes or is reused
                }
                if constexpr (Tr::persistent)
                    ptx::named_barrier_sync(Tr::ds_ready_barrier, consumer_threads);
                return;
            }
            const int row0 = k0 + Tr::key_rows_of(consumer) + warp_in_warpgroup() * mma_m;
            if constexpr (Consumer::dk_tiles > 0) {
                store_gradient_rows<Tr::dtype>(
                    c.dk, a.softmax_scale,
                    static_cast<T*>(a.dk) + out.entry * a.dk_stride.batch +
                        tile.kv_head * a.dk_stride.head +
                        std::int64_t{out.k_row0} * a.dk_stride.seq + col0,
                    a.dk_stride.seq, row0, out.k_len);
            }
            if constexpr (Consumer::dv_tiles > 0) {
                store_gradient_rows<Tr::dtype>(
                    c.dv, 1.0f,
                    static_cast<T*>(a.dv) + out.entry * a.dv_stride.batch +
                        tile.kv_head * a.dv_stride.head +
                        std::int64_t{out.k_row0} * a.dv_stride.seq + col0,
                    a.dv_stride.seq, row0, out.k_len);
            }
        });
    };
    if constexpr (Tr::per_role) {
        if (consumer == 0)
            consume(std::integral_constant<int, 0>{});
        else
            consume(std::integral_constant<int, 1>{});
    } else {
        consume(std::integral_constant<int, -1>{});
    }
#else
    // Built for sm_90a only (the family's CMake target); other targets get an empty body.
    (void)launch;
#endif
}

// The dQ conversion's staging: a query block's dQ rows in 16 bits, each row padded by 16 bytes
// so that a warp's fragment stores (8 rows x 4 column pairs) fall in 32 distinct banks at every
// head dim built (a row pitch of 4 or 20 words mod 32).
template <class T, int Rows, int Cols>
struct DqConversionSmem {
    static constexpr int pitch = Cols + 16 / static_cast<int>(sizeof(T));
    alignas(16) T rows[Rows][pitch];
};

// dQ = scale · the accumulator, rounded to 16 bits: one CTA of 128 threads a query block of one
// head. Each thread loads its float4s (two rows' column pairs of the wgmma fragment order) and
// writes them to shared memory as rows; then each thread stores whole 16-byte pieces of rows.
// The fragment's own 4-byte stores wrote 16 bytes of each of 8 rows a warp instruction, two L2
// requests a 32-byte sector: 124-130 µs for 16k tokens at d_head 64 and 128, half of HBM's
// bandwidth, against FA4's 62 µs; staged as here, 65.7 µs (ncu, H100, 2026-12-07).
template <unsigned long long CodeHi, unsigned long long CodeLo>
__global__ void __launch_bounds__(128) backward_dq_kernel(const __grid_constant__ BackwardArgs a) {
    ptx::wait_for_previous_grid();  // the main kernel's reduces (a programmatic launch)
    using Tr = BackwardTraits<unpack(CodeHi, CodeLo)>;
    using T = typename Tr::T;
    using Smem = DqConversionSmem<T, Tr::B_r, Tr::cols>;
    __shared__ Smem smem;
    const int block = blockIdx.x, head = blockIdx.y;
    const BackwardSequence seq = BackwardSequence::of(a, blockIdx.z);
    if (block * Tr::B_r >= seq.q_len)
        return;  // a packed sequence shorter than the grid's
    const float4* acc =
        reinterpret_cast<const float4*>(a.dq_accum + seq.ws(a, head, block * Tr::B_r) * Tr::cols);
    constexpr int part = Tr::dq_part_floats / 4;  // float4s of a 64 x 64 part
    static_assert(Tr::cols == Tr::d_head, "no padding columns in the accumulator");
    constexpr int per_thread = Tr::B_r * Tr::cols / 4 / 128;
    static_assert(per_thread * 4 * 128 == Tr::B_r * Tr::cols, "whole float4s a thread");
    float4 v[per_thread];
#pragma unroll
    for (int j = 0; j < per_thread; ++j)
        v[j] = acc[threadIdx.x + j * 128];
#pragma unroll
    for (int j = 0; j < per_thread; ++j) {
        const int i = threadIdx.x + j * 128;
        const int p = i / part, nt = i % part / warpgroup_threads;
        const int thread = i % warpgroup_threads, lane = thread % warp_size;
        const int row = Tr::dq_part_row(p) + mma_m * (thread / warp_size) + lane / 4;
        const int col = Tr::dq_part_col(p) + 8 * nt + 2 * (lane % 4);
        ptx::st_shared_4(
            ptx::smem_address(&smem.rows[row][col]),
            ptx::pack_rn<Tr::dtype>(v[j].x * a.softmax_scale, v[j].y * a.softmax_scale));
        ptx::st_shared_4(
            ptx::smem_address(&smem.rows[row + 8][col]),
            ptx::pack_rn<Tr::dtype>(v[j].z * a.softmax_scale, v[j].w * a.softmax_scale));
    }
    __syncthreads();
    T* dq = static_cast<T*>(a.dq) + seq.entry * a.dq_stride.batch + head * a.dq_stride.head +
            std::int64_t{seq.q_row0 + block * Tr::B_r} * a.dq_stride.seq;
    constexpr int row_pieces = Tr::cols * static_cast<int>(sizeof(T)) / 16;
    constexpr int pieces = Tr::B_r * row_pieces / 128;
    static_assert(pieces * 128 == Tr::B_r * row_pieces, "whole 16-byte pieces a thread");
    const int rows = seq.q_len - block * Tr::B_r;
#pragma unroll
    for (int j = 0; j < pieces; ++j) {
        const int i = threadIdx.x + j * 128;
        const int row = i / row_pieces, col = i % row_pieces * (16 / static_cast<int>(sizeof(T)));
        if (row < rows) {
            ptx::st_global_16(dq + row * a.dq_stride.seq + col,
                              ptx::ld_shared_16(ptx::smem_address(&smem.rows[row][col])));
        }
    }
}

}  // namespace flash_attention::sm90
