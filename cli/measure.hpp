#pragma once

// Timing kernels the way the benchmark rules ask: random inputs (never zeros),
// rotated among enough copies that L2 cannot hold them between runs, warm-up, then
// every run timed with CUDA events and the median reported with its spread.

#include <cstdint>
#include <optional>
#include <vector>

#include "common/device_buffer.hpp"
#include "flash_attention/flash_attention.hpp"
#include "measurement.hpp"

namespace flash_attention::cli {

// Device inputs for one shape, in as many copies as it takes to exceed the L2 cache
// four times over, and one output per copy.
class Workspace {
  public:
    Workspace(const Shape& shape, std::uint64_t seed);
    const Shape& shape() const { return shape_; }
    int slots() const { return static_cast<int>(q_.size()); }
    ForwardParams params(int slot) const;

  private:
    Shape shape_;
    std::vector<DeviceTensor> q_, k_, v_, o_;
};

// Times each config (nullopt: the automatic choice, through forward(params, stream)) on
// one workspace: `warmup` untimed runs each, then `runs` timed runs each, interleaved in
// `rounds` rounds; within a round a config's runs are queued back to back, each between
// its own pair of events. A long sweep heats the GPU and its clock drifts down; interleaving
// spreads that drift over every config instead of charging it to the last ones. Returns
// one measurement per config, in order; stops early (fewer results) once `stop()` is true.
std::vector<Measurement> measure_interleaved(
    const std::vector<std::optional<KernelConfig>>& configs, const Workspace& workspace, int warmup,
    int runs, int rounds, bool (*stop)());

}  // namespace flash_attention::cli
