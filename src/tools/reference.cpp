#include "flash_attention/tools.hpp"

#include "tools/host_math.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace flash_attention::reference {

float to_float(DType dtype, std::uint16_t bits) {
    if (dtype == DType::FP16) {
        __half_raw raw;
        raw.x = bits;
        return __half2float(__half(raw));
    }
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
}

std::uint16_t from_float(DType dtype, float value) {
    if (dtype == DType::FP16)
        return static_cast<__half_raw>(__float2half_rn(value)).x;
    return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(value)).x;
}

namespace detail {

float round_to(DType dtype, float x) {
    return to_float(dtype, from_float(dtype, x));
}

int worker_count(std::int64_t n) {
    return static_cast<int>(std::clamp<std::int64_t>(std::thread::hardware_concurrency(), 1,
                                                     std::max<std::int64_t>(n, 1)));
}

void parallel_for(std::int64_t n,
                  const std::function<void(std::int64_t, std::int64_t, int)>& body) {
    const int threads = worker_count(n);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] { body(n * t / threads, n * (t + 1) / threads, t); });
    }
    for (auto& th : pool)
        th.join();
}

}  // namespace detail

namespace {

using detail::parallel_for;
using detail::round_to;

struct RowErrors {
    double kernel = 0;
    double naive = 0;
    double lse = 0;
    double naive_lse = 0;
};

std::pair<std::int64_t, std::int64_t> visible_keys(const Problem& p, std::int64_t row) {
    return detail::VisibleKeys{p.q.seq,    p.k.seq,       p.causal,
                               p.top_left, p.window_left, p.window_right}(row);
}

// One query row, three ways: double precision, naive same-dtype, and the kernel's.
RowErrors check_row(const Problem& p, const RowSample& r, std::vector<double>& s64,
                    std::vector<float>& s16) {
    const HostTensor& q = p.q;
    const DType dt = q.dtype;
    const std::int64_t d = q.d_head;
    const std::int64_t kv_head = r.head / (q.heads / p.k.heads);
    const auto [lo, hi] = visible_keys(p, r.row);
    const float* qr = &q.values[q.offset(r.batch, r.row, r.head)];
    // The sink joins the denominator as a score of its own with no value.
    const double sink = p.sinks != nullptr ? (*p.sinks)[r.head] : -INFINITY;
    double max64 = sink;
    float max16 = static_cast<float>(sink);
    // The naive fp32 LSE, online: its row max and the sum relative to it.
    float max32 = static_cast<float>(sink);
    float sum32 = p.sinks != nullptr ? 1.0f : 0.0f;
    for (std::int64_t j = lo; j < hi; ++j) {
        const float* kr = &p.k.values[p.k.offset(r.batch, j, kv_head)];
        double acc64 = 0;
        float acc32 = 0;
        for (std::int64_t x = 0; x < d; ++x) {
            acc64 += static_cast<double>(qr[x]) * kr[x];
            acc32 += qr[x] * kr[x];
        }
        s64[j] = acc64 * p.scale;
        s16[j] = round_to(dt, round_to(dt, acc32) * static_cast<float>(p.scale));
        float s32 = acc32 * static_cast<float>(p.scale);
        if (p.softcap != 0) {
            s64[j] = p.softcap * std::tanh(s64[j] / p.softcap);
            const auto cap = static_cast<float>(p.softcap);
            s16[j] = round_to(dt, cap * std::tanh(s16[j] / cap));
            s32 = cap * std::tanh(s32 / cap);
        }
        // ALiBi's bias in fp32 for the naive rows too: rounded to the dtype it would carry an
        // error of its own magnitude's last place (hundreds of keys away, units), a bound
        // too loose to test the kernels' bias.
        if (p.alibi_slopes != nullptr) {
            const double bias = detail::AlibiBias{p.alibi_slopes, p.alibi_batch_stride, p.q.seq,
                                                  p.k.seq, p.top_left}(r.batch, r.head, r.row, j);
            s64[j] += bias;
            s16[j] += static_cast<float>(bias);
            s32 += static_cast<float>(bias);
        }
        if (s32 > max32) {
            sum32 = sum32 * std::exp(max32 - s32) + 1.0f;  // exp(-inf) = 0: the first score
            max32 = s32;
        } else {
            sum32 += std::exp(s32 - max32);
        }
        max64 = std::max(max64, s64[j]);
        max16 = std::max(max16, s16[j]);
    }
    const bool any = max64 != -INFINITY;  // a key or a sink
    double sum64 = any && p.sinks != nullptr ? std::exp(sink - max64) : 0;
    float sum16 = any && p.sinks != nullptr ? std::exp(static_cast<float>(sink) - max16) : 0;
    for (std::int64_t j = lo; j < hi; ++j) {
        s64[j] = std::exp(s64[j] - max64);
        sum64 += s64[j];
        s16[j] = std::exp(s16[j] - max16);
        sum16 += s16[j];
    }
    for (std::int64_t j = lo; j < hi; ++j)
        s16[j] = round_to(dt, s16[j] / sum16);

    // A row that sees no key is all zeros, with log-sum-exp -inf (its sink with one).
    RowErrors e;
    const std::uint16_t* orow = &p.out.bits[p.out.offset(r.batch, r.row, r.head)];
    for (std::int64_t x = 0; x < p.v.d_head; ++x) {  // V's head dim: O's columns
        double acc64 = 0;
        float acc32 = 0;
        for (std::int64_t j = lo; j < hi; ++j) {
            const float vj = p.v.values[p.v.offset(r.batch, j, kv_head) + x];
            acc64 += s64[j] * vj;
            acc32 += s16[j] * vj;
        }
        const double ref = hi > lo ? acc64 / sum64 : 0.0;
        const double got = to_float(dt, orow[x]);
        // NaN compares false: make it an infinite error instead of a silent pass.
        e.kernel = std::max(e.kernel, std::isfinite(got) ? std::abs(got - ref) : INFINITY);
        e.naive = std::max(e.naive, std::abs(static_cast<double>(round_to(dt, acc32)) - ref));
    }
    if (p.lse != nullptr) {
        const float got = (*p.lse)[(r.batch * q.heads + r.head) * q.seq + r.row];
        if (!any) {
            e.lse = got == -INFINITY ? 0.0 : INFINITY;
        } else {
            const double ref = max64 + std::log(sum64);
            e.lse = std::isfinite(got) ? std::abs(got - ref) : INFINITY;
            e.naive_lse = std::abs(static_cast<double>(max32 + std::log(sum32)) - ref);
        }
    }
    return e;
}

}  // namespace

HostTensor HostTensor::random_normal(DType dtype, std::int64_t batch, std::int64_t seq,
                                     std::int64_t heads, std::int64_t d_head, std::uint64_t seed) {
    HostTensor t{dtype, batch, seq, heads, d_head, {}, {}};
    t.bits.resize(t.size());
    t.values.resize(t.size());
    constexpr std::int64_t chunk = 1 << 16;
    const std::int64_t chunks = (t.size() + chunk - 1) / chunk;
    parallel_for(chunks, [&](std::int64_t begin, std::int64_t end, int) {
        for (std::int64_t c = begin; c < end; ++c) {
            std::mt19937_64 rng(seed ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(c + 1)));
            std::normal_distribution<float> normal(0.0f, 1.0f);
            for (std::int64_t i = c * chunk; i < std::min(t.size(), (c + 1) * chunk); ++i) {
                t.bits[i] = from_float(dtype, normal(rng));
                t.values[i] = to_float(dtype, t.bits[i]);
            }
        }
    });
    return t;
}

HostTensor HostTensor::from_bits(DType dtype, std::int64_t batch, std::int64_t seq,
                                 std::int64_t heads, std::int64_t d_head,
                                 std::vector<std::uint16_t> bits) {
    HostTensor t{dtype, batch, seq, heads, d_head, std::move(bits), {}};
    t.values.resize(t.bits.size());
    for (std::size_t i = 0; i < t.bits.size(); ++i)
        t.values[i] = to_float(dtype, t.bits[i]);
    return t;
}

std::vector<RowSample> sample_rows(std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                   std::int64_t rows_per_head, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<RowSample> rows;
    for (std::int64_t b = 0; b < batch; ++b) {
        for (std::int64_t h = 0; h < heads; ++h) {
            if (seq <= rows_per_head) {
                for (std::int64_t s = 0; s < seq; ++s)
                    rows.push_back({b, h, s});
                continue;
            }
            for (std::int64_t i = 0; i < rows_per_head; ++i) {
                const std::int64_t lo = seq * i / rows_per_head;
                const std::int64_t hi = seq * (i + 1) / rows_per_head;
                rows.push_back({b, h, lo + static_cast<std::int64_t>(rng() % (hi - lo))});
            }
        }
    }
    return rows;
}

CheckResult check_attention(const Problem& p, const std::vector<RowSample>& rows) {
    // K's columns are Q's, O's are V's (which may have fewer: DeepSeek's MLA).
    if (p.k.d_head != p.q.d_head || p.out.d_head != p.v.d_head) {
        throw std::invalid_argument(
            "check_attention: expected k's head dim " + std::to_string(p.q.d_head) +
            " (q's) and out's " + std::to_string(p.v.d_head) + " (v's), got " +
            std::to_string(p.k.d_head) + " and " + std::to_string(p.out.d_head));
    }
    const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::vector<RowErrors> per_thread(threads);
    parallel_for(static_cast<std::int64_t>(rows.size()),
                 [&](std::int64_t begin, std::int64_t end, int t) {
                     std::vector<double> s64(p.k.seq);
                     std::vector<float> s16(p.k.seq);
                     for (std::int64_t i = begin; i < end; ++i) {
                         const RowErrors e = check_row(p, rows[i], s64, s16);
                         per_thread[t].kernel = std::max(per_thread[t].kernel, e.kernel);
                         per_thread[t].naive = std::max(per_thread[t].naive, e.naive);
                         per_thread[t].lse = std::max(per_thread[t].lse, e.lse);
                         per_thread[t].naive_lse = std::max(per_thread[t].naive_lse, e.naive_lse);
                     }
                 });
    CheckResult r;
    for (const RowErrors& e : per_thread) {
        r.max_error = std::max(r.max_error, e.kernel);
        r.naive_max_error = std::max(r.naive_max_error, e.naive);
        r.lse_max_error = std::max(r.lse_max_error, e.lse);
        r.lse_naive_max_error = std::max(r.lse_naive_max_error, e.naive_lse);
    }
    r.rows_checked = static_cast<std::int64_t>(rows.size());
    r.non_finite = std::count_if(p.out.values.begin(), p.out.values.end(),
                                 [](float x) { return !std::isfinite(x); });
    r.tolerance = 2 * r.naive_max_error + 1e-3;
    r.lse_tolerance = 2 * r.lse_naive_max_error + k_lse_tolerance;
    r.passed = r.non_finite == 0 && r.rows_checked > 0 && r.max_error <= r.tolerance &&
               r.lse_max_error <= r.lse_tolerance;
    return r;
}

CheckResult check_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                            const HostTensor& out, double softmax_scale,
                            const std::vector<RowSample>& rows) {
    return check_attention(Problem{q, k, v, out, softmax_scale, false, nullptr}, rows);
}

std::string CheckResult::summary() const {
    char text[320];
    const int n = std::snprintf(
        text, sizeof text,
        "%s: max|out-ref| %.3g %s 2 x %.3g (naive same-dtype) + 1e-3 = %.3g on %lld rows; "
        "%lld non-finite outputs",
        passed ? "passed" : "FAILED", max_error, max_error <= tolerance ? "<=" : ">",
        naive_max_error, tolerance, static_cast<long long>(rows_checked),
        static_cast<long long>(non_finite));
    // A failure the output's error does not explain is the LSE's: say so.
    if (lse_max_error > 0 && n > 0 && static_cast<std::size_t>(n) < sizeof text) {
        std::snprintf(text + n, sizeof text - static_cast<std::size_t>(n),
                      "; max|lse-ref| %.3g %s 2 x %.3g (naive fp32) + %.0e = %.3g", lse_max_error,
                      lse_max_error <= lse_tolerance ? "<=" : ">", lse_naive_max_error,
                      k_lse_tolerance, lse_tolerance);
    }
    return text;
}

}  // namespace flash_attention::reference
