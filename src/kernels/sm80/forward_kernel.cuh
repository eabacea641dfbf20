#pragma once

// The sm80 forward kernel: one CTA computes B_r rows of O for one (batch, head),
// streaming K and V through shared memory B_c rows at a time (FlashAttention-2).
// mma.sync + ldmatrix + cp.async; runs on sm_80 and later.

#include <cstdint>

#include "kernels/kernel_args.hpp"
#include "kernels/primitives/epilogue.cuh"
#include "kernels/primitives/masking.cuh"
#include "kernels/primitives/online_softmax.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm80/gm2sm.cuh"
#include "kernels/primitives/sm80/warp_gemm.cuh"
#include "kernels/sm80/traits.cuh"

namespace flash_attention::sm80 {

// Makes every copy this thread issued visible to the whole CTA. Each thread waits for
// its own cp.async groups; the barrier then publishes them to the other warps (and
// tells the issuer that every warp is done with the buffer's previous contents).
template <bool Async>
__device__ __forceinline__ void wait_copies_and_sync() {
    if constexpr (Async)
        ptx::cp_async_wait_group<0>();
    __syncthreads();
}

template <bool Async>
__device__ __forceinline__ void commit_copies() {
    if constexpr (Async)
        ptx::cp_async_commit_group();
}

// Variants: sliding window, softcap and ALiBi (KernelArgs::variants), an instantiation of its own
// so that the plain kernel's loop stays as it was.
template <unsigned long long CodeHi, unsigned long long CodeLo, bool Variants = false>
__global__ void __launch_bounds__(Traits<unpack(CodeHi, CodeLo)>::threads, 1)
    forward_kernel(const __grid_constant__ KernelArgs args) {
    constexpr KernelConfig C = unpack(CodeHi, CodeLo);
    using Tr = Traits<C>;
    using T = typename Tr::T;
    constexpr bool async = C.sm80.async_copy;
    constexpr bool eager = C.sm80.eager_load_blocks;
    constexpr bool buffer = C.sm80.mma_double_buffer_loads;
    constexpr int m_tiles = Tr::m_tiles;

    extern __shared__ __align__(128) unsigned char smem[];
    const std::uint32_t q_smem = ptx::smem_address(smem) + Tr::q_smem_offset;
    const std::uint32_t k_smem = ptx::smem_address(smem) + Tr::k_smem_offset;
    const std::uint32_t v_smem = ptx::smem_address(smem) + Tr::v_smem_offset;

    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int kv_head = head / (args.heads / args.heads_kv);  // grouped-query attention
    // With causal masking the last query blocks see the most keys; launching them first
    // keeps the long CTAs from forming the grid's tail.
    const int q_block = args.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int q_row0 = q_block * Tr::B_r;
    const int q_rows = min(Tr::B_r, args.seq_q - q_row0);  // fewer in the last, partial block
    const int warp_row0 = (threadIdx.x / warp_size) * Tr::rows_per_warp;
    // K/V blocks [first, end) are visited; those outside [unmasked_first, unmasked_end) need
    // the mask (the plain kernel: a prefix of unmasked blocks from 0).
    int first = 0, end, unmasked_first = 0, unmasked_end;
    const int shift = band_shift(args.seq_q, args.seq_k, args.top_left);
    if constexpr (Variants) {
        const BandBlocks b = band_blocks(shift, args.band, args.seq_k, q_row0, q_rows, Tr::B_c);
        first = b.first;
        end = b.end;
        unmasked_first = b.unmasked_first;
        unmasked_end = b.unmasked_end;
    } else {
        const KeyBlocks b =
            key_blocks(args.diagonal_seq_q, args.seq_k, args.causal, q_row0, q_rows, Tr::B_c);
        end = b.visited;
        unmasked_end = b.unmasked;
    }
    const auto rows_of_block = [&](int j) { return min(Tr::B_c, args.seq_k - j * Tr::B_c); };
    // ALiBi's slope in S's units (0: none), the variant kernel's only.
    const float alibi = Variants ? alibi_slope(args.alibi_slopes, args.alibi_batch_stride, batch,
                                               head, args.scale_log2)
                                 : 0.0f;

    const auto tile_start = [&](const void* base, const TensorStrides& st, int h,
                                std::int64_t row) {
        return static_cast<const T*>(base) + batch * st.batch + h * st.head + row * st.seq;
    };
    TileCopyGM2SM<typename Tr::QTile, Tr::threads, async, T> q_copy(
        tile_start(args.q, args.q_stride, head, q_row0), args.q_stride.seq, q_smem);
    TileCopyGM2SM<typename Tr::KTile, Tr::threads, async, T> k_copy(
        tile_start(args.k, args.k_stride, kv_head, std::int64_t{first} * Tr::B_c),
        args.k_stride.seq, k_smem);
    TileCopyGM2SM<typename Tr::VTile, Tr::threads, async, T> v_copy(
        tile_start(args.v, args.v_stride, kv_head, std::int64_t{first} * Tr::B_c),
        args.v_stride.seq, v_smem);

    // Q and the first K block travel together.
    q_copy.copy_rows(q_rows);
    k_copy.copy_rows(rows_of_block(first));
    commit_copies<async>();
    wait_copies_and_sync<async>();

    const SmemA<typename Tr::QTile, m_tiles> q_in_smem(q_smem, warp_row0);
    typename SmemA<typename Tr::QTile, m_tiles>::template Frags<Tr::qk_k_tiles> q_held;
    if constexpr (Tr::q_held_in_registers)
        q_in_smem.load(q_held, 0);
    const auto q_frags = [&] {
        if constexpr (Tr::q_held_in_registers) {
            return RegisterA<m_tiles, Tr::qk_k_tiles>{q_held.r};
        } else {
            return q_in_smem;
        }
    }();
    const SmemB<typename Tr::KTile, Tr::qk_n_tiles, false> k_frags(k_smem);
    const SmemB<typename Tr::VTile, Tr::pv_n_tiles, true> v_frags(v_smem);

    float o[m_tiles][Tr::pv_n_tiles][4];  // (rows_per_warp x d_v) fp32
    zero(o);
    OnlineSoftmax<m_tiles, C.sm80.optimized_softmax> softmax(args.softmax_scale, args.scale_log2);

    // One K/V block: S = Q·K_jᵀ, mask (from block `unmasked` on), online softmax, O += P·V_j.
    const auto process_block = [&](int j) {
        if constexpr (eager) {
            v_copy.copy_rows(rows_of_block(j));  // V_j lands while S = Q·K_jᵀ computes
            commit_copies<async>();
        }

        float s[m_tiles][Tr::qk_n_tiles][4];  // (rows_per_warp x B_c) fp32
        zero(s);
        warp_gemm<Tr::dtype, Tr::qk_k_tiles, Tr::qk_step, buffer>(s, q_frags, k_frags);
        if constexpr (Variants) {
            // The softcap first: tanh(-inf) would be -1, not -inf.
            if (args.softcap_prescale != 0.0f)
                softcap_scores(s, args.softcap_prescale);
            if (alibi != 0.0f)  // on every block, after the softcap
                alibi_scores(s, AlibiTile(alibi, q_row0 + warp_row0 + shift, j * Tr::B_c));
            if (j < unmasked_first || j >= unmasked_end) {
                mask_scores_band(s, q_row0 + warp_row0, j * Tr::B_c, [&](int row) {
                    return band_keys(row, shift, args.band, args.seq_k);
                });
            }
        } else if (j >= unmasked_end) {
            mask_scores(s, q_row0 + warp_row0, j * Tr::B_c, args.diagonal_seq_q, args.seq_k,
                        args.causal);
        }

        if constexpr (!eager) {
            v_copy.copy_rows(rows_of_block(j));
            commit_copies<async>();
        }
        // V_j has landed, and every warp is done reading K_j.
        wait_copies_and_sync<async>();
        if (eager && j + 1 < end) {
            k_copy.advance(Tr::B_c);
            k_copy.copy_rows(rows_of_block(j + 1));  // lands during softmax and O += P·V_j
            commit_copies<async>();
        }

        softmax.update(s, o);
        std::uint32_t p[m_tiles][Tr::pv_k_tiles][4];  // (rows_per_warp x B_c) 16-bit
        accumulators_to_a_fragments<Tr::dtype>(s, p);
        warp_gemm<Tr::dtype, Tr::pv_k_tiles, Tr::pv_step, buffer>(
            o, RegisterA<m_tiles, Tr::pv_k_tiles>{p}, v_frags);

        if (j + 1 < end) {
            if constexpr (!eager) {
                k_copy.advance(Tr::B_c);
                k_copy.copy_rows(rows_of_block(j + 1));
                commit_copies<async>();
            }
            v_copy.advance(Tr::B_c);
            // K_{j+1} has landed, and every warp is done reading V_j.
            wait_copies_and_sync<async>();
        }
    };
    // Blocks every row sees whole skip the mask; the last few (the diagonal with causal
    // masking, the partial block at the end of the keys) apply it. One loop with a
    // uniform branch rather than two loops: two copies of the body made ptxas keep more
    // values live across them and spill 172 bytes instead of 56 (B_r 128, 4 warps).
    for (int j = first; j < end; ++j)
        process_block(j);

    if constexpr (Variants) {
        // Attention sinks: one per head, the same for every row of the CTA (the variant
        // kernel only, as in the sm90 family).
        constexpr float log2e = 1.4426950408889634f;
        const float sink = args.sinks != nullptr ? __ldg(args.sinks + head) * log2e : -INFINITY;
        softmax.finalize(o, [sink](int, int) { return sink; });
    } else {
        softmax.finalize(o);
    }

    if (args.lse != nullptr && threadIdx.x % 4 == 0) {
        store_lse<m_tiles>(args.lse + (std::int64_t{batch} * args.heads + head) * args.seq_q,
                           q_row0 + warp_row0, args.seq_q, softmax);
    }

    // O is staged in this warp's own rows of Q's tile: no other warp reads them, and
    // the barrier-free hand-over only needs the warp's lanes to agree.
    __syncwarp();
    store_accumulators_RF2SM<Tr::dtype, typename Tr::QTile>(o, q_smem, warp_row0);
    __syncwarp();
    T* out = static_cast<T*>(args.o) + batch * args.o_stride.batch + head * args.o_stride.head +
             (std::int64_t{q_row0} + warp_row0) * args.o_stride.seq;
    copy_rows_SM2GM<typename Tr::QTile, Tr::rows_per_warp, Tr::d_v / 8>(
        q_smem, warp_row0, [&](int r) { return out + r * args.o_stride.seq; }, q_rows - warp_row0);
}

}  // namespace flash_attention::sm80
