#pragma once

// Online softmax over the rows a warp owns, on m16n8 fp32 accumulator tiles. Each
// thread holds two rows per m16 tile (lane/4 and lane/4 + 8); the 4 lanes of a quad
// share a row, so row reductions are two xor-shuffles.

#include <cmath>
#include <cstdint>

#include "flash_attention/kernel_config.hpp"
#include "kernels/primitives/ptx.cuh"

namespace flash_attention {

// 2^x for x <= 0 (or -inf) without the MUFU: x = n + f with n an integer and f in
// [-0.5, 0.5], 2^f by a cubic (minimax for relative error: 7.5e-5 in fp32, below half an
// fp16 ulp, 4.9e-4), and n added to the exponent field. Eight instructions on the FMA and
// integer pipes, where MUFU.EX2 is one issue but a quarter-rate pipe (16 results per clock
// per SM on Hopper). -inf (a masked score) gives 2^-126 instead of 0: a row's sum then
// carries at most a few 1e-38 of masked keys, and a row that saw no key at all is told apart
// by its max (finalize()).
__device__ __forceinline__ float exp2_polynomial(float x) {
    x = fmaxf(x, -126.0f);
    // Adding 1.5 * 2^23 rounds x to an integer, n, which lands in the sum's low mantissa
    // bits (two's complement); shifting those bits by 23 puts n in the exponent field and
    // pushes the rest out.
    constexpr float shifter = 12582912.0f;
    const float t = x + shifter;
    const float f = x - (t - shifter);
    const float p = fmaf(fmaf(fmaf(0.05517145f, f, 0.24261062f), f, 0.69326097f), f, 0.99992812f);
    return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

// Emulated: eighths of a row's exponentials (those of m16n8 tiles nt with nt % 8 below it)
// computed by exp2_polynomial() instead of the MUFU (optimized variant only).
template <int MT, bool Optimized, int Emulated = 0>
class OnlineSoftmax {
    static_assert(Emulated == 0 || Optimized, "the textbook variant keeps __expf");
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
        exponentiate(s);
        rescale(o);
    }

    // update()'s first half, for kernels whose O is still being written by an in-flight
    // GEMM: S becomes probabilities, the max and sum move on, and the factor O must be
    // rescaled by is kept for rescale().
    template <int NT>
    __device__ __forceinline__ void exponentiate(float (&s)[MT][NT][4]) {
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
                const float row_max = new_row_max(s, mt, h);
                float alpha;
                float row_sum = 0.0f;
                if constexpr (Optimized) {
                    const float max_scaled = scaled_max(row_max);
                    alpha = ptx::ex2(max_[mt][h] * scale_log2_ - max_scaled);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; ++e) {
                            s[mt][nt][e] = probability(s[mt][nt][e], max_scaled, nt % 8 < Emulated);
                            row_sum += s[mt][nt][e];
                        }
                    }
                    // The quad's partial sums are only combined once, in finalize().
                    sum_[mt][h] = sum_[mt][h] * alpha + row_sum;
                } else {
                    const float reference = row_max == -INFINITY ? 0.0f : row_max;
                    alpha = __expf(max_[mt][h] - reference);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; ++e) {
                            s[mt][nt][e] = __expf(s[mt][nt][e] - reference);
                            row_sum += s[mt][nt][e];
                        }
                    }
                    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
                    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
                    sum_[mt][h] = sum_[mt][h] * alpha + row_sum;
                }
                max_[mt][h] = row_max;
                alpha_[mt][h] = alpha;
            }
        }
    }

    // O *= exp(old max - new max) of the last exponentiate().
    template <int NTO>
    __device__ __forceinline__ void rescale(float (&o)[MT][NTO][4]) const {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int nt = 0; nt < NTO; ++nt) {
                    o[mt][nt][2 * h] *= alpha_[mt][h];
                    o[mt][nt][2 * h + 1] *= alpha_[mt][h];
                }
            }
        }
    }

    // O /= row sum. A row that saw no key keeps O = 0.
    template <int NTO>
    __device__ __forceinline__ void finalize(float (&o)[MT][NTO][4]) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if constexpr (Optimized) {
                    sum_[mt][h] += __shfl_xor_sync(0xffffffffu, sum_[mt][h], 1);
                    sum_[mt][h] += __shfl_xor_sync(0xffffffffu, sum_[mt][h], 2);
                }
                // Approximate reciprocal: an output rounded to 16 bits does not need
                // IEEE division and its slow path.
                // With emulated exponentials a row that saw no key has a sum of a few
                // 2^-126 (exp2_polynomial()); its max, still -inf, says so.
                const bool saw_keys =
                    sum_[mt][h] > 0.0f && (Emulated == 0 || max_[mt][h] != -INFINITY);
                const float inv = saw_keys ? __fdividef(1.0f, sum_[mt][h]) : 0.0f;
#pragma unroll
                for (int nt = 0; nt < NTO; ++nt) {
                    o[mt][nt][2 * h] *= inv;
                    o[mt][nt][2 * h + 1] *= inv;
                }
            }
        }
    }

    // After finalize(): ln of the sum of exp(scale * score) over the row's visible keys,
    // -inf for a row that saw none.
    __device__ __forceinline__ float log_sum_exp(int mt, int h) const {
        if (!(sum_[mt][h] > 0.0f) || max_[mt][h] == -INFINITY)
            return -INFINITY;
        // The optimized variant keeps the max in raw score units, the textbook one scaled.
        const float max_term = Optimized ? max_[mt][h] * scale_ : max_[mt][h];
        return max_term + __logf(sum_[mt][h]);
    }

  private:
    // The running max of row (mt, h) with S's scores for it, across the quad.
    template <int NT>
    __device__ __forceinline__ float new_row_max(const float (&s)[MT][NT][4], int mt, int h) const {
        float row_max = max_[mt][h];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            row_max = fmaxf(row_max, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
        return row_max;
    }

    // The optimized variant's exponent offset: exp(scale * (s - m)) = 2^(s * scale_log2 -
    // m * scale_log2), one FFMA and one MUFU.EX2 per score with the max in raw score
    // units. A row that has seen only masked keys has max -inf; subtracting 0 instead
    // keeps exp2(-inf - ...) = 0 rather than NaN.
    __device__ __forceinline__ float scaled_max(float row_max) const {
        return row_max == -INFINITY ? 0.0f : row_max * scale_log2_;
    }
    // polynomial: a constant once the caller's loop is unrolled.
    __device__ __forceinline__ float probability(float score, float max_scaled,
                                                 bool polynomial) const {
        const float x = fmaf(score, scale_log2_, -max_scaled);
        return polynomial ? exp2_polynomial(x) : ptx::ex2(x);
    }

    float scale_;
    float scale_log2_;
    float max_[MT][2];
    float sum_[MT][2];
    float alpha_[MT][2];
};

}  // namespace flash_attention
