#pragma once

// Checks made before any launch. Each failure throws flash_attention::Error whose
// message names the argument, what was expected and what was given.

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "flash_attention/flash_attention.hpp"

namespace flash_attention {

// Throws Error(code, "<argument>: expected <expected>, got <given>").
[[noreturn]] void fail(ErrorCode code, const std::string& argument, const std::string& expected,
                       const std::string& given);

// One tensor: a non-null 16-byte aligned pointer, positive sizes within the limits,
// non-negative strides (16-byte rows, unit d_head stride) whose last element exists.
void check_layout(const TensorView& t, const char* name);

// Whether two checked tensors can touch a common byte.
bool overlap(const TensorView& a, const TensorView& b);

// Distinct output elements must have distinct addresses, or the CTAs writing them race.
void check_output_does_not_self_overlap(const TensorView& o, const char* name);

// Masked scores are -inf before scaling; a scale <= 0 would turn them into +inf or NaN.
// The kernels work in base 2 with scale·log2(e), which must be a finite float too.
void check_softmax_scale(std::optional<float> scale);

// One of the two CausalAlignment values (a C++ caller can cast any int to it).
void check_causal_alignment(CausalAlignment alignment);

// Sliding-window sides of -1 or more (with causal, window_right -1 or 0), a softcap of 0
// or a positive finite number up to 1e6 with scale / softcap a normal float (scale: the
// call's softmax scale), and a 4-byte aligned sinks pointer.
void check_variants(const Variants& variants, bool causal, float scale);

// An optional LSE output of `count` floats (laid out as `layout` says): aligned, inside
// the address space, overlapping none of `tensors`.
void check_lse(const float* lse, std::int64_t count, const char* layout,
               std::initializer_list<std::pair<const TensorView*, const char*>> tensors);

// Shapes, dtypes, strides, alignment, aliasing and the scale; needs no GPU.
void validate_tensors(const ForwardParams& params);

// A data-free problem: dtype, head dim, positive sizes, heads_kv dividing heads.
void validate_shape(const ProblemShape& problem);

// The shape of validated tensors.
ProblemShape shape_of(const ForwardParams& params);

// That every pointer of `params` is memory `device` can reach and `stream` belongs to it
// (CUDA runtime queries: needs the GPU).
void check_on_device(const ForwardParams& params, const DeviceProperties& device, Stream stream);
// The same for named pointers (null ones are skipped).
void check_on_device(std::initializer_list<std::pair<const void*, const char*>> pointers,
                     const DeviceProperties& device, Stream stream);

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
float softmax_scale(std::optional<float> given, std::int64_t d_head);

}  // namespace flash_attention
