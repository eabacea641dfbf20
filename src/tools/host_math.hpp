#pragma once

// Host arithmetic the double-precision references share (reference.cpp,
// reference_backward.cpp).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "flash_attention/kernel_config.hpp"

namespace flash_attention::reference::detail {

// x rounded to the dtype (FP16, BF16 or E4M3, to_float/from_float's) and back.
float round_to(DType dtype, float x);

// Runs body(begin, end, thread) over [0, n) on all hardware threads, each thread a contiguous
// range.
void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t, int)>& body);

// The hardware threads parallel_for uses for n items.
int worker_count(std::int64_t n);

// The keys query row `row` sees, [lo, hi): all, or those of its causal mask and sliding window
// (sides of -1 unbounded) around its diagonal position (bottom right: row + seq_k - seq_q; top
// left: row).
struct VisibleKeys {
    std::int64_t seq_q, seq_k;
    bool causal, top_left;
    int window_left, window_right;

    std::pair<std::int64_t, std::int64_t> operator()(std::int64_t row) const {
        const std::int64_t pos = row + (top_left ? 0 : seq_k - seq_q);
        const std::int64_t right = causal ? 0 : window_right;
        const std::int64_t lo = window_left >= 0 ? pos - window_left : 0;
        const std::int64_t hi = right >= 0 ? pos + right + 1 : seq_k;
        return {std::clamp<std::int64_t>(lo, 0, seq_k), std::clamp<std::int64_t>(hi, 0, seq_k)};
    }
};

// ALiBi's bias of query row `row` and key j: -slope * |row's diagonal position - j|, the slope
// slopes[b * batch_stride + h]; 0 without slopes.
struct AlibiBias {
    const std::vector<float>* slopes;
    std::int64_t batch_stride;
    std::int64_t seq_q, seq_k;
    bool top_left;

    double operator()(std::int64_t b, std::int64_t h, std::int64_t row, std::int64_t j) const {
        if (slopes == nullptr)
            return 0.0;
        const std::int64_t pos = row + (top_left ? 0 : seq_k - seq_q);
        const double slope = (*slopes)[static_cast<std::size_t>(b * batch_stride + h)];
        return -slope * static_cast<double>(pos > j ? pos - j : j - pos);
    }
};

}  // namespace flash_attention::reference::detail
