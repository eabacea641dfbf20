#pragma once

// The automatic choice of a kernel: the tuning cache's winner for this GPU and problem
// when there is one that this build can run, else the built-in table, else any built
// kernel that fits (the sm90 family first where it runs, then the largest tiles).

#include <cstdint>
#include <optional>

#include "api/validate.hpp"

namespace flash_attention {

// A validated problem as the choice sees it.
struct ChoiceProblem {
    ProblemShape shape;
    // The sm90 family's TMA can address the tensors (tma_problem is empty).
    bool tma_addressable = true;
    // Rows per page of a paged K/V cache; 0: contiguous keys.
    std::int64_t page_size = 0;
    // A window, softcap, ALiBi or sinks (Variants::any()): the configs' variant kernels run,
    // which pack_gqa configs do not have.
    bool variants = false;
};

ChoiceProblem choice_problem(const ForwardParams& params);

// Whether `config` is a forward config that was built and runs this problem on `device`.
bool can_run(const KernelConfig& config, const ChoiceProblem& problem,
             const DeviceProperties& device);

// The built-in table's choice, else the built kernel that fits, the sm90 family first. On a
// paged cache a table row whose key block and pages cut each other into shorter runs than
// either (B_c 80 on 64-row pages: 16-row TMA copies) gives way to a later row of its family
// that runs whole pages or whole blocks, where the table has one.
std::optional<KernelConfig> heuristic_config(const ChoiceProblem& problem,
                                             const DeviceProperties& device);

// Whether forward() without a named config runs this problem on the split-KV kernels
// (forward_kvcache's path) instead of a KernelConfig's: decoding shapes, whose few query
// rows per K/V head leave the dense kernels one tile per (batch, head) and most SMs idle,
// unless they need the variant kernels (a window or softcap, which split-KV does not take)
// or, past decoding's few rows, the choice on `device` is a pack_gqa config.
bool runs_split_kv(const ChoiceProblem& problem, const DeviceProperties& device);

// The split-KV kernel's choice for a shape on `device` (serving.cpp): num_splits, else the
// tuning cache's count, else plan_splits' own.
KernelChoice split_kv_choice(const ProblemShape& shape, const DeviceProperties& device,
                             int num_splits);

// Tuning cache, then heuristic_config; nullopt when nothing fits.
std::optional<KernelConfig> find_kernel_for(const ChoiceProblem& problem,
                                            const DeviceProperties& device);

// find_kernel_for, or throws Error(unsupported) when nothing fits.
KernelConfig choose_kernel(const ChoiceProblem& problem, const DeviceProperties& device);

}  // namespace flash_attention
