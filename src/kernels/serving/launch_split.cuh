#pragma once

// The split-KV kernel's launch for one d_head (declared in launch.hpp), instantiated by
// split_kv_d*.cu.

#include <cuda_runtime.h>

#include <limits>
#include <optional>
#include <string>

#include "common/cuda_check.hpp"
#include "common/stream_scratch.hpp"
#include "kernels/launch_support.cuh"
#include "kernels/serving/launch.hpp"
#include "kernels/serving/split_kv_kernel.cuh"

namespace flash_attention::serving {

template <DType Dt, int D>
void launch_combine(const CombineArgs& args, Stream stream) {
    launch_kernel<&combine_kernel<Dt, D>>(dim3(static_cast<unsigned>(args.rows)),
                                          combine_warps * warp_size, 0, stream, args,
                                          "split-KV combine kernel launch");
}

template <DType Dt, int D, int Warps, bool Paged>
void launch_split(SplitKvArgs args, std::int64_t max_seq_k, int requested_splits, Stream stream) {
    using Tr = SplitKvTraits<Dt, D, Warps>;
    constexpr auto* kernel = &split_kv_kernel<Dt, D, Warps, Paged>;
    const std::int64_t rows = std::int64_t{args.max_seq_q} * (args.heads / args.heads_kv);
    static_assert(Tr::B_c == split_kv_block_keys(D, Warps));
    const std::int64_t tiles = blocks_covering(static_cast<int>(rows), Tr::B_r);
    const SplitPlan plan = plan_for(D, rows, max_seq_k, requested_splits);
    const int splits = plan.splits;
    if (tiles * splits > std::numeric_limits<int>::max()) {
        throw Error(ErrorCode::invalid_argument,
                    "max_seqlen_q: expected at most 2^31 - 1 query tiles x splits, got " +
                        std::to_string(tiles) + " x " + std::to_string(splits));
    }
    args.splits = splits;
    args.blocks_per_split = plan.blocks_per_split;
    std::optional<StreamScratch> partial;  // freed in stream order after the combine
    if (splits > 1) {
        const std::size_t rows = static_cast<std::size_t>(args.partial_rows) * splits;
        partial.emplace(rows * (D + 1) * sizeof(float), stream, false);
        args.o_partial = static_cast<float*>(partial->get());
        args.lse_partial = args.o_partial + rows * D;
    }
    enable_dynamic_smem<kernel, Tr::smem_bytes>();
    launch_kernel<kernel>(
        dim3(static_cast<unsigned>(tiles * splits), static_cast<unsigned>(args.heads_kv),
             static_cast<unsigned>(args.batch)),
        Tr::threads, Tr::smem_bytes, stream, args, "split-KV kernel launch");
    if (splits > 1) {
        launch_combine<Dt, D>(
            {args.o_partial, args.lse_partial, args.partial_rows, args.cu_seqlens_q, args.batch,
             splits, args.heads, args.view_seq_q, args.o, args.o_stride, args.lse},
            stream);
    }
}

template <DType Dt, int D>
void launch_for(const SplitKvArgs& args, std::int64_t max_seq_k, int splits, Stream stream) {
    const bool paged = args.keys.block_table != nullptr;
    const bool one_warp =
        split_kv_warps(std::int64_t{args.max_seq_q} * (args.heads / args.heads_kv)) == 1;
    if (one_warp) {
        if (paged)
            launch_split<Dt, D, 1, true>(args, max_seq_k, splits, stream);
        else
            launch_split<Dt, D, 1, false>(args, max_seq_k, splits, stream);
    } else {
        if (paged)
            launch_split<Dt, D, 4, true>(args, max_seq_k, splits, stream);
        else
            launch_split<Dt, D, 4, false>(args, max_seq_k, splits, stream);
    }
}

template <int D>
void launch_d_head(const SplitKvArgs& args, DType dtype, std::int64_t max_seq_k, int splits,
                   Stream stream) {
    if (dtype == DType::BF16)
        launch_for<DType::BF16, D>(args, max_seq_k, splits, stream);
    else
        launch_for<DType::FP16, D>(args, max_seq_k, splits, stream);
}

}  // namespace flash_attention::serving
