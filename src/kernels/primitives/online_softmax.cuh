#pragma once

// Online softmax over the rows a warp owns, on m16n8 fp32 accumulator tiles. Each
// thread holds two rows per m16 tile (lane/4 and lane/4 + 8); the 4 lanes of a quad
// share a row, so row reductions are two xor-shuffles.

#include <cmath>

#include "kernels/primitives/ptx.cuh"

namespace flash_attention {

// OnlineSoftmax::finalize()'s default: no attention sink.
struct NoSink {
    __device__ __forceinline__ constexpr float operator()(int, int) const { return -INFINITY; }
};

// The reference a row's probabilities are taken against (optimized variant only for the
// last two): its running max; `lazy`, a max that moves only when the row gains 2^8 on it, so
// most blocks skip O's rescaling (exponentiate_optimized()); or `fixed`, one value for the
// whole row, for scores known to lie in a bounded range (a softcap's), so that no block
// needs a row max or rescales O (exponentiate_fixed()).
enum class RowReference { max, lazy, fixed };

// LazyLog2: how far (log2 units) a lazy row's max may rise above its reference before the
// reference moves, so the probabilities stay below 2^LazyLog2 (FP8's P, offset before its e4m3
// rounding, takes a smaller limit: fp8_lazy_rescale_log2). OffsetLog2 (optimized variant): the
// probabilities come out 2^OffsetLog2 times larger, the offset taken in the FFMA each
// exponential has anyway instead of an FMUL a value (FP8's P: 2^8, fp8_p_offset_log2), and so
// do the sums: O divided by them is unchanged, and the LSE takes the offset off.
template <int MT, bool Optimized, RowReference Reference = RowReference::max, float LazyLog2 = 8.0f,
          float OffsetLog2 = 0.0f>
class OnlineSoftmax {
    static constexpr bool Lazy = Reference == RowReference::lazy;
    static constexpr bool Fixed = Reference == RowReference::fixed;
    static_assert(Optimized || Reference == RowReference::max,
                  "lazy and fixed references are forms of the optimized variant");

  public:
    static constexpr bool lazy = Lazy;

    // scale: softmax_scale; scale_log2: softmax_scale * log2(e). A fixed reference is given
    // in raw score units (the caller guarantees no probability leaves fp32's and P's normal
    // range against it); the others start at -inf.
    __device__ __forceinline__ OnlineSoftmax(float scale, float scale_log2,
                                             float fixed_reference = -INFINITY)
        : scale_(scale), scale_log2_(scale_log2) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                max_[mt][h] = Fixed ? fixed_reference : -INFINITY;
                sum_[mt][h] = 0.0f;
                rounded_sum_[mt][h] = 0.0f;
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
        if constexpr (Fixed)
            exponentiate_fixed(s);
        else if constexpr (Optimized)
            exponentiate_optimized(s);
        else
            exponentiate_textbook(s);
    }

    // Lazy, on a row's later blocks: the probabilities against the references the rows hold,
    // without taking the row max first (an FMNMX a score, and a dependent chain of them and
    // two shuffles a row before the first exponential). Valid where no probability outgrew
    // its reference by more than k_kept_sum_limit: each thread checks its partial sums of
    // the block, which bound every probability it added and fail for inf and NaN (and for a
    // row that has no reference yet), and agree(kept) makes the answer its warpgroup's.
    // Returns false having changed nothing but S: the caller computes S again and calls
    // exponentiate_to_max().
    template <int NT, class Agree>
    __device__ __forceinline__ bool exponentiate_kept(float (&s)[MT][NT][4], const Agree& agree) {
        static_assert(Lazy, "only a lazy reference can be kept without a row max");
        float block_sum[MT][2];
        bool kept = true;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // -inf before a row's first key: the sums become inf or NaN, not kept.
                block_sum[mt][h] = exponentiate_row(s, mt, h, offset(max_[mt][h]));
                kept = kept && block_sum[mt][h] <= k_kept_sum_limit;
            }
        }
        if (!agree(kept))
            return false;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                sum_[mt][h] += block_sum[mt][h];
                alpha_[mt][h] = 1.0f;
            }
        }
        rescaled_ = false;
        return true;
    }

    // Lazy, after exponentiate_kept() failed: against each row's max, every reference moving
    // to it (a reference kept within 2^8 would let the next blocks fail the same check).
    template <int NT>
    __device__ __forceinline__ void exponentiate_to_max(float (&s)[MT][NT][4]) {
        exponentiate_optimized<true>(s);
    }

    // O *= exp(old max - new max) of the last exponentiate(); nothing to do when the
    // lazy variant kept every reference max of the warp (a warp-uniform branch), or ever
    // with a fixed reference.
    template <int NTO>
    __device__ __forceinline__ void rescale(float (&o)[MT][NTO][4]) const {
        if constexpr (!Fixed) {
            if (Lazy && !rescaled_)
                return;
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
    }

    // After P = S rounded to 16 bits (accumulators_to_a_fragments()): with a fixed reference,
    // adds P as rounded, which is what O accumulates, to the sums O is divided by; nothing
    // otherwise. Against a row max the row's largest probability is exactly 1 in 16 bits,
    // so a row dominated by a few keys gets their values back to fp32's precision; against
    // a fixed reference it is 2^x for any x, and dividing the rounded sum of P·V by the
    // unrounded sum would miss by P's rounding (up to 2^-8 in bf16): a row that sees one
    // key returned V off by a unit in the last place (GPU tests, docs/PERF.md, 2026-11-25).
    // The unrounded sum stays for the LSE, whose bound the rounded one would break on such
    // rows. Two more instructions a probability: 4.7-5.8% of a softcap kernel's time, its
    // loop being bound by issue slots (H200, docs/PERF.md, 2026-11-25).
    template <DType dtype, int KT>
    __device__ __forceinline__ void add_rounded(const std::uint32_t (&p)[MT][KT][4]) {
        if constexpr (Fixed) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) {  // A fragment registers: row h = r % 2
                        const float2 pair = ptx::unpack<dtype>(p[mt][kt][r]);
                        rounded_sum_[mt][r % 2] += pair.x + pair.y;
                    }
                }
            }
        }
    }

    // O /= row sum. A row that saw no key keeps O = 0. sink_log2(mt, h): the row's attention
    // sink (KernelArgs::sinks) times log2(e), joining its denominator, or -inf for none (the
    // default, which compiles to nothing).
    template <int NTO, class SinkLog2 = NoSink>
    __device__ __forceinline__ void finalize(float (&o)[MT][NTO][4],
                                             const SinkLog2& sink_log2 = {}) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if constexpr (Optimized) {
                    sum_[mt][h] += __shfl_xor_sync(0xffffffffu, sum_[mt][h], 1);
                    sum_[mt][h] += __shfl_xor_sync(0xffffffffu, sum_[mt][h], 2);
                }
                if constexpr (Fixed) {
                    rounded_sum_[mt][h] += __shfl_xor_sync(0xffffffffu, rounded_sum_[mt][h], 1);
                    rounded_sum_[mt][h] += __shfl_xor_sync(0xffffffffu, rounded_sum_[mt][h], 2);
                }
                const float keep = add_sink(mt, h, sink_log2(mt, h));
                const float divisor = Fixed ? rounded_sum_[mt][h] : sum_[mt][h];
                // Approximate reciprocal: an output rounded to 16 bits does not need
                // IEEE division and its slow path.
                const float inv = divisor > 0.0f ? __fdividef(keep, divisor) : 0.0f;
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
        if (!(sum_[mt][h] > 0.0f))
            return -INFINITY;
        // The optimized variant keeps the max in raw score units, the textbook one scaled.
        // offset(max) * ln 2, the sum's own reference, is no more exact: it trades the offset's
        // rounding for scale_log2's, both ~1e-4 at scale 100 (docs/PERF.md, 2026-11-28).
        const float max_term = Optimized ? max_[mt][h] * scale_ : max_[mt][h];
        constexpr float ln2 = 0.6931471805599453f;
        return max_term + __logf(sum_[mt][h]) - OffsetLog2 * ln2;
    }

  private:
    // Adds 2^sink to row (mt, h)'s sum (after the quad's sums are combined), rebasing the
    // row's reference to the larger of it and the sink so that neither term overflows even
    // for a sink far above the scores; returns the factor O's accumulators, which are
    // relative to the old reference, take (1 without a sink). The reference kept is what
    // log_sum_exp() reads: the LSE includes the sink, and a row that saw no key gets O = 0
    // and LSE = the sink.
    __device__ __forceinline__ float add_sink(int mt, int h, float sink) {
        if (sink == -INFINITY)
            return 1.0f;
        constexpr float log2e = 1.4426950408889634f;
        // In base 2: the optimized variant keeps the reference in raw scores, the textbook one
        // in scaled ones.
        const float unit = Optimized ? scale_log2_ : log2e;
        const float reference = max_[mt][h] == -INFINITY ? -INFINITY
                                : Optimized              ? offset(max_[mt][h])
                                                         : max_[mt][h] * log2e;
        const float top = fmaxf(reference, sink);
        const float keep = ptx::ex2(reference - top);  // 0 for a row without keys
        const float added = ptx::ex2(sink - (top - OffsetLog2));
        sum_[mt][h] = sum_[mt][h] * keep + added;
        if constexpr (Fixed)
            rounded_sum_[mt][h] = rounded_sum_[mt][h] * keep + added;
        max_[mt][h] = __fdividef(top, unit);
        return keep;
    }

    // Probabilities 2^(s * scale_log2 - m * scale_log2) against a reference max m in raw
    // score units: one FFMA and one MUFU.EX2 per score. The reference is the row's max, or
    // with Lazy any value close enough below it that no probability overflows (the softmax
    // does not depend on it): a row's reference then moves only when the row gains more
    // than 2^LazyLog2 (2^8: FlashAttention-4's lazy rescaling), so the probabilities stay below
    // 256, far inside fp16 and bf16, and a warp whose rows all kept theirs skips O's
    // rescaling (d_head / 2 FMULs a thread), as most blocks after a row's first do. Measured
    // (docs/PERF.md): +2-9% at d_head 256, +1-4% at 64, -2 to -4% at 128 non-causal, hence
    // a knob. A row that has seen only masked keys has max -inf; subtracting 0 instead keeps
    // exp2(-inf - ...) = 0 rather than NaN. The quad's partial sums are only combined once,
    // in finalize(). Accuracy: with the reference below the max, a row's largest
    // probability is no longer exactly 1 when P is rounded to 16 bits, so at a sharp softmax
    // the error is up to 2-3x a fused non-lazy kernel's, still a small fraction of a naive
    // same-dtype computation's (H100, 2026-11-24, docs/PERF.md).
    template <bool Move = false, int NT>
    __device__ __forceinline__ void exponentiate_optimized(float (&s)[MT][NT][4]) {
        bool moved = false;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float row_max = new_row_max(s, mt, h);
                // Each row decides for itself, so its exponentials need not wait for the
                // warp. NaN (both -inf: no key yet) counts as moving, and so does the
                // first key.
                const bool moves =
                    !Lazy || Move || !((row_max - max_[mt][h]) * scale_log2_ <= LazyLog2);
                moved |= moves;
                const float reference = moves ? row_max : max_[mt][h];
                const float max_scaled = offset(reference == -INFINITY ? 0.0f : reference);
                const float alpha = ptx::ex2(offset(max_[mt][h]) - max_scaled);
                const float row_sum = exponentiate_row(s, mt, h, max_scaled);
                sum_[mt][h] = sum_[mt][h] * alpha + row_sum;
                max_[mt][h] = reference;
                alpha_[mt][h] = alpha;  // exactly 1 for a row that kept its reference
            }
        }
        // Read only by rescale(), after the exponentials: the vote's latency is off their
        // path, and rows of the warp that kept their reference multiply by 1.
        if constexpr (Lazy)
            rescaled_ = __any_sync(0xffffffffu, moved);
    }

    // Against the fixed reference m (raw score units): 2^(s * scale_log2 - m * scale_log2),
    // one FFMA and one MUFU.EX2 per score as above, but no row max (an FMNMX a score and two
    // shuffles a row), no correction factor and no rescaling of O. Masked scores (-inf) give
    // 0; a row that saw no key keeps a sum of 0, which finalize() and log_sum_exp() read.
    template <int NT>
    __device__ __forceinline__ void exponentiate_fixed(float (&s)[MT][NT][4]) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                sum_[mt][h] += exponentiate_row(s, mt, h, offset(max_[mt][h]));
            }
        }
    }

    // Textbook order: scale every score first (one FMUL each), exponentiate against the
    // row's max, add the row's sum across the quad.
    template <int NT>
    __device__ __forceinline__ void exponentiate_textbook(float (&s)[MT][NT][4]) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    s[mt][nt][2 * h] *= scale_;
                    s[mt][nt][2 * h + 1] *= scale_;
                }
                const float row_max = new_row_max(s, mt, h);
                const float reference = row_max == -INFINITY ? 0.0f : row_max;
                const float alpha = __expf(max_[mt][h] - reference);
                float row_sum = 0.0f;
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
                max_[mt][h] = row_max;
                alpha_[mt][h] = alpha;
            }
        }
    }

    // The exponent offset of reference m (raw score units), m * scale_log2 rounded once and
    // explicitly: every exponent taken against m and the factor between two references read
    // this one value, so a row's sum is relative to exactly 2^offset(m). Left to the
    // compiler, `m * scale_log2 - offset` was fused into one FFMA in some copies of the loop
    // and not in others; each fused reference move then put up to half a unit in the last
    // place of m * scale_log2 (2.4e-4 at scale 100) into the row's sum, and the LSE at scale
    // 100 came out 2-3x less exact (H200, 2026-11-28, docs/PERF.md).
    __device__ __forceinline__ float offset(float m) const {
        return __fmul_rn(m, scale_log2_);
    }

    // Row (mt, h)'s scores in place as 2^(s * scale_log2 - offset): one FFMA and one MUFU.EX2
    // a score. Returns this thread's sum of them.
    template <int NT>
    __device__ __forceinline__ float exponentiate_row(float (&s)[MT][NT][4], int mt, int h,
                                                      float offset) const {
        float row_sum = 0.0f;
        const float shift = offset - OffsetLog2;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; ++e) {
                s[mt][nt][e] = ptx::ex2(fmaf(s[mt][nt][e], scale_log2_, -shift));
                row_sum += s[mt][nt][e];
            }
        }
        return row_sum;
    }

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

    // The most a thread's probabilities of one row and block may add up to against a kept
    // reference (exponentiate_kept()): each then stays below 2^12, inside fp16 as P.
    static constexpr float k_kept_sum_limit = 4096.0f;

    float scale_;
    float scale_log2_;
    float max_[MT][2];
    float sum_[MT][2];
    float rounded_sum_[MT][2];  // fixed reference only: add_rounded()
    float alpha_[MT][2];
    bool rescaled_ = true;  // whether the last exponentiate() moved the reference
};

}  // namespace flash_attention
