#pragma once

// What a launcher hands its kernel: plain data, shared by host and device code.

#include <cstdint>

#include "kernels/fast_divisor.hpp"

namespace flash_attention {

struct TensorStrides {
    std::int64_t batch, seq, head;  // in elements; d_head has unit stride
};

// Sequences of their own lengths in one call (forward_varlen, forward_kvcache), read by the
// sm90 family; forward() leaves the pointers null and each batch entry is one sequence of
// seq_q queries and seq_k keys. Offsets and lengths live in device memory and are cut to
// the views by the kernel, never trusted.
struct SequenceArgs {
    const std::int32_t* cu_seqlens_q;  // batch + 1 offsets into q's and o's rows (view batch 1)
    const std::int32_t* cu_seqlens_k;  // batch + 1 offsets into k's and v's rows (view batch 1)
    const std::int32_t* seqused_k;     // sequence b uses seqused_k[b] + seqused_k_add keys
    int seqused_k_add;                 // tokens appended to the cache by the same call
    // A paged cache: k and v are (num_pages, page_size, heads_kv, d_head) (k_view_batch,
    // k_view_seq), sequence b's key i in page block_table[b * block_table_stride + i /
    // page_size]; null: no pages.
    const std::int32_t* block_table;
    std::int64_t block_table_stride;
    int max_pages;       // per sequence
    int page_copy_rows;  // rows of one TMA copy: never crosses a page
    // The tensors' own (batch, seq): q and o, then k and v.
    int q_view_batch, q_view_seq;
    int k_view_batch, k_view_seq;
};

// The query length the causal diagonal is aligned to (masking.cuh): the queries' own
// (bottom right), or the keys' (top left: row i then sees keys below min(i + 1, seq_k)).
constexpr int diagonal_queries(int seq_q, int seq_k, bool top_left) {
    return top_left ? seq_k : seq_q;
}

// A side of a sliding window no key position reaches: windows are normalised to at most
// this (exactly the same mask, since lengths stay below 2^30), so the kernels need no
// "unbounded" case and row + shift + window + 1 stays inside an int.
inline constexpr int k_unbounded_window = (1 << 30) - 1;

// Row r of a sequence (at diagonal position r + shift) sees keys [r + shift - left, r +
// shift + right], cut to [0, keys): a sliding window, or with right 0 causal masking. Read
// by the variant kernels only (KernelArgs::variants); the plain ones keep their causal
// flag.
struct KeyBand {
    int left, right;  // at most k_unbounded_window
};

// The diagonal position of row 0 (KeyBand): seq_k - diagonal_queries.
constexpr int band_shift(int seq_q, int seq_k, bool top_left) {
    return seq_k - diagonal_queries(seq_q, seq_k, top_left);
}

struct KernelArgs {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;  // (batch, heads, seq_q) or null
    TensorStrides q_stride, k_stride, v_stride, o_stride;
    int batch;     // sequences
    int heads;     // of q and o
    int heads_kv;  // of k and v; divides heads
    int seq_q;     // the longest sequence's queries
    int seq_k;     // and keys
    bool causal;
    // The causal diagonal's alignment: top_left for the per-sequence kernels, which apply
    // diagonal_queries to each sequence, and for the dense ones diagonal_seq_q =
    // diagonal_queries(seq_q, seq_k, top_left), set by the host so that their masks read one
    // parameter, as before (a second length held across the main loop cost a spill).
    bool top_left;
    int diagonal_seq_q;
    float softmax_scale;
    float scale_log2;  // softmax_scale * log2(e): the softmax works in base 2
    int sm_count;      // of the device: the grid of a persistent kernel
    // Tiles are numbered in sections of this many heads (batch entries times heads, query heads
    // of one K/V head together), the query block slowest within a section (tile_scheduler.cuh):
    // 1 numbers each head's tiles together; more balances causal tiles' lengths across the
    // CTAs while the section's K/V still fits in L2. At least 1.
    int section_heads;
    SequenceArgs seqs;
    // Sliding window, logit softcap or sinks: the launch runs the config's variant kernel,
    // whose main loop masks with `band` (causal included) and applies the softcap. With a
    // softcap, scores become tanh(score * softcap_prescale) (prescale = scale / softcap, 0:
    // off) and softmax_scale is the softcap, so the softmax and the LSE need nothing else.
    bool variants;
    KeyBand band;
    float softcap_prescale;
    // With a softcap, every score lies in [-1, 1] after the tanh. Where the probabilities of
    // that whole range, 2^((t - softcap_reference) * scale_log2), are normal numbers of fp32
    // and of P's type without overflowing, softcap_fixed: the sm90 variant kernels take that one
    // reference for every row, with no row maxima and no rescaling of O (RowReference::fixed).
    bool softcap_fixed;
    float softcap_reference;
    // Attention sinks, fp32 per query head, or null: added to the rows' denominators where
    // they are finalised (OnlineSoftmax::finalize), by the variant kernels and the split-KV
    // ones (which take no window or softcap).
    const float* sinks;
    // The divisions of a dense problem's tile numbers (section_heads among them), set by the
    // sm90 launcher for its B_r.
    TileDivisors tile_divisors;
    // ALiBi (Variants::alibi_slopes), read by the variant kernels: sequence b's head h adds
    // -slope * |position - key| to its scores (AlibiBias), slope alibi_slopes[b *
    // alibi_batch_stride + h]; null: none. Last, so that the fields before keep their offsets
    // (the plain kernels' parameter loads stay as they were).
    const float* alibi_slopes;
    std::int64_t alibi_batch_stride;
    // pack_gqa tiles (sm90): log2 of the query heads a K/V head serves, set by the launcher.
    // Row r of a sequence's packed rows is query position r >> pack_shift of the group's head
    // r % (1 << pack_shift), so a tile of B_r rows holds B_r >> pack_shift positions of every
    // head of one group (tile_scheduler.cuh).
    int pack_shift;
    // FP8 (E4M3) inputs' dequantisation factors, fp32 (batch, heads_kv); null for 16-bit ones.
    const float* q_descale;
    const float* k_descale;
    const float* v_descale;
};

// What a backward launcher hands its kernels (sm80/backward_kernel.cuh): the forward's
// tensors, dO, the gradients it writes, and D = rowsum(dO ∘ O) - dLSE, which the
// preprocess kernel writes into workspace.
struct BackwardArgs {
    const void* q;
    const void* k;
    const void* v;
    const void* o;
    const void* d_o;
    void* dq;
    void* dk;
    void* dv;
    const float* lse;    // the forward's, natural log, (batch, heads, seq_q)
    const float* d_lse;  // ∂loss/∂LSE, (batch, heads, seq_q), or null
    // Workspace (backward_workspace()): D per query row, and for the sm90 family the LSE in
    // base 2 and dQ's fp32 accumulator; q_rows rows a (batch, head), seq_q or (sm90) whole
    // query blocks.
    float* d;         // (batch, heads, q_rows)
    float* lse2;      // (batch, heads, q_rows), or null
    float* dq_accum;  // (batch, heads, q_rows, tile_columns(d_head)) in the kernel's fragment
                      // order, or null
    // (batch, heads, q_rows / 64): per 64 query rows, the key blocks whose dQ has been added
    // (ordered_dq), or null
    int* dq_semaphores;
    // Persistent CTAs on the dynamic schedule: the key blocks handed out past the first round
    // (zeroed by the preprocess), or null.
    int* tile_counter;
    int q_rows;
    TensorStrides q_stride, k_stride, v_stride, o_stride, d_o_stride;
    TensorStrides dq_stride, dk_stride, dv_stride;
    int batch;
    int heads;     // of q, o, d_o, dq
    int heads_kv;  // of k, v, dk, dv; divides heads
    int seq_q;
    int seq_k;
    bool causal;
    bool top_left;       // the causal diagonal's (and a window's) alignment
    int diagonal_seq_q;  // as KernelArgs': diagonal_queries(seq_q, seq_k, top_left)
    // A sliding window: the band kernels run, whose mask (BandMask) is `band` (causal included,
    // as right 0) at diagonal position row + seq_k - diagonal_seq_q; the plain ones read
    // `causal` only.
    bool banded;
    KeyBand band;
    float softmax_scale;  // the given scale: dQ's and dK's factor
    // P = exp2(S·scale_log2 - lse2): softmax_scale · log2(e), or with a softcap (the forward's
    // mapping, api/forward.cpp) S = tanh(raw · softcap_prescale) and scale_log2 = softcap ·
    // log2(e). softcap_prescale = softmax_scale / softcap, or 0 without one.
    float scale_log2;
    float softcap_prescale;
    int sm_count;  // of the device: how many CTAs run at once (the causal schedule's groups)
    // Attention sinks, fp32 per query head, or null: the LSE includes them, so P, and dQ, dK
    // and dV, need nothing else; their gradient goes to d_sinks (heads,), or nowhere if null.
    const float* sinks;
    float* d_sinks;
    // Packed sequences (backward_varlen), or null: batch + 1 offsets into the query tensors'
    // rows (q, o, d_o, dq; view batch 1) and the key tensors' (k, v, dk, dv), and the keys each
    // sequence uses (seqused_k, or null: all). seq_q and seq_k are then the longest lengths
    // (the grid's) and each CTA reads its sequence's (BackwardSequence).
    const std::int32_t* cu_seqlens_q;
    const std::int32_t* cu_seqlens_k;
    const std::int32_t* seqused_k;
    int total_q, total_k;  // the packed views' rows
    // Rows of one head's LSE and dLSE: seq_q (batch, heads, seq_q), or packed total_q (heads,
    // total_q). The workspace's rows of a sequence start at a multiple of q_block (sm90: 128,
    // whole query blocks; sm80: 1): sequence b's at cu_seqlens_q[b] rounded down plus b blocks.
    int lse_rows;
    int q_block;
    // Ordered dQ's semaphores: one per 64 of these query rows a (sequence, head): q_rows dense,
    // packed the longest sequence's in whole blocks.
    int semaphore_rows;
    // ALiBi, as KernelArgs' (the band kernels run it: banded is set with it).
    const float* alibi_slopes;
    std::int64_t alibi_batch_stride;
    // Stream-K (BackwardStreamK, set by the launch where it splits): two slots a range of a
    // CTA's dK and dV partials (fp32, B_c x (d_head + d_v) floats each), and a counter for each
    // of the streamk_blocks split key blocks (zeroed by the preprocess); else null and 0. Last,
    // so that the fields before keep their offsets (and the kernels without it their code).
    float* streamk_partials;
    int* streamk_counters;
    int streamk_blocks;
};

}  // namespace flash_attention
