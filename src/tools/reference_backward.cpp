// The gradients of attention in double precision and as a naive 16-bit computation, against a
// kernel's dQ, dK and dV.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flash_attention/tools.hpp"
#include "tools/host_math.hpp"

namespace flash_attention::reference {

namespace {

using detail::parallel_for;
using detail::round_to;

// Largest |got - ref| and |naive - ref| of one gradient, and the largest |ref|. Two naive
// values: the larger error counts (dQ's and dK's two naive dS, Row::compute).
struct Errors {
    double kernel = 0;
    double naive = 0;
    double ref = 0;

    void add(double got, double naive_value, double reference) {
        add(got, naive_value, naive_value, reference);
    }
    void add(double got, double naive_value, double other_naive, double reference) {
        // NaN compares false: an infinite error instead of a silent pass.
        kernel = std::max(kernel, std::isfinite(got) ? std::abs(got - reference) : INFINITY);
        naive =
            std::max({naive, std::abs(naive_value - reference), std::abs(other_naive - reference)});
        ref = std::max(ref, std::abs(reference));
    }
    void merge(const Errors& e) {
        kernel = std::max(kernel, e.kernel);
        naive = std::max(naive, e.naive);
        ref = std::max(ref, e.ref);
    }
};

// Keys [first, end) that query row i sees, as the forward's reference.
std::pair<std::int64_t, std::int64_t> visible_keys(const BackwardProblem& p, std::int64_t i) {
    return detail::VisibleKeys{p.q.seq,    p.k.seq,       p.causal,
                               p.top_left, p.window_left, p.window_right}(i);
}

// dQ or dK naively in the dtype from its fp32 sum: rounded, scaled, rounded.
float scaled_naive(DType dt, float sum, double scale) {
    return round_to(dt, round_to(dt, sum) * static_cast<float>(scale));
}

// a·b over n elements, in double precision and as a naive fp32 accumulation.
std::pair<double, float> dot(const float* a, const float* b, std::int64_t n) {
    double a64 = 0;
    float a32 = 0;
    for (std::int64_t x = 0; x < n; ++x) {
        a64 += static_cast<double>(a[x]) * b[x];
        a32 += a[x] * b[x];
    }
    return {a64, a32};
}

// A head's dsinks summed over its rows: in double precision, and by two naive computations
// (see Row::compute); the bound takes the one farther from the double.
struct SinkSums {
    double exact = 0;
    float as_torch = 0, as_flash = 0;
    // Σ over the rows of (P_sink · u · Σ|dO ∘ O|)², u the dtype's unit roundoff: the square of
    // the rounding scale of a sum whose every row's D comes from an O rounded to the dtype.
    double rounding_sq = 0;
    void add(const SinkSums& s) {
        exact += s.exact;
        as_torch += s.as_torch;
        as_flash += s.as_flash;
        rounding_sq += s.rounding_sq;
    }
};

// One query row of one head: P and dS in double precision and naively in the dtype; with a
// sink, its share of dsinks, -P_sink · D. Two naive dS, whose D differ: ds16's D = Σ P dP in
// the dtype, as PyTorch's attention in the dtype computes it, and ds16_flash's the flash formula,
// D = Σ dO ∘ O in fp32 from a naive forward's O in the dtype, as every flash backward (and its
// preprocess) computes it. On nearly one-hot rows O's rounding dominates the second (a CPU
// simulation erred up to 6x more than autograd in bf16, 2026-12-03); dQ's and dK's bounds take
// the larger naive error, as the Python tests' bounds do.
struct Row {
    std::vector<double> p64, ds64, slope64;  // slope: the softcap's tanh derivative, 1 - t²
    std::vector<float> p16, ds16, ds16_flash, slope16;
    std::int64_t first = 0, end = 0;  // the keys the row sees
    SinkSums d_sink;

    explicit Row(std::int64_t seq_k)
        : p64(seq_k),
          ds64(seq_k),
          slope64(seq_k, 1.0),
          p16(seq_k),
          ds16(seq_k),
          ds16_flash(seq_k),
          slope16(seq_k, 1.0f) {}

    void compute(const BackwardProblem& p, std::int64_t b, std::int64_t h, std::int64_t i) {
        const DType dt = p.q.dtype;
        const std::int64_t d = p.q.d_head;
        const std::int64_t d_v = p.v.d_head;  // dO's and V's (DeepSeek's MLA: below Q's)
        const std::int64_t kv = h / (p.q.heads / p.k.heads);
        std::tie(first, end) = visible_keys(p, i);
        const float* qi = &p.q.values[p.q.offset(b, i, h)];
        const float* doi = &p.d_o.values[p.d_o.offset(b, i, h)];
        // The sink joins the denominator (not the values): a row that sees no key is all sink.
        const bool sink = p.sinks != nullptr;
        const double sink_logit = sink ? (*p.sinks)[static_cast<std::size_t>(h)] : 0.0;
        double max64 = sink ? sink_logit : -INFINITY;
        float max16 = sink ? static_cast<float>(sink_logit) : -INFINITY;
        for (std::int64_t j = first; j < end; ++j) {
            const auto [a64, a32] = dot(qi, &p.k.values[p.k.offset(b, j, kv)], d);
            p64[j] = a64 * p.scale;
            p16[j] = round_to(dt, round_to(dt, a32) * static_cast<float>(p.scale));
            if (p.softcap != 0) {
                const double t64 = std::tanh(p64[j] / p.softcap);
                const float t16 = std::tanh(p16[j] / static_cast<float>(p.softcap));
                p64[j] = p.softcap * t64;
                p16[j] = round_to(dt, static_cast<float>(p.softcap) * t16);
                slope64[j] = 1 - t64 * t64;
                slope16[j] = 1 - t16 * t16;
            }
            if (p.alibi_slopes != nullptr) {  // in fp32 for the naive rows, as the forward's
                const double bias = detail::AlibiBias{p.alibi_slopes, p.alibi_batch_stride, p.q.seq,
                                                      p.k.seq, p.top_left}(b, h, i, j);
                p64[j] += bias;
                p16[j] += static_cast<float>(bias);
            }
            max64 = std::max(max64, p64[j]);
            max16 = std::max(max16, p16[j]);
        }
        double sum64 = sink ? std::exp(sink_logit - max64) : 0;
        float sum16 = sink ? std::exp(static_cast<float>(sink_logit) - max16) : 0;
        const double sink64 = sum64;
        const float sink16 = sum16;
        for (std::int64_t j = first; j < end; ++j) {
            p64[j] = std::exp(p64[j] - max64);
            sum64 += p64[j];
            p16[j] = std::exp(p16[j] - max16);
            sum16 += p16[j];
        }
        // dP = dO·Vᵀ, D = Σ P dP, dS = P (dP - D).
        double d64 = 0;
        float d32 = 0;
        for (std::int64_t j = first; j < end; ++j) {
            p64[j] /= sum64;
            p16[j] = round_to(dt, p16[j] / sum16);
            const auto [a64, a32] = dot(doi, &p.v.values[p.v.offset(b, j, kv)], d_v);
            ds64[j] = a64;
            ds16[j] = round_to(dt, a32);
            d64 += p64[j] * ds64[j];
            d32 += p16[j] * ds16[j];
        }
        const float d16 = round_to(dt, d32);
        // The flash formula's D, and Σ|dO ∘ O| (the sink's rounding scale).
        float d_o32 = 0;
        double magnitude = 0;
        for (std::int64_t x = 0; x < d_v; ++x) {
            float o32 = 0;
            for (std::int64_t j = first; j < end; ++j)
                o32 += p16[j] * p.v.values[p.v.offset(b, j, kv) + x];
            d_o32 += doi[x] * round_to(dt, o32);
            magnitude += std::abs(static_cast<double>(doi[x]) * o32);
        }
        for (std::int64_t j = first; j < end; ++j) {
            ds64[j] = p64[j] * (ds64[j] - d64) * slope64[j];
            ds16_flash[j] = round_to(dt, p16[j] * (ds16[j] - d_o32) * slope16[j]);
            ds16[j] = round_to(dt, p16[j] * (ds16[j] - d16) * slope16[j]);
        }
        if (sink) {
            // As PyTorch's attention in the dtype computes it (the sink a column of the softmax,
            // its logit a parameter of the dtype): each row's share -P_sink · D rounded to the
            // dtype from the rounded D, the rows summed in fp32 and the total rounded (below).
            // With fp32 shares, a sum over every row of a head, the naive error sat below what a
            // 16-bit O allows: a correct kernel failed (0.0084 against a bound of 0.0059; window
            // 255, softcap 5, sinks), and with D from the rounded O more often (0.024 against
            // 0.017), while the Python tests' naive, PyTorch's own bf16 autograd, passed them
            // (H200, 2026-12-02).
            // The second naive is the flash formula, D = Σ dO ∘ O in fp32 from a naive forward's
            // O in the dtype (P rounded to the dtype, P·V summed in fp32, O rounded), as the
            // Python tests' bound takes the larger of the two: with the first alone, the sm80
            // kernels failed by 4-12% (window 255, softcap 5, sinks), and with O exact before
            // its rounding the sm90 kernel by 3% (0.0096 against 0.0093, the same shape under
            // memcheck): the kernels' O carries the forward's P rounding too (H200, 2026-12-02).
            d_sink.exact = -(sink64 / sum64) * d64;
            d_sink.as_torch = round_to(dt, -(sink16 / sum16) * d16);
            d_sink.as_flash = -static_cast<float>(sink64 / sum64) * d_o32;
            const double unit_roundoff = dt == DType::BF16 ? 0x1p-8 : 0x1p-11;
            const double scale = sink64 / sum64 * unit_roundoff * magnitude;
            d_sink.rounding_sq = scale * scale;
        }
    }
};

// The sampled keys of each (batch, K/V head), and their dK, dV sums: double and naive fp32.
struct KeySums {
    std::vector<std::int64_t> keys;
    std::vector<double> dk64, dv64;             // keys x d_head, keys x V's head dim
    std::vector<float> dk32, dk_flash32, dv32;  // dK's two naive sums (Row's two dS)

    void resize(std::int64_t d, std::int64_t d_v) {
        const auto n = keys.size() * static_cast<std::size_t>(d);
        const auto n_v = keys.size() * static_cast<std::size_t>(d_v);
        dk64.assign(n, 0);
        dv64.assign(n_v, 0);
        dk32.assign(n, 0);
        dk_flash32.assign(n, 0);
        dv32.assign(n_v, 0);
    }
    void add(const KeySums& other) {
        for (std::size_t i = 0; i < dk64.size(); ++i) {
            dk64[i] += other.dk64[i];
            dk32[i] += other.dk32[i];
            dk_flash32[i] += other.dk_flash32[i];
        }
        for (std::size_t i = 0; i < dv64.size(); ++i) {
            dv64[i] += other.dv64[i];
            dv32[i] += other.dv32[i];
        }
    }
};

std::int64_t non_finite(const HostTensor& t) {
    return std::count_if(t.values.begin(), t.values.end(),
                         [](float x) { return !std::isfinite(x); });
}

CheckResult result(const Errors& e, std::int64_t rows, std::int64_t bad) {
    CheckResult r;
    r.max_error = e.kernel;
    r.naive_max_error = e.naive;
    r.tolerance = 2 * e.naive + k_gradient_slack * std::max(1.0, e.ref);
    r.rows_checked = rows;
    r.non_finite = bad;
    r.passed = bad == 0 && rows > 0 && r.max_error <= r.tolerance;
    return r;
}

}  // namespace

BackwardCheck check_attention_backward(const BackwardProblem& p,
                                       const std::vector<RowSample>& query_rows,
                                       const std::vector<RowSample>& key_rows) {
    const DType dt = p.q.dtype;
    const std::int64_t d = p.q.d_head;
    const std::int64_t d_v = p.v.d_head;
    // K, dQ and dK have Q's head dim; dO, dV (and O) V's.
    if (p.k.d_head != d || p.dq.d_head != d || p.dk.d_head != d || p.d_o.d_head != d_v ||
        p.dv.d_head != d_v) {
        throw std::invalid_argument(
            "check_attention_backward: expected k, dq and dk of q's head dim " + std::to_string(d) +
            " and d_o and dv of v's " + std::to_string(d_v));
    }
    const std::int64_t group = p.q.heads / p.k.heads;
    // Which query rows of which head need dQ, which keys of which K/V head dK and dV.
    std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::int64_t>> dq_rows;
    for (const RowSample& r : query_rows)
        dq_rows[{r.batch, r.head}].push_back(r.row);
    std::map<std::pair<std::int64_t, std::int64_t>, KeySums> key_sums;
    for (const RowSample& r : key_rows)
        key_sums[{r.batch, r.head}].keys.push_back(r.row);
    for (auto& [unit, sums] : key_sums)
        sums.resize(d, d_v);

    Errors dq_errors;
    std::vector<SinkSums> sink_sums(static_cast<std::size_t>(p.q.heads));  // over the batch
    for (std::int64_t b = 0; b < p.q.batch; ++b) {
        for (std::int64_t h = 0; h < p.q.heads; ++h) {
            const auto wanted_q = dq_rows.find({b, h});
            const auto wanted_k = key_sums.find({b, h / group});
            const bool sinks = p.sinks != nullptr;  // every row enters dsinks
            if (wanted_q == dq_rows.end() && wanted_k == key_sums.end() && !sinks)
                continue;
            // The head's query rows over the threads; each its own share of the key sums.
            const int workers = detail::worker_count(p.q.seq);
            std::vector<KeySums> partial(static_cast<std::size_t>(workers));
            std::vector<Errors> dq_partial(static_cast<std::size_t>(workers));
            std::vector<SinkSums> sink_partial(static_cast<std::size_t>(workers));
            parallel_for(p.q.seq, [&](std::int64_t begin, std::int64_t end, int t) {
                Row row(p.k.seq);
                KeySums* sums = nullptr;
                if (wanted_k != key_sums.end()) {
                    sums = &partial[static_cast<std::size_t>(t)];
                    sums->keys = wanted_k->second.keys;
                    sums->resize(d, d_v);
                }
                for (std::int64_t i = begin; i < end; ++i) {
                    const bool wants_dq =
                        wanted_q != dq_rows.end() &&
                        std::find(wanted_q->second.begin(), wanted_q->second.end(), i) !=
                            wanted_q->second.end();
                    if (!wants_dq && sums == nullptr && !sinks)
                        continue;
                    row.compute(p, b, h, i);
                    sink_partial[static_cast<std::size_t>(t)].add(row.d_sink);
                    if (wants_dq) {
                        const std::int64_t kv = h / group;
                        for (std::int64_t x = 0; x < d; ++x) {
                            double a64 = 0;
                            float a32 = 0, flash32 = 0;
                            for (std::int64_t j = row.first; j < row.end; ++j) {
                                const float kx = p.k.values[p.k.offset(b, j, kv) + x];
                                a64 += row.ds64[j] * kx;
                                a32 += row.ds16[j] * kx;
                                flash32 += row.ds16_flash[j] * kx;
                            }
                            const double got = p.dq.values[p.dq.offset(b, i, h) + x];
                            dq_partial[static_cast<std::size_t>(t)].add(
                                got, scaled_naive(dt, a32, p.scale),
                                scaled_naive(dt, flash32, p.scale), a64 * p.scale);
                        }
                    }
                    if (sums != nullptr) {
                        const float* qi = &p.q.values[p.q.offset(b, i, h)];
                        const float* doi = &p.d_o.values[p.d_o.offset(b, i, h)];
                        for (std::size_t s = 0; s < sums->keys.size(); ++s) {
                            const std::int64_t j = sums->keys[s];
                            if (j < row.first || j >= row.end)
                                continue;  // invisible to row i
                            for (std::int64_t x = 0; x < d; ++x) {
                                const std::size_t at =
                                    s * static_cast<std::size_t>(d) + static_cast<std::size_t>(x);
                                sums->dk64[at] += row.ds64[j] * qi[x];
                                sums->dk32[at] += row.ds16[j] * qi[x];
                                sums->dk_flash32[at] += row.ds16_flash[j] * qi[x];
                            }
                            for (std::int64_t x = 0; x < d_v; ++x) {
                                const std::size_t at =
                                    s * static_cast<std::size_t>(d_v) + static_cast<std::size_t>(x);
                                sums->dv64[at] += row.p64[j] * doi[x];
                                sums->dv32[at] += row.p16[j] * doi[x];
                            }
                        }
                    }
                }
            });
            for (const Errors& e : dq_partial)
                dq_errors.merge(e);
            for (const SinkSums& part : sink_partial)
                sink_sums[static_cast<std::size_t>(h)].add(part);
            if (wanted_k != key_sums.end()) {
                for (const KeySums& part : partial) {
                    if (!part.keys.empty())
                        wanted_k->second.add(part);
                }
            }
        }
    }

    Errors dk_errors, dv_errors;
    for (const auto& [unit, sums] : key_sums) {
        const auto [b, kv] = unit;
        for (std::size_t s = 0; s < sums.keys.size(); ++s) {
            const std::int64_t j = sums.keys[s];
            for (std::int64_t x = 0; x < d; ++x) {
                const std::size_t at =
                    s * static_cast<std::size_t>(d) + static_cast<std::size_t>(x);
                dk_errors.add(p.dk.values[p.dk.offset(b, j, kv) + x],
                              scaled_naive(dt, sums.dk32[at], p.scale),
                              scaled_naive(dt, sums.dk_flash32[at], p.scale),
                              sums.dk64[at] * p.scale);
            }
            for (std::int64_t x = 0; x < d_v; ++x) {
                const std::size_t at =
                    s * static_cast<std::size_t>(d_v) + static_cast<std::size_t>(x);
                dv_errors.add(p.dv.values[p.dv.offset(b, j, kv) + x], round_to(dt, sums.dv32[at]),
                              sums.dv64[at]);
            }
        }
    }

    BackwardCheck c;
    const auto q_count = static_cast<std::int64_t>(query_rows.size());
    const auto k_count = static_cast<std::int64_t>(key_rows.size());
    c.dq = result(dq_errors, q_count, non_finite(p.dq));
    c.dk = result(dk_errors, k_count, non_finite(p.dk));
    c.dv = result(dv_errors, k_count, non_finite(p.dv));
    c.d_sinks.passed = true;
    if (p.sinks != nullptr) {
        Errors sink_errors;
        std::int64_t bad = 0;
        for (std::int64_t h = 0; h < p.q.heads; ++h) {
            const float got = p.d_sinks != nullptr && std::ssize(*p.d_sinks) > h
                                  ? (*p.d_sinks)[static_cast<std::size_t>(h)]
                                  : NAN;  // missing: an infinite error
            bad += std::isfinite(got) ? 0 : 1;
            const SinkSums& sums = sink_sums[static_cast<std::size_t>(h)];
            const float as_torch = round_to(dt, sums.as_torch);
            const float as_flash = sums.as_flash;  // the kernels write fp32 dsinks
            // The naive error: the larger of the two computations', and at least the rounding
            // scale of its rows (root-sum-square). One sum's error is one draw of a walk over
            // every row: a correct kernel failed 2 x the two draws (0.0128 against 0.0116, bf16,
            // window 255, sinks, 700 rows; H200, 2026-12-04). The scale is about √rows · u of a
            // row's share: a dsink 5% off still fails (reference_test.cpp).
            const double naive_error =
                std::max({static_cast<double>(std::abs(as_torch - sums.exact)),
                          static_cast<double>(std::abs(as_flash - sums.exact)),
                          std::sqrt(sums.rounding_sq)});
            sink_errors.add(got, sums.exact + naive_error, sums.exact);
        }
        c.d_sinks = result(sink_errors, p.q.heads, bad);
    }
    c.passed = c.dq.passed && c.dk.passed && c.dv.passed && c.d_sinks.passed;
    return c;
}

std::string BackwardCheck::summary() const {
    const auto one = [](const char* name, const CheckResult& r) {
        char text[200];
        std::snprintf(text, sizeof text,
                      "%s max|%s-ref| %.3g %s %.3g (2 x %.3g naive same-dtype + slack), %lld "
                      "non-finite",
                      r.passed ? "ok" : "FAILED", name, r.max_error,
                      r.max_error <= r.tolerance ? "<=" : ">", r.tolerance, r.naive_max_error,
                      static_cast<long long>(r.non_finite));
        return std::string(text);
    };
    return std::string(passed ? "passed" : "FAILED") + ": " + one("dq", dq) + "; " + one("dk", dk) +
           "; " + one("dv", dv) +
           (d_sinks.rows_checked > 0 ? "; " + one("dsinks", d_sinks) : std::string()) + " (" +
           std::to_string(dq.rows_checked) + " query rows, " + std::to_string(dk.rows_checked) +
           " key rows)";
}

}  // namespace flash_attention::reference
