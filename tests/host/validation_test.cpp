// Every validation error, checked without a GPU: validate_tensors needs no device,
// and validate_config is given a device description.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>

#include "api/kernel_args.hpp"
#include "api/validate.hpp"
#include "flash_attention/flash_attention.hpp"
#include "registry/registry.hpp"
#include "support/built_configs.hpp"

namespace fa = flash_attention;

namespace {

// Fake, never dereferenced, 16-byte aligned device addresses far apart.
void* address(std::uintptr_t gib) {
    return reinterpret_cast<void*>(gib << 30);
}

fa::ForwardParams good_params(fa::DType dtype = fa::DType::BF16, std::int64_t d = 128) {
    const std::int64_t b = 2, s = 256, h = 4;
    return {fa::TensorView::contiguous(address(1), dtype, b, s, h, d),
            fa::TensorView::contiguous(address(2), dtype, b, s, h, d),
            fa::TensorView::contiguous(address(3), dtype, b, s, h, d),
            fa::TensorView::contiguous(address(4), dtype, b, s, h, d)};
}

// Applies `change` to good params and returns the validation error it causes.
fa::Error tensor_error(const std::function<void(fa::ForwardParams&)>& change) {
    fa::ForwardParams p = good_params();
    change(p);
    try {
        fa::validate_tensors(p);
    } catch (const fa::Error& e) {
        return e;
    }
    ADD_FAILURE() << "no error";
    return fa::Error(fa::ErrorCode::cuda, "");
}

void expect_error(const fa::Error& e, fa::ErrorCode code, const std::string& argument,
                  const std::string& given) {
    const std::string message = e.what();
    EXPECT_EQ(e.code(), code) << message;
    EXPECT_EQ(message.rfind(argument + ": expected ", 0), 0u) << message;
    EXPECT_NE(message.find(", got " + given), std::string::npos) << message;
}

const fa::DeviceProperties k_h100{0, "NVIDIA H100 80GB HBM3", 9, 0, 132, 232448};

}  // namespace

TEST(Validation, AcceptsContiguousAndStridedViews) {
    EXPECT_NO_THROW(fa::validate_tensors(good_params()));
    fa::ForwardParams p = good_params();
    p.q.stride = {1 << 20, 4096, 1024, 1};  // e.g. a slice of a packed QKV tensor
    EXPECT_NO_THROW(fa::validate_tensors(p));
}

TEST(Validation, Dtypes) {
    expect_error(tensor_error([](auto& p) { p.k.dtype = fa::DType::FP16; }), fa::ErrorCode::dtype,
                 "k.dtype", "FP16");
    expect_error(tensor_error([](auto& p) { p.o.dtype = static_cast<fa::DType>(9); }),
                 fa::ErrorCode::dtype, "o.dtype", "enum value 9");
}

TEST(Validation, Shapes) {
    expect_error(tensor_error([](auto& p) { p.k.shape[0] = 3; }), fa::ErrorCode::invalid_argument,
                 "k.shape[0] (batch)", "3");
    expect_error(tensor_error([](auto& p) { p.v.shape[2] = 5; }), fa::ErrorCode::invalid_argument,
                 "v.shape[2] (heads)", "5");
    expect_error(tensor_error([](auto& p) { p.v.shape[1] = 128; }), fa::ErrorCode::invalid_argument,
                 "v.shape[1] (seq)", "128");
    expect_error(tensor_error([](auto& p) { p.o.shape[1] = 128; }), fa::ErrorCode::invalid_argument,
                 "o.shape[1] (seq)", "128");
    expect_error(tensor_error([](auto& p) { p.q.shape[1] = 0; }), fa::ErrorCode::invalid_argument,
                 "q.shape[1] (seq)", "0");
    expect_error(tensor_error([](auto& p) {
                     p.q.shape[0] = 70000;
                     p.k.shape[0] = p.v.shape[0] = p.o.shape[0] = 70000;
                 }),
                 fa::ErrorCode::invalid_argument, "q.shape", "(70000, 256, 4, 128)");
}

TEST(Validation, HeadDim) {
    fa::ForwardParams p = good_params(fa::DType::FP16, 80);
    try {
        fa::validate_tensors(p);
        FAIL();
    } catch (const fa::Error& e) {
        expect_error(e, fa::ErrorCode::unsupported, "q.shape[3] (d_head)", "80");
        EXPECT_NE(std::string(e.what()).find("64, 96, 128, 192 or 256"), std::string::npos);
    }
    EXPECT_NO_THROW(fa::validate_tensors(good_params(fa::DType::BF16, 256)));
    EXPECT_NO_THROW(fa::validate_tensors(good_params(fa::DType::BF16, 192)));
    EXPECT_NO_THROW(fa::validate_tensors(good_params(fa::DType::BF16, 96)));
}

// V (and O) with a head dim of their own: 128 with d_head 192 (DeepSeek's MLA), and nothing
// else; O takes V's.
TEST(Validation, ValueHeadDim) {
    fa::ForwardParams p = good_params(fa::DType::BF16, 192);
    p.v.shape[3] = p.o.shape[3] = 128;
    p.v.stride = p.o.stride = {256 * 4 * 128, 4 * 128, 128, 1};
    EXPECT_NO_THROW(fa::validate_tensors(p));
    EXPECT_EQ(fa::shape_of(p).d_v, 128);
    EXPECT_EQ(fa::shape_of(good_params(fa::DType::BF16, 192)).d_v, 0);
    fa::ForwardParams wide_o = p;
    wide_o.o = good_params(fa::DType::BF16, 192).o;
    expect_error(tensor_error([&](auto& q) { q = wide_o; }), fa::ErrorCode::invalid_argument,
                 "o.shape[3] (d_v)", "192");
    fa::ForwardParams v64 = p;
    v64.v.shape[3] = v64.o.shape[3] = 64;
    expect_error(tensor_error([&](auto& q) { q = v64; }), fa::ErrorCode::unsupported,
                 "v.shape[3] (d_v)", "64");
    fa::ForwardParams d256 = good_params(fa::DType::BF16, 256);
    d256.v.shape[3] = d256.o.shape[3] = 128;
    try {
        fa::validate_tensors(d256);
        FAIL();
    } catch (const fa::Error& e) {
        expect_error(e, fa::ErrorCode::unsupported, "v.shape[3] (d_v)", "128");
        EXPECT_NE(std::string(e.what()).find("256 (q's d_head), or 128 with d_head 192"),
                  std::string::npos)
            << e.what();
    }
}

TEST(Validation, GroupedQueryHeads) {
    fa::ForwardParams p = good_params();  // 4 query heads
    p.k.shape[2] = p.v.shape[2] = 2;
    EXPECT_NO_THROW(fa::validate_tensors(p));
    p.k.shape[2] = p.v.shape[2] = 1;  // multi-query
    EXPECT_NO_THROW(fa::validate_tensors(p));
    expect_error(tensor_error([](auto& p) { p.k.shape[2] = p.v.shape[2] = 3; }),
                 fa::ErrorCode::invalid_argument, "q.shape[2] (heads)", "4");
    expect_error(tensor_error([](auto& p) { p.k.shape[2] = 2; }), fa::ErrorCode::invalid_argument,
                 "v.shape[2] (heads)", "4");
    expect_error(tensor_error([](auto& p) { p.o.shape[2] = 2; }), fa::ErrorCode::invalid_argument,
                 "o.shape[2] (heads)", "2");
}

TEST(Validation, CausalAndLogSumExp) {
    fa::ForwardParams p = good_params();
    p.options.causal = true;
    p.k.shape[1] = p.v.shape[1] = 100;  // seq_q > seq_k: some rows see no key, which is allowed
    EXPECT_NO_THROW(fa::validate_tensors(p));
    p.options.lse = static_cast<float*>(address(8));
    EXPECT_NO_THROW(fa::validate_tensors(p));
    expect_error(tensor_error([](auto& p) {
                     p.options.lse = reinterpret_cast<float*>(static_cast<char*>(address(8)) + 2);
                 }),
                 fa::ErrorCode::invalid_argument, "lse", "one that is not");
    expect_error(tensor_error([](auto& p) { p.options.lse = static_cast<float*>(p.o.data); }),
                 fa::ErrorCode::invalid_argument, "lse", "an overlapping range");
}

// Sliding window, softcap and sinks (issue 15): bad values name the field.
TEST(Validation, Variants) {
    fa::ForwardParams p = good_params();
    p.options.variants = {4096, 0, 50.0f, static_cast<const float*>(address(8))};
    p.options.causal = true;
    EXPECT_NO_THROW(fa::validate_tensors(p));
    p.options.variants = {0, 0, 0.0f, nullptr};  // a window of one key
    EXPECT_NO_THROW(fa::validate_tensors(p));
    expect_error(tensor_error([](auto& p) { p.options.variants.window_left = -2; }),
                 fa::ErrorCode::invalid_argument, "variants.window_left", "-2");
    expect_error(tensor_error([](auto& p) { p.options.variants.window_right = -5; }),
                 fa::ErrorCode::invalid_argument, "variants.window_right", "-5");
    expect_error(tensor_error([](auto& p) {
                     p.options.causal = true;
                     p.options.variants.window_right = 3;
                 }),
                 fa::ErrorCode::invalid_argument, "variants.window_right", "3");
    for (const float bad : {-1.0f, NAN, INFINITY, 2e6f}) {
        const fa::Error e = tensor_error([&](auto& p) { p.options.variants.softcap = bad; });
        EXPECT_EQ(std::string(e.what()).rfind("variants.softcap: expected ", 0), 0u) << e.what();
    }
    expect_error(tensor_error([](auto& p) {
                     p.options.variants.sinks =
                         reinterpret_cast<const float*>(static_cast<char*>(address(8)) + 2);
                 }),
                 fa::ErrorCode::invalid_argument, "variants.sinks", "one that is not");
    EXPECT_TRUE((fa::Variants{-1, 0, 0.0f, nullptr}.changes_scores()));
    EXPECT_TRUE((fa::Variants{-1, -1, 1.0f, nullptr}.changes_scores()));
    const fa::Variants sinks_only{-1, -1, 0.0f, static_cast<const float*>(address(8))};
    EXPECT_FALSE(sinks_only.changes_scores());
    EXPECT_TRUE(sinks_only.any());
    EXPECT_TRUE(fa::shape_of(p).window_or_softcap);  // p: a window of one key
    EXPECT_FALSE(fa::shape_of(good_params()).window_or_softcap);
}

// ALiBi: its slopes' alignment and batch stride (0 or the query heads) name their field; it
// changes the scores, so it routes as a window does.
TEST(Validation, Alibi) {
    fa::ForwardParams p = good_params();
    p.options.variants.alibi_slopes = static_cast<const float*>(address(8));
    EXPECT_NO_THROW(fa::validate_tensors(p));
    EXPECT_TRUE(p.options.variants.changes_scores());
    EXPECT_TRUE(fa::shape_of(p).window_or_softcap);
    p.options.variants.alibi_batch_stride = p.q.shape[2];
    EXPECT_NO_THROW(fa::validate_tensors(p));
    expect_error(tensor_error([](auto& p) {
                     p.options.variants.alibi_slopes =
                         reinterpret_cast<const float*>(static_cast<char*>(address(8)) + 2);
                 }),
                 fa::ErrorCode::invalid_argument, "variants.alibi_slopes", "one that is not");
    expect_error(tensor_error([](auto& p) {
                     p.options.variants.alibi_slopes = static_cast<const float*>(address(8));
                     p.options.variants.alibi_batch_stride = 3;
                 }),
                 fa::ErrorCode::invalid_argument, "variants.alibi_batch_stride", "3");
}

// The sinks and slopes every CTA reads lie apart from O and the LSE that other CTAs write:
// inside either, a CTA could read a value another had overwritten.
TEST(Validation, VariantArraysApartFromOutputs) {
    expect_error(tensor_error([](auto& p) {
                     p.options.variants.sinks = static_cast<const float*>(p.o.data) + 64;
                 }),
                 fa::ErrorCode::invalid_argument, "variants.sinks", "an overlapping range");
    static float lse[2 * 4 * 256];
    expect_error(tensor_error([](auto& p) {
                     p.options.lse = lse;
                     p.options.variants.alibi_slopes = lse + 100;
                 }),
                 fa::ErrorCode::invalid_argument, "variants.alibi_slopes", "an overlapping range");
    // (batch, heads) slopes end where the LSE begins: 2 x 4 floats with the batch stride, 4
    // without.
    expect_error(tensor_error([](auto& p) {
                     p.options.lse = lse + 8;
                     p.options.variants.alibi_slopes = lse + 1;
                     p.options.variants.alibi_batch_stride = 4;
                 }),
                 fa::ErrorCode::invalid_argument, "variants.alibi_slopes", "an overlapping range");
    fa::ForwardParams p = good_params();
    p.options.lse = lse + 8;
    p.options.variants.alibi_slopes = lse + 4;
    EXPECT_NO_THROW(fa::validate_tensors(p));
}

// The softcap's fixed reference (KernelArgs::softcap_fixed): taken exactly where the
// probabilities of every score in [-1, 1] (after the tanh), 2^((t - reference) * scale_log2),
// stay inside P's normal range and below the overflow margin, the largest at 2^0 when the
// span allows; row maxima otherwise.
TEST(KernelArgs, SoftcapFixedReference) {
    struct Range {
        fa::DType dtype;
        double bottom, top;  // the exponents allowed, kernel_args.hpp's margins included
        float largest_fixed;
    };
    for (const Range r :
         {Range{fa::DType::BF16, -125, 31, 54.0f}, Range{fa::DType::FP16, -13, 14, 9.3f}}) {
        for (const float softcap :
             {0.5f, 5.0f, 9.3f, 9.4f, 30.0f, 50.0f, 54.0f, 54.1f, 60.0f, 1e6f}) {
            fa::ForwardParams p = good_params(r.dtype);
            p.options.variants.softcap = softcap;
            const fa::KernelArgs a = fa::kernel_args(p, fa::DeviceProperties::model("h100"));
            EXPECT_EQ(a.softcap_fixed, softcap <= r.largest_fixed)
                << fa::to_string(r.dtype) << " softcap " << softcap;
            if (!a.softcap_fixed)
                continue;
            EXPECT_FLOAT_EQ(a.softmax_scale, softcap);
            const double l = a.scale_log2;
            const double high = (1 - a.softcap_reference) * l, low = (-1 - a.softcap_reference) * l;
            EXPECT_LE(high, r.top + 1e-3) << softcap;
            EXPECT_GE(low, r.bottom - 1e-3) << softcap;
            EXPECT_GE(high, -1e-3) << softcap;  // the top probability at least 2^0
        }
    }
    fa::ForwardParams p = good_params();
    EXPECT_FALSE(
        fa::kernel_args(p, fa::DeviceProperties::model("h100")).softcap_fixed);  // no softcap
}

// Causal tiles are numbered in sections of a power of two of K/V heads whose K/V fits a third of
// the L2 (H100: 16.7 MiB), whole K/V groups, at most every head of the batch; heads of fewer than 8
// query blocks, and non-causal tiles, head after head.
TEST(KernelArgs, SectionHeads) {
    const fa::DeviceProperties h100 = fa::DeviceProperties::model("h100");
    const auto sections = [&](std::int64_t batch, std::int64_t seq, std::int64_t heads,
                              std::int64_t heads_kv, std::int64_t d, bool causal, int B_r = 128) {
        fa::ForwardParams p = good_params();
        p.q = fa::TensorView::contiguous(address(1), fa::DType::BF16, batch, seq, heads, d);
        p.k = fa::TensorView::contiguous(address(2), fa::DType::BF16, batch, seq, heads_kv, d);
        p.v = p.k;
        p.o = p.q;
        p.options.causal = causal;
        return fa::section_heads(p, B_r, h100);
    };
    EXPECT_EQ(sections(2, 8192, 8, 8, 256, false), 1);
    EXPECT_EQ(sections(2, 8192, 8, 8, 256, true), 2);         // 8 MiB a head
    EXPECT_EQ(sections(1, 16384, 8, 8, 256, true), 1);        // 16 MiB
    EXPECT_EQ(sections(1, 65536, 8, 8, 256, true), 1);        // 64 MiB: never below one head
    EXPECT_EQ(sections(4, 4096, 16, 16, 128, true), 8);       // 2 MiB: 8, not 8.3
    EXPECT_EQ(sections(8, 2048, 32, 32, 64, true), 32);       // 512 KiB: 32, not 33
    EXPECT_EQ(sections(1, 1024, 8, 8, 128, true), 8);         // every head of the batch
    EXPECT_EQ(sections(32, 1000, 32, 32, 64, true), 1);       // 7.8 query blocks of 128 rows
    EXPECT_EQ(sections(16, 1024, 32, 32, 64, true, 192), 1);  // 6 blocks of 192 rows
    EXPECT_EQ(sections(8, 2048, 32, 32, 64, true, 192), 32);  // 11
    EXPECT_EQ(sections(1, 32768, 32, 8, 128, true), 4);       // one K/V head's four query heads
    EXPECT_EQ(sections(1, 8192, 32, 8, 128, true), 16);       // 4 MiB: four K/V heads
}

TEST(Validation, StridesAndAlignment) {
    expect_error(tensor_error([](auto& p) { p.q.stride[3] = 2; }), fa::ErrorCode::invalid_argument,
                 "q.stride[3] (d_head)", "2");
    expect_error(tensor_error([](auto& p) { p.k.stride[1] = 516; }),
                 fa::ErrorCode::invalid_argument, "k.stride[1] (seq)", "516");
    expect_error(tensor_error([](auto& p) { p.v.stride[0] = -8; }), fa::ErrorCode::invalid_argument,
                 "v.stride[0] (batch)", "-8");
    expect_error(tensor_error([](auto& p) { p.q.data = static_cast<char*>(p.q.data) + 8; }),
                 fa::ErrorCode::invalid_argument, "q.data", "one that is not");
    expect_error(tensor_error([](auto& p) { p.v.data = nullptr; }), fa::ErrorCode::invalid_argument,
                 "v.data", "a null pointer");
}

TEST(Validation, OutputMayNotAliasInputsOrItself) {
    expect_error(tensor_error([](auto& p) { p.o.data = p.q.data; }),
                 fa::ErrorCode::invalid_argument, "o", "an overlapping range");
    expect_error(tensor_error([](auto& p) { p.o.stride[1] = 0; }), fa::ErrorCode::invalid_argument,
                 "o.stride[1] (seq)", "0");
}

// (shape - 1) * stride wrapped around: o at q's address with a huge batch stride passed
// the aliasing check.
TEST(Validation, HugeStridesCannotWrapTheAliasingCheck) {
    expect_error(tensor_error([](auto& p) {
                     p.o.data = p.q.data;
                     p.o.shape[0] = 3;
                     p.o.stride[0] = std::int64_t{1} << 62;
                     p.q.shape[0] = p.k.shape[0] = p.v.shape[0] = 3;
                 }),
                 fa::ErrorCode::invalid_argument, "o.stride", "(4611686018427387904, 512, 128, 1)");
    // Large but representable: the ranges are exact, and the overlap is found.
    expect_error(tensor_error([](auto& p) {
                     p.o.data = p.q.data;
                     p.o.stride[0] = std::int64_t{1} << 40;
                 }),
                 fa::ErrorCode::invalid_argument, "o", "an overlapping range");
}

// 2^31 - 1 rows passed validation, and 32-bit positions in the kernels wrapped: zeros and
// LSE -inf with no error (K/V broadcast with stride 0 costs no memory).
TEST(Validation, SequenceLengthsStayInsideTheKernelsRange) {
    expect_error(tensor_error([](auto& p) {
                     p.k.shape[1] = p.v.shape[1] = std::numeric_limits<int>::max();
                     p.k.stride[1] = p.v.stride[1] = 0;
                 }),
                 fa::ErrorCode::invalid_argument, "k.shape", "(2, 2147483647, 4, 128)");
    EXPECT_NO_THROW(fa::validate_tensors([] {
        fa::ForwardParams p = good_params();
        p.k.shape[1] = p.v.shape[1] = std::int64_t{1} << 30;
        p.k.stride[1] = p.v.stride[1] = 0;
        return p;
    }()));
    fa::ProblemShape shape;
    shape.seq_k = std::int64_t{1} << 31;
    EXPECT_THROW(fa::validate_shape(shape), fa::Error);
}

// Strides of 2^39 elements and more passed, then cuTensorMapEncodeTiled failed as a CUDA
// error: TMA takes strides below 2^40 bytes, so the sm80 family runs such tensors.
TEST(Validation, StridesBeyondTmaFallBackToTheSm80Family) {
    fa::ForwardParams p = good_params();
    EXPECT_TRUE(fa::tma_problem(p).empty());
    p.k.stride[0] = std::int64_t{1} << 39;  // 2^40 bytes
    const std::string problem = fa::tma_problem(p);
    EXPECT_NE(problem.find("k.stride[0] (batch): expected a stride below 2^40 bytes"),
              std::string::npos)
        << problem;
    p.k.shape[0] = p.q.shape[0] = p.v.shape[0] = p.o.shape[0] = 1;  // never stepped along
    EXPECT_TRUE(fa::tma_problem(p).empty());
}

TEST(Validation, Scale) {
    // scale * log2(e) overflowed to inf in the kernels: every row came out NaN.
    expect_error(tensor_error([](auto& p) { p.options.softmax_scale = 3e38f; }),
                 fa::ErrorCode::invalid_argument, "softmax_scale", "3e+38");
    EXPECT_NO_THROW(fa::validate_tensors([] {
        fa::ForwardParams p = good_params();
        p.options.softmax_scale = 1e38f;
        return p;
    }()));
    expect_error(tensor_error([](auto& p) {
                     p.options.softmax_scale = std::numeric_limits<float>::infinity();
                 }),
                 fa::ErrorCode::invalid_argument, "softmax_scale", "inf");
    EXPECT_FLOAT_EQ(fa::AttentionOptions{}.scale(128), 1.0f / std::sqrt(128.0f));
}

TEST(Validation, CausalAlignment) {
    expect_error(tensor_error([](auto& p) { p.options.causal_alignment = fa::CausalAlignment{7}; }),
                 fa::ErrorCode::invalid_argument, "causal_alignment", "enum value 7");
    EXPECT_FLOAT_EQ(fa::AttentionOptions{.softmax_scale = 0.5f}.scale(128), 0.5f);
}

TEST(Validation, Config) {
    ASSERT_FALSE(fa::configs().empty());
    const auto expect_config_error = [&](const fa::ForwardParams& params, const fa::KernelConfig& c,
                                         fa::ErrorCode code, const std::string& argument,
                                         const std::string& given) {
        try {
            fa::validate_config(params, c, k_h100);
            ADD_FAILURE() << "no error for " << c.to_string();
        } catch (const fa::Error& e) {
            expect_error(e, code, argument, given);
        }
    };
    if (fa::testing::any_forward_config() == nullptr)
        GTEST_SKIP() << "this build has no 16-bit forward config";
    fa::KernelConfig built = *fa::testing::any_forward_config();
    fa::ForwardParams matching = good_params(built.dtype, built.d_head);
    EXPECT_NO_THROW(fa::validate_config(matching, built, k_h100));

    fa::KernelConfig other_dtype = built;
    other_dtype.dtype = built.dtype == fa::DType::FP16 ? fa::DType::BF16 : fa::DType::FP16;
    expect_config_error(matching, other_dtype, fa::ErrorCode::invalid_argument, "config",
                        other_dtype.to_string());

    fa::KernelConfig invalid = built;
    invalid.n_warps = 3;
    expect_config_error(matching, invalid, fa::ErrorCode::not_built, "config", invalid.to_string());

    // Any sequence lengths: partial tiles are masked inside the kernel.
    fa::ForwardParams odd = matching;
    odd.q.shape[1] = odd.o.shape[1] = built.B_r + 17;
    odd.k.shape[1] = odd.v.shape[1] = built.B_c * 3 + 5;
    EXPECT_NO_THROW(fa::validate_config(odd, built, k_h100));

    fa::DeviceProperties small = k_h100;
    small.smem_per_block_optin = 1024;
    try {
        fa::validate_config(matching, built, small);
        ADD_FAILURE();
    } catch (const fa::Error& e) {
        EXPECT_EQ(e.code(), fa::ErrorCode::unsupported);
    }
}

TEST(Validation, ConfigNotBuilt) {
    // A valid config that no kernel set builds (B_c = 16 with Q held whole).
    const fa::KernelConfig c =
        fa::KernelConfig::parse("(BF16, 128, 64, 16, 4): async+load_0_1_1_tiles");
    if (fa::is_built(c))
        GTEST_SKIP() << "this build's kernel set holds " << c.to_string();
    try {
        fa::validate_config(good_params(), c, k_h100);
        FAIL();
    } catch (const fa::Error& e) {
        expect_error(e, fa::ErrorCode::not_built, "config", c.to_string());
        EXPECT_NE(std::string(e.what()).find("flash_attention list"), std::string::npos);
    }
}

// The checks of a problem that need neither tensors nor a GPU, through the public API: a
// command line judges its arguments with them before it looks for a GPU.
TEST(Validation, ProblemShapeAndOptionsWithoutTensors) {
    const fa::ProblemShape shape{.dtype = fa::DType::BF16, .d_head = 128, .seq_q = 64, .seq_k = 64};
    EXPECT_NO_THROW(fa::validate(shape));
    EXPECT_NO_THROW(fa::validate(shape, 0.5f, {.window_left = 8, .window_right = 8}));
    const auto message = [&](fa::ProblemShape s, std::optional<float> scale, fa::Variants v) {
        try {
            fa::validate(s, scale, v);
        } catch (const fa::Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    fa::ProblemShape d100 = shape;
    d100.d_head = 100;
    EXPECT_EQ(message(d100, std::nullopt, {}), "d_head: expected 64, 96, 128, 192 or 256, got 100");
    fa::ProblemShape mla = shape;
    mla.d_head = 192;
    mla.d_v = 128;
    EXPECT_EQ(message(mla, std::nullopt, {}), "no error");
    for (const int d_v : {192, 64, -1}) {
        mla.d_v = d_v;
        EXPECT_EQ(message(mla, std::nullopt, {}),
                  "d_v: expected 0 (V's head dim is d_head) or 128 with d_head 192, got " +
                      std::to_string(d_v));
    }
    EXPECT_GT(fa::k_max_softmax_scale, 2.35e38);  // float max / log2(e)
    EXPECT_LT(fa::k_max_softmax_scale, 2.36e38);
    for (const float scale : {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), 2.36e38f}) {
        EXPECT_EQ(message(shape, scale, {}).rfind("softmax_scale: expected", 0), 0u) << scale;
    }
    EXPECT_NO_THROW(fa::validate(shape, 2.35e38f));
    fa::ProblemShape causal = shape;
    causal.causal = true;
    EXPECT_EQ(message(causal, std::nullopt, {.window_left = 5, .window_right = 5})
                  .rfind("variants.window_right: expected -1 or 0 with causal", 0),
              0u);
}

// "Supported on the current device" is false when there is no device; it threw.
TEST(Validation, NothingIsSupportedWithoutADevice) {
    if (fa::device_count() > 0)
        GTEST_SKIP() << "needs a machine without a GPU";
    ASSERT_FALSE(fa::configs().empty());
    for (const fa::KernelConfig& c : fa::configs())
        EXPECT_FALSE(fa::is_supported(c)) << c.to_string();
}

namespace {

// Good backward params on fake addresses: the device check comes after every host check, so
// without a GPU a valid call fails with no_device and an invalid one with its own error.
fa::BackwardParams good_backward(std::int64_t heads_kv = 4) {
    const std::int64_t b = 2, s = 256, h = 4, d = 128;
    const auto t = [&](int slot, std::int64_t heads) {
        return fa::TensorView::contiguous(address(slot), fa::DType::BF16, b, s, heads, d);
    };
    fa::BackwardParams p{t(1, h), t(2, heads_kv), t(3, heads_kv), t(4, h),
                         t(5, h), t(6, h),        t(7, heads_kv), t(8, heads_kv)};
    p.options.lse = static_cast<float*>(address(9));
    return p;
}

fa::Error backward_error(const std::function<void(fa::BackwardParams&)>& change) {
    fa::BackwardParams p = good_backward();
    change(p);
    try {
        fa::backward(p);
    } catch (const fa::Error& e) {
        return e;
    }
    ADD_FAILURE() << "no error";
    return fa::Error(fa::ErrorCode::cuda, "");
}

}  // namespace

TEST(Validation, BackwardChecksEverythingBeforeTheDevice) {
    if (fa::device_count() == 0) {
        EXPECT_EQ(backward_error([](auto&) {}).code(), fa::ErrorCode::no_device);
    }
    expect_error(backward_error([](auto& p) { p.options.lse = nullptr; }),
                 fa::ErrorCode::invalid_argument, "options.lse", "a null pointer");
    expect_error(backward_error([](auto& p) {
                     p.options.causal = true;
                     p.options.variants.window_right = 5;
                 }),
                 fa::ErrorCode::invalid_argument, "variants.window_right", "5");
    expect_error(backward_error([](auto& p) { p.d_sinks = reinterpret_cast<float*>(256); }),
                 fa::ErrorCode::invalid_argument, "d_sinks", "a pointer");
    // d_sinks (written first) apart from the ALiBi slopes the main kernels read: the (batch,
    // heads) rows count with a batch stride, not without one.
    const auto slopes_then_sinks = [](fa::BackwardParams& p, std::int64_t stride) {
        static float sinks_and_slopes[12];
        p.options.variants.sinks = sinks_and_slopes;
        p.options.variants.alibi_slopes = sinks_and_slopes + 4;
        p.options.variants.alibi_batch_stride = stride;
        p.d_sinks = sinks_and_slopes + 8;
    };
    expect_error(backward_error([&](auto& p) {
                     slopes_then_sinks(p, 4);  // rows 4-7 and 8-11: d_sinks is the second
                 }),
                 fa::ErrorCode::invalid_argument, "d_sinks", "an overlapping range");
    expect_error(backward_error([&](auto& p) {
                     slopes_then_sinks(p, 0);
                     p.d_sinks = const_cast<float*>(p.options.variants.alibi_slopes);
                 }),
                 fa::ErrorCode::invalid_argument, "d_sinks", "an overlapping range");
    if (fa::device_count() == 0) {
        EXPECT_EQ(backward_error([&](auto& p) { slopes_then_sinks(p, 0); }).code(),
                  fa::ErrorCode::no_device);
    }
    expect_error(backward_error([](auto& p) { p.dk.shape[2] = 2; }),
                 fa::ErrorCode::invalid_argument, "dk.shape[2] (heads)", "2");
    expect_error(backward_error([](auto& p) { p.d_o.shape[1] = 255; }),
                 fa::ErrorCode::invalid_argument, "d_o.shape[1] (seq)", "255");
    expect_error(backward_error([](auto& p) { p.dq.dtype = fa::DType::FP16; }),
                 fa::ErrorCode::dtype, "dq.dtype", "FP16");
    expect_error(backward_error([](auto& p) { p.dv = p.dk; }), fa::ErrorCode::invalid_argument,
                 "dv", "an overlapping range");
    expect_error(backward_error([](auto& p) { p.dq = p.q; }), fa::ErrorCode::invalid_argument, "dq",
                 "an overlapping range");
    expect_error(backward_error([](auto& p) { p.options.lse = static_cast<float*>(p.dq.data); }),
                 fa::ErrorCode::invalid_argument, "options.lse", "an overlapping range");
    expect_error(backward_error([](auto& p) { p.options.softmax_scale = -1.0f; }),
                 fa::ErrorCode::invalid_argument, "softmax_scale", "-1");
    // The sinks and slopes apart from the gradients that other CTAs write.
    expect_error(backward_error([](auto& p) {
                     p.options.variants.sinks = static_cast<const float*>(p.dq.data);
                 }),
                 fa::ErrorCode::invalid_argument, "options.variants.sinks", "an overlapping range");
    expect_error(backward_error([](auto& p) {
                     p.options.variants.alibi_slopes = static_cast<const float*>(p.dk.data) + 4;
                 }),
                 fa::ErrorCode::invalid_argument, "options.variants.alibi_slopes",
                 "an overlapping range");
    // GQA: dK and dV have the K/V heads.
    fa::BackwardParams gqa = good_backward(1);
    if (fa::device_count() == 0) {
        try {
            fa::backward(gqa);
            ADD_FAILURE() << "no error";
        } catch (const fa::Error& e) {
            EXPECT_EQ(e.code(), fa::ErrorCode::no_device) << e.what();
        }
    }
}

namespace {

// Good packed backward params on fake addresses (three sequences of up to 100 rows in 256).
fa::VarlenBackwardParams good_varlen_backward() {
    const auto t = [&](int slot, std::int64_t heads) {
        return fa::TensorView::contiguous(address(slot), fa::DType::BF16, 1, 256, heads, 128);
    };
    fa::VarlenBackwardParams p;
    p.q = t(1, 4), p.k = t(2, 2), p.v = t(3, 2), p.o = t(4, 4), p.d_o = t(5, 4);
    p.dq = t(6, 4), p.dk = t(7, 2), p.dv = t(8, 2);
    p.options.lse = static_cast<float*>(address(9));
    p.cu_seqlens_q = static_cast<const std::int32_t*>(address(10));
    p.cu_seqlens_k = static_cast<const std::int32_t*>(address(11));
    p.batch = 3;
    p.max_seqlen_q = 100;
    p.max_seqlen_k = 100;
    return p;
}

fa::Error varlen_backward_error(const std::function<void(fa::VarlenBackwardParams&)>& change) {
    fa::VarlenBackwardParams p = good_varlen_backward();
    change(p);
    try {
        fa::backward_varlen(p);
    } catch (const fa::Error& e) {
        return e;
    }
    ADD_FAILURE() << "no error";
    return fa::Error(fa::ErrorCode::cuda, "");
}

}  // namespace

// backward_varlen: the dense checks on the packed views, then the sequences', before the device.
TEST(Validation, VarlenBackwardChecksEverythingBeforeTheDevice) {
    if (fa::device_count() == 0) {
        EXPECT_EQ(varlen_backward_error([](auto&) {}).code(), fa::ErrorCode::no_device);
    }
    // (batch, heads) ALiBi slopes count the call's sequences (3), not the packed view's one entry.
    expect_error(varlen_backward_error([](auto& p) {
                     static float sinks_and_slopes[16];
                     p.options.variants.sinks = sinks_and_slopes;
                     p.options.variants.alibi_slopes = sinks_and_slopes + 4;
                     p.options.variants.alibi_batch_stride = 4;
                     p.d_sinks = sinks_and_slopes + 12;  // the third sequence's slopes
                 }),
                 fa::ErrorCode::invalid_argument, "d_sinks", "an overlapping range");
    expect_error(varlen_backward_error([](auto& p) { p.q.shape[0] = 2; }),
                 fa::ErrorCode::invalid_argument, "q.shape[0] (batch)", "2");
    expect_error(varlen_backward_error([](auto& p) { p.cu_seqlens_q = nullptr; }),
                 fa::ErrorCode::invalid_argument, "cu_seqlens_q", "null");
    // The lengths are read while other CTAs write the gradients.
    expect_error(varlen_backward_error([](auto& p) {
                     p.seqused_k = static_cast<const std::int32_t*>(p.dk.data) + 8;
                 }),
                 fa::ErrorCode::invalid_argument, "seqused_k", "an overlapping range");
    expect_error(varlen_backward_error([](auto& p) { p.cu_seqlens_k = nullptr; }),
                 fa::ErrorCode::invalid_argument, "cu_seqlens_k", "null");
    // d_sinks, written first, apart from the lengths the main kernels read after it.
    expect_error(varlen_backward_error([](auto& p) {
                     static float sinks[16];
                     p.options.variants.sinks = sinks;
                     p.d_sinks = const_cast<float*>(reinterpret_cast<const float*>(p.cu_seqlens_k));
                 }),
                 fa::ErrorCode::invalid_argument, "d_sinks", "an overlapping range");
    expect_error(varlen_backward_error([](auto& p) { p.max_seqlen_q = 257; }),
                 fa::ErrorCode::invalid_argument, "max_seqlen_q", "257");
    expect_error(varlen_backward_error([](auto& p) { p.batch = 0; }),
                 fa::ErrorCode::invalid_argument, "batch", "0");
    expect_error(varlen_backward_error([](auto& p) { p.options.lse = nullptr; }),
                 fa::ErrorCode::invalid_argument, "options.lse", "a null pointer");
    expect_error(varlen_backward_error([](auto& p) { p.dk = p.dv; }),
                 fa::ErrorCode::invalid_argument, "dv", "an overlapping range");
}

// The backward's workspace grows with the sequence, never with its square: D (sm80), plus the
// LSE in base 2 and dQ's fp32 accumulator on 128-row padded rows (sm90), plus a semaphore per 64
// rows when ordered, or two words on the dynamic schedule.
TEST(Validation, BackwardWorkspaceIsLinearInTheSequence) {
    const auto shape = [](int seq) {
        return fa::ProblemShape{.dtype = fa::DType::BF16,
                                .d_head = 128,
                                .batch = 2,
                                .seq_q = seq,
                                .seq_k = seq,
                                .heads = 16,
                                .heads_kv = 4,
                                .causal = true};
    };
    const auto sm80 = fa::KernelConfig::parse("(BF16, 128, 64, 64, 8): bwd+async+swizzled");
    const auto sm90 = fa::KernelConfig::parse("(BF16, 128, 64, 128, 12): sm90+bwd+stages_2");
    const auto ordered =
        fa::KernelConfig::parse("(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+ordered");
    const std::size_t rows = 2 * 16;  // (batch, head) pairs
    EXPECT_EQ(fa::backward_workspace_bytes(shape(1000), sm80), rows * 1000 * 4);
    // 1000 rows padded to 1024: D, the LSE and 128 accumulator floats a row.
    EXPECT_EQ(fa::backward_workspace_bytes(shape(1000), sm90), rows * 1024 * (2 + 128) * 4);
    EXPECT_EQ(fa::backward_workspace_bytes(shape(1000), ordered),
              rows * 1024 * (2 + 128) * 4 + rows * 1024 / 64 * 4);
    // The dynamic schedule's counter (and a word of padding) on top.
    const auto dynamic =
        fa::KernelConfig::parse("(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic");
    EXPECT_EQ(fa::backward_workspace_bytes(shape(1000), dynamic),
              rows * 1024 * (2 + 128) * 4 + 2 * 4);
    // d_head 96: the accumulator's rows are its tiles' 96 columns (64-byte swizzle, no padding).
    fa::ProblemShape d96 = shape(1000);
    d96.d_head = 96;
    EXPECT_EQ(fa::backward_workspace_bytes(
                  d96, fa::KernelConfig::parse("(BF16, 96, 64, 128, 12): sm90+bwd+stages_2")),
              rows * 1024 * (2 + 96) * 4);
    // The number is the config's: one of another problem is refused, not sized.
    for (const auto& [config, what] :
         {std::pair{fa::KernelConfig::parse("(BF16, 128, 128, 128, 12): sm90+stages_2"),
                    std::string("a backward config")},
          {fa::KernelConfig::parse("(FP16, 128, 64, 128, 12): sm90+bwd+stages_2"),
           std::string("dtype BF16")},
          {fa::KernelConfig::parse("(BF16, 64, 128, 128, 12): sm90+bwd+stages_2"),
           std::string("d_head 128")}}) {
        try {
            fa::backward_workspace_bytes(shape(1000), config);
            ADD_FAILURE() << config.to_string();
        } catch (const fa::Error& e) {
            EXPECT_EQ(e.code(), fa::ErrorCode::invalid_argument);
            EXPECT_NE(std::string(e.what()).find("config: expected " + what), std::string::npos)
                << e.what();
        }
    }
    for (const auto& c : {sm80, sm90, ordered}) {
        EXPECT_EQ(fa::backward_workspace_bytes(shape(16384), c),
                  2 * fa::backward_workspace_bytes(shape(8192), c))
            << c.to_string();
    }
    // Stream-K adds its slots and counters where it splits the shape on this device (none
    // causal, none without a GPU): at most two slots an SM of 128 x (128 + 128) floats and an int
    // for 4/3 of the SMs, whatever the length.
    const auto lagdq = fa::KernelConfig::parse(
        "(BF16, 128, 64, 128, 12): sm90+bwd+stages_2+persistent+dynamic+lagdq");
    fa::KernelConfig streamk = lagdq;
    streamk.sm90.stream_k = true;
    EXPECT_EQ(fa::backward_workspace_bytes(shape(1000), streamk),
              fa::backward_workspace_bytes(shape(1000), lagdq));
    for (const int seq : {1000, 8192}) {
        fa::ProblemShape dense = shape(seq);
        dense.causal = false;
        const std::size_t extra = fa::backward_workspace_bytes(dense, streamk) -
                                  fa::backward_workspace_bytes(dense, lagdq);
        if (fa::device_count() == 0) {
            EXPECT_EQ(extra, 0u);
        } else {
            const auto sms = static_cast<std::size_t>(fa::DeviceProperties::current().sm_count);
            EXPECT_LE(extra, (2 * 128 * 256 + 2) * sms * 4) << "seq " << seq;
        }
    }
}

// Handing the pool's memory back before any call (without a GPU too) does nothing, and says
// nothing.
TEST(Validation, ReleasingCachedMemoryBeforeAnyCallDoesNothing) {
    EXPECT_NO_THROW(fa::release_cached_memory());
}

namespace {

// Well-formed FP8 attention on fake addresses: q, k and v E4M3, o BF16, and the descales.
fa::ForwardParams fp8_params() {
    const std::int64_t b = 2, s = 256, h = 4, d = 128;
    fa::ForwardParams p{fa::TensorView::contiguous(address(1), fa::DType::E4M3, b, s, h, d),
                        fa::TensorView::contiguous(address(2), fa::DType::E4M3, b, s, h, d),
                        fa::TensorView::contiguous(address(3), fa::DType::E4M3, b, s, h, d),
                        fa::TensorView::contiguous(address(4), fa::DType::BF16, b, s, h, d)};
    p.descales = fa::Fp8Descales{static_cast<const float*>(address(5)),
                                 static_cast<const float*>(address(6)),
                                 static_cast<const float*>(address(7))};
    return p;
}

fa::Error fp8_error(const std::function<void(fa::ForwardParams&)>& change) {
    return tensor_error([&](fa::ForwardParams& p) {
        p = fp8_params();
        change(p);
    });
}

// The error validate() gives a data-free problem.
fa::Error problem_error(const fa::ProblemShape& s, const fa::Variants& v = {}) {
    try {
        fa::validate(s, std::nullopt, v);
    } catch (const fa::Error& e) {
        return e;
    }
    ADD_FAILURE() << "no error";
    return fa::Error(fa::ErrorCode::cuda, "");
}

}  // namespace

// FP8 attention as forward() takes it: E4M3 inputs at d_head 128 with a BF16 output and the
// descales, with causal masking, GQA and the LSE; the data-free check accepts its shape. The
// descales reach the kernels; 16-bit calls hand them nulls.
TEST(Validation, Fp8AcceptsWellFormedInputs) {
    EXPECT_NO_THROW(fa::validate_tensors(fp8_params()));
    fa::ForwardParams p = fp8_params();
    p.options.causal = true;
    p.options.causal_alignment = fa::CausalAlignment::top_left;
    p.k.shape[1] = p.v.shape[1] = 1000;
    p.k.shape[2] = p.v.shape[2] = 1;
    p.k.stride = p.v.stride = {1000 * 128, 128, 128, 1};
    p.options.lse = static_cast<float*>(address(8));
    EXPECT_NO_THROW(fa::validate_tensors(p));
    EXPECT_EQ(fa::shape_of(p).dtype, fa::DType::E4M3);
    const fa::ProblemShape shape{
        .dtype = fa::DType::E4M3, .d_head = 128, .seq_q = 4096, .seq_k = 4096, .causal = true};
    EXPECT_NO_THROW(fa::validate(shape));

    const fa::DeviceProperties h100 = fa::DeviceProperties::model("h100");
    const fa::KernelArgs a = fa::kernel_args(fp8_params(), h100);
    EXPECT_EQ(a.q_descale, address(5));
    EXPECT_EQ(a.k_descale, address(6));
    EXPECT_EQ(a.v_descale, address(7));
    const fa::KernelArgs plain = fa::kernel_args(good_params(), h100);
    EXPECT_EQ(plain.q_descale, nullptr);
    EXPECT_EQ(plain.k_descale, nullptr);
    EXPECT_EQ(plain.v_descale, nullptr);
}

// q, k and v all E4M3 with o BF16; 16-bit q with an E4M3 tensor is a mix of dtypes.
TEST(Validation, Fp8Dtypes) {
    expect_error(fp8_error([](auto& p) { p.k.dtype = fa::DType::FP16; }), fa::ErrorCode::dtype,
                 "k.dtype", "FP16");
    expect_error(fp8_error([](auto& p) { p.v.dtype = fa::DType::BF16; }), fa::ErrorCode::dtype,
                 "v.dtype", "BF16");
    expect_error(fp8_error([](auto& p) { p.k.dtype = p.v.dtype = fa::DType::BF16; }),
                 fa::ErrorCode::dtype, "k.dtype", "BF16");
    for (const fa::DType o : {fa::DType::E4M3, fa::DType::FP16}) {
        const fa::Error e = fp8_error([&](auto& p) { p.o.dtype = o; });
        expect_error(e, fa::ErrorCode::dtype, "o.dtype", std::string(fa::to_string(o)));
        EXPECT_NE(std::string(e.what()).find("expected BF16"), std::string::npos) << e.what();
    }
    expect_error(fp8_error([](auto& p) { p.o.dtype = static_cast<fa::DType>(9); }),
                 fa::ErrorCode::dtype, "o.dtype", "enum value 9");
    const fa::Error mixed = tensor_error([](auto& p) { p.v.dtype = fa::DType::E4M3; });
    expect_error(mixed, fa::ErrorCode::dtype, "v.dtype", "E4M3");
    EXPECT_NE(std::string(mixed.what()).find("expected BF16 (q's dtype)"), std::string::npos)
        << mixed.what();
    // One byte an element: rows 16-byte aligned take strides of 16 elements.
    expect_error(fp8_error([](auto& p) { p.k.stride[1] = 520; }), fa::ErrorCode::invalid_argument,
                 "k.stride[1] (seq)", "520");
}

// The descales: required with E4M3 inputs (every pointer, 4-byte aligned, apart from o and the
// LSE), refused
// with 16-bit ones.
TEST(Validation, Fp8Descales) {
    expect_error(fp8_error([](auto& p) { p.descales.reset(); }), fa::ErrorCode::invalid_argument,
                 "descales", "none");
    expect_error(fp8_error([](auto& p) { p.descales->q = nullptr; }),
                 fa::ErrorCode::invalid_argument, "descales.q", "a null pointer");
    expect_error(fp8_error([](auto& p) { p.descales->k = nullptr; }),
                 fa::ErrorCode::invalid_argument, "descales.k", "a null pointer");
    expect_error(fp8_error([](auto& p) {
                     p.descales->v =
                         reinterpret_cast<const float*>(static_cast<char*>(address(7)) + 2);
                 }),
                 fa::ErrorCode::invalid_argument, "descales.v", "one that is not");
    expect_error(fp8_error([](auto& p) { p.descales->k = static_cast<const float*>(p.o.data); }),
                 fa::ErrorCode::invalid_argument, "descales.k", "an overlapping range");
    // The LSE output, written while the factors are read.
    expect_error(fp8_error([](auto& p) {
                     p.options.lse = static_cast<float*>(address(8));
                     p.descales->v = p.options.lse + 3;
                 }),
                 fa::ErrorCode::invalid_argument, "descales.v", "an overlapping range");
    for (const fa::DType dtype : {fa::DType::FP16, fa::DType::BF16}) {
        const fa::Error e = tensor_error([&](auto& p) {
            p = good_params(dtype);
            p.descales = fp8_params().descales;
        });
        expect_error(e, fa::ErrorCode::invalid_argument, "descales",
                     "some with " + std::string(fa::to_string(dtype)) + " inputs");
        EXPECT_NE(std::string(e.what()).find("none for FP16/BF16 inputs"), std::string::npos)
            << e.what();
    }
}

// FP8 attention takes no variants, no V head dim of its own and d_head 64, 128 or 256 only, yet:
// each is unsupported, naming the option or dimension.
TEST(Validation, Fp8Unsupported) {
    const auto unsupported = [](const std::function<void(fa::ForwardParams&)>& change,
                                const std::string& argument, const std::string& given) {
        expect_error(fp8_error(change), fa::ErrorCode::unsupported, argument, given);
    };
    unsupported([](auto& p) { p.options.variants.window_left = 64; },
                "options.variants.window_left", "64");
    unsupported(
        [](auto& p) {
            p.options.causal = true;
            p.options.variants.window_right = 0;
        },
        "options.variants.window_right", "0");
    unsupported([](auto& p) { p.options.variants.softcap = 30.0f; }, "options.variants.softcap",
                "30");
    unsupported([](auto& p) { p.options.variants.sinks = static_cast<const float*>(address(8)); },
                "options.variants.sinks", "a pointer");
    unsupported(
        [](auto& p) { p.options.variants.alibi_slopes = static_cast<const float*>(address(8)); },
        "options.variants.alibi_slopes", "a pointer");
    unsupported([](auto& p) { p.v.shape[3] = p.o.shape[3] = 64; }, "v.shape[3] (d_v)", "64");
    for (const std::int64_t d : {96, 192, 80}) {
        const fa::Error e = fp8_error([&](auto& p) {
            for (fa::TensorView* t : {&p.q, &p.k, &p.v, &p.o}) {
                *t = fa::TensorView::contiguous(t->data, t->dtype, 2, 256, 4, d);
            }
        });
        expect_error(e, fa::ErrorCode::unsupported, "q.shape[3] (d_head)", std::to_string(d));
        EXPECT_NE(std::string(e.what()).find("expected 64, 128 or 256 (the FP8 kernels' head dims"),
                  std::string::npos)
            << e.what();
    }
}

// The data-free check (validate(), choose_config's and chosen_kernel's) takes FP8's limits as
// the tensors' check does; the automatic choice names E4M3 when no built kernel runs it.
TEST(Validation, Fp8ProblemShapeWithoutTensors) {
    const fa::ProblemShape fp8{.dtype = fa::DType::E4M3, .d_head = 128, .seq_q = 64, .seq_k = 64};
    const auto changed = [&](const std::function<void(fa::ProblemShape&)>& change) {
        fa::ProblemShape s = fp8;
        change(s);
        return s;
    };
    const fa::Error d96 = problem_error(changed([](auto& s) { s.d_head = 96; }));
    expect_error(d96, fa::ErrorCode::unsupported, "d_head", "96");
    EXPECT_NE(std::string(d96.what()).find("expected 64, 128 or 256 (the FP8 kernels' head dims"),
              std::string::npos)
        << d96.what();
    expect_error(problem_error(changed([](auto& s) { s.d_v = 64; })), fa::ErrorCode::unsupported,
                 "d_v", "64");
    expect_error(problem_error(changed([](auto& s) { s.window_or_softcap = true; })),
                 fa::ErrorCode::unsupported, "window_or_softcap", "true");
    expect_error(problem_error(fp8, {.softcap = 30.0f}), fa::ErrorCode::unsupported,
                 "variants.softcap", "30");
    expect_error(problem_error(fp8, {.window_left = 8}), fa::ErrorCode::unsupported,
                 "variants.window_left", "8");
    expect_error(problem_error(changed([](auto& s) { s.dtype = static_cast<fa::DType>(7); })),
                 fa::ErrorCode::dtype, "dtype", "enum value 7");

    const fa::DeviceProperties h100 = fa::DeviceProperties::model("h100");
    try {
        const fa::KernelConfig c = fa::choose_config(fp8, h100);
        EXPECT_EQ(c.dtype, fa::DType::E4M3) << c.to_string();
    } catch (const fa::Error& e) {
        EXPECT_EQ(e.code(), fa::ErrorCode::unsupported) << e.what();
        EXPECT_NE(std::string(e.what()).find("got E4M3 d_head 128"), std::string::npos) << e.what();
    }
    try {
        fa::choose_config(changed([](auto& s) { s.d_head = 96; }), h100);
        ADD_FAILURE() << "no error";
    } catch (const fa::Error& e) {
        expect_error(e, fa::ErrorCode::unsupported, "d_head", "96");
    }
}

// A named config runs E4M3 tensors when it is an E4M3 one: another dtype's is the caller's error,
// and an E4M3 config this build lacks is not_built.
TEST(Validation, Fp8NamedConfig) {
    const fa::KernelConfig bf16 =
        fa::KernelConfig::parse("(BF16, 128, 128, 128, 12): sm90+stages_2");
    try {
        fa::validate_config(fp8_params(), bf16, k_h100);
        ADD_FAILURE() << "no error";
    } catch (const fa::Error& e) {
        expect_error(e, fa::ErrorCode::invalid_argument, "config", bf16.to_string());
        EXPECT_NE(std::string(e.what()).find("dtype E4M3 (the tensors')"), std::string::npos)
            << e.what();
    }
    const fa::KernelConfig fp8 =
        fa::KernelConfig::parse("(E4M3, 128, 128, 128, 12): sm90+stages_2");
    if (fa::is_built(fp8)) {
        EXPECT_NO_THROW(fa::validate_config(fp8_params(), fp8, k_h100));
    } else {
        try {
            fa::validate_config(fp8_params(), fp8, k_h100);
            ADD_FAILURE() << "no error";
        } catch (const fa::Error& e) {
            expect_error(e, fa::ErrorCode::not_built, "config", fp8.to_string());
        }
    }
}

// Every entry point but forward() and forward_kvcache() takes 16-bit inputs only, and says where
// FP8 runs.
TEST(Validation, Fp8RunsThroughForwardAndKvcacheOnly) {
    const auto expect_forward_only = [](const std::function<void()>& call,
                                        const std::string& argument) {
        try {
            call();
            ADD_FAILURE() << "no error for " << argument;
        } catch (const fa::Error& e) {
            expect_error(e, fa::ErrorCode::dtype, argument, "E4M3");
            EXPECT_NE(std::string(e.what()).find("runs through forward() and forward_kvcache()"),
                      std::string::npos)
                << e.what();
        }
    };
    const auto e4m3 = [](int slot, std::int64_t batch, std::int64_t seq) {
        return fa::TensorView::contiguous(address(slot), fa::DType::E4M3, batch, seq, 4, 128);
    };
    fa::VarlenParams varlen;
    varlen.q = e4m3(1, 1, 256);
    varlen.k = varlen.v = e4m3(2, 1, 256);
    varlen.o = fa::TensorView::contiguous(address(4), fa::DType::BF16, 1, 256, 4, 128);
    expect_forward_only([&] { fa::forward_varlen(varlen); }, "q.dtype");
    expect_forward_only([&] { fa::chosen_kernel(varlen); }, "q.dtype");
    fa::BackwardParams backward = good_backward();
    for (fa::TensorView* t : {&backward.q, &backward.k, &backward.v, &backward.d_o, &backward.o,
                              &backward.dq, &backward.dk, &backward.dv}) {
        t->dtype = fa::DType::E4M3;
    }
    expect_forward_only([&] { fa::backward(backward); }, "q.dtype");
    fa::VarlenBackwardParams varlen_backward = good_varlen_backward();
    varlen_backward.q.dtype = fa::DType::E4M3;
    expect_forward_only([&] { fa::backward_varlen(varlen_backward); }, "q.dtype");
    const fa::ProblemShape fp8{.dtype = fa::DType::E4M3, .d_head = 128, .seq_q = 64, .seq_k = 64};
    expect_forward_only(
        [&] { fa::choose_backward_config(fp8, fa::DeviceProperties::model("h100")); }, "dtype");
}
