#pragma once

#include <compare>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace flash_attention {

enum class DType : int { FP16, BF16 };

std::string_view to_string(DType dtype);

// Kernel families: sm80 (mma.sync, ldmatrix, cp.async; Ampere and later) and sm90
// (TMA, wgmma, warp specialisation; sm_90a machine code, so Hopper only).
enum class Family : int { sm80, sm90 };

std::string_view to_string(Family family);
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

// Every knob of one compiled forward kernel. A structural type, so a KernelConfig value
// is itself the template argument of the kernel it names.
//
// Short form: (dtype, d_head, B_r, B_c, n_warps) followed by the enabled flags.
//   sm80: "(FP16, 128, 64, 64, 4): async+eager+swizzled+load_2_2_2_tiles+buffer+opt_softmax"
//   sm90: "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+pingpong+persistent"
// An sm90 kernel has one producer warpgroup (TMA) and n_warps / 4 - 1 consumer
// warpgroups of 64 query rows each, so B_r = 64 * consumer warpgroups.
struct KernelConfig {
    Family family = Family::sm80;
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
    // sm90 knobs (0/false for sm80).
    int stages = 0;  // K/V tiles in flight: the depth of the TMA pipeline
    // Issue S_{j+1} = Q·K_{j+1}ᵀ before O += P_j·V_j so the softmax of one block overlaps
    // the GEMMs of the next within a warpgroup.
    bool intra_warpgroup_overlap = false;
    // Consumer warpgroups take turns issuing GEMMs, so one's softmax overlaps another's GEMMs.
    bool pingpong = false;
    // One CTA per SM loops over tiles: the next tile's K/V stream in during this tile's
    // epilogue, and no CTA launch separates them.
    bool persistent = false;
    // Q as register fragments for S = Q·Kᵀ (wgmma with A from registers): shared memory
    // then serves only K to that GEMM, a third less traffic, for d_head / 4 registers.
    bool q_in_registers = false;

    friend constexpr auto operator<=>(const KernelConfig&, const KernelConfig&) = default;

    constexpr int n_threads() const { return n_warps * 32; }
    constexpr int rows_per_warp() const { return n_warps > 0 ? B_r / n_warps : 0; }
    constexpr int consumer_warpgroups() const {
        return family == Family::sm90 ? n_warps / 4 - 1 : 0;
    }
    // sm90: registers per consumer thread after setmaxnreg. The producer warpgroup drops
    // to 24, and 64K registers are shared by 128 * (1 + consumer warpgroups) threads.
    constexpr int consumer_registers() const { return consumer_warpgroups() >= 3 ? 160 : 240; }
    // Q, K and V tiles (sm90: `q_buffers()` Q tiles, `stages` K and V tiles, 1024 bytes to
    // align the tiles to the 128-byte swizzle's 1024-byte period, and the pipeline's
    // mbarriers); O is staged through Q's buffer at the end.
    constexpr std::size_t smem_bytes() const {
        if (family == Family::sm90)
            return sm90_smem_bytes(q_buffers());
        return (static_cast<std::size_t>(B_r) + 2 * static_cast<std::size_t>(B_c)) *
               static_cast<std::size_t>(d_head) * element_bytes(dtype);
    }
    // sm90: a persistent kernel loads the next tile's Q into a second buffer while this
    // tile computes and stores its O, when an H100 has the shared memory for it.
    constexpr int q_buffers() const {
        return family == Family::sm90 && persistent &&
                       sm90_smem_bytes(2) <=
                           static_cast<std::size_t>(DeviceLimits::h100().smem_per_block_optin)
                   ? 2
                   : 1;
    }

    // CTAs resident per SM as bounded by shared memory and threads, and for sm90 by its
    // register reallocation (one CTA); sm80 registers are known only after compilation:
    // the registry reports the device's own figure.
    int ctas_per_sm(const DeviceLimits& limits) const;

    std::string to_string() const;

  private:
    constexpr std::size_t sm90_smem_bytes(int q_tiles) const {
        const std::size_t n_stages = stages > 0 ? static_cast<std::size_t>(stages) : 0;
        return (q_tiles * static_cast<std::size_t>(B_r) +
                2 * n_stages * static_cast<std::size_t>(B_c)) *
                   static_cast<std::size_t>(d_head) * element_bytes(dtype) +
               1024 + 8 * (2 * static_cast<std::size_t>(q_tiles) + 4 * n_stages);
    }

  public:
    // Inverse of to_string(). Throws flash_attention::Error naming the offending token.
    static KernelConfig parse(std::string_view short_form);
};

}  // namespace flash_attention

template <>
struct std::hash<flash_attention::KernelConfig> {
    std::size_t operator()(const flash_attention::KernelConfig& c) const noexcept;
};
