#pragma once

// Host side of one sm90 kernel instantiation: tensor maps, launch, occupancy, resources.
// Generated translation units (compiled for sm_90a only) call make_ops<Config>().

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "common/cuda_check.hpp"
#include "common/stream_scratch.hpp"
#include "kernels/fp8/v_transpose.hpp"
#include "kernels/launch_support.cuh"
#include "kernels/sm90/backward_kernel.cuh"
#include "kernels/sm90/forward_kernel.cuh"
#include "registry/kernel_ops.hpp"

namespace flash_attention::sm90 {

// forward()'s dense problems, and sequences of their own lengths (forward_kernel.cuh).
template <KernelConfig C>
inline constexpr auto* kernel = &forward_kernel<pack(C).hi, pack(C).lo, false>;
template <KernelConfig C>
inline constexpr auto* per_sequence_kernel = &forward_kernel<pack(C).hi, pack(C).lo, true>;
// Sliding window and softcap, dense or per sequence (KernelArgs::variants).
template <KernelConfig C>
inline constexpr auto* variant_kernel = &forward_kernel<pack(C).hi, pack(C).lo, true, true>;
// A paged KV cache, without and with variants.
template <KernelConfig C>
inline constexpr auto* paged_kernel = &forward_kernel<pack(C).hi, pack(C).lo, true, false, true>;
template <KernelConfig C>
inline constexpr auto* paged_variant_kernel =
    &forward_kernel<pack(C).hi, pack(C).lo, true, true, true>;
// ALiBi (KernelArgs::alibi_slopes), with or without the other variants, contiguous or paged.
template <KernelConfig C>
inline constexpr auto* alibi_kernel =
    &forward_kernel<pack(C).hi, pack(C).lo, true, true, false, true>;
template <KernelConfig C>
inline constexpr auto* paged_alibi_kernel =
    &forward_kernel<pack(C).hi, pack(C).lo, true, true, true, true>;

template <auto* Kernel, int Smem>
void launch_instance(std::int64_t ctas, int threads, Stream stream, const Params& params) {
    enable_dynamic_smem<Kernel, Smem>();
    launch_kernel<Kernel>(dim3(static_cast<unsigned>(ctas)), threads, Smem, stream, params,
                          "sm90 forward kernel launch");
}

// pack_gqa: KernelArgs::pack_shift for a call, after the checks the API makes first
// (pack_gqa_problem(), device_policy.cpp): the query heads of a K/V head a power of two
// dividing a consumer's 64 rows, the plain kernel body (no variant of the scores, no sinks),
// and a sequence's rows, its queries times those heads, ints.
inline int pack_shift(const KernelArgs& args) {
    const int group = args.heads / args.heads_kv;
    if (group > 64 || 64 % group != 0 || args.variants || args.alibi_slopes != nullptr ||
        (std::int64_t{args.seqs.q_view_seq} * group > std::numeric_limits<int>::max() - 256)) {
        throw Error(ErrorCode::unsupported,
                    "config: expected a problem that packgqa packs (query heads a power-of-two "
                    "multiple of the K/V heads, at most 64 times; no window, softcap, ALiBi or "
                    "sinks), got " +
                        std::to_string(args.heads) + " query heads over " +
                        std::to_string(args.heads_kv) + " K/V heads" +
                        (args.variants || args.alibi_slopes != nullptr ? " with variants" : ""));
    }
    return std::countr_zero(static_cast<unsigned>(group));
}

// A launch's tiles, numbered in one dimension (tile_at() decodes them) with ints; o's memory
// bounds them far below 2^31.
inline std::int64_t checked_tiles(const KernelArgs& args, int B_r, bool packed) {
    const std::int64_t tiles = tile_numbers(args, B_r, packed);
    if (tiles > std::numeric_limits<int>::max()) {
        throw Error(ErrorCode::invalid_argument,
                    "q.shape: expected at most 2^31 - 1 tiles of " + std::to_string(B_r) +
                        " query rows (sequences x heads x query blocks), got " +
                        std::to_string(tiles));
    }
    return tiles;
}

// The CTAs of a launch of `tiles` tiles: a persistent kernel runs one an SM (its register
// reallocation leaves room for no second). With the dynamic schedule, its two counters (the next
// tile, the CTAs done: TileScheduler) in `counters`, which the launch holds, and in params.
template <KernelConfig C>
std::int64_t launch_ctas(Params& params, std::int64_t tiles,
                         std::optional<StreamCounters>& counters, Stream stream) {
    if constexpr (C.sm90.dynamic_schedule) {
        counters.emplace(2, stream);
        params.tile_counter = counters->get();
    }
    return C.sm90.persistent ? std::min<std::int64_t>(tiles, params.args.sm_count) : tiles;
}

template <KernelConfig C>
void launch(const KernelArgs& args, Stream stream) {
    constexpr int smem = static_cast<int>(smem_bytes(C));
    constexpr bool packed = C.sm90.pack_gqa;
    const SequenceArgs& seqs = args.seqs;
    const bool paged = seqs.block_table != nullptr;
    // pack_gqa tiles run the per-sequence body, dense calls too.
    const bool per_sequence = packed || seqs.cu_seqlens_q != nullptr ||
                              seqs.cu_seqlens_k != nullptr || seqs.seqused_k != nullptr || paged;
    KernelArgs a = args;
    if constexpr (packed) {
        a.pack_shift = pack_shift(args);
        // A unit's tiles together (dense_position()): sections count query heads.
        a.section_heads = 1;
    }
    const std::int64_t tiles = checked_tiles(a, C.B_r, packed);
    // Dense tiles: the divisions of their numbers, once here (their products are at most
    // `tiles`, checked above).
    if (!per_sequence)
        a.tile_divisors = tile_divisors(args, C.B_r);
    // A paged cache's K/V copies stop at page boundaries (paged_copy_rows).
    if (paged)
        a.seqs.page_copy_rows = paged_copy_rows(a.seqs.k_view_seq, C.B_c);
    Params params{a,
                  make_tensor_maps(a, C.dtype, C.d_head, C.v_head_dim(),
                                   paged ? a.seqs.page_copy_rows : C.B_c, packed),
                  nullptr,
                  {}};
    std::optional<StreamCounters> counters;
    const std::int64_t ctas = launch_ctas<C>(params, tiles, counters, stream);
    // Stream-K: the dense kernel splits a non-causal problem's last, part-filled round; its
    // partial results live in memory of this launch, their flags in the stream's counters.
    std::optional<StreamScratch> partials;
    std::optional<StreamCounters> partial_flags;
    if constexpr (C.sm90.stream_k) {
        const StreamKPlan plan =
            per_sequence || args.variants || args.causal
                ? StreamKPlan{0, 0}
                : stream_k_plan(tiles, ctas, blocks_covering(args.seq_k, C.B_c));
        if (plan.units > 0) {
            const int slots = static_cast<int>(ctas) * consumer_warpgroups(C);
            const std::size_t slot_floats =
                partial_o_floats(tile_columns(C.v_head_dim())) + partial_lse_floats;
            partials.emplace(sizeof(float) * slot_floats * slots, stream, false);
            partial_flags.emplace(slots, stream);
            params.split = {static_cast<float*>(partials->get()), partial_flags->get(), plan.whole,
                            plan.units};
        }
    }
    constexpr int threads = C.n_threads();
    if constexpr (packed) {  // the plain body only (pack_shift())
        if (paged)
            launch_instance<paged_kernel<C>, smem>(ctas, threads, stream, params);
        else
            launch_instance<per_sequence_kernel<C>, smem>(ctas, threads, stream, params);
    } else if (args.alibi_slopes != nullptr && paged) {
        launch_instance<paged_alibi_kernel<C>, smem>(ctas, threads, stream, params);
    } else if (args.alibi_slopes != nullptr) {
        launch_instance<alibi_kernel<C>, smem>(ctas, threads, stream, params);
    } else if (args.variants && paged) {
        launch_instance<paged_variant_kernel<C>, smem>(ctas, threads, stream, params);
    } else if (args.variants) {
        launch_instance<variant_kernel<C>, smem>(ctas, threads, stream, params);
    } else if (paged) {
        launch_instance<paged_kernel<C>, smem>(ctas, threads, stream, params);
    } else if (per_sequence) {
        launch_instance<per_sequence_kernel<C>, smem>(ctas, threads, stream, params);
    } else {
        launch_instance<kernel<C>, smem>(ctas, threads, stream, params);
    }
}

// FP8 (e4m3): forward()'s dense problems on the dense kernel body (Traits::fp8), after a pass
// that writes V's transposed copy (fp8::transpose_v) into memory of the launch: 8-bit wgmma
// reads P·V's B operand K-major only; with transpose_v the kernel reads V itself and transposes
// each block in shared memory (no pass, no workspace). Only the dense instance: no varlen, KV
// cache or variants.
template <KernelConfig C>
void launch_fp8(const KernelArgs& args, Stream stream) {
    static_assert(!C.sm90.pack_gqa && !C.sm90.stream_k, "the rule dtype: FP8's knobs");
    const SequenceArgs& seqs = args.seqs;
    if (seqs.cu_seqlens_q != nullptr || seqs.cu_seqlens_k != nullptr || seqs.seqused_k != nullptr ||
        seqs.block_table != nullptr || args.variants || args.alibi_slopes != nullptr ||
        args.q_descale == nullptr || args.k_descale == nullptr || args.v_descale == nullptr) {
        throw Error(ErrorCode::unsupported,
                    "config: " + C.to_string() +
                        " runs forward()'s dense FP8 problems only (descales given, no varlen, "
                        "KV cache or variants)");
    }
    const std::int64_t tiles = checked_tiles(args, C.B_r, false);
    KernelArgs a = args;
    a.tile_divisors = tile_divisors(args, C.B_r);
    std::optional<StreamScratch> vt;  // V's transposed copy, unless the kernel transposes V
    if constexpr (!C.sm90.transpose_v) {
        TensorView v{};
        v.data = const_cast<void*>(args.v);
        v.dtype = DType::E4M3;
        v.shape = {args.batch, args.seq_k, args.heads_kv, C.d_head};
        v.stride = {args.v_stride.batch, args.v_stride.seq, args.v_stride.head, 1};
        vt.emplace(fp8::transposed_v_bytes(v), stream, false, StreamScratch::Pool::device);
        fp8::transpose_v(v, vt->get(), stream);
    }
    Params params{a,
                  make_fp8_tensor_maps(a, C.d_head, C.B_c, vt ? vt->get() : nullptr,
                                       fp8::padded_keys(args.seq_k)),
                  nullptr,
                  {}};
    std::optional<StreamCounters> counters;
    const std::int64_t ctas = launch_ctas<C>(params, tiles, counters, stream);
    launch_instance<kernel<C>, static_cast<int>(smem_bytes(C))>(ctas, C.n_threads(), stream,
                                                                params);
}

// Mask: CausalMask, or BandMask for a sliding window (BackwardArgs::banded); Softcap:
// BackwardArgs::softcap_prescale; Alibi: BackwardArgs::alibi_slopes (on BandMask). The variants
// are instances of their own, as the forward's, so that the plain loop keeps its code: ALiBi's
// step in the window-and-softcap kernel spilled 28 bytes at d_head 128 where it had none
// (ptxas, CUDA 13.0).
template <KernelConfig C, class Mask = CausalMask, bool Softcap = false, bool Alibi = false>
inline constexpr auto* backward_main_kernel =
    &backward_kernel<pack(C).hi, pack(C).lo, Mask, Softcap, Alibi>;

template <auto* Kernel, int Smem>
void launch_backward_instance(std::int64_t ctas, int threads, Stream stream,
                              const BackwardLaunch& params) {
    enable_dynamic_smem<Kernel, Smem>();
    launch_kernel<Kernel>(dim3(static_cast<unsigned>(ctas)), threads, Smem, stream, params,
                          "sm90 backward kernel launch", LaunchOrder::after_trigger);
}

// The backward pass: the preprocess (D, the LSE in base 2, dQ's accumulator zeroed), the main
// kernel, and dQ's conversion, in stream order; the main kernel and the conversion are
// programmatic dependent launches (Hopper), scheduled while the kernel before them finishes and
// waiting for its writes where they read them.
template <KernelConfig C>
void launch_backward(const BackwardArgs& args, Stream stream) {
    // Everything that can throw before the first launch: no output is half written.
    const auto scheduler = KeyBlockScheduler::of(args, C.B_c, C.sm90.ordered_dq);
    if (scheduler.count() > std::numeric_limits<int>::max()) {
        throw Error(ErrorCode::invalid_argument,
                    "k.shape: expected at most 2^31 - 1 key blocks of " + std::to_string(C.B_c) +
                        " rows (sequences x heads x blocks), got " +
                        std::to_string(scheduler.count()));
    }
    // Persistent: a CTA an SM, each walking one key block of each round (backward_kernel.cuh).
    const std::int64_t ctas = C.sm90.persistent && args.sm_count > 0
                                  ? std::min<std::int64_t>(scheduler.count(), args.sm_count)
                                  : scheduler.count();
    BackwardLaunch params{
        args, make_backward_tensor_maps(args, C.dtype, C.d_head, C.v_head_dim(), C.B_r, C.B_c)};
    // Stream-K: where the kernel splits the last round, its partials and counters in memory of
    // this launch (the preprocess zeroes the counters).
    std::optional<StreamScratch> streamk;
    if constexpr (C.sm90.stream_k) {
        const BackwardStreamK split = BackwardStreamK::of(args, C.B_r, C.B_c, ctas);
        if (split.splits()) {
            constexpr int columns = tile_columns(C.d_head) + tile_columns(C.v_head_dim());
            streamk.emplace(split.bytes(C.B_c, columns), stream, false);
            BackwardArgs& a = params.args;
            a.streamk_partials = static_cast<float*>(streamk->get());
            a.streamk_counters = reinterpret_cast<int*>(
                a.streamk_partials +
                std::size_t{2} * static_cast<std::size_t>(split.ranges) * C.B_c * columns);
            a.streamk_blocks = split.blocks;
        }
    }
    launch_backward_preprocess_and_sinks<C.dtype, C.d_head, C.v_head_dim()>(params.args, stream);
    constexpr int smem = static_cast<int>(smem_bytes(C));
    constexpr int threads = C.n_threads();
    const bool softcap = args.softcap_prescale != 0.0f;
    // Packed sequences and ALiBi run on the band kernels (BackwardArgs::banded, set by the host).
    if (args.alibi_slopes != nullptr && softcap)
        launch_backward_instance<backward_main_kernel<C, BandMask, true, true>, smem>(
            ctas, threads, stream, params);
    else if (args.alibi_slopes != nullptr)
        launch_backward_instance<backward_main_kernel<C, BandMask, false, true>, smem>(
            ctas, threads, stream, params);
    else if (args.banded && softcap)
        launch_backward_instance<backward_main_kernel<C, BandMask, true>, smem>(ctas, threads,
                                                                                stream, params);
    else if (args.banded)
        launch_backward_instance<backward_main_kernel<C, BandMask>, smem>(ctas, threads, stream,
                                                                          params);
    else if (softcap)
        launch_backward_instance<backward_main_kernel<C, CausalMask, true>, smem>(ctas, threads,
                                                                                  stream, params);
    else
        launch_backward_instance<backward_main_kernel<C>, smem>(ctas, threads, stream, params);
    launch_kernel<&backward_dq_kernel<pack(C).hi, pack(C).lo>>(
        dim3(blocks_covering(args.seq_q, C.B_r), args.heads, args.batch), 128, 0, stream, args,
        "sm90 backward dQ conversion launch", LaunchOrder::after_trigger);
}

template <KernelConfig C>
constexpr KernelOps make_ops() {
    if constexpr (C.backward) {
        return backward_kernel_ops<backward_main_kernel<C>, &launch_backward<C>, C.n_threads(),
                                   static_cast<int>(smem_bytes(C))>();
    } else if constexpr (C.dtype == DType::E4M3) {
        return kernel_ops<kernel<C>, &launch_fp8<C>, C.n_threads(),
                          static_cast<int>(smem_bytes(C))>();
    } else if constexpr (C.sm90.pack_gqa) {
        return kernel_ops<per_sequence_kernel<C>, &launch<C>, C.n_threads(),
                          static_cast<int>(smem_bytes(C))>();
    } else {
        return kernel_ops<kernel<C>, &launch<C>, C.n_threads(), static_cast<int>(smem_bytes(C))>();
    }
}

}  // namespace flash_attention::sm90
