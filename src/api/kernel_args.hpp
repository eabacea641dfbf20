#pragma once

// What the API hands a registered kernel.

#include "flash_attention/flash_attention.hpp"
#include "kernels/kernel_args.hpp"

namespace flash_attention {

// A tensor's batch, sequence and head strides, as the kernels take them.
TensorStrides strides(const TensorView& t);

// The softmax's scale as every kernel takes it, computed here alone: the scores' scale and its
// base-2 form (the kernels exponentiate with exp2). With a softcap the softmax runs on
// tanh(score * scale / softcap) scaled by the softcap: `scale` is then the softcap and
// `softcap_prescale` the given scale over it (0 without a softcap).
struct SoftmaxScale {
    float scale;
    float scale_log2;
    float softcap_prescale;
};
SoftmaxScale softmax_scale(const AttentionOptions& options, std::int64_t d_head);

// The rows' key band (KeyBand): the window's sides, an unbounded one (-1) as
// k_unbounded_window, and with causal masking a right side of 0.
KeyBand key_band(const AttentionOptions& options);

// Validated dense tensors as KernelArgs on `device`: each batch entry one sequence of the
// tensors' lengths (SequenceArgs without offsets or lengths), a head's tiles numbered together
// (section_heads 1), and the descales' pointers (null without them).
KernelArgs kernel_args(const ForwardParams& params, const DeviceProperties& device);

// KernelArgs::section_heads for forward()'s dense problems on tiles of B_r query rows: sized by
// a head's K/V, read off the key tensor. forward_varlen and forward_kvcache keep one head a
// section: their key tensor is a paged cache's pages or a cache's capacity, not the sequences'
// keys, and sections were measured on dense problems only.
int section_heads(const ForwardParams& params, int B_r, const DeviceProperties& device);

}  // namespace flash_attention
