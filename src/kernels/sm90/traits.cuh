#pragma once

// Compile-time expansion of an sm90 KernelConfig: warpgroup roles, shared-memory layout
// of the Q tile and the K/V pipeline stages, barrier ids and register budgets.

#include <cstdint>
#include <type_traits>

#include "config/config_code.hpp"
#include "config/config_space.hpp"
#include "config/resources.hpp"
#include "flash_attention/kernel_config.hpp"
#include "kernels/primitives/element.cuh"
#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/online_softmax.cuh"
#include "kernels/primitives/sm90/swizzled_tile.cuh"
#include "kernels/primitives/sm90/tma.cuh"

namespace flash_attention::sm90 {

// The named barriers (bar.sync ids) of a consumer warpgroup, one of each per consumer.
enum class NamedBarrier {
    gemm_turn,  // ping-pong: the right to issue GEMMs passes from consumer to consumer
    epilogue,   // a consumer's 128 threads have staged O before one of them stores it
    vote,       // lazy: whether every row of a consumer kept its reference (bar.red)
};

// transpose_v: per stage, "full" when V's block has landed in the staging tile (TMA) and
// "empty" when the transposers have read it, and `end`: the ring position whose arrival on the
// stage's full barrier brings no block, the producer's last (~0u until then, which no position
// reaches). The producer writes it after waiting for the stage's empty barrier (every transposer
// has read the word for the position before) and before that arrival, whose release the
// transposers' wait acquires: the word's accesses are ordered by the barriers. (One count for
// every stage, read at each position, would be read while the producer writes it: racecheck
// reported that race, H100, 2026-12-06.) A word a stage, padded to 8 bytes.
template <int Stages>
struct VStagingBarriers {
    tma::Barrier full[Stages], empty[Stages];
    struct End {
        std::uint32_t ring;
        std::uint32_t unused;
    } end[Stages];
};

template <KernelConfig C>
struct Traits {
    static_assert(unpack(pack(C)) == C, "every field fits the packed kernel parameter");
    static_assert(C.family == Family::sm90, "an sm90 config");
    using T = typename Element<C.dtype>::type;
    static constexpr DType dtype = C.dtype;
    // FP8 (e4m3) attention: Q, K and V in 8 bits, O in bf16. Its tiles are SwizzledTile's 16-bit
    // columns holding pairs of e4m3 values (TMA moves bytes): Q's and K's rows d_head bytes, whose
    // 32-byte k-steps are 8-bit wgmma's; V's transposed copy (fp8/v_transpose.hpp) in rows of
    // B_c keys, one row a column of V, since 8-bit wgmma reads its B operand K-major only.
    static constexpr bool fp8 = dtype == DType::E4M3;
    static constexpr DType out_dtype = fp8 ? DType::BF16 : dtype;
    using OutT = typename Element<out_dtype>::type;
    static constexpr int d_head = C.d_head;     // Q's and K's columns
    static constexpr int d_v = C.v_head_dim();  // V's and O's
    // The tiles' columns: whole sub-tiles of their swizzle (tile_swizzle_bytes(): 64
    // columns, or 32 at d_head 96, whose tiles then hold no padding); FP8's pairs of values, so
    // that FP8 at d_head 64 (rows of 64 bytes) takes the 64-byte swizzle too.
    static constexpr int q_cols = fp8 ? d_head / 2 : tile_columns(d_head);
    static constexpr int o_cols = tile_columns(d_v);
    static constexpr int qk_swizzle = tile_swizzle_bytes(fp8 ? d_head / 2 : d_head);
    static constexpr int o_swizzle = tile_swizzle_bytes(d_v);
    static constexpr int B_r = C.B_r;
    static constexpr int B_c = C.B_c;
    static constexpr int stages = C.sm90.stages;
    static constexpr int threads = C.n_threads();
    static constexpr bool q_in_registers = C.sm90.q_in_registers;
    // Rows are (position, head) pairs of one K/V head's query heads (Tile; the per-sequence
    // body only).
    static constexpr bool pack_gqa = C.sm90.pack_gqa;
    static constexpr RowReference row_reference =
        C.sm90.lazy_rescale ? RowReference::lazy : RowReference::max;

    // Warpgroup 0 produces (one thread issues every TMA copy); warpgroups 1..consumers
    // each compute 64 query rows.
    static constexpr int consumers = flash_attention::consumer_warpgroups(C);
    static constexpr int rows_per_consumer = 64;  // a wgmma's M
    // setmaxnreg: the producer needs few registers; what it gives up lets each consumer
    // hold O, S and P. The registers are the CTA's own, as launched (64K / threads a
    // thread, in steps of 8), not the SM's: two consumers launch with 384 x 168, and
    // 24 + 2 x 240 fills that exactly (a producer of 32 left the consumers'
    // setmaxnreg.inc waiting forever); three launch with 512 x 128, which 32 + 3 x 160
    // fills. At 24 the three-consumer producer spilled once tiles carried a sequence's
    // offsets; the two-consumer ones spill only in their paged instantiation (12-16
    // bytes, off the consumers' path).
    static constexpr int producer_registers = consumers >= 3 ? 32 : 24;
    static constexpr int consumer_registers = flash_attention::consumer_registers(C);
    // A launch gets at most 64K / threads registers a thread, in steps of 8.
    static constexpr int launch_registers = 65536 / threads / 8 * 8;
    static_assert(producer_registers + consumers * consumer_registers <=
                      launch_registers * (1 + consumers),
                  "the CTA's registers hold every warpgroup's budget");

    // One consumer's Q and its O (staged in Q's region unless apart: d_v <= d_head), and one
    // K and one V block, in TMA's swizzled layout.
    using QTile = SwizzledTile<rows_per_consumer, q_cols, qk_swizzle>;
    using OTile = SwizzledTile<rows_per_consumer, o_cols, o_swizzle>;
    using KTile = SwizzledTile<B_c, q_cols, qk_swizzle>;
    using VTile = std::conditional_t<fp8, SwizzledTile<d_v, B_c / 2, 128>,
                                     SwizzledTile<B_c, o_cols, o_swizzle>>;
    // P's A fragments over `tiles` of S's n8 tiles: k-steps of 16 keys, or 8-bit wgmma's 32.
    static constexpr int p_steps_of(int tiles) { return tiles * 8 / (fp8 ? 32 : 16); }
    static constexpr int p_steps = p_steps_of(B_c / 8);
    // FP8: P·V_j in parts of O's columns, each into a block accumulator of its own
    // (Consumer::pv_block) that is added to O in fp32 once retired. d_v 128 in one part (64
    // registers); at d_v 256 one block's accumulator (128) beside O (128) would not fit 240,
    // so four parts of 64 columns take turns in two accumulators (64 registers), each
    // part's GEMM running while the one before it is added.
    static constexpr int pv_parts = fp8 && o_cols > 128 ? 4 : 1;
    static constexpr int pv_buffers = pv_parts > 1 ? 2 : 1;
    static constexpr int pv_cols = o_cols / pv_parts;
    static_assert(o_cols % pv_parts == 0 && pv_cols % 8 == 0 && pv_buffers <= pv_parts,
                  "whole parts, each starting on V's transposed copy's 8-row swizzle period");
    // A paged cache's K or V block: the same bytes, 8-row groups outermost, so that each run
    // of a page's rows is one TMA copy of all of a head's columns instead of one a sub-tile
    // (16-row pages at d_head 128: 5 copies a block of 80 keys instead of 10; chunked
    // prefill ran 9-11% behind the contiguous cache with 10, docs/PERF.md 2026-11-26).
    using PagedKTile = SwizzledTile<B_c, q_cols, qk_swizzle, true>;
    using PagedVTile = SwizzledTile<B_c, o_cols, o_swizzle, true>;

    // Layout from a 1024-byte-aligned base (the swizzle's period): Q buffers (one region
    // per consumer in each, reused for its O unless O is staged apart), K stages, V stages,
    // O's region (apart), then the barriers.
    static constexpr int q_buffers = flash_attention::q_buffers(C);
    // O staged apart (o_staged_apart()): each consumer warp hands Q's one buffer back once
    // its last S GEMM has read it (Consumer::release_q()), and the consumers stage their O
    // in turn in a region after the V stages, whose barrier (o_empty) completes a phase per
    // store that has read it.
    static constexpr bool o_apart = flash_attention::o_staged_apart(C);
    // FP8's bf16 O is twice its Q rows' bytes: stored from the registers (epilogue.cuh).
    static_assert(!(fp8 && o_apart), "FP8 stages no O (o_staged_apart())");
    static_assert(o_apart || fp8 || OTile::bytes <= QTile::bytes, "O is staged where Q was");
    // Q's full/empty pairs (q_barrier_pairs()): one per buffer, or with one buffer in a
    // persistent CTA one per consumer, each guarding that consumer's rows (q_pair()).
    static constexpr int q_pairs = flash_attention::q_barrier_pairs(C);
    static constexpr bool q_split = q_pairs != q_buffers;
    static constexpr int consumers_per_q_pair = q_split ? 1 : consumers;
    static constexpr int q_pair_bytes = consumers_per_q_pair * QTile::bytes;
    // The pair of consumer w's rows in Q buffer b (split only with one buffer: b is 0).
    __device__ static constexpr int q_pair(int b, int w) { return q_split ? w : b; }
    // q_empty's arrivals a tile: each of its consumers' warps (O apart) or each of its
    // consumers' storing thread (after its O store has read the rows).
    static constexpr int q_empty_arrivals = (o_apart ? 4 : 1) * consumers_per_q_pair;
    static constexpr int q_offset = 0;
    static constexpr int q_buffer_bytes = consumers * QTile::bytes;
    static constexpr int k_offset = q_offset + q_buffers * q_buffer_bytes;
    static constexpr int v_offset = k_offset + stages * KTile::bytes;
    // FP8 with transpose_v: each stage's V block as TMA lands it (keys by columns, as K's),
    // which the producer warpgroup's transposers turn into the stage's VTile.
    static constexpr bool transpose_v = C.sm90.transpose_v;
    static_assert(!transpose_v || fp8, "V is transposed for 8-bit P·V only");
    using VStagingTile =
        SwizzledTile<B_c, fp8 ? d_v / 2 : 64,
                     fp8 ? tile_swizzle_bytes(d_v / 2) : 128>;  // (named for every config)
    static constexpr int v_staging_offset = v_offset + stages * VTile::bytes;
    // The producer warpgroup's warps after the first, which transpose (mainloop.cuh).
    static constexpr int transposer_threads = transpose_v ? warpgroup_threads - warp_size : 0;
    static_assert(!transpose_v || v_staging_offset % 1024 == 0, "staging at the swizzle's period");
    static constexpr int o_offset =  // O apart: its region
        v_staging_offset + (transpose_v ? stages * VStagingTile::bytes : 0);
    // P through shared memory (p_in_smem): each consumer's P tile, 64 rows x B_c keys in
    // 64-key sub-tiles, K-major (the A of P·V). With it P's registers are free while S_{j+1}
    // and P_j·V_j run together (intra-warpgroup overlap), which at 192 rows otherwise spilled
    // (d_head 96, ptxas 13.0).
    static constexpr bool p_in_smem = C.sm90.p_in_smem;
    // (Of 64 columns where unused: the type is named below for every config, and B_c 80, 112
    // and 176 are no whole 64-column sub-tiles.)
    using PTile = SwizzledTile<rows_per_consumer, p_in_smem ? B_c : 64, 128>;
    static constexpr int p_offset = o_offset + (o_apart ? OTile::bytes : 0);
    static_assert(!p_in_smem || p_offset % 1024 == 0, "P's tiles at the swizzle's period");
    static constexpr int barrier_offset = p_offset + (p_in_smem ? consumers * PTile::bytes : 0);
    static constexpr bool dynamic_schedule = C.sm90.dynamic_schedule;
    // The static schedule's last round split along the keys (tile_scheduler.cuh), in the
    // dense kernel's non-causal launches (launch.cuh).
    static constexpr bool stream_k = C.sm90.stream_k;
    static constexpr bool trim_blocks = C.sm90.trim_blocks;
    static constexpr bool half_blocks = C.sm90.half_blocks;
    // Dense tile numbers decoded through the launch's divisors (tile_at()): +1.4-2.9% at
    // 512-1k keys, where a tile is a few blocks (H100, docs/PERF.md, 2026-11-28). Not where
    // ptxas (CUDA 13.0) then scheduled the main loop slower, at long lengths where the decode is
    // one tile in 100 blocks or more: d_head 128's B_c 80 tiles (-12% at 16k keys) and d_head
    // 64's statically scheduled tile (-0.6% and -2.7% at 16k in two calls). Those keep the
    // divisions, and their SASS as measured.
    static constexpr bool fast_tile_decode =
        !(d_head == 128 && B_c == 80) && !(d_head == 64 && !dynamic_schedule);
    // With the dynamic schedule, per Q buffer the index of the tile it holds and a barrier
    // (TileSlots: the producer takes the index from the global counter, the consumers
    // read it there).
    static constexpr int tile_slot_offset = barrier_offset + 8 * (2 * q_pairs + 4 * stages);
    static constexpr int o_barrier_offset =
        tile_slot_offset + (dynamic_schedule ? 16 * q_buffers : 0);
    // transpose_v: the staging tiles' barriers (VStagingBarriers).
    static constexpr int v_staging_barrier_offset = o_barrier_offset + (o_apart ? 8 : 0);
    static constexpr int smem_bytes =
        1024 + v_staging_barrier_offset +
        (transpose_v ? static_cast<int>(sizeof(VStagingBarriers<stages>)) : 0);
    static_assert(smem_bytes == static_cast<int>(flash_attention::smem_bytes(C)),
                  "smem_bytes(C) matches the layout");
    static_assert(sizeof(tma::Barrier) == 8, "an mbarrier is 8 bytes");

    // Hardware id of a consumer's named barrier: 0 is __syncthreads, then the GEMM turns,
    // then the epilogues.
    static constexpr int barrier_id(NamedBarrier barrier, int consumer) {
        return 1 + static_cast<int>(barrier) * consumers + consumer;
    }
    static_assert(barrier_id(NamedBarrier::vote, consumers - 1) < 16, "16 named barriers per CTA");

    static_assert(d_head % 16 == 0 && space::is_wgmma_n(B_c), "wgmma shapes instantiated");
    static_assert(B_r == consumers * rows_per_consumer, "64 query rows per consumer");
};

// The pipeline's mbarriers: a full/empty pair per Q buffer or per consumer's rows of it
// (Traits::q_pair(); one use per tile) and per stage for K and for V. "full": the producer's
// TMA copies landed; "empty": every consumer is done with the buffer (for Q: its O, staged
// there, has been stored).
template <int QPairs, int Stages>
struct Barriers {
    tma::Barrier q_full[QPairs], q_empty[QPairs];
    tma::Barrier k_full[Stages], k_empty[Stages];
    tma::Barrier v_full[Stages], v_empty[Stages];
};

}  // namespace flash_attention::sm90
