// The FP8 (E4M3) reference: the encoding, every code and every rounding case, and the check's FP8
// rule able to fail. FlashAttention-3's FP8 computation passes, naive (one pass over the keys) and
// blocked as a kernel runs it; an all-zero output, the reference scaled by 1.05 (1.10), a row's
// values permuted and an LSE off by 0.05 do not; inputs that do not fit together are refused.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "flash_attention/tools.hpp"
#include "kernels/fp8.hpp"

namespace fa = flash_attention;
using fa::DType;
using fa::reference::from_float;
using fa::reference::HostTensor;
using fa::reference::RowSample;
using fa::reference::to_float;

namespace {

// A code's value from its fields, written apart from the library's decoding: exponent field 0
// holds m/8 x 2^-6, the others (1 + m/8) x 2^(e-7).
double e4m3_value(int code) {
    const int e = (code >> 3) & 15;
    const int m = code & 7;
    const double magnitude =
        e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
    return (code & 0x80) != 0 ? -magnitude : magnitude;
}

bool is_nan_code(int code) {
    return (code & 0x7F) == 0x7F;
}

// The e4m3 code nearest x >= 0, ties to the even code (an even mantissa), past 448 448: by search
// over the values of the codes 0x00 to 0x7E, which are in increasing order.
int nearest_code(double x) {
    static const std::vector<double> values = [] {
        std::vector<double> v;
        for (int code = 0; code <= 0x7E; ++code)
            v.push_back(e4m3_value(code));
        return v;
    }();
    const auto lo =
        static_cast<int>(std::upper_bound(values.begin(), values.end(), x) - values.begin()) - 1;
    if (lo == 0x7E || values[lo] == x)
        return lo;
    const double below = x - values[lo];
    const double above = values[lo + 1] - x;
    if (below != above)
        return below < above ? lo : lo + 1;
    return lo % 2 == 0 ? lo : lo + 1;
}

TEST(Fp8Encoding, EveryCodeDecodesAndRoundTrips) {
    for (int code = 0; code < 256; ++code) {
        const float value = to_float(DType::E4M3, static_cast<std::uint16_t>(code));
        if (is_nan_code(code)) {
            EXPECT_TRUE(std::isnan(value)) << code;
            continue;
        }
        EXPECT_EQ(value, e4m3_value(code)) << code;
        EXPECT_EQ(from_float(DType::E4M3, value), code) << code;  // -0 too: 0x80
    }
    EXPECT_EQ(to_float(DType::E4M3, 0x7E), 448.0f);
    EXPECT_EQ(to_float(DType::E4M3, 0x01), 0x1p-9f);  // the smallest subnormal
    EXPECT_EQ(to_float(DType::E4M3, 0x07), 0x1.cp-7f);
    EXPECT_EQ(to_float(DType::E4M3, 0x08), 0x1p-6f);  // the smallest normal
}

TEST(Fp8Encoding, RoundsToNearestEvenAndSaturates) {
    // Between each two neighbours (subnormals included): the midpoint goes to the even code, a
    // float either side of it to the nearer.
    for (int code = 0; code < 0x7E; ++code) {
        const float lo = to_float(DType::E4M3, static_cast<std::uint16_t>(code));
        const float hi = to_float(DType::E4M3, static_cast<std::uint16_t>(code + 1));
        const float mid = (lo + hi) / 2;  // exact: 5 significant bits
        const int even = code % 2 == 0 ? code : code + 1;
        EXPECT_EQ(from_float(DType::E4M3, mid), even) << mid;
        EXPECT_EQ(from_float(DType::E4M3, -mid), 0x80 | even) << -mid;
        EXPECT_EQ(from_float(DType::E4M3, std::nextafter(mid, lo)), code) << mid;
        EXPECT_EQ(from_float(DType::E4M3, std::nextafter(mid, hi)), code + 1) << mid;
    }
    EXPECT_EQ(from_float(DType::E4M3, 0x1p-10f), 0x00);  // half the smallest subnormal: to 0
    EXPECT_EQ(from_float(DType::E4M3, -0x1p-10f), 0x80);
    EXPECT_EQ(from_float(DType::E4M3, 0x1.8p-9f), 0x02);  // 1.5 steps: to 2
    EXPECT_EQ(from_float(DType::E4M3, 0x1.ep-7f), 0x08);  // 7.5 steps: into the first binade
    // Past 448, whatever the nearest would be (480 is NaN's code), 448: satfinite.
    for (const float big : {448.5f, 464.0f, 479.0f, 480.0f, 1e6f, std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity()}) {
        EXPECT_EQ(from_float(DType::E4M3, big), 0x7E) << big;
        EXPECT_EQ(from_float(DType::E4M3, -big), 0xFE) << -big;
    }
    EXPECT_EQ(from_float(DType::E4M3, std::numeric_limits<float>::quiet_NaN()), 0x7F);
    EXPECT_EQ(from_float(DType::E4M3, -std::numeric_limits<float>::quiet_NaN()), 0x7F);
    // Floats across e4m3's range and beyond it, their bit patterns 1021 apart (an odd spacing,
    // landing at ever different places between two neighbours), against the search.
    for (std::uint32_t bits = 0; bits < 0x44000000u; bits += 1021) {  // up to 512
        const float x = std::bit_cast<float>(bits);
        ASSERT_EQ(from_float(DType::E4M3, x), nearest_code(x)) << x;
    }
}

TEST(Fp8Encoding, RandomNormalValuesAreTheCodes) {
    const HostTensor t = HostTensor::random_normal(DType::E4M3, 2, 33, 3, 64, 7);
    double sum = 0, squares = 0;
    for (std::int64_t i = 0; i < t.size(); ++i) {
        ASSERT_LE(t.bits[i], 0xFF);
        ASSERT_FALSE(is_nan_code(t.bits[i]));
        ASSERT_EQ(t.values[i], e4m3_value(t.bits[i]));
        sum += t.values[i];
        squares += double(t.values[i]) * t.values[i];
    }
    EXPECT_NEAR(sum / t.size(), 0.0, 0.05);
    EXPECT_NEAR(squares / t.size(), 1.0, 0.05);
}

struct Fp8Inputs {
    HostTensor q, k, v;
    std::vector<float> q_descale, k_descale, v_descale;  // (batch, k.heads)
};

// (b, s, h, d) normal values quantised as a per-head FP8 recipe does: a descale per batch entry
// and K/V head (a query head's its K/V head's) that puts the largest magnitude of its slice at
// 448, the stored value input / descale rounded to e4m3.
HostTensor quantise(const std::vector<float>& x, std::int64_t batch, std::int64_t seq,
                    std::int64_t heads, std::int64_t d, std::int64_t group,
                    std::vector<float>& descale) {
    const std::int64_t kv_heads = heads / group;
    std::vector<float> amax(batch * kv_heads, 0.0f);
    for (std::int64_t i = 0; i < batch * seq * heads * d; ++i) {
        const std::int64_t b = i / (seq * heads * d);
        const std::int64_t h = i / d % heads;
        float& m = amax[b * kv_heads + h / group];
        m = std::max(m, std::abs(x[i]));
    }
    descale.resize(amax.size());
    for (std::size_t i = 0; i < amax.size(); ++i)
        descale[i] = amax[i] / 448.0f;
    std::vector<std::uint16_t> bits(x.size());
    for (std::int64_t i = 0; i < batch * seq * heads * d; ++i) {
        const std::int64_t b = i / (seq * heads * d);
        const std::int64_t h = i / d % heads;
        bits[i] = from_float(DType::E4M3, x[i] / descale[b * kv_heads + h / group]);
    }
    return HostTensor::from_bits(DType::E4M3, batch, seq, heads, d, bits);
}

struct Shape {
    bool outliers = false;
    bool causal = false;
    std::int64_t batch = 1, seq_q = 1, seq_k = 1;
    std::int64_t heads = 4, heads_kv = 2, d = 64;
    std::int64_t rows_per_head = 1000;
    double scale = 0.125;
};

// Random: normal e4m3 values with descales of their own per (batch entry, K/V head). Outliers:
// normal inputs with a few query and key channels 20 times the rest (as activations have),
// quantised to e4m3's range.
Fp8Inputs make_inputs(const Shape& s, std::uint64_t seed) {
    const std::int64_t group = s.heads / s.heads_kv;
    Fp8Inputs in;
    if (!s.outliers) {
        in.q = HostTensor::random_normal(DType::E4M3, s.batch, s.seq_q, s.heads, s.d, seed);
        in.k = HostTensor::random_normal(DType::E4M3, s.batch, s.seq_k, s.heads_kv, s.d, seed + 1);
        in.v = HostTensor::random_normal(DType::E4M3, s.batch, s.seq_k, s.heads_kv, s.d, seed + 2);
        for (std::int64_t i = 0; i < s.batch * s.heads_kv; ++i) {
            in.q_descale.push_back(0.5f + 0.25f * static_cast<float>(i));
            in.k_descale.push_back(1.5f - 0.125f * static_cast<float>(i));
            in.v_descale.push_back(0.75f + 0.5f * static_cast<float>(i));
        }
        return in;
    }
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    const auto draw = [&](std::int64_t seq, std::int64_t heads, bool outlier_channels) {
        std::vector<float> x(s.batch * seq * heads * s.d);
        for (std::size_t i = 0; i < x.size(); ++i) {
            const auto channel = static_cast<std::int64_t>(i) % s.d;
            const bool outlier = channel == 3 || channel == 17 || channel == 42;
            x[i] = normal(rng) * (outlier_channels && outlier ? 20.0f : 1.0f);
        }
        return x;
    };
    in.q =
        quantise(draw(s.seq_q, s.heads, true), s.batch, s.seq_q, s.heads, s.d, group, in.q_descale);
    in.k = quantise(draw(s.seq_k, s.heads_kv, true), s.batch, s.seq_k, s.heads_kv, s.d, 1,
                    in.k_descale);
    in.v = quantise(draw(s.seq_k, s.heads_kv, false), s.batch, s.seq_k, s.heads_kv, s.d, 1,
                    in.v_descale);
    return in;
}

HostTensor zeros_like_output(const Shape& s) {
    return HostTensor::from_bits(DType::BF16, s.batch, s.seq_q, s.heads, s.d,
                                 std::vector<std::uint16_t>(s.batch * s.seq_q * s.heads * s.d));
}

HostTensor with_values(HostTensor t, const std::vector<float>& values) {
    for (std::size_t i = 0; i < values.size(); ++i)
        t.bits[i] = from_float(t.dtype, values[i]);
    return HostTensor::from_bits(t.dtype, t.batch, t.seq, t.heads, t.d_head, t.bits);
}

// The keys query row i sees: [0, hi), bottom-right causal.
std::int64_t visible(const Shape& s, std::int64_t i) {
    return s.causal ? std::min(i + s.seq_k - s.seq_q + 1, s.seq_k) : s.seq_k;
}

std::int64_t descale_index(const Shape& s, const RowSample& r) {
    return r.batch * s.heads_kv + r.head / (s.heads / s.heads_kv);
}

struct Fp8Output {
    HostTensor out;
    std::vector<float> lse;
};

// FlashAttention-3's FP8 forward on the sampled rows (the others left zero), written apart from
// the checker: keys in blocks of `block` from the last block, an online softmax whose probabilities
// 2^(s - m + 8) are taken against the running max m and rounded to e4m3, the accumulator and row
// sum rescaled when m grows. With one block for all keys it is the naive FP8 computation the bound
// comes from.
Fp8Output fp8_attention(const Shape& s, const Fp8Inputs& in, const std::vector<RowSample>& rows,
                        std::int64_t block) {
    std::vector<float> out(s.batch * s.seq_q * s.heads * s.d, 0.0f);
    std::vector<float> lse(s.batch * s.heads * s.seq_q, 0.0f);
    std::vector<float> scores(s.seq_k), acc(s.d);
    for (const RowSample& r : rows) {
        const std::int64_t kv = r.head / (s.heads / s.heads_kv);
        const std::int64_t at = descale_index(s, r);
        const float scale_log2 =
            static_cast<float>(s.scale * std::numbers::log2e) * in.q_descale[at] * in.k_descale[at];
        const float* qr = &in.q.values[in.q.offset(r.batch, r.row, r.head)];
        float m = -INFINITY, sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0f);
        // The blocks from the last, as FlashAttention-3 takes them (the masked ones first).
        for (std::int64_t n = (visible(s, r.row) - 1) / block; n >= 0; --n) {
            const std::int64_t j0 = n * block;
            const std::int64_t j1 = std::min(j0 + block, visible(s, r.row));
            float block_max = -INFINITY;
            for (std::int64_t j = j0; j < j1; ++j) {
                const float* kr = &in.k.values[in.k.offset(r.batch, j, kv)];
                float dot = 0;
                for (std::int64_t x = 0; x < s.d; ++x)
                    dot += qr[x] * kr[x];
                scores[j] = dot * scale_log2;
                block_max = std::max(block_max, scores[j]);
            }
            const float m_new = std::max(m, block_max);
            const float rescale = std::exp2(m - m_new);  // 0 for the first block
            sum *= rescale;
            for (float& a : acc)
                a *= rescale;
            m = m_new;
            for (std::int64_t j = j0; j < j1; ++j) {
                const float p = std::exp2(scores[j] - m + 8.0f);
                sum += p;
                const float p8 = to_float(DType::E4M3, from_float(DType::E4M3, p));
                const float* vr = &in.v.values[in.v.offset(r.batch, j, kv)];
                for (std::int64_t x = 0; x < s.d; ++x)
                    acc[x] += p8 * vr[x];
            }
        }
        const float o_scale = 1.0f / sum * in.v_descale[at];
        for (std::int64_t x = 0; x < s.d; ++x)
            out[in.q.offset(r.batch, r.row, r.head) + x] = acc[x] * o_scale;
        lse[(r.batch * s.heads + r.head) * s.seq_q + r.row] =
            (m + std::log2(sum) - 8.0f) * std::numbers::ln2_v<float>;
    }
    return {with_values(zeros_like_output(s), out), lse};
}

// The dequantised inputs' attention in double on the sampled rows, times `factor`, in bf16.
HostTensor scaled_reference(const Shape& s, const Fp8Inputs& in, const std::vector<RowSample>& rows,
                            double factor) {
    std::vector<float> out(s.batch * s.seq_q * s.heads * s.d, 0.0f);
    for (const RowSample& r : rows) {
        const std::int64_t kv = r.head / (s.heads / s.heads_kv);
        const std::int64_t at = descale_index(s, r);
        std::vector<double> w(visible(s, r.row));
        double m = -INFINITY, sum = 0;
        for (std::size_t j = 0; j < w.size(); ++j) {
            double dot = 0;
            for (std::int64_t x = 0; x < s.d; ++x) {
                dot += double(in.q.values[in.q.offset(r.batch, r.row, r.head) + x]) *
                       in.q_descale[at] * in.k.values[in.k.offset(r.batch, j, kv) + x] *
                       in.k_descale[at];
            }
            w[j] = dot * s.scale;
            m = std::max(m, w[j]);
        }
        for (double& x : w)
            sum += (x = std::exp(x - m));
        for (std::int64_t x = 0; x < s.d; ++x) {
            double o = 0;
            for (std::size_t j = 0; j < w.size(); ++j)
                o += w[j] * in.v.values[in.v.offset(r.batch, j, kv) + x] * in.v_descale[at];
            out[in.q.offset(r.batch, r.row, r.head) + x] = static_cast<float>(factor * o / sum);
        }
    }
    return with_values(zeros_like_output(s), out);
}

fa::reference::CheckResult check(const Shape& s, const Fp8Inputs& in, const HostTensor& out,
                                 const std::vector<float>* lse,
                                 const std::vector<RowSample>& rows) {
    fa::reference::Problem p{in.q, in.k, in.v, out, s.scale, s.causal, lse};
    p.q_descale = &in.q_descale;
    p.k_descale = &in.k_descale;
    p.v_descale = &in.v_descale;
    return fa::reference::check_attention(p, rows);
}

class Fp8Reference : public testing::TestWithParam<Shape> {};

TEST_P(Fp8Reference, RightAnswersPassWrongOnesFail) {
    const Shape& s = GetParam();
    const Fp8Inputs in = make_inputs(s, 31);
    const auto rows = fa::reference::sample_rows(s.batch, s.heads, s.seq_q, s.rows_per_head, 9);

    // (a) The naive FP8 computation, and the kernel's blocked one (FlashAttention-3's blocks of
    // 128 keys at d_head 128 and 256).
    const Fp8Output naive = fp8_attention(s, in, rows, s.seq_k);
    const auto good = check(s, in, naive.out, &naive.lse, rows);
    EXPECT_TRUE(good.passed) << good.summary();
    const Fp8Output blocked = fp8_attention(s, in, rows, 128);
    const auto kernel_like = check(s, in, blocked.out, &blocked.lse, rows);
    EXPECT_TRUE(kernel_like.passed) << kernel_like.summary();

    // (b) An unwritten (zero) output: the bound is tighter than the outputs themselves, even
    // where a row averages thousands of keys.
    const auto zero = check(s, in, zeros_like_output(s), nullptr, rows);
    EXPECT_FALSE(zero.passed) << zero.summary();

    // (c) The reference scaled up: by 5% with outliers, whose rows attend to a few keys of the
    // largest probabilities (2^8, exact in e4m3). The naive FP8 output's error is 1.5-2.5% of the
    // largest output where a row averages keys of zero-mean values (many, or a few of similar
    // score): each probability's rounding to e4m3 is worth up to 6% of its weight, and such an
    // output is itself of the size those roundings add up to. Twice that, and the slack, is
    // 4-6%, so there a 5% error lies at the rule's resolution, and 10% is tested.
    const double factor = s.outliers ? 1.05 : 1.10;
    const auto large = check(s, in, scaled_reference(s, in, rows, factor), nullptr, rows);
    EXPECT_FALSE(large.passed) << "x " << factor << ": " << large.summary();

    // (d) One row's values rotated by a column.
    const RowSample r = rows[rows.size() / 2];
    std::vector<float> rotated = naive.out.values;
    const auto begin = rotated.begin() + naive.out.offset(r.batch, r.row, r.head);
    std::rotate(begin, begin + 1, begin + s.d);
    const auto permuted = check(s, in, with_values(naive.out, rotated), nullptr, rows);
    EXPECT_FALSE(permuted.passed) << permuted.summary();

    // (e) One row's LSE off by 0.05 fails where the tensor cores' accumulation
    // (k_fp8_accumulation) bounds scores that finely: inputs of ordinary scale. Outliers' scores
    // reach hundreds, where 14 bits leave the LSE uncertain by more: an LSE off by twice that
    // bound fails there.
    const auto exact = check(s, in, naive.out, &naive.lse, rows);
    ASSERT_TRUE(exact.passed) << exact.summary();
    const float off = s.outliers ? static_cast<float>(2 * exact.lse_tolerance) : 0.05f;
    if (!s.outliers) {
        EXPECT_LT(exact.lse_tolerance, 0.025) << exact.summary();
    }
    std::vector<float> bad_lse = naive.lse;
    bad_lse[(r.batch * s.heads + r.head) * s.seq_q + r.row] += off;
    const auto lse = check(s, in, naive.out, &bad_lse, rows);
    EXPECT_FALSE(lse.passed) << lse.summary();
    EXPECT_GT(lse.lse_max_error, lse.lse_tolerance) << lse.summary();
}

std::vector<Shape> shapes() {
    std::vector<Shape> all;
    for (const bool outliers : {false, true}) {
        for (const bool causal : {false, true}) {
            all.push_back({outliers, causal, 2, 1, 1});
            all.push_back({outliers, causal, 2, 129, 129});
            // Query rows sampled: 16 a head, over rows seeing 1 to 4096 keys (causal).
            all.push_back({outliers, causal, 1, 4096, 4096, 4, 2, 64, 16});
        }
    }
    all.push_back({true, true, 1, 200, 1000, 2, 1, 128, 64});  // d_head 128, MQA
    return all;
}

std::string shape_name(const testing::TestParamInfo<Shape>& info) {
    const Shape& s = info.param;
    return std::string(s.outliers ? "Outliers" : "Random") + (s.causal ? "Causal" : "Full") + "_q" +
           std::to_string(s.seq_q) + "_k" + std::to_string(s.seq_k) + "_h" +
           std::to_string(s.heads) + "_" + std::to_string(s.heads_kv) + "_d" + std::to_string(s.d);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Reference, testing::ValuesIn(shapes()), shape_name);

// What does not fit together is refused, the message naming it.
TEST(Fp8ReferenceInputs, MismatchesAreRefused) {
    const Shape s{false, true, 2, 8, 8};
    const Fp8Inputs in = make_inputs(s, 5);
    const auto rows = fa::reference::sample_rows(s.batch, s.heads, s.seq_q, 8, 1);
    const HostTensor out = zeros_like_output(s);
    const auto refused = [&](const fa::reference::Problem& p, const std::string& named) {
        try {
            fa::reference::check_attention(p, rows);
            ADD_FAILURE() << "accepted; expected a refusal naming " << named;
        } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
        }
    };
    const auto fp8 = [&](const HostTensor& k, const HostTensor& o) {
        fa::reference::Problem p{in.q, k, in.v, o, s.scale, s.causal};
        p.q_descale = &in.q_descale;
        p.k_descale = &in.k_descale;
        p.v_descale = &in.v_descale;
        return p;
    };
    EXPECT_NO_THROW(fa::reference::check_attention(fp8(in.k, out), rows));

    const HostTensor k16 =
        HostTensor::random_normal(DType::BF16, s.batch, s.seq_k, s.heads_kv, s.d, 3);
    refused(fp8(k16, out), "got k BF16");
    const HostTensor out16 =
        HostTensor::from_bits(DType::FP16, s.batch, s.seq_q, s.heads, s.d, out.bits);
    refused(fp8(in.k, out16), "out must be BF16");

    auto no_descale = fp8(in.k, out);
    no_descale.k_descale = nullptr;
    refused(no_descale, "k_descale");
    const std::vector<float> per_query_head(s.batch * s.heads, 1.0f);
    auto wrong_size = fp8(in.k, out);
    wrong_size.v_descale = &per_query_head;
    refused(wrong_size, "v_descale must hold batch x k.heads = 4");
    auto softcap = fp8(in.k, out);
    softcap.softcap = 30;
    refused(softcap, "softcap");

    // 16-bit inputs take no descales.
    const HostTensor q16 =
        HostTensor::random_normal(DType::BF16, s.batch, s.seq_q, s.heads, s.d, 4);
    const HostTensor v16 =
        HostTensor::random_normal(DType::BF16, s.batch, s.seq_k, s.heads_kv, s.d, 5);
    fa::reference::Problem p16{q16, k16, v16, out, s.scale, s.causal};
    EXPECT_NO_THROW(fa::reference::check_attention(p16, rows));
    p16.q_descale = &in.q_descale;
    refused(p16, "q_descale is for E4M3 inputs");
}

}  // namespace

namespace {

// __byte_perm(x, y, s): byte n of the result is byte s >> 4n (low 3 bits) of y:x (x low).
std::uint32_t byte_perm(std::uint32_t x, std::uint32_t y, unsigned s) {
    const std::uint64_t both = (std::uint64_t{y} << 32) | x;
    std::uint32_t out = 0;
    for (int n = 0; n < 4; ++n)
        out |= static_cast<std::uint32_t>((both >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return out;
}

}  // namespace

// The in-kernel transpose of V (sm90 transpose_v, kernels/fp8.hpp's fp8_vt_* names) emulated lane
// by lane from the PTX ISA's fragment layouts: ldmatrix .trans gives lane l of matrix m the 16-bit
// elements (rows 2 (l % 4) and 2 (l % 4) + 1, column l / 4) of the 8 x 8 matrix whose row r lane
// 8m + r addresses; stmatrix writes lane l's register i to matrix i's row l / 4, 16-bit columns
// 2 (l % 4) and 2 (l % 4) + 1. Every unit of a block of 128 keys x 256 columns must leave V's
// transposed copy as the pass writes it: slot s of k-step g holds key 32 g + fp8_key_of_slot(s);
// and each matrix stmatrix writes must spread over the swizzle's 8 bank groups.
TEST(Fp8Transpose, UnitsWriteTheCopysKeyOrder) {
    constexpr int keys = 128, cols = 256;
    std::vector<std::uint8_t> v(keys * cols), vt(cols * keys, 0);
    std::mt19937 rng(7);
    for (auto& b : v)
        b = static_cast<std::uint8_t>(rng());
    const auto pair_at = [&](int key, int chunk, int col_pair) {  // a 16-bit element of V's row
        const int c = 16 * chunk + 2 * col_pair;
        return static_cast<std::uint32_t>(v[key * cols + c] | (v[key * cols + c + 1] << 8));
    };
    for (int g = 0; g < keys / fa::fp8_k_step_keys; ++g) {
        for (int cg = 0; cg < cols / 16; ++cg) {
            std::uint32_t out[32][4];
            for (int lane = 0; lane < 32; ++lane) {
                std::uint32_t r[4];
                for (int m = 0; m < 4; ++m) {
                    const int q = lane % 4, p = lane / 4;
                    const int row0 = fa::fp8_vt_load_key(g, 8 * m + 2 * q);
                    const int row1 = fa::fp8_vt_load_key(g, 8 * m + 2 * q + 1);
                    r[m] = pair_at(row0, cg, p) | (pair_at(row1, cg, p) << 16);
                }
                const unsigned first = fa::fp8_vt_selector(lane, false);
                const unsigned second = fa::fp8_vt_selector(lane, true);
                out[lane][0] = byte_perm(r[0], r[1], first);
                out[lane][1] = byte_perm(r[0], r[1], second);
                out[lane][2] = byte_perm(r[2], r[3], first);
                out[lane][3] = byte_perm(r[2], r[3], second);
            }
            for (int lane = 0; lane < 32; ++lane) {
                for (int i = 0; i < 4; ++i) {
                    // Matrix i's row lane / 4 is at the address lane 8 i + lane / 4 gives.
                    const int addressing = 8 * i + lane / 4;
                    const int row = fa::fp8_vt_store_row(cg, addressing);
                    const int byte0 = 16 * fa::fp8_vt_store_chunk(g, addressing) + 4 * (lane % 4);
                    for (int b = 0; b < 4; ++b)
                        vt[row * keys + byte0 + b] =
                            static_cast<std::uint8_t>(out[lane][i] >> (8 * b));
                }
            }
        }
    }
    // A stmatrix matrix's 8 rows lie on 8 different rows mod 8: under the 128-byte swizzle, which
    // XORs a row's chunks with its row mod 8, its 16-byte stores hit 8 different bank groups.
    for (int cg = 0; cg < cols / 16; ++cg) {
        for (int m = 0; m < 4; ++m) {
            int seen = 0;
            for (int r = 0; r < 8; ++r)
                seen |= 1 << (fa::fp8_vt_store_row(cg, 8 * m + r) % 8);
            EXPECT_EQ(seen, 0xFF) << "column group " << cg << ", matrix " << m;
        }
    }
    for (int c = 0; c < cols; ++c) {
        for (int slot = 0; slot < keys; ++slot) {
            const int key = slot / fa::fp8_k_step_keys * fa::fp8_k_step_keys +
                            fa::fp8_key_of_slot(slot % fa::fp8_k_step_keys);
            ASSERT_EQ(vt[c * keys + slot], v[key * cols + c])
                << "column " << c << ", slot " << slot;
        }
    }
}
