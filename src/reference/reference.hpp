#pragma once

// CPU reference attention in double precision, and the FlashAttention test rule:
// a kernel passes when max|out - ref| <= 2 * max|naive - ref| + 1e-3, where "naive"
// is the textbook computation in the same 16-bit dtype (matmul rounded to dtype,
// softmax rounded to dtype, matmul rounded to dtype), as PyTorch would do it.

#include <cstdint>
#include <string>
#include <vector>

#include "flash_attention/kernel_config.hpp"

namespace flash_attention::reference {

float to_float(DType dtype, std::uint16_t bits);
std::uint16_t from_float(DType dtype, float value);  // round to nearest even

// A contiguous (batch, seq, heads, d_head) tensor on the host: its 16-bit encoding and
// the exact float value of each element.
struct HostTensor {
    DType dtype = DType::FP16;
    std::int64_t batch = 0, seq = 0, heads = 0, d_head = 0;
    std::vector<std::uint16_t> bits;
    std::vector<float> values;

    std::int64_t size() const { return batch * seq * heads * d_head; }
    std::int64_t offset(std::int64_t b, std::int64_t s, std::int64_t h) const {
        return ((b * seq + s) * heads + h) * d_head;
    }

    // Standard normal values rounded to dtype, drawn in parallel from `seed`.
    static HostTensor random_normal(DType dtype, std::int64_t batch, std::int64_t seq,
                                    std::int64_t heads, std::int64_t d_head, std::uint64_t seed);
    static HostTensor from_bits(DType dtype, std::int64_t batch, std::int64_t seq,
                                std::int64_t heads, std::int64_t d_head,
                                std::vector<std::uint16_t> bits);
};

struct RowSample {
    std::int64_t batch, head, row;
};

// Up to rows_per_head query rows per (batch, head), one drawn from each of
// rows_per_head equal strata so every part of the sequence (every warp's and every
// CTA's rows, over many draws) gets checked; all rows when seq <= rows_per_head.
std::vector<RowSample> sample_rows(std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                   std::int64_t rows_per_head, std::uint64_t seed);

// A problem and a kernel's answer to it. K and V may have fewer heads than Q (GQA/MQA:
// query head h reads K/V head h / (q.heads / k.heads)). Query i's diagonal position is
// d = i + seq_k - seq_q (bottom-right aligned), or with `top_left` d = i; with `causal` it
// sees keys j <= d, and with a sliding window d - window_left <= j <= d + window_right (-1:
// unbounded). `softcap` (0: off) turns scores s into softcap * tanh(s / softcap); `sinks`
// (per query head) join each row's denominator. `lse`, when given, is the kernel's
// log-sum-exp, (batch, q.heads, q.seq) contiguous, natural log.
struct Problem {
    const HostTensor& q;
    const HostTensor& k;
    const HostTensor& v;
    const HostTensor& out;
    double scale;
    bool causal = false;
    const std::vector<float>* lse = nullptr;
    bool top_left = false;
    int window_left = -1;
    int window_right = -1;
    double softcap = 0;
    const std::vector<float>* sinks = nullptr;
};

// The LSE's slack: its error bound is 2 x the error of a naive fp32 LSE (scores accumulated
// and scaled in fp32) + this. The naive error carries the fp32 rounding of the scaled scores,
// which alone exceeds a fixed bound where a row's LSE is large (thousands at a scale of 100:
// one unit in the last place is 2.4e-4 to 4.9e-4 there, and the kernels' row max is fp32);
// at ordinary scales the kernels' error is about 1e-6.
inline constexpr double k_lse_tolerance = 1e-3;

struct CheckResult {
    double max_error = 0;        // max |out - ref| over the sampled rows
    double naive_max_error = 0;  // max |naive same-dtype - ref| over the same rows
    double tolerance = 0;        // 2 * naive_max_error + 1e-3
    std::int64_t rows_checked = 0;
    std::int64_t non_finite = 0;  // NaN/Inf anywhere in out: unwritten (poisoned) or broken
    double lse_max_error = 0;     // max |lse - ref| (0 when not checked; -inf must match exactly)
    double lse_naive_max_error = 0;  // max |naive fp32 lse - ref| over the same rows
    double lse_tolerance = 0;        // 2 * lse_naive_max_error + k_lse_tolerance
    bool passed = false;

    std::string summary() const;
};

// Compares the kernel's output (and LSE) with the double-precision reference on the
// sampled rows and checks every element of the output is finite. Runs on all hardware
// threads.
CheckResult check_attention(const Problem& problem, const std::vector<RowSample>& rows);
// Full attention, no mask, equal heads.
CheckResult check_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                            const HostTensor& out, double softmax_scale,
                            const std::vector<RowSample>& rows);

}  // namespace flash_attention::reference
