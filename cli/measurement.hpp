#pragma once

// What a benchmark measured: plain data, formatted by report.hpp.

#include <optional>
#include <string>
#include <vector>

#include "flash_attention/flash_attention.hpp"

namespace flash_attention::cli {

struct Shape {
    DType dtype;
    int d_head;
    int batch;
    int heads;
    int seq_q;
    int seq_k;
    int heads_kv;  // of K and V; divides heads
    bool causal;
    std::optional<float> scale;  // softmax scale; default 1/sqrt(d_head)

    // 4 * batch * heads * seq_q * seq_k * d_head (two GEMMs of 2 * M * N * K each),
    // halved with causal masking, by the usual convention.
    double flop() const {
        return 4.0 * batch * heads * double(seq_q) * seq_k * d_head / (causal ? 2 : 1);
    }
    ProblemShape problem() const {
        return {dtype, d_head, batch, seq_q, seq_k, heads, heads_kv, causal};
    }
    friend auto operator<=>(const Shape&, const Shape&) = default;
};

struct Measurement {
    std::string label;    // the config's short form, or "automatic choice (BF16, d_head 128)"
    KernelConfig config;  // the kernel that ran
    Shape shape;
    double median_ms;
    double min_ms;
    double max_ms;
    int runs;
    std::vector<double> times_ms;  // every timed run, in the order they ran

    // From the timed runs in the order they ran: their median, min and max.
    static Measurement of(std::string label, const KernelConfig& config, const Shape& shape,
                          std::vector<double> times_ms);

    double tflops() const { return shape.flop() / (median_ms * 1e-3) / 1e12; }
    // (max - min) / median: the run-to-run spread.
    double spread() const { return (max_ms - min_ms) / median_ms; }
};

// Harmonic mean of TFLOP/s: the rate of running every shape once with equal work (the
// seed's summary over sequence lengths).
double harmonic_mean_tflops(const std::vector<Measurement>& measurements);

}  // namespace flash_attention::cli
