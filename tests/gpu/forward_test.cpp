// Every built config against the double-precision reference, on fresh random data,
// with the output poisoned with NaN before each run (FlashAttention's test rule).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "api/kernel_args.hpp"
#include "common/cuda_check.hpp"
#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"
#include "kernels/sm90/tensor_maps.hpp"
#include "support/built_configs.hpp"

namespace fa = flash_attention;
using fa::reference::HostTensor;

namespace {

std::vector<int> test_seqs() {
    std::vector<int> seqs;
    const char* env = std::getenv("FLASH_TEST_SEQS");  // e.g. "512,4096" for a quick run
    std::stringstream list(env ? env : "512,1024,2048,4096");
    for (std::string item; std::getline(list, item, ',');)
        seqs.push_back(std::stoi(item));
    return seqs;
}

struct Case {
    fa::KernelConfig config;
    int seq;
};

std::vector<Case> all_cases() {
    std::vector<Case> cases;
    for (const fa::KernelConfig& c : fa::testing::forward_configs()) {
        for (const int seq : test_seqs())
            cases.push_back({c, seq});
    }
    return cases;
}

std::uint64_t fresh_seed() {
    return (std::uint64_t{std::random_device{}()} << 32) | std::random_device{}();
}

// Q's and K's head dim, and V's and O's: a config's (DeepSeek's MLA: 192 and 128), or one d.
struct HeadDims {
    int d, d_v;
    HeadDims(int d_) : d(d_), d_v(d_) {}
    HeadDims(int d_, int d_v_) : d(d_), d_v(d_v_) {}
    HeadDims(const fa::KernelConfig& c) : d(c.d_head), d_v(c.v_head_dim()) {}
};

// O's shape: Q's rows, V's head dim.
HostTensor output_shape(const HostTensor& q, const HostTensor& v) {
    return HostTensor{q.dtype, q.batch, q.seq, q.heads, v.d_head, {}, {}};
}

// Fresh random inputs for one problem on the device, and a poisoned output.
struct Problem {
    std::uint64_t seed;  // printed on failure: the inputs can be regenerated from it
    bool causal;
    bool top_left = false;  // the causal diagonal's alignment
    HostTensor q, k, v;
    fa::tools::DeviceTensor dq, dk, dv, dout;
    fa::tools::DeviceBuffer lse;
    // Sliding window, softcap, sinks and ALiBi (the device copies of the sinks and slopes are
    // set by draw_sinks and draw_alibi).
    fa::Variants variants;
    std::vector<float> sinks, alibi_slopes;
    fa::tools::DeviceBuffer sinks_dev, alibi_dev;

    Problem(fa::DType dtype, int batch, int seq_q, int seq_k, int heads, HeadDims dims,
            int heads_kv = 0, bool causal_ = false)
        : seed(fresh_seed()),
          causal(causal_),
          q(HostTensor::random_normal(dtype, batch, seq_q, heads, dims.d, seed)),
          k(HostTensor::random_normal(dtype, batch, seq_k, heads_kv ? heads_kv : heads, dims.d,
                                      seed + 1)),
          v(HostTensor::random_normal(dtype, batch, seq_k, heads_kv ? heads_kv : heads, dims.d_v,
                                      seed + 2)),
          dq(fa::tools::DeviceTensor::upload(q)),
          dk(fa::tools::DeviceTensor::upload(k)),
          dv(fa::tools::DeviceTensor::upload(v)),
          dout(fa::tools::DeviceTensor::empty_like(output_shape(q, v))),
          lse(static_cast<std::size_t>(batch) * heads * seq_q * sizeof(float)) {}

    fa::ForwardParams params(bool with_lse = false) {
        fa::ForwardParams p{dq.view, dk.view, dv.view, dout.view};
        p.options.causal = causal;
        if (top_left)
            p.options.causal_alignment = fa::CausalAlignment::top_left;
        if (with_lse)
            p.options.lse = static_cast<float*>(lse.data());
        p.options.variants = variants;
        return p;
    }

    // Every K element of keys [first, seq_k) becomes `value` (uploaded again): those keys
    // score value x (the sum of the row's q), far above the others' for many rows.
    void set_keys_from(std::int64_t first, float value) {
        const std::uint16_t bits = fa::reference::from_float(k.dtype, value);
        for (std::int64_t b = 0; b < k.batch; ++b) {
            for (std::int64_t key = first; key < k.seq; ++key) {
                for (std::int64_t h = 0; h < k.heads; ++h) {
                    for (std::int64_t i = 0; i < k.d_head; ++i) {
                        k.bits[k.offset(b, key, h) + i] = bits;
                        k.values[k.offset(b, key, h) + i] = fa::reference::to_float(k.dtype, bits);
                    }
                }
            }
        }
        dk = fa::tools::DeviceTensor::upload(k);
    }

    // One sink per query head: normal around 0 with a spread of 3, the last head's far
    // above any score (its rows' probabilities all but vanish: the rebase in finalize).
    void draw_sinks() {
        std::mt19937_64 rng(seed + 3);
        std::normal_distribution<float> normal(0.0f, 3.0f);
        sinks.assign(static_cast<std::size_t>(q.heads), 0.0f);
        for (float& x : sinks)
            x = normal(rng);
        sinks.back() = 60.0f;
        sinks_dev = fa::tools::DeviceBuffer(sinks.size() * sizeof(float));
        sinks_dev.upload(sinks);
        variants.sinks = static_cast<const float*>(sinks_dev.data());
    }

    // ALiBi slopes, one per query head or with per_batch one per (batch entry, head): uniform
    // in [0, 0.3) as flash_attn's tests draw them, the last head's 2 (its rows see little past
    // a few keys either side of the diagonal).
    void draw_alibi(bool per_batch) {
        std::mt19937_64 rng(seed + 4);
        std::uniform_real_distribution<float> uniform(0.0f, 0.3f);
        alibi_slopes.assign(static_cast<std::size_t>((per_batch ? q.batch : 1) * q.heads), 0.0f);
        for (float& x : alibi_slopes)
            x = uniform(rng);
        alibi_slopes.back() = 2.0f;
        alibi_dev = fa::tools::DeviceBuffer(alibi_slopes.size() * sizeof(float));
        alibi_dev.upload(alibi_slopes);
        variants.alibi_slopes = static_cast<const float*>(alibi_dev.data());
        variants.alibi_batch_stride = per_batch ? q.heads : 0;
    }

    // Poisons O (and the LSE), runs, and checks against the reference on sampled rows
    // (every element of O is checked to be finite, whatever the sample).
    fa::reference::CheckResult run_and_check(const std::function<void()>& forward, double scale,
                                             bool with_lse = false,
                                             std::int64_t rows_per_head = 256) {
        dout.buffer.poison_with_nan();
        lse.poison_with_nan();
        forward();
        fa::cuda_check(cudaDeviceSynchronize(), "kernel execution");
        const HostTensor out = dout.download(output_shape(q, v));
        const std::vector<float> lse_host = with_lse ? lse.download_floats() : std::vector<float>();
        const auto rows = fa::reference::sample_rows(q.batch, q.heads, q.seq, rows_per_head, seed);
        return fa::reference::check_attention(
            {q, k, v, out, scale, causal, with_lse ? &lse_host : nullptr, top_left,
             variants.window_left, variants.window_right, variants.softcap,
             sinks.empty() ? nullptr : &sinks, alibi_slopes.empty() ? nullptr : &alibi_slopes,
             variants.alibi_batch_stride},
            rows);
    }
};

void PrintTo(const Case& c, std::ostream* os) {
    *os << c.config.to_string() << ", seq " << c.seq;
}

class EveryConfig : public ::testing::TestWithParam<Case> {};

// sm90 kernels are sm_90a machine code: on another GPU they are reported, not run.
std::string cannot_run(const fa::KernelConfig& c) {
    return c.to_string() + " cannot run on this GPU (sm90 kernels need compute capability 9.0)";
}

TEST_P(EveryConfig, MatchesReference) {
    const auto [config, seq] = GetParam();
    if (!fa::is_supported(config))
        GTEST_SKIP() << cannot_run(config);
    Problem p(config.dtype, 2, seq, seq, 2, config);
    const auto result = p.run_and_check([&] { fa::forward(p.params(), config); },
                                        1.0 / std::sqrt(double(config.d_head)));
    EXPECT_TRUE(result.passed) << result.summary() << "; seed " << p.seed;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
    const std::string name = fa::testing::config_identifier(info.param.config);
    return name + "_seq" + std::to_string(info.param.seq) + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Built, EveryConfig, ::testing::ValuesIn(all_cases()), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EveryConfig);

// Every built config on shapes real callers hand it: lengths that are no multiple of any
// tile (1, 7, 129, 257, 1000, 4095), seq_q != seq_k both ways, causal masking with
// seq_q > seq_k (rows that see no key: zeros, LSE -inf) and seq_q < seq_k, aligned at the
// bottom right and at the top left, and grouped-query ratios 1, 2 and 8. The log-sum-exp
// output is checked too.
struct OddShape {
    int seq_q, seq_k, heads, heads_kv;
    bool causal;
    bool top_left = false;
};

constexpr OddShape k_odd_shapes[] = {
    {1, 1, 2, 2, false},      {7, 1000, 4, 2, true},         {1000, 7, 4, 4, true},
    {257, 129, 8, 1, false},  {129, 257, 8, 8, true},        {1000, 1000, 8, 1, false},
    {4095, 4095, 8, 1, true}, {300, 1000, 4, 2, true, true}, {1000, 300, 4, 1, true, true},
};

struct OddCase {
    fa::KernelConfig config;
    OddShape shape;
};

std::vector<OddCase> odd_cases() {
    std::vector<OddCase> cases;
    for (const fa::KernelConfig& c : fa::testing::forward_configs()) {
        for (const OddShape& s : k_odd_shapes)
            cases.push_back({c, s});
    }
    return cases;
}

void PrintTo(const OddCase& c, std::ostream* os) {
    *os << c.config.to_string() << ", seq_q " << c.shape.seq_q << ", seq_k " << c.shape.seq_k
        << ", heads " << c.shape.heads << "/" << c.shape.heads_kv
        << (c.shape.causal ? ", causal" : "") << (c.shape.top_left ? " top left" : "");
}

class EveryConfigOddShapes : public ::testing::TestWithParam<OddCase> {};

TEST_P(EveryConfigOddShapes, MatchesReference) {
    const auto [config, s] = GetParam();
    if (!fa::is_supported(config))
        GTEST_SKIP() << cannot_run(config);
    Problem p(config.dtype, 1, s.seq_q, s.seq_k, s.heads, config, s.heads_kv, s.causal);
    p.top_left = s.top_left;
    const auto result = p.run_and_check([&] { fa::forward(p.params(true), config); },
                                        1.0 / std::sqrt(double(config.d_head)), true);
    EXPECT_TRUE(result.passed) << result.summary() << "; seed " << p.seed;
}

std::string odd_case_name(const ::testing::TestParamInfo<OddCase>& info) {
    const OddShape& s = info.param.shape;
    return std::string(fa::to_string(info.param.config.family)) +
           (info.param.config.sm90.dynamic_schedule ? "_dynamic" : "") + "_d" +
           std::to_string(info.param.config.d_head) + "_config" +
           std::to_string(info.index / std::size(k_odd_shapes)) + "_q" + std::to_string(s.seq_q) +
           "_k" + std::to_string(s.seq_k) + "_h" + std::to_string(s.heads) + "_" +
           std::to_string(s.heads_kv) + (s.causal ? "_causal" : "") +
           (s.top_left ? "_topleft" : "");
}

INSTANTIATE_TEST_SUITE_P(Built, EveryConfigOddShapes, ::testing::ValuesIn(odd_cases()),
                         odd_case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EveryConfigOddShapes);

// Every built config with the attention variants (issue 15), alone and together, on odd
// lengths: sliding windows with and without causal masking (both alignments), softcap (with
// and without a fixed reference), sinks with GQA, rows that see no key, and a window far
// shorter than the sequence (most blocks skipped). LSE checked.
struct VariantShape {
    int seq_q, seq_k, heads, heads_kv;
    bool causal, top_left;
    int window_left, window_right;
    float softcap;
    bool sinks;
    float scale = 0;  // softmax_scale; 0: 1 / sqrt(d_head)
    int alibi = 0;    // ALiBi: 0 none, 1 one slope a head, 2 a batch of 2 with its own slopes
};

constexpr VariantShape k_variant_shapes[] = {
    {1000, 1000, 4, 2, true, false, 100, 0, 0, false},    // window + causal
    {300, 1000, 4, 4, false, false, 64, 32, 0, false},    // window both sides, seq_q < seq_k
    {777, 777, 4, 2, false, false, 128, 128, 10, false},  // window + softcap
    {1000, 1000, 2, 2, true, false, -1, -1, 5, false},    // softcap + causal
    {1000, 1000, 8, 2, true, false, -1, -1, 0, true},     // sinks + causal + GQA
    {300, 1000, 4, 2, true, true, 50, 0, 0, false},       // top-left causal with a window
    {129, 257, 4, 1, false, false, 17, 3, 0, false},      // window, odd lengths
    {1000, 300, 4, 1, true, true, 10, 0, 20, true},       // all; rows past the keys see none
    {4095, 4095, 2, 1, true, false, 1000, 0, 30, true},   // long: most blocks skipped
    {1, 1000, 4, 4, false, false, 0, 0, 0, true},         // one row, a window of one key
    {257, 513, 4, 2, false, false, -1, -1, 0, true},      // sinks alone (plain kernels)
    // A softcap on a sharp softmax (scale 1: scores up to the cap), inside the fixed
    // reference's range in bf16 (KernelArgs::softcap_fixed), past it in fp16; and a softcap
    // past it in both (row maxima).
    {2048, 2048, 4, 2, false, false, -1, -1, 50, false, 1.0f},
    {1000, 1000, 4, 2, true, false, -1, -1, 60, true},
    // Every row sees one key (a window of 0 each side) under a softcap inside the fixed
    // reference's range in both dtypes: O must be V to the output's last bit, which needs
    // the sums of P as rounded to 16 bits (OnlineSoftmax::add_rounded()).
    {300, 300, 8, 2, false, false, 0, 0, 8, false},
    // ALiBi: causal with GQA; per-(batch, head) slopes with seq_q < seq_k; odd lengths; with a
    // window, a softcap and sinks at the top-left alignment (rows past the keys see none).
    {1000, 1000, 4, 2, true, false, -1, -1, 0, false, 0, 1},
    {300, 1000, 4, 4, false, false, -1, -1, 0, false, 0, 2},
    {257, 513, 4, 2, false, false, -1, -1, 0, false, 0, 1},
    {1000, 300, 4, 1, true, true, 100, 0, 20, true, 0, 1},
};

struct VariantCase {
    fa::KernelConfig config;
    VariantShape shape;
};

std::vector<VariantCase> variant_cases() {
    std::vector<VariantCase> cases;
    for (const fa::KernelConfig& c : fa::testing::forward_configs()) {
        if (c.sm90.pack_gqa)
            continue;  // no variant kernels: Forward.PackedGroups checks that they refuse
        for (const VariantShape& s : k_variant_shapes)
            cases.push_back({c, s});
    }
    return cases;
}

void PrintTo(const VariantCase& c, std::ostream* os) {
    const VariantShape& s = c.shape;
    *os << c.config.to_string() << ", seq_q " << s.seq_q << ", seq_k " << s.seq_k << ", heads "
        << s.heads << "/" << s.heads_kv << (s.causal ? ", causal" : "")
        << (s.top_left ? " top left" : "") << ", window (" << s.window_left << ", "
        << s.window_right << "), softcap " << s.softcap << (s.sinks ? ", sinks" : "")
        << (s.alibi != 0 ? ", ALiBi" : "");
}

class EveryConfigVariants : public ::testing::TestWithParam<VariantCase> {};

TEST_P(EveryConfigVariants, MatchesReference) {
    const auto [config, s] = GetParam();
    if (!fa::is_supported(config))
        GTEST_SKIP() << cannot_run(config);
    Problem p(config.dtype, s.alibi == 2 ? 2 : 1, s.seq_q, s.seq_k, s.heads, config, s.heads_kv,
              s.causal);
    p.top_left = s.top_left;
    p.variants.window_left = s.window_left;
    p.variants.window_right = s.window_right;
    p.variants.softcap = s.softcap;
    if (s.sinks)
        p.draw_sinks();
    if (s.alibi != 0)
        p.draw_alibi(s.alibi == 2);
    fa::ForwardParams params = p.params(true);
    if (s.scale != 0)
        params.options.softmax_scale = s.scale;
    const double scale = s.scale != 0 ? s.scale : 1.0 / std::sqrt(double(config.d_head));
    const auto result = p.run_and_check([&] { fa::forward(params, config); }, scale, true);
    EXPECT_TRUE(result.passed) << result.summary() << "; seed " << p.seed;
}

std::string variant_case_name(const ::testing::TestParamInfo<VariantCase>& info) {
    return std::string(fa::to_string(info.param.config.family)) + "_d" +
           std::to_string(info.param.config.d_head) + "_config" +
           std::to_string(info.index / std::size(k_variant_shapes)) + "_shape" +
           std::to_string(info.index % std::size(k_variant_shapes));
}

INSTANTIATE_TEST_SUITE_P(Built, EveryConfigVariants, ::testing::ValuesIn(variant_cases()),
                         variant_case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EveryConfigVariants);

// The automatic choice with a window on a decoding shape (which forward() otherwise sends
// to the split-KV kernel) and with sinks on it (which the split-KV kernel takes: batch 64's
// 128 rows run its key warps on a GPU of up to 170 SMs, batch 2's a CTA a range).
TEST(Variants, AutomaticChoiceOnDecodingShapes) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    for (const auto& [window, batch] :
         {std::pair{true, 2}, std::pair{false, 2}, std::pair{false, 64}}) {
        Problem p(fa::DType::BF16, batch, 1, 4096, 8, 128, 2, false);
        if (window) {
            p.variants.window_left = 777;
            p.variants.softcap = 15;
        }
        p.draw_sinks();
        const auto result =
            p.run_and_check([&] { fa::forward(p.params(true)); }, 1.0 / std::sqrt(128.0), true);
        EXPECT_TRUE(result.passed)
            << (window ? "window + softcap + sinks: " : "sinks: ") << "batch " << batch << ": "
            << result.summary() << "; seed " << p.seed;
    }
}

// A sharp softmax: scale 1 (8-16 times 1/sqrt(d_head)) over 4096 keys, so a row's max keeps
// rising by more than 2^8 (log2 units) after its first blocks. Lazy rescaling (the `lazy`
// knob) then keeps a row's reference max for some blocks and moves it in later ones; the
// output and the LSE must not depend on when. And a spike: from key 3000 on every K element
// is 128, so those keys score 128 x (the sum of the row's q) / sqrt(d_head), for a fifth of
// the rows more than 2^128 above the reference kept from the keys before: the sm90 kernels'
// exponentials against it overflow to inf, and the block must be computed again against its
// row max (exponentiate_kept()). Every built config, against the reference.
class EveryConfigSharpSoftmax : public ::testing::TestWithParam<Case> {};

std::vector<Case> sharp_cases() {
    std::vector<Case> cases;
    for (const fa::KernelConfig& c : fa::testing::forward_configs())
        cases.push_back({c, 4096});
    return cases;
}

TEST_P(EveryConfigSharpSoftmax, MatchesReference) {
    const auto [config, seq_k] = GetParam();
    if (!fa::is_supported(config))
        GTEST_SKIP() << cannot_run(config);
    for (const bool spike : {false, true}) {
        Problem p(config.dtype, 1, 333, seq_k, 2, config);
        const float scale = spike ? 1.0f / std::sqrt(static_cast<float>(config.d_head)) : 1.0f;
        if (spike)
            p.set_keys_from(3000, 128.0f);
        fa::ForwardParams params = p.params(true);
        params.options.softmax_scale = scale;
        const auto result = p.run_and_check([&] { fa::forward(params, config); }, scale, true);
        EXPECT_TRUE(result.passed)
            << (spike ? "spike: " : "scale 1: ") << result.summary() << "; seed " << p.seed;
    }
}

// Scale 100 on 1500 keys (a ragged last block): offsets near 5000 in log2 units and a reference
// move at nearly every new row max, so the LSE sees every correction factor. A factor that
// disagrees with the rounded offset the row's sum is taken against (ptxas fused one into an FFMA
// in the first peeled loop) put 2-3x the naive fp32 LSE's error into it and failed this bound on 4
// of 10 runs of `run --check` (docs/PERF.md, 2026-11-28); consistent factors measured 0.8-1.5x.
TEST_P(EveryConfigSharpSoftmax, LseAtScale100) {
    const fa::KernelConfig config = GetParam().config;
    if (!fa::is_supported(config))
        GTEST_SKIP() << cannot_run(config);
    Problem p(config.dtype, 4, 700, 1500, 4, config);
    fa::ForwardParams params = p.params(true);
    params.options.softmax_scale = 100.0f;
    const auto result =
        p.run_and_check([&] { fa::forward(params, config); }, 100.0f, true, /*rows_per_head=*/700);
    EXPECT_TRUE(result.passed) << result.summary() << "; seed " << p.seed;
}

INSTANTIATE_TEST_SUITE_P(Built, EveryConfigSharpSoftmax, ::testing::ValuesIn(sharp_cases()),
                         case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EveryConfigSharpSoftmax);

// One (dtype, d_head) pair per built combination of V's head dim d_head, for the tests below
// (V's own head dim: Forward.ValueHeadDimOfItsOwn).
std::vector<std::pair<fa::DType, int>> built_problem_kinds() {
    std::vector<std::pair<fa::DType, int>> kinds;
    for (const auto& c : fa::testing::forward_configs()) {
        const std::pair kind{c.dtype, c.d_head};
        if (c.d_v != 0)
            continue;
        if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end())
            kinds.push_back(kind);
    }
    return kinds;
}

// DeepSeek's MLA: Q and K of head dim 192, V and O of 128, through the automatic choice: odd
// lengths, GQA, causal at both alignments, the LSE.
TEST(Forward, ValueHeadDimOfItsOwn) {
    bool ran = false;
    for (const fa::DType dtype : {fa::DType::BF16, fa::DType::FP16}) {
        bool built = false;
        for (const auto& c : fa::testing::forward_configs())
            built = built || (c.dtype == dtype && c.d_v == 128 && fa::is_supported(c));
        if (!built)
            continue;
        ran = true;
        for (const int causal : {0, 1, 2}) {
            Problem p(dtype, 2, 333, 1001, 8, HeadDims{192, 128}, 2, causal != 0);
            p.top_left = causal == 2;
            const auto result =
                p.run_and_check([&] { fa::forward(p.params(true)); }, 1.0 / std::sqrt(192.0), true);
            EXPECT_TRUE(result.passed) << fa::to_string(dtype) << ", causal " << causal << ": "
                                       << result.summary() << "; seed " << p.seed;
        }
    }
    if (!ran)
        GTEST_SKIP() << "no kernel with V's head dim 128 runs on this GPU in this build";
}

TEST(Forward, AutomaticChoiceMatchesReference) {
    for (const auto& [dtype, d] : built_problem_kinds()) {
        Problem p(dtype, 2, 1024, 1024, 3, d);
        const auto result =
            p.run_and_check([&] { fa::forward(p.params()); }, 1.0 / std::sqrt(double(d)));
        EXPECT_TRUE(result.passed) << "d " << d << ": " << result.summary() << "; seed " << p.seed;
    }
}

TEST(Forward, DifferentQueryAndKeyLengths) {
    for (const auto& [dtype, d] : built_problem_kinds()) {
        for (const auto& [sq, sk] : {std::pair{256, 2048}, std::pair{2048, 256}}) {
            Problem p(dtype, 1, sq, sk, 2, d);
            const auto result =
                p.run_and_check([&] { fa::forward(p.params()); }, 1.0 / std::sqrt(double(d)));
            EXPECT_TRUE(result.passed)
                << "seq_q " << sq << " seq_k " << sk << ": " << result.summary();
        }
    }
}

// forward() sends decoding shapes to the split-KV kernels: the top-left diagonal there too
// (one query: it sees key 0 only; eight: keys 0..i).
TEST(Forward, TopLeftCausalOnDecodingShapes) {
    for (const auto& [dtype, d] : built_problem_kinds()) {
        for (const int seq_q : {1, 8}) {
            Problem p(dtype, 2, seq_q, 3000, 8, d, 2, true);
            p.top_left = true;
            const auto result = p.run_and_check([&] { fa::forward(p.params(true)); },
                                                1.0 / std::sqrt(double(d)), true);
            EXPECT_TRUE(result.passed) << "d " << d << ", seq_q " << seq_q << ": "
                                       << result.summary() << "; seed " << p.seed;
        }
    }
}

TEST(Forward, CustomScale) {
    for (const auto& [dtype, d] : built_problem_kinds()) {
        Problem p(dtype, 1, 512, 512, 2, d);
        fa::ForwardParams params = p.params();
        params.options.softmax_scale = 0.3f;
        const auto result = p.run_and_check([&] { fa::forward(params); }, 0.3);
        EXPECT_TRUE(result.passed) << result.summary();
    }
}

// Q, K, V as slices of one packed (batch, seq, 3, heads, d) tensor and O with padded
// rows: the kernels take any batch/seq/head strides.
TEST(Forward, StridedViews) {
    for (const auto& [dtype, d] : built_problem_kinds()) {
        const int b = 2, s = 512, h = 3;
        const HostTensor qkv = HostTensor::random_normal(dtype, b, s, 3 * h, d, fresh_seed());
        const fa::tools::DeviceTensor packed = fa::tools::DeviceTensor::upload(qkv);
        const auto slice = [&](int which) {
            fa::TensorView t = packed.view;
            t.data = static_cast<char*>(t.data) + std::int64_t{which} * h * d * 2;
            t.shape = {b, s, h, d};
            return t;  // strides stay those of the packed tensor
        };
        const std::int64_t padded_row = std::int64_t{h} * d + 64;
        fa::tools::DeviceBuffer out_buffer(static_cast<std::size_t>(b) * s * padded_row * 2);
        out_buffer.poison_with_nan();
        const fa::TensorView o{
            out_buffer.data(), dtype, {b, s, h, d}, {s * padded_row, padded_row, d, 1}};
        fa::forward({slice(0), slice(1), slice(2), o});
        fa::cuda_check(cudaDeviceSynchronize(), "kernel execution");

        // Unpack to contiguous host tensors and check.
        const auto bits = out_buffer.download();
        HostTensor q{dtype, b, s, h, d, {}, {}}, k = q, v = q;
        std::vector<std::uint16_t> out_bits(static_cast<std::size_t>(b) * s * h * d);
        for (auto* t : {&q, &k, &v})
            t->bits.resize(out_bits.size());
        for (int bi = 0; bi < b; ++bi) {
            for (int si = 0; si < s; ++si) {
                for (int hi = 0; hi < h; ++hi) {
                    for (int x = 0; x < d; ++x) {
                        const std::size_t dst = ((std::size_t(bi) * s + si) * h + hi) * d + x;
                        q.bits[dst] = qkv.bits[qkv.offset(bi, si, hi) + x];
                        k.bits[dst] = qkv.bits[qkv.offset(bi, si, h + hi) + x];
                        v.bits[dst] = qkv.bits[qkv.offset(bi, si, 2 * h + hi) + x];
                        out_bits[dst] =
                            bits[(std::size_t(bi) * s + si) * padded_row + std::size_t(hi) * d + x];
                    }
                }
            }
        }
        q = HostTensor::from_bits(dtype, b, s, h, d, q.bits);
        k = HostTensor::from_bits(dtype, b, s, h, d, k.bits);
        v = HostTensor::from_bits(dtype, b, s, h, d, v.bits);
        const HostTensor out = HostTensor::from_bits(dtype, b, s, h, d, out_bits);
        const auto rows = fa::reference::sample_rows(b, h, s, 128, fresh_seed());
        const auto result =
            fa::reference::check_attention(q, k, v, out, 1.0 / std::sqrt(double(d)), rows);
        EXPECT_TRUE(result.passed) << "d " << d << ": " << result.summary();
        // The padding between rows must be untouched (still NaN poison).
        for (int bi = 0; bi < b; ++bi) {
            for (int si = 0; si < s; ++si) {
                for (int x = h * d; x < padded_row; ++x) {
                    ASSERT_EQ(bits[(std::size_t(bi) * s + si) * padded_row + x], 0xFFFF)
                        << "write outside O at batch " << bi << " row " << si;
                }
            }
        }
    }
}

// The same inputs give bit-identical outputs: a race would make them differ.
TEST(Forward, Deterministic) {
    for (const fa::KernelConfig& c : fa::testing::forward_configs()) {
        if (!fa::is_supported(c))
            continue;
        Problem p(c.dtype, 1, 1024, 1024, 4, c);
        p.dout.buffer.poison_with_nan();
        fa::forward(p.params(), c);
        const auto first = p.dout.buffer.download();
        p.dout.buffer.poison_with_nan();
        fa::forward(p.params(), c);
        EXPECT_EQ(first, p.dout.buffer.download()) << c.to_string();
    }
}

// Persistent sm90 configs (static and dynamic schedule) over many more causal tiles than
// SMs, of lengths from 1 to 16 key blocks, with grouped-query heads: every tile is
// computed exactly once (a tile lost or done twice leaves NaN poison or a wrong row).
TEST(Forward, PersistentSchedulesCoverEveryTileOnce) {
    for (const fa::KernelConfig& c : fa::testing::forward_configs()) {
        if (!c.sm90.persistent || !fa::is_supported(c))
            continue;
        // 2 x 8 heads x 16 query blocks of 128 rows (11 of 192): 176 to 256 tiles.
        Problem p(c.dtype, 2, 2048, 2048, 8, c, 2, true);
        const auto result = p.run_and_check([&] { fa::forward(p.params(true), c); },
                                            1.0 / std::sqrt(double(c.d_head)), true);
        EXPECT_TRUE(result.passed)
            << c.to_string() << ": " << result.summary() << "; seed " << p.seed;
    }
}

// One forward() captured on `stream` and instantiated as a graph, whose replays launch() runs.
class CapturedForward {
  public:
    CapturedForward(const fa::ForwardParams& params, const fa::KernelConfig& c,
                    cudaStream_t stream) {
        cudaGraph_t graph = nullptr;
        fa::cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal),
                       "cudaStreamBeginCapture");
        fa::forward(params, c, stream);
        fa::cuda_check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
        const cudaError_t status = cudaGraphInstantiate(&exec_, graph, 0);
        cudaGraphDestroy(graph);
        fa::cuda_check(status, "cudaGraphInstantiate");
    }
    ~CapturedForward() { cudaGraphExecDestroy(exec_); }
    CapturedForward(const CapturedForward&) = delete;
    CapturedForward& operator=(const CapturedForward&) = delete;

    void launch(cudaStream_t stream) const {
        fa::cuda_check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
    }

  private:
    cudaGraphExec_t exec_ = nullptr;
};

// Stream-K configs on dense non-causal problems whose tiles leave the grid's last round at
// most two thirds full (stream_k_plan()): its tiles split along the keys, partials merged by the
// CTA that ends each tile (tile_scheduler.cuh). The heads are chosen per config so that the
// tiles come to about 1.25 rounds. Ragged last key blocks, seq_q above and below seq_k,
// grouped-query heads, a sharp softmax (scale 100), one tile past whole rounds split over every
// CTA (a merge of as many partials), and launches the plan leaves unsplit (a last round too
// full; fewer key blocks than CTAs). The LSE too; every element of O finite (a piece lost
// leaves NaN poison); launches in a row on one stream, a captured graph's replays and two
// streams at once (the flags are the stream's own, left zero).
TEST(Forward, StreamKSplitsTheLastRound) {
    struct Shape {
        int batch, seq_q, seq_k;
        double rounds;      // tiles / SMs: the heads follow
        int heads_kv;       // 0: as many as the query heads
        float scale;        // 0: 1 / sqrt(d_head)
        int rows_per_head;  // the reference's sample
        bool splits;        // what stream_k_plan() makes of it
    };
    const int sms = fa::DeviceProperties::current().sm_count;
    const Shape shapes[] = {
        {1, 1000, 1111, 1.25, 0, 0, 16, true}, {2, 2000, 700, 1.3, 1, 0, 16, true},
        {1, 777, 1500, 1.2, 1, 0, 16, true},   {1, 1000, 1000, 1.25, 0, 100, 16, true},
        {1, 1000, 1000, 1.9, 0, 0, 16, false},  // the last round too full to split
    };
    for (const fa::KernelConfig& c : fa::testing::forward_configs()) {
        if (!c.sm90.stream_k || !fa::is_supported(c))
            continue;
        const auto check = [&](int batch, int seq_q, int seq_k, int heads, int heads_kv,
                               float scale_arg, int rows_per_head, bool splits) {
            // The launcher's plan for it (launch.cuh): the shape tests what it is meant to.
            const std::int64_t tiles = std::int64_t{(seq_q + c.B_r - 1) / c.B_r} * heads * batch;
            EXPECT_EQ(fa::sm90::stream_k_plan(tiles, std::min<std::int64_t>(tiles, sms),
                                              (seq_k + c.B_c - 1) / c.B_c)
                              .units > 0,
                      splits)
                << c.to_string() << ", " << tiles << " tiles";
            Problem p(c.dtype, batch, seq_q, seq_k, heads, c, heads_kv);
            fa::ForwardParams params = p.params(true);
            if (scale_arg != 0)
                params.options.softmax_scale = scale_arg;
            const double scale = scale_arg != 0 ? scale_arg : 1.0 / std::sqrt(double(c.d_head));
            const auto result =
                p.run_and_check([&] { fa::forward(params, c); }, scale, true, rows_per_head);
            EXPECT_TRUE(result.passed)
                << c.to_string() << ", " << batch << " x " << seq_q << " x " << seq_k << ", heads "
                << heads << "/" << heads_kv << ": " << result.summary() << "; seed " << p.seed;
        };
        const auto heads_for = [&](const Shape& s) {
            const int q_blocks = (s.seq_q + c.B_r - 1) / c.B_r;
            return static_cast<int>(std::ceil(s.rounds * sms / (s.batch * q_blocks)));
        };
        for (const Shape& s : shapes) {
            const int heads = heads_for(s);
            check(s.batch, s.seq_q, s.seq_k, heads, s.heads_kv ? s.heads_kv : heads, s.scale,
                  s.rows_per_head, s.splits);
        }
        // One tile past whole rounds, split over every CTA (141 key blocks and more).
        check(1, 64, 128 * 140 + 5, sms + 1, 1, 0, 4, true);
        // A tail of 5 tiles of one key block: fewer units than CTAs, not split.
        check(1, 64, 50, sms + 5, 1, 0, 16, false);

        cudaStream_t streams[2];
        for (auto& st : streams)
            fa::cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
        const double scale = 1.0 / std::sqrt(double(c.d_head));
        const int heads = heads_for(shapes[0]);
        Problem a(c.dtype, 1, 1000, 1111, heads, c, heads);
        Problem b(c.dtype, 1, 1000, 1111, heads, c, 1);
        const CapturedForward graph(a.params(), c, streams[0]);
        for (int launch = 0; launch < 4; ++launch) {
            b.dout.buffer.poison_with_nan();
            const auto a_result = a.run_and_check(
                [&] {
                    if (launch == 2)
                        graph.launch(streams[0]);
                    else
                        fa::forward(a.params(), c, streams[0]);
                    fa::forward(b.params(), c, streams[1]);
                },
                scale, false, 8);
            const auto b_result = fa::reference::check_attention(
                {b.q, b.k, b.v, b.dout.download(output_shape(b.q, b.v)), scale, false, nullptr},
                fa::reference::sample_rows(1, heads, 1000, 8, b.seed));
            EXPECT_TRUE(a_result.passed && b_result.passed)
                << c.to_string() << ", launch " << launch << (launch == 2 ? " (graph)" : "") << ": "
                << a_result.summary() << " / " << b_result.summary();
        }
        for (auto& st : streams)
            cudaStreamDestroy(st);
    }
}

// Causal tiles numbered in sections of heads (KernelArgs::section_heads), the last section
// shorter than the others (18 heads of 3 x 6 over 3 K/V heads: sections of 16, 8 or 4 at d_head
// 64, 128 or 256 on 50-64 MiB of L2), odd lengths: every sm90 config computes every tile once.
TEST(Forward, CausalSectionsCoverEveryTileOnce) {
    for (const fa::KernelConfig& c : fa::testing::forward_configs()) {
        if (c.family != fa::Family::sm90 || !fa::is_supported(c))
            continue;
        Problem p(c.dtype, 3, 8191, 8191, 6, c, 3, true);
        const int sections = fa::section_heads(p.params(), c.B_r, fa::DeviceProperties::current());
        ASSERT_GT(sections, 1) << c.to_string();
        ASSERT_NE(18 % sections, 0) << c.to_string() << ": sections of " << sections;
        // A tile computed by no CTA stays NaN, which the finiteness check over all of O finds;
        // 32 sampled rows a head check the values (256 took 66-76 s over the ci set's configs).
        const auto result = p.run_and_check([&] { fa::forward(p.params(true), c); },
                                            1.0 / std::sqrt(double(c.d_head)), true, 32);
        EXPECT_TRUE(result.passed)
            << c.to_string() << ": " << result.summary() << "; seed " << p.seed;
    }
}

// The dynamic schedule's counters under capture are a stream-ordered allocation of the
// launch's own, zeroed on every replay; outside capture each stream has its own: launches on
// two streams at once do not share them.
TEST(Forward, DynamicScheduleReplaysAndRunsConcurrently) {
    for (const fa::KernelConfig& c : fa::testing::forward_configs()) {
        if (!c.sm90.dynamic_schedule || !fa::is_supported(c))
            continue;
        const double scale = 1.0 / std::sqrt(double(c.d_head));
        cudaStream_t streams[2];
        for (auto& s : streams)
            fa::cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
        Problem graphed(c.dtype, 1, 4096, 4096, 8, c, 2, true);
        const auto graph_result = graphed.run_and_check(
            [&] {
                fa::forward(graphed.params(), c, streams[0]);  // warm-up, as before any capture
                const CapturedForward graph(graphed.params(), c, streams[0]);
                fa::cuda_check(cudaStreamSynchronize(streams[0]), "sync");
                graphed.dout.buffer.poison_with_nan();
                for (int replay = 0; replay < 3; ++replay)
                    graph.launch(streams[0]);
                fa::cuda_check(cudaStreamSynchronize(streams[0]), "graph replays");
            },
            scale);
        EXPECT_TRUE(graph_result.passed) << c.to_string() << " (graph): " << graph_result.summary();

        Problem a(c.dtype, 2, 4096, 4096, 8, c, 8, true);
        Problem b(c.dtype, 2, 4096, 4096, 8, c, 8, true);
        b.dout.buffer.poison_with_nan();
        const auto a_result = a.run_and_check(
            [&] {
                fa::forward(a.params(), c, streams[0]);
                fa::forward(b.params(), c, streams[1]);
            },
            scale);
        const HostTensor b_out = b.dout.download(output_shape(b.q, b.v));
        const auto b_result =
            fa::reference::check_attention({b.q, b.k, b.v, b_out, scale, true, nullptr},
                                           fa::reference::sample_rows(2, 8, 4096, 256, b.seed));
        EXPECT_TRUE(a_result.passed && b_result.passed)
            << c.to_string() << " (two streams): " << a_result.summary() << " / "
            << b_result.summary();
        for (auto& s : streams)
            cudaStreamDestroy(s);
    }
}

// Outside capture a stream's launches share its counters, which each launch's last CTA zeroes
// for the next (StreamCounters): launches in a row on one stream, with a captured graph's
// replays between them, and on a stream created after the first was destroyed, each compute
// every tile (counters left past zero would skip tiles, whose NaN poison the check finds).
TEST(Forward, DynamicScheduleLeavesItsCountersZero) {
    for (const fa::KernelConfig& c : fa::testing::forward_configs()) {
        if (!c.sm90.dynamic_schedule || !fa::is_supported(c))
            continue;
        const double scale = 1.0 / std::sqrt(double(c.d_head));
        Problem p(c.dtype, 2, 2048, 2048, 8, c, 2, true);
        for (int stream_number = 0; stream_number < 2; ++stream_number) {
            cudaStream_t stream = nullptr;
            fa::cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
            std::optional<CapturedForward> graph;
            graph.emplace(p.params(), c, stream);
            for (int launch = 0; launch < 4; ++launch) {
                const bool replay = launch == 2;
                const auto result = p.run_and_check(
                    [&] {
                        if (replay)
                            graph->launch(stream);
                        else
                            fa::forward(p.params(), c, stream);
                    },
                    scale);
                EXPECT_TRUE(result.passed)
                    << c.to_string() << ", stream " << stream_number << ", launch " << launch
                    << (replay ? " (graph)" : "") << ": " << result.summary();
            }
            graph.reset();  // before its stream
            fa::cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
        }
    }
}

// Waits for the device, failing (and ending the process, whose kernel cannot be
// stopped) if it is still busy after `seconds`: a schedule that deadlocks fails the
// suite instead of hanging it.
void synchronize_or_abort(double seconds, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (cudaStreamQuery(nullptr) == cudaErrorNotReady) {
        if (std::chrono::steady_clock::now() > deadline) {
            ADD_FAILURE() << what << ": still running after " << seconds << " s (deadlock)";
            std::cerr << "FATAL: " << what << " did not finish within " << seconds << " s\n";
            std::_Exit(EXIT_FAILURE);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    fa::cuda_check(cudaDeviceSynchronize(), what.c_str());
}

// The dynamic schedule on tiles of at most one key block: the producer runs whole tiles
// ahead of the consumers and reaches its end while they are still at work. Its final
// "past the end" index must wait until the consumers have emptied the Q buffer; when it
// waited only for them to read the buffer's previous index, a consumer could miss a phase
// of q_full and wait forever (the release build's test run hung, 2026-11-24). Many
// launches, because the hang needs the producer to win a race.
TEST(Forward, DynamicScheduleEndsWhileConsumersWork) {
    for (const fa::KernelConfig& c : fa::testing::forward_configs()) {
        if (!c.sm90.dynamic_schedule || !fa::is_supported(c))
            continue;
        for (const bool causal : {false, true}) {
            // 4 x 16 heads x 64 query blocks (22 of 192 rows): 15 to 31 tiles per CTA.
            Problem p(c.dtype, 4, 4096 * (causal ? 2 : 1), 7, 16, c, 16, causal);
            const auto result = p.run_and_check(
                [&] {
                    for (int launch = 0; launch < 100; ++launch)
                        fa::forward(p.params(), c);
                    synchronize_or_abort(30, c.to_string() + ", 100 launches");
                },
                1.0 / std::sqrt(double(c.d_head)));
            EXPECT_TRUE(result.passed) << c.to_string() << ": " << result.summary();
        }
    }
}

}  // namespace

// The automatic choice on this GPU runs the family made for it: sm90 on compute capability
// 9.0 when the build has it, for every dtype and head dim.
TEST(Forward, AutomaticChoiceRunsTheDevicesFamily) {
    const fa::DeviceProperties& device = fa::DeviceProperties::current();
    const bool hopper = device.major == 9 && device.minor == 0;
    for (const auto& [dtype, d] : built_problem_kinds()) {
        Problem p(dtype, 1, 1024, 1024, 2, d);
        const fa::KernelConfig c = fa::choose_config(p.params());
        const bool sm90_built = std::any_of(
            fa::testing::forward_configs().begin(), fa::testing::forward_configs().end(),
            [&](const auto& x) {
                return x.family == fa::Family::sm90 && x.dtype == dtype && x.d_head == d;
            });
        EXPECT_EQ(c.family, hopper && sm90_built ? fa::Family::sm90 : fa::Family::sm80)
            << c.to_string();
    }
}

// Host memory is not the current device's: a clear error naming the pointer, before any
// launch (the API never checked where its pointers lived).
TEST(Forward, PointersMustBeTheCurrentDevicesMemory) {
    const auto [dtype, d] = built_problem_kinds().front();
    Problem p(dtype, 1, 256, 256, 2, d);
    std::vector<std::uint16_t> host(static_cast<std::size_t>(p.k.size()) + 64);
    fa::ForwardParams params = p.params();
    // 16-byte aligned host memory, so that only its location is wrong.
    params.k.data = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(host.data()) + 15) &
                                            ~std::uintptr_t{15});
    try {
        fa::forward(params);
        ADD_FAILURE() << "host memory accepted";
    } catch (const fa::Error& e) {
        EXPECT_EQ(e.code(), fa::ErrorCode::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("k.data: expected memory of the current device"),
                  std::string::npos)
            << e.what();
    }
}

// pack_gqa configs on the shapes the choice gives them: a few positions of every query head of
// a K/V head in one tile (speculative decoding, short chunks), groups of 2 to 64 heads
// (a position a consumer), tiles and consumers that end inside the rows, keys shorter than a
// block and thousands long, causal at both alignments, the LSE checked. Problems they do not
// pack (3 query heads a K/V head, a window, sinks) are refused with the config named.
TEST(Forward, PackedGroups) {
    struct Shape {
        int seq_q, seq_k, heads, heads_kv;
        bool causal, top_left;
    };
    constexpr Shape shapes[] = {
        {16, 4096, 8, 2, true, false}, {5, 1000, 16, 2, true, false},
        {17, 300, 4, 2, false, false}, {64, 777, 32, 2, true, true},
        {1, 129, 64, 1, false, false}, {100, 4095, 8, 4, true, false},
        {3, 2000, 32, 1, true, true},  {40, 77, 16, 4, false, false},
    };
    int ran = 0;
    for (const fa::KernelConfig& c : fa::testing::forward_configs()) {
        if (!c.sm90.pack_gqa || !fa::is_supported(c))
            continue;
        ++ran;
        for (const Shape& s : shapes) {
            Problem p(c.dtype, 2, s.seq_q, s.seq_k, s.heads, c.d_head, s.heads_kv, s.causal);
            p.top_left = s.top_left;
            const auto result = p.run_and_check([&] { fa::forward(p.params(true), c); },
                                                1.0 / std::sqrt(double(c.d_head)), true);
            EXPECT_TRUE(result.passed)
                << c.to_string() << ", seq_q " << s.seq_q << ", seq_k " << s.seq_k << ", heads "
                << s.heads << "/" << s.heads_kv << ": " << result.summary() << "; seed " << p.seed;
        }
        const auto expect_refused = [&](Problem& p, const char* what) {
            try {
                fa::forward(p.params(), c);
                ADD_FAILURE() << c.to_string() << " ran " << what;
            } catch (const fa::Error& e) {
                EXPECT_EQ(e.code(), fa::ErrorCode::unsupported) << e.what();
                EXPECT_NE(std::string(e.what()).find(c.to_string()), std::string::npos) << e.what();
            }
        };
        Problem odd_group(c.dtype, 1, 16, 256, 6, c.d_head, 2, true);
        expect_refused(odd_group, "3 query heads a K/V head");
        Problem window(c.dtype, 1, 16, 256, 8, c.d_head, 2, true);
        window.variants.window_left = 10;
        expect_refused(window, "a window");
        Problem sinks(c.dtype, 1, 16, 256, 8, c.d_head, 2, true);
        sinks.draw_sinks();
        expect_refused(sinks, "sinks");
    }
    if (ran == 0)
        GTEST_SKIP() << "no pack_gqa config of this build runs on this GPU";
}

// An error the caller left in CUDA's last-error state is the caller's: the old launch path
// (<<<>>> then cudaGetLastError) reported it as ours and cleared it.
TEST(Forward, EarlierCudaErrorsAreNeitherReportedNorCleared) {
    const auto [dtype, d] = built_problem_kinds().front();
    Problem p(dtype, 1, 512, 512, 2, d);
    void* too_much = nullptr;
    ASSERT_NE(cudaMalloc(&too_much, std::size_t{1} << 62), cudaSuccess);  // sets the last error
    const auto result =
        p.run_and_check([&] { fa::forward(p.params()); }, 1.0 / std::sqrt(double(d)));
    EXPECT_TRUE(result.passed) << result.summary();
    EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}
