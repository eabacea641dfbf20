#pragma once

// Host side of one sm80 kernel instantiation: launch, occupancy, resources.
// Generated translation units call make_ops<Config>() once per config.

#include <cuda_runtime.h>

#include "common/cuda_check.hpp"
#include "kernels/launch_support.cuh"
#include "kernels/sm80/backward_kernel.cuh"
#include "kernels/sm80/forward_kernel.cuh"
#include "registry/kernel_ops.hpp"

namespace flash_attention::sm80 {

template <KernelConfig C>
inline constexpr auto* kernel = &forward_kernel<pack(C).hi, pack(C).lo>;
// Sliding window and softcap (KernelArgs::variants).
template <KernelConfig C>
inline constexpr auto* variant_kernel = &forward_kernel<pack(C).hi, pack(C).lo, true>;

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

// A sliding window (BackwardArgs::banded), a softcap (softcap_prescale) or ALiBi
// (alibi_slopes): the band kernels, instances of their own as the forward's variants (a softcap
// without a window runs the band mask with the causal flag's band).
template <KernelConfig C, class Mask = CausalMask, bool Softcap = false, bool Alibi = false>
inline constexpr auto* dkdv_kernel =
    &backward_dkdv_kernel<pack(C).hi, pack(C).lo, Mask, Softcap, Alibi>;
template <KernelConfig C, class Mask = CausalMask, bool Softcap = false, bool Alibi = false>
inline constexpr auto* dq_kernel =
    &backward_dq_kernel<pack(C).hi, pack(C).lo, Mask, Softcap, Alibi>;

template <KernelConfig C, class Mask, bool Softcap, bool Alibi = false>
void launch_backward_kernels(const BackwardArgs& args, Stream stream) {
    constexpr int dkdv_smem = static_cast<int>(backward_dkdv_smem_bytes(C));
    enable_dynamic_smem<dkdv_kernel<C, Mask, Softcap, Alibi>, dkdv_smem>();
    launch_kernel<dkdv_kernel<C, Mask, Softcap, Alibi>>(
        dim3(blocks_covering(args.seq_k, C.B_c), args.heads_kv, args.batch), C.n_threads(),
        dkdv_smem, stream, args, "sm80 backward dK/dV kernel launch");
    constexpr int dq_smem = static_cast<int>(backward_dq_smem_bytes(C));
    enable_dynamic_smem<dq_kernel<C, Mask, Softcap, Alibi>, dq_smem>();
    launch_kernel<dq_kernel<C, Mask, Softcap, Alibi>>(
        dim3(blocks_covering(args.seq_q, C.B_r), args.heads, args.batch), C.n_threads(), dq_smem,
        stream, args, "sm80 backward dQ kernel launch");
}

// The backward pass: D's preprocess, then the dK/dV and the dQ kernels, in stream order.
template <KernelConfig C>
void launch_backward(const BackwardArgs& args, Stream stream) {
    launch_backward_preprocess_and_sinks<C.dtype, C.d_head, C.v_head_dim()>(args, stream);
    if (args.alibi_slopes != nullptr && args.softcap_prescale != 0.0f)
        launch_backward_kernels<C, BandMask, true, true>(args, stream);
    else if (args.alibi_slopes != nullptr)
        launch_backward_kernels<C, BandMask, false, true>(args, stream);
    else if (args.softcap_prescale != 0.0f)
        launch_backward_kernels<C, BandMask, true>(args, stream);
    else if (args.banded)
        launch_backward_kernels<C, BandMask, false>(args, stream);
    else
        launch_backward_kernels<C, CausalMask, false>(args, stream);
}

template <KernelConfig C>
constexpr KernelOps make_ops() {
    if constexpr (C.backward) {
        return backward_kernel_ops<dkdv_kernel<C>, &launch_backward<C>, C.n_threads(),
                                   static_cast<int>(backward_dkdv_smem_bytes(C))>();
    } else {
        return kernel_ops<kernel<C>, &launch<C>, C.n_threads(), static_cast<int>(smem_bytes(C))>();
    }
}

}  // namespace flash_attention::sm80
