#pragma once

// The serving kernel: attention for varlen batches, paged KV caches and decoding, on the
// sm80 tile primitives (mma.sync, ldmatrix, cp.async; any GPU from sm_80).
//
// One CTA computes one query tile of one (sequence, K/V head) over one range of its key
// blocks. PackGQA: the tile's rows are the (query position, query head) pairs of the
// heads that share the K/V head, position-major, so a decode step's 4-8 query heads fill
// one m16 tile instead of 4-8 tiles of one useful row each, and each K/V byte is read
// once for all of them. Split-KV: with few such tiles (decoding), the key blocks are
// divided into `splits` ranges computed by different CTAs; each writes its normalised
// partial O and its LSE in fp32, and combine_kernel merges them. Key warps (decoding
// batches that fill the GPU with their rows): one CTA takes all of a row's ranges, four or
// eight warps (split_kv_key_warps) each streaming a group of them from its own stages, and
// merges the groups itself, in the order combine_kernel merges them. Every row and key is
// addressed through a row source (dense, packed or paged), so the main loop is the same for
// all layouts. FP8 (E4M3) caches and queries stream as bytes and are converted exactly to
// fp16 on their way into the MMAs (e4m3_operands.cuh): a decode step reads half a 16-bit
// cache's bytes; the descales join the softmax's scale (q's and k's) and O (v's), whose
// output is BF16.

#include <cstdint>
#include <type_traits>

#include "kernels/fp8.hpp"
#include "kernels/primitives/element.cuh"
#include "kernels/primitives/epilogue.cuh"
#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/masking.cuh"
#include "kernels/primitives/online_softmax.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/range_fold.cuh"
#include "kernels/primitives/sequences.cuh"
#include "kernels/primitives/sm80/e4m3_operands.cuh"
#include "kernels/primitives/sm80/gm2sm.cuh"
#include "kernels/primitives/sm80/warp_gemm.cuh"
#include "kernels/primitives/smem_tile.cuh"
#include "kernels/serving/split_kv_args.hpp"

namespace flash_attention::serving {

template <DType Dt, int D, int Warps, int Stages, int KeyWarps = 1>
struct SplitKvTraits {
    static_assert(KeyWarps == 1 || Warps == 1, "key warps stream one-warp tiles");
    // FP8: e4m3 bytes in memory and shared memory, fp16 in the MMAs, a BF16 output.
    static constexpr bool fp8 = Dt == DType::E4M3;
    static constexpr DType mma_dtype = fp8 ? DType::FP16 : Dt;
    static constexpr DType out_dtype = fp8 ? DType::BF16 : Dt;
    using T = typename Element<Dt>::type;
    using OutT = typename Element<out_dtype>::type;
    // The threads of one stream of key blocks (its copies and its barrier): the CTA's, or
    // one key warp's.
    static constexpr int stream_threads = Warps * warp_size;
    static constexpr int threads = KeyWarps * stream_threads;
    // One m16 tile per warp: a decode step has group (1-16) rows per K/V head, and a
    // 16-row tile wastes the least of the MMA on them; longer query tiles use 4 warps.
    static constexpr int B_r = Warps * mma_m;
    static constexpr int B_c = split_kv_block_keys(D, Warps);

    static constexpr int qk_k_tiles = D / 16;
    static constexpr int qk_n_tiles = B_c / 8;
    static constexpr int pv_k_tiles = B_c / 16;
    static constexpr int pv_n_tiles = D / 8;
    // Whether a CTA that streams several ranges folds them in registers (a second O, 64
    // fp32 a thread at d_head 128). Not at d_head 256 (128 more: 800-940 bytes of spills),
    // nor in one-warp tiles without key warps, which stream one range a CTA (launch_split).
    static constexpr bool folds_ranges = (Warps > 1 || KeyWarps > 1) && D <= 128;
    // Q's fragments for the whole block stay in registers (16 a thread at d_head 64, 32 at
    // 128), except where the fold needs the room: four-warp d_head 128 reads them from shared
    // memory two k-tiles at a time (255 registers and 32-52 bytes of spills with Q held,
    // 234-246 and none without), as d_head 256 always does. (Four-warp d_head 64 without Q
    // held spilled 24-28 bytes: ptxas stopped at 168 registers.) FP8's four-warp d_head 64
    // kernels, whose e4m3 conversions take registers too, spilled 36 bytes with Q held (paged,
    // CUDA 13.0): they read it from shared memory.
    static constexpr bool q_in_registers =
        fp8 && D <= 64 ? Warps == 1 : D <= 64 || (D <= 128 && !folds_ranges);
    static constexpr int qk_step = q_in_registers ? qk_k_tiles : 2;

    // Stages of K and V: blocks j+1 .. j+stages-1 load while block j computes, so a CTA
    // always has blocks in flight (a single buffer left each CTA idle for a load's latency
    // twice a block). The launch picks the count (split_kv_stages).
    static constexpr int stages = Stages;
    // Tiles of 16-bit columns: an e4m3 row's D bytes are D / 2 of them.
    static constexpr int tile_cols = fp8 ? D / 2 : D;
    using QTile = SmemTile<B_r, tile_cols, true>;  // also stages a 16-bit O at the end
    using KTile = SmemTile<B_c, tile_cols, true>;
    using VTile = SmemTile<B_c, tile_cols, true>;
    // The operands' fragments from those tiles (warp_gemm's sources).
    using QSource = std::conditional_t<fp8, E4m3SmemA<QTile, 1>, SmemA<QTile, 1>>;
    using KSource =
        std::conditional_t<fp8, E4m3SmemB<KTile, qk_n_tiles>, SmemB<KTile, qk_n_tiles, false>>;
    using VSource =
        std::conditional_t<fp8, E4m3SmemValues<VTile, pv_n_tiles>, SmemB<VTile, pv_n_tiles, true>>;
    // Q (shared by the key warps), then each stream's K stages and V stages.
    static constexpr int stream_bytes = stages * (KTile::bytes + VTile::bytes);
    static constexpr int q_smem_offset = 0;
    static constexpr int k_smem_offset = QTile::bytes;  // + key warp x stream_bytes
    static constexpr int v_smem_offset = QTile::bytes + stages * KTile::bytes;
    static constexpr int smem_bytes = QTile::bytes + KeyWarps * stream_bytes;

    // Every thread of a stream has finished with a stage before it is refilled, and sees
    // the stage's copies once they have landed: the CTA's barrier, or a key warp's own.
    __device__ __forceinline__ static void sync_stream() {
        if constexpr (KeyWarps > 1)
            __syncwarp();
        else
            __syncthreads();
    }
};

// Sequence b's queries and keys (primitives/sequences.cuh).
__device__ __forceinline__ Span query_span(const SplitKvArgs& a, int b) {
    return sequence_span(a.cu_seqlens_q, nullptr, 0, b, a.view_seq_q);
}

template <bool Paged>
__device__ __forceinline__ Span key_span(const KeySource& ks, int b) {
    return sequence_span(ks.cu_seqlens, ks.seqlens, ks.seqlens_add, b, ks.seq,
                         Paged ? ks.max_pages * ks.seq : 0);
}

// Where the 16-row groups of a K/V block start in the K/V view: entry (page, or batch
// entry) and row, entry -1 for a group that reads as zeros (past the sequence's end, or a
// page id outside the cache). Looked up a block ahead of the copy that uses it, so a paged
// cache's table read is off the load path.
template <int Groups>
struct BlockRows {
    int entry[Groups];
    int row[Groups];
    // Every group's rows lie in the cache (none past the sequence's end or a bad page id).
    __device__ __forceinline__ bool all_in_cache() const {
        bool all = true;
#pragma unroll
        for (int g = 0; g < Groups; ++g)
            all = all && entry[g] >= 0;
        return all;
    }
};

template <bool Paged, int BlockKeys>
__device__ __forceinline__ BlockRows<BlockKeys / 16> block_rows(const KeySource& ks, int b,
                                                                const Span& span, int block) {
    BlockRows<BlockKeys / 16> rows;
#pragma unroll
    for (int g = 0; g < BlockKeys / 16; ++g) {
        const int key0 = block * BlockKeys + 16 * g;
        rows.entry[g] = span.entry;
        rows.row[g] = span.row0 + key0;
        if (key0 >= span.len) {
            rows.entry[g] = -1;  // no page table entry is read past the end
        } else if constexpr (Paged) {
            const int page = ks.block_table[b * ks.block_table_stride + key0 / ks.seq];
            rows.entry[g] = page < 0 || page >= ks.view_batch ? -1 : page;
            rows.row[g] = key0 % ks.seq;
        }
    }
    return rows;
}

template <DType Dt, int D, int Warps, int Stages, bool Paged, int KeyWarps>
__device__ __forceinline__ void split_kv_tile(const SplitKvArgs& args) {
    using Tr = SplitKvTraits<Dt, D, Warps, Stages, KeyWarps>;
    using T = typename Tr::T;
    using OutT = typename Tr::OutT;
    using KCopy = RowGatherCopyGM2SM<typename Tr::KTile, Tr::stream_threads, Tr::threads>;
    using VCopy = RowGatherCopyGM2SM<typename Tr::VTile, Tr::stream_threads, Tr::threads>;
    using QCopy = RowGatherCopyGM2SM<typename Tr::QTile, Tr::threads>;

    // The combine (a programmatic dependent launch) may be scheduled once every CTA has
    // started: it waits for this grid's writes itself (wait_for_previous_grid).
    ptx::launch_dependents();
    extern __shared__ __align__(128) unsigned char smem[];
    // This thread's stream of key blocks: key warp w's stages are its own.
    const int key_warp = KeyWarps > 1 ? static_cast<int>(threadIdx.x / Tr::stream_threads) : 0;
    const std::uint32_t stream_smem = ptx::smem_address(smem) + key_warp * Tr::stream_bytes;
    const std::uint32_t q_smem = ptx::smem_address(smem) + Tr::q_smem_offset;
    const std::uint32_t k_smem = stream_smem + Tr::k_smem_offset;
    const std::uint32_t v_smem = stream_smem + Tr::v_smem_offset;

    // The tile: (query tile, group of key splits, K/V head) x sequence, the K/V head
    // fastest. A row of the cache holds every K/V head's keys side by side (heads_kv x 256
    // bytes at d_head 128), so the CTAs of one key range, launched together, read whole
    // DRAM rows between them rather than one head's 256 bytes of each.
    const int b = blockIdx.y;
    const int kv_head = blockIdx.x % args.heads_kv;
    const int split_groups = (args.splits + args.splits_per_cta - 1) / args.splits_per_cta;
    // With key warps the CTA takes all of the row's ranges (splits_per_cta = splits), warp
    // w those of its group w.
    const int first_split = KeyWarps > 1
                                ? min(args.splits, key_warp * args.ranges_per_group)
                                : (blockIdx.x / args.heads_kv) % split_groups * args.splits_per_cta;
    const int end_split = min(
        args.splits, first_split + (KeyWarps > 1 ? args.ranges_per_group : args.splits_per_cta));
    const int group = args.heads / args.heads_kv;
    const Span qs = query_span(args, b);
    const int row0 = (blockIdx.x / args.heads_kv / split_groups) * Tr::B_r;  // packed rows
    if (row0 >= qs.len * group)
        return;  // a shorter sequence than the grid's longest: the whole CTA leaves
    const int tile_rows = min(Tr::B_r, qs.len * group - row0);
    const auto position = [&](int r) { return (row0 + r) / group; };
    const auto head_of = [&](int r) { return kv_head * group + (row0 + r) % group; };

    const KeySource& ks = args.keys;
    const Span kspan = key_span<Paged>(ks, b);
    const int pos0 = position(0);
    // The query length the causal diagonal is aligned to (masking.cuh).
    const int diagonal = diagonal_queries(qs.len, kspan.len, args.top_left);
    const KeyBlocks blocks = key_blocks(diagonal, kspan.len, args.causal, pos0,
                                        position(tile_rows - 1) - pos0 + 1, Tr::B_c);
    // This CTA's blocks: its ranges', streamed as one. Ranges have a length fixed per call,
    // not per batch, so a row's split depends on its own keys only; the ranges past a short
    // sequence's end are empty and still write their partial result (O = 0, LSE -inf).
    const auto range_start = [&](int split) {
        return min(blocks.visited, split * args.blocks_per_split);
    };
    const int first_block = range_start(first_split);
    const int end_block = range_start(end_split);

    const T* q_base = static_cast<const T*>(args.q);
    const auto q_row = [&](int r) -> const T* {
        if (r >= tile_rows)
            return nullptr;
        return q_base + std::int64_t{qs.entry} * args.q_stride.batch +
               std::int64_t{qs.row0 + position(r)} * args.q_stride.seq +
               std::int64_t{head_of(r)} * args.q_stride.head;
    };
    // K and V read by this CTA alone (one query tile per K/V head) stream past L2 as the
    // first lines to evict, so that the partial results the combine reads next stay there.
    const std::uint64_t kv_l2 = ptx::l2_policy(args.kv_read_once);
    // Block j's K and V into stage (j - first_block) % stages, as one cp.async group.
    using Rows = BlockRows<Tr::B_c / 16>;
    const auto copy_kv = [&](int j, const Rows& rows) {
        const std::uint32_t stage = (j - first_block) % Tr::stages;
        const int valid = min(Tr::B_c, kspan.len - j * Tr::B_c);
        const auto group_of = [&](const void* base, const TensorStrides& stride) {
            return [&, base](int g) -> const T* {
                if (rows.entry[g] < 0)
                    return nullptr;
                return static_cast<const T*>(base) + std::int64_t{rows.entry[g]} * stride.batch +
                       std::int64_t{rows.row[g]} * stride.seq + std::int64_t{kv_head} * stride.head;
            };
        };
        if constexpr (!Paged) {
            // A whole block of a contiguous cache: its rows one stride apart, no predicates
            // (the gather below spent most of the decode loop's instructions; ncu).
            if (valid == Tr::B_c && rows.entry[0] >= 0) {
                KCopy::copy_strided(k_smem + stage * Tr::KTile::bytes,
                                    group_of(ks.k, ks.k_stride)(0), ks.k_stride.seq, kv_l2);
                VCopy::copy_strided(v_smem + stage * Tr::VTile::bytes,
                                    group_of(ks.v, ks.v_stride)(0), ks.v_stride.seq, kv_l2);
                return;
            }
        } else {
            // A whole block whose pages all lie in the cache: each page's rows without
            // predicates.
            if (valid == Tr::B_c && rows.all_in_cache()) {
                KCopy::copy_whole_groups(k_smem + stage * Tr::KTile::bytes,
                                         group_of(ks.k, ks.k_stride), ks.k_stride.seq, kv_l2);
                VCopy::copy_whole_groups(v_smem + stage * Tr::VTile::bytes,
                                         group_of(ks.v, ks.v_stride), ks.v_stride.seq, kv_l2);
                return;
            }
        }
        KCopy::copy_groups(k_smem + stage * Tr::KTile::bytes, group_of(ks.k, ks.k_stride),
                           ks.k_stride.seq, valid, static_cast<const T*>(ks.k), kv_l2);
        VCopy::copy_groups(v_smem + stage * Tr::VTile::bytes, group_of(ks.v, ks.v_stride),
                           ks.v_stride.seq, valid, static_cast<const T*>(ks.v), kv_l2);
    };
    const auto rows_of = [&](int j) { return block_rows<Paged, Tr::B_c>(ks, b, kspan, j); };

    // Groups: Q with the first block, then one per further stage (any may be empty; empty
    // groups keep the count that cp.async.wait_group relies on).
    QCopy::copy(q_smem, q_row, q_base);
#pragma unroll
    for (int i = 0; i < Tr::stages; ++i) {
        if (first_block + i < end_block)
            copy_kv(first_block + i, rows_of(first_block + i));
        ptx::cp_async_commit_group();
    }
    // Q and the first block; the key warps read the Q that all of them copied.
    ptx::cp_async_wait_group<Tr::stages - 1>();
    __syncthreads();

    const int warp_row0 = KeyWarps > 1 ? 0 : static_cast<int>(threadIdx.x / warp_size) * mma_m;
    const typename Tr::QSource q_in_smem(q_smem, warp_row0);
    typename Tr::QSource::template Frags<Tr::qk_k_tiles> q_held;
    if constexpr (Tr::q_in_registers)
        q_in_smem.load(q_held, 0);
    const auto q_frags = [&] {
        if constexpr (Tr::q_in_registers) {
            return RegisterA<1, Tr::qk_k_tiles>{q_held.r};
        } else {
            return q_in_smem;
        }
    }();

    float o[1][Tr::pv_n_tiles][4];
    // Packed row r sees the keys its query position sees.
    const auto visible_keys = [&](int r) {
        return keys_seen(position(r), diagonal, kspan.len, args.causal);
    };
    const int lane = threadIdx.x % warp_size;
    // Packed row r's attention sink (natural log units), -inf without.
    const auto sink_of = [&](int r) {
        return args.sinks != nullptr ? __ldg(args.sinks + head_of(r)) : -INFINITY;
    };
    // The global token of packed row r: numbers the partial results and the LSE.
    const auto token = [&](int r) {
        return std::int64_t{qs.entry} * args.view_seq_q + qs.row0 + position(r);
    };

    // The row's final O (16-bit: through Q's tile, this warp's own rows, which no other warp
    // reads; FP8's BF16 O from registers) and LSE, for the rows of this thread's two row halves:
    // the tile's keys in one range, or all its ranges folded here.
    const auto store_output = [&](const float(&out)[1][Tr::pv_n_tiles][4], const float(&lse)[2]) {
        if (args.lse != nullptr && lane % 4 == 0) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = warp_row0 + lane / 4 + 8 * h;
                if (r < tile_rows) {
                    args.lse[(std::int64_t{qs.entry} * args.heads + head_of(r)) * args.view_seq_q +
                             qs.row0 + position(r)] = lse[h];
                }
            }
        }
        if constexpr (Tr::fp8) {
            // Straight from the accumulators: a lane's run of eight consecutive columns of
            // each 32 (e4m3_output_run), 16 bytes of BF16, for each of its two rows.
            OutT* o_base = static_cast<OutT*>(args.o);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = warp_row0 + lane / 4 + 8 * h;
                if (r >= tile_rows)
                    continue;
                OutT* row = o_base + std::int64_t{qs.entry} * args.o_stride.batch +
                            std::int64_t{qs.row0 + position(r)} * args.o_stride.seq +
                            std::int64_t{head_of(r)} * args.o_stride.head + 8 * (lane % 4);
#pragma unroll
                for (int m = 0; m < Tr::pv_n_tiles / 4; ++m) {
                    float run[8];
                    e4m3_output_run(out[0], m, h, run);
                    ptx::st_global_16(row + 32 * m, {ptx::pack_rn<Tr::out_dtype>(run[0], run[1]),
                                                     ptx::pack_rn<Tr::out_dtype>(run[2], run[3]),
                                                     ptx::pack_rn<Tr::out_dtype>(run[4], run[5]),
                                                     ptx::pack_rn<Tr::out_dtype>(run[6], run[7])});
                }
            }
        } else {
            __syncwarp();
            store_accumulators_RF2SM<Dt, typename Tr::QTile>(out, q_smem, warp_row0);
            __syncwarp();
            T* o_base = static_cast<T*>(args.o);
            copy_rows_SM2GM<typename Tr::QTile, mma_m>(
                q_smem, warp_row0,
                [&](int r) {
                    return o_base + std::int64_t{qs.entry} * args.o_stride.batch +
                           std::int64_t{qs.row0 + position(warp_row0 + r)} * args.o_stride.seq +
                           std::int64_t{head_of(warp_row0 + r)} * args.o_stride.head;
                },
                tile_rows - warp_row0);
        }
    };
    // fp32 partial O straight from the accumulators (each quad writes whole 32-byte
    // sectors) and a per-row value (the range's LSE, or a fold's max) into slot `split`;
    // combine_kernel merges the slots.
    const auto store_partial = [&](const float(&out)[1][Tr::pv_n_tiles][4], const float(&lse)[2],
                                   int split) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp_row0 + lane / 4 + 8 * h;
            if (r >= tile_rows)
                continue;
            const std::int64_t row = split * args.partial_rows + token(r) * args.heads + head_of(r);
            if constexpr (Tr::fp8) {
                float* dst = args.o_partial + row * D + 8 * (lane % 4);
#pragma unroll
                for (int m = 0; m < Tr::pv_n_tiles / 4; ++m) {
                    float run[8];
                    e4m3_output_run(out[0], m, h, run);
                    *reinterpret_cast<float4*>(dst + 32 * m) = {run[0], run[1], run[2], run[3]};
                    *reinterpret_cast<float4*>(dst + 32 * m + 4) = {run[4], run[5], run[6], run[7]};
                }
            } else {
                float* dst = args.o_partial + row * D + 2 * (lane % 4);
#pragma unroll
                for (int nt = 0; nt < Tr::pv_n_tiles; ++nt)
                    *reinterpret_cast<float2*>(dst + nt * 8) = {out[0][nt][2 * h],
                                                                out[0][nt][2 * h + 1]};
            }
            if (lane % 4 == 0)
                args.lse_partial[row] = lse[h];
        }
    };

    // A CTA that streams a row's first ranges folds them (RangeFold) instead of writing each:
    // with all of them, it stores the final O and no combine runs (speculative decoding b16);
    // otherwise it leaves the fold's state in slot 0 for combine_kernel. A key warp folds
    // its group of ranges.
    constexpr bool can_fold = Tr::folds_ranges;
    const bool folds =
        can_fold && (KeyWarps > 1 || (first_split == 0 && end_split - first_split > 1));
    float o_fold[1][Tr::pv_n_tiles][4];
    RangeFold fold[2];
    if constexpr (can_fold)
        zero(o_fold);
    // Adds a range (LSE, sum 1) or a group's state, with its O or accumulators x, to a fold
    // and its accumulators, for this thread's two row halves.
    const auto fold_in = [](RangeFold(&into)[2], float(&acc)[1][Tr::pv_n_tiles][4],
                            const RangeFold(&other)[2], const float(&x)[1][Tr::pv_n_tiles][4]) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const RangeFold::Weights w = into[h].add(other[h].max, other[h].sum);
#pragma unroll
            for (int nt = 0; nt < Tr::pv_n_tiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& a = acc[0][nt][2 * h + e];
                    a = RangeFold::merge(a, x[0][nt][2 * h + e], w);
                }
            }
        }
    };
    // A whole row's fold: the sink joins, O normalised and stored with its LSE.
    const auto store_folded = [&](RangeFold(&row)[2], float(&acc)[1][Tr::pv_n_tiles][4]) {
        float lse[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float keep = row[h].add_sink(sink_of(warp_row0 + lane / 4 + 8 * h));
            const float scale = __fmul_rn(row[h].normaliser(), keep);
            lse[h] = row[h].log_sum_exp();
#pragma unroll
            for (int nt = 0; nt < Tr::pv_n_tiles; ++nt) {
                acc[0][nt][2 * h] = __fmul_rn(acc[0][nt][2 * h], scale);
                acc[0][nt][2 * h + 1] = __fmul_rn(acc[0][nt][2 * h + 1], scale);
            }
        }
        store_output(acc, lse);
    };

    // FP8: the (sequence, K/V head)'s q and k descales in the softmax's scale, v's in O.
    float softmax_scale = args.softmax_scale;
    float scale_log2 = args.scale_log2;
    float v_descale = 1.0f;
    if constexpr (Tr::fp8) {
        const std::int64_t pair = std::int64_t{b} * args.heads_kv + kv_head;
        softmax_scale = fp8_descaled(args.softmax_scale, args, pair);
        scale_log2 = fp8_descaled(args.scale_log2, args, pair);
        v_descale = __ldg(args.v_descale + pair);
    }

    // Each range from a fresh softmax state, as a CTA of its own would compute it; the
    // copies run ahead across range boundaries (the blocks are one stream).
    for (int split = first_split; split < end_split; ++split) {
        zero(o);
        OnlineSoftmax<1, true> softmax(softmax_scale, scale_log2);
        // One K/V block: S = Q·K_jᵀ, mask, online softmax, O += P·V_j, while the next load.
        for (int j = range_start(split); j < range_start(split + 1); ++j) {
            const std::uint32_t stage = (j - first_block) % Tr::stages;
            const int refill = j + Tr::stages;  // the block that takes this stage next
            // Its rows: the page table read is in flight while block j computes.
            Rows ahead{};
            if (refill < end_block)
                ahead = rows_of(refill);
            if (j > first_block) {
                ptx::cp_async_wait_group<Tr::stages - 1>();  // block j has landed
                Tr::sync_stream();
            }
            const typename Tr::KSource k_frags(k_smem + stage * Tr::KTile::bytes);
            const typename Tr::VSource v_frags(v_smem + stage * Tr::VTile::bytes);
            float s[1][Tr::qk_n_tiles][4];
            zero(s);
            warp_gemm<Tr::mma_dtype, Tr::qk_k_tiles, Tr::qk_step, false>(s, q_frags, k_frags);
            if (j >= blocks.unmasked)
                mask_scores_by(s, warp_row0, j * Tr::B_c, visible_keys);
            softmax.update(s, o);
            std::uint32_t p[1][Tr::pv_k_tiles][4];
            accumulators_to_a_fragments<Tr::mma_dtype>(s, p);
            warp_gemm<Tr::mma_dtype, Tr::pv_k_tiles, Tr::pv_k_tiles, false>(
                o, RegisterA<1, Tr::pv_k_tiles>{p}, v_frags);
            // Every warp is done with this stage before the refill overwrites it.
            Tr::sync_stream();
            if (refill < end_block)
                copy_kv(refill, ahead);
            ptx::cp_async_commit_group();
        }
        softmax.finalize(o);
        if constexpr (Tr::fp8) {
#pragma unroll
            for (int nt = 0; nt < Tr::pv_n_tiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    o[0][nt][e] *= v_descale;
            }
        }
        float lse[2] = {softmax.log_sum_exp(0, 0), softmax.log_sum_exp(0, 1)};
        if (KeyWarps == 1 && args.splits == 1) {
            // A row's sink joins where its ranges end: here when it has one range, as a
            // second range of LSE `sink` and O = 0 (the merge's one order, RangeFold).
            if (args.sinks != nullptr) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    RangeFold with_sink;
                    with_sink.add(lse[h]);
                    const float keep = with_sink.add_sink(sink_of(warp_row0 + lane / 4 + 8 * h));
                    const float scale = __fmul_rn(with_sink.normaliser(), keep);
                    lse[h] = with_sink.log_sum_exp();
#pragma unroll
                    for (int nt = 0; nt < Tr::pv_n_tiles; ++nt) {
                        o[0][nt][2 * h] = __fmul_rn(o[0][nt][2 * h], scale);
                        o[0][nt][2 * h + 1] = __fmul_rn(o[0][nt][2 * h + 1], scale);
                    }
                }
            }
            return store_output(o, lse);
        }
        if (!folds) {
            store_partial(o, lse, split);
            continue;
        }
        if constexpr (can_fold) {
            const RangeFold range[2] = {{lse[0], 1.0f}, {lse[1], 1.0f}};  // O is normalised
            if (KeyWarps > 1 && args.ranges_per_group == 1) {
                // A group of one range is the range itself, as combine_kernel adds it.
                fold[0] = range[0];
                fold[1] = range[1];
#pragma unroll
                for (int nt = 0; nt < Tr::pv_n_tiles; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        o_fold[0][nt][e] = o[0][nt][e];
                }
            } else {
                fold_in(fold, o_fold, range, o);
            }
        }
    }
    if constexpr (KeyWarps > 1) {
        // The row's groups in order, as combine_kernel folds them: each key warp leaves its
        // group's state in its own stages (every copy has landed and been read), and warp 0
        // folds them into the row and stores O.
        ptx::cp_async_wait_group<0>();
        __syncthreads();
        const int groups = blocks_covering(args.splits, args.ranges_per_group);
        // A key warp's state: the accumulators, then max and sum of both row halves, one
        // float a lane at a time (conflict-free).
        const auto state = [&](int w, int i) -> float& {
            return reinterpret_cast<float*>(smem + Tr::k_smem_offset +
                                            w * Tr::stream_bytes)[i * warp_size + lane];
        };
        constexpr int acc_floats = Tr::pv_n_tiles * 4;
        static_assert((acc_floats + 4) * warp_size * sizeof(float) <= Tr::stream_bytes,
                      "a key warp's state fits its stages");
        if (key_warp > 0 && key_warp < groups) {
#pragma unroll
            for (int nt = 0; nt < Tr::pv_n_tiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    state(key_warp, nt * 4 + e) = o_fold[0][nt][e];
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                state(key_warp, acc_floats + 2 * h) = fold[h].max;
                state(key_warp, acc_floats + 2 * h + 1) = fold[h].sum;
            }
        }
        __syncthreads();
        if (key_warp > 0)
            return;
        RangeFold row[2];
        float o_row[1][Tr::pv_n_tiles][4];
        zero(o_row);
        for (int w = 0; w < groups; ++w) {
            if (w > 0) {
#pragma unroll
                for (int nt = 0; nt < Tr::pv_n_tiles; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        o_fold[0][nt][e] = state(w, nt * 4 + e);
                }
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    fold[h] = {state(w, acc_floats + 2 * h), state(w, acc_floats + 2 * h + 1)};
            }
            fold_in(row, o_row, fold, o_fold);
        }
        return store_folded(row, o_row);
    }
    if constexpr (can_fold) {
        if (!folds)
            return;
        if (end_split < args.splits) {
            // The state for combine_kernel: accumulators and max in slot 0, the sum beside.
            const float max[2] = {fold[0].max, fold[1].max};
            store_partial(o_fold, max, 0);
            if (lane % 4 == 0) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = warp_row0 + lane / 4 + 8 * h;
                    if (r < tile_rows)
                        args.fold_sum[token(r) * args.heads + head_of(r)] = fold[h].sum;
                }
            }
            return;
        }
        store_folded(fold, o_fold);
    }
}

// Whether this device code converts e4m3 in hardware (cvt.rn.f16x2.e4m3x2: sm_89 on). FP8
// attention runs on Hopper only (the API refuses it elsewhere), so the FP8 instances' code
// for older GPUs is a trap.
__device__ constexpr bool converts_e4m3() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
    return false;
#else
    return true;
#endif
}

template <DType Dt, int D, int Warps, int Stages, bool Paged, int KeyWarps>
__global__ void __launch_bounds__(SplitKvTraits<Dt, D, Warps, Stages, KeyWarps>::threads)
    split_kv_kernel(const __grid_constant__ SplitKvArgs args) {
    if constexpr (Dt == DType::E4M3 && !converts_e4m3())
        __trap();
    else
        split_kv_tile<Dt, D, Warps, Stages, Paged, KeyWarps>(args);
}

// Merges the ranges of each row left to right (RangeFold), from slot 0's folded state
// where the split kernel folded the row's first ranges itself, or (ranges_per_group > 1)
// each group of ranges from scratch and the groups left to right. CTAs of combine_warps warps;
// WarpsPerRow of them take a row, each a share of its columns (every lane an even number of
// consecutive ones), so the order of each column's merge is the same in every launch shape
// (launch_combine picks WarpsPerRow from the row count, i.e. the batch). A second kernel,
// not the last CTA of a tile: merging there put each tile's rows on one CTA's critical path
// (speculative decoding 133 -> 166 µs, decode b16 x 8192 195 -> 210; docs/PERF.md).
inline constexpr int combine_warps = 4;

template <DType Dt, int D, int WarpsPerRow>
__global__ void __launch_bounds__(combine_warps* warp_size)
    combine_kernel(const __grid_constant__ CombineArgs args) {
    static_assert(combine_warps % WarpsPerRow == 0);
    using T = typename Element<Dt>::type;
    constexpr int cols = D / (warp_size * WarpsPerRow);
    static_assert(cols >= 2 && cols % 2 == 0, "every lane stores pairs of columns");
    const int warp = threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    const int col0 = (warp % WarpsPerRow * warp_size + lane) * cols;  // this lane's columns
    const std::int64_t row =
        std::int64_t{blockIdx.x} * (combine_warps / WarpsPerRow) + warp / WarpsPerRow;
    if (row >= args.rows)
        return;  // the grid's last CTA: whole rows leave together
    const std::int64_t token = row / args.heads;
    if (args.cu_seqlens_q != nullptr) {
        // Sequences are contiguous: the rows between the first offset and the last are
        // theirs, the others no sequence's (and their partials were never written).
        const int first = clamp_to(args.cu_seqlens_q[0], 0, args.view_seq_q);
        const int end = clamp_to(args.cu_seqlens_q[args.batch], first, args.view_seq_q);
        if (token < first || token >= end)
            return;
    }
    ptx::wait_for_previous_grid();  // the split kernel's partials (launch_combine)
    const auto slot = [&](int s) { return args.o_partial + (s * args.rows + row) * D + col0; };
    RangeFold fold;
    float acc[cols] = {};
    int s = 0;
    if (args.folded > 1) {  // slot 0: the state of the first `folded` ranges
        fold.max = args.lse_partial[row];
        fold.sum = args.fold_sum[row];
#pragma unroll
        for (int c = 0; c < cols; c += 2) {
            const float2 x = *reinterpret_cast<const float2*>(slot(0) + c);
            acc[c] = x.x;
            acc[c + 1] = x.y;
        }
        s = args.folded;
    }
    // Adds a range (its LSE, sum 1) or a group's state, with its O or accumulators x.
    const auto fold_in = [](RangeFold& into, float(&a)[cols], float max, float sum,
                            const float(&x)[cols]) {
        const RangeFold::Weights w = into.add(max, sum);
#pragma unroll
        for (int c = 0; c < cols; ++c)
            a[c] = RangeFold::merge(a[c], x[c], w);
    };
    // The open group's fold (ranges_per_group > 1) and its ranges so far, added to the
    // row's where the group ends.
    RangeFold group;
    float group_acc[cols] = {};
    int in_group = 0;
    // Batches of ranges whose loads are all issued before the first merge: the merges are
    // a dependent chain, the loads are not (one L2 round trip a batch, not a range).
    constexpr int batch = 16;
    for (; s < args.splits; s += batch) {
        const int n = min(batch, args.splits - s);
        float lse[batch];
        float x[batch][cols];
#pragma unroll
        for (int i = 0; i < batch; ++i) {
            if (i < n) {
                lse[i] = args.lse_partial[(s + i) * args.rows + row];
#pragma unroll
                for (int c = 0; c < cols; c += 2) {
                    const float2 v = *reinterpret_cast<const float2*>(slot(s + i) + c);
                    x[i][c] = v.x;
                    x[i][c + 1] = v.y;
                }
            }
        }
        if (args.ranges_per_group == 1) {
#pragma unroll
            for (int i = 0; i < batch; ++i) {
                if (i < n)
                    fold_in(fold, acc, lse[i], 1.0f, x[i]);
            }
            continue;
        }
#pragma unroll
        for (int i = 0; i < batch; ++i) {
            if (i < n) {
                fold_in(group, group_acc, lse[i], 1.0f, x[i]);
                if (++in_group == args.ranges_per_group || s + i + 1 == args.splits) {
                    fold_in(fold, acc, group.max, group.sum, group_acc);
#pragma unroll
                    for (int c = 0; c < cols; ++c)
                        group_acc[c] = 0.0f;
                    group = {};
                    in_group = 0;
                }
            }
        }
    }

    const int head = static_cast<int>(row % args.heads);
    const float keep = fold.add_sink(args.sinks != nullptr ? __ldg(args.sinks + head) : -INFINITY);
    const float scale = __fmul_rn(fold.normaliser(), keep);
    const std::int64_t view_batch = token / args.view_seq_q;
    const std::int64_t view_row = token % args.view_seq_q;
    T* out = static_cast<T*>(args.o) + view_batch * args.o_stride.batch +
             view_row * args.o_stride.seq + head * args.o_stride.head + col0;
#pragma unroll
    for (int c = 0; c < cols; c += 2) {
        *reinterpret_cast<std::uint32_t*>(out + c) =
            ptx::pack_rn<Dt>(__fmul_rn(acc[c], scale), __fmul_rn(acc[c + 1], scale));
    }
    if (args.lse != nullptr && col0 == 0)
        args.lse[(view_batch * args.heads + head) * args.view_seq_q + view_row] =
            fold.log_sum_exp();
}

}  // namespace flash_attention::serving
