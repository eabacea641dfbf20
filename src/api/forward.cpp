#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>
#include <string>

#include "api/choice.hpp"
#include "api/kernel_args.hpp"
#include "api/validate.hpp"
#include "common/stream_scratch.hpp"
#include "config/resources.hpp"
#include "registry/registry.hpp"
#include "tuning/tuning_cache.hpp"

namespace flash_attention {

TensorStrides strides(const TensorView& t) {
    return {t.stride[0], t.stride[1], t.stride[2]};
}

SoftmaxScale softmax_scale(const AttentionOptions& options, std::int64_t d_head) {
    const float given = options.scale(d_head);
    const float softcap = options.variants.softcap;
    const float scale = softcap != 0.0f ? softcap : given;
    return {scale, static_cast<float>(scale * std::numbers::log2e),
            softcap != 0.0f ? given / softcap : 0.0f};
}

namespace {

// -1 (unbounded) and anything past every position as k_unbounded_window: the same mask.
int window_side(int side) {
    return side < 0 || side > k_unbounded_window ? k_unbounded_window : side;
}

}  // namespace

KeyBand key_band(const AttentionOptions& options) {
    const Variants& v = options.variants;
    return {window_side(v.window_left), options.causal ? 0 : window_side(v.window_right)};
}

namespace {

// KernelArgs::softcap_fixed / softcap_reference for a softcap whose softmax works in base 2
// with scale_log2 = softcap * log2(e). After the tanh a score t lies in [-1, 1], so against a
// reference r the probabilities 2^((t - r) * scale_log2) span 2^(2 * scale_log2). They must be
// normal numbers of fp32 and of P's type at the bottom (bf16 shares fp32's range: 2^-126;
// fp16: 2^-14), and at the top leave a row's sum of up to 2^31 of them, and O's accumulators
// (times |V| up to 2^64), finite in fp32; one unit of margin each side covers tanh.approx's
// error. r puts the top at 2^0 where the span fits below it, else as low as the bottom allows:
// bf16 takes softcaps up to 54.0 (Gemma-2's 50, Grok's 30), fp16 up to 9.35.
struct FixedReference {
    bool fits;
    float reference;  // in units of t
};
FixedReference softcap_fixed_reference(float softcap, DType dtype) {
    if (softcap == 0.0f)
        return {false, 0.0f};
    const double bottom = dtype == DType::FP16 ? -13.0 : -125.0;
    const double top = dtype == DType::FP16 ? 14.0 : 31.0;
    const double span = 2.0 * softcap * std::numbers::log2e;
    if (span > top - bottom)
        return {false, 0.0f};
    const double high = std::max(0.0, span + bottom);  // the top's exponent
    return {true, static_cast<float>(1.0 - high / (softcap * std::numbers::log2e))};
}

}  // namespace

// KernelArgs::section_heads for tiles of B_r query rows. A causal head's tiles differ in length,
// longest first: numbered head after head, the tiles that start last are the last head's longest,
// and the grid waits on them (bench/tile_order.py, a model of greedy CTAs over the grid: 87-89% of
// the mean work at d_head 256 from 1k to 8k keys, 90-94% at d_head 128). Sections of heads, their
// query blocks taken in turn, put every head's longest tiles first (96-100%), while the K/V that
// the CTAs stream at one time stays the section's. Measured on the H200 (2026-11-26,
// docs/PERF.md): sections a power of two of K/V heads whose K/V fits a third of the L2 (16 MiB)
// gained 4-11% at d_head 256 from 1k to 8k keys and 3-6% at d_head 64 and 128 from 2k; 8 MiB
// gained less, 32 MiB less at d_head 256; sections of uneven size (the last one short) lost up to
// 5%: the last section's own longest tile starts last again. Heads of fewer than 8 query blocks
// (512 keys, and 1024 at B_r 192) lost 1-4% in sections: their few tiles run side by side
// anyway, reading their K/V together. Those, and non-causal tiles (all of one length), keep a
// head's tiles together.
int section_heads(const ForwardParams& p, int B_r, const DeviceProperties& device) {
    if (!p.options.causal || p.q.shape[1] < 8 * std::int64_t{B_r})
        return 1;
    const std::int64_t kv_head_bytes =
        2 * p.k.shape[1] * p.k.shape[3] * static_cast<std::int64_t>(element_bytes(p.k.dtype));
    const auto kv_heads = static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(
        std::max<std::int64_t>(1, device.l2_bytes / 3 / kv_head_bytes))));
    const std::int64_t group = p.q.shape[2] / p.k.shape[2];
    return static_cast<int>(std::min(kv_heads * group, p.q.shape[0] * p.q.shape[2]));
}

KernelArgs kernel_args(const ForwardParams& p, const DeviceProperties& device) {
    const AttentionOptions& opt = p.options;
    const Variants& var = opt.variants;
    const SoftmaxScale scale = softmax_scale(opt, p.q.shape[3]);
    // ALiBi's bias leaves the scores unbounded: no fixed reference with it.
    const FixedReference fixed = var.alibi_slopes != nullptr
                                     ? FixedReference{false, 0.0f}
                                     : softcap_fixed_reference(var.softcap, p.q.dtype);
    const bool top_left = opt.causal_alignment == CausalAlignment::top_left;
    return {.q = p.q.data,
            .k = p.k.data,
            .v = p.v.data,
            .o = p.o.data,
            .lse = opt.lse,
            .q_stride = strides(p.q),
            .k_stride = strides(p.k),
            .v_stride = strides(p.v),
            .o_stride = strides(p.o),
            .batch = static_cast<int>(p.q.shape[0]),
            .heads = static_cast<int>(p.q.shape[2]),
            .heads_kv = static_cast<int>(p.k.shape[2]),
            .seq_q = static_cast<int>(p.q.shape[1]),
            .seq_k = static_cast<int>(p.k.shape[1]),
            .causal = opt.causal,
            .top_left = top_left,
            .diagonal_seq_q = diagonal_queries(static_cast<int>(p.q.shape[1]),
                                               static_cast<int>(p.k.shape[1]), top_left),
            .softmax_scale = scale.scale,
            .scale_log2 = scale.scale_log2,
            .sm_count = device.sm_count,
            .section_heads = 1,
            .seqs = {.cu_seqlens_q = nullptr,
                     .cu_seqlens_k = nullptr,
                     .seqused_k = nullptr,
                     .seqused_k_add = 0,
                     .block_table = nullptr,
                     .block_table_stride = 0,
                     .max_pages = 0,
                     .page_copy_rows = 0,
                     .q_view_batch = static_cast<int>(p.q.shape[0]),
                     .q_view_seq = static_cast<int>(p.q.shape[1]),
                     .k_view_batch = static_cast<int>(p.k.shape[0]),
                     .k_view_seq = static_cast<int>(p.k.shape[1])},
            .variants = var.any(),
            .band = key_band(opt),
            .softcap_prescale = scale.softcap_prescale,
            .softcap_fixed = fixed.fits,
            .softcap_reference = fixed.reference,
            .sinks = var.sinks,
            .tile_divisors = {},  // the sm90 launcher's, for its B_r
            .alibi_slopes = var.alibi_slopes,
            .alibi_batch_stride = var.alibi_batch_stride,
            .pack_shift = 0,  // the sm90 launcher's, for pack_gqa configs
            .q_descale = p.descales ? p.descales->q : nullptr,
            .k_descale = p.descales ? p.descales->k : nullptr,
            .v_descale = p.descales ? p.descales->v : nullptr};
}

namespace {

// Checks the named config against these tensors and device, then launches it.
void launch(const ForwardParams& params, const KernelConfig& config, const DeviceProperties& device,
            Stream stream) {
    validate_config(params, config, device);
    check_on_device(params, device, stream);
    if (params.descales) {
        check_on_device({{params.descales->q, "descales.q"},
                         {params.descales->k, "descales.k"},
                         {params.descales->v, "descales.v"}},
                        device, stream);
    }
    KernelArgs args = kernel_args(params, device);
    args.section_heads = section_heads(params, config.B_r, device);
    find_kernel(config)->launch(args, stream);
}

}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, std::int64_t batch, std::int64_t seq,
                                  std::int64_t heads, std::int64_t d_head) {
    return {data,
            dtype,
            {batch, seq, heads, d_head},
            {seq * heads * d_head, heads * d_head, d_head, 1}};
}

KernelConfig choose_config(const ForwardParams& params) {
    validate_tensors(params);
    return choose_kernel(choice_problem(params), DeviceProperties::current());
}

KernelConfig choose_config(const ProblemShape& problem, const DeviceProperties& device) {
    validate_forward_shape(problem);
    return choose_kernel({problem}, device);
}

namespace {

// A decoding shape as forward_kvcache's call: every sequence uses all seq_k keys.
KVCacheParams as_kvcache(const ForwardParams& params) {
    KVCacheParams kv;
    kv.q = params.q;
    kv.k_cache = params.k;
    kv.v_cache = params.v;
    kv.o = params.o;
    kv.options = params.options;
    kv.descales = params.descales;
    return kv;
}

}  // namespace

KernelChoice chosen_kernel(const ProblemShape& problem, const DeviceProperties& device) {
    validate_forward_shape(problem);
    if (problem.dtype == DType::E4M3)
        check_fp8_device(device, "dtype");
    if (runs_split_kv({problem}, device))
        return split_kv_choice(problem, device, 0);
    return {choose_kernel({problem}, device), 0};
}

KernelChoice chosen_kernel(const ForwardParams& params) {
    validate_tensors(params);
    const DeviceProperties& device = DeviceProperties::current();
    const ChoiceProblem problem = choice_problem(params);
    if (runs_split_kv(problem, device))
        return chosen_kernel(as_kvcache(params));
    return {choose_kernel(problem, device), 0};
}

void forward(const ForwardParams& params, Stream stream) {
    validate_tensors(params);
    const DeviceProperties& device = DeviceProperties::current();
    const ChoiceProblem problem = choice_problem(params);
    if (runs_split_kv(problem, device)) {
        forward_kvcache(as_kvcache(params), stream);
        return;
    }
    launch(params, choose_kernel(problem, device), device, stream);
}

bool is_supported(const KernelConfig& config) {
    // "The current device can run it" is false when there is none (or it is older than
    // sm_80): a question, not an error.
    if (device_count() == 0)
        return false;
    try {
        return device_problem(config, DeviceProperties::current()).empty();
    } catch (const Error& e) {
        if (e.code() == ErrorCode::no_device)
            return false;
        throw;
    }
}

std::string shape_problem(const KernelConfig& config, const ProblemShape& problem, bool sinks) {
    return pack_gqa_problem(config, problem.heads, problem.heads_kv, problem.seq_q,
                            sinks || problem.window_or_softcap);
}

std::size_t shared_memory_bytes(const KernelConfig& config) {
    return smem_bytes(config);
}

std::string_view version() {
    return FLASH_ATTENTION_VERSION;
}

void reload_tuning_cache() {
    tuning::reload();
}

void release_cached_memory() {
    release_pool_memory();
}

void forward(const ForwardParams& params, const KernelConfig& config, Stream stream) {
    validate_tensors(params);
    launch(params, config, DeviceProperties::current(), stream);
}

}  // namespace flash_attention
