#include "registry/registry.hpp"

#include <algorithm>

namespace flash_attention {

const KernelOps* find_kernel(const KernelConfig& config) {
    const auto table = registry_table();
    const auto it = std::lower_bound(
        table.begin(), table.end(), config,
        [](const RegistryEntry& e, const KernelConfig& c) { return e.config < c; });
    return it != table.end() && it->config == config ? it->ops : nullptr;
}

const std::vector<KernelConfig>& configs() {
    static const std::vector<KernelConfig> all = [] {
        std::vector<KernelConfig> v;
        for (const RegistryEntry& e : registry_table())
            v.push_back(e.config);
        return v;
    }();
    return all;
}

bool is_built(const KernelConfig& config) {
    return find_kernel(config) != nullptr;
}

}  // namespace flash_attention
