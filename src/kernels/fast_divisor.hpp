#pragma once

// Division by a divisor known at launch but not at compile time, as a multiply-high, an add
// and a shift (the round-up method of Granlund and Montgomery, "Division by Invariant Integers
// using Multiplication", PLDI 1994, with N = 32) instead of nvcc's integer division by a
// runtime value (a reciprocal estimate and its corrections, a chain of dependent instructions),
// on every tile a persistent CTA's warpgroups decode (tile_scheduler.cuh).

#include <cstdint>

namespace flash_attention {

struct FastDivisor {
    // l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1; then n / d = (mulhi(m, n) + n) >> l
    // for every n < 2^32, and the sum does not overflow 32 bits for n < 2^31 (mulhi(m, n) <= n).
    // constexpr, so device code calls it too (--expt-relaxed-constexpr): a 32 x 32 -> 64-bit
    // multiply, an add and a shift there.
    std::uint32_t multiplier = 1;  // d = 1: mulhi(1, n) = 0, so n itself
    int shift = 0;
    int divisor = 1;

    constexpr FastDivisor() = default;
    // d in [1, 2^31).
    constexpr explicit FastDivisor(int d) : divisor(d) {
        while ((std::int64_t{1} << shift) < d)
            ++shift;
        const std::uint64_t excess = (std::uint64_t{1} << shift) - static_cast<std::uint64_t>(d);
        multiplier = static_cast<std::uint32_t>((excess << 32) / static_cast<std::uint64_t>(d) + 1);
    }

    // n / d for n in [0, 2^31).
    constexpr int quotient(int n) const {
        const auto u = static_cast<std::uint32_t>(n);
        const auto high = static_cast<std::uint32_t>((std::uint64_t{multiplier} * u) >> 32);
        return static_cast<int>((high + u) >> shift);
    }
};

// What a dense problem's tile numbers divide by (tile_at() in tile_scheduler.cuh): its query
// blocks a head, the heads of a section and their tiles, q's heads, and the query heads a K/V
// head serves. Set by the sm90 launcher, which knows B_r.
struct TileDivisors {
    FastDivisor q_blocks, section_heads, section_tiles, heads, group;
};

}  // namespace flash_attention
