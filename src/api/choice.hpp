#pragma once

// The automatic choice of a kernel: the tuning cache's winner for this GPU and problem
// when there is one that this build can run, else the built-in table, else any built
// kernel that fits.

#include <optional>

#include "api/validate.hpp"

namespace flash_attention {

// Whether `config` was built and runs these (validated) tensors on `device`.
bool can_run(const KernelConfig& config, const ForwardParams& params, const DeviceInfo& device);

// The built-in table's choice, else the built kernel with the largest tiles that fits.
std::optional<KernelConfig> heuristic_config(const ForwardParams& params, const DeviceInfo& device);

// Tuning cache, then heuristic_config. Throws Error(unsupported) when nothing fits.
KernelConfig choose_kernel(const ForwardParams& params, const DeviceInfo& device);

}  // namespace flash_attention
