#pragma once

// Checks made before any launch. Each failure throws flash_attention::Error whose
// message names the argument, what was expected and what was given.

#include <string>

#include "flash_attention/flash_attention.hpp"

namespace flash_attention {

// Shapes, dtypes, strides, alignment, aliasing and the scale; needs no GPU.
void validate_tensors(const ForwardParams& params);

// A data-free problem: dtype, head dim, positive sizes, heads_kv dividing heads.
void validate_shape(const ProblemShape& problem);

// The shape of validated tensors.
ProblemShape shape_of(const ForwardParams& params);

// That every pointer of `params` is memory `device` can reach and `stream` belongs to it
// (CUDA runtime queries: needs the GPU).
void check_on_device(const ForwardParams& params, const DeviceProperties& device, Stream stream);

// That `config` was built and can run these tensors on `device`.
void validate_config(const ForwardParams& params, const KernelConfig& config,
                     const DeviceProperties& device);

// Why `config` cannot run on `device` whatever the tensors (not built, another family's
// GPU, too much shared memory), or an empty string.
std::string device_problem(const KernelConfig& config, const DeviceProperties& device);

// Why the sm90 family's TMA cannot address these tensors (a zero stride along a
// dimension of size > 1, e.g. a broadcast K/V), or an empty string.
std::string tma_problem(const ForwardParams& params);

// The problem's softmax scale: the given one or 1/sqrt(d_head).
float softmax_scale(const ForwardParams& params);

}  // namespace flash_attention
