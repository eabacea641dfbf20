// Every built backward config against the double-precision gradients, on fresh random inputs
// and dO, with dQ, dK and dV poisoned with NaN before each run (FlashAttention's test rule):
// odd lengths, seq_q != seq_k at both alignments, causal and not, GQA ratios 1, 4 and 8;
// determinism from run to run and across batch sizes; the automatic choice.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"
#include "kernels/key_block_scheduler.hpp"
#include "kernels/serving/launch.hpp"
#include "support/built_configs.hpp"

namespace fa = flash_attention;
using fa::reference::HostTensor;
using fa::tools::DeviceBuffer;
using fa::tools::DeviceTensor;

namespace {

std::uint64_t fresh_seed() {
    return (std::uint64_t{std::random_device{}()} << 32) | std::random_device{}();
}

struct Shape {
    int batch, seq_q, seq_k, heads, heads_kv;
    bool causal;
    bool top_left = false;
};

// Inputs, dO and the forward's output and LSE (the automatic choice's forward) on the device,
// and the gradients' buffers.
// Q's and K's head dim, and V's, O's and dO's: a config's (DeepSeek's MLA: 192 and 128), or
// one d.
struct HeadDims {
    int d, d_v;
    HeadDims(int d_) : d(d_), d_v(d_) {}
    HeadDims(const fa::KernelConfig& c) : d(c.d_head), d_v(c.v_head_dim()) {}
};

struct Problem {
    Shape shape;
    std::uint64_t seed;
    float softcap;  // 0: none
    int window_left = -1, window_right = -1;
    HostTensor q, k, v, d_o;
    DeviceTensor dev_q, dev_k, dev_v, dev_d_o, dev_o, dev_dq, dev_dk, dev_dv;
    DeviceBuffer lse;
    // Attention sinks (with_sinks): one logit per query head, and their gradient's buffer.
    std::vector<float> sinks;
    DeviceBuffer dev_sinks, dev_d_sinks;
    // ALiBi (set_alibi, before the forward): slopes per head or per (batch entry, head).
    std::vector<float> alibi_slopes;
    std::int64_t alibi_batch_stride = 0;
    DeviceBuffer dev_alibi;

    Problem(fa::DType dtype, HeadDims dims, const Shape& s, std::uint64_t seed_,
            bool with_sinks = false, float softcap_ = 0.0f, std::pair<int, int> window = {-1, -1})
        : shape(s),
          seed(seed_),
          softcap(softcap_),
          window_left(window.first),
          window_right(window.second),
          q(HostTensor::random_normal(dtype, s.batch, s.seq_q, s.heads, dims.d, seed)),
          k(HostTensor::random_normal(dtype, s.batch, s.seq_k, s.heads_kv, dims.d, seed + 1)),
          v(HostTensor::random_normal(dtype, s.batch, s.seq_k, s.heads_kv, dims.d_v, seed + 2)),
          d_o(HostTensor::random_normal(dtype, s.batch, s.seq_q, s.heads, dims.d_v, seed + 3)),
          dev_q(DeviceTensor::upload(q)),
          dev_k(DeviceTensor::upload(k)),
          dev_v(DeviceTensor::upload(v)),
          dev_d_o(DeviceTensor::upload(d_o)),
          dev_o(DeviceTensor::empty_like(d_o)),
          dev_dq(DeviceTensor::empty_like(q)),
          dev_dk(DeviceTensor::empty_like(k)),
          dev_dv(DeviceTensor::empty_like(v)),
          lse(static_cast<std::size_t>(s.batch) * s.heads * s.seq_q * sizeof(float)) {
        if (with_sinks) {
            for (int h = 0; h < s.heads; ++h)  // around the scores' scale, one each side of 0
                sinks.push_back(static_cast<float>((h % 5) - 2) * 0.75f);
            dev_sinks = DeviceBuffer(sinks.size() * sizeof(float));
            dev_sinks.upload(sinks);
            dev_d_sinks = DeviceBuffer(sinks.size() * sizeof(float));
        }
        fa::forward({dev_q.view, dev_k.view, dev_v.view, dev_o.view, options()});
    }

    // ALiBi with these slopes ((heads,) or (batch, heads)): the forward runs again with them.
    void set_alibi(std::vector<float> slopes) {
        alibi_batch_stride = std::ssize(slopes) == shape.heads ? 0 : shape.heads;
        alibi_slopes = std::move(slopes);
        dev_alibi = DeviceBuffer(alibi_slopes.size() * sizeof(float));
        dev_alibi.upload(alibi_slopes);
        fa::forward({dev_q.view, dev_k.view, dev_v.view, dev_o.view, options()});
    }

    fa::AttentionOptions options() {
        return {
            .softmax_scale = std::nullopt,
            .causal = shape.causal,
            .causal_alignment =
                shape.top_left ? fa::CausalAlignment::top_left : fa::CausalAlignment::bottom_right,
            .lse = static_cast<float*>(lse.data()),
            .variants = {
                .window_left = window_left,
                .window_right = window_right,
                .softcap = softcap,
                .sinks = sinks.empty() ? nullptr : static_cast<const float*>(dev_sinks.data()),
                .alibi_slopes =
                    alibi_slopes.empty() ? nullptr : static_cast<const float*>(dev_alibi.data()),
                .alibi_batch_stride = alibi_batch_stride}};
    }

    fa::BackwardParams params() {
        fa::BackwardParams p{dev_q.view,   dev_k.view,  dev_v.view,   dev_o.view,
                             dev_d_o.view, dev_dq.view, dev_dk.view,  dev_dv.view,
                             options(),    nullptr,     deterministic};
        p.d_sinks = sinks.empty() ? nullptr : static_cast<float*>(dev_d_sinks.data());
        return p;
    }
    bool deterministic = false;

    // Poisons the gradients, runs `backward`, and checks every element is finite and the
    // sampled rows against the reference.
    template <class Backward>
    fa::reference::BackwardCheck run_and_check(const Backward& backward) {
        dev_dq.buffer.poison_with_nan();
        dev_dk.buffer.poison_with_nan();
        dev_dv.buffer.poison_with_nan();
        if (!sinks.empty())
            dev_d_sinks.poison_with_nan();
        backward();
        fa::tools::synchronize();
        const HostTensor dq = dev_dq.download(q), dk = dev_dk.download(k), dv = dev_dv.download(v);
        const std::vector<float> d_sinks =
            sinks.empty() ? std::vector<float>{} : dev_d_sinks.download_floats();
        const auto q_rows = fa::reference::sample_rows(q.batch, q.heads, q.seq, 48, seed);
        const auto k_rows = fa::reference::sample_rows(k.batch, k.heads, k.seq, 48, seed + 9);
        fa::reference::BackwardProblem problem{q,
                                               k,
                                               v,
                                               d_o,
                                               dq,
                                               dk,
                                               dv,
                                               1.0 / std::sqrt(double(q.d_head)),
                                               shape.causal,
                                               shape.top_left};
        if (!sinks.empty()) {
            problem.sinks = &sinks;
            problem.d_sinks = &d_sinks;
        }
        problem.softcap = softcap;
        problem.window_left = window_left;
        problem.window_right = window_right;
        if (!alibi_slopes.empty()) {
            problem.alibi_slopes = &alibi_slopes;
            problem.alibi_batch_stride = alibi_batch_stride;
        }
        return fa::reference::check_attention_backward(problem, q_rows, k_rows);
    }
};

constexpr Shape k_shapes[] = {
    {2, 128, 128, 4, 4, false},       {2, 128, 128, 4, 4, true},        {1, 1, 1, 2, 2, false},
    {1, 1000, 1000, 8, 1, true},      {2, 100, 257, 8, 2, true},        {2, 257, 100, 4, 1, true},
    {1, 300, 1000, 4, 4, true, true}, {1, 1000, 300, 8, 2, true, true}, {1, 17, 600, 4, 1, false},
    {2, 513, 513, 4, 2, false},
};

struct Case {
    fa::KernelConfig config;
    Shape shape;
};

std::vector<Case> cases() {
    std::vector<Case> v;
    for (const fa::KernelConfig& c : fa::testing::backward_configs()) {
        for (const Shape& s : k_shapes)
            v.push_back({c, s});
    }
    return v;
}

// Whether the build has a backward kernel of this dtype and head dim (V's the same), and a
// forward one for O and the LSE.
bool backward_built(fa::DType dtype, int d) {
    return fa::testing::has_forward(dtype, d, d) &&
           fa::testing::has_backward([&](const fa::KernelConfig& c) {
               return c.dtype == dtype && c.d_head == d && c.v_head_dim() == d;
           });
}

// Whether the build has a forward kernel for a backward config's O and LSE (a partial build may
// not).
bool forward_for(const fa::KernelConfig& c) {
    return fa::testing::has_forward(c.dtype, c.d_head, c.v_head_dim());
}

void PrintTo(const Case& c, std::ostream* os) {
    *os << c.config.to_string() << ", batch " << c.shape.batch << ", q" << c.shape.seq_q << " k"
        << c.shape.seq_k << ", heads " << c.shape.heads << "/" << c.shape.heads_kv
        << (c.shape.causal ? ", causal" : "") << (c.shape.top_left ? " top left" : "");
}

class EveryBackwardConfig : public ::testing::TestWithParam<Case> {};

TEST_P(EveryBackwardConfig, MatchesReference) {
    const auto& [config, shape] = GetParam();
    if (!fa::is_supported(config))
        GTEST_SKIP() << config.to_string() << " cannot run on this GPU";
    if (!forward_for(config))
        GTEST_SKIP() << "this build has no forward kernel of " << fa::to_string(config.dtype)
                     << " d_head " << config.d_head << " for O and the LSE";
    Problem p(config.dtype, config, shape, fresh_seed());
    const auto result = p.run_and_check([&] { fa::backward(p.params(), config); });
    EXPECT_TRUE(result.passed) << result.summary() << "; seed " << p.seed;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
    const std::string name = fa::testing::config_identifier(info.param.config);
    const Shape& s = info.param.shape;
    return name + "_q" + std::to_string(s.seq_q) + "_k" + std::to_string(s.seq_k) + "_h" +
           std::to_string(s.heads) + "_" + std::to_string(s.heads_kv) +
           (s.causal ? (s.top_left ? "_causal_tl" : "_causal") : "") + "_" +
           std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Built, EveryBackwardConfig, ::testing::ValuesIn(cases()), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EveryBackwardConfig);

// The automatic choice: backward(params) without a config, every dtype and head dim built.
TEST(Backward, AutomaticChoiceMatchesReference) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    for (const fa::DType dtype : {fa::DType::BF16, fa::DType::FP16}) {
        for (const int d : {64, 96, 128, 192, 256}) {
            if (!backward_built(dtype, d))
                continue;  // a partial build's (the release set has every one)
            const Shape shape{2, 333, 333, 8, 2, true};
            Problem p(dtype, d, shape, fresh_seed());
            const auto result = p.run_and_check([&] { fa::backward(p.params()); });
            EXPECT_TRUE(result.passed) << fa::to_string(dtype) << " d_head " << d << ": "
                                       << result.summary() << "; seed " << p.seed;
            // The pool's memory handed back: the next call maps its workspace afresh.
            EXPECT_NO_THROW(fa::release_cached_memory());
        }
    }
}

std::vector<std::uint16_t> bits_of(const DeviceTensor& t, const HostTensor& shape_of) {
    return t.download(shape_of).bits;
}

// Stream-K (streamk, BackwardStreamK): non-causal problems whose last round the kernel splits
// into ranges of steps, at this GPU's SM count: one whose last round holds a third of the CTAs
// or more (its own key blocks split), one that holds fewer (the round before it split too);
// odd lengths, GQA, and a softcap. Sampled rows against the reference, and every element of dQ,
// dK and dV against the same kernel without stream-K where the build has it (the sums' order
// differs, so within a 16-bit rounding or two, and some of dK's and dV's bits differ: the run
// split).
TEST(Backward, StreamKSplitsTheLastRound) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    std::vector<fa::KernelConfig> configs;
    for (const fa::KernelConfig& c : fa::testing::backward_configs()) {
        if (c.sm90.stream_k && fa::is_supported(c) && forward_for(c))
            configs.push_back(c);
    }
    if (configs.empty())
        GTEST_SKIP() << "no stream-K backward config in this build with a forward kernel of its "
                        "dtype and head dim, or not a Hopper GPU";
    const int sms = fa::DeviceProperties::current().sm_count;
    for (const fa::KernelConfig& c : configs) {
        fa::KernelConfig plain = c;
        plain.sm90.stream_k = false;
        const bool compare = fa::is_built(plain);
        for (const auto& [seq_q, seq_k, heads, heads_kv, softcap, short_round] :
             {std::tuple{777, 1000, 8, 4, 0.0f, false}, std::tuple{777, 1000, 8, 4, 0.0f, true},
              std::tuple{1000, 333, 8, 2, 30.0f, false}}) {
            // The first batch that splits in the way asked for.
            Shape shape{0, seq_q, seq_k, heads, heads_kv, false};
            fa::sm90::BackwardStreamK split;
            for (int batch = 1; batch < 200 && !split.splits(); ++batch) {
                fa::BackwardArgs a{};
                a.batch = batch;
                a.seq_q = seq_q;
                a.seq_k = seq_k;
                a.heads = heads;
                a.heads_kv = heads_kv;
                const std::int64_t key_blocks =
                    fa::sm90::KeyBlockScheduler::of(a, c.B_c, false).count();
                const fa::sm90::BackwardStreamK k = fa::sm90::BackwardStreamK::of(
                    a, c.B_r, c.B_c, std::min<std::int64_t>(key_blocks, sms));
                if (k.splits() && (k.blocks > k.ranges) == short_round) {
                    split = k;
                    shape.batch = batch;
                }
            }
            ASSERT_TRUE(split.splits()) << "no batch splits q" << seq_q << " k" << seq_k;
            SCOPED_TRACE(::testing::Message()
                         << c.to_string() << ", batch " << shape.batch << " q" << seq_q << " k"
                         << seq_k << ", heads " << heads << "/" << heads_kv << ", softcap "
                         << softcap << ": " << split.blocks << " key blocks split over "
                         << split.ranges << " ranges of " << split.units() / split.ranges
                         << " steps");
            Problem p(c.dtype, c, shape, fresh_seed(), false, softcap);
            const auto result = p.run_and_check([&] { fa::backward(p.params(), c); });
            EXPECT_TRUE(result.passed) << result.summary() << "; seed " << p.seed;
            if (!compare)
                continue;
            const HostTensor dq = p.dev_dq.download(p.q), dk = p.dev_dk.download(p.k),
                             dv = p.dev_dv.download(p.v);
            fa::backward(p.params(), plain);
            fa::tools::synchronize();
            // dK and dV are summed in a fixed order within a CTA, so without a split the two
            // kernels agree bit for bit; a split adds the pieces' fp32 partials in another.
            std::int64_t reordered = 0;
            for (const auto& [split_run, plain_run, name] :
                 {std::tuple{&dq, p.dev_dq.download(p.q), "dq"},
                  std::tuple{&dk, p.dev_dk.download(p.k), "dk"},
                  std::tuple{&dv, p.dev_dv.download(p.v), "dv"}}) {
                float largest = 0.0f;
                for (const float x : plain_run.values)
                    largest = std::max(largest, std::abs(x));
                std::int64_t off = 0;
                for (std::size_t i = 0; i < plain_run.values.size(); ++i) {
                    const float a = split_run->values[i], b = plain_run.values[i];
                    off += !(std::abs(a - b) <= 0.02f * std::abs(b) + 1e-3f * largest);
                    reordered += std::string_view(name) != "dq" && a != b;
                }
                EXPECT_EQ(off, 0) << name << ": elements off the kernel without stream-K; seed "
                                  << p.seed;
            }
            EXPECT_GT(reordered, 0)
                << "dK and dV equal the kernel's without stream-K bit for bit: nothing split";
        }
    }
}

// Deterministic mode: ten runs give the same bits, and a batch entry's gradients are the same
// bits alone and in a batch of three.
TEST(Backward, Deterministic) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    // GQA and not: the ordered kernels' two add orders (KeyBlockScheduler); every head dim's
    // ordered kernel (d_head 96's 64-byte tiles and uneven dQ, 192's and MLA's split gradients).
    const HeadDims mla(
        fa::KernelConfig::parse("(BF16, 192, 64, 64, 12): sm90+dv_128+bwd+stages_2"));
    for (const HeadDims dims : {HeadDims(128), HeadDims(96), HeadDims(192), mla}) {
        if (!fa::testing::has_backward([&](const fa::KernelConfig& c) {
                return c.sm90.ordered_dq && c.dtype == fa::DType::BF16 && c.d_head == dims.d &&
                       c.v_head_dim() == dims.d_v;
            }))
            continue;  // a partial build's (the release set has every one)
        for (const auto& [causal, heads_kv] :
             {std::pair{false, 2}, std::pair{true, 2}, std::pair{true, 8}}) {
            const Shape shape{3, 700, 700, 8, heads_kv, causal};
            Problem p(fa::DType::BF16, dims, shape, fresh_seed());
            p.deterministic = true;
            // The baseline is checked against the reference: equal bits of runs that wrote
            // nothing would be the poison's.
            const auto result = p.run_and_check([&] { fa::backward(p.params()); });
            ASSERT_TRUE(result.passed) << "d_head " << dims.d << "/" << dims.d_v << ": "
                                       << result.summary() << "; seed " << p.seed;
            const auto dq = bits_of(p.dev_dq, p.q), dk = bits_of(p.dev_dk, p.k),
                       dv = bits_of(p.dev_dv, p.v);
            for (int run = 1; run < 10; ++run) {
                p.dev_dq.buffer.poison_with_nan();
                p.dev_dk.buffer.poison_with_nan();
                p.dev_dv.buffer.poison_with_nan();
                fa::backward(p.params());
                ASSERT_EQ(bits_of(p.dev_dq, p.q), dq)
                    << "run " << run << ", d_head " << dims.d << "/" << dims.d_v << ", heads_kv "
                    << heads_kv;
                ASSERT_EQ(bits_of(p.dev_dk, p.k), dk) << "run " << run;
                ASSERT_EQ(bits_of(p.dev_dv, p.v), dv) << "run " << run;
            }
            // Batch entry 1 alone: views of its slices of every tensor.
            const auto entry = [](const fa::TensorView& t) {
                fa::TensorView one = t;
                one.shape[0] = 1;
                one.data = static_cast<char*>(t.data) + t.stride[0] * 2;
                return one;
            };
            fa::tools::DeviceTensor dq1 = DeviceTensor::empty_like(p.q),
                                    dk1 = DeviceTensor::empty_like(p.k),
                                    dv1 = DeviceTensor::empty_like(p.v);
            fa::BackwardParams one = p.params();
            one.q = entry(one.q);
            one.k = entry(one.k);
            one.v = entry(one.v);
            one.o = entry(one.o);
            one.d_o = entry(one.d_o);
            one.dq = entry(dq1.view);
            one.dk = entry(dk1.view);
            one.dv = entry(dv1.view);
            one.dq.data = dq1.view.data;  // a tensor of one entry at the buffer's start
            one.dk.data = dk1.view.data;
            one.dv.data = dv1.view.data;
            // The LSE of entry 1: (batch, heads, seq_q) rows, entry 1 after the first's.
            one.options.lse = static_cast<float*>(p.lse.data()) + shape.heads * shape.seq_q;
            for (fa::tools::DeviceTensor* t : {&dq1, &dk1, &dv1})
                t->buffer.poison_with_nan();
            fa::backward(one);
            fa::tools::synchronize();
            const auto row_bytes = [&](const fa::TensorView& t) {
                return static_cast<std::size_t>(t.stride[0]) * 2;
            };
            const auto all_dq = bits_of(dq1, p.q), all_dk = bits_of(dk1, p.k),
                       all_dv = bits_of(dv1, p.v);
            const auto same_entry = [&](const std::vector<std::uint16_t>& alone,
                                        const std::vector<std::uint16_t>& batched,
                                        std::size_t bytes) {
                return std::memcmp(alone.data(), batched.data() + bytes / 2, bytes) == 0;
            };
            const std::string which =
                "d_head " + std::to_string(dims.d) + "/" + std::to_string(dims.d_v) + ", causal " +
                std::to_string(causal) + ", heads_kv " + std::to_string(heads_kv);
            EXPECT_TRUE(same_entry(all_dq, dq, row_bytes(p.dev_dq.view))) << "dq, " << which;
            EXPECT_TRUE(same_entry(all_dk, dk, row_bytes(p.dev_dk.view))) << "dk, " << which;
            EXPECT_TRUE(same_entry(all_dv, dv, row_bytes(p.dev_dv.view))) << "dv, " << which;
        }
    }
}

// Attention sinks: dQ, dK, dV (the LSE carries the sinks) and dsinks against the reference, on
// shapes with rows that see no key (all sink) and GQA, for each head dim and dtype built; dsinks
// are the same bits run to run, deterministic or not.
TEST(Backward, SinksMatchReference) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    int ran = 0;
    for (const fa::DType dtype : {fa::DType::BF16, fa::DType::FP16}) {
        for (const int d : {64, 96, 128, 192, 256}) {
            for (const Shape& shape :
                 {Shape{2, 257, 100, 8, 2, true}, Shape{1, 300, 1000, 4, 4, false},
                  Shape{2, 128, 128, 4, 1, true, true}}) {
                try {
                    Problem p(dtype, d, shape, fresh_seed(), true);
                    const auto result = p.run_and_check([&] { fa::backward(p.params()); });
                    EXPECT_TRUE(result.passed) << fa::to_string(dtype) << " d_head " << d << ": "
                                               << result.summary() << "; seed " << p.seed;
                    const std::vector<float> first = p.dev_d_sinks.download_floats();
                    p.dev_d_sinks.poison_with_nan();
                    fa::backward(p.params());
                    fa::tools::synchronize();
                    EXPECT_EQ(p.dev_d_sinks.download_floats(), first) << "dsinks differ run to run";
                    ++ran;
                } catch (const fa::Error& e) {
                    // Unsupported only where the build has no backward kernel of this dtype
                    // and head dim.
                    if (e.code() != fa::ErrorCode::unsupported || backward_built(dtype, d))
                        throw;
                }
            }
        }
    }
    EXPECT_GT(ran, 0) << "no backward kernel built";
}

// A logit softcap: dQ, dK, dV through tanh's derivative against the reference, with sinks on one
// shape, for every built dtype and head dim (both families).
TEST(Backward, SoftcapMatchesReference) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    int ran = 0;
    for (const fa::DType dtype : {fa::DType::BF16, fa::DType::FP16}) {
        for (const int d : {64, 96, 128, 192, 256}) {
            for (const auto& [shape, sinks] :
                 {std::pair{Shape{2, 257, 100, 8, 2, true}, true},
                  std::pair{Shape{1, 300, 1000, 4, 4, false}, false},
                  std::pair{Shape{2, 128, 128, 4, 1, true, true}, false}}) {
                try {
                    Problem p(dtype, d, shape, fresh_seed(), sinks, 5.0f);
                    const auto result = p.run_and_check([&] { fa::backward(p.params()); });
                    EXPECT_TRUE(result.passed) << fa::to_string(dtype) << " d_head " << d << ": "
                                               << result.summary() << "; seed " << p.seed;
                    ++ran;
                } catch (const fa::Error& e) {
                    // Unsupported only where the build has no backward kernel of this dtype
                    // and head dim.
                    if (e.code() != fa::ErrorCode::unsupported || backward_built(dtype, d))
                        throw;
                }
            }
        }
    }
    EXPECT_GT(ran, 0) << "no backward kernel built";
}

// Sliding windows on every built backward config (both families; the ordered ones bitwise stable
// run to run): causal with a left side, both sides without causal, windows narrower than a
// block, rows and keys no window reaches (seq_q != seq_k at both alignments), GQA, and with a
// softcap and sinks; and key blocks of no steps (keys no window reaches) among ones with steps,
// several a CTA where CTAs are persistent (960 key blocks).
TEST(Backward, WindowMatchesReference) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    struct WindowCase {
        Shape shape;
        std::pair<int, int> window;
        float softcap;
        bool sinks;
    };
    const WindowCase window_cases[] = {
        {{2, 700, 700, 4, 2, true}, {100, 0}, 0.0f, false},
        {{1, 700, 700, 4, 4, false}, {64, 200}, 0.0f, false},
        {{1, 333, 900, 8, 2, true}, {129, 0}, 0.0f, false},
        {{1, 900, 333, 4, 1, true, true}, {37, 0}, 0.0f, true},
        {{1, 500, 500, 4, 2, false}, {0, 0}, 0.0f, false},
        {{1, 640, 513, 4, 4, false, true}, {-1, 100}, 0.0f, false},
        {{1, 700, 700, 4, 2, true}, {255, 0}, 5.0f, true},
        {{2, 130, 1500, 40, 40, false}, {30, 30}, 0.0f, false},
    };
    for (const fa::KernelConfig& config : fa::testing::backward_configs()) {
        if (!forward_for(config))
            continue;
        for (const WindowCase& c : window_cases) {
            Problem p(config.dtype, config, c.shape, fresh_seed(), c.sinks, c.softcap, c.window);
            p.deterministic = fa::is_deterministic(config);
            const auto run = [&] { fa::backward(p.params(), config); };
            const auto result = p.run_and_check(run);
            EXPECT_TRUE(result.passed)
                << config.to_string() << ", window " << c.window.first << ", " << c.window.second
                << ", q" << c.shape.seq_q << " k" << c.shape.seq_k << ": " << result.summary()
                << "; seed " << p.seed;
            if (p.deterministic) {
                const HostTensor dq = p.dev_dq.download(p.q), dk = p.dev_dk.download(p.k),
                                 dv = p.dev_dv.download(p.v);
                for (fa::tools::DeviceTensor* t : {&p.dev_dq, &p.dev_dk, &p.dev_dv})
                    t->buffer.poison_with_nan();
                run();
                fa::tools::synchronize();
                EXPECT_EQ(p.dev_dq.download(p.q).bits, dq.bits) << config.to_string();
                EXPECT_EQ(p.dev_dk.download(p.k).bits, dk.bits) << config.to_string();
                EXPECT_EQ(p.dev_dv.download(p.v).bits, dv.bits) << config.to_string();
            }
        }
    }
}

// ALiBi on every built backward config (both families: the band kernels take its bias): causal
// with and without GQA, per-(batch, head) slopes with seq_q != seq_k at both alignments, odd
// lengths, and with a window, a softcap and sinks. Slopes uniform in [0, 0.3) as flash_attn's tests
// draw them, one of 2 (a sharp row).
TEST(Backward, AlibiMatchesReference) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    struct AlibiCase {
        Shape shape;
        bool per_batch;
        std::pair<int, int> window;
        float softcap;
        bool sinks;
    };
    const AlibiCase alibi_cases[] = {
        {{1, 700, 700, 4, 2, true}, false, {-1, -1}, 0.0f, false},
        // Without GQA: the ordered kernels' causal walk, highest key block first.
        {{1, 700, 700, 4, 4, true}, false, {-1, -1}, 0.0f, false},
        {{2, 300, 1000, 4, 4, false}, true, {-1, -1}, 0.0f, false},
        {{2, 1000, 300, 4, 1, true, true}, true, {-1, -1}, 0.0f, false},
        {{1, 257, 513, 4, 2, false}, false, {-1, -1}, 0.0f, false},
        {{1, 700, 700, 4, 2, true}, false, {255, 0}, 5.0f, true},
    };
    for (const fa::KernelConfig& config : fa::testing::backward_configs()) {
        if (!forward_for(config))
            continue;
        for (const AlibiCase& c : alibi_cases) {
            Problem p(config.dtype, config, c.shape, fresh_seed(), c.sinks, c.softcap, c.window);
            std::mt19937_64 rng(p.seed + 7);
            std::uniform_real_distribution<float> uniform(0.0f, 0.3f);
            std::vector<float> slopes(
                static_cast<std::size_t>((c.per_batch ? c.shape.batch : 1) * c.shape.heads));
            for (float& x : slopes)
                x = uniform(rng);
            slopes.back() = 2.0f;
            p.set_alibi(std::move(slopes));
            p.deterministic = fa::is_deterministic(config);
            const auto result = p.run_and_check([&] { fa::backward(p.params(), config); });
            EXPECT_TRUE(result.passed)
                << config.to_string() << ", q" << c.shape.seq_q << " k" << c.shape.seq_k
                << (c.shape.causal ? ", causal" : "") << (c.per_batch ? ", per-batch slopes" : "")
                << ", window " << c.window.first << ", softcap " << c.softcap << ": "
                << result.summary() << "; seed " << p.seed;
        }
    }
}

// Rows [row0, row0 + len) of a packed (1, total, heads, d) tensor as a dense one of batch 1.
HostTensor rows_of(const HostTensor& t, std::int64_t row0, std::int64_t len) {
    const std::int64_t row = t.heads * t.d_head;
    const auto first = t.bits.begin() + row0 * row;
    return HostTensor::from_bits(t.dtype, 1, len, t.heads, t.d_head,
                                 std::vector<std::uint16_t>(first, first + len * row));
}

// Packed sequences on every built backward config (both families): empty and one-token
// sequences, keys cut by seqused_k, rows past the last offset (NaN in the inputs); causal at both
// alignments, a window, a softcap, GQA. Each sequence against the reference alone; rows no
// sequence uses get zeros; the deterministic configs are bitwise stable.
TEST(Backward, VarlenMatchesReference) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    struct VarlenCase {
        std::vector<std::int32_t> lens_q, lens_k, used;  // used empty: every key
        bool causal, top_left;
        std::pair<int, int> window;
        float softcap;
    };
    std::vector<VarlenCase> varlen_cases = {
        {{300, 0, 1, 129, 257}, {300, 5, 1, 200, 257}, {}, true, false, {-1, -1}, 0.0f},
        {{100, 37, 250}, {300, 64, 250}, {280, 0, 250}, false, false, {-1, -1}, 0.0f},
        {{200, 1, 180}, {150, 130, 180}, {}, true, true, {63, 0}, 5.0f},
    };
    // An empty first sequence, and more key blocks (3 a sequence, 2 K/V heads, 25 sequences)
    // than an H100 or H200 has SMs, so that persistent CTAs take key blocks from the dynamic
    // schedule's counter, which the preprocess zeroes (with no rows in the first sequence).
    VarlenCase many{{0}, {0}, {}, true, false, {-1, -1}, 0.0f};
    for (int b = 1; b < 25; ++b) {
        many.lens_q.push_back(40 + 13 * b);
        many.lens_k.push_back(300 + b);
    }
    varlen_cases.push_back(many);
    const int heads = 4, heads_kv = 2;
    const bool hopper = fa::DeviceProperties::current().major == 9;
    for (const fa::KernelConfig& config : fa::testing::backward_configs()) {
        // forward_varlen, whose output this reads, runs head dims without a split-KV kernel on
        // the sm90 family only.
        if ((!hopper && (!fa::serving::has_split_kv(config.d_head) || config.d_v != 0)) ||
            !forward_for(config))
            continue;
        for (const VarlenCase& c : varlen_cases) {
            const std::uint64_t seed = fresh_seed();
            const auto batch = static_cast<std::int64_t>(c.lens_q.size());
            std::vector<std::int32_t> cu_q{0}, cu_k{0};
            for (std::int64_t b = 0; b < batch; ++b) {
                cu_q.push_back(cu_q.back() + c.lens_q[b]);
                cu_k.push_back(cu_k.back() + c.lens_k[b]);
            }
            const std::int64_t total_q = cu_q.back() + 2, total_k = cu_k.back() + 2;
            const int d = config.d_head, d_v = config.v_head_dim();
            // Rows no sequence uses hold NaN (a buffer's unwritten tail): nothing may reach the
            // gradients from them.
            const auto with_nan_rows = [&](HostTensor t, const std::vector<std::int32_t>& cu,
                                           bool keys) {
                const std::uint16_t nan = config.dtype == fa::DType::BF16 ? 0x7FC0 : 0x7E00;
                const std::int64_t row = t.heads * t.d_head;
                for (std::int64_t r = 0; r < t.seq; ++r) {
                    bool used = false;
                    for (std::int64_t b = 0; b < batch; ++b) {
                        const std::int64_t len =
                            keys && !c.used.empty() ? c.used[b] : cu[b + 1] - cu[b];
                        used = used || (r >= cu[b] && r < cu[b] + len);
                    }
                    if (!used)
                        std::fill_n(t.bits.begin() + r * row, row, nan);
                }
                return HostTensor::from_bits(t.dtype, t.batch, t.seq, t.heads, t.d_head, t.bits);
            };
            const HostTensor q = with_nan_rows(
                HostTensor::random_normal(config.dtype, 1, total_q, heads, d, seed), cu_q, false);
            const HostTensor k = with_nan_rows(
                HostTensor::random_normal(config.dtype, 1, total_k, heads_kv, d, seed + 1), cu_k,
                true);
            const HostTensor v = with_nan_rows(
                HostTensor::random_normal(config.dtype, 1, total_k, heads_kv, d_v, seed + 2), cu_k,
                true);
            const HostTensor d_o = with_nan_rows(
                HostTensor::random_normal(config.dtype, 1, total_q, heads, d_v, seed + 3), cu_q,
                false);
            DeviceTensor dev_q = DeviceTensor::upload(q), dev_k = DeviceTensor::upload(k);
            DeviceTensor dev_v = DeviceTensor::upload(v), dev_d_o = DeviceTensor::upload(d_o);
            DeviceTensor dev_o = DeviceTensor::empty_like(d_o),
                         dev_dq = DeviceTensor::empty_like(q);
            DeviceTensor dev_dk = DeviceTensor::empty_like(k), dev_dv = DeviceTensor::empty_like(v);
            DeviceBuffer lse(static_cast<std::size_t>(heads * total_q) * sizeof(float));
            DeviceBuffer dev_cu_q(cu_q.size() * 4), dev_cu_k(cu_k.size() * 4), dev_used;
            dev_cu_q.upload(cu_q);
            dev_cu_k.upload(cu_k);
            if (!c.used.empty()) {
                dev_used = DeviceBuffer(c.used.size() * 4);
                dev_used.upload(c.used);
            }
            fa::AttentionOptions options{
                .softmax_scale = std::nullopt,
                .causal = c.causal,
                .causal_alignment =
                    c.top_left ? fa::CausalAlignment::top_left : fa::CausalAlignment::bottom_right,
                .lse = static_cast<float*>(lse.data()),
                .variants = {.window_left = c.window.first,
                             .window_right = c.window.second,
                             .softcap = c.softcap}};
            const auto* used =
                c.used.empty() ? nullptr : static_cast<const std::int32_t*>(dev_used.data());
            const std::int64_t max_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
            const std::int64_t max_k = *std::max_element(c.lens_k.begin(), c.lens_k.end());
            fa::VarlenParams forward;
            forward.q = dev_q.view, forward.k = dev_k.view, forward.v = dev_v.view;
            forward.o = dev_o.view;
            forward.cu_seqlens_q = static_cast<const std::int32_t*>(dev_cu_q.data());
            forward.cu_seqlens_k = static_cast<const std::int32_t*>(dev_cu_k.data());
            forward.seqused_k = used;
            forward.batch = batch, forward.max_seqlen_q = max_q, forward.max_seqlen_k = max_k;
            forward.options = options;
            fa::forward_varlen(forward);
            fa::VarlenBackwardParams p;
            p.q = dev_q.view, p.k = dev_k.view, p.v = dev_v.view, p.o = dev_o.view;
            p.d_o = dev_d_o.view, p.dq = dev_dq.view, p.dk = dev_dk.view, p.dv = dev_dv.view;
            p.cu_seqlens_q = forward.cu_seqlens_q, p.cu_seqlens_k = forward.cu_seqlens_k;
            p.seqused_k = used;
            p.batch = batch, p.max_seqlen_q = max_q, p.max_seqlen_k = max_k;
            p.options = options;
            p.deterministic = fa::is_deterministic(config);
            const auto run = [&] {
                dev_dq.buffer.poison_with_nan();
                dev_dk.buffer.poison_with_nan();
                dev_dv.buffer.poison_with_nan();
                fa::backward_varlen(p, config);
                fa::tools::synchronize();
                return std::vector<HostTensor>{dev_dq.download(q), dev_dk.download(k),
                                               dev_dv.download(v)};
            };
            const std::vector<HostTensor> g = run();
            const std::string what = config.to_string() + ", case " +
                                     std::to_string(&c - varlen_cases.data()) + ", seed " +
                                     std::to_string(seed);
            for (std::int64_t b = 0; b < batch; ++b) {
                const std::int64_t lq = c.lens_q[b];
                const std::int64_t lk = c.used.empty() ? c.lens_k[b] : c.used[b];
                const std::vector<std::int32_t>& cu = cu_k;
                for (std::int64_t row = cu[b] + lk; row < cu[b + 1]; ++row) {  // keys not used
                    for (const HostTensor* t : {&g[1], &g[2]}) {
                        const std::int64_t size = heads_kv * t->d_head;
                        for (std::int64_t x = 0; x < size; ++x)
                            ASSERT_EQ(t->bits[row * size + x], 0) << what;
                    }
                }
                if (lk == 0) {  // queries that see no key: zero gradients
                    for (std::int64_t x = cu_q[b] * heads * d; x < (cu_q[b] + lq) * heads * d; ++x)
                        ASSERT_EQ(g[0].bits[x], 0) << what;
                }
                if (lq == 0 || lk == 0)
                    continue;
                const HostTensor qs = rows_of(q, cu_q[b], lq), ks = rows_of(k, cu[b], lk);
                const HostTensor vs = rows_of(v, cu[b], lk), dos = rows_of(d_o, cu_q[b], lq);
                const HostTensor dqs = rows_of(g[0], cu_q[b], lq), dks = rows_of(g[1], cu[b], lk);
                const HostTensor dvs = rows_of(g[2], cu[b], lk);
                fa::reference::BackwardProblem problem{
                    qs,       ks,        vs, dos, dqs, dks, dvs, 1.0 / std::sqrt(double(d)),
                    c.causal, c.top_left};
                problem.softcap = c.softcap;
                problem.window_left = c.window.first;
                problem.window_right = c.window.second;
                const auto result = fa::reference::check_attention_backward(
                    problem, fa::reference::sample_rows(1, heads, lq, 48, seed + b),
                    fa::reference::sample_rows(1, heads_kv, lk, 48, seed + b + 9));
                EXPECT_TRUE(result.passed)
                    << what << ", sequence " << b << ": " << result.summary();
            }
            for (const auto& [t, row0, heads_of] :
                 {std::tuple{&g[0], cu_q.back(), heads}, std::tuple{&g[1], cu_k.back(), heads_kv},
                  std::tuple{&g[2], cu_k.back(), heads_kv}}) {
                for (std::int64_t x = row0 * heads_of * t->d_head; x < std::ssize(t->bits); ++x)
                    ASSERT_EQ(t->bits[x], 0) << "rows past the last offset, " << what;
            }
            if (p.deterministic) {
                const std::vector<HostTensor> again = run();
                for (int i = 0; i < 3; ++i)
                    EXPECT_EQ(again[i].bits, g[i].bits) << what;
            }
        }
    }
}

// dO broadcast along its rows (a stride of 0, as out.sum()'s gradient arrives) is no TMA source:
// the automatic choice runs an sm80 kernel, and an sm90 config is refused naming the stride.
TEST(Backward, BroadcastDoutRunsOnTheSm80Family) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    if (!fa::testing::has_backward([](const fa::KernelConfig& c) {
            return c.family == fa::Family::sm80 && c.dtype == fa::DType::BF16 && c.d_head == 64;
        }))
        GTEST_SKIP() << "this build has no sm80 backward kernel of BF16 d_head 64";
    Problem p(fa::DType::BF16, 64, {2, 129, 129, 4, 2, true}, fresh_seed());
    std::vector<std::uint16_t> bits(p.d_o.bits);
    for (std::int64_t b = 0; b < p.d_o.batch; ++b) {
        for (std::int64_t s = 1; s < p.d_o.seq; ++s) {
            std::copy_n(p.d_o.bits.begin() + p.d_o.offset(b, 0, 0), p.d_o.heads * p.d_o.d_head,
                        bits.begin() + p.d_o.offset(b, s, 0));
        }
    }
    p.d_o = HostTensor::from_bits(p.d_o.dtype, p.d_o.batch, p.d_o.seq, p.d_o.heads, p.d_o.d_head,
                                  std::move(bits));
    p.dev_d_o = DeviceTensor::upload(p.d_o);
    p.dev_d_o.view.stride[1] = 0;
    const auto result = p.run_and_check([&] { fa::backward(p.params()); });
    EXPECT_TRUE(result.passed) << result.summary() << "; seed " << p.seed;
    for (const fa::KernelConfig& c : fa::testing::backward_configs()) {
        if (c.family != fa::Family::sm90 || c.d_head != 64 || c.dtype != fa::DType::BF16)
            continue;
        try {
            fa::backward(p.params(), c);
            ADD_FAILURE() << c.to_string() << " ran with a zero dO stride";
        } catch (const fa::Error& e) {
            EXPECT_EQ(e.code(), fa::ErrorCode::unsupported) << e.what();
            EXPECT_NE(std::string(e.what()).find("d_o.stride[1]"), std::string::npos) << e.what();
        }
    }
}

// A CUDA failure or bad input never leaves a silent wrong answer: the LSE is required and a
// window must agree with causal masking, each before any launch.
TEST(Backward, RefusesWhatItDoesNotCompute) {
    if (fa::device_count() == 0)
        GTEST_SKIP() << "no GPU";
    Problem p(fa::DType::BF16, 64, {1, 64, 64, 2, 2, false}, fresh_seed());
    // Each refusal for its own reason: the argument it names first.
    const auto expect_refused = [](const auto& call, const std::string& argument) {
        try {
            call();
            ADD_FAILURE() << "no exception; expected one naming " << argument;
        } catch (const fa::Error& e) {
            EXPECT_EQ(e.code(), fa::ErrorCode::invalid_argument) << e.what();
            EXPECT_EQ(std::string(e.what()).rfind(argument + ": expected", 0), 0u) << e.what();
        }
    };
    fa::BackwardParams no_lse = p.params();
    no_lse.options.lse = nullptr;
    expect_refused([&] { fa::backward(no_lse); }, "options.lse");
    fa::BackwardParams window = p.params();  // causal masking is a right side of 0
    window.options.causal = true;
    window.options.variants.window_right = 8;
    expect_refused([&] { fa::backward(window); }, "variants.window_right");
    fa::BackwardParams d_sinks_alone = p.params();  // a gradient for sinks the forward had not
    fa::tools::DeviceBuffer d_sinks(2 * sizeof(float));
    d_sinks_alone.d_sinks = static_cast<float*>(d_sinks.data());
    expect_refused([&] { fa::backward(d_sinks_alone); }, "d_sinks");
    const fa::KernelConfig forward_config = fa::testing::forward_configs().front();
    expect_refused([&] { fa::backward(p.params(), forward_config); }, "config");
}

}  // namespace
