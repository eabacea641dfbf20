#pragma once

// One problem of `run`, `bench` and `tune` through the entry point its shape names
// (forward, forward_kvcache, forward_varlen): random inputs built on the host, uploaded,
// run as a candidate kernel, and checked against the double-precision reference.

#include <cstdint>
#include <optional>
#include <vector>

#include "flash_attention/flash_attention.hpp"
#include "flash_attention/tools.hpp"
#include "measurement.hpp"

namespace flash_attention::cli {

using tools::DeviceBuffer;
using tools::DeviceTensor;
using tools::LaunchTimes;

// What to run: a config (forward() only), the split-KV kernel with `splits` key ranges
// per sequence (forward_kvcache and forward_varlen only), or neither: the library's
// automatic choice.
struct Candidate {
    std::optional<KernelConfig> config;
    int splits = 0;

    Candidate() = default;
    Candidate(std::nullopt_t) {}
    Candidate(const KernelConfig& c) : config(c) {}
    static Candidate with_splits(int n) {
        Candidate c;
        c.splits = n;
        return c;
    }
    bool automatic() const { return !config && splits == 0; }
};

// The inputs of a shape on the host. q, k and v are the problem as the reference sees it:
// (batch, seq, heads, d_head), or for varlen the packed (1, total, heads, d_head).
struct HostProblem {
    reference::HostTensor q, k, v;
    // Paged caches: k and v as (pages, page_size, heads_kv, d_head), pages in a random
    // order, and the block table (batch, pages per sequence).
    std::optional<reference::HostTensor> k_pages, v_pages;
    std::vector<std::int32_t> block_table;
    // kvcache: cache_seqlens (every sequence uses all seq_k keys); varlen: the offsets
    // cu_seqlens (batch + 1) of varlen_lengths(shape), for queries and keys alike.
    std::vector<std::int32_t> seqlens;
    // Shape::sinks: one per query head, normal with a spread of 3; empty otherwise.
    std::vector<float> sinks;
    // Shape::alibi: one slope per query head (2^(-8 (h + 1) / heads)); empty otherwise.
    std::vector<float> alibi_slopes;
    // Shape::backward: dO, q's shape, standard normal.
    std::optional<reference::HostTensor> d_o;
    // E4M3 (FP8): the descales of q, k and v, one per (batch entry, K/V head), uniform in
    // [0.5, 2]; empty otherwise.
    std::vector<float> q_descale, k_descale, v_descale;

    static HostProblem random(const Shape& shape, std::uint64_t seed);
};

// dQ, dK and dV as a backward run left them.
struct Gradients {
    reference::HostTensor dq, dk, dv;
};

// A device copy of a HostProblem with its output, poisoned with NaN. A backward shape's also
// holds dO, the forward's output and LSE (the automatic choice's forward, run when it is
// built) and the gradients.
class DeviceProblem {
  public:
    DeviceProblem(const Shape& shape, const HostProblem& host);
    // Device bytes such a problem takes.
    static std::size_t bytes(const Shape& shape);

    // Runs the candidate through the shape's entry point (UsageError for a candidate that
    // entry point does not take); `lse` optional. A backward shape: backward() with the
    // candidate's config or the automatic choice.
    void launch(const Candidate& candidate, float* lse = nullptr) const;
    // The kernel launch() runs.
    KernelChoice kernel(const Candidate& candidate) const;
    reference::HostTensor download_output(const HostProblem& host) const;
    Gradients download_gradients(const HostProblem& host) const;

  private:
    // FP8 problems' descales (device copies of the host's), else none.
    std::optional<Fp8Descales> descales() const;
    ForwardParams dense_params(float* lse) const;
    KVCacheParams kvcache_params(int splits, float* lse) const;
    VarlenParams varlen_params(int splits, float* lse) const;
    BackwardParams backward_params() const;
    AttentionOptions options(float* lse) const;

    Shape shape_;
    DeviceTensor q_, k_, v_, o_;
    DeviceBuffer seqlens_, table_, sinks_, alibi_;
    DeviceBuffer q_descale_, k_descale_, v_descale_;  // E4M3
    // Shape::backward.
    DeviceBuffer forward_lse_;
    std::optional<DeviceTensor> d_o_, dq_, dk_, dv_;
    std::int64_t pages_per_seq_ = 0;
    std::int32_t longest_ = 1;  // varlen: the longest sequence drawn
};

// A backward shape's gradients against the reference on up to rows_per_head sampled query
// rows per (batch, head) and key rows per (batch, K/V head).
reference::BackwardCheck check_gradients(const Shape& shape, const HostProblem& host,
                                         const Gradients& gradients, int rows_per_head,
                                         std::uint64_t seed);

// The output (and the LSE, in the entry point's layout) against the reference on up to
// rows_per_head sampled query rows per (sequence, head); varlen checks each sequence.
reference::CheckResult check_output(const Shape& shape, const HostProblem& host,
                                    const reference::HostTensor& out, const std::vector<float>* lse,
                                    int rows_per_head, std::uint64_t seed);

}  // namespace flash_attention::cli
