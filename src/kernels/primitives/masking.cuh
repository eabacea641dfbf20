#pragma once

// Which keys a query row sees, per CTA and per score tile. One mask for every kernel:
// keys past seq_k (the last, partial K/V block) and, with causal masking, keys past
// row + seq_k - seq_q (aligned at the bottom right, as FlashAttention >= 2.1 does). The
// functions below take that seq_q as the diagonal's query length: aligned at the top left
// (query i sees keys j <= i, PyTorch's is_causal) it is seq_k (diagonal_queries).

#include <algorithm>
#include <cmath>

#include "kernels/kernel_args.hpp"
#include "kernels/primitives/geometry.cuh"

namespace flash_attention {

struct KeyBlocks {
    int visited;   // K/V blocks this CTA computes; the rest are fully masked and skipped
    int unmasked;  // the first `unmasked` of them need no mask at all
};

// Blocks of `block` rows that cover n rows: n + block - 1 would overflow near 2^31.
__host__ __device__ constexpr int blocks_covering(int n, int block) {
    return n / block + (n % block != 0 ? 1 : 0);
}

// For the CTA whose query rows are [q_row0, q_row0 + q_rows). Lengths reach 2^31 - 1, so
// every sum below stays under seq_k: offsets from the end of the query sequence are
// small, and seq_k is added last.
__host__ __device__ constexpr KeyBlocks key_blocks(int seq_q, int seq_k, bool causal, int q_row0,
                                                   int q_rows, int B_c) {
    int visited = blocks_covering(seq_k, B_c);
    int unmasked = seq_k / B_c;  // blocks with no key past seq_k
    if (causal) {
        // The CTA's last row sees keys below q_row0 + q_rows + seq_k - seq_q ...
        if (const int past = q_row0 - seq_q + q_rows; past < 0) {
            const int last_row_keys = seq_k + past;
            visited =
                last_row_keys <= 0 ? 0 : std::min(visited, blocks_covering(last_row_keys, B_c));
        }
        // ... and its first row keys below q_row0 + 1 + seq_k - seq_q: blocks entirely
        // under that bound are visible to every row of the CTA.
        if (const int past = q_row0 + 1 - seq_q; past < 0)
            unmasked = std::min(unmasked, std::max(0, seq_k + past) / B_c);
    }
    return {visited, std::min(unmasked, visited)};
}

// Keys row `row` sees (before the key-length mask): all seq_k, or with causal masking
// those below row + 1 + seq_k - seq_q, summed so that nothing passes 2^31.
__host__ __device__ constexpr int keys_seen(int row, int seq_q, int seq_k, bool causal) {
    return causal ? seq_k + std::min(0, row + 1 - seq_q) : seq_k;
}

// Sets to -inf the scores of keys a row must not see, on a warp's m16n8 accumulator
// tiles: rows first_row + [0, 16 * MT), keys first_key + [0, 8 * NT); row r sees keys
// [0, visible_keys(r)).
template <int MT, int NT, class VisibleKeys>
__device__ __forceinline__ void mask_scores_by(float (&s)[MT][NT][4], int first_row, int first_key,
                                               const VisibleKeys& visible_keys) {
    const int lane = threadIdx.x % warp_size;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = first_row + mt * mma_m + lane / 4 + 8 * h;
            const int keys = visible_keys(row);
            const int visible = keys - first_key - 2 * (lane % 4);  // of this lane's columns
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (nt * 8 + e >= visible)
                        s[mt][nt][2 * h + e] = -INFINITY;
                }
            }
        }
    }
}

// The dense problem's mask: query row `row` of seq_q sees keys_seen(row, ...) of seq_k.
template <int MT, int NT>
__device__ __forceinline__ void mask_scores(float (&s)[MT][NT][4], int first_row, int first_key,
                                            int seq_q, int seq_k, bool causal) {
    mask_scores_by(s, first_row, first_key,
                   [&](int row) { return keys_seen(row, seq_q, seq_k, causal); });
}

}  // namespace flash_attention
