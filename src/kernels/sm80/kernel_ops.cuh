#pragma once

// Host side of one sm80 kernel instantiation: launch, occupancy, resources.
// Generated translation units call make_ops<Config>() once per config.

#include <cuda_runtime.h>

#include <array>
#include <mutex>

#include "common/cuda_check.hpp"
#include "kernels/sm80/forward_kernel.cuh"
#include "registry/kernel_ops.hpp"

namespace flash_attention::sm80 {

// Kernels asking for more than 48 KB of dynamic shared memory must opt in, once per
// device; doing it on every launch would cost a driver call each time.
template <KernelConfig C>
void enable_dynamic_smem() {
    if constexpr (C.smem_bytes() > 48 * 1024) {
        constexpr int max_devices = 64;
        static std::array<std::once_flag, max_devices> done;
        int device = 0;
        cuda_check(cudaGetDevice(&device), "cudaGetDevice");
        const auto set = [] {
            cuda_check(cudaFuncSetAttribute(forward_kernel<pack(C)>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(C.smem_bytes())),
                       "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
        };
        if (device < max_devices) {
            std::call_once(done[device], set);
        } else {
            set();
        }
    }
}

template <KernelConfig C>
void launch(const KernelArgs& args, Stream stream) {
    enable_dynamic_smem<C>();
    const dim3 grid((args.seq_q + C.B_r - 1) / C.B_r, args.heads, args.batch);
    forward_kernel<pack(C)><<<grid, C.n_threads(), C.smem_bytes(), stream>>>(args);
    cuda_check(cudaGetLastError(), "sm80 forward kernel launch");
}

template <KernelConfig C>
int ctas_per_sm() {
    enable_dynamic_smem<C>();
    int ctas = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, forward_kernel<pack(C)>,
                                                             C.n_threads(), C.smem_bytes()),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return ctas;
}

template <KernelConfig C>
KernelResources resources() {
    cudaFuncAttributes attributes{};
    cuda_check(cudaFuncGetAttributes(&attributes, forward_kernel<pack(C)>),
               "cudaFuncGetAttributes");
    return {attributes.numRegs, static_cast<int>(attributes.localSizeBytes),
            static_cast<int>(attributes.sharedSizeBytes)};
}

template <KernelConfig C>
constexpr KernelOps make_ops() {
    return {&launch<C>, &ctas_per_sm<C>, &resources<C>};
}

}  // namespace flash_attention::sm80
