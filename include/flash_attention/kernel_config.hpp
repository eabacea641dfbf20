#pragma once

#include <compare>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace flash_attention {

enum class DType : int { FP16, BF16 };

std::string_view to_string(DType dtype);
constexpr std::size_t element_bytes(DType) {
    return 2;
}

// Per-SM resources that bound how many CTAs of a kernel fit at once.
struct DeviceLimits {
    int smem_per_sm;           // bytes of shared memory per SM usable by CTAs
    int smem_per_block_optin;  // largest dynamic shared memory one CTA may ask for
    int reserved_smem_per_block;
    int max_threads_per_sm;
    int max_ctas_per_sm;

    static constexpr DeviceLimits a100() { return {167936, 166912, 1024, 2048, 32}; }
    static constexpr DeviceLimits h100() { return {233472, 232448, 1024, 2048, 32}; }
};

// Every knob of one compiled sm80-family forward kernel. A structural type, so a
// KernelConfig value is itself the template argument of the kernel it names.
//
// Short form: "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_2_2_2_tiles+buffer+opt_softmax"
// is (dtype, d_head, B_r, B_c, n_warps) followed by the enabled flags.
struct KernelConfig {
    DType dtype = DType::FP16;
    int d_head = 128;
    int B_r = 64;  // query rows per CTA
    int B_c = 64;  // key/value rows per main-loop iteration
    int n_warps = 4;
    bool async_copy = false;  // cp.async GMEM->SMEM instead of load + store through registers
    bool eager_load_blocks = false;  // prefetch the next K (V) block while computing on this one
    bool swizzled = false;           // XOR-swizzled SMEM rows instead of plain row-major
    // Fragments loaded SMEM->registers per step of the inner GEMM loop, in 16-wide k-tiles;
    // 0 loads the whole k extent at once (for Q: once per CTA, held across iterations).
    int Q_mma_load_K_tiles = 0;
    int K_mma_load_K_tiles = 0;
    int V_mma_load_K_tiles = 0;
    bool mma_double_buffer_loads = false;  // load step s+1's fragments before step s's MMAs
    bool optimized_softmax = false;        // scale folded into one FFMA per exp2, deferred row sums

    friend constexpr auto operator<=>(const KernelConfig&, const KernelConfig&) = default;

    constexpr int n_threads() const { return n_warps * 32; }
    constexpr int rows_per_warp() const { return n_warps > 0 ? B_r / n_warps : 0; }
    // Q, K and V tiles; O is staged through Q's buffer at the end.
    constexpr std::size_t smem_bytes() const {
        return static_cast<std::size_t>(B_r + 2 * B_c) * d_head * element_bytes(dtype);
    }

    // CTAs resident per SM as bounded by shared memory and threads (registers are
    // known only after compilation: the registry reports the device's own figure).
    int ctas_per_sm(const DeviceLimits& limits) const;

    std::string to_string() const;
    // Inverse of to_string(). Throws flash_attention::Error naming the offending token.
    static KernelConfig parse(std::string_view short_form);
};

}  // namespace flash_attention

template <>
struct std::hash<flash_attention::KernelConfig> {
    std::size_t operator()(const flash_attention::KernelConfig& c) const noexcept;
};
