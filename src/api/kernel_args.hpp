#pragma once

// What the API hands a registered kernel.

#include "flash_attention/flash_attention.hpp"
#include "kernels/kernel_args.hpp"

namespace flash_attention {

// Validated dense tensors as KernelArgs for `config` on `device`: each batch entry one sequence
// of the tensors' lengths (SequenceArgs without offsets or lengths).
KernelArgs kernel_args(const ForwardParams& params, const KernelConfig& config,
                       const DeviceProperties& device);

}  // namespace flash_attention
