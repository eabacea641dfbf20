#pragma once

// The backward pass's first kernel, shared by both families: per query row and head
// D = rowsum(dO ∘ O) - dLSE, the row's LSE in base 2 where the family's main kernel reads it
// from a padded buffer (sm90: whole query blocks a head, so that TMA copies a block's rows
// in one aligned bulk copy), and the row's fp32 dQ accumulator and its 64 rows' semaphore
// zeroed (sm90). Then, with attention sinks, their gradient from D and the LSE.

#include <cmath>
#include <cstdint>

#include "flash_attention/kernel_config.hpp"
#include "kernels/kernel_args.hpp"
#include "kernels/launch_support.cuh"
#include "kernels/primitives/element.cuh"
#include "kernels/primitives/masking.cuh"
#include "kernels/primitives/ptx.cuh"

namespace flash_attention {

// The LSE in base 2 for P = exp2(S·scale_log2 - lse2); a row that saw no key (LSE -inf) and a
// row past the sequence get +inf, so that their P is 0 rather than inf.
__device__ __forceinline__ float lse_base2(float lse) {
    constexpr float log2e = 1.4426950408889634f;
    return lse == -INFINITY ? INFINITY : lse * log2e;
}

// Rows of one preprocess CTA (128 threads, d_head / 8 a row).
constexpr int backward_preprocess_rows(int d_head) {
    return 128 / (d_head / 8);
}

// Every row [0, args.q_rows) of every head: D_Head / 8 threads a row, each summing one 16-byte
// chunk of it, then a shuffle reduction among them. Rows past seq_q (padding) get D = 0 and an
// LSE of +inf: their P, hence their dS, is 0.
template <DType dtype, int D_Head>
__global__ void __launch_bounds__(128)
    backward_preprocess_kernel(const __grid_constant__ BackwardArgs args) {
    constexpr int lanes = D_Head / 8;  // per row
    constexpr int rows = backward_preprocess_rows(D_Head);
    const int row = blockIdx.x * rows + static_cast<int>(threadIdx.x) / lanes;
    const int chunk = threadIdx.x % lanes;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    float sum = 0.0f;
    if (row < args.seq_q) {
        using T = typename Element<dtype>::type;
        const T* o = static_cast<const T*>(args.o) + batch * args.o_stride.batch +
                     head * args.o_stride.head + row * args.o_stride.seq + chunk * 8;
        const T* d_o = static_cast<const T*>(args.d_o) + batch * args.d_o_stride.batch +
                       head * args.d_o_stride.head + row * args.d_o_stride.seq + chunk * 8;
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
    if (row >= args.q_rows)
        return;
    const std::int64_t head_row0 = (std::int64_t{batch} * args.heads + head) * args.q_rows;
    if (args.dq_accum != nullptr) {
        float4* acc =
            reinterpret_cast<float4*>(args.dq_accum + (head_row0 + row) * D_Head) + 2 * chunk;
        acc[0] = float4{};
        acc[1] = float4{};
    }
    if (chunk != 0)
        return;
    if (args.dq_semaphores != nullptr && row % 64 == 0)
        args.dq_semaphores[(head_row0 + row) / 64] = 0;
    const bool real = row < args.seq_q;
    const std::int64_t at = (std::int64_t{batch} * args.heads + head) * args.seq_q + row;
    args.d[head_row0 + row] = real ? sum - (args.d_lse != nullptr ? args.d_lse[at] : 0.0f) : 0.0f;
    if (args.lse2 != nullptr)
        args.lse2[head_row0 + row] = real ? lse_base2(args.lse[at]) : INFINITY;
}

// Launches the preprocess over every row (args.q_rows, padding included) of every head.
template <DType dtype, int D_Head>
void launch_backward_preprocess(const BackwardArgs& args, Stream stream) {
    launch_kernel<&backward_preprocess_kernel<dtype, D_Head>>(
        dim3(blocks_covering(args.q_rows, backward_preprocess_rows(D_Head)), args.heads,
             args.batch),
        128, 0, stream, args, "backward preprocess launch");
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
    const std::int64_t rows = std::int64_t{args.batch} * args.seq_q;
    float sum = 0.0f;
    for (std::int64_t r = threadIdx.x; r < rows; r += Threads) {
        const std::int64_t batch = r / args.seq_q, row = r % args.seq_q;
        const std::int64_t head_row0 = batch * args.heads + head;
        // A sink of -inf is none (the forward's reading): a row that saw no key keeps LSE -inf,
        // and adds nothing rather than exp(-inf + inf).
        const float lse = args.lse[head_row0 * args.seq_q + row];
        if (lse != -INFINITY)
            sum -= expf(sink - lse) * args.d[head_row0 * args.q_rows + row];
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

// The preprocess, then with args.d_sinks the sinks' gradient (which needs only its D).
template <DType dtype, int D_Head>
void launch_backward_preprocess_and_sinks(const BackwardArgs& args, Stream stream) {
    launch_backward_preprocess<dtype, D_Head>(args, stream);
    if (args.d_sinks != nullptr) {
        constexpr int threads = 256;
        launch_kernel<&sink_gradient_kernel<threads>>(dim3(args.heads), threads, 0, stream, args,
                                                      "sink gradient launch");
    }
}

}  // namespace flash_attention
