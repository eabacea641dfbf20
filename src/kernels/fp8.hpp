#pragma once

// FP8 (e4m3) facts the kernels and the host share: P's offset and the lazy references' limit
// (the softmax's), and P·V's key order within each 32-key k-step of V's transposed copy.
//
// The key order:
// wgmma takes 8-bit operands K-major only, so V (keys by columns) is read transposed, and P,
// the A operand from registers, holds four consecutive k positions a register (row lane / 4
// (+ 8), positions 4 (lane % 4) + {0..3} and 16 + the same). S's fp32 accumulator, from which P
// is made, holds keys in pairs: 2 (lane % 4) + {0, 1} of each n8 tile. Packing a thread's
// accumulator registers in their own order, slot 4 t + i of a k-step's first half holds key
// 2 t + (i % 2) + 8 (i / 2), and the second half the same keys plus 16. V's transposed copy puts
// each key at its slot (fp8_key_of_slot), so that P needs no shuffle (FlashAttention-3 reorders
// V's bytes in the same spirit in its in-kernel transpose). constexpr: host code and device code
// (--expt-relaxed-constexpr) share it.

#if defined(__CUDACC__)
#include <cfloat>
#include <cmath>
#include <cstdint>
#endif

namespace flash_attention {

// Keys a k-step of an 8-bit wgmma.
inline constexpr int fp8_k_step_keys = 32;

// P's offset before its e4m3 rounding, 2^8 (FlashAttention-3's), as its log2: e4m3 keeps 3
// mantissa bits down to 2^-6, so a row's lesser probabilities keep their precision. The softmax
// takes it in its exponents (OnlineSoftmax's OffsetLog2): the row sums carry it too, so O
// divided by them needs no correction.
inline constexpr float fp8_p_offset_log2 = 8.0f;

// A lazy row reference's limit for FP8 (OnlineSoftmax's LazyLog2): probabilities up to 2^0.8
// against it, offset by 2^8, stay below e4m3's largest value, 448 (2^0.8 x 256 = 445.7);
// the 16-bit kernels' 2^8 would saturate P (wrong outputs, H100, 2026-12-06). The kept-reference
// steps (OnlineSoftmax::exponentiate_kept), whose probabilities may reach 2^12, are not taken.
inline constexpr float fp8_lazy_rescale_log2 = 0.8f;

// The key (0..31, within its k-step) at position `slot` (0..31) of V's transposed copy and of
// P's A fragment (a permutation of 0..31; fp8_slot_of_key is its inverse).
constexpr int fp8_key_of_slot(int slot) {
    const int half = slot / 16, pair = slot % 16 / 4, i = slot % 4;
    return 16 * half + 2 * pair + i % 2 + 8 * (i / 2);
}

// The inverse: the slot that holds `key`.
constexpr int fp8_slot_of_key(int key) {
    const int half = key / 16, pair = key % 8 / 2, i = key % 2 + 2 * (key % 16 / 8);
    return 16 * half + 4 * pair + i;
}

// The in-kernel transpose of V (sm90 transpose_v): a warp's unit is k-step g's 32 keys x 16 of
// V's columns (group cg). ldmatrix.trans reads four 8 x 8 matrices of 16-bit pairs of columns,
// lane l addressing the row of key fp8_vt_load_key(g, l) (matrix l / 8) at 16-byte chunk cg, and
// leaves lane l columns 2p, 2p+1 (p = l / 4) of keys 2q, 2q+1 (q = l % 4) of each matrix m, key
// 2q's pair in the low half. prmt with fp8_vt_even / fp8_vt_odd takes matrices m and m + 1's
// registers to the bytes of keys 2q, 2q+1, 2q+8, 2q+9 of column 2p / 2p + 1: slot word q of
// that column's 16-key half. stmatrix writes a half's two words as matrices 2h and 2h + 1, whose
// rows lanes 8i..8i+7 address: row fp8_vt_store_row(cg, l) of the transposed tile (V's column)
// at 16-byte chunk fp8_vt_store_chunk(g, l) of its slots. The first word is the even column
// below p = 4 and the odd one from there (fp8_vt_selector), so that a matrix's 8 rows are 8
// different rows mod 8, in 8 different bank groups under the swizzle (with even columns alone
// they would pair up: a 2-way conflict). A host test emulates the three instructions and checks
// the result against fp8_key_of_slot.
inline constexpr unsigned fp8_vt_even = 0x6420;  // bytes 0 and 2 of each register
inline constexpr unsigned fp8_vt_odd = 0x7531;   // bytes 1 and 3
constexpr unsigned fp8_vt_selector(int lane, bool second) {
    return (lane / 4 < 4) != second ? fp8_vt_even : fp8_vt_odd;
}
constexpr int fp8_vt_load_key(int g, int lane) {
    return fp8_k_step_keys * g + lane;
}
constexpr int fp8_vt_store_row(int cg, int lane) {
    return 16 * cg + 2 * (lane % 8) + (lane / 8 % 2 ^ lane % 8 / 4);
}
constexpr int fp8_vt_store_chunk(int g, int lane) {
    return 2 * g + lane / 16;
}

#if defined(__CUDACC__)
// FP8: Q's and K's descales of a (sequence, K/V head), `pair`, folded into a softmax scale (S
// itself is never scaled). A zero product (an all-zero input's descale) or one whose scaled
// factor would underflow takes the smallest normal factor instead: the scores it leaves are
// within 1e-30 of zero, as meant, and a masked score stays -inf where 0 x -inf would be NaN. A
// negative or NaN product gives NaN, which the output then shows.
// Args: the sm90 kernels' KernelArgs or the split-KV kernel's SplitKvArgs (q_descale, k_descale).
template <class Args>
__device__ __forceinline__ float fp8_descaled(float scale, const Args& args, std::int64_t pair) {
    const float qk = __ldg(args.q_descale + pair) * __ldg(args.k_descale + pair);
    return qk >= 0.0f ? fmaxf(scale * qk, FLT_MIN) : NAN;
}
#endif

}  // namespace flash_attention
