#pragma once

// Host arithmetic the double-precision references share (reference.cpp,
// reference_backward.cpp).

#include <cstdint>
#include <functional>

#include "flash_attention/kernel_config.hpp"

namespace flash_attention::reference::detail {

// x rounded to the 16-bit dtype and back.
float round_to(DType dtype, float x);

// Runs body(begin, end, thread) over [0, n) on all hardware threads, each thread a contiguous
// range.
void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t, int)>& body);

// The hardware threads parallel_for uses for n items.
int worker_count(std::int64_t n);

}  // namespace flash_attention::reference::detail
