#pragma once

// What a launcher hands its kernel: plain data, shared by host and device code.

#include <cstdint>

namespace flash_attention {

struct TensorStrides {
    std::int64_t batch, seq, head;  // in elements; d_head has unit stride
};

struct KernelArgs {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;  // (batch, heads, seq_q) or null
    TensorStrides q_stride, k_stride, v_stride, o_stride;
    int batch;
    int heads;     // of q and o
    int heads_kv;  // of k and v; divides heads
    int seq_q;
    int seq_k;
    bool causal;
    float softmax_scale;
    float scale_log2;  // softmax_scale * log2(e): the softmax works in base 2
    int sm_count;      // of the device: the grid of a persistent kernel
};

}  // namespace flash_attention
