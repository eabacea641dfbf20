#pragma once

// Host side of the serving kernels (split_kv_kernel.cuh): the API layer fills the args,
// these choose the kernel, the number of key splits and the scratch, and launch.

#include <cstdint>

#include "flash_attention/flash_attention.hpp"
#include "kernels/serving/split_kv_args.hpp"

namespace flash_attention::serving {

// How a row's key blocks are divided: `splits` ranges of `blocks_per_split` blocks.
struct SplitPlan {
    int splits;
    int blocks_per_split;
    int ranges_per_group = 1;  // SplitKvArgs::ranges_per_group
};

// The plan for query tiles of `tiles_per_head` tiles per (sequence, K/V head) over at most
// key_blocks blocks of block_keys keys, of a paged cache or not. requested 0: the
// library's choice. Nothing here depends on the batch: one row's result is the same
// whatever else is in it.
SplitPlan plan_splits(std::int64_t tiles_per_head, int key_blocks, int block_keys, bool paged,
                      int requested);

// The head dims the split-KV kernel is built for (launch_d_head's instances, every dtype: an e4m3
// row of d_head 64 is 64 bytes, which SmemTile swizzles too): d_head 192's rows of 24 16-byte
// chunks do not split evenly over its copies' threads (RowGatherCopyGM2SM), and its decoding runs
// on the sm90 family's kernels instead.
constexpr bool has_split_kv(std::int64_t d_head) {
    return d_head == 64 || d_head == 128 || d_head == 256;
}

// plan_splits for the kernel that runs query rows of rows_per_kv_head (position, query
// head) pairs per K/V head over at most max_seq_k keys of dtype's elements.
SplitPlan plan_for(int d_head, DType dtype, std::int64_t rows_per_kv_head, std::int64_t max_seq_k,
                   bool paged, int requested);

// Attention for `args` (everything but splits and the partial buffers filled in):
// requested_splits 0 lets plan_splits() decide from max_seq_k. Throws Error.
void launch_attention(SplitKvArgs args, DType dtype, int d_head, std::int64_t max_seq_k,
                      int requested_splits, Stream stream);

// The launch for one d_head, every dtype: instantiated once per d_head, each in its own
// translation unit (split_kv_d*.cu) so that the build compiles them in parallel.
template <int D>
void launch_d_head(const SplitKvArgs& args, DType dtype, std::int64_t max_seq_k, int splits,
                   Stream stream);
extern template void launch_d_head<64>(const SplitKvArgs&, DType, std::int64_t, int, Stream);
extern template void launch_d_head<128>(const SplitKvArgs&, DType, std::int64_t, int, Stream);
extern template void launch_d_head<256>(const SplitKvArgs&, DType, std::int64_t, int, Stream);

// KV append, before the attention that reads the new rows (same stream).
void launch_append(const AppendArgs& args, int batch, int heads_kv, Stream stream);

}  // namespace flash_attention::serving
