#include "api/validate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "config/config_space.hpp"

namespace flash_attention {

namespace {

std::string limits_text() {
    return "batch at most " + std::to_string(k_max_batch) + ", heads at most " +
           std::to_string(k_max_heads) + " and seq at most " + std::to_string(k_max_seq);
}

// The head dims the FP8 (E4M3) kernels take (the config rule dtype).
constexpr bool fp8_head_dim(std::int64_t d) {
    return d == 64 || d == 128 || d == 256;
}

// What a message expects of an E4M3 problem's d_head: fp8_head_dim's dims, read off the predicate
// so that the two agree.
std::string fp8_head_dims_expected() {
    std::vector<int> dims;
    for (const int d : space::k_head_dims) {
        if (fp8_head_dim(d))
            dims.push_back(d);
    }
    return space::numbers_text(dims) + " (the FP8 kernels' head dims, for E4M3 inputs)";
}

bool is_dtype(DType dtype) {
    return dtype == DType::FP16 || dtype == DType::BF16 || dtype == DType::E4M3;
}

// A dtype as a message gives it: its name, or the number a C++ caller cast to it.
std::string dtype_text(DType dtype) {
    return is_dtype(dtype) ? std::string(to_string(dtype))
                           : "enum value " + std::to_string(static_cast<int>(dtype));
}

// Every entry point but forward() and forward_kvcache() takes 16-bit inputs only: its refusal of
// anything else, which points FP8 callers to those two.
[[noreturn]] void fail_not_16_bit(const std::string& argument, DType given) {
    fail(ErrorCode::dtype, argument,
         given == DType::E4M3
             ? "FP16 or BF16 (FP8 attention, E4M3, runs through forward() and forward_kvcache())"
             : "FP16 or BF16",
         dtype_text(given));
}

}  // namespace

void fail(ErrorCode code, const std::string& argument, const std::string& expected,
          const std::string& given) {
    throw Error(code, argument + ": expected " + expected + ", got " + given);
}

namespace {

// Dimension i's name in `tensor`.
std::string dim_name(std::string_view tensor, int i) {
    static constexpr std::array<const char*, 4> names = {"batch", "seq", "heads", "d_head"};
    static constexpr std::string_view value_side[] = {"v", "o", "d_o", "dv", "v_cache", "v_new"};
    if (i == 3 &&
        std::find(std::begin(value_side), std::end(value_side), tensor) != std::end(value_side))
        return "d_v";
    return names.at(static_cast<std::size_t>(i));
}

}  // namespace

std::string shape_name(const char* tensor, int i) {
    return std::string(tensor) + ".shape[" + std::to_string(i) + "] (" + dim_name(tensor, i) + ")";
}

std::string stride_name(const char* tensor, int i) {
    return std::string(tensor) + ".stride[" + std::to_string(i) + "] (" + dim_name(tensor, i) + ")";
}

void check_layout(const TensorView& t, const char* name) {
    if (t.data == nullptr) {
        fail(ErrorCode::invalid_argument, std::string(name) + ".data", "a device pointer",
             "a null pointer");
    }
    for (int i = 0; i < 4; ++i) {
        if (t.shape[i] <= 0) {
            fail(ErrorCode::invalid_argument, shape_name(name, i), "a positive size",
                 std::to_string(t.shape[i]));
        }
        if (t.stride[i] < 0) {
            fail(ErrorCode::invalid_argument, stride_name(name, i), "a non-negative stride",
                 std::to_string(t.stride[i]));
        }
    }
    if (t.stride[3] != 1) {
        fail(ErrorCode::invalid_argument, stride_name(name, 3), "1 (contiguous head dim)",
             std::to_string(t.stride[3]));
    }
    // Every row is read and written as 16-byte vectors.
    if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) {
        fail(ErrorCode::invalid_argument, std::string(name) + ".data", "a 16-byte aligned address",
             "one that is not");
    }
    const auto row_elements = static_cast<std::int64_t>(16 / element_bytes(t.dtype));
    for (int i = 0; i < 3; ++i) {
        if (t.shape[i] > 1 && t.stride[i] % row_elements != 0) {
            fail(ErrorCode::invalid_argument, stride_name(name, i),
                 "a multiple of " + std::to_string(row_elements) +
                     " elements (16-byte aligned rows)",
                 std::to_string(t.stride[i]));
        }
    }
    if (t.shape[0] > k_max_batch || t.shape[1] > k_max_seq || t.shape[2] > k_max_heads) {
        fail(ErrorCode::invalid_argument, std::string(name) + ".shape", limits_text(),
             "(" + std::to_string(t.shape[0]) + ", " + std::to_string(t.shape[1]) + ", " +
                 std::to_string(t.shape[2]) + ", " + std::to_string(t.shape[3]) + ")");
    }
    // The last element's address must exist: checked arithmetic, so that a huge stride
    // cannot wrap around and make the aliasing checks below compare wrong ranges.
    std::uint64_t extent = 1;  // elements from the first to one past the last
    for (int i = 0; i < 4; ++i) {
        std::uint64_t step = 0;
        if (__builtin_mul_overflow(static_cast<std::uint64_t>(t.shape[i] - 1),
                                   static_cast<std::uint64_t>(t.stride[i]), &step) ||
            __builtin_add_overflow(extent, step, &extent)) {
            extent = std::numeric_limits<std::uint64_t>::max();
            break;
        }
    }
    std::uint64_t end = 0;
    if (extent > std::numeric_limits<std::uint64_t>::max() / element_bytes(t.dtype) ||
        __builtin_add_overflow(reinterpret_cast<std::uintptr_t>(t.data),
                               extent * element_bytes(t.dtype), &end)) {
        fail(ErrorCode::invalid_argument, std::string(name) + ".stride",
             "strides whose last element lies inside the 64-bit address space",
             "(" + std::to_string(t.stride[0]) + ", " + std::to_string(t.stride[1]) + ", " +
                 std::to_string(t.stride[2]) + ", " + std::to_string(t.stride[3]) + ")");
    }
}

namespace {

// [first, last] bytes a tensor can touch.
std::pair<std::uintptr_t, std::uintptr_t> byte_range(const TensorView& t) {
    // Cannot overflow: check_layout bounded the extent.
    std::int64_t last = 0;
    for (int i = 0; i < 4; ++i)
        last += (t.shape[i] - 1) * t.stride[i];
    const auto first = reinterpret_cast<std::uintptr_t>(t.data);
    return {first, first + static_cast<std::uintptr_t>(last + 1) * element_bytes(t.dtype) - 1};
}

}  // namespace

bool overlap(const TensorView& a, const TensorView& b) {
    const auto [a0, a1] = byte_range(a);
    const auto [b0, b1] = byte_range(b);
    return a0 <= b1 && b0 <= a1;
}

namespace {

void check_output_does_not_self_overlap(const TensorView& o, const char* name) {
    std::array<int, 3> order = {0, 1, 2};
    std::sort(order.begin(), order.end(), [&](int x, int y) { return o.stride[x] < o.stride[y]; });
    std::int64_t extent = o.shape[3];  // elements covered by the dims already placed
    for (const int i : order) {
        if (o.shape[i] == 1)
            continue;
        if (o.stride[i] < extent) {
            fail(ErrorCode::invalid_argument, stride_name(name, i),
                 "at least " + std::to_string(extent) + " so that output elements do not alias",
                 std::to_string(o.stride[i]));
        }
        extent += o.stride[i] * (o.shape[i] - 1);  // bounded by check_layout
    }
}

void check_causal_alignment(CausalAlignment alignment) {
    if (alignment != CausalAlignment::bottom_right && alignment != CausalAlignment::top_left) {
        fail(ErrorCode::invalid_argument, "causal_alignment", "bottom_right or top_left",
             "enum value " + std::to_string(static_cast<int>(alignment)));
    }
}

void check_softmax_scale(std::optional<float> scale) {
    if (scale && !(std::isfinite(*scale) && *scale > 0 && *scale < k_max_softmax_scale)) {
        char given[32];
        std::snprintf(given, sizeof given, "%.6g", static_cast<double>(*scale));
        char bound[32];
        std::snprintf(bound, sizeof bound, "%.4g", k_max_softmax_scale);
        fail(ErrorCode::invalid_argument, "softmax_scale",
             std::string("a positive finite number below ") + bound +
                 " (scale * log2(e) must be a finite float)",
             given);
    }
}

void check_variants(const Variants& v, bool causal, float scale, std::int64_t heads) {
    for (const auto& [side, name] : {std::pair{v.window_left, "variants.window_left"},
                                     {v.window_right, "variants.window_right"}}) {
        if (side < -1) {
            fail(ErrorCode::invalid_argument, name, "-1 (unbounded) or a key count of 0 or more",
                 std::to_string(side));
        }
    }
    if (causal && v.window_right > 0) {
        fail(ErrorCode::invalid_argument, "variants.window_right",
             "-1 or 0 with causal (causal masking is window_right 0)",
             std::to_string(v.window_right));
    }
    // The kernels take scale / softcap as a float whose 0 means "off", and softcap * log2(e)
    // as the softmax's scale: both must be normal floats.
    constexpr float softcap_max = 1e6f;
    if (v.softcap != 0.0f &&
        !(std::isfinite(v.softcap) && v.softcap > 0.0f && v.softcap <= softcap_max &&
          scale / v.softcap >= std::numeric_limits<float>::min())) {
        char given[32];
        std::snprintf(given, sizeof given, "%.6g", static_cast<double>(v.softcap));
        fail(ErrorCode::invalid_argument, "variants.softcap",
             "0 (off) or a positive finite number up to 1e6 (and softmax_scale / softcap a normal "
             "float)",
             given);
    }
    if (reinterpret_cast<std::uintptr_t>(v.sinks) % alignof(float) != 0) {
        fail(ErrorCode::invalid_argument, "variants.sinks", "a 4-byte aligned address",
             "one that is not");
    }
    if (reinterpret_cast<std::uintptr_t>(v.alibi_slopes) % alignof(float) != 0) {
        fail(ErrorCode::invalid_argument, "variants.alibi_slopes", "a 4-byte aligned address",
             "one that is not");
    }
    if (v.alibi_batch_stride != 0 && v.alibi_batch_stride != heads) {
        fail(ErrorCode::invalid_argument, "variants.alibi_batch_stride",
             "0 (one slope a query head, shared by the batch) or the query heads " +
                 std::to_string(heads) + " ((batch, heads) slopes)",
             std::to_string(v.alibi_batch_stride));
    }
}

}  // namespace

void check_float_rows(const void* lse, const char* argument, std::int64_t count, const char* layout,
                      std::initializer_list<std::pair<const TensorView*, const char*>> tensors) {
    if (lse == nullptr)
        return;
    if (reinterpret_cast<std::uintptr_t>(lse) % alignof(float) != 0)
        fail(ErrorCode::invalid_argument, argument, "a 4-byte aligned address", "one that is not");
    // count is bounded (an output tensor's distinct elements, a page table's checked span):
    // count * 4 does not overflow.
    const auto first = reinterpret_cast<std::uintptr_t>(lse);
    std::uintptr_t last = 0;
    if (__builtin_add_overflow(first, static_cast<std::uintptr_t>(count) * 4 - 1, &last)) {
        fail(ErrorCode::invalid_argument, argument,
             std::string("an address whose ") + layout + " values fit the address space",
             "one too close to its end");
    }
    for (const auto& [t, name] : tensors) {
        if (t == nullptr)
            continue;
        const auto [t0, t1] = byte_range(*t);
        if (first <= t1 && t0 <= last) {
            fail(ErrorCode::invalid_argument, argument,
                 std::string("memory that does not overlap ") + name, "an overlapping range");
        }
    }
}

void check_words_apart(const void* a, std::int64_t a_count, const std::string& a_name,
                       const void* b, std::int64_t b_count, const char* b_name) {
    const auto a0 = reinterpret_cast<std::uintptr_t>(a);
    const auto b0 = reinterpret_cast<std::uintptr_t>(b);
    if (a0 != 0 && b0 != 0 && a0 < b0 + 4 * static_cast<std::uintptr_t>(b_count) &&
        b0 < a0 + 4 * static_cast<std::uintptr_t>(a_count)) {
        fail(ErrorCode::invalid_argument, a_name,
             std::string("memory that does not overlap ") + b_name, "an overlapping range");
    }
}

void check_variant_arrays_apart(
    const AttentionOptions& options, const std::string& prefix, std::int64_t heads,
    std::int64_t slope_rows,
    std::initializer_list<std::pair<const TensorView*, const char*>> written, const float* lse,
    std::int64_t lse_count) {
    const Variants& v = options.variants;
    const std::int64_t slopes = v.alibi_batch_stride != 0 ? slope_rows * heads : heads;
    const std::string sinks = prefix + "sinks", alibi = prefix + "alibi_slopes";
    check_float_rows(v.sinks, sinks.c_str(), heads, "(heads,)", written);
    check_float_rows(v.alibi_slopes, alibi.c_str(), slopes, "(heads,) or (batch, heads)", written);
    check_words_apart(v.sinks, heads, sinks, lse, lse_count, "lse");
    check_words_apart(v.alibi_slopes, slopes, alibi, lse, lse_count, "lse");
}

void check_output(const TensorView& out, const char* name,
                  std::initializer_list<std::pair<const TensorView*, const char*>> others) {
    for (const auto& [t, other] : others) {
        if (t != nullptr && overlap(out, *t)) {
            fail(ErrorCode::invalid_argument, name,
                 std::string("memory that does not overlap ") + other, "an overlapping range");
        }
    }
    check_output_does_not_self_overlap(out, name);
}

void check_options(const AttentionOptions& options, std::int64_t d_head, std::int64_t heads) {
    check_softmax_scale(options.softmax_scale);
    check_causal_alignment(options.causal_alignment);
    check_variants(options.variants, options.causal, options.scale(d_head), heads);
}

void check_outputs_and_options(
    const TensorView& o, std::initializer_list<std::pair<const TensorView*, const char*>> inputs,
    const AttentionOptions& options, std::int64_t lse_count, const char* lse_layout,
    std::int64_t d_head) {
    check_output(o, "o", inputs);
    check_float_rows(options.lse, "lse", lse_count, lse_layout, inputs);
    check_float_rows(options.lse, "lse", lse_count, lse_layout, {{&o, "o"}});
    check_options(options, d_head, o.shape[2]);
}

namespace {

std::string shape_value(std::int64_t v, const char* of) {
    return std::to_string(v) + " (" + of + ")";
}

}  // namespace

void check_dtype(const TensorView& t, const char* name, DType as) {
    const std::string argument = std::string(name) + ".dtype";
    if (is_dtype(t.dtype) && t.dtype != as) {
        fail(ErrorCode::dtype, argument, std::string(to_string(as)) + " (q's dtype)",
             std::string(to_string(t.dtype)));
    }
    if (t.dtype != DType::FP16 && t.dtype != DType::BF16)
        fail_not_16_bit(argument, t.dtype);
}

// forward()'s dtypes: FP16 or BF16 throughout, or FP8 attention's q, k and v in E4M3 with o in
// BF16; descales with E4M3 inputs only (16-bit ones need no dequantisation).
void check_attention_dtypes(const ForwardParams& p, const char* k_name, const char* v_name) {
    if (!is_dtype(p.q.dtype)) {
        fail(ErrorCode::dtype, "q.dtype", "FP16, BF16 or E4M3 (FP8 attention)",
             dtype_text(p.q.dtype));
    }
    if (p.q.dtype != DType::E4M3) {
        for (const auto& [t, name] :
             {std::pair{&p.q, "q"}, {&p.k, k_name}, {&p.v, v_name}, {&p.o, "o"}})
            check_dtype(*t, name, p.q.dtype);
        if (p.descales) {
            fail(ErrorCode::invalid_argument, "descales", "none for FP16/BF16 inputs",
                 "some with " + std::string(to_string(p.q.dtype)) + " inputs");
        }
        return;
    }
    for (const auto& [t, name] : {std::pair{&p.k, k_name}, {&p.v, v_name}}) {
        if (t->dtype != DType::E4M3) {
            fail(ErrorCode::dtype, std::string(name) + ".dtype",
                 "E4M3 (q's dtype: FP8 attention takes q, k and v in E4M3)", dtype_text(t->dtype));
        }
    }
    if (p.o.dtype != DType::BF16) {
        fail(ErrorCode::dtype, "o.dtype", "BF16 (FP8 attention's output)", dtype_text(p.o.dtype));
    }
}

namespace {

// FP8 attention takes no variants yet: each one set is unsupported, named under `prefix`.
void check_fp8_variants(const Variants& v, const std::string& prefix) {
    const auto refuse = [&](const char* field, const char* off, const std::string& given) {
        fail(ErrorCode::unsupported, prefix + field,
             std::string(off) + " (no variants with E4M3 inputs yet)", given);
    };
    if (v.window_left != -1)
        refuse("window_left", "-1", std::to_string(v.window_left));
    if (v.window_right != -1)
        refuse("window_right", "-1", std::to_string(v.window_right));
    if (v.softcap != 0.0f) {
        char given[32];
        std::snprintf(given, sizeof given, "%.6g", static_cast<double>(v.softcap));
        refuse("softcap", "0", given);
    }
    if (v.sinks != nullptr)
        refuse("sinks", "null", "a pointer");
    if (v.alibi_slopes != nullptr)
        refuse("alibi_slopes", "null", "a pointer");
}

}  // namespace

void check_fp8_device(const DeviceProperties& device, const char* argument) {
    if (device.major < 9) {
        fail(ErrorCode::unsupported, argument,
             "FP16 or BF16 on this GPU (FP8 attention, E4M3, runs on Hopper, compute capability "
             "9.0, and later)",
             "E4M3 on " + device.description());
    }
}

// FP8 attention's tensors beyond their dtypes: a head dim of its kernels', V's the same (no MLA
// yet), no variants, and the three descales, (batch, heads_kv) floats each (q's batch: a KV
// cache's entries or pages may be more), read while o is written.
void check_fp8_tensors(const ForwardParams& p) {
    if (!fp8_head_dim(p.q.shape[3])) {
        fail(ErrorCode::unsupported, shape_name("q", 3), fp8_head_dims_expected(),
             std::to_string(p.q.shape[3]));
    }
    if (p.v.shape[3] != p.q.shape[3]) {
        fail(ErrorCode::unsupported, shape_name("v", 3),
             shape_value(p.q.shape[3], "q's: no MLA with E4M3 inputs yet"),
             std::to_string(p.v.shape[3]));
    }
    check_fp8_variants(p.options.variants, "options.variants.");
    if (!p.descales) {
        fail(ErrorCode::invalid_argument, "descales",
             "q, k and v dequantisation factors (Fp8Descales) with E4M3 inputs", "none");
    }
    const std::int64_t factors = p.q.shape[0] * p.k.shape[2];
    for (const auto& [factor, name] : {std::pair{p.descales->q, "descales.q"},
                                       {p.descales->k, "descales.k"},
                                       {p.descales->v, "descales.v"}}) {
        if (factor == nullptr) {
            fail(ErrorCode::invalid_argument, name, "a device fp32 array of (batch, heads_kv)",
                 "a null pointer");
        }
        check_float_rows(factor, name, factors, "(batch, heads_kv)", {{&p.o, "o"}});
        // The LSE output too: early CTAs write it while later ones read their factors.
        if (p.options.lse != nullptr) {
            const auto lse = reinterpret_cast<std::uintptr_t>(p.options.lse);
            const auto lse_end =
                lse + static_cast<std::uintptr_t>(p.q.shape[0] * p.q.shape[2] * p.q.shape[1]) *
                          sizeof(float);
            const auto first = reinterpret_cast<std::uintptr_t>(factor);
            const auto end = first + static_cast<std::uintptr_t>(factors) * sizeof(float);
            if (first < lse_end && lse < end) {
                fail(ErrorCode::invalid_argument, name, "memory that does not overlap lse",
                     "an overlapping range");
            }
        }
    }
}

void validate_tensors(const ForwardParams& p) {
    check_attention_dtypes(p);
    const std::array<std::pair<const TensorView*, const char*>, 4> tensors = {
        {{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.o, "o"}}};
    for (const auto& [t, name] : tensors)
        check_layout(*t, name);

    // q, o: (batch, seq_q, heads_q, d); k, v: (batch, seq_k, heads_kv, d).
    const auto same = [](const TensorView& t, const char* name, int i, const TensorView& as,
                         const char* as_name) {
        if (t.shape[i] != as.shape[i]) {
            fail(ErrorCode::invalid_argument, shape_name(name, i),
                 shape_value(as.shape[i], (std::string(as_name) + "'s").c_str()),
                 std::to_string(t.shape[i]));
        }
    };
    for (const int i : {0, 3})
        same(p.k, "k", i, p.q, "q");
    same(p.v, "v", 0, p.q, "q");
    for (const int i : {0, 1, 2})
        same(p.o, "o", i, p.q, "q");
    same(p.o, "o", 3, p.v, "v");
    same(p.v, "v", 1, p.k, "k");
    same(p.v, "v", 2, p.k, "k");
    if (p.q.shape[2] % p.k.shape[2] != 0) {
        fail(ErrorCode::invalid_argument, shape_name("q", 2),
             "a multiple of k's heads " + std::to_string(p.k.shape[2]) +
                 " (grouped-query attention)",
             std::to_string(p.q.shape[2]));
    }
    if (p.q.dtype == DType::E4M3)
        check_fp8_tensors(p);
    if (!space::is_head_dim(p.q.shape[3])) {
        fail(ErrorCode::unsupported, shape_name("q", 3), space::head_dims_text(),
             std::to_string(p.q.shape[3]));
    }
    if (!space::is_value_dim(p.q.shape[3], p.v.shape[3])) {
        fail(ErrorCode::unsupported, shape_name("v", 3),
             space::value_dims_text(static_cast<int>(p.q.shape[3])), std::to_string(p.v.shape[3]));
    }
    const std::int64_t rows = p.q.shape[0] * p.q.shape[2] * p.q.shape[1];
    check_outputs_and_options(p.o, {{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}}, p.options, rows,
                              "(batch, heads, seq_q)", p.q.shape[3]);
    check_variant_arrays_apart(p.options, "variants.", p.q.shape[2], p.q.shape[0], {{&p.o, "o"}},
                               p.options.lse, rows);
}

namespace {

// A data-free problem's head dims and sizes, whatever its dtype.
void check_problem_sizes(const ProblemShape& s) {
    if (!space::is_head_dim(s.d_head))
        fail(ErrorCode::unsupported, "d_head", space::head_dims_text(), std::to_string(s.d_head));
    if (s.d_v != 0 && (s.d_v == s.d_head || !space::is_value_dim(s.d_head, s.d_v))) {
        fail(ErrorCode::unsupported, "d_v",
             "0 (V's head dim is d_head) or " + space::value_dim_pairs_text(),
             std::to_string(s.d_v));
    }
    const std::tuple<const char*, std::int64_t, std::int64_t> sizes[] = {
        {"batch", s.batch, k_max_batch},
        {"seq_q", s.seq_q, k_max_seq},
        {"seq_k", s.seq_k, k_max_seq},
        {"heads", s.heads, k_max_heads},
        {"heads_kv", s.heads_kv, k_max_heads}};
    for (const auto& [name, value, largest] : sizes) {
        if (value <= 0 || value > largest) {
            fail(ErrorCode::invalid_argument, name, "a size from 1 to " + std::to_string(largest),
                 std::to_string(value));
        }
    }
    if (s.heads % s.heads_kv != 0) {
        fail(ErrorCode::invalid_argument, "heads",
             "a multiple of heads_kv " + std::to_string(s.heads_kv) + " (grouped-query attention)",
             std::to_string(s.heads));
    }
}

}  // namespace

void validate_shape(const ProblemShape& s) {
    if (s.dtype != DType::FP16 && s.dtype != DType::BF16)
        fail_not_16_bit("dtype", s.dtype);
    check_problem_sizes(s);
}

void validate_forward_shape(const ProblemShape& s) {
    if (s.dtype == DType::E4M3) {
        // check_fp8_tensors' limits, as far as a shape tells them.
        if (!fp8_head_dim(s.d_head)) {
            fail(ErrorCode::unsupported, "d_head", fp8_head_dims_expected(),
                 std::to_string(s.d_head));
        }
        if (s.d_v != 0) {
            fail(ErrorCode::unsupported, "d_v",
                 "0 (V's head dim is d_head: no MLA with E4M3 inputs yet)", std::to_string(s.d_v));
        }
        if (s.window_or_softcap) {
            fail(ErrorCode::unsupported, "window_or_softcap",
                 "false (no variants with E4M3 inputs yet)", "true");
        }
    } else if (s.dtype != DType::FP16 && s.dtype != DType::BF16) {
        fail(ErrorCode::dtype, "dtype", "FP16, BF16 or E4M3 (FP8 attention)", dtype_text(s.dtype));
    }
    check_problem_sizes(s);
}

void validate(const ProblemShape& problem, std::optional<float> scale, const Variants& variants) {
    // The variants by name first: a shape says only that some are set (window_or_softcap).
    if (problem.dtype == DType::E4M3)
        check_fp8_variants(variants, "variants.");
    validate_forward_shape(problem);
    check_softmax_scale(scale);
    check_variants(variants, problem.causal,
                   AttentionOptions{.softmax_scale = scale}.scale(problem.d_head), problem.heads);
}

ProblemShape shape_of(const ForwardParams& p) {
    return {.dtype = p.q.dtype,
            .d_head = static_cast<int>(p.q.shape[3]),
            .batch = p.q.shape[0],
            .seq_q = p.q.shape[1],
            .seq_k = p.k.shape[1],
            .heads = p.q.shape[2],
            .heads_kv = p.k.shape[2],
            .causal = p.options.causal,
            .window_or_softcap = p.options.variants.changes_scores(),
            .d_v = value_dim_of(p.q, p.v)};
}

int value_dim_of(const TensorView& q, const TensorView& v) {
    return v.shape[3] == q.shape[3] ? 0 : static_cast<int>(v.shape[3]);
}

float AttentionOptions::scale(std::int64_t d_head) const {
    return softmax_scale ? *softmax_scale
                         : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_head)));
}

void check_dim(const TensorView& t, const char* name, int i, const char* dim_name,
               std::int64_t expected, const std::string& why) {
    if (t.shape[i] != expected) {
        fail(ErrorCode::invalid_argument,
             std::string(name) + ".shape[" + std::to_string(i) + "] (" + dim_name + ")",
             std::to_string(expected) + " (" + why + ")", std::to_string(t.shape[i]));
    }
}

void check_int_array(const std::int32_t* p, const char* name, bool required,
                     const std::string& needed_for) {
    if (p == nullptr) {
        if (required)
            fail(ErrorCode::invalid_argument, name, "a device int32 array " + needed_for, "null");
        return;
    }
    if (reinterpret_cast<std::uintptr_t>(p) % alignof(std::int32_t) != 0)
        fail(ErrorCode::invalid_argument, name, "a 4-byte aligned address", "one that is not");
}

void check_range(const char* name, std::int64_t value, std::int64_t lo, std::int64_t hi) {
    if (value < lo || value > hi) {
        fail(ErrorCode::invalid_argument, name,
             "a value from " + std::to_string(lo) + " to " + std::to_string(hi),
             std::to_string(value));
    }
}

}  // namespace flash_attention
