// The tools API's view of the config space and of this build's registry.

#include "config/config_space.hpp"
#include "config/resources.hpp"
#include "flash_attention/tools.hpp"
#include "registry/registry.hpp"

namespace flash_attention::tools {

std::vector<std::string_view> kernel_set_names() {
    return space::set_names();
}

std::vector<KernelConfig> kernel_set(std::string_view name) {
    return space::named_set(name);
}

std::string_view built_kernel_set() {
    return flash_attention::built_kernel_set();
}

bool instantiable(const KernelConfig& config) {
    return space::rejecting_rule(config, /*validity_only=*/true) == nullptr;
}

KernelInfo kernel_info(const KernelConfig& config) {
    const KernelOps* ops = find_kernel(config);
    KernelInfo info;
    info.built = ops != nullptr;
    info.smem_bytes = smem_bytes(config);
    // Registers are known only on the device, and occupancy with them.
    if (ops != nullptr && device_count() > 0) {
        info.ctas_per_sm = ops->ctas_per_sm();
        info.measured = true;
        const KernelResources r = ops->resources();
        info.registers_per_thread = r.registers_per_thread;
        info.local_bytes_per_thread = r.local_bytes_per_thread;
    } else {
        info.ctas_per_sm = ctas_per_sm(
            config, config.family == Family::sm90 ? DeviceLimits::h100() : DeviceLimits::a100());
    }
    return info;
}

}  // namespace flash_attention::tools
