#pragma once

// What a launcher hands its kernel: plain data, shared by host and device code.

#include <cstdint>

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
    SequenceArgs seqs;
};

}  // namespace flash_attention
