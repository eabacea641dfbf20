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
// ptx::wait_for_previous_grid() for all its writes, instead of launching after it ends.
template <DType Dt, int D>
void launch_combine(const CombineArgs& args, Stream stream) {
    // A warp a row where the rows fill the GPU several times over (speculative decoding:
    // 8192 rows of 8 splits, 22 -> 17 µs in ncu); else as many warps a row as give each
    // lane two columns, whose loads the few rows of a decode step (32 or 512) need in
    // flight. The merge's order is the same either way (combine_kernel).
    constexpr std::int64_t fewest_rows_a_warp = 4096;
    constexpr int few_rows_warps = std::min(combine_warps, D / (2 * warp_size));
    if (args.rows >= fewest_rows_a_warp || few_rows_warps == 1) {
        launch_kernel<&combine_kernel<Dt, D, 1>>(
            dim3(static_cast<unsigned>((args.rows + combine_warps - 1) / combine_warps)),
            combine_warps * warp_size, 0, stream, args, "split-KV combine kernel launch",
            LaunchOrder::after_trigger);
    } else {
        constexpr int rows_a_cta = combine_warps / few_rows_warps;
        launch_kernel<&combine_kernel<Dt, D, few_rows_warps>>(
            dim3(static_cast<unsigned>((args.rows + rows_a_cta - 1) / rows_a_cta)),
            combine_warps * warp_size, 0, stream, args, "split-KV combine kernel launch",
            LaunchOrder::after_trigger);
    }
}

// How many consecutive key ranges each CTA streams (SplitKvArgs::splits_per_cta), for
// four-warp tiles. With `all_ranges` (the kernel folds ranges, contiguous cache), all of a
// unit's (one query tile of one K/V head of one sequence) where the units alone occupy at
// least 3/4 of the SMs: the CTA folds them and writes the final O, no partials and no
// combine (speculative decoding b16, 128 units on 132 SMs: 134.5 -> 176 TFLOP/s; 2026-11-24,
// docs/PERF.md). A paged cache's gathers need the second CTA an SM that this costs (the
// same shape on 16-row pages 136 -> 156 µs). Else the fewest that let every CTA of the
// launch be resident at once, so no CTA hands its slot over mid-launch and restarts its
// pipeline (b16 ranges in 4s: 129.6 -> 135 TFLOP/s). One-warp (decoding) tiles keep one:
// b16 x 8192's 2048 CTAs balanced themselves better than 512 of four ranges (191.5 -> 192.8
// µs; H100, 2026-11-24). Only the CTAs change, never a row's arithmetic, so the count may
// follow the batch.
template <auto* Kernel, int Threads, int SmemBytes>
int splits_per_cta(std::int64_t units, int splits, bool all_ranges) {
    constexpr int max_devices = 64;
    struct Capacity {
        std::int64_t sms = 0;
        std::int64_t resident = 0;  // CTAs of this kernel the GPU holds at once
    };
    static std::array<std::once_flag, max_devices> once;
    static std::array<Capacity, max_devices> capacity{};
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    if (splits == 1 || device >= max_devices)
        return 1;
    std::call_once(once[device], [&] {
        int sms = 0;
        cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                   "cudaDeviceGetAttribute(MultiProcessorCount)");
        capacity[device] = {sms, std::int64_t{sms} * ctas_per_sm<Kernel, Threads, SmemBytes>()};
    });
    const Capacity& c = capacity[device];
    if (all_ranges && 4 * units >= 3 * c.sms)
        return splits;
    if (c.resident <= 0)
        return 1;
    const std::int64_t ranges = units * splits;
    const std::int64_t per_cta = (ranges + c.resident - 1) / c.resident;
    return static_cast<int>(std::min<std::int64_t>(per_cta, splits));
}

template <DType Dt, int D, int Warps, int Stages, bool Paged, int KeyWarps = 1>
void launch_split(SplitKvArgs args, const SplitPlan& plan, Stream stream) {
    using Tr = SplitKvTraits<Dt, D, Warps, Stages, KeyWarps>;
    constexpr auto* kernel = &split_kv_kernel<Dt, D, Warps, Stages, Paged, KeyWarps>;
    const std::int64_t rows = std::int64_t{args.max_seq_q} * (args.heads / args.heads_kv);
    static_assert(Tr::B_c == split_kv_block_keys(D, Warps));
    const std::int64_t tiles = blocks_covering(static_cast<int>(rows), Tr::B_r);
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
    args.ranges_per_group = plan.ranges_per_group;
    args.kv_read_once = tiles == 1;
    // Key warps: a CTA a row, its warps the row's groups. One-warp tiles without: a CTA a
    // range.
    args.splits_per_cta =
        KeyWarps > 1 ? splits
        : Warps == 1 ? 1
                     : splits_per_cta<kernel, Tr::threads, Tr::smem_bytes>(
                           tiles * args.heads_kv * args.batch, splits, Tr::folds_ranges && !Paged);
    const std::int64_t split_groups = (splits + args.splits_per_cta - 1) / args.splits_per_cta;
    // Ranges a CTA folds into slot 0 (1: none), and whether the CTAs leave partials to merge:
    // not where each folds all of its row's.
    const int folded = Tr::folds_ranges ? std::min(args.splits_per_cta, splits) : 1;
    // (A CTA folds a row's first ranges into slot 0 only in four-warp tiles, whose merge
    // takes no groups: plan_for.)
    const bool combine = splits > 1 && folded < splits;
    std::optional<StreamScratch> partial;  // freed in stream order after the combine
    if (combine) {
        const std::size_t rows = static_cast<std::size_t>(args.partial_rows);
        const std::size_t slots = rows * splits;
        partial.emplace((slots * (D + 1) + rows) * sizeof(float), stream, false);
        args.o_partial = static_cast<float*>(partial->get());
        args.lse_partial = args.o_partial + slots * D;
        args.fold_sum = args.lse_partial + slots;
    }
    enable_dynamic_smem<kernel, Tr::smem_bytes>();
    launch_kernel<kernel>(dim3(static_cast<unsigned>(tiles * split_groups * args.heads_kv),
                               static_cast<unsigned>(args.batch)),
                          Tr::threads, Tr::smem_bytes, stream, args, "split-KV kernel launch");
    if (combine) {
        launch_combine<Tr::out_dtype, D>(
            {args.o_partial, args.lse_partial, args.fold_sum, folded, args.ranges_per_group,
             args.partial_rows, args.cu_seqlens_q, args.batch, splits, args.heads, args.view_seq_q,
             args.o, args.o_stride, args.lse, args.sinks},
            stream);
    }
}

// Four-warp tiles (speculative decoding, and every longer query off Hopper's sm90 path):
// a third stage where two CTAs still fit an SM (Hopper's 228 KB at d_head 64 and 128), so
// two blocks load while one computes; two stages where the third would cost a CTA (A100's
// 164 KB, d_head 256).
template <DType Dt, int D, bool Paged>
void launch_four_warps(const SplitKvArgs& args, const SplitPlan& plan, Stream stream) {
    int device = 0;
    int smem_per_sm = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    cuda_check(
        cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
        "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)");
    constexpr int reserved = 1024;  // per CTA, the runtime's
    if (2 * (SplitKvTraits<Dt, D, 4, 3>::smem_bytes + reserved) <= smem_per_sm)
        launch_split<Dt, D, 4, 3, Paged>(args, plan, stream);
    else
        launch_split<Dt, D, 4, 2, Paged>(args, plan, stream);
}

// One-warp (decoding) tiles, three stages: with two they were latency-bound (ncu, decode
// b16 x 8192: no eligible warp 74% of cycles at 85% of DRAM bandwidth). Key warps (one CTA
// a row, no partials, no merge kernel) where the rows fill whole waves of the SMs to at
// least 90%, a row has ranges for more than one warp and the CTA's stages fit (not on an
// A100 at d_head 128, nor with eight warps on pages at d_head 64). H200, 8192 keys, 8 K/V heads
// (2026-11-26, docs/PERF.md): 128, 256 and 512 rows (batch 16, 32, 64) 2-5% faster than a CTA a
// range, 104 rows (79% of the SMs) and 192 (1.45 waves) 3% slower; a CTA a range spreads a row over
// many SMs.
template <DType Dt, int D, bool Paged>
void launch_one_warp(const SplitKvArgs& args, const SplitPlan& plan, Stream stream) {
    constexpr int key_warps = split_kv_key_warps(D, static_cast<int>(element_bytes(Dt)), 1, Paged);
    if constexpr (key_warps > 1) {
        const DeviceProperties& device = DeviceProperties::current();
        const std::int64_t rows = std::int64_t{args.batch} * args.heads_kv;  // a tile each
        const std::int64_t sms = device.sm_count;
        const std::int64_t waves = (rows + sms - 1) / sms;
        if (plan.splits > 1 && 10 * rows >= 9 * waves * sms &&
            SplitKvTraits<Dt, D, 1, 3, key_warps>::smem_bytes <= device.smem_per_block_optin)
            return launch_split<Dt, D, 1, 3, Paged, key_warps>(args, plan, stream);
    }
    launch_split<Dt, D, 1, 3, Paged>(args, plan, stream);
}

template <DType Dt, int D>
void launch_for(const SplitKvArgs& args, std::int64_t max_seq_k, int splits, Stream stream) {
    const bool paged = args.keys.block_table != nullptr;
    const std::int64_t rows_per_kv_head =
        std::int64_t{args.max_seq_q} * (args.heads / args.heads_kv);
    const SplitPlan plan = plan_for(D, Dt, rows_per_kv_head, max_seq_k, paged, splits);
    const bool one_warp = split_kv_warps(rows_per_kv_head) == 1;
    if (one_warp) {
        if (paged)
            launch_one_warp<Dt, D, true>(args, plan, stream);
        else
            launch_one_warp<Dt, D, false>(args, plan, stream);
    } else {
        if (paged)
            launch_four_warps<Dt, D, true>(args, plan, stream);
        else
            launch_four_warps<Dt, D, false>(args, plan, stream);
    }
}

template <int D>
void launch_d_head(const SplitKvArgs& args, DType dtype, std::int64_t max_seq_k, int splits,
                   Stream stream) {
    if (dtype == DType::BF16) {
        launch_for<DType::BF16, D>(args, max_seq_k, splits, stream);
    } else if (dtype == DType::FP16) {
        launch_for<DType::FP16, D>(args, max_seq_k, splits, stream);
    } else if (dtype == DType::E4M3) {
        launch_for<DType::E4M3, D>(args, max_seq_k, splits, stream);
    } else {
        throw Error(ErrorCode::dtype, "q.dtype: expected FP16, BF16 or E4M3 for a KV cache, got " +
                                          std::string(to_string(dtype)));
    }
}

}  // namespace flash_attention::serving
