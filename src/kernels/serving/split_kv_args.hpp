#pragma once

// What the serving launchers hand their kernels (split-KV attention, the merge of its
// partial results, KV append): plain data, shared by host and device code.
//
// Tokens are addressed in a tensor "view" (batch, seq, heads, d_head). A dense batch is
// itself the view; a varlen batch is a view of batch 1 whose seq axis is the packed
// tokens, sequence b starting at cu_seqlens[b]. Either way a query token has one global
// index, view_batch * view_seq + view_row, which numbers the partial results and the
// merge's rows.

#include <cstdint>

#include "kernels/kernel_args.hpp"

namespace flash_attention::serving {

// The split-KV kernel's tile, stated once for the kernel (SplitKvTraits) and the host's
// split plan. A tile of one warp holds 16 packed (position, query head) rows: a decode
// step of up to 16 query heads per K/V head; anything longer runs four warps.
constexpr int split_kv_warps(std::int64_t rows_per_kv_head) {
    return rows_per_kv_head <= 16 ? 1 : 4;
}
// 64 keys a block; 32 at d_head 256, where O alone holds 128 fp32 registers a thread,
// and 32 for the one-warp (decode) tiles: two stages of 64 keys took 70 KB, 3 CTAs an
// SM, so one of its 4 schedulers had no warp and the others issued every 3.4 cycles
// (ncu, decode b16 x 8192: 77% of DRAM bandwidth); half the block fits 6.
constexpr int split_kv_block_keys(int d_head, int warps) {
    return (warps == 1 || d_head > 128) ? 32 : 64;
}
// Key warps: a CTA of one-warp tiles may run this many warps side by side, each streaming
// its own group of the row's key ranges from its own stages, and merge the groups itself
// (one CTA a row: cuDNN's decode shape, no partials and no merge kernel). Three stages of
// 32-key blocks a warp take 196 KB at d_head 128 with four warps (one CTA an SM); d_head
// 256's would not fit a second warp's. A paged cache's gathers (a table read, then rows
// from scattered pages) have more latency to hide: there, as many warps as fill d_head
// 128's 196 KB, up to eight (d_head 64, and e4m3 at d_head 128; sixteen would cap a thread
// at 128 registers: 48-56 bytes of spills, ptxas 13.0). Against four on 16-row pages
// (decode, batch 16 x 8192, heads 32/8, H100, 2026-12-07): bf16 d_head 64 104 -> 94 us,
// e4m3 d_head 64 81 -> 60 us, e4m3 d_head 128 113 -> 98 us; in a contiguous cache eight
// were level at bf16 d_head 64 and e4m3 d_head 128 and lost e4m3 d_head 64 52 -> 62 us.
// A row's ranges are merged in groups of ceil(splits / key warps) (SplitKvArgs::
// ranges_per_group) whichever kernel runs it, so the choice, which follows the batch, never
// changes a row's bits.
constexpr int split_kv_key_warps(int d_head, int element_bytes, int warps, bool paged) {
    if (warps != 1 || d_head > 128)
        return 1;
    constexpr int most = 8;
    const int fill = 4 * 256 / (d_head * element_bytes);
    return paged ? (fill < most ? fill : most) : 4;
}

// Where sequence b's keys lie and how many it uses.
struct KeySource {
    const void* k;
    const void* v;
    TensorStrides k_stride, v_stride;
    const std::int32_t* cu_seqlens;  // packed keys (varlen): sequence b at row cu_seqlens[b]
    const std::int32_t* seqlens;     // keys used per sequence; null: from cu_seqlens or seq
    int seqlens_add;                 // added to seqlens[b]: tokens appended by this call
    int seq;                         // rows of the K/V view: dense length, or page size
    int view_batch;                  // entries of the K/V view: cache batch, or pages
    // Paged: key i of sequence b is row i % seq of page block_table[b * stride + i / seq].
    const std::int32_t* block_table;  // null: not paged
    std::int64_t block_table_stride;
    int max_pages;  // pages per sequence in the table
};

struct SplitKvArgs {
    const void* q;
    void* o;
    TensorStrides q_stride, o_stride;
    const std::int32_t* cu_seqlens_q;  // varlen queries; null: dense, seq_q per sequence
    KeySource keys;
    int batch;  // sequences
    int heads;
    int heads_kv;
    int view_seq_q;  // the query view's seq: the dense seq_q, or the packed total
    int max_seq_q;   // longest query sequence (sizes the grid)
    bool causal;
    bool top_left;  // the causal diagonal's alignment (diagonal_queries)
    // Attention sinks, fp32 per query head, or null: joined once, where a row's ranges end
    // (the unsplit kernel's finalize, a fold of all ranges, or the combine).
    const float* sinks;
    float softmax_scale;
    float scale_log2;
    // FP8 (E4M3) inputs' dequantisation factors, fp32 (batch, heads_kv): q's and k's join the
    // softmax's scale, v's O. Null with 16-bit inputs.
    const float* q_descale;
    const float* k_descale;
    const float* v_descale;
    int splits;            // key ranges per (sequence, K/V head, query tile)
    int blocks_per_split;  // key blocks in each range (the last ones may be empty)
    // A row's merge: each run of ranges_per_group consecutive ranges folded from scratch (a
    // group), then the groups folded in order (RangeFold); 1: the ranges folded in order.
    int ranges_per_group;
    // Consecutive ranges one CTA streams. Each range is computed as by a CTA of its own,
    // and their merge runs in one order (RangeFold) whether the CTA holding a row's first
    // ranges folds them or combine_kernel does, so this only changes how many CTAs there
    // are, bit for bit (the launch fits them to the GPU, the batch included).
    int splits_per_cta;
    // One query tile per (sequence, K/V head): each K/V byte is read by one CTA only, and
    // streams through L2 as evict-first (set by the launch).
    bool kv_read_once;
    float* lse;  // (view batch, heads, view_seq_q) or null
    // Where a combine runs (splits > 1 and splits_per_cta < splits), each range's normalised
    // O and LSE, or in slot 0 with splits_per_cta > 1 the state of the first ranges' fold
    // (accumulators in o_partial, the max in lse_partial, the sum in fold_sum); null otherwise.
    float* o_partial;           // (splits, tokens * heads, d_head) fp32
    float* lse_partial;         // (splits, tokens * heads)
    float* fold_sum;            // (tokens * heads)
    std::int64_t partial_rows;  // tokens * heads
};

// The merge of split results into O (and LSE): one row per query token and head.
struct CombineArgs {
    const float* o_partial;
    const float* lse_partial;
    const float* fold_sum;
    int folded;  // ranges folded into slot 0 by the split kernel (1: none, slot 0 is a range)
    int ranges_per_group;  // SplitKvArgs::ranges_per_group (1 wherever folded > 1)
    std::int64_t rows;     // tokens * heads
    // Packed queries: rows outside [cu_seqlens_q[0], cu_seqlens_q[batch]) belong to no
    // sequence and are left unwritten (null: every row is a sequence's).
    const std::int32_t* cu_seqlens_q;
    int batch;
    int splits;
    int heads;
    int view_seq_q;
    void* o;
    TensorStrides o_stride;
    float* lse;
    const float* sinks;  // SplitKvArgs::sinks
};

// KV append: k_new (batch, seq_new, heads_kv, d_head) and v_new (..., d_v) into the cache at
// each sequence's length.
struct AppendArgs {
    const void* k_new;
    const void* v_new;
    TensorStrides k_new_stride, v_new_stride;
    void* k_cache;
    void* v_cache;
    TensorStrides k_stride, v_stride;
    const std::int32_t* cache_seqlens;
    int seq_new;
    int d_head;
    int d_v;
    int element_bytes;  // 2 (FP16, BF16) or 1 (E4M3)
    int seq;            // rows of the cache view: dense length, or page size
    int view_batch;     // cache entries, or pages
    const std::int32_t* block_table;
    std::int64_t block_table_stride;
    int max_pages;
};

}  // namespace flash_attention::serving
