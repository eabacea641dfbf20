#pragma once

// Which keys a query row sees, per CTA and per score tile. One mask for every kernel:
// keys past seq_k (the last, partial K/V block) and, with causal masking, keys past
// row + seq_k - seq_q (aligned at the bottom right, as FlashAttention >= 2.1 does). The
// functions below take that seq_q as the diagonal's query length: aligned at the top left
// (query i sees keys j <= i, PyTorch's is_causal) it is seq_k (diagonal_queries).

#include <algorithm>
#include <cmath>

#include "kernels/blocks.hpp"
#include "kernels/kernel_args.hpp"
#include "kernels/masks.hpp"
#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/ptx.cuh"

namespace flash_attention {

struct KeyBlocks {
    int visited;   // K/V blocks this CTA computes; the rest are fully masked and skipped
    int unmasked;  // the first `unmasked` of them need no mask at all
};

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

// Sets to -inf the scores of keys a row must not see, on a warp's m16n8 accumulator
// tiles: rows first_row + [0, 16 * MT), keys first_key + [0, 8 * NT); row r sees keys
// [0, visible_keys(r)). A compare and a select a score: FlashAttention-4's form, a bit mask
// of the row's kept prefix read into predicates 7 at a time (R2P), took a fifth of the
// mask's instructions away and measured level on every sm90 kernel (H200,
// 2026-11-26, docs/PERF.md): the mask's ALU slots are not what a tile waits on.
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

// The blocks of B_c keys the rows [q_row0, q_row0 + q_rows) visit, [first, end), and those
// every one of them sees whole, [unmasked_first, unmasked_end) (empty when none): both ends
// of a window need the mask, so the unmasked blocks are a range, not a prefix. A row's lo
// and hi never decrease with the row, so the first row bounds the start and the last the
// end.
struct BandBlocks {
    int first, end;
    int unmasked_first, unmasked_end;
};

__host__ __device__ constexpr BandBlocks band_blocks(int shift, KeyBand band, int seq_k, int q_row0,
                                                     int q_rows, int B_c) {
    const KeySpan top = band_keys(q_row0, shift, band, seq_k);
    const KeySpan bottom = band_keys(q_row0 + q_rows - 1, shift, band, seq_k);
    if (bottom.hi <= top.lo)
        return {0, 0, 0, 0};  // no row sees a key
    BandBlocks b{};
    b.first = top.lo / B_c;
    b.end = blocks_covering(bottom.hi, B_c);
    b.unmasked_first = blocks_covering(bottom.lo, B_c);
    b.unmasked_end = std::max(b.unmasked_first, top.hi / B_c);
    return b;
}

// Sets to -inf the scores of keys outside each row's [lo, hi), on a warp's m16n8 accumulator
// tiles as mask_scores_by: spans[mt][h] is row mt * 16 + lane / 4 + 8 h's.
template <int MT, int NT>
__device__ __forceinline__ void mask_scores_spans(float (&s)[MT][NT][4],
                                                  const KeySpan (&spans)[MT][2], int first_key) {
    const int column0 = first_key + 2 * (threadIdx.x % warp_size % 4);  // this lane's first
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int lo = spans[mt][h].lo - column0;
            const int hi = spans[mt][h].hi - column0;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (nt * 8 + e < lo || nt * 8 + e >= hi)
                        s[mt][nt][2 * h + e] = -INFINITY;
                }
            }
        }
    }
}

// The same with each row's [lo, hi) from row_keys(row) (band_keys), rows first_row + [0, 16 MT).
template <int MT, int NT, class RowKeys>
__device__ __forceinline__ void mask_scores_band(float (&s)[MT][NT][4], int first_row,
                                                 int first_key, const RowKeys& row_keys) {
    const int lane = threadIdx.x % warp_size;
    KeySpan spans[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
            spans[mt][h] = row_keys(first_row + mt * mma_m + lane / 4 + 8 * h);
    }
    mask_scores_spans(s, spans, first_key);
}

// Logit softcap (KernelArgs::softcap_prescale): s = tanh(s * prescale), the softcap itself
// being the softmax's scale. tanh.approx's relative error (2^-11) is below the 16-bit
// rounding the naive computation's scores already carry.
template <int MT, int NT>
__device__ __forceinline__ void softcap_scores(float (&s)[MT][NT][4], float prescale) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[mt][nt][e] = ptx::tanh_approx(s[mt][nt][e] * prescale);
        }
    }
}

// ALiBi: score (row, column) gets -slope * |row position - column position|, its positions being
// a query's on the causal diagonal (row + band_shift) and a key's index, whichever way round the
// tile holds them. The slope is in the units of the scores it is added to: the given slope times
// log2(e) / scale_log2, since the softmax multiplies every score by scale_log2 and works in base 2
// (with a softcap that scale is the softcap's, so the bias joins after the tanh, as flash_attn's).
// A distance is exact in fp32 below 2^24 keys; past that the bias's relative error is 2^-24.
__device__ __forceinline__ float alibi_slope(const float* slopes, std::int64_t batch_stride,
                                             int sequence, int head, float scale_log2) {
    constexpr float log2e = 1.4426950408889634f;
    return slopes == nullptr
               ? 0.0f
               : __ldg(slopes + sequence * batch_stride + head) * (log2e / scale_log2);
}

// The bias of a warp's m16n8 accumulator tiles: rows at positions row_pos + [0, 16 MT), columns
// at col_pos + [0, 8 NT). One float offset a thread, then an addition and a multiply-add an
// element.
struct AlibiTile {
    float slope;
    float base;  // this lane's first row's position minus its first column's

    __device__ __forceinline__ AlibiTile(float slope_, int row_pos, int col_pos)
        : slope(slope_),
          base(static_cast<float>(row_pos + static_cast<int>(threadIdx.x % warp_size) / 4 -
                                  col_pos - 2 * static_cast<int>(threadIdx.x % 4))) {}
    // Element e of tile (mt, nt).
    __device__ __forceinline__ float operator()(int mt, int nt, int e) const {
        return -slope * fabsf(base + static_cast<float>(mt * mma_m + 8 * (e / 2) - nt * 8 - e % 2));
    }
};

template <int MT, int NT>
__device__ __forceinline__ void alibi_scores(float (&s)[MT][NT][4], const AlibiTile& bias) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[mt][nt][e] += bias(mt, nt, e);
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
