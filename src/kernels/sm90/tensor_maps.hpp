#pragma once

// TMA tensor maps of Q, K, V and O, built on the host for each launch and passed to the
// kernel as __grid_constant__ parameters. Each views its tensor as 4-D (d_head, seq,
// heads, batch) with the caller's strides, so partial tiles, GQA head sharing and
// strided layouts need no special cases in the kernel: TMA zero-fills reads past seq
// and drops writes past it. A paged cache's K and V are 5-D views of their own
// (encode_paged in tensor_maps.cpp).

#include <cuda.h>

#include <cstdint>
#include <limits>
#include <string>

#include "flash_attention/kernel_config.hpp"
#include "kernels/kernel_args.hpp"

namespace flash_attention::sm90 {

// cuTensorMapEncodeTiled takes global strides below 2^40 bytes and sizes below 2^32
// (CUDA driver API, tensor map object management): tensors beyond either run on the
// sm80 family.
inline constexpr std::uint64_t k_tma_max_stride_bytes = std::uint64_t{1} << 40;

struct TensorMaps {
    CUtensorMap q, k, v, o;
};

// The backward pass's inputs, Q and dO in boxes of a query block's rows, K and V of a key
// block's; and its outputs dK and dV, stored in boxes of a key block's rows
// (sm90/backward_kernel.cuh).
struct BackwardTensorMaps {
    CUtensorMap q, k, v, d_o, dk, dv;
};

// Stream-K (Traits::stream_k, tile_scheduler.cuh): how the launch splits its last round of
// tiles, set by the launcher; partials null when it splits none.
struct StreamKSplit {
    // A slot per CTA and consumer: its partial O (normalised, fp32, in the fragments' order),
    // after every slot's O the rows' LSE (epilogue.cuh, PartialSlot).
    float* partials;
    int* flags;  // per slot: its partial is stored (zero at the launch, and left zero)
    int whole;   // tiles in whole rounds of the grid: below, the static stride's
    int units;   // key blocks of the tiles from `whole` on, dealt out to the CTAs in order
};

// Stream-K's split of a launch of `ctas` persistent CTAs over `tiles` dense tiles of `blocks`
// key blocks each (launch.cuh), or none (units 0). It splits only a last round that leaves at
// least a third of the CTAs idle: the idle time it recovers must outweigh a second piece's
// start (Q, the pipeline's ramp) and the partials' stores and merges, and under the power cap
// the CTAs that do run a part-filled round run faster. Measured (bf16, H200,
// 2026-11-28, docs/PERF.md), last rounds 1/3 full: d_head 64 +1.6% at 4k keys; 0.42:
// d_head 128 +1.4-1.7% at 8k-16k; 2/3: d_head 128 level to +1.9% at 2k-4k; 0.76: d_head 256
// -1.2% at 8k, +0.8% at 16k; 0.85: d_head 64 level. Also none when a CTA's range would be
// empty (fewer key blocks than CTAs) or c x units would overflow the kernel's ints.
struct StreamKPlan {
    int whole, units;
};
inline StreamKPlan stream_k_plan(std::int64_t tiles, std::int64_t ctas, int blocks) {
    const std::int64_t whole = tiles / ctas * ctas;
    const std::int64_t tail = tiles - whole;
    const std::int64_t units = tail * blocks;
    if (3 * tail > 2 * ctas || units < ctas || units * ctas > std::numeric_limits<int>::max())
        return {static_cast<int>(tiles), 0};
    return {static_cast<int>(whole), static_cast<int>(units)};
}

// A partial-result slot's floats: a consumer's O (64 rows x d_v), then its 128 threads'
// LSE, two rows each.
constexpr int partial_o_floats(int d_v) {
    return 64 * d_v;
}
inline constexpr int partial_lse_floats = 2 * 128;

struct Params {
    KernelArgs args;
    TensorMaps maps;
    int* tile_counter;  // the dynamic schedule's two (TileScheduler), else null
    StreamKSplit split;
};

// Boxes: one row of the tiles' swizzle (tile_swizzle_bytes(): 64 columns, 128
// bytes; at d_head 96, 32 columns of the 64-byte swizzle) x 64 rows for Q and O,
// x kv_rows for K and V; a paged cache's K and V (args.seqs.block_table set): runs of
// kv_rows rows, all columns in one box (group-major tiles). Q and K have d_head columns, V
// and O d_v. packed (pack_gqa): Q's and O's 64 rows are 64 / group positions of a group's
// query heads (tma::load_packed_tile), group = heads / heads_kv, a divisor of 64. Throws
// Error(ErrorCode::cuda) if the driver rejects a map.
TensorMaps make_tensor_maps(const KernelArgs& args, DType dtype, int d_head, int d_v, int kv_rows,
                            bool packed = false);

// FP8 (Traits::fp8): Q and K (e4m3, (d_head, seq, heads, batch)) and V's transposed copy `vt`
// (fp8/v_transpose.hpp: (seq_pad keys, d_v, heads_kv, batch), contiguous) as `v`, or with vt
// null V itself as K is (the kernels' transpose_v), each viewed as 16-bit elements, pairs of
// e4m3 values (TMA moves bytes): boxes of 64 such columns (128 bytes, the 128-byte swizzle's
// row) x 64 rows for Q, x kv_rows for K (and V itself), x d_v for the copy; no
// map of O, which the FP8 kernels store from registers. Throws Error(ErrorCode::invalid_argument)
// for strides in bytes that are not multiples of 16, Error(ErrorCode::cuda) if the driver
// rejects a map.
TensorMaps make_fp8_tensor_maps(const KernelArgs& args, int d_head, int kv_rows, const void* vt,
                                std::int64_t seq_pad);

// Boxes of one row of the tiles' swizzle (as make_tensor_maps's) x q_rows rows for Q and dO,
// x kv_rows for K, V, dK and dV; V, dO and dV of d_v columns.
BackwardTensorMaps make_backward_tensor_maps(const BackwardArgs& args, DType dtype, int d_head,
                                             int d_v, int q_rows, int kv_rows);

// Why the paged maps cannot address a cache (k or v: pages, page_size, heads, d_head) named
// `name` whose heads are head_stride elements apart: heads that are not d_head apart, or a
// d_head that is not whole 32-column sub-tiles. Empty if they can.
std::string paged_maps_problem(const char* name, std::int64_t heads, std::int64_t d_head,
                               std::int64_t head_stride);

}  // namespace flash_attention::sm90
