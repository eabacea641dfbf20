#include "api/choice.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "registry/registry.hpp"
#include "tuning/tuning_cache.hpp"

namespace flash_attention {

namespace {

struct Preference {
    DType dtype;
    int d_head;
    const char* config;
    int max_seq = 0;  // only when max(seq_q, seq_k) is at most this (0: any length)
};

// Why these: on Hopper the sm90 family first: wgmma at 64 rows per consumer warpgroup,
// two consumers (three at d_head 64, where O and S leave room), a two-stage K/V
// pipeline, intra-warpgroup overlap, persistent CTAs and, where registers allow, Q held
// in registers (a third less shared-memory traffic for S = Q·Kᵀ: +3-4% at d_head 128).
// B_c 128 fills wgmma's N (25% faster than 64 at d_head 128); d_head 256 takes B_c 80, the
// widest key block whose O (128 registers), S and P fit 240 with two K/V stages (16% faster
// than B_c 64 at seq 8192: S's shared-memory operands no longer saturate shared memory).
// Up to 2048 keys one stage of B_c 128 with ping-pong measured 1-7% faster than B_c 80
// (a tile has few blocks, and each costs its fixed overheads once per 128 keys, not 80).
// The tunes of 2026-11-23 picked these (docs/PERF.md); the table skips them off Hopper.
// sm80: B_r = 128 with 4 warps gives each warp two m16 tiles, so every K and V
// fragment read from shared memory feeds two MMAs; with 16 rows per warp the
// ldmatrix traffic (about 170 B/clk/SM at H100 mma.sync rates) exceeds shared
// memory's 128 B/clk. One k-tile per step, double-buffered, is the largest fragment
// step that keeps O (128 fp32 registers at d_head 128) and S within 255 registers.
// Measured results are in docs/PERF.md; the tuning cache overrides this table.
constexpr Preference k_table[] = {
    {DType::BF16, 128, "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg"},
    {DType::FP16, 128, "(FP16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg"},
    {DType::BF16, 64, "(BF16, 64, 192, 64, 16): sm90+stages_3+overlap+pingpong+persistent+qreg"},
    {DType::FP16, 64, "(FP16, 64, 192, 64, 16): sm90+stages_3+overlap+pingpong+persistent+qreg"},
    {DType::BF16, 256, "(BF16, 256, 128, 128, 12): sm90+stages_1+pingpong+persistent", 2048},
    {DType::FP16, 256, "(FP16, 256, 128, 128, 12): sm90+stages_1+pingpong+persistent", 2048},
    {DType::BF16, 256, "(BF16, 256, 128, 80, 12): sm90+stages_2+overlap+persistent"},
    {DType::FP16, 256, "(FP16, 256, 128, 80, 12): sm90+stages_2+overlap+persistent"},
    {DType::BF16, 128,
     "(BF16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    {DType::FP16, 128,
     "(FP16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    {DType::BF16, 64,
     "(BF16, 64, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
    {DType::FP16, 64,
     "(FP16, 64, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"},
};

}  // namespace

bool can_run(const KernelConfig& c, const ForwardParams& p, const DeviceInfo& device) {
    return c.dtype == p.q.dtype && c.d_head == p.q.shape[3] && device_problem(c, device).empty() &&
           (c.family != Family::sm90 || tma_problem(p).empty());
}

std::optional<KernelConfig> heuristic_config(const ForwardParams& p, const DeviceInfo& device) {
    // Parsed once: this runs on every forward() that has no tuned entry.
    static const std::vector<KernelConfig> table = [] {
        std::vector<KernelConfig> v;
        for (const Preference& pref : k_table)
            v.push_back(KernelConfig::parse(pref.config));
        return v;
    }();
    const std::int64_t seq = std::max(p.q.shape[1], p.k.shape[1]);
    for (std::size_t i = 0; i < table.size(); ++i) {
        const int max_seq = k_table[i].max_seq;
        if ((max_seq == 0 || seq <= max_seq) && can_run(table[i], p, device))
            return table[i];
    }
    std::vector<KernelConfig> candidates;
    for (const KernelConfig& c : configs()) {
        if (can_run(c, p, device))
            candidates.push_back(c);
    }
    if (candidates.empty())
        return std::nullopt;
    // Larger tiles reuse each K/V byte loaded from memory across more query rows.
    std::stable_sort(
        candidates.begin(), candidates.end(),
        [](const KernelConfig& a, const KernelConfig& b) { return a.B_r * a.B_c > b.B_r * b.B_c; });
    return candidates.front();
}

KernelConfig choose_kernel(const ForwardParams& p, const DeviceInfo& device) {
    const tuning::Key key{device.name,
                          device.sm_count,
                          p.q.dtype,
                          static_cast<int>(p.q.shape[3]),
                          tuning::seq_bucket(p.q.shape[1], p.k.shape[1]),
                          p.causal};
    // A cached config this build lacks, or one that does not divide these lengths, is
    // skipped: a stale cache costs speed, never a failure.
    if (const auto tuned = tuning::lookup(key); tuned && can_run(*tuned, p, device))
        return *tuned;
    if (const auto c = heuristic_config(p, device))
        return *c;
    throw Error(ErrorCode::unsupported,
                "q: expected a dtype and d_head that a built kernel handles (kernel set \"" +
                    std::string(built_kernel_set()) + "\"; see flash_attention list), got " +
                    std::string(to_string(p.q.dtype)) + " d_head " + std::to_string(p.q.shape[3]));
}

}  // namespace flash_attention
