#pragma once

// The type-erased face of one compiled kernel, as the registry holds it.

#include "flash_attention/flash_attention.hpp"
#include "kernels/kernel_args.hpp"

namespace flash_attention {

struct KernelResources {
    int registers_per_thread;
    int local_bytes_per_thread;  // > 0 means spills or a stack frame
};

struct KernelOps {
    // Launches on `stream`; throws Error(ErrorCode::cuda) if the launch fails. A forward
    // config's kernel has `launch`, a backward config's (KernelConfig::backward) `launch_backward`;
    // the other is null.
    void (*launch)(const KernelArgs& args, Stream stream);
    void (*launch_backward)(const BackwardArgs& args, Stream stream);
    // CTAs per SM on the current device, from the CUDA occupancy calculator.
    int (*ctas_per_sm)();
    KernelResources (*resources)();
};

}  // namespace flash_attention
