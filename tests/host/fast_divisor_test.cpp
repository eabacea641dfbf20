#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/fast_divisor.hpp"

namespace fa = flash_attention;

namespace {

// The divisors tile numbers meet (query blocks, heads, sections, GQA groups) and the edges
// of the method: 1, powers of two and their neighbours, and the largest int.
TEST(FastDivisor, QuotientEqualsDivisionOverTheIntRange) {
    std::vector<int> divisors;
    for (int d = 1; d <= 1000; ++d)
        divisors.push_back(d);
    for (int k = 10; k < 31; ++k) {
        divisors.push_back((1 << k) - 1);
        divisors.push_back(1 << k);
        divisors.push_back((1 << k) + 1);
    }
    divisors.push_back(2147483647);
    std::mt19937 rng(20261128);
    std::uniform_int_distribution<int> any(0, 2147483647);
    for (const int d : divisors) {
        const fa::FastDivisor fast(d);
        std::vector<int> numerators = {0, 1, d - 1, d, 2147483647, 2147483647 - d};
        for (int i = 0; i < 300; ++i)
            numerators.push_back(any(rng));
        for (int q = 1; q < 64 && std::int64_t{q} * d <= 2147483647; ++q) {
            numerators.push_back(q * d - 1);
            numerators.push_back(q * d);
        }
        for (const int n : numerators) {
            if (n < 0)
                continue;
            ASSERT_EQ(fast.quotient(n), n / d) << n << " / " << d;
        }
    }
}

static_assert(fa::FastDivisor(3).quotient(7) == 2 && fa::FastDivisor(1).quotient(9) == 9 &&
                  fa::FastDivisor(64).quotient(130) == 2,
              "constexpr, as device code calls it");

}  // namespace
