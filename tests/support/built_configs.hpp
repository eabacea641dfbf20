#pragma once

// The configs of this build by pass: the GPU tests run each forward config through forward()
// and each backward config through backward().

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"

namespace flash_attention::testing {

// 16-bit configs by pass (FP8's take 8-bit inputs, which the 16-bit tests do not make; they
// have tests of their own: fp8_configs()).
inline std::vector<KernelConfig> built_configs(bool backward) {
    std::vector<KernelConfig> v;
    for (const KernelConfig& c : configs()) {
        if (c.backward == backward && c.dtype != DType::E4M3)
            v.push_back(c);
    }
    return v;
}

inline const std::vector<KernelConfig>& forward_configs() {
    static const std::vector<KernelConfig> v = built_configs(false);
    return v;
}

// A built 16-bit forward config, for the tests that need one of any kind; null where the build
// has none (a partial build of backward or FP8 configs alone).
inline const KernelConfig* any_forward_config() {
    return forward_configs().empty() ? nullptr : &forward_configs().front();
}

inline const std::vector<KernelConfig>& fp8_configs() {
    static const std::vector<KernelConfig> v = [] {
        std::vector<KernelConfig> fp8;
        for (const KernelConfig& c : configs()) {
            if (c.dtype == DType::E4M3)
                fp8.push_back(c);
        }
        return fp8;
    }();
    return v;
}

// Whether the build has a config that `wanted` accepts. A build of a few kernels (FLASH_KERNELS)
// may lack one; the release set has each the library takes (it is the built-in table:
// ConfigSpace.ReleaseSetIsTheBuiltInTable), so tests skip on this only in partial builds.
template <class Wanted>
bool has_built(Wanted wanted) {
    const std::vector<KernelConfig>& all = configs();
    return std::any_of(all.begin(), all.end(), wanted);
}

// Whether the build holds the release set (the default build, and the ci, tune and all sets): the
// automatic choice of a build without it picks among fewer kernels, so tests of what it picks
// skip elsewhere.
inline bool holds_release_set() {
    static const bool holds = [] {
        const std::vector<KernelConfig> release = tools::kernel_set("release");
        return std::all_of(release.begin(), release.end(),
                           [](const KernelConfig& c) { return is_built(c); });
    }();
    return holds;
}

inline bool has_sm90_forward(DType dtype, int d_head, int d_v) {
    return has_built([&](const KernelConfig& c) {
        return !c.backward && c.family == Family::sm90 && c.dtype == dtype && c.d_head == d_head &&
               c.v_head_dim() == d_v;
    });
}

// Whether a forward kernel of this dtype and these head dims is built and runs on this GPU: the
// backward's tests run the forward for O and the LSE, which a partial build may lack.
inline bool has_forward(DType dtype, int d_head, int d_v) {
    return has_built([&](const KernelConfig& c) {
        return !c.backward && c.dtype == dtype && c.d_head == d_head && c.v_head_dim() == d_v &&
               is_supported(c);
    });
}

template <class Wanted>
bool has_backward(Wanted wanted) {
    return has_built([&](const KernelConfig& c) { return c.backward && wanted(c); });
}

// A config's short form as a test-name part: letters and digits, runs of anything else one '_'.
inline std::string config_identifier(const KernelConfig& c) {
    std::string name;
    for (const char ch : c.to_string()) {
        if (std::isalnum(static_cast<unsigned char>(ch)))
            name += ch;
        else if (!name.empty() && name.back() != '_')
            name += '_';
    }
    return name;
}

inline const std::vector<KernelConfig>& backward_configs() {
    static const std::vector<KernelConfig> v = built_configs(true);
    return v;
}

}  // namespace flash_attention::testing
