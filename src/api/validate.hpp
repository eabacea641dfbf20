#pragma once

// Checks made before any launch. Each failure throws flash_attention::Error whose
// message names the argument, what was expected and what was given.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "flash_attention/flash_attention.hpp"

namespace flash_attention {

// Throws Error(code, "<argument>: expected <expected>, got <given>").
[[noreturn]] void fail(ErrorCode code, const std::string& argument, const std::string& expected,
                       const std::string& given);

// "v.shape[3] (d_v)": a dense (batch, seq, heads, head dim) tensor's dimension i, with its name;
// the head dim of V's side (v, o and their gradients and caches) is d_v, which DeepSeek's MLA
// makes differ from Q's and K's d_head.
std::string shape_name(const char* tensor, int i);
// The same for its stride: "v.stride[3] (d_v)".
std::string stride_name(const char* tensor, int i);

// A tensor's dtype: q's (`as`), and FP16 or BF16. Every entry point but forward() checks its
// tensors with it: E4M3 is refused with a message that FP8 runs through forward() and
// forward_kvcache() only.
void check_dtype(const TensorView& t, const char* name, DType as);

// One tensor: a non-null 16-byte aligned pointer, positive sizes within the limits,
// non-negative strides (16-byte rows, unit d_head stride) whose last element exists.
void check_layout(const TensorView& t, const char* name);

// Whether two checked tensors can touch a common byte.
bool overlap(const TensorView& a, const TensorView& b);

// What every entry point checks of its output and options once its tensors are valid:
// o overlaps none of `inputs` (null entries skipped) nor itself (distinct output elements
// must have distinct addresses, or the CTAs writing them race); the optional LSE of
// `lse_count` floats (laid out as `lse_layout` says) is aligned, inside the address space
// and overlaps none of the inputs nor o; the softmax scale is positive with scale·log2(e) a
// finite float (masked scores are -inf before scaling; the kernels work in base 2); the
// causal alignment is one of the two values (a C++ caller can cast any int to it); and the
// variants have window sides of -1 or more (with causal, window_right -1 or 0), a softcap
// of 0 or a positive finite number up to 1e6 with scale / softcap a normal float, and a
// 4-byte aligned sinks pointer. d_head (q's last dimension) gives the scale's default.
void check_outputs_and_options(
    const TensorView& o, std::initializer_list<std::pair<const TensorView*, const char*>> inputs,
    const AttentionOptions& options, std::int64_t lse_count, const char* lse_layout,
    std::int64_t d_head);

// An output tensor: no element aliases another (distinct output elements must have distinct
// addresses, or the CTAs writing them race) and none overlaps the `others` (null skipped).
void check_output(const TensorView& out, const char* name,
                  std::initializer_list<std::pair<const TensorView*, const char*>> others);

// `count` 4-byte values at `rows` (floats: an LSE or its gradient; or int32 lengths, laid out
// as `layout` says; null: none given): 4-byte aligned, inside the address space, overlapping
// none of `tensors`.
void check_float_rows(const void* rows, const char* argument, std::int64_t count,
                      const char* layout,
                      std::initializer_list<std::pair<const TensorView*, const char*>> tensors);

// `a_count` 4-byte values at `a` overlap none of the `b_count` at `b` (either null: none); the
// error names a.
void check_words_apart(const void* a, std::int64_t a_count, const std::string& a_name,
                       const void* b, std::int64_t b_count, const char* b_name);

// The variants' arrays a call reads, options.variants.sinks ((heads,) floats) and
// .alibi_slopes ((heads,), or (slope_rows, heads) with a batch stride), overlap none of the
// tensors it writes (`written`) nor the `lse_count` floats of the LSE it writes at `lse` (null:
// none): some CTAs write those while others still read the arrays. `prefix` names them as the
// caller's struct does ("variants." or "options.variants.").
void check_variant_arrays_apart(
    const AttentionOptions& options, const std::string& prefix, std::int64_t heads,
    std::int64_t slope_rows,
    std::initializer_list<std::pair<const TensorView*, const char*>> written, const float* lse,
    std::int64_t lse_count);

// The softmax scale, the causal alignment and the variants' bounds (check_outputs_and_options).
void check_options(const AttentionOptions& options, std::int64_t d_head, std::int64_t heads);

// t.shape[i] (named dim_name) must be `expected`, for the reason `why`.
void check_dim(const TensorView& t, const char* name, int i, const char* dim_name,
               std::int64_t expected, const std::string& why);
// A device int32 array (null only where not required), 4-byte aligned.
void check_int_array(const std::int32_t* p, const char* name, bool required,
                     const std::string& needed_for);
// lo <= value <= hi.
void check_range(const char* name, std::int64_t value, std::int64_t lo, std::int64_t hi);

// Shapes, dtypes, strides, alignment, aliasing and the scale; with E4M3 inputs FP8 attention's
// limits and its descales; needs no GPU.
void validate_tensors(const ForwardParams& params);
// Its parts for forward_kvcache's views: q's dtype for k, v and o (16-bit), or FP8's (q, k, v
// E4M3, o BF16) with descales only then; and with E4M3, FP8's head dims, no variants, and the
// descales' pointers ((q's batch, heads_kv) floats clear of o and the LSE). k_name and v_name
// name k and v in errors (forward_kvcache: k_cache, v_cache).
void check_attention_dtypes(const ForwardParams& params, const char* k_name = "k",
                            const char* v_name = "v");
void check_fp8_tensors(const ForwardParams& params);
// FP8 (E4M3) attention runs on Hopper (compute capability 9.0) and later: elsewhere an
// ErrorCode::unsupported naming `argument` (the dtype's name in the caller's API).
void check_fp8_device(const DeviceProperties& device, const char* argument);

// A data-free problem of forward(): dtype (E4M3 with FP8 attention's limits), head dim, positive
// sizes, heads_kv dividing heads.
void validate_forward_shape(const ProblemShape& problem);
// The same for the entry points of 16-bit inputs only (the backward's): E4M3 is refused as
// check_dtype refuses it.
void validate_shape(const ProblemShape& problem);

// The shape of validated tensors.
ProblemShape shape_of(const ForwardParams& params);
// ProblemShape::d_v of tensors q and v: 0 where V's head dim is q's.
int value_dim_of(const TensorView& q, const TensorView& v);

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

// Why a pack_gqa config (packgqa) cannot run a problem of `heads` query heads over
// `heads_kv` K/V heads and `seq_q` query rows a view, with variants (Variants::any()) or not:
// its tiles take groups of query heads that divide a consumer's 64 rows, run the plain kernel
// body, and number a sequence's (position, head) rows in ints. Empty for other configs.
std::string pack_gqa_problem(const KernelConfig& config, std::int64_t heads, std::int64_t heads_kv,
                             std::int64_t seq_q, bool variants);

// Why the sm90 family's TMA cannot address these tensors (a zero stride along a
// dimension of size > 1, e.g. a broadcast K/V), or an empty string.
std::string tma_problem(std::initializer_list<std::pair<const char*, const TensorView*>> tensors);
// The forward's: Q, K, V and O.
std::string tma_problem(const ForwardParams& params);

}  // namespace flash_attention
