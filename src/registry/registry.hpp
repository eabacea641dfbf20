#pragma once

// config -> compiled kernel. The table itself is generated at build time
// (generate_kernels) from the kernel set chosen with -DFLASH_KERNELS.

#include <span>
#include <string_view>

#include "flash_attention/kernel_config.hpp"
#include "registry/kernel_ops.hpp"

namespace flash_attention {

struct RegistryEntry {
    KernelConfig config;
    const KernelOps* ops;
};

// Sorted by config. Defined in the generated registry_table.cpp.
std::span<const RegistryEntry> registry_table();
// The name of the kernel set this build was generated from.
std::string_view built_kernel_set();

// The compiled kernel for a config, or nullptr when it was not built.
const KernelOps* find_kernel(const KernelConfig& config);

}  // namespace flash_attention
