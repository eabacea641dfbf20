// The reference check must be able to fail: a right answer passes, a wrong one, a NaN,
// a wrong mask or a wrong log-sum-exp does not.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>

#include "flash_attention/tools.hpp"

namespace fa = flash_attention;
using fa::reference::HostTensor;

namespace {

// The attention variants (issue 15) of a straightforward computation.
struct Variants {
    int left = -1, right = -1;  // sliding window around i + seq_k - seq_q; -1: unbounded
    double softcap = 0;
    const std::vector<float>* sinks = nullptr;
    bool top_left = false;                      // the diagonal at i (SDPA's) instead
    const std::vector<float>* alibi = nullptr;  // a slope a query head: -slope * |pos - j|
};

// Straightforward attention in double for every row, written independently of the
// checker's code: returns O rounded to the dtype, and the log-sum-exp.
std::pair<HostTensor, std::vector<float>> attention(const HostTensor& q, const HostTensor& k,
                                                    const HostTensor& v, double scale, bool causal,
                                                    const Variants& var = {}) {
    // O has V's head dim (which may differ from Q's and K's: DeepSeek's MLA).
    HostTensor out{q.dtype,  q.batch,
                   q.seq,    q.heads,
                   v.d_head, std::vector<std::uint16_t>(q.batch * q.seq * q.heads * v.d_head),
                   {}};
    std::vector<float> lse(q.batch * q.heads * q.seq);
    const std::int64_t group = q.heads / k.heads;
    for (std::int64_t b = 0; b < q.batch; ++b) {
        for (std::int64_t h = 0; h < q.heads; ++h) {
            for (std::int64_t i = 0; i < q.seq; ++i) {
                std::vector<double> w;
                std::vector<std::int64_t> keys;
                const std::int64_t pos = var.top_left ? i : i + k.seq - q.seq;
                for (std::int64_t j = 0; j < k.seq; ++j) {
                    if ((causal && j > pos) || (var.left >= 0 && j < pos - var.left) ||
                        (var.right >= 0 && j > pos + var.right))
                        continue;
                    double dot = 0;
                    for (std::int64_t x = 0; x < q.d_head; ++x) {
                        dot += double(q.values[q.offset(b, i, h) + x]) *
                               k.values[k.offset(b, j, h / group) + x];
                    }
                    const double s = dot * scale;
                    const double bias =
                        var.alibi ? -double((*var.alibi)[h]) * double(std::abs(pos - j)) : 0;
                    w.push_back((var.softcap > 0 ? var.softcap * std::tanh(s / var.softcap) : s) +
                                bias);
                    keys.push_back(j);
                }
                const double sink = var.sinks ? (*var.sinks)[h] : -INFINITY;
                double m = sink, sum = 0;
                for (const double s : w)
                    m = std::max(m, s);
                if (sink > -INFINITY)
                    sum += std::exp(sink - m);  // a denominator term with no value
                for (double& s : w)
                    sum += (s = std::exp(s - m));
                lse[(b * q.heads + h) * q.seq + i] =
                    sum == 0 ? -INFINITY : float(m + std::log(sum));
                for (std::int64_t x = 0; x < v.d_head; ++x) {
                    double o = 0;
                    for (std::size_t j = 0; j < w.size(); ++j)
                        o += w[j] * v.values[v.offset(b, keys[j], h / group) + x];
                    out.bits[out.offset(b, i, h) + x] =
                        fa::reference::from_float(q.dtype, float(w.empty() ? 0 : o / sum));
                }
            }
        }
    }
    out = HostTensor::from_bits(out.dtype, out.batch, out.seq, out.heads, out.d_head, out.bits);
    return {out, lse};
}

struct Case {
    HostTensor q, k, v;
    bool causal;
};

Case make(bool causal, std::int64_t sq, std::int64_t sk, std::int64_t hq, std::int64_t hkv) {
    return {HostTensor::random_normal(fa::DType::BF16, 2, sq, hq, 64, 11),
            HostTensor::random_normal(fa::DType::BF16, 2, sk, hkv, 64, 12),
            HostTensor::random_normal(fa::DType::BF16, 2, sk, hkv, 64, 13), causal};
}

fa::reference::CheckResult check(const Case& c, const HostTensor& out,
                                 const std::vector<float>* lse) {
    const auto rows = fa::reference::sample_rows(c.q.batch, c.q.heads, c.q.seq, 1000, 5);
    return fa::reference::check_attention({c.q, c.k, c.v, out, 0.125, c.causal, lse}, rows);
}

}  // namespace

// V with a head dim of its own (DeepSeek's MLA: Q and K 192, V and O 128): O's columns are
// V's, and a wrong one fails; tensors whose head dims disagree are refused.
TEST(Reference, ValueHeadDimOfItsOwn) {
    const Case c{HostTensor::random_normal(fa::DType::BF16, 1, 33, 4, 192, 21),
                 HostTensor::random_normal(fa::DType::BF16, 1, 47, 2, 192, 22),
                 HostTensor::random_normal(fa::DType::BF16, 1, 47, 2, 128, 23), true};
    auto [out, lse] = attention(c.q, c.k, c.v, 0.125, c.causal);
    ASSERT_EQ(out.d_head, 128);
    EXPECT_TRUE(check(c, out, &lse).passed);
    HostTensor wrong = out;
    wrong.values[wrong.offset(0, 20, 3) + 127] += 0.25f;
    wrong.bits[wrong.offset(0, 20, 3) + 127] =
        fa::reference::from_float(wrong.dtype, wrong.values[wrong.offset(0, 20, 3) + 127]);
    EXPECT_FALSE(check(c, wrong, &lse).passed);
    // An output of Q's head dim is not V's.
    const HostTensor q_wide = HostTensor::random_normal(fa::DType::BF16, 1, 33, 4, 192, 24);
    EXPECT_THROW(check(c, q_wide, &lse), std::invalid_argument);
}

TEST(Reference, RightAnswersPassWrongOnesFail) {
    for (const Case& c :
         {make(false, 40, 70, 4, 4), make(true, 70, 40, 4, 2), make(true, 40, 70, 4, 1)}) {
        auto [out, lse] = attention(c.q, c.k, c.v, 0.125, c.causal);
        const auto good = check(c, out, &lse);
        EXPECT_TRUE(good.passed) << good.summary();

        HostTensor wrong = out;  // one element off by 0.05
        wrong.values[wrong.offset(1, 17, 3) + 5] += 0.05f;
        wrong.bits[wrong.offset(1, 17, 3) + 5] =
            fa::reference::from_float(wrong.dtype, wrong.values[wrong.offset(1, 17, 3) + 5]);
        EXPECT_FALSE(check(c, wrong, &lse).passed);

        HostTensor nan = out;  // one unwritten (poisoned) element
        nan.bits[0] = 0xFFFF;
        nan = HostTensor::from_bits(nan.dtype, nan.batch, nan.seq, nan.heads, nan.d_head, nan.bits);
        EXPECT_FALSE(check(c, nan, &lse).passed);

        std::vector<float> bad_lse = lse;
        bad_lse[c.q.seq - 1] += 0.01f;  // the last row sees keys in every case
        const auto lse_failure = check(c, out, &bad_lse);
        EXPECT_FALSE(lse_failure.passed);
        // O is right here: the one-line summary must say what failed.
        EXPECT_NE(lse_failure.summary().find("max|lse-ref|"), std::string::npos)
            << lse_failure.summary();
    }
}

// At a scale of 100 a row's LSE is in the hundreds to thousands, where fp32 alone rounds by
// more than the fixed slack: the bound follows a naive fp32 LSE's error there, yet a wrong
// LSE still fails, and at ordinary scales the bound stays at the slack.
TEST(Reference, LseBoundFollowsFp32Rounding) {
    const Case c = make(false, 40, 300, 4, 4);
    const auto rows = fa::reference::sample_rows(c.q.batch, c.q.heads, c.q.seq, 1000, 5);
    const auto check_at = [&](double scale, const std::vector<float>& lse, const HostTensor& out) {
        return fa::reference::check_attention({c.q, c.k, c.v, out, scale, false, &lse}, rows);
    };
    auto [out, lse] = attention(c.q, c.k, c.v, 100.0, false);
    std::vector<float> rounded = lse;  // the exact LSE, off by the fp32 rounding of a row max
    for (float& x : rounded)
        x = std::nextafter(std::nextafter(x, INFINITY), INFINITY);
    const auto good = check_at(100.0, rounded, out);
    EXPECT_TRUE(good.passed) << good.summary();
    EXPECT_GT(good.lse_tolerance, fa::reference::k_lse_tolerance) << good.summary();
    std::vector<float> wrong = lse;
    wrong[7] += 0.05f;
    EXPECT_FALSE(check_at(100.0, wrong, out).passed);

    auto [plain_out, plain_lse] = attention(c.q, c.k, c.v, 0.125, false);
    const auto plain = check_at(0.125, plain_lse, plain_out);
    EXPECT_TRUE(plain.passed) << plain.summary();
    EXPECT_LT(plain.lse_tolerance, 1.01 * fa::reference::k_lse_tolerance) << plain.summary();
}

TEST(Reference, MaskAndGroupingMatter) {
    const Case causal = make(true, 64, 64, 4, 2);
    auto [unmasked_out, unmasked_lse] = attention(causal.q, causal.k, causal.v, 0.125, false);
    EXPECT_FALSE(check(causal, unmasked_out, nullptr).passed)
        << "a non-causal answer passed a causal check";

    // K/V heads 0,1 laid out for 4 query heads as 0,1,0,1 (the wrong grouping: query
    // head h must read K/V head h / 2, i.e. 0,0,1,1).
    const Case grouped = make(false, 32, 32, 4, 2);
    const auto interleave_heads = [](const HostTensor& kv) {
        HostTensor full =
            HostTensor::random_normal(kv.dtype, kv.batch, kv.seq, 2 * kv.heads, kv.d_head, 1);
        for (std::int64_t b = 0; b < kv.batch; ++b)
            for (std::int64_t s = 0; s < kv.seq; ++s)
                for (std::int64_t h = 0; h < full.heads; ++h)
                    std::copy_n(&kv.values[kv.offset(b, s, h % kv.heads)], kv.d_head,
                                &full.values[full.offset(b, s, h)]);
        return full;
    };
    const HostTensor k_full = interleave_heads(grouped.k);
    const HostTensor v_full = interleave_heads(grouped.v);
    auto [interleaved, lse] = attention(grouped.q, k_full, v_full, 0.125, false);
    EXPECT_FALSE(check(grouped, interleaved, &lse).passed)
        << "head h read K/V head h % 2 and passed";
}

TEST(Reference, RowsThatSeeNoKeyAreZeroWithLseMinusInfinity) {
    const Case c = make(true, 80, 16, 2, 2);  // causal, seq_q > seq_k: rows 0..63 see nothing
    auto [out, lse] = attention(c.q, c.k, c.v, 0.125, true);
    EXPECT_EQ(lse[0], -INFINITY);
    EXPECT_TRUE(check(c, out, &lse).passed);
    std::vector<float> finite = lse;
    finite[0] = 0.0f;
    EXPECT_FALSE(check(c, out, &finite).passed);
}

// Sliding windows, softcap and sinks: the right answer passes, each variant left out fails.
TEST(Reference, VariantsMatter) {
    const Case c = make(true, 70, 90, 4, 2);
    const std::vector<float> sinks = {2.0f, -1.0f, 0.5f, 3.0f};
    const Variants all{9, -1, 0.8, &sinks};  // a softcap small enough to bite at scale 0.125
    const auto rows = fa::reference::sample_rows(c.q.batch, c.q.heads, c.q.seq, 1000, 5);
    const auto check_with = [&](const HostTensor& out, const std::vector<float>& lse,
                                const Variants& v) {
        return fa::reference::check_attention(
            {c.q, c.k, c.v, out, 0.125, c.causal, &lse, false, v.left, v.right, v.softcap, v.sinks},
            rows);
    };
    auto [out, lse] = attention(c.q, c.k, c.v, 0.125, c.causal, all);
    const auto good = check_with(out, lse, all);
    EXPECT_TRUE(good.passed) << good.summary();
    for (const Variants& missing : {Variants{-1, -1, 0.8, &sinks}, Variants{9, -1, 0, &sinks},
                                    Variants{9, -1, 0.8, nullptr}}) {
        auto [wrong_out, wrong_lse] = attention(c.q, c.k, c.v, 0.125, c.causal, missing);
        EXPECT_FALSE(check_with(wrong_out, wrong_lse, all).passed)
            << "left out: window " << missing.left << ", softcap " << missing.softcap << ", sinks "
            << (missing.sinks != nullptr);
    }
    // Non-causal, a window on both sides; rows whose window lies past the keys see none.
    const Case wide = make(false, 90, 40, 2, 2);
    const Variants band{3, 5, 0, nullptr};
    auto [band_out, band_lse] = attention(wide.q, wide.k, wide.v, 0.125, false, band);
    const auto band_rows = fa::reference::sample_rows(2, 2, 90, 1000, 7);
    EXPECT_TRUE(fa::reference::check_attention({wide.q, wide.k, wide.v, band_out, 0.125, false,
                                                &band_lse, false, 3, 5, 0, nullptr},
                                               band_rows)
                    .passed);
    EXPECT_FALSE(fa::reference::check_attention({wide.q, wide.k, wide.v, band_out, 0.125, false,
                                                 &band_lse, false, 3, -1, 0, nullptr},
                                                band_rows)
                     .passed)
        << "a right-unbounded window passed against a right side of 5";
}

// The diagonal's alignment and ALiBi's slopes: each right answer passes, and the answer of the
// other alignment, or of other slopes, fails (the GPU tests of top-left causal masking and of
// ALiBi lean on the checker telling them apart).
TEST(Reference, AlignmentAndAlibiMatter) {
    const Case c = make(true, 40, 90, 4, 2);  // seq_q < seq_k: the alignments differ
    const auto rows = fa::reference::sample_rows(c.q.batch, c.q.heads, c.q.seq, 1000, 5);
    const auto check_with = [&](const HostTensor& out, const std::vector<float>& lse, bool top_left,
                                const std::vector<float>* alibi) {
        fa::reference::Problem p{c.q, c.k, c.v, out, 0.125, true, &lse, top_left};
        p.alibi_slopes = alibi;
        return fa::reference::check_attention(p, rows);
    };
    for (const bool top_left : {false, true}) {
        auto [out, lse] = attention(c.q, c.k, c.v, 0.125, true, Variants{.top_left = top_left});
        EXPECT_TRUE(check_with(out, lse, top_left, nullptr).passed) << "top_left " << top_left;
        EXPECT_FALSE(check_with(out, lse, !top_left, nullptr).passed)
            << "an answer aligned " << (top_left ? "top left" : "bottom right")
            << " passed the other alignment's check";
    }
    const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
    const std::vector<float> other = {0.0625f, 0.125f, 0.25f, 0.5f};
    for (const bool top_left : {false, true}) {
        auto [out, lse] =
            attention(c.q, c.k, c.v, 0.125, true, Variants{.top_left = top_left, .alibi = &slopes});
        EXPECT_TRUE(check_with(out, lse, top_left, &slopes).passed) << "top_left " << top_left;
        EXPECT_FALSE(check_with(out, lse, top_left, &other).passed)
            << "ALiBi with other slopes passed";
        EXPECT_FALSE(check_with(out, lse, top_left, nullptr).passed)
            << "ALiBi's answer passed a check without it";
    }
}

namespace {

// The gradients of attention, straightforwardly, in double for every row, written
// independently of the checker's code (bottom-right causal, a window of `left` and `right` keys
// around the diagonal, -1 unbounded): dQ, dK, dV rounded to the dtype. With sinks (one logit per
// query head in every row's denominator), also dsinks = Σ over rows of -P_sink · Σ_j P dP.
struct Gradients {
    HostTensor dq, dk, dv;
    std::vector<float> d_sinks;
};

Gradients gradients(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                    const HostTensor& d_o, double scale, bool causal,
                    const std::vector<float>* sinks = nullptr, double softcap = 0,
                    bool tanh_derivative = true, int left = -1, int right = -1) {
    const std::int64_t group = q.heads / k.heads, d = q.d_head, d_v = v.d_head;
    std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), d_sinks(q.heads);
    for (std::int64_t b = 0; b < q.batch; ++b) {
        for (std::int64_t h = 0; h < q.heads; ++h) {
            const std::int64_t kv = h / group;
            for (std::int64_t i = 0; i < q.seq; ++i) {
                const std::int64_t pos = i + k.seq - q.seq;
                const auto hidden = [&](std::int64_t j) {
                    return (causal && j > pos) || (left >= 0 && j < pos - left) ||
                           (right >= 0 && j > pos + right);
                };
                std::vector<double> p(k.seq, 0.0), dp(k.seq, 0.0), slope(k.seq, 1.0);
                const double sink = sinks != nullptr ? (*sinks)[h] : -INFINITY;
                double m = sink;
                for (std::int64_t j = 0; j < k.seq; ++j) {
                    if (hidden(j))
                        continue;
                    double dot = 0;
                    for (std::int64_t x = 0; x < d; ++x)
                        dot += double(q.values[q.offset(b, i, h) + x]) *
                               k.values[k.offset(b, j, kv) + x];
                    p[j] = dot * scale;
                    if (softcap != 0) {  // softcap · tanh(s / softcap), d/ds = 1 - tanh²
                        const double t = std::tanh(p[j] / softcap);
                        p[j] = softcap * t;
                        slope[j] = tanh_derivative ? 1 - t * t : 1.0;
                    }
                    m = std::max(m, p[j]);
                }
                if (m == -INFINITY)
                    continue;  // sees no key: no gradient
                const double p_sink = sinks != nullptr ? std::exp(sink - m) : 0.0;
                double sum = p_sink;
                for (std::int64_t j = 0; j < k.seq; ++j)
                    sum += (p[j] = hidden(j) ? 0.0 : std::exp(p[j] - m));
                double delta = 0;  // Σ_j P dP
                for (std::int64_t j = 0; j < k.seq; ++j) {
                    p[j] /= sum;
                    for (std::int64_t x = 0; x < d_v; ++x)
                        dp[j] += double(d_o.values[d_o.offset(b, i, h) + x]) *
                                 v.values[v.offset(b, j, kv) + x];
                    delta += p[j] * dp[j];
                }
                d_sinks[h] -= p_sink / sum * delta;
                for (std::int64_t j = 0; j < k.seq; ++j) {
                    const double ds = p[j] * (dp[j] - delta) * slope[j];
                    for (std::int64_t x = 0; x < d; ++x) {
                        dq[q.offset(b, i, h) + x] += scale * ds * k.values[k.offset(b, j, kv) + x];
                        dk[k.offset(b, j, kv) + x] += scale * ds * q.values[q.offset(b, i, h) + x];
                    }
                    for (std::int64_t x = 0; x < d_v; ++x)
                        dv[v.offset(b, j, kv) + x] += p[j] * d_o.values[d_o.offset(b, i, h) + x];
                }
            }
        }
    }
    const auto rounded = [](const HostTensor& like, const std::vector<double>& g) {
        std::vector<std::uint16_t> bits(g.size());
        for (std::size_t i = 0; i < g.size(); ++i)
            bits[i] = fa::reference::from_float(like.dtype, float(g[i]));
        return HostTensor::from_bits(like.dtype, like.batch, like.seq, like.heads, like.d_head,
                                     bits);
    };
    return {rounded(q, dq), rounded(k, dk), rounded(v, dv),
            std::vector<float>(d_sinks.begin(), d_sinks.end())};
}

}  // namespace

// The backward check: exact gradients pass; one wrong element of any gradient, a NaN, a
// gradient of the other mask, or GQA's heads left unsummed do not.
TEST(Reference, BackwardCheckFailsWrongGradients) {
    for (const bool causal : {false, true}) {
        const Case c = make(causal, 40, 57, 4, 2);  // seq_q != seq_k, GQA 4:2
        const HostTensor d_o = HostTensor::random_normal(fa::DType::BF16, 2, 40, 4, 64, 14);
        const Gradients g = gradients(c.q, c.k, c.v, d_o, 0.125, causal);
        const auto q_rows = fa::reference::sample_rows(2, 4, 40, 1000, 3);
        const auto k_rows = fa::reference::sample_rows(2, 2, 57, 1000, 4);
        const auto check = [&](const HostTensor& dq, const HostTensor& dk, const HostTensor& dv,
                               bool with_causal) {
            return fa::reference::check_attention_backward(
                {c.q, c.k, c.v, d_o, dq, dk, dv, 0.125, with_causal}, q_rows, k_rows);
        };
        const auto good = check(g.dq, g.dk, g.dv, causal);
        EXPECT_TRUE(good.passed) << good.summary();
        const auto wrong = [&](const HostTensor& t, std::int64_t at, float value) {
            HostTensor w = t;
            w.bits[at] = fa::reference::from_float(t.dtype, value);
            return HostTensor::from_bits(w.dtype, w.batch, w.seq, w.heads, w.d_head, w.bits);
        };
        EXPECT_FALSE(
            check(wrong(g.dq, g.dq.offset(1, 30, 3) + 5, 3.0f), g.dk, g.dv, causal).passed);
        EXPECT_FALSE(
            check(g.dq, wrong(g.dk, g.dk.offset(0, 50, 1) + 7, 3.0f), g.dv, causal).passed);
        EXPECT_FALSE(check(g.dq, g.dk, wrong(g.dv, g.dv.offset(1, 3, 0), NAN), causal).passed);
        EXPECT_FALSE(check(g.dq, g.dk, g.dv, !causal).passed);
    }
    // dK and dV of a K/V head sum its query heads: one head's share alone does not pass.
    const Case c = make(false, 16, 16, 2, 1);
    const HostTensor d_o = HostTensor::random_normal(fa::DType::BF16, 2, 16, 2, 64, 15);
    const Gradients g = gradients(c.q, c.k, c.v, d_o, 0.125, false);
    HostTensor half_q = c.q, half_do = d_o;
    for (std::int64_t b = 0; b < 2; ++b) {
        for (std::int64_t i = 0; i < 16; ++i) {
            for (std::int64_t x = 0; x < 64; ++x) {
                half_q.values[half_q.offset(b, i, 1) + x] = 0;
                half_do.values[half_do.offset(b, i, 1) + x] = 0;
            }
        }
    }
    const Gradients one_head = gradients(half_q, c.k, c.v, half_do, 0.125, false);
    const auto rows = fa::reference::sample_rows(2, 1, 16, 1000, 6);
    EXPECT_FALSE(fa::reference::check_attention_backward(
                     {c.q, c.k, c.v, d_o, g.dq, one_head.dk, one_head.dv, 0.125},
                     fa::reference::sample_rows(2, 2, 16, 1000, 6), rows)
                     .passed);
}

// V with a head dim of its own (DeepSeek's MLA: 192 and 128): dO and dV have V's columns; exact
// gradients pass, a wrong dV or dK does not, and mismatched head dims are refused.
TEST(Reference, BackwardValueHeadDimOfItsOwn) {
    const Case c{HostTensor::random_normal(fa::DType::BF16, 1, 29, 4, 192, 31),
                 HostTensor::random_normal(fa::DType::BF16, 1, 45, 2, 192, 32),
                 HostTensor::random_normal(fa::DType::BF16, 1, 45, 2, 128, 33), true};
    const HostTensor d_o = HostTensor::random_normal(fa::DType::BF16, 1, 29, 4, 128, 34);
    const Gradients g = gradients(c.q, c.k, c.v, d_o, 0.125, true);
    const auto q_rows = fa::reference::sample_rows(1, 4, 29, 1000, 3);
    const auto k_rows = fa::reference::sample_rows(1, 2, 45, 1000, 4);
    const auto check = [&](const HostTensor& dk, const HostTensor& dv) {
        return fa::reference::check_attention_backward(
            {c.q, c.k, c.v, d_o, g.dq, dk, dv, 0.125, true}, q_rows, k_rows);
    };
    const auto good = check(g.dk, g.dv);
    EXPECT_TRUE(good.passed) << good.summary();
    HostTensor bad_dv = g.dv;
    bad_dv.bits[bad_dv.offset(0, 40, 1) + 127] = fa::reference::from_float(bad_dv.dtype, 3.0f);
    bad_dv = HostTensor::from_bits(bad_dv.dtype, 1, 45, 2, 128, bad_dv.bits);
    EXPECT_FALSE(check(g.dk, bad_dv).passed);
    HostTensor bad_dk = g.dk;
    bad_dk.bits[bad_dk.offset(0, 44, 0) + 191] = fa::reference::from_float(bad_dk.dtype, 3.0f);
    bad_dk = HostTensor::from_bits(bad_dk.dtype, 1, 45, 2, 192, bad_dk.bits);
    EXPECT_FALSE(check(bad_dk, g.dv).passed);
    EXPECT_THROW(check(g.dk, g.dk), std::invalid_argument);  // a dV of K's head dim
}

// With sinks: exact gradients and dsinks pass; a wrong dsink, none, or gradients computed without
// the sinks do not. Rows that see no key (seq_q > seq_k, causal) are all sink.
TEST(Reference, BackwardCheckWithSinks) {
    for (const bool causal : {false, true}) {
        const Case c = make(causal, 57, 40, 4, 2);
        const HostTensor d_o = HostTensor::random_normal(fa::DType::BF16, 2, 57, 4, 64, 16);
        const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
        const Gradients g = gradients(c.q, c.k, c.v, d_o, 0.125, causal, &sinks);
        const Gradients plain = gradients(c.q, c.k, c.v, d_o, 0.125, causal);
        const auto q_rows = fa::reference::sample_rows(2, 4, 57, 1000, 5);
        const auto k_rows = fa::reference::sample_rows(2, 2, 40, 1000, 6);
        const auto check = [&](const Gradients& with, const std::vector<float>* d_sinks) {
            fa::reference::BackwardProblem p{c.q,     c.k,     c.v,   d_o,   with.dq,
                                             with.dk, with.dv, 0.125, causal};
            p.sinks = &sinks;
            p.d_sinks = d_sinks;
            return fa::reference::check_attention_backward(p, q_rows, k_rows);
        };
        const auto good = check(g, &g.d_sinks);
        EXPECT_TRUE(good.passed) << good.summary();
        EXPECT_EQ(good.d_sinks.rows_checked, 4);
        std::vector<float> off = g.d_sinks;
        off[2] += 0.05f * (1 + std::abs(off[2]));
        EXPECT_FALSE(check(g, &off).passed);
        EXPECT_FALSE(check(g, nullptr).passed) << "dsinks missing";
        EXPECT_FALSE(check(plain, &g.d_sinks).passed) << "gradients that ignore the sinks";
    }
}

// With a softcap: exact gradients pass; gradients that ignore the cap, or a check that ignores
// it, do not.
TEST(Reference, BackwardCheckWithSoftcap) {
    const Case c = make(true, 40, 57, 4, 2);
    const HostTensor d_o = HostTensor::random_normal(fa::DType::BF16, 2, 40, 4, 64, 17);
    const double scale = 0.5;  // scores of a few units, which a cap of 2 bends
    const Gradients g = gradients(c.q, c.k, c.v, d_o, scale, true, nullptr, 2.0);
    const Gradients plain = gradients(c.q, c.k, c.v, d_o, scale, true);
    const auto q_rows = fa::reference::sample_rows(2, 4, 40, 1000, 7);
    const auto k_rows = fa::reference::sample_rows(2, 2, 57, 1000, 8);
    const auto check = [&](const Gradients& with, double softcap) {
        fa::reference::BackwardProblem p{c.q,     c.k,     c.v,   d_o, with.dq,
                                         with.dk, with.dv, scale, true};
        p.softcap = softcap;
        return fa::reference::check_attention_backward(p, q_rows, k_rows);
    };
    const auto good = check(g, 2.0);
    EXPECT_TRUE(good.passed) << good.summary();
    EXPECT_FALSE(check(plain, 2.0).passed) << "gradients that ignore the softcap";
    const Gradients no_slope = gradients(c.q, c.k, c.v, d_o, scale, true, nullptr, 2.0, false);
    EXPECT_FALSE(check(no_slope, 2.0).passed) << "capped P without tanh's derivative in dS";
    EXPECT_FALSE(check(g, 0.0).passed) << "a check that ignores the softcap";
}

// With a sliding window (causal with a left side; both sides without causal, where rows whose
// window lies past the keys see none; seq_q != seq_k): exact gradients pass; gradients without
// the window, or a check without it, do not.
TEST(Reference, BackwardCheckWithWindow) {
    for (const auto& [causal, left, right] :
         {std::tuple{true, 9, -1}, std::tuple{false, 3, 5}, std::tuple{false, -1, 0}}) {
        const Case c = make(causal, 57, 40, 4, 2);
        const HostTensor d_o = HostTensor::random_normal(fa::DType::BF16, 2, 57, 4, 64, 18);
        const Gradients g =
            gradients(c.q, c.k, c.v, d_o, 0.125, causal, nullptr, 0, true, left, right);
        const Gradients plain = gradients(c.q, c.k, c.v, d_o, 0.125, causal);
        const auto q_rows = fa::reference::sample_rows(2, 4, 57, 1000, 9);
        const auto k_rows = fa::reference::sample_rows(2, 2, 40, 1000, 10);
        const auto check = [&](const Gradients& with, int l, int r) {
            fa::reference::BackwardProblem p{c.q,     c.k,     c.v,   d_o,   with.dq,
                                             with.dk, with.dv, 0.125, causal};
            p.window_left = l;
            p.window_right = r;
            return fa::reference::check_attention_backward(p, q_rows, k_rows);
        };
        const auto good = check(g, left, right);
        EXPECT_TRUE(good.passed) << good.summary() << " window " << left << ", " << right;
        EXPECT_FALSE(check(plain, left, right).passed) << "gradients that ignore the window";
        EXPECT_FALSE(check(g, -1, -1).passed) << "a check that ignores the window";
    }
}
