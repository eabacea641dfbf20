#pragma once

// Public API: attention forward, O = softmax(Q·Kᵀ·scale)·V, fp16/bf16.
// Plain C++: no CUDA headers are needed to include this file.

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "flash_attention/error.hpp"
#include "flash_attention/kernel_config.hpp"

struct CUstream_st;

namespace flash_attention {

using Stream = CUstream_st*;  // the same type as cudaStream_t; nullptr is the default stream

// A 4-D tensor in device memory laid out (batch, seq, heads, d_head). Strides are in
// elements; d_head must have unit stride, the other three are free.
struct TensorView {
    void* data = nullptr;
    DType dtype = DType::FP16;
    std::array<std::int64_t, 4> shape{};   // batch, seq, heads, d_head
    std::array<std::int64_t, 4> stride{};  // in elements, same order

    // A densely packed (batch, seq, heads, d_head) tensor.
    static TensorView contiguous(void* data, DType dtype, std::int64_t batch, std::int64_t seq,
                                 std::int64_t heads, std::int64_t d_head);
};

struct ForwardParams {
    TensorView q;
    TensorView k;
    TensorView v;
    TensorView o;                        // written; may not alias q, k or v
    std::optional<float> softmax_scale;  // default 1/sqrt(d_head)
};

// Runs the kernel the library chooses for this problem and device: the winner that
// `flash_attention tune` recorded for this GPU, dtype, d_head and sequence-length bucket
// in the tuning cache ($FLASH_ATTENTION_TUNING, else ~/.cache/flash_attention/tuning.json),
// else a built-in table. The cache is read once per process; a missing, corrupt or stale
// cache only means the built-in table is used.
// Throws flash_attention::Error on invalid input or a CUDA failure.
void forward(const ForwardParams& params, Stream stream = nullptr);

// Runs exactly the named kernel; throws ErrorCode::not_built if it was not compiled.
void forward(const ForwardParams& params, const KernelConfig& config, Stream stream = nullptr);

// The kernel the automatic choice would run for these parameters on the current device.
KernelConfig choose_config(const ForwardParams& params);

// Makes the next automatic choice read the tuning cache file again.
void reload_tuning_cache();

// Every config compiled into this build, in KernelConfig order.
const std::vector<KernelConfig>& configs();

// Whether this build holds a kernel for the config.
bool is_built(const KernelConfig& config);

}  // namespace flash_attention
