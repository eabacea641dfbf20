#pragma once

// Timing kernels the way the benchmark rules ask: random inputs (never zeros),
// rotated among enough copies that L2 cannot hold them between runs, warm-up, then
// every run timed with CUDA events and the median reported with its spread.

#include <string>
#include <vector>

#include "common/device_buffer.hpp"
#include "flash_attention/flash_attention.hpp"

namespace flash_attention::cli {

struct Shape {
    DType dtype;
    int d_head;
    int batch;
    int heads;
    int seq_q;
    int seq_k;

    // 4 * batch * heads * seq_q * seq_k * d_head: two GEMMs of 2 * M * N * K each.
    double flop() const { return 4.0 * batch * heads * double(seq_q) * seq_k * d_head; }
    std::string to_string() const;
};

struct Measurement {
    KernelConfig config;
    Shape shape;
    double median_ms;
    double min_ms;
    double max_ms;
    int runs;

    double tflops() const { return shape.flop() / (median_ms * 1e-3) / 1e12; }
    // (max - min) / median: the run-to-run spread.
    double spread() const { return (max_ms - min_ms) / median_ms; }
};

// Device inputs for one shape, in `slots` copies whose total exceeds the L2 cache
// several times over, and one output per slot.
class Workspace {
  public:
    explicit Workspace(const Shape& shape, std::uint64_t seed);
    const Shape& shape() const { return shape_; }
    int slots() const { return static_cast<int>(q_.size()); }
    ForwardParams params(int slot) const;

  private:
    Shape shape_;
    std::vector<DeviceTensor> q_, k_, v_, o_;
};

// Times `config` on the workspace: `warmup` untimed runs, then `runs` timed runs,
// rotating through the slots.
Measurement measure(const KernelConfig& config, const Workspace& workspace, int warmup, int runs);

// Harmonic mean of TFLOP/s: the rate of running every shape once, each weighted equally
// by work (the seed's summary over sequence lengths).
double harmonic_mean_tflops(const std::vector<Measurement>& measurements);

}  // namespace flash_attention::cli
