#pragma once

// Host-side pieces every kernel family's make_ops<Config>() shares: the dynamic
// shared-memory opt-in, the occupancy query and the compiled resources of a kernel.

#include <cuda_runtime.h>

#include <array>
#include <mutex>

#include "common/cuda_check.hpp"
#include "common/relaxed_capture.hpp"
#include "registry/kernel_ops.hpp"

namespace flash_attention {

// Kernels asking for more than 48 KB of dynamic shared memory must opt in, once per
// device; doing it on every launch would cost a driver call each time.
template <auto* Kernel, int SmemBytes>
void enable_dynamic_smem() {
    if constexpr (SmemBytes > 48 * 1024) {
        constexpr int max_devices = 64;
        static std::array<std::once_flag, max_devices> done;
        int device = 0;
        cuda_check(cudaGetDevice(&device), "cudaGetDevice");
        const auto set = [] {
            const RelaxedCapture relaxed;
            cuda_check(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            SmemBytes),
                       "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
        };
        if (device < max_devices) {
            std::call_once(done[device], set);
        } else {
            set();
        }
    }
}

// CTAs per SM on the current device, from the CUDA occupancy calculator.
template <auto* Kernel, int Threads, int SmemBytes>
int ctas_per_sm() {
    enable_dynamic_smem<Kernel, SmemBytes>();
    int ctas = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, Kernel, Threads, SmemBytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return ctas;
}

// When a launch may start relative to the stream's previous kernel: after it ends, or
// (Hopper on) once every CTA of it has called ptx::launch_dependents() or exited, a
// programmatic dependent launch whose kernel must call ptx::wait_for_previous_grid() before it
// reads what the previous one wrote. Elsewhere
// after_trigger is after_end.
enum class LaunchOrder { after_end, after_trigger };

// Whether the current device runs programmatic dependent launches (sm_90 on).
inline bool programmatic_launch_supported() {
    int device = 0;
    int major = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
               "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
    return major >= 9;
}

// Launches through cudaLaunchKernelEx, whose result is this launch's own: checking
// cudaGetLastError() after <<<...>>> would also report, and clear, an earlier error of
// the caller's. Our failure is thrown and not left behind in the last-error state.
template <auto* Kernel, class Params>
void launch_kernel(dim3 grid, int threads, int smem_bytes, Stream stream, const Params& params,
                   const char* what, LaunchOrder order = LaunchOrder::after_end) {
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = static_cast<std::size_t>(smem_bytes);
    config.stream = stream;
    cudaLaunchAttribute programmatic{};
    if (order == LaunchOrder::after_trigger && programmatic_launch_supported()) {
        programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        programmatic.val.programmaticStreamSerializationAllowed = 1;
        config.attrs = &programmatic;
        config.numAttrs = 1;
    }
    const cudaError_t status = cudaLaunchKernelEx(&config, Kernel, params);
    if (status != cudaSuccess)
        cudaGetLastError();
    cuda_check(status, what);
}

template <auto* Kernel>
KernelResources resources();

// The registry's face of one kernel: its family's launcher, the occupancy calculator and
// the compiled resources.
template <auto* Kernel, void (*Launch)(const KernelArgs&, Stream), int Threads, int SmemBytes>
constexpr KernelOps kernel_ops() {
    return {Launch, nullptr, &ctas_per_sm<Kernel, Threads, SmemBytes>, &resources<Kernel>};
}

// A backward config's: Kernel is its main kernel (the one `list` reports).
template <auto* Kernel, void (*Launch)(const BackwardArgs&, Stream), int Threads, int SmemBytes>
constexpr KernelOps backward_kernel_ops() {
    return {nullptr, Launch, &ctas_per_sm<Kernel, Threads, SmemBytes>, &resources<Kernel>};
}

template <auto* Kernel>
KernelResources resources() {
    cudaFuncAttributes attributes{};
    cuda_check(cudaFuncGetAttributes(&attributes, Kernel), "cudaFuncGetAttributes");
    return {attributes.numRegs, static_cast<int>(attributes.localSizeBytes)};
}

}  // namespace flash_attention
