#pragma once

#include <optional>

#include "api/validate.hpp"

namespace flash_attention {

// The built-in choice: the first config of the table for (dtype, d_head) that is
// built and divides the problem's sequence lengths, else any built config that does
// (largest tiles first); nullopt when none does.
std::optional<KernelConfig> heuristic_config(const ForwardParams& params, const DeviceInfo& device);

}  // namespace flash_attention
