#pragma once

// The backward pass's first kernel, shared by both families: per query row and head
// D = rowsum(dO ∘ O) - dLSE, the row's LSE in base 2 where the family's main kernel reads it
// from a padded buffer (sm90: whole query blocks a head, so that TMA copies a block's rows
// in one aligned bulk copy), and the row's fp32 dQ accumulator and its 64 rows' semaphore
// zeroed (sm90). Then, with attention sinks, their gradient from D and the LSE.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <utility>

#include "config/resources.hpp"
#include "flash_attention/error.hpp"
#include "flash_attention/kernel_config.hpp"
#include "kernels/kernel_args.hpp"
#include "kernels/launch_support.cuh"
#include "kernels/primitives/element.cuh"
#include "kernels/primitives/masking.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sequences.cuh"

namespace flash_attention {

// The LSE in base 2 for P = exp2(S·scale_log2 - lse2); a row that saw no key (LSE -inf) and a
// row past the sequence get +inf, so that their P is 0 rather than inf.
__device__ __forceinline__ float lse_base2(float lse) {
    constexpr float log2e = 1.4426950408889634f;
    return lse == -INFINITY ? INFINITY : lse * log2e;
}

// Where sequence b of a backward call lies: its rows in the query and key views, and its first
// rows in the workspace (D, the base-2 LSE, dQ's accumulator) and in the LSE. Dense: entry b of
// every view, all seq_q and seq_k rows. Packed (cu_seqlens_q): entry 0, the sequence's own rows
// (sequence_span: cut to the views, never past them), its workspace rows from
// (cu_seqlens_q[b] / q_block + b) q_block, which leaves every sequence whole query blocks of its
// own (a block never straddles two sequences' dQ rows or semaphores).
struct BackwardSequence {
    int index;  // b
    int entry;
    int q_row0, q_len;
    int k_row0, k_len;
    int ws_row0;   // within (entry, head)'s q_rows
    int lse_row0;  // within (entry, head)'s lse_rows

    // Entry b of dense tensors.
    __device__ static BackwardSequence dense(const BackwardArgs& a, int b) {
        return {b, b, 0, a.seq_q, 0, a.seq_k, 0, 0};
    }
    __device__ static BackwardSequence of(const BackwardArgs& a, int b) {
        if (a.cu_seqlens_q == nullptr)
            return dense(a, b);
        const Span q = sequence_span(a.cu_seqlens_q, nullptr, 0, b, a.total_q);
        const Span k = sequence_span(a.cu_seqlens_k, a.seqused_k, 0, b, a.total_k);
        const int ws = (q.row0 / a.q_block + b) * a.q_block;
        return {b, 0, q.row0, min(q.len, a.seq_q), k.row0, min(k.len, a.seq_k), ws, q.row0};
    }
    // Rows of (entry, head) in the workspace and in the LSE, for the sequence's query row q.
    __device__ std::int64_t ws(const BackwardArgs& a, int head, int q) const {
        return (std::int64_t{entry} * a.heads + head) * a.q_rows + ws_row0 + q;
    }
    __device__ std::int64_t lse(const BackwardArgs& a, int head, int q) const {
        return (std::int64_t{entry} * a.heads + head) * a.lse_rows + lse_row0 + q;
    }
    // Ordered dQ's semaphore of the 64 query rows from q: per sequence, head and block, so that
    // no two sequences share one even where offsets out of order overlap their workspace rows
    // (a shared one would count adds that never come).
    __device__ std::int64_t semaphore(const BackwardArgs& a, int head, int q) const {
        return (std::int64_t{index} * a.heads + head) * (a.semaphore_rows / 64) + q / 64;
    }
};

// Threads a row: one a 16-byte chunk, rounded up to a power of two so that a row's lanes are
// a shuffle group of one warp (d_head 192: 32 lanes for its 24 chunks).
constexpr int backward_preprocess_lanes(int d_head) {
    return static_cast<int>(std::bit_ceil(static_cast<unsigned>(d_head / 8)));
}
constexpr int backward_preprocess_rows(int d_head) {
    return 128 / backward_preprocess_lanes(d_head);  // of one preprocess CTA (128 threads)
}

// Every workspace row of every head and sequence (BackwardSequence: dense, [0, q_rows); packed,
// the sequence's rows rounded up to whole q_blocks): backward_preprocess_lanes() threads a row,
// each of the first D_V / 8 summing one 16-byte chunk of O's and dO's rows (V's head dim), then a
// shuffle reduction among them. Rows past the sequence (padding) get D = 0 and an LSE of +inf:
// their P, hence their dS, is 0. The sm90 accumulator's rows are tile_columns(D_Head) floats.
template <DType dtype, int D_V, int D_Head = D_V>
__global__ void __launch_bounds__(128)
    backward_preprocess_kernel(const __grid_constant__ BackwardArgs args) {
    // The sm90 main kernel (a programmatic dependent launch) may be scheduled once every CTA
    // has started: its loads of Q, K, V and dO begin while the last of these run, and it waits
    // for this grid's writes (wait_for_previous_grid) before it reads them.
    ptx::launch_dependents();
    // The persistent dynamic schedule's counter and stream-K's, by the first CTA before any
    // thread returns (a packed call's first sequence may have no rows).
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
        if (args.tile_counter != nullptr && threadIdx.x == 0)
            *args.tile_counter = 0;
        for (int i = static_cast<int>(threadIdx.x); i < args.streamk_blocks;
             i += static_cast<int>(blockDim.x))
            args.streamk_counters[i] = 0;
    }
    constexpr int lanes = backward_preprocess_lanes(D_V);  // per row
    constexpr int rows = backward_preprocess_rows(D_V);
    const int row = blockIdx.x * rows + static_cast<int>(threadIdx.x) / lanes;
    const int chunk = threadIdx.x % lanes;
    // Lanes past the row's chunks (d_head 192) add nothing.
    const bool column = lanes == D_V / 8 || chunk < D_V / 8;
    const int head = blockIdx.y;
    const BackwardSequence seq = BackwardSequence::of(args, blockIdx.z);
    const bool real = row < seq.q_len;
    float sum = 0.0f;
    if (real && column) {
        using T = typename Element<dtype>::type;
        const std::int64_t q = seq.q_row0 + row;
        const T* o = static_cast<const T*>(args.o) + seq.entry * args.o_stride.batch +
                     head * args.o_stride.head + q * args.o_stride.seq + chunk * 8;
        const T* d_o = static_cast<const T*>(args.d_o) + seq.entry * args.d_o_stride.batch +
                       head * args.d_o_stride.head + q * args.d_o_stride.seq + chunk * 8;
        const uint4 a = ptx::ld_global_16(o);
        const uint4 b = ptx::ld_global_16(d_o);
        const std::uint32_t x[4] = {a.x, a.y, a.z, a.w};
        const std::uint32_t y[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 u = ptx::unpack<dtype>(x[i]);
            const float2 w = ptx::unpack<dtype>(y[i]);
            sum += u.x * w.x + u.y * w.y;
        }
    }
#pragma unroll
    for (int offset = lanes / 2; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const int seq_rows = args.cu_seqlens_q == nullptr
                             ? args.q_rows
                             : blocks_covering(seq.q_len, args.q_block) * args.q_block;
    if (row >= seq_rows)
        return;
    const std::int64_t at = seq.ws(args, head, row);
    // The sm90 accumulator's rows are its tiles' columns (d_head 96: 12 chunks over 16 lanes; 192
    // with V's 128: 24 chunks over 16 lanes).
    constexpr int acc_cols = tile_columns(D_Head);
    if (args.dq_accum != nullptr) {
        for (int c = chunk; c < acc_cols / 8; c += lanes) {
            float4* acc = reinterpret_cast<float4*>(args.dq_accum + at * acc_cols) + 2 * c;
            acc[0] = float4{};
            acc[1] = float4{};
        }
    }
    if (chunk != 0)
        return;
    if (args.dq_semaphores != nullptr && row % 64 == 0)
        args.dq_semaphores[seq.semaphore(args, head, row)] = 0;
    const std::int64_t lse_at = seq.lse(args, head, row);
    args.d[at] = real ? sum - (args.d_lse != nullptr ? args.d_lse[lse_at] : 0.0f) : 0.0f;
    if (args.lse2 != nullptr)
        args.lse2[at] = real ? lse_base2(args.lse[lse_at]) : INFINITY;
}

// Launches the preprocess over every workspace row (padding included) of every head and
// sequence.
template <DType dtype, int D_V, int D_Head = D_V>
void launch_backward_preprocess(const BackwardArgs& args, Stream stream) {
    const int rows = args.cu_seqlens_q == nullptr
                         ? args.q_rows
                         : blocks_covering(args.seq_q, args.q_block) * args.q_block;
    launch_kernel<&backward_preprocess_kernel<dtype, D_V, D_Head>>(
        dim3(blocks_covering(rows, backward_preprocess_rows(D_V)), args.heads, args.batch), 128, 0,
        stream, args, "backward preprocess launch");
}

// Attention sinks' gradient. A sink is a score with no value that joins a row's softmax
// denominator: its probability is P_sink = exp(sink - LSE) (the LSE includes it), O = Σ P_j V_j
// loses P_sink's share, and LSE grows with it, so ∂loss/∂sink = Σ over the head's rows of
// P_sink · (dLSE - rowsum(dO ∘ O)) = -Σ P_sink · D. One CTA a head: each thread sums a fixed
// stride of the (batch, seq_q) rows, then a fixed reduction tree, so the sum's order, and its
// bits, never change from run to run.
// (A template, as the other kernels of shared headers, so that every translation unit may
// instantiate it.)
template <int Threads>
__global__ void __launch_bounds__(Threads)
    sink_gradient_kernel(const __grid_constant__ BackwardArgs args) {
    const int head = blockIdx.x;
    const float sink = args.sinks[head];
    float sum = 0.0f;
    for (int b = 0; b < args.batch; ++b) {
        const BackwardSequence seq = BackwardSequence::of(args, b);
        for (int row = threadIdx.x; row < seq.q_len; row += Threads) {
            // A sink of -inf is none (the forward's reading): a row that saw no key keeps LSE
            // -inf, and adds nothing rather than exp(-inf + inf).
            const float lse = args.lse[seq.lse(args, head, row)];
            if (lse != -INFINITY)
                sum -= expf(sink - lse) * args.d[seq.ws(args, head, row)];
        }
    }
#pragma unroll
    for (int offset = warp_size / 2; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    __shared__ float warp_sums[Threads / warp_size];
    if (threadIdx.x % warp_size == 0)
        warp_sums[threadIdx.x / warp_size] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (const float w : warp_sums)
            total += w;
        args.d_sinks[head] = total;
    }
}

// Packed sequences: zeros into every row of a gradient (dQ: cu_seqlens_q's rows; dK, dV:
// cu_seqlens_k's, seqused_k's) that no sequence uses, which the main kernels never write (rows
// past cu_seqlens[batch], keys past seqused_k): a thread a (row, head), its sequence found by
// bisecting the offsets. Offsets out of order give some sequence, never a write past the view.
struct UnusedRows {
    void* out;
    TensorStrides stride;
    int rows, heads;
    const std::int32_t* cu_seqlens;
    const std::int32_t* seqused;
    int batch;
    int max_len;  // max_seqlen: BackwardSequence cuts a sequence there, and so does this
};

template <int D_Head, class T>
__global__ void __launch_bounds__(256)
    zero_unused_rows_kernel(const __grid_constant__ UnusedRows u) {
    const std::int64_t total = std::int64_t{u.rows} * u.heads;
    for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
         i += std::int64_t{gridDim.x} * blockDim.x) {
        const int row = static_cast<int>(i / u.heads), head = static_cast<int>(i % u.heads);
        int lo = 0, hi = u.batch;  // the last sequence starting at or before the row
        while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            (u.cu_seqlens[mid] <= row ? lo : hi) = mid;
        }
        const Span s = sequence_span(u.cu_seqlens, u.seqused, 0, lo, u.rows);
        if (row >= s.row0 && row < s.row0 + min(s.len, u.max_len))
            continue;
        T* at = static_cast<T*>(u.out) + head * u.stride.head + std::int64_t{row} * u.stride.seq;
#pragma unroll
        for (int c = 0; c < D_Head / 8; ++c)
            reinterpret_cast<uint4*>(at)[c] = uint4{};
    }
}

template <DType dtype, int D_Head>
void launch_zero_unused_rows(const UnusedRows& u, Stream stream) {
    const std::int64_t threads = std::int64_t{u.rows} * u.heads;
    const auto ctas =
        static_cast<unsigned>(std::clamp<std::int64_t>((threads + 255) / 256, 1, 4096));
    launch_kernel<&zero_unused_rows_kernel<D_Head, typename Element<dtype>::type>>(
        dim3(ctas), 256, 0, stream, u, "backward unused rows launch");
}

// The preprocess, then with args.d_sinks the sinks' gradient (which needs only its D); packed
// sequences get zeros in the gradients' rows no sequence uses. D_V: the head dim of V, O, dO and
// dV (DeepSeek's MLA: below D_Head), which D sums over; the sm90 family's fp32 dQ accumulator is
// zeroed here, a row of tile_columns(D_Head) floats.
template <DType dtype, int D_Head, int D_V = D_Head>
void launch_backward_preprocess_and_sinks(const BackwardArgs& args, Stream stream) {
    launch_backward_preprocess<dtype, D_V, D_Head>(args, stream);
    if (args.cu_seqlens_q != nullptr) {
        launch_zero_unused_rows<dtype, D_Head>({args.dq, args.dq_stride, args.total_q, args.heads,
                                                args.cu_seqlens_q, nullptr, args.batch, args.seq_q},
                                               stream);
        launch_zero_unused_rows<dtype, D_Head>(
            {args.dk, args.dk_stride, args.total_k, args.heads_kv, args.cu_seqlens_k,
             args.seqused_k, args.batch, args.seq_k},
            stream);
        launch_zero_unused_rows<dtype, D_V>(
            {args.dv, args.dv_stride, args.total_k, args.heads_kv, args.cu_seqlens_k,
             args.seqused_k, args.batch, args.seq_k},
            stream);
    }
    if (args.d_sinks != nullptr) {
        constexpr int threads = 256;
        launch_kernel<&sink_gradient_kernel<threads>>(dim3(args.heads), threads, 0, stream, args,
                                                      "sink gradient launch");
    }
}

}  // namespace flash_attention
