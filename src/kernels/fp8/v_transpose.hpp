#pragma once

// FP8 (e4m3) prefill's first step (design.md section 12, "FP8 (e4m3) forward: the plan"): a
// pass over V before the attention kernel writes V's K-major copy into the workspace, so that
// the kernel TMA-loads P·V's B operand as wgmma's 8-bit operands need it, with no transpose of
// its own.

#include <cstddef>
#include <cstdint>

#include "flash_attention/flash_attention.hpp"
#include "kernels/fp8.hpp"

namespace flash_attention::fp8 {

// seq_k rounded up to whole k-steps: the keys of each row of V's transposed copy.
constexpr std::int64_t padded_keys(std::int64_t seq_k) {
    return (seq_k + fp8_k_step_keys - 1) / fp8_k_step_keys * fp8_k_step_keys;
}

// The bytes of V's transposed copy: (batch, heads_kv, d_v, padded_keys(seq_k)), contiguous.
constexpr std::size_t transposed_v_bytes(const TensorView& v) {
    return static_cast<std::size_t>(v.shape[0] * v.shape[2] * v.shape[3] * padded_keys(v.shape[1]));
}

// Writes V's transposed copy to `out` (transposed_v_bytes(v) bytes, 16-byte aligned) on
// `stream`: out[b][h][c][32 g + slot] = V[b][32 g + fp8_key_of_slot(slot)][h][c] for keys below
// seq_k, and 0x00 (e4m3 zero) for the padding keys, which P·V multiplies by P = 0 and which so
// must not be NaN. v is an E4M3 view (batch, seq_k, heads_kv, d_v) of unit d_v stride and d_v a
// multiple of 16; its other strides are free (16-byte multiples take the vector path). Throws
// Error: invalid_argument or dtype for a view it does not take, cuda if the launch fails.
void transpose_v(const TensorView& v, void* out, Stream stream);

}  // namespace flash_attention::fp8
