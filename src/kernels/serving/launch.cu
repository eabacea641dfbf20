#include "kernels/serving/launch.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <string>

#include "common/cuda_check.hpp"
#include "kernels/launch_support.cuh"
#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/masking.cuh"
#include "kernels/primitives/ptx.cuh"

namespace flash_attention::serving {

SplitPlan plan_splits(std::int64_t tiles_per_head, int key_blocks, int block_keys, bool paged,
                      int requested) {
    // Splitting pays when a (sequence, K/V head) has few query tiles: decoding, and
    // speculative decoding's few positions. Longer queries fill the GPU with their tiles,
    // and a split would only add its fp32 partials' traffic and the merge.
    constexpr std::int64_t most_tiles_split = 4;
    // A range holds at least 512 keys and a row at most 32 ranges: measured on the H100
    // (docs/PERF.md, decode b16 x 8192 and b1 x 131072, heads 32/8), 512-key ranges were
    // fastest at 8192 keys and 4096-key ones at 131072; shorter ranges spend more of each
    // CTA on its first load and its partial result, longer ones leave SMs idle. A paged
    // cache's blocks cost each CTA a table read and a gather, latency that twice the warps
    // hide: b1 x 131072 on 16-row pages 224 -> 196 µs at 64 ranges (contiguous 187 -> 189;
    // 64-row pages 200 -> 194; H100, 2026-11-24, docs/PERF.md).
    constexpr int fewest_keys = 512;
    const int most_ranges = paged ? 64 : 32;
    key_blocks = std::max(key_blocks, 1);
    int per_split = key_blocks;
    if (requested > 0) {
        per_split = blocks_covering(key_blocks, requested);
    } else if (tiles_per_head <= most_tiles_split) {
        per_split = std::max(blocks_covering(fewest_keys, block_keys),
                             blocks_covering(key_blocks, most_ranges));
    }
    return {blocks_covering(key_blocks, per_split), per_split};
}

SplitPlan plan_for(int d_head, DType dtype, std::int64_t rows_per_kv_head, std::int64_t max_seq_k,
                   bool paged, int requested) {
    // Both fit ints: the API checks rows (check_packed_rows) and lengths (k_max_seq).
    const int warps = split_kv_warps(rows_per_kv_head);
    const int block_keys = split_kv_block_keys(d_head, warps);
    SplitPlan plan = plan_splits(blocks_covering(static_cast<int>(rows_per_kv_head), warps * mma_m),
                                 blocks_covering(static_cast<int>(max_seq_k), block_keys),
                                 block_keys, paged, requested);
    const int key_warps =
        split_kv_key_warps(d_head, static_cast<int>(element_bytes(dtype)), warps, paged);
    plan.ranges_per_group = key_warps > 1 ? blocks_covering(plan.splits, key_warps) : 1;
    return plan;
}

void launch_attention(SplitKvArgs args, DType dtype, int d_head, std::int64_t max_seq_k,
                      int requested_splits, Stream stream) {
    switch (d_head) {
        case 64:
            return launch_d_head<64>(args, dtype, max_seq_k, requested_splits, stream);
        case 128:
            return launch_d_head<128>(args, dtype, max_seq_k, requested_splits, stream);
        case 256:
            return launch_d_head<256>(args, dtype, max_seq_k, requested_splits, stream);
        default:
            throw Error(ErrorCode::unsupported,
                        "d_head: expected 64, 128 or 256 (the split-KV kernel's), got " +
                            std::to_string(d_head));
    }
}

// KV append: one CTA per (new token, K/V head, sequence) copies that row of k_new and
// v_new into the cache, 16 bytes a thread (K's chunks, then V's).
__global__ void append_kernel(const __grid_constant__ AppendArgs args) {
    const int t = blockIdx.x;
    const int head = blockIdx.y;
    const int b = blockIdx.z;
    const int k_chunks = args.d_head * args.element_bytes / 16;  // 16-byte chunks of a K row
    const bool is_v = static_cast<int>(threadIdx.x) >= k_chunks;
    const int chunk = static_cast<int>(threadIdx.x) - (is_v ? k_chunks : 0);
    // Rows are 64-bit here: a corrupt length near 2^31 must not wrap into the cache.
    const std::int64_t row = std::int64_t{args.cache_seqlens[b]} + t;
    std::int64_t entry = b;
    std::int64_t entry_row = row;
    if (args.block_table != nullptr) {
        if (row < 0 || row >= std::int64_t{args.max_pages} * args.seq)
            return;
        const int page = args.block_table[b * args.block_table_stride + row / args.seq];
        if (page < 0 || page >= args.view_batch)
            return;  // a page outside the cache is never written
        entry = page;
        entry_row = row % args.seq;
    } else if (row < 0 || row >= args.seq) {
        return;  // past the cache's capacity: dropped
    }
    const TensorStrides& src_stride = is_v ? args.v_new_stride : args.k_new_stride;
    const TensorStrides& dst_stride = is_v ? args.v_stride : args.k_stride;
    const auto* src =
        static_cast<const unsigned char*>(is_v ? args.v_new : args.k_new) +
        (b * src_stride.batch + t * src_stride.seq + head * src_stride.head) * args.element_bytes;
    auto* dst = static_cast<unsigned char*>(is_v ? args.v_cache : args.k_cache) +
                (entry * dst_stride.batch + entry_row * dst_stride.seq + head * dst_stride.head) *
                    args.element_bytes;
    ptx::st_global_16(dst + chunk * 16, ptx::ld_global_16(src + chunk * 16));
}

void launch_append(const AppendArgs& args, int batch, int heads_kv, Stream stream) {
    launch_kernel<&append_kernel>(
        dim3(static_cast<unsigned>(args.seq_new), static_cast<unsigned>(heads_kv),
             static_cast<unsigned>(batch)),
        (args.d_head + args.d_v) * args.element_bytes / 16, 0, stream, args,
        "KV append kernel launch");
}

}  // namespace flash_attention::serving
