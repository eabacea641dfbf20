#pragma once

// The split-KV kernel's launch for one d_head (declared in launch.hpp), instantiated by
// split_kv_d*.cu.

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <limits>
#include <mutex>
#include <optional>
#include <string>

#include "common/cuda_check.hpp"
#include "common/stream_scratch.hpp"
#include "kernels/launch_support.cuh"
#include "kernels/serving/launch.hpp"
#include "kernels/serving/split_kv_kernel.cuh"

namespace flash_attention::serving {

// The combine launches as a programmatic dependent of the split kernel on Hopper (PDL):
// its CTAs are scheduled while the split kernel's last ones run and wait in
// cudaGridDependencySynchronize() for all its writes, instead of launching after it ends.
template <DType Dt, int D>
void launch_combine(const CombineArgs& args, Stream stream) {
    // A warp a row where the rows fill the GPU several times over (speculative decoding:
    // 8192 rows of 8 splits, 22 -> 17 µs in ncu); a CTA a row otherwise, whose four warps
    // share the splits: a warp looping over one row's 16-32 splits made decoding's merge
    // (512 or 32 rows) the longer one (b16 x 8192 192 -> 195 µs, b1 x 131072 188 -> 192).
    constexpr std::int64_t fewest_rows_a_warp = 4096;
    if (args.rows >= fewest_rows_a_warp) {
        launch_kernel<&combine_kernel<Dt, D, 1>>(
            dim3(static_cast<unsigned>((args.rows + combine_warps - 1) / combine_warps)),
            combine_warps * warp_size, 0, stream, args, "split-KV combine kernel launch",
            LaunchOrder::after_trigger);
    } else {
        launch_kernel<&combine_kernel<Dt, D, combine_warps>>(
            dim3(static_cast<unsigned>(args.rows)), combine_warps * warp_size, 0, stream, args,
            "split-KV combine kernel launch", LaunchOrder::after_trigger);
    }
}

// How many consecutive key ranges each CTA streams (SplitKvArgs::splits_per_cta): for
// four-warp tiles, the fewest that let every CTA of the launch be resident at once, so no
// CTA hands its slot over mid-launch and restarts its pipeline (speculative decoding b16:
// 1024 ranges on 264 slots, 129.6 -> 135 TFLOP/s at 4 a CTA). One-warp (decoding) tiles
// keep one: b16 x 8192's 2048 CTAs balanced themselves better than 512 of four ranges
// (191.5 -> 192.8 µs; docs/PERF.md, ninth session). Only the CTAs change, never a range's
// arithmetic, so the count may follow the batch.
template <auto* Kernel, int Threads, int SmemBytes>
int splits_per_cta(std::int64_t ranges, int splits) {
    constexpr int max_devices = 64;
    static std::array<std::once_flag, max_devices> once;
    static std::array<std::int64_t, max_devices> resident{};
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    if (splits == 1 || device >= max_devices)
        return 1;
    std::call_once(once[device], [&] {
        int sms = 0;
        cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                   "cudaDeviceGetAttribute(MultiProcessorCount)");
        resident[device] = std::int64_t{sms} * ctas_per_sm<Kernel, Threads, SmemBytes>();
    });
    if (resident[device] <= 0)
        return 1;
    const std::int64_t per_cta = (ranges + resident[device] - 1) / resident[device];
    return static_cast<int>(std::min<std::int64_t>(per_cta, splits));
}

template <DType Dt, int D, int Warps, int Stages, bool Paged>
void launch_split(SplitKvArgs args, std::int64_t max_seq_k, int requested_splits, Stream stream) {
    using Tr = SplitKvTraits<Dt, D, Warps, Stages>;
    constexpr auto* kernel = &split_kv_kernel<Dt, D, Warps, Stages, Paged>;
    const std::int64_t rows = std::int64_t{args.max_seq_q} * (args.heads / args.heads_kv);
    static_assert(Tr::B_c == split_kv_block_keys(D, Warps));
    const std::int64_t tiles = blocks_covering(static_cast<int>(rows), Tr::B_r);
    const SplitPlan plan = plan_for(D, rows, max_seq_k, Paged, requested_splits);
    const int splits = plan.splits;
    if (tiles * splits * args.heads_kv > std::numeric_limits<int>::max()) {
        throw Error(ErrorCode::invalid_argument,
                    "max_seqlen_q: expected at most 2^31 - 1 query tiles x splits x K/V heads, "
                    "got " +
                        std::to_string(tiles) + " x " + std::to_string(splits) + " x " +
                        std::to_string(args.heads_kv));
    }
    args.splits = splits;
    args.blocks_per_split = plan.blocks_per_split;
    args.kv_read_once = tiles == 1;
    args.splits_per_cta = Warps == 1 ? 1
                                     : splits_per_cta<kernel, Tr::threads, Tr::smem_bytes>(
                                           tiles * splits * args.heads_kv * args.batch, splits);
    const std::int64_t split_groups = (splits + args.splits_per_cta - 1) / args.splits_per_cta;
    std::optional<StreamScratch> partial;  // freed in stream order after the combine
    if (splits > 1) {
        const std::size_t rows = static_cast<std::size_t>(args.partial_rows) * splits;
        partial.emplace(rows * (D + 1) * sizeof(float), stream, false);
        args.o_partial = static_cast<float*>(partial->get());
        args.lse_partial = args.o_partial + rows * D;
    }
    enable_dynamic_smem<kernel, Tr::smem_bytes>();
    launch_kernel<kernel>(dim3(static_cast<unsigned>(tiles * split_groups * args.heads_kv),
                               static_cast<unsigned>(args.batch)),
                          Tr::threads, Tr::smem_bytes, stream, args, "split-KV kernel launch");
    if (splits > 1) {
        launch_combine<Dt, D>(
            {args.o_partial, args.lse_partial, args.partial_rows, args.cu_seqlens_q, args.batch,
             splits, args.heads, args.view_seq_q, args.o, args.o_stride, args.lse},
            stream);
    }
}

// Four-warp tiles (speculative decoding, and every longer query off Hopper's sm90 path):
// a third stage where two CTAs still fit an SM (Hopper's 228 KB at d_head 64 and 128), so
// two blocks load while one computes; two stages where the third would cost a CTA (A100's
// 164 KB, d_head 256).
template <DType Dt, int D, bool Paged>
void launch_four_warps(const SplitKvArgs& args, std::int64_t max_seq_k, int splits, Stream stream) {
    int device = 0;
    int smem_per_sm = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    cuda_check(
        cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
        "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)");
    constexpr int reserved = 1024;  // per CTA, the runtime's
    if (2 * (SplitKvTraits<Dt, D, 4, 3>::smem_bytes + reserved) <= smem_per_sm)
        launch_split<Dt, D, 4, 3, Paged>(args, max_seq_k, splits, stream);
    else
        launch_split<Dt, D, 4, 2, Paged>(args, max_seq_k, splits, stream);
}

template <DType Dt, int D>
void launch_for(const SplitKvArgs& args, std::int64_t max_seq_k, int splits, Stream stream) {
    const bool paged = args.keys.block_table != nullptr;
    const bool one_warp =
        split_kv_warps(std::int64_t{args.max_seq_q} * (args.heads / args.heads_kv)) == 1;
    // One-warp (decoding) tiles take three stages: with two they were latency-bound (ncu,
    // decode b16 x 8192: no eligible warp 74% of cycles at 85% of DRAM bandwidth).
    if (one_warp) {
        if (paged)
            launch_split<Dt, D, 1, 3, true>(args, max_seq_k, splits, stream);
        else
            launch_split<Dt, D, 1, 3, false>(args, max_seq_k, splits, stream);
    } else {
        if (paged)
            launch_four_warps<Dt, D, true>(args, max_seq_k, splits, stream);
        else
            launch_four_warps<Dt, D, false>(args, max_seq_k, splits, stream);
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
