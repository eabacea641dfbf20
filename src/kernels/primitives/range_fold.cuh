#pragma once

// Results of one row over disjoint ranges of its keys, merged: split-KV decoding's partial
// results (serving/split_kv_kernel.cuh) and the sm90 stream-K pieces of a tile
// (sm90/epilogue.cuh).

#include <cmath>

#include "kernels/primitives/ptx.cuh"

namespace flash_attention {

// The merge of one row's range results (O_s normalised, LSE_s), left to right in range
// order: the one order for every launch shape, so a row's bits depend neither on how its
// ranges were spread over CTAs nor on how many rows the combine had (both follow the
// batch). The state: the largest LSE so far, sum = Σ exp(LSE_s - max), and the caller's
// accumulators Σ exp(LSE_s - max) · O_s. A left fold, so a CTA that streams a row's first
// ranges folds them itself and hands the state on (split_kv_kernel), and combine_kernel
// continues from it. With ranges_per_group > 1 each group of ranges is folded from scratch
// and the groups' states are folded in order (add(max, sum) with their accumulators).
// Every operation is explicitly rounded: an FMA contraction the compiler chose differently
// in the two kernels would change the bits.
struct RangeFold {
    struct Weights {
        float keep;  // of the accumulators so far
        float add;   // of the new range's O, or the new group's accumulators
    };
    float max = -INFINITY;
    float sum = 0.0f;

    // A range (its LSE; sum 1: O is normalised) or a group's state (max, sum).
    __device__ __forceinline__ Weights add(float other_max, float other_sum = 1.0f) {
        constexpr float log2e = 1.4426950408889634f;
        const float next = fmaxf(max, other_max);
        // No key yet anywhere: weights 0 rather than exp(-inf - -inf) = NaN.
        const float reference = next == -INFINITY ? 0.0f : next;
        const Weights w{ptx::ex2(__fmul_rn(__fsub_rn(max, reference), log2e)),
                        ptx::ex2(__fmul_rn(__fsub_rn(other_max, reference), log2e))};
        // other_sum 1: x 1 is exact, so a range adds as it did before groups existed.
        sum = __fmaf_rn(sum, w.keep, __fmul_rn(other_sum, w.add));
        max = next;
        return w;
    }
    __device__ __forceinline__ static float merge(float acc, float o, const Weights& w) {
        return __fmaf_rn(acc, w.keep, __fmul_rn(o, w.add));
    }
    // An attention sink joins as a last range of LSE `sink` whose O is zero: returns the
    // factor the accumulators take (-inf: no sink, 1).
    __device__ __forceinline__ float add_sink(float sink) {
        return sink == -INFINITY ? 1.0f : add(sink).keep;
    }
    // The final O = accumulators x normaliser(); a row that saw no key: O = 0, LSE -inf.
    __device__ __forceinline__ float normaliser() const {
        return sum > 0.0f ? __frcp_rn(sum) : 0.0f;
    }
    __device__ __forceinline__ float log_sum_exp() const {
        return sum > 0.0f ? __fadd_rn(max, __logf(sum)) : -INFINITY;
    }
};

}  // namespace flash_attention
