#pragma once

// Online softmax over the rows a warp owns, on m16n8 fp32 accumulator tiles. Each
// thread holds two rows per m16 tile (lane/4 and lane/4 + 8); the 4 lanes of a quad
// share a row, so row reductions are two xor-shuffles.

#include <cmath>

#include "kernels/primitives/ptx.cuh"

namespace flash_attention {

template <int MT, bool Optimized>
class OnlineSoftmax {
  public:
    // scale: softmax_scale; scale_log2: softmax_scale * log2(e).
    __device__ __forceinline__ OnlineSoftmax(float scale, float scale_log2)
        : scale_(scale), scale_log2_(scale_log2) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                max_[mt][h] = -INFINITY;
                sum_[mt][h] = 0.0f;
            }
        }
    }

    // Turns raw scores S into unnormalised probabilities in place, updates the row max
    // and sum, and rescales the output accumulator O by exp(old max - new max).
    template <int NT, int NTO>
    __device__ __forceinline__ void update(float (&s)[MT][NT][4], float (&o)[MT][NTO][4]) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if constexpr (!Optimized) {
                    // Textbook order: scale every score first (one FMUL each).
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        s[mt][nt][2 * h] *= scale_;
                        s[mt][nt][2 * h + 1] *= scale_;
                    }
                }
                float row_max = max_[mt][h];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    row_max = fmaxf(row_max, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
                }
                row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
                row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));

                float alpha;
                float row_sum = 0.0f;
                if constexpr (Optimized) {
                    // exp(scale * (s - m)) = 2^(s * scale_log2 - m * scale_log2): one FFMA
                    // and one MUFU.EX2 per score. The max stays in raw score units.
                    const float max_scaled = row_max * scale_log2_;
                    alpha = ptx::ex2(max_[mt][h] * scale_log2_ - max_scaled);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; ++e) {
                            s[mt][nt][e] = ptx::ex2(fmaf(s[mt][nt][e], scale_log2_, -max_scaled));
                            row_sum += s[mt][nt][e];
                        }
                    }
                    // The quad's partial sums are only combined once, in finalize().
                    sum_[mt][h] = sum_[mt][h] * alpha + row_sum;
                } else {
                    alpha = __expf(max_[mt][h] - row_max);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; ++e) {
                            s[mt][nt][e] = __expf(s[mt][nt][e] - row_max);
                            row_sum += s[mt][nt][e];
                        }
                    }
                    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
                    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
                    sum_[mt][h] = sum_[mt][h] * alpha + row_sum;
                }
                max_[mt][h] = row_max;
#pragma unroll
                for (int nt = 0; nt < NTO; ++nt) {
                    o[mt][nt][2 * h] *= alpha;
                    o[mt][nt][2 * h + 1] *= alpha;
                }
            }
        }
    }

    // O /= row sum.
    template <int NTO>
    __device__ __forceinline__ void finalize(float (&o)[MT][NTO][4]) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float row_sum = sum_[mt][h];
                if constexpr (Optimized) {
                    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
                    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
                }
                // Approximate reciprocal: an output rounded to 16 bits does not need
                // IEEE division and its slow path.
                const float inv = __fdividef(1.0f, row_sum);
#pragma unroll
                for (int nt = 0; nt < NTO; ++nt) {
                    o[mt][nt][2 * h] *= inv;
                    o[mt][nt][2 * h + 1] *= inv;
                }
            }
        }
    }

  private:
    float scale_;
    float scale_log2_;
    float max_[MT][2];
    float sum_[MT][2];
};

}  // namespace flash_attention
