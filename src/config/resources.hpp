#pragma once

// What a config asks of a GPU: shared memory, registers, CTAs per SM, and the limits of
// the devices the config space is built for. Host and device code (the kernels' traits
// check their layouts against these formulas); not part of the public API.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "flash_attention/kernel_config.hpp"

namespace flash_attention {

// Per-SM resources that bound how many CTAs of a kernel fit at once.
struct DeviceLimits {
    int smem_per_sm;           // bytes of shared memory per SM usable by CTAs
    int smem_per_block_optin;  // largest dynamic shared memory one CTA may ask for
    int reserved_smem_per_block;
    int max_threads_per_sm;
    int max_ctas_per_sm;
    int l2_bytes;

    static constexpr DeviceLimits a100() { return {167936, 166912, 1024, 2048, 32, 40 << 20}; }
    static constexpr DeviceLimits h100() { return {233472, 232448, 1024, 2048, 32, 50 << 20}; }
};

// sm90: a tile's swizzle, 128 bytes (64-column sub-tiles) where d is whole such sub-tiles, else
// 64 bytes (32-column sub-tiles: d_head 96 with no padding, so that the GEMMs whose N is d
// (P·V; the backward's dV, dK and dQ) compute 96 columns, not 128). Both passes.
constexpr int tile_swizzle_bytes(int d) {
    return d % 64 == 0 ? 128 : 64;
}
// sm90: the columns of a tile of d head columns, whole sub-tiles of its swizzle.
constexpr int tile_columns(int d) {
    const int sub_tile = tile_swizzle_bytes(d) / 2;
    return (d + sub_tile - 1) / sub_tile * sub_tile;
}

// sm90: one producer warpgroup, the rest consume (64 query rows each).
constexpr int consumer_warpgroups(const KernelConfig& c) {
    return c.family == Family::sm90 ? c.n_warps / 4 - 1 : 0;
}

// The sm90 backward with every consumer on the CTA's 64 keys (d_head 256, whose dK and dV no
// consumer can hold whole): each computes the scores of its share of a step's queries and holds
// dK and dV for its share of d_head's columns; Pᵀ and dSᵀ are shared through shared memory.
constexpr bool sm90_backward_split_head(const KernelConfig& c) {
    return c.B_c == 64 && consumer_warpgroups(c) > 1;
}
// The same with the gradients split instead of the columns (d_head 192, and 192 with V's 128):
// half of 192 columns would start a consumer's mid-way through a 128-byte swizzle atom (64
// columns), which an MN-major wgmma operand cannot, so consumer 0 holds dK and consumer 1 dV,
// each over every column.
constexpr bool sm90_backward_split_gradients(const KernelConfig& c) {
    return sm90_backward_split_head(c) && tile_columns(c.d_head) % 128 != 0;
}

// The sm90 backward's dQ = dS·K split over two consumers of 64 keys by columns where B_r is one
// 64-row group and d_head's tiles are not whole 64-column sub-tiles (96): an MN-major wgmma
// operand's N is whole swizzle atoms (32 columns at 96), so the columns go 64 + 32 rather than
// 48 + 48, each consumer's GEMM compiled for its share.
constexpr bool sm90_backward_uneven_dq(const KernelConfig& c) {
    return !sm90_backward_split_head(c) && consumer_warpgroups(c) == 2 && c.B_r == 64 &&
           tile_columns(c.d_head) % 64 == 32;
}

// sm90: registers per consumer thread after setmaxnreg. The producer warpgroup drops
// to 24, and 64K registers are shared by 128 * (1 + consumer warpgroups) threads.
constexpr int consumer_registers(const KernelConfig& c) {
    return consumer_warpgroups(c) >= 3 ? 160 : 240;
}

namespace detail {
// sm90: the full/empty mbarrier pairs of `q_tiles` Q buffers. A persistent CTA with one
// buffer has a pair per consumer (its 64 rows): each consumer's next Q then loads once its
// own last S GEMM (or O store) is done with its rows, not the slowest consumer's. d_head
// 256's consumers waited for the next tile's Q (a probe that skipped the copy ran 2.4-2.5%
// faster at 1k-2k keys); the pairs gained 0.5-2% at 512-16k (H200, docs/PERF.md, 2026-11-28).
constexpr int sm90_q_barrier_pairs(const KernelConfig& c, int q_tiles) {
    return c.sm90.persistent && q_tiles == 1 ? consumer_warpgroups(c) : q_tiles;
}

// sm90: `q_tiles` Q tiles, `stages` K and V tiles (rows of d_head and of v_head_dim()
// columns, tile_columns()), 1024 bytes to align the tiles to the swizzle's period (at most
// 1024 bytes), the pipeline's mbarriers, with the dynamic schedule each Q buffer's tile index
// and its barrier (16 bytes, padded), with `o_apart` one consumer's O staging region (64 rows
// of the output's dtype: bf16 for E4M3 inputs) and its barrier, and with p_in_smem a P tile a
// consumer. E4M3's tiles hold a byte an element, V's transposed copy (d_v rows of B_c keys) as
// many bytes as a V tile; with transpose_v each stage also holds V's block as loaded (a staging
// tile as large), and a full/empty pair of mbarriers and an end word (8 bytes) a stage follow.
constexpr std::size_t sm90_smem_bytes(const KernelConfig& c, int q_tiles, bool o_apart = false) {
    const std::size_t n_stages = c.sm90.stages > 0 ? static_cast<std::size_t>(c.sm90.stages) : 0;
    const std::size_t q = static_cast<std::size_t>(q_tiles);
    const std::size_t q_pairs = static_cast<std::size_t>(sm90_q_barrier_pairs(c, q_tiles));
    const std::size_t row_bytes =
        static_cast<std::size_t>(tile_columns(c.d_head)) * element_bytes(c.dtype);
    const std::size_t v_row_bytes =
        static_cast<std::size_t>(tile_columns(c.v_head_dim())) * element_bytes(c.dtype);
    // p_in_smem: each consumer's P tile (64 rows x B_c).
    const std::size_t p_tiles = c.sm90.p_in_smem
                                    ? static_cast<std::size_t>(consumer_warpgroups(c)) * 64 *
                                          static_cast<std::size_t>(c.B_c) * element_bytes(c.dtype)
                                    : 0;
    return q * static_cast<std::size_t>(c.B_r) * row_bytes +
           n_stages * static_cast<std::size_t>(c.B_c) * (row_bytes + v_row_bytes) + 1024 +
           8 * (2 * q_pairs + 4 * n_stages) + (c.sm90.dynamic_schedule ? 16 * q : 0) +
           (o_apart ? 64 * static_cast<std::size_t>(tile_columns(c.v_head_dim())) * 2 + 8 : 0) +
           p_tiles +
           (c.sm90.transpose_v ? n_stages * (static_cast<std::size_t>(c.B_c) * v_row_bytes + 24)
                               : 0);
}
}  // namespace detail

// sm90: a persistent kernel loads the next tile's Q into a second buffer while this
// tile computes and stores its O, when an H100 has the shared memory for it.
constexpr int q_buffers(const KernelConfig& c) {
    return c.family == Family::sm90 && c.sm90.persistent &&
                   detail::sm90_smem_bytes(c, 2) <=
                       static_cast<std::size_t>(DeviceLimits::h100().smem_per_block_optin)
               ? 2
               : 1;
}

// sm90: a persistent kernel with one Q buffer stages O in a region of its own, one
// consumer's 64 rows that the consumers take in turn, when an H100 has the shared memory
// for it: the buffer then goes back to the producer after the tile's last S GEMM, and the
// next tile's Q loads during the last P·V and the epilogue instead of after them. Two
// consumers at most: the turns pass through one mbarrier whose phase parity a consumer waits
// on, which names the phase it means only while the barrier is at most one phase behind; a
// third consumer can find it two behind (its own last use, then the other two's) and pass
// at once, staging over another's O (wrong results and a hang, d_head 192 at 192 x 64 with
// psmem, H100, 2026-12-06). Never for FP8 (E4M3), whose kernels store their bf16 O from registers:
// its region (64 rows of bf16) is as large as a second Q buffer of 128 rows of bytes.
constexpr bool o_staged_apart(const KernelConfig& c) {
    return c.family == Family::sm90 && c.dtype != DType::E4M3 && c.sm90.persistent &&
           q_buffers(c) == 1 && consumer_warpgroups(c) <= 2 &&
           detail::sm90_smem_bytes(c, 1, true) <=
               static_cast<std::size_t>(DeviceLimits::h100().smem_per_block_optin);
}

// sm90: Q's full/empty mbarrier pairs (detail::sm90_q_barrier_pairs()).
constexpr int q_barrier_pairs(const KernelConfig& c) {
    return detail::sm90_q_barrier_pairs(c, q_buffers(c));
}

// The backward kernels (sm80/backward_kernel.cuh), 16-bit tiles: the dK/dV kernel holds its K
// and V block (B_c rows), a Q and a dO tile (B_r rows), Pᵀ and dSᵀ (B_c x B_r) and the Q
// tile's LSE and D (fp32); the dQ kernel its Q and dO tile, a K and a V block and dS. Q and K
// rows have d_head columns, V and dO rows v_head_dim().
constexpr std::size_t backward_dkdv_smem_bytes(const KernelConfig& c) {
    const auto r = static_cast<std::size_t>(c.B_r), k = static_cast<std::size_t>(c.B_c);
    const auto d = static_cast<std::size_t>(c.d_head) + static_cast<std::size_t>(c.v_head_dim());
    return 2 * ((r + k) * d + 2 * k * r) + 8 * r;
}
constexpr std::size_t backward_dq_smem_bytes(const KernelConfig& c) {
    const auto r = static_cast<std::size_t>(c.B_r), k = static_cast<std::size_t>(c.B_c);
    const auto d = static_cast<std::size_t>(c.d_head) + static_cast<std::size_t>(c.v_head_dim());
    return 2 * ((r + k) * d + k * r);
}

// The sm90 backward kernel (sm90/backward_kernel.cuh), one struct: its B_c keys' K and V (64 a
// consumer, or d_head 192's and 256's 64 shared; V of v_head_dim() columns), `stages` Q and dO
// tiles of B_r queries (dO of V's columns), two dS tiles (B_r x B_c; with split_head two P tiles
// beside them), dQ's fp32 staging (B_r x tile_columns(d_head)), two steps' LSE
// and D rows (fp32; lag_dq: a stage's) and the mbarriers (K and V full and, for a persistent CTA's
// next tile, empty; the dynamic schedule's ring of two key-block indices with theirs), rounded up
// to the struct's 1024-byte alignment; 1024 bytes more to align it (the 128-byte swizzle's period).
constexpr std::size_t sm90_backward_smem_bytes(const KernelConfig& c) {
    const auto r = static_cast<std::size_t>(c.B_r), k = static_cast<std::size_t>(c.B_c);
    const auto d = static_cast<std::size_t>(tile_columns(c.d_head));
    const auto dv = static_cast<std::size_t>(tile_columns(c.v_head_dim()));
    const auto stages = static_cast<std::size_t>(c.sm90.stages > 0 ? c.sm90.stages : 0);
    const std::size_t score_tiles = sm90_backward_split_head(c) ? 2 : 1;
    // The statistics: lag_dq, a step's in its Q stage (and four mbarriers); otherwise two
    // copies alternating by step.
    const std::size_t stats_buffers = c.sm90.lag_dq ? stages : 2;
    const std::size_t bytes = 2 * (k * (d + dv) + stages * r * (d + dv) + 2 * score_tiles * k * r) +
                              4 * r * d + 8 * r * stats_buffers + 8 * (2 + 4 * stages) +
                              (c.sm90.lag_dq ? 32 : 0) + (c.sm90.dynamic_schedule ? 40 : 0);
    return (bytes + 1023) / 1024 * 1024 + 1024;
}

// A backward call's workspace besides its tensors, in one allocation: D per query row and head
// (sm80 and sm90), the LSE in base 2 and dQ's fp32 accumulator (sm90, tile_columns(d_head) a row),
// and with ordered_dq a semaphore per 64 query rows. The sm90 family's rows are padded to whole
// blocks of 128 queries a head, so that every query block's rows start 16-byte aligned for its bulk
// copies; 4-byte elements, each array's offset a multiple of 2 of them at least.
struct BackwardWorkspace {
    std::int64_t q_rows;  // rows a (batch, head)
    std::size_t d_floats, lse2_floats, dq_floats, semaphores;
    std::size_t counters = 0;  // persistent dynamic: the tile counter (and one of padding)
    // Each array's offset in the allocation, in 4-byte elements: D, the LSE, dQ's accumulator,
    // the semaphores, the counters.
    constexpr std::size_t lse2_offset() const { return d_floats; }
    constexpr std::size_t dq_offset() const { return lse2_offset() + lse2_floats; }
    constexpr std::size_t semaphore_offset() const { return dq_offset() + dq_floats; }
    constexpr std::size_t counter_offset() const { return semaphore_offset() + semaphores; }
    constexpr std::size_t bytes() const { return (counter_offset() + counters) * 4; }
};
// Query rows the workspace gives a sequence a whole multiple of (BackwardArgs::q_block): sm90's
// blocks of up to 128 queries read their rows in whole blocks.
constexpr std::int64_t backward_q_block(const KernelConfig& c) {
    return c.family == Family::sm90 ? 128 : 1;
}
// A packed call's semaphore rows a sequence (BackwardArgs::semaphore_rows): the longest
// sequence's in whole blocks of 128.
constexpr std::int64_t backward_semaphore_rows(std::int64_t max_seqlen_q) {
    return (max_seqlen_q + 127) / 128 * 128;
}
// `entries` (batch entries) x heads x q_rows rows.
constexpr BackwardWorkspace backward_workspace_rows(const KernelConfig& c, std::int64_t entries,
                                                    std::int64_t heads, std::int64_t q_rows) {
    const bool sm90 = c.family == Family::sm90;
    const auto rows = static_cast<std::size_t>(entries * heads * q_rows);
    return {q_rows,
            rows,
            sm90 ? rows : 0,
            sm90 ? rows * static_cast<std::size_t>(tile_columns(c.d_head)) : 0,
            sm90 && c.sm90.ordered_dq ? rows / 64 : 0,
            sm90 && c.sm90.dynamic_schedule ? std::size_t{2} : 0};
}
constexpr BackwardWorkspace backward_workspace(const KernelConfig& c, std::int64_t batch,
                                               std::int64_t heads, std::int64_t seq_q) {
    const std::int64_t block = backward_q_block(c);
    return backward_workspace_rows(c, batch, heads, (seq_q + block - 1) / block * block);
}
// Packed sequences (backward_varlen): one entry whose rows give each of `batch` sequences its
// own whole blocks (BackwardSequence: sequence b from (cu_seqlens_q[b] / block + b) block, which
// ends by total_q + batch blocks).
// Ordered dQ's semaphores are per sequence (BackwardSequence::semaphore): batch x heads x the
// longest sequence's blocks.
constexpr BackwardWorkspace backward_workspace_varlen(const KernelConfig& c, std::int64_t batch,
                                                      std::int64_t heads, std::int64_t total_q,
                                                      std::int64_t max_seqlen_q) {
    const std::int64_t block = backward_q_block(c);
    BackwardWorkspace w =
        backward_workspace_rows(c, 1, heads, (total_q + batch * block + block - 1) / block * block);
    if (w.semaphores > 0) {
        w.semaphores =
            static_cast<std::size_t>(batch * heads * backward_semaphore_rows(max_seqlen_q) / 64);
    }
    return w;
}

// Dynamic shared memory of one CTA: Q, K and V tiles (sm90: see sm90_smem_bytes); O is
// staged through Q's buffer at the end (sm90: or apart, o_staged_apart()), which holds it
// since v_head_dim() <= d_head. A backward config: its main kernel's (sm80: the larger of its
// two).
constexpr std::size_t smem_bytes(const KernelConfig& c) {
    if (c.backward && c.family == Family::sm90)
        return sm90_backward_smem_bytes(c);
    if (c.backward)
        return std::max(backward_dkdv_smem_bytes(c), backward_dq_smem_bytes(c));
    if (c.family == Family::sm90)
        return detail::sm90_smem_bytes(c, q_buffers(c), o_staged_apart(c));
    return ((static_cast<std::size_t>(c.B_r) + static_cast<std::size_t>(c.B_c)) *
                static_cast<std::size_t>(c.d_head) +
            static_cast<std::size_t>(c.B_c) * static_cast<std::size_t>(c.v_head_dim())) *
           element_bytes(c.dtype);
}

// CTAs resident per SM as bounded by shared memory and threads, and for sm90 by its
// register reallocation (one CTA); sm80 registers are known only after compilation:
// the registry reports the device's own figure.
int ctas_per_sm(const KernelConfig& c, const DeviceLimits& limits);

}  // namespace flash_attention
