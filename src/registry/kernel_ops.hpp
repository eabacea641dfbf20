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
    // Launches on `stream`; throws Error(ErrorCode::cuda) if the launch fails.
    void (*launch)(const KernelArgs& args, Stream stream);
    // CTAs per SM on the current device, from the CUDA occupancy calculator.
    int (*ctas_per_sm)();
    KernelResources (*resources)();
};

}  // namespace flash_attention
