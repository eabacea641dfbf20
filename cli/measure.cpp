#include "measure.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "common/cuda_check.hpp"

namespace flash_attention::cli {

Workspace::Workspace(const Shape& shape, std::uint64_t seed) : shape_(shape) {
    using reference::HostTensor;
    const HostTensor q = HostTensor::random_normal(shape.dtype, shape.batch, shape.seq_q,
                                                   shape.heads, shape.d_head, seed);
    const HostTensor k = HostTensor::random_normal(shape.dtype, shape.batch, shape.seq_k,
                                                   shape.heads_kv, shape.d_head, seed + 1);
    const HostTensor v = HostTensor::random_normal(shape.dtype, shape.batch, shape.seq_k,
                                                   shape.heads_kv, shape.d_head, seed + 2);
    // Enough copies that one slot's inputs are long evicted from L2 when it comes round
    // again: at least 4x the L2 size in total. At least 4 copies even when each exceeds
    // L2: one allocation can sit worse in DRAM than another, and with only two the
    // median lands between their two modes (seen at seq 4096 on the H100).
    constexpr int min_slots = 4;
    int device = 0;
    int l2_bytes = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    cuda_check(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device),
               "cudaDeviceGetAttribute(L2CacheSize)");
    const double slot_bytes = 2.0 * (2 * q.size() + k.size() + v.size());
    const int slots = std::clamp(static_cast<int>(4.0 * l2_bytes / slot_bytes) + 1, min_slots, 64);
    for (int s = 0; s < slots; ++s) {
        q_.push_back(DeviceTensor::upload(q));
        k_.push_back(DeviceTensor::upload(k));
        v_.push_back(DeviceTensor::upload(v));
        o_.push_back(DeviceTensor::empty_like(q));
    }
}

ForwardParams Workspace::params(int slot) const {
    ForwardParams p{q_[slot].view, k_[slot].view, v_[slot].view, o_[slot].view, shape_.scale};
    p.causal = shape_.causal;
    return p;
}

std::vector<Measurement> measure_interleaved(
    const std::vector<std::optional<KernelConfig>>& configs, const Workspace& workspace, int warmup,
    int runs, int rounds, bool (*stop)()) {
    int slot = 0;
    const auto launch = [&](const std::optional<KernelConfig>& config) {
        const ForwardParams params = workspace.params(slot++ % workspace.slots());
        if (config) {
            forward(params, *config);
        } else {
            forward(params);
        }
    };
    for (const auto& config : configs) {
        for (int i = 0; i < warmup; ++i)
            launch(config);
    }
    cuda_check(cudaDeviceSynchronize(), "warm-up");

    rounds = std::clamp(rounds, 1, runs);
    LaunchTimes timer((runs + rounds - 1) / rounds);
    std::vector<std::vector<double>> ms(configs.size());
    for (int round = 0; round < rounds && !stop(); ++round) {
        const int in_round = runs * (round + 1) / rounds - runs * round / rounds;
        // A fresh order each round, so no config always runs last or after the same one.
        std::vector<std::size_t> order(configs.size());
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(round)));
        for (const std::size_t c : order) {
            // Back to back: the GPU stays busy (and its clock steady) through the runs.
            for (int i = 0; i < in_round; ++i) {
                timer.before(i, nullptr);
                launch(configs[c]);
                timer.after(i, nullptr);
            }
            const std::vector<double> t = timer.elapsed_ms(in_round);
            ms[c].insert(ms[c].end(), t.begin(), t.end());
        }
    }
    std::vector<Measurement> out;
    for (std::size_t c = 0; c < configs.size() && !stop(); ++c) {
        const std::vector<double>& in_order = ms[c];
        std::vector<double> t = in_order;
        std::sort(t.begin(), t.end());
        const double median =
            t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
        const KernelConfig ran = configs[c] ? *configs[c] : choose_config(workspace.params(0));
        const Shape& shape = workspace.shape();
        const std::string automatic = "automatic choice (" + std::string(to_string(shape.dtype)) +
                                      ", d_head " + std::to_string(shape.d_head) + ")";
        out.push_back({configs[c] ? configs[c]->to_string() : automatic, ran, workspace.shape(),
                       median, t.front(), t.back(), static_cast<int>(t.size()), in_order});
    }
    return out;
}

}  // namespace flash_attention::cli
