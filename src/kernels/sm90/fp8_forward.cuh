#pragma once

// The sm90 FP8 (e4m3) forward, first form: dense problems, causal or not, GQA, bf16 output and
// the LSE, no variants (docs/design.md section 12). FlashAttention-3's operand plan in its
// simplest schedule: a producer thread streams Q, K and V's transposed copy with TMA, and each
// of two consumer warpgroups takes 64 query rows through S = Q·Kᵀ (8-bit wgmma from shared
// memory), the online softmax, and O += P·V with P's e4m3 fragments packed from S's registers
// in place (fp8_key_order.hpp) and V read K-major from its copy (fp8/v_transpose.hpp), which
// the launch writes first. One tile a CTA, no overlap of a block's softmax with GEMMs yet: the
// correct baseline the tuned FP8 kernel is measured against.
//
// Scales: the descales of Q and K (per sequence and K/V head) multiply S in fp32; P is taken
// 2^8 times larger before its e4m3 rounding (FlashAttention-3's offset: e4m3 keeps 3 mantissa
// bits down to 2^-6, so the probabilities of a row's lesser keys keep their precision), and V's
// descale over 2^8 scales O once at the end. The row sums stay in fp32, unscaled.

#include <cstdint>

#include "common/stream_scratch.hpp"
#include "kernels/fp8/v_transpose.hpp"
#include "kernels/fp8_key_order.hpp"
#include "kernels/launch_support.cuh"
#include "kernels/primitives/epilogue.cuh"
#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/masking.cuh"
#include "kernels/primitives/online_softmax.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm80/warp_gemm.cuh"
#include "kernels/primitives/sm90/ptx.cuh"
#include "kernels/primitives/sm90/swizzled_tile.cuh"
#include "kernels/primitives/sm90/tma.cuh"
#include "kernels/primitives/sm90/warpgroup_gemm.cuh"
#include "kernels/sm90/tensor_maps.hpp"

namespace flash_attention::sm90 {

template <KernelConfig C>
struct Fp8Traits {
    static_assert(C.family == Family::sm90 && C.dtype == DType::E4M3 && !C.backward,
                  "an sm90 FP8 forward config (the rule dtype)");
    static constexpr int d = C.d_head;  // V's too
    static constexpr int B_r = C.B_r, B_c = C.B_c, stages = C.sm90.stages;
    static constexpr int consumers = consumer_warpgroups(C);
    static constexpr int threads = C.n_threads();
    // 8-bit tiles in SwizzledTile's 16-bit columns, pairs of e4m3 values: rows of d bytes for Q
    // and K, whose k-steps of 32 bytes are 8-bit wgmma's 32 values; V's copy in rows of B_c keys.
    using QTile = Swizzle128Tile<64, d / 2>;
    using KTile = Swizzle128Tile<B_c, d / 2>;
    using VtTile = Swizzle128Tile<d, B_c / 2>;
    static constexpr int s_tiles = B_c / 8;                // S's n8 accumulator tiles
    static constexpr int p_steps = B_c / fp8_k_step_keys;  // P's 32-key k-steps
    static constexpr float p_offset = 256.0f;              // 2^8 (the header's scales)
    static constexpr int pv_cols = d < 128 ? d : 128;      // V's columns a P·V chunk

    struct Smem {
        alignas(1024) unsigned char q[consumers][QTile::bytes];
        alignas(1024) unsigned char k[stages][KTile::bytes];
        alignas(1024) unsigned char vt[stages][VtTile::bytes];
        tma::Barrier q_full;
        tma::Barrier k_full[stages], k_empty[stages];
        tma::Barrier v_full[stages], v_empty[stages];
    };
    static constexpr int smem_bytes = static_cast<int>(sizeof(Smem)) + 1024;
    static_assert(smem_bytes == static_cast<int>(flash_attention::smem_bytes(C)),
                  "smem_bytes(C) matches the layout");
    static_assert(QTile::bytes % 1024 == 0 && KTile::bytes % 1024 == 0 && VtTile::bytes % 1024 == 0,
                  "every tile on the swizzle's period");
};

struct Fp8Params {
    KernelArgs args;
    Fp8TensorMaps maps;
};

template <unsigned long long CodeHi, unsigned long long CodeLo>
__global__ void __launch_bounds__(Fp8Traits<unpack(CodeHi, CodeLo)>::threads, 1)
    fp8_forward_kernel(const __grid_constant__ Fp8Params params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = Fp8Traits<unpack(CodeHi, CodeLo)>;
    using Smem = typename Tr::Smem;
    const KernelArgs& a = params.args;
    extern __shared__ unsigned char smem_raw[];
    auto& smem =
        *reinterpret_cast<Smem*>(smem_raw + ((1024 - ptx::smem_address(smem_raw) % 1024) % 1024));
    const int q_row0 = static_cast<int>(blockIdx.x) * Tr::B_r;
    const int head = static_cast<int>(blockIdx.y), batch = static_cast<int>(blockIdx.z);
    const int kv_head = head / (a.heads / a.heads_kv);
    // The blocks the tile's rows see: with causal masking up to its last row's diagonal.
    const int last_row = min(q_row0 + Tr::B_r, a.seq_q) - 1;
    const int keys =
        a.causal ? max(0, min(a.seq_k, last_row + 1 + a.seq_k - a.diagonal_seq_q)) : a.seq_k;
    const int blocks = (keys + Tr::B_c - 1) / Tr::B_c;

    const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / warpgroup_threads, 0);
    if (threadIdx.x == 0) {
        smem.q_full.init(1);
        for (int s = 0; s < Tr::stages; ++s) {
            smem.k_full[s].init(1);
            smem.v_full[s].init(1);
            smem.k_empty[s].init(4 * Tr::consumers);  // each consumer warp, after its wait
            smem.v_empty[s].init(4 * Tr::consumers);
        }
        tma::fence_barrier_init();
    }
    __syncthreads();

    if (warpgroup == 0) {
        ptx::setmaxnreg_dec<24>();
        if (threadIdx.x != 0)
            return;
        smem.q_full.arrive_expect_tx(Tr::consumers * Tr::QTile::bytes);
        for (int w = 0; w < Tr::consumers; ++w)
            tma::load_tile<typename Tr::QTile>(smem.q[w], &params.maps.q, q_row0 + 64 * w, head,
                                               batch, smem.q_full);
        for (int j = 0; j < blocks; ++j) {
            const RingSlot<Tr::stages> slot(j);
            smem.k_empty[slot.stage].wait(slot.parity ^ 1);
            smem.k_full[slot.stage].arrive_expect_tx(Tr::KTile::bytes);
            tma::load_tile<typename Tr::KTile>(smem.k[slot.stage], &params.maps.k, j * Tr::B_c,
                                               kv_head, batch, smem.k_full[slot.stage]);
            smem.v_empty[slot.stage].wait(slot.parity ^ 1);
            smem.v_full[slot.stage].arrive_expect_tx(Tr::VtTile::bytes);
            // The copy's rows are V's columns; its 16-bit columns, pairs of keys.
            tma::load_tile_at<typename Tr::VtTile>(smem.vt[slot.stage], &params.maps.vt,
                                                   j * Tr::B_c / 2, 0, kv_head, batch,
                                                   smem.v_full[slot.stage]);
        }
        return;
    }

    ptx::setmaxnreg_inc<240>();
    const int consumer = warpgroup - 1;
    const int first_row = q_row0 + 64 * consumer + warp_in_warpgroup() * mma_m;
    // Q's and K's descales scale S itself, not the softmax's scale: any descale (zero, negative,
    // a product that underflows) then gives the softmax of the scores it means, where folded
    // into the scale a zero would meet the references' -inf (NaN).
    const std::int64_t pair = std::int64_t{batch} * a.heads_kv + kv_head;
    const float qk_descale = __ldg(a.q_descale + pair) * __ldg(a.k_descale + pair);
    OnlineSoftmax<1, true> softmax(a.softmax_scale, a.scale_log2);
    float o[1][Tr::d / 8][4];
    zero(o);
    const std::uint32_t q_smem = ptx::smem_address(smem.q[consumer]);
    smem.q_full.wait(0);
    for (int j = 0; j < blocks; ++j) {
        const RingSlot<Tr::stages> slot(j);
        float s[1][Tr::s_tiles][4];
        smem.k_full[slot.stage].wait(slot.parity);
        ptx::fence_operands(s[0]);
        ptx::wgmma_fence();
        warpgroup_gemm_qk<DType::E4M3, typename Tr::QTile, typename Tr::KTile>(
            s[0], q_smem, ptx::smem_address(smem.k[slot.stage]));
        ptx::wgmma_commit_group();
        ptx::wgmma_wait<0>();
        ptx::fence_operands(s[0]);
        __syncwarp();
        if (threadIdx.x % warp_size == 0)
            smem.k_empty[slot.stage].arrive();
#pragma unroll
        for (int nt = 0; nt < Tr::s_tiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[0][nt][e] *= qk_descale;
        }
        // Keys past the sequence, and with causal masking past a row's diagonal (the dense
        // kernels' mask: diagonal_seq_q carries the alignment).
        if (a.causal || (j + 1) * Tr::B_c > a.seq_k)
            mask_scores(s, first_row, j * Tr::B_c, a.diagonal_seq_q, a.seq_k, a.causal);
        softmax.update(s, o);
        // P's k-step kt: register i from S's n8 tiles 4 kt + 2 (i / 2) and the next, the rows of
        // i % 2, in the accumulators' own key order (fp8_key_order.hpp).
        std::uint32_t p[Tr::p_steps][4];
#pragma unroll
        for (int kt = 0; kt < Tr::p_steps; ++kt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int t = 4 * kt + 2 * (i / 2), e = 2 * (i % 2);
                p[kt][i] = ptx::pack_e4m3x4(
                    s[0][t][e] * Tr::p_offset, s[0][t][e + 1] * Tr::p_offset,
                    s[0][t + 1][e] * Tr::p_offset, s[0][t + 1][e + 1] * Tr::p_offset);
            }
        }
        // The block's P·V in a fresh accumulator a chunk of 128 of V's columns at a time, added
        // to O in fp32: the tensor cores add each k-step at about 14 bits (k_fp8_accumulation),
        // so O accumulated there over every block would lose precision with the keys (DeepSeek-V3
        // promotes FP8 GEMMs' sums to fp32 every 128 products alike); at d_head 256 one chunk's
        // accumulator beside O keeps to the consumers' 240 registers.
        smem.v_full[slot.stage].wait(slot.parity);
        const std::uint32_t vt_smem = ptx::smem_address(smem.vt[slot.stage]);
#pragma unroll
        for (int c = 0; c < Tr::d / Tr::pv_cols; ++c) {
            float block[Tr::pv_cols / 8][4];
            ptx::fence_operands(block);
            ptx::wgmma_fence();
            warpgroup_gemm_pv_e4m3<typename Tr::VtTile, Tr::pv_cols>(
                block, p, vt_smem + Tr::VtTile::group_offset(c * Tr::pv_cols), false);
            ptx::wgmma_commit_group();
            ptx::wgmma_wait<0>();
            ptx::fence_operands(block);
#pragma unroll
            for (int nt = 0; nt < Tr::pv_cols / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    o[0][c * Tr::pv_cols / 8 + nt][e] += block[nt][e];
            }
        }
        ptx::fence_operands(p);
        __syncwarp();
        if (threadIdx.x % warp_size == 0)
            smem.v_empty[slot.stage].arrive();
    }
    softmax.finalize(o);
    const float v_scale = __ldg(a.v_descale + pair) / Tr::p_offset;
    const int lane = threadIdx.x % warp_size;
    if (a.lse != nullptr && lane % 4 == 0)
        store_lse<1>(a.lse + (std::int64_t{batch} * a.heads + head) * a.seq_q, first_row, a.seq_q,
                     softmax);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = first_row + lane / 4 + 8 * h;
        if (row >= a.seq_q)
            continue;
        unsigned char* out =
            static_cast<unsigned char*>(a.o) +
            2 * (std::int64_t{batch} * a.o_stride.batch + std::int64_t{row} * a.o_stride.seq +
                 std::int64_t{head} * a.o_stride.head + 2 * (lane % 4));
#pragma unroll
        for (int nt = 0; nt < Tr::d / 8; ++nt) {
            ptx::st_global_4(out + 2 * 8 * nt,
                             ptx::pack_rn<DType::BF16>(o[0][nt][2 * h] * v_scale,
                                                       o[0][nt][2 * h + 1] * v_scale));
        }
    }
#else
    (void)params;  // sm_90a only (the family's CMake target)
#endif
}

// V's transposed copy (fp8::transpose_v) into memory of the launch, then the kernel, one CTA
// a tile of B_r query rows of a (sequence, head).
template <KernelConfig C>
void launch_fp8(const KernelArgs& args, Stream stream) {
    using Tr = Fp8Traits<C>;
    if (args.seqs.cu_seqlens_q != nullptr || args.seqs.cu_seqlens_k != nullptr ||
        args.seqs.seqused_k != nullptr || args.seqs.block_table != nullptr || args.variants ||
        args.alibi_slopes != nullptr || args.q_descale == nullptr || args.k_descale == nullptr ||
        args.v_descale == nullptr) {
        throw Error(ErrorCode::unsupported,
                    "config: " + C.to_string() +
                        " runs forward()'s dense FP8 problems only (descales given, no varlen, "
                        "KV cache or variants)");
    }
    TensorView v{};
    v.data = const_cast<void*>(args.v);
    v.dtype = DType::E4M3;
    v.shape = {args.batch, args.seq_k, args.heads_kv, Tr::d};
    v.stride = {args.v_stride.batch, args.v_stride.seq, args.v_stride.head, 1};
    StreamScratch vt(fp8::transposed_v_bytes(v), stream, false, StreamScratch::Pool::device);
    fp8::transpose_v(v, vt.get(), stream);
    const Fp8Params params{
        args, make_fp8_tensor_maps(args, Tr::d, Tr::B_c, vt.get(), fp8::padded_keys(args.seq_k))};
    constexpr auto* kernel = &fp8_forward_kernel<pack(C).hi, pack(C).lo>;
    enable_dynamic_smem<kernel, Tr::smem_bytes>();
    const dim3 grid(static_cast<unsigned>((args.seq_q + Tr::B_r - 1) / Tr::B_r),
                    static_cast<unsigned>(args.heads), static_cast<unsigned>(args.batch));
    launch_kernel<kernel>(grid, Tr::threads, Tr::smem_bytes, stream, params,
                          "sm90 FP8 forward kernel launch");
}

}  // namespace flash_attention::sm90
