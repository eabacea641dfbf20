#pragma once

// What a benchmark measured: plain data, formatted by report.hpp.

#include <optional>
#include <string>
#include <vector>

#include "flash_attention/flash_attention.hpp"

namespace flash_attention::cli {

// The entry point a problem goes through: forward() on dense tensors; forward_kvcache on
// a cache of batch x seq_k keys (contiguous, or in pages of page_size rows in a random
// order); forward_varlen on `batch` packed sequences of random lengths from 1 to seq_q
// (varlen_lengths), each with as many keys as queries.
enum class Api { dense, kvcache, varlen };

struct Shape {
    DType dtype;
    int d_head;
    int batch;
    int heads;
    int seq_q;  // varlen: the longest sequence
    int seq_k;
    int heads_kv;  // of K and V; divides heads
    bool causal;
    std::optional<float> scale;  // softmax scale; default 1/sqrt(d_head)
    Api api = Api::dense;
    int page_size = 0;  // kvcache: 0 contiguous, else the rows of a page
    // The attention variants (Variants): a sliding window (-1: unbounded), a softcap (0:
    // off), random sinks per query head, ALiBi with the standard slopes.
    int window_left = -1;
    int window_right = -1;
    float softcap = 0;
    bool sinks = false;
    bool alibi = false;
    // The backward pass (dense, no variants): dQ, dK and dV of the forward's output.
    bool backward = false;
    // V's and O's head dim where it differs from d_head (ProblemShape::d_v), else 0.
    int d_v = 0;
    int v_head_dim() const { return d_v != 0 ? d_v : d_head; }

    // 4 * heads * d_head * (query, key) pairs (two GEMMs of 2 * M * N * K each). Dense:
    // batch * seq_q * seq_k pairs, halved with causal masking by the usual convention.
    // kvcache and varlen: the pairs each row sees (bottom-right causal), as bench/serving.py.
    // With a sliding window: the pairs each row sees. The backward pass counts 2.5x the
    // forward's (five GEMMs against two, FlashAttention's convention).
    double flop() const;
    // Bytes of K and V the keys take (each read once by a decoding kernel).
    double kv_bytes() const;
    // What the automatic choice sees: varlen's longest sequence, a cache's length.
    ProblemShape problem() const {
        return {dtype,    d_head, batch,
                seq_q,    seq_k,  heads,
                heads_kv, causal, window_left != -1 || window_right != -1 || softcap != 0 || alibi,
                d_v};
    }
    friend auto operator<=>(const Shape&, const Shape&) = default;
};

// The lengths of a varlen shape's sequences: uniform in [1, seq_q], the same for every
// call with this shape (a fixed seed), so a measurement's FLOPs can be recomputed.
std::vector<int> varlen_lengths(const Shape& shape);

// "dense", "kvcache", "paged 16" or "varlen".
std::string api_name(const Shape& shape);

struct Measurement {
    std::string label;    // the config's short form, or "automatic choice (BF16, d_head 128)"
    KernelChoice kernel;  // the kernel that ran
    Shape shape;
    double median_ms;
    double min_ms;
    double max_ms;
    int runs;
    std::vector<double> times_ms;  // every timed run, in the order they ran

    // From the timed runs in the order they ran: their median, min and max.
    static Measurement of(std::string label, const KernelChoice& kernel, const Shape& shape,
                          std::vector<double> times_ms);

    double tflops() const { return shape.flop() / (median_ms * 1e-3) / 1e12; }
    double kv_tbps() const { return shape.kv_bytes() / (median_ms * 1e-3) / 1e12; }
    // (max - min) / median: the run-to-run spread.
    double spread() const { return (max_ms - min_ms) / median_ms; }
};

// Harmonic mean of TFLOP/s: the rate of running every shape once with equal work (the
// seed's summary over sequence lengths).
double harmonic_mean_tflops(const std::vector<Measurement>& measurements);

}  // namespace flash_attention::cli
