#pragma once

// Host side of one sm80 kernel instantiation: launch, occupancy, resources.
// Generated translation units call make_ops<Config>() once per config.

#include <cuda_runtime.h>

#include "common/cuda_check.hpp"
#include "kernels/launch_support.cuh"
#include "kernels/sm80/forward_kernel.cuh"
#include "registry/kernel_ops.hpp"

namespace flash_attention::sm80 {

template <KernelConfig C>
inline constexpr auto* kernel = &forward_kernel<pack(C)>;
// Sliding window and softcap (KernelArgs::variants).
template <KernelConfig C>
inline constexpr auto* variant_kernel = &forward_kernel<pack(C), true>;

template <KernelConfig C>
void launch(const KernelArgs& args, Stream stream) {
    // Sequences of their own lengths run on the sm90 family or the serving kernels.
    if (args.seqs.cu_seqlens_q != nullptr || args.seqs.cu_seqlens_k != nullptr ||
        args.seqs.seqused_k != nullptr) {
        throw Error(ErrorCode::unsupported,
                    "config: expected an sm90-family config for per-sequence lengths, got " +
                        C.to_string());
    }
    constexpr int smem = static_cast<int>(smem_bytes(C));
    const dim3 grid(blocks_covering(args.seq_q, C.B_r), args.heads, args.batch);
    if (args.variants) {
        enable_dynamic_smem<variant_kernel<C>, smem>();
        launch_kernel<variant_kernel<C>>(grid, C.n_threads(), smem, stream, args,
                                         "sm80 forward kernel launch");
        return;
    }
    enable_dynamic_smem<kernel<C>, smem>();
    launch_kernel<kernel<C>>(grid, C.n_threads(), smem, stream, args, "sm80 forward kernel launch");
}

template <KernelConfig C>
constexpr KernelOps make_ops() {
    return kernel_ops<kernel<C>, &launch<C>, C.n_threads(), static_cast<int>(smem_bytes(C))>();
}

}  // namespace flash_attention::sm80
