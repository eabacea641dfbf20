#include "flash_attention/tools.hpp"

#include "tools/host_math.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numbers>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace flash_attention::reference {

namespace {

// E4M3 (e4m3fn): a sign, 4 exponent bits (bias 7) and 3 mantissa bits. Exponent field 0 holds
// the subnormals m/8 x 2^-6; exponent 15 with mantissa 7 is NaN, the rest of it finite (no
// infinities), so the largest value is 1.75 x 2^8 = 448.
float e4m3_to_float(std::uint8_t byte) {
    const int exponent = (byte >> 3) & 0xF;
    const int mantissa = byte & 7;
    float magnitude;
    if (exponent == 15 && mantissa == 7) {
        magnitude = NAN;
    } else if (exponent == 0) {
        magnitude = std::ldexp(static_cast<float>(mantissa), -9);
    } else {
        magnitude =
            std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);  // (1 + m/8) 2^(e-7)
    }
    return (byte & 0x80) != 0 ? -magnitude : magnitude;
}

std::uint8_t float_to_e4m3(float value) {
    if (std::isnan(value))
        return 0x7F;
    const std::uint8_t sign = std::signbit(value) ? 0x80 : 0;
    const float magnitude = std::abs(value);
    // satfinite: whatever rounds past 448 (a tie at 464 rounds to 448 anyway) stays at 448.
    if (magnitude >= 448.0f)
        return sign | 0x7E;
    // The codes of one sign are in value order, eight to a binade [2^e, 2^(e+1)) with e from -6,
    // the subnormals below 2^-6 using the same step as that binade's, 2^-9. So the code is
    // (e + 6) x 8 plus the magnitude counted in steps of 2^(e-3) (8 to 15 within the binade, 0 to
    // 7 below it), and counting rounded to nearest even (nearbyint, the default rounding mode)
    // carries a count of 16 into the next binade's first code by itself.
    const int e = magnitude < 0x1p-6f ? -6 : std::ilogb(magnitude);
    const auto steps = static_cast<int>(std::nearbyint(std::ldexp(magnitude, 3 - e)));
    return static_cast<std::uint8_t>(sign | ((e + 6) * 8 + steps));
}

}  // namespace

float to_float(DType dtype, std::uint16_t bits) {
    switch (dtype) {
        case DType::FP16: {
            __half_raw raw;
            raw.x = bits;
            return __half2float(__half(raw));
        }
        case DType::BF16: {
            __nv_bfloat16_raw raw;
            raw.x = bits;
            return __bfloat162float(__nv_bfloat16(raw));
        }
        case DType::E4M3:
            return e4m3_to_float(static_cast<std::uint8_t>(bits));
    }
    throw std::invalid_argument("to_float: unknown dtype " +
                                std::to_string(static_cast<int>(dtype)));
}

std::uint16_t from_float(DType dtype, float value) {
    switch (dtype) {
        case DType::FP16:
            return static_cast<__half_raw>(__float2half_rn(value)).x;
        case DType::BF16:
            return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(value)).x;
        case DType::E4M3:
            return float_to_e4m3(value);
    }
    throw std::invalid_argument("from_float: unknown dtype " +
                                std::to_string(static_cast<int>(dtype)));
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
    double ref = 0;               // max |reference output| (FP8 rows): the FP8 slack's unit
    double lse_accumulation = 0;  // FP8 rows: the tensor cores' accumulation (k_fp8_accumulation)
};

std::pair<std::int64_t, std::int64_t> visible_keys(const Problem& p, std::int64_t row) {
    return detail::VisibleKeys{p.q.seq,    p.k.seq,       p.causal,
                               p.top_left, p.window_left, p.window_right}(row);
}

// Column x of a row's P·V over keys [lo, hi) of sequence `batch`'s K/V head: with the double
// probabilities s64 in double, and with the naive computation's (`naive`, already in its
// precision) in fp32, as its GEMM sums them.
struct PvColumn {
    double exact;
    float naive;
};
PvColumn pv_column(const Problem& p, std::int64_t batch, std::int64_t kv_head, std::int64_t lo,
                   std::int64_t hi, std::int64_t x, const std::vector<double>& s64,
                   const std::vector<float>& naive) {
    PvColumn sums{0, 0};
    for (std::int64_t j = lo; j < hi; ++j) {
        const float vj = p.v.values[p.v.offset(batch, j, kv_head) + x];
        sums.exact += s64[j] * vj;
        sums.naive += naive[j] * vj;
    }
    return sums;
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
        const auto [acc64, acc32] = pv_column(p, r.batch, kv_head, lo, hi, x, s64, s16);
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

// FP8's max offset: probabilities are exponentiated as 2^(s - m + 8) (up to 256, clear of 448)
// rather than 2^(s - m) (up to 1), so that in e4m3 (normal from 2^-6, nonzero from 2^-9) they keep
// their 3 mantissa bits down to 2^-14 of the row's largest rather than 2^-6, and vanish below
// 2^-18 rather than 2^-10. The row sum and the LSE take the 2^8 back out.
constexpr float k_fp8_max_offset = 8;

// One query row of FP8 inputs, two ways and the kernel's: double precision on the dequantised
// inputs, and the naive FP8 computation, FlashAttention-3's in one pass over the keys.
//
// Hopper's wgmma multiplies 8-bit operands into fp32 accumulators, so S = Q Kᵀ is the e4m3 values'
// products summed in fp32, the descales not applied: they are one factor a row (a K/V head's),
// so the kernel folds q_descale x k_descale into the softmax's scale, which is base 2 (scale x
// log2 e: ex2 is the hardware's exponential), all in fp32. P·V is again a wgmma with both
// operands 8-bit, so P goes to e4m3, using the max offset above; the row sum ℓ adds the fp32 P
// before that rounding (it is reduced from the same registers, before the conversion), and
// v_descale, one factor a row too, joins 1/ℓ in the final fp32 scaling of O before its rounding
// to bf16. The LSE, (m + log2 ℓ - 8) in base 2, is turned into natural units in fp32.
//
// The kernel's online softmax rounds P against a running max rather than the row's, and so its
// roundings to e4m3 differ from these, of the same size: the rule's factor 2 is for that.
RowErrors check_row_fp8(const Problem& p, const RowSample& r, std::vector<double>& s64,
                        std::vector<float>& s32) {
    const HostTensor& q = p.q;
    const std::int64_t kv_head = r.head / (q.heads / p.k.heads);
    const auto at = static_cast<std::size_t>(r.batch * p.k.heads + kv_head);
    const float q_descale = (*p.q_descale)[at];
    const float k_descale = (*p.k_descale)[at];
    const float v_descale = (*p.v_descale)[at];
    const double scale64 = p.scale * q_descale * k_descale;
    const float scale_log2 =
        static_cast<float>(p.scale * std::numbers::log2e) * q_descale * k_descale;
    const auto [lo, hi] = visible_keys(p, r.row);
    const float* qr = &q.values[q.offset(r.batch, r.row, r.head)];
    double max64 = -INFINITY;
    float max32 = -INFINITY;
    double magnitude = 0;  // the largest sum of |q x k| over the row's keys
    for (std::int64_t j = lo; j < hi; ++j) {
        const float* kr = &p.k.values[p.k.offset(r.batch, j, kv_head)];
        double acc64 = 0, abs64 = 0;
        float acc32 = 0;
        for (std::int64_t x = 0; x < q.d_head; ++x) {
            acc64 += static_cast<double>(qr[x]) * kr[x];
            abs64 += std::abs(static_cast<double>(qr[x]) * kr[x]);
            acc32 += qr[x] * kr[x];
        }
        magnitude = std::max(magnitude, abs64);
        s64[j] = acc64 * scale64;
        s32[j] = acc32 * scale_log2;
        max64 = std::max(max64, s64[j]);
        max32 = std::max(max32, s32[j]);
    }
    double sum64 = 0;
    float sum32 = 0;
    for (std::int64_t j = lo; j < hi; ++j) {
        s64[j] = std::exp(s64[j] - max64);
        sum64 += s64[j];
        s32[j] = std::exp2(s32[j] - max32 + k_fp8_max_offset);
        sum32 += s32[j];
        s32[j] = round_to(DType::E4M3, s32[j]);
    }
    // A row that sees no key is all zeros (the kernel's 1/ℓ is 0 for ℓ = 0), LSE -inf.
    const float o_scale = hi > lo ? 1.0f / sum32 * v_descale : 0.0f;

    RowErrors e;
    const std::uint16_t* orow = &p.out.bits[p.out.offset(r.batch, r.row, r.head)];
    for (std::int64_t x = 0; x < p.v.d_head; ++x) {
        const auto [acc64, acc32] = pv_column(p, r.batch, kv_head, lo, hi, x, s64, s32);
        const double ref = hi > lo ? acc64 * v_descale / sum64 : 0.0;
        const double got = to_float(DType::BF16, orow[x]);
        e.kernel = std::max(e.kernel, std::isfinite(got) ? std::abs(got - ref) : INFINITY);
        e.naive = std::max(
            e.naive, std::abs(static_cast<double>(round_to(DType::BF16, acc32 * o_scale)) - ref));
        e.ref = std::max(e.ref, std::abs(ref));
    }
    if (p.lse != nullptr) {
        const float got = (*p.lse)[(r.batch * q.heads + r.head) * q.seq + r.row];
        if (hi == lo) {
            e.lse = got == -INFINITY ? 0.0 : INFINITY;
        } else {
            const double ref = max64 + std::log(sum64);
            e.lse = std::isfinite(got) ? std::abs(got - ref) : INFINITY;
            const float naive =
                (max32 + std::log2(sum32) - k_fp8_max_offset) * std::numbers::ln2_v<float>;
            e.naive_lse = std::abs(static_cast<double>(naive) - ref);
            const double k_steps = static_cast<double>(q.d_head) / 32;
            e.lse_accumulation = k_steps * k_fp8_accumulation * magnitude * scale64;
        }
    }
    return e;
}

// The tensors' dtypes and the descales fit together; throws naming the argument that does not.
void check_dtypes(const Problem& p) {
    const auto fail = [](const std::string& what) {
        throw std::invalid_argument("check_attention: " + what);
    };
    const auto name = [](DType dtype) { return std::string(to_string(dtype)); };
    if (p.k.dtype != p.q.dtype || p.v.dtype != p.q.dtype) {
        fail("k and v must have q's dtype " + name(p.q.dtype) + ", got k " + name(p.k.dtype) +
             " and v " + name(p.v.dtype));
    }
    const bool fp8 = p.q.dtype == DType::E4M3;
    const DType out_dtype = fp8 ? DType::BF16 : p.q.dtype;
    if (p.out.dtype != out_dtype) {
        fail("out must be " + name(out_dtype) + " with " + name(p.q.dtype) + " inputs, got " +
             name(p.out.dtype));
    }
    const std::pair<const char*, const std::vector<float>*> descales[] = {
        {"q_descale", p.q_descale}, {"k_descale", p.k_descale}, {"v_descale", p.v_descale}};
    const auto expected = static_cast<std::size_t>(p.q.batch * p.k.heads);
    for (const auto& [what, descale] : descales) {
        if (!fp8 && descale != nullptr) {
            fail(std::string(what) + " is for E4M3 inputs; these are " + name(p.q.dtype));
        } else if (fp8 && descale == nullptr) {
            fail(std::string("E4M3 inputs need ") + what +
                 " (q_descale, k_descale and v_descale, each batch x k.heads values)");
        } else if (fp8 && descale->size() != expected) {
            fail(std::string(what) + " must hold batch x k.heads = " + std::to_string(expected) +
                 " values, got " + std::to_string(descale->size()));
        }
    }
    if (fp8 && (p.softcap != 0 || p.alibi_slopes != nullptr || p.sinks != nullptr))
        fail("E4M3 inputs take no softcap, alibi_slopes or sinks");
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
    check_dtypes(p);
    const bool fp8 = p.q.dtype == DType::E4M3;
    const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::vector<RowErrors> per_thread(threads);
    parallel_for(
        static_cast<std::int64_t>(rows.size()), [&](std::int64_t begin, std::int64_t end, int t) {
            std::vector<double> s64(p.k.seq);
            std::vector<float> s16(p.k.seq);
            for (std::int64_t i = begin; i < end; ++i) {
                const RowErrors e =
                    fp8 ? check_row_fp8(p, rows[i], s64, s16) : check_row(p, rows[i], s64, s16);
                per_thread[t].kernel = std::max(per_thread[t].kernel, e.kernel);
                per_thread[t].naive = std::max(per_thread[t].naive, e.naive);
                per_thread[t].lse = std::max(per_thread[t].lse, e.lse);
                per_thread[t].naive_lse = std::max(per_thread[t].naive_lse, e.naive_lse);
                per_thread[t].ref = std::max(per_thread[t].ref, e.ref);
                per_thread[t].lse_accumulation =
                    std::max(per_thread[t].lse_accumulation, e.lse_accumulation);
            }
        });
    CheckResult r;
    double max_ref = 0, lse_accumulation = 0;
    for (const RowErrors& e : per_thread) {
        max_ref = std::max(max_ref, e.ref);
        lse_accumulation = std::max(lse_accumulation, e.lse_accumulation);
        r.max_error = std::max(r.max_error, e.kernel);
        r.naive_max_error = std::max(r.naive_max_error, e.naive);
        r.lse_max_error = std::max(r.lse_max_error, e.lse);
        r.lse_naive_max_error = std::max(r.lse_naive_max_error, e.naive_lse);
    }
    r.rows_checked = static_cast<std::int64_t>(rows.size());
    r.non_finite = std::count_if(p.out.values.begin(), p.out.values.end(),
                                 [](float x) { return !std::isfinite(x); });
    r.tolerance = 2 * r.naive_max_error + (fp8 ? k_fp8_output_slack * max_ref : 1e-3);
    r.lse_tolerance = 2 * r.lse_naive_max_error + k_lse_tolerance + lse_accumulation;
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
        "%s: max|out-ref| %.3g %s 2 x %.3g (naive same-dtype) + %.2g = %.3g on %lld rows; "
        "%lld non-finite outputs",
        passed ? "passed" : "FAILED", max_error, max_error <= tolerance ? "<=" : ">",
        naive_max_error, tolerance - 2 * naive_max_error, tolerance,
        static_cast<long long>(rows_checked), static_cast<long long>(non_finite));
    // A failure the output's error does not explain is the LSE's: say so.
    if (lse_max_error > 0 && n > 0 && static_cast<std::size_t>(n) < sizeof text) {
        std::snprintf(text + n, sizeof text - static_cast<std::size_t>(n),
                      "; max|lse-ref| %.3g %s 2 x %.3g (naive fp32) + %.2g = %.3g", lse_max_error,
                      lse_max_error <= lse_tolerance ? "<=" : ">", lse_naive_max_error,
                      lse_tolerance - 2 * lse_naive_max_error, lse_tolerance);
    }
    return text;
}

}  // namespace flash_attention::reference
