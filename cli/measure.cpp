#include "measure.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "common/cuda_check.hpp"

namespace flash_attention::cli {

Workspace::Workspace(const Shape& shape, std::uint64_t seed) : shape_(shape) {
    using reference::HostTensor;
    const HostTensor q = HostTensor::random_normal(shape.dtype, shape.batch, shape.seq_q,
                                                   shape.heads, shape.d_head, seed);
    const HostTensor k = HostTensor::random_normal(shape.dtype, shape.batch, shape.seq_k,
                                                   shape.heads, shape.d_head, seed + 1);
    const HostTensor v = HostTensor::random_normal(shape.dtype, shape.batch, shape.seq_k,
                                                   shape.heads, shape.d_head, seed + 2);
    // Enough copies that one slot's inputs are long evicted from L2 when it comes round
    // again: at least 4x the L2 size in total, and at least 2 slots.
    int device = 0;
    int l2_bytes = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    cuda_check(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device),
               "cudaDeviceGetAttribute(L2CacheSize)");
    const double slot_bytes = 2.0 * (2 * q.size() + k.size() + v.size());
    const int slots = std::clamp(static_cast<int>(4.0 * l2_bytes / slot_bytes) + 1, 2, 64);
    for (int s = 0; s < slots; ++s) {
        q_.push_back(DeviceTensor::upload(q));
        k_.push_back(DeviceTensor::upload(k));
        v_.push_back(DeviceTensor::upload(v));
        o_.push_back(DeviceTensor::empty_like(q));
    }
}

ForwardParams Workspace::params(int slot) const {
    return {q_[slot].view, k_[slot].view, v_[slot].view, o_[slot].view, std::nullopt};
}

Measurement measure(const std::optional<KernelConfig>& config, const Workspace& workspace,
                    int warmup, int runs) {
    const auto launch = [&](int i) {
        const ForwardParams params = workspace.params(i % workspace.slots());
        if (config) {
            forward(params, *config);
        } else {
            forward(params);
        }
    };
    for (int i = 0; i < warmup; ++i)
        launch(i);
    cuda_check(cudaDeviceSynchronize(), "warm-up");
    EventTimer timer;
    std::vector<double> ms;
    for (int i = 0; i < runs; ++i) {
        timer.start(nullptr);
        launch(i);
        ms.push_back(timer.stop(nullptr));
    }
    std::sort(ms.begin(), ms.end());
    const double median =
        ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
    const KernelConfig ran = config ? *config : choose_config(workspace.params(0));
    return {config ? config->to_string() : "automatic choice",
            ran,
            workspace.shape(),
            median,
            ms.front(),
            ms.back(),
            runs};
}

}  // namespace flash_attention::cli
