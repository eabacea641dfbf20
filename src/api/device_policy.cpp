// Which configs can run where: a config against the device (built, family, shared
// memory) and against the tensors (TMA's limits). The other half of validation, the
// tensors alone, is validate.cpp; device discovery is device.cpp.

#include <cstdint>
#include <limits>
#include <string>

#include "api/validate.hpp"
#include "config/config_space.hpp"
#include "config/resources.hpp"
#include "kernels/sm90/tensor_maps.hpp"
#include "registry/registry.hpp"

namespace flash_attention {

namespace {

// "config: expected ..., got <short form>".
[[noreturn]] void throw_config_error(ErrorCode code, const std::string& expected,
                                     const std::string& given) {
    throw Error(code, "config: expected " + expected + ", got " + given);
}

}  // namespace

std::string device_problem(const KernelConfig& c, const DeviceProperties& device) {
    if (find_kernel(c) == nullptr) {
        const space::Rule* rule = space::rejecting_rule(c, /*validity_only=*/true);
        return rule ? "a valid config (rule \"" + std::string(rule->name) +
                          "\": " + std::string(rule->why) + ")"
                    : "a config compiled into this build (kernel set \"" +
                          std::string(built_kernel_set()) + "\"; see flash_attention list)";
    }
    // sm_90a machine code runs on compute capability 9.0 and nothing else.
    if (c.family == Family::sm90 && !(device.major == 9 && device.minor == 0)) {
        return "an sm80-family config on device " + std::to_string(device.index) +
               " (compute capability " + std::to_string(device.major) + "." +
               std::to_string(device.minor) + "; sm90 kernels need 9.0)";
    }
    if (static_cast<long>(smem_bytes(c)) > device.smem_per_block_optin) {
        return "at most " + std::to_string(device.smem_per_block_optin) +
               " bytes of shared memory per CTA on device " + std::to_string(device.index) +
               " (the config needs " + std::to_string(smem_bytes(c)) + ")";
    }
    return {};
}

std::string pack_gqa_problem(const KernelConfig& c, std::int64_t heads, std::int64_t heads_kv,
                             std::int64_t seq_q, bool variants) {
    if (!c.sm90.pack_gqa)
        return {};
    const std::int64_t group = heads_kv > 0 ? heads / heads_kv : 0;
    if (group < 1 || group > 64 || 64 % group != 0) {
        return "query heads a power-of-two multiple of the K/V heads, at most 64 (packgqa packs "
               "a group of query heads into a consumer's 64 rows), got " +
               std::to_string(heads) + " over " + std::to_string(heads_kv);
    }
    if (variants)
        return "no window, softcap, ALiBi or sinks (packgqa runs the plain kernel body)";
    if (seq_q * group > std::numeric_limits<std::int32_t>::max() - 256) {
        return "query rows x (query heads / K/V heads) below 2^31 - 256 (packgqa numbers them "
               "in ints), got " +
               std::to_string(seq_q) + " x " + std::to_string(group);
    }
    return {};
}

std::string tma_problem(std::initializer_list<std::pair<const char*, const TensorView*>> tensors) {
    for (const auto& [name, t] : tensors) {
        for (int i = 0; i < 3; ++i) {
            if (t->shape[i] > 1 && t->stride[i] == 0) {
                return stride_name(name, i) +
                       ": expected a non-zero stride (the sm90 family's TMA copies need one), "
                       "got 0";
            }
            if (t->shape[i] > 1 &&
                static_cast<std::uint64_t>(t->stride[i]) * element_bytes(t->dtype) >=
                    sm90::k_tma_max_stride_bytes) {
                return stride_name(name, i) +
                       ": expected a stride below 2^40 bytes (the sm90 family's TMA copies' "
                       "limit), got " +
                       std::to_string(t->stride[i]) + " elements";
            }
        }
    }
    return {};
}

std::string tma_problem(const ForwardParams& p) {
    return tma_problem({{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"o", &p.o}});
}

void validate_config(const ForwardParams& p, const KernelConfig& c,
                     const DeviceProperties& device) {
    if (c.backward)
        throw_config_error(ErrorCode::invalid_argument, "a forward config (without bwd)",
                           c.to_string());
    if (c.dtype != p.q.dtype) {
        throw_config_error(ErrorCode::invalid_argument,
                           "dtype " + std::string(to_string(p.q.dtype)) + " (the tensors')",
                           c.to_string());
    }
    if (c.d_head != p.q.shape[3]) {
        throw_config_error(ErrorCode::invalid_argument,
                           "d_head " + std::to_string(p.q.shape[3]) + " (the tensors')",
                           c.to_string());
    }
    if (c.v_head_dim() != p.v.shape[3]) {
        throw_config_error(ErrorCode::invalid_argument,
                           "V's head dim " + std::to_string(p.v.shape[3]) + " (the tensors'" +
                               (c.d_v == 0 ? "; dv_N where it differs from d_head)" : ")"),
                           c.to_string());
    }
    if (const std::string problem = device_problem(c, device); !problem.empty()) {
        throw_config_error(
            find_kernel(c) == nullptr ? ErrorCode::not_built : ErrorCode::unsupported, problem,
            c.to_string());
    }
    if (c.family == Family::sm90) {
        if (const std::string problem = tma_problem(p); !problem.empty())
            throw Error(ErrorCode::unsupported, problem + " with config " + c.to_string());
    }
    if (const std::string problem =
            pack_gqa_problem(c, p.q.shape[2], p.k.shape[2], p.q.shape[1], p.options.variants.any());
        !problem.empty())
        throw_config_error(ErrorCode::unsupported, problem, c.to_string());
}

}  // namespace flash_attention
