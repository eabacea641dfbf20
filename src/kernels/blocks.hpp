#pragma once

// Blocks of `block` rows that cover n rows: n + block - 1 would overflow near 2^31. constexpr,
// so that host code and device code (--expt-relaxed-constexpr) share it.

namespace flash_attention {

constexpr int blocks_covering(int n, int block) {
    return n / block + (n % block != 0 ? 1 : 0);
}

}  // namespace flash_attention
