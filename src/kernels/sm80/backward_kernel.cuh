#pragma once

// The sm80 backward pass (mma.sync, ldmatrix, cp.async; runs on sm_80 and later), in three
// kernels:
//  - preprocess: D = rowsum(dO ∘ O) - dLSE per query row and head, into workspace;
//  - dK/dV: one CTA per (key block, K/V head, batch) holds its B_c rows of K and V and walks
//    every query tile that sees them, for each query head of the K/V head (GQA sums without
//    expanding K and V): Sᵀ = K·Qᵀ, Pᵀ = exp2(Sᵀ·scale·log2e - LSE·log2e), dPᵀ = V·dOᵀ,
//    dSᵀ = Pᵀ ∘ (dPᵀ - D), dV += Pᵀ·dO, dK += dSᵀ·Q; dK scaled at the end;
//  - dQ: one CTA per (query tile, head, batch) walks the key blocks its rows see: S, P, dP
//    and dS again, dQ += dS·K.
// V, dO and dV may have a head dim of their own (DeepSeek's MLA: 128 with 192): dP's k extent
// and dV's columns are V's.
// dQ has a kernel of its own rather than atomics from the dK/dV kernel: every gradient is
// summed in one fixed order (deterministic, a row's independent of the batch) at the cost of
// computing S and dP twice (seven GEMMs where one kernel with atomics has five).
//
// In both main kernels the score tiles (S, dP) are split over the warps in 16-row groups and
// column groups (WarpLayout); P and dS go through shared memory as 16-bit tiles, from where the
// gradient GEMMs read them as A operands with their own split of the output's columns.

#include <cstdint>

#include "kernels/backward_preprocess.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/primitives/element.cuh"
#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/mask.cuh"
#include "kernels/primitives/masking.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm80/gm2sm.cuh"
#include "kernels/primitives/sm80/warp_gemm.cuh"
#include "kernels/primitives/smem_tile.cuh"
#include "kernels/sm80/traits.cuh"

namespace flash_attention::sm80 {

// A Rows x Cols tile split over Warps warps: 16-row groups, and the warps of a group over the
// columns (config space rule "backward_tiles" keeps each warp's columns whole n8 pairs).
template <int Rows, int Cols, int Warps>
struct WarpLayout {
    static constexpr int row_groups = Rows / mma_m;
    static constexpr int column_groups = Warps / row_groups;
    static constexpr int cols = Cols / column_groups;  // per warp
    static constexpr int n_tiles = cols / 8;
    static_assert(row_groups * column_groups == Warps && n_tiles % 2 == 0);

    __device__ static int row0() { return (threadIdx.x / warp_size) % row_groups * mma_m; }
    __device__ static int col0() { return (threadIdx.x / warp_size) / row_groups * cols; }
};

template <KernelConfig C>
struct BackwardTraits {
    static_assert(unpack(pack(C)) == C, "every field fits the packed kernel parameter");
    using T = typename Element<C.dtype>::type;
    static constexpr DType dtype = C.dtype;
    static constexpr int d_head = C.d_head;     // Q's, K's, dQ's and dK's columns
    static constexpr int d_v = C.v_head_dim();  // V's, dO's and dV's
    static constexpr int B_r = C.B_r;           // query rows of a tile
    static constexpr int B_c = C.B_c;           // key rows of a block
    static constexpr int warps = C.n_warps;
    static constexpr int threads = C.n_threads();
    static constexpr bool async = C.sm80.async_copy;

    using QTile = SmemTile<B_r, d_head, C.sm80.swizzled>;  // Q (the dQ kernel: then dQ)
    using DoTile = SmemTile<B_r, d_v, C.sm80.swizzled>;    // dO
    using KTile = SmemTile<B_c, d_head, C.sm80.swizzled>;  // K, then dK
    using VTile = SmemTile<B_c, d_v, C.sm80.swizzled>;     // V, then dV
    using PtTile = SmemTile<B_c, B_r, C.sm80.swizzled>;    // Pᵀ and dSᵀ
    using DsTile = SmemTile<B_r, B_c, C.sm80.swizzled>;    // dS
    // k16 tiles of S's k extent (d_head) and of dP's (d_v), and of fragments per load.
    static constexpr int k_tiles_d = d_head / 16;
    static constexpr int step_d = k_tiles_d >= 4 ? 2 : 1;
    static constexpr int k_tiles_v = d_v / 16;
    static constexpr int step_v = k_tiles_v >= 4 ? 2 : 1;

    // The dK/dV kernel's shared memory (its size is backward_dkdv_smem_bytes(C)).
    struct DkDvSmem {
        alignas(128) unsigned char k[KTile::bytes];
        alignas(128) unsigned char v[VTile::bytes];
        alignas(128) unsigned char q[QTile::bytes];
        alignas(128) unsigned char d_o[DoTile::bytes];
        alignas(128) unsigned char p_t[PtTile::bytes];
        alignas(128) unsigned char ds_t[PtTile::bytes];
        float lse2[B_r];  // the Q tile's LSE in base 2 (+inf past seq_q: P = 0)
        float d[B_r];     // and D
    };
    // The dQ kernel's.
    struct DqSmem {
        alignas(128) unsigned char q[QTile::bytes];
        alignas(128) unsigned char d_o[DoTile::bytes];
        alignas(128) unsigned char k[KTile::bytes];
        alignas(128) unsigned char v[VTile::bytes];
        alignas(128) unsigned char ds[DsTile::bytes];
    };
    static_assert(sizeof(DkDvSmem) == backward_dkdv_smem_bytes(C));
    static_assert(sizeof(DqSmem) == backward_dq_smem_bytes(C));
};

// Stores a warp's 16 x (8 * NT) fp32 accumulators, rounded to 16 bits, at rows row0 + [0, 16)
// and columns col0 + [0, 8 * NT) of a shared-memory tile.
template <DType dtype, class Tile, int NT>
__device__ __forceinline__ void store_tile_RF2SM(const float (&a)[1][NT][4], std::uint32_t tile,
                                                 int row0, int col0) {
    const int lane = lane_id();
    const int row = row0 + lane / 4;
    const std::uint32_t col_bytes = (lane % 4) * 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int chunk = col0 / 8 + nt;
        ptx::st_shared_4(tile + Tile::chunk_offset(row, chunk) + col_bytes,
                         ptx::pack_rn<dtype>(a[0][nt][0], a[0][nt][1]));
        ptx::st_shared_4(tile + Tile::chunk_offset(row + 8, chunk) + col_bytes,
                         ptx::pack_rn<dtype>(a[0][nt][2], a[0][nt][3]));
    }
}

// Copies the first `rows` rows of a shared-memory tile to GMEM with every thread of the CTA;
// row r goes to gmem_row(r), a T*.
template <class Tile, int Threads, class GmemRow>
__device__ __forceinline__ void copy_tile_SM2GM(std::uint32_t tile, const GmemRow& gmem_row,
                                                int rows) {
    for (int c = threadIdx.x; c < Tile::rows * Tile::chunks_per_row; c += Threads) {
        const int r = c / Tile::chunks_per_row;
        const int chunk = c % Tile::chunks_per_row;
        if (r < rows)
            ptx::st_global_16(gmem_row(r) + chunk * 8,
                              ptx::ld_shared_16(tile + Tile::chunk_offset(r, chunk)));
    }
}

// Rows [0, rows) of two tensors' tiles of one head (K and V, or Q and dO: TileA and TileB) into
// shared memory, zero-filled past `rows`.
template <class TileA, class TileB, int Threads, bool Async, class T>
__device__ __forceinline__ void copy_tile_pair(const T* a, std::int64_t a_stride,
                                               std::uint32_t a_smem, const T* b,
                                               std::int64_t b_stride, std::uint32_t b_smem,
                                               int rows) {
    TileCopyGM2SM<TileA, Threads, Async, T>(a, a_stride, a_smem).copy_rows(rows);
    TileCopyGM2SM<TileB, Threads, Async, T>(b, b_stride, b_smem).copy_rows(rows);
}

template <int NT>
__device__ __forceinline__ void scale_accumulators(float (&a)[1][NT][4], float factor) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
            a[0][nt][i] *= factor;
    }
}

template <bool Async>
__device__ __forceinline__ void finish_copies() {
    if constexpr (Async) {
        ptx::cp_async_commit_group();
        ptx::cp_async_wait_group<0>();
    }
    __syncthreads();
}

// The two score GEMMs of one tile pair: S = A1·B1ᵀ over k = d_head (RowTile, ColTile: the
// tiles of A1 and B1) and dP = A2·B2ᵀ over k = d_v (RowTile2, ColTile2), on this warp's 16 rows
// and n8 columns of Layout (A: the rows' tiles, B: the columns').
template <class Tr, class Layout, class RowTile, class ColTile, class RowTile2, class ColTile2>
__device__ __forceinline__ void score_gemms(float (&s)[1][Layout::n_tiles][4],
                                            float (&dp)[1][Layout::n_tiles][4], std::uint32_t a1,
                                            std::uint32_t b1, std::uint32_t a2, std::uint32_t b2) {
    const int row0 = Layout::row0();
    zero(s);
    zero(dp);
    warp_gemm<Tr::dtype, Tr::k_tiles_d, Tr::step_d, true>(
        s, SmemA<RowTile, 1>(a1, row0),
        SmemB<ColTile, Layout::n_tiles, false>(b1 + Layout::col0() * ColTile::row_bytes));
    warp_gemm<Tr::dtype, Tr::k_tiles_v, Tr::step_v, true>(
        dp, SmemA<RowTile2, 1>(a2, row0),
        SmemB<ColTile2, Layout::n_tiles, false>(b2 + Layout::col0() * ColTile2::row_bytes));
}

// P = exp2(S·scale_log2 - lse2) and dS = P ∘ (dP - D) in place (s becomes P, dp dS), with
// lse2 and D per score element: (row h of the m16 tile, column pair element e). Softcap: s
// holds t = tanh(S · prescale) (masked after), and dS carries tanh's derivative 1 - t² (0 where
// masked: t is -inf there). Alibi: ALiBi's bias joins t in the exponent only, since the
// derivative is the tanh's.
template <bool Softcap, bool Alibi, int NT, class RowStats>
__device__ __forceinline__ void probabilities_and_ds(float (&s)[1][NT][4], float (&dp)[1][NT][4],
                                                     float scale_log2, const RowStats& stats,
                                                     const AlibiTile& bias) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 ld = stats(nt, i / 2, i % 2);  // (lse2, D)
            const float t = s[0][nt][i];
            const float p = ptx::ex2((Alibi ? t + bias(0, nt, i) : t) * scale_log2 - ld.x);
            s[0][nt][i] = p;
            dp[0][nt][i] = p * (dp[0][nt][i] - ld.y);
            if constexpr (Softcap)
                dp[0][nt][i] *= fmaxf(1.0f - t * t, 0.0f);
        }
    }
}

// dK and dV of one key block of one K/V head. Mask: CausalMask, or BandMask for a sliding
// window (BackwardArgs::band); Softcap: BackwardArgs::softcap_prescale; Alibi (with BandMask):
// BackwardArgs::alibi_slopes.
template <unsigned long long CodeHi, unsigned long long CodeLo, class Mask, bool Softcap,
          bool Alibi>
__global__ void __launch_bounds__(BackwardTraits<unpack(CodeHi, CodeLo)>::threads, 1)
    backward_dkdv_kernel(const __grid_constant__ BackwardArgs args) {
    constexpr KernelConfig C = unpack(CodeHi, CodeLo);
    using Tr = BackwardTraits<C>;
    using T = typename Tr::T;
    using Scores = WarpLayout<Tr::B_c, Tr::B_r, Tr::warps>;    // Sᵀ, dPᵀ: keys x queries
    using Grads = WarpLayout<Tr::B_c, Tr::d_head, Tr::warps>;  // dK: keys x d_head
    using GradsV = WarpLayout<Tr::B_c, Tr::d_v, Tr::warps>;    // dV: keys x d_v
    constexpr int NS = Scores::n_tiles;
    constexpr int NG = Grads::n_tiles;
    constexpr int NGV = GradsV::n_tiles;

    extern __shared__ __align__(128) unsigned char smem_bytes[];
    auto& smem = *reinterpret_cast<typename Tr::DkDvSmem*>(smem_bytes);
    const std::uint32_t k_s = ptx::smem_address(smem.k), v_s = ptx::smem_address(smem.v);
    const std::uint32_t q_s = ptx::smem_address(smem.q), d_o_s = ptx::smem_address(smem.d_o);
    const std::uint32_t p_t_s = ptx::smem_address(smem.p_t);
    const std::uint32_t ds_t_s = ptx::smem_address(smem.ds_t);

    const int key_block = blockIdx.x;
    const int kv_head = blockIdx.y;
    const BackwardSequence seq = BackwardSequence::of(args, blockIdx.z);
    const int k0 = key_block * Tr::B_c;
    if (k0 >= seq.k_len)
        return;  // a packed sequence shorter than the grid's
    const int k_rows = min(Tr::B_c, seq.k_len - k0);
    const int group = args.heads / args.heads_kv;
    const Mask mask = Mask::of(args, seq.q_len, seq.k_len);
    // ALiBi: a query's position on the diagonal is its index plus this.
    const int shift = band_shift(seq.q_len, seq.k_len, args.top_left);
    // The query tiles that see a key of the block.
    const QueryBlocks tiles = QueryBlocks::of(mask, k0, k0 + k_rows - 1, Tr::B_r);

    // Row `row` of a tensor of the sequence's entry (q_row0 and k_row0 added by the callers).
    const auto rows_at = [&](const void* base, const TensorStrides& st, int h, std::int64_t row) {
        return static_cast<const T*>(base) + seq.entry * st.batch + h * st.head + row * st.seq;
    };
    copy_tile_pair<typename Tr::KTile, typename Tr::VTile, Tr::threads, Tr::async>(
        rows_at(args.k, args.k_stride, kv_head, seq.k_row0 + k0), args.k_stride.seq, k_s,
        rows_at(args.v, args.v_stride, kv_head, seq.k_row0 + k0), args.v_stride.seq, v_s, k_rows);

    float dk[1][NG][4], dv[1][NGV][4];
    zero(dk);
    zero(dv);
    const int row0 = Scores::row0(), col0 = Scores::col0();
    for (int g = 0; g < group; ++g) {
        const int head = kv_head * group + g;
        for (int tile = tiles.first; tile < tiles.end; ++tile) {
            const int q0 = tile * Tr::B_r;
            const int q_rows = min(Tr::B_r, seq.q_len - q0);
            // The previous tile's readers of Q, dO, Pᵀ, dSᵀ and the statistics are done.
            __syncthreads();
            copy_tile_pair<typename Tr::QTile, typename Tr::DoTile, Tr::threads, Tr::async>(
                rows_at(args.q, args.q_stride, head, seq.q_row0 + q0), args.q_stride.seq, q_s,
                rows_at(args.d_o, args.d_o_stride, head, seq.q_row0 + q0), args.d_o_stride.seq,
                d_o_s, q_rows);
            for (int r = threadIdx.x; r < Tr::B_r; r += Tr::threads) {
                smem.lse2[r] =
                    r < q_rows ? lse_base2(args.lse[seq.lse(args, head, q0 + r)]) : INFINITY;
                smem.d[r] = r < q_rows ? args.d[seq.ws(args, head, q0 + r)] : 0.0f;
            }
            finish_copies<Tr::async>();

            float s[1][NS][4], dp[1][NS][4];  // Sᵀ and dPᵀ, then Pᵀ and dSᵀ
            score_gemms<Tr, Scores, typename Tr::KTile, typename Tr::QTile, typename Tr::VTile,
                        typename Tr::DoTile>(s, dp, k_s, q_s, v_s, d_o_s);
            if constexpr (Softcap)  // before the mask: tanh(-inf) would be -1
                softcap_scores(s, args.softcap_prescale);
            if (!mask.whole(q0, Tr::B_r, k0, Tr::B_c))
                mask_key_rows(mask, s, k0 + row0, q0 + col0);
            // Keys are the rows here: a query's position is its index plus the shift.
            const AlibiTile bias(Alibi ? alibi_slope(args.alibi_slopes, args.alibi_batch_stride,
                                                     seq.index, head, args.scale_log2)
                                       : 0.0f,
                                 k0 + row0, q0 + col0 + shift);
            probabilities_and_ds<Softcap, Alibi>(
                s, dp, args.scale_log2,
                [&](int nt, int, int e) {
                    const int c = col0 + nt * 8 + 2 * (lane_id() % 4) + e;
                    return float2{smem.lse2[c], smem.d[c]};
                },
                bias);
            store_tile_RF2SM<Tr::dtype, typename Tr::PtTile>(s, p_t_s, row0, col0);
            store_tile_RF2SM<Tr::dtype, typename Tr::PtTile>(dp, ds_t_s, row0, col0);
            __syncthreads();

            // dV += Pᵀ·dO and dK += dSᵀ·Q over k = the tile's B_r queries.
            const SmemB<typename Tr::DoTile, NGV, true> d_o_frags(d_o_s, GradsV::col0());
            const SmemB<typename Tr::QTile, NG, true> q_frags(q_s, Grads::col0());
            warp_gemm<Tr::dtype, Tr::B_r / 16, 1, false>(
                dv, SmemA<typename Tr::PtTile, 1>(p_t_s, GradsV::row0()), d_o_frags);
            warp_gemm<Tr::dtype, Tr::B_r / 16, 1, false>(
                dk, SmemA<typename Tr::PtTile, 1>(ds_t_s, Grads::row0()), q_frags);
        }
    }

    // dK = scale · dSᵀ·Q. Staged through K's and V's tiles, once no warp reads them and their
    // copies have landed (a block no query sees issued them and computed nothing).
    scale_accumulators(dk, args.softmax_scale);
    finish_copies<Tr::async>();
    store_tile_RF2SM<Tr::dtype, typename Tr::KTile>(dk, k_s, Grads::row0(), Grads::col0());
    store_tile_RF2SM<Tr::dtype, typename Tr::VTile>(dv, v_s, GradsV::row0(), GradsV::col0());
    __syncthreads();
    const auto out_rows = [&](void* base, const TensorStrides& st) {
        return [=](int r) {
            return static_cast<T*>(base) + seq.entry * st.batch + kv_head * st.head +
                   (std::int64_t{seq.k_row0} + k0 + r) * st.seq;
        };
    };
    copy_tile_SM2GM<typename Tr::KTile, Tr::threads>(k_s, out_rows(args.dk, args.dk_stride),
                                                     k_rows);
    copy_tile_SM2GM<typename Tr::VTile, Tr::threads>(v_s, out_rows(args.dv, args.dv_stride),
                                                     k_rows);
}

// dQ of one query tile of one head (Mask, Softcap and Alibi as the dK/dV kernel's).
template <unsigned long long CodeHi, unsigned long long CodeLo, class Mask, bool Softcap,
          bool Alibi>
__global__ void __launch_bounds__(BackwardTraits<unpack(CodeHi, CodeLo)>::threads, 1)
    backward_dq_kernel(const __grid_constant__ BackwardArgs args) {
    constexpr KernelConfig C = unpack(CodeHi, CodeLo);
    using Tr = BackwardTraits<C>;
    using T = typename Tr::T;
    using Scores = WarpLayout<Tr::B_r, Tr::B_c, Tr::warps>;    // S, dP: queries x keys
    using Grads = WarpLayout<Tr::B_r, Tr::d_head, Tr::warps>;  // dQ: queries x d_head
    constexpr int NS = Scores::n_tiles;
    constexpr int NG = Grads::n_tiles;

    extern __shared__ __align__(128) unsigned char smem_bytes[];
    auto& smem = *reinterpret_cast<typename Tr::DqSmem*>(smem_bytes);
    const std::uint32_t q_s = ptx::smem_address(smem.q), d_o_s = ptx::smem_address(smem.d_o);
    const std::uint32_t k_s = ptx::smem_address(smem.k), v_s = ptx::smem_address(smem.v);
    const std::uint32_t ds_s = ptx::smem_address(smem.ds);

    // Causal: the last query tiles see the most keys; launched first, they do not form the
    // grid's tail (the dK/dV kernel's longest blocks are its first already).
    const int tile = args.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int head = blockIdx.y;
    const BackwardSequence seq = BackwardSequence::of(args, blockIdx.z);
    const int kv_head = head / (args.heads / args.heads_kv);
    const int q0 = tile * Tr::B_r;
    if (q0 >= seq.q_len)
        return;  // a packed sequence shorter than the grid's
    const int q_rows = min(Tr::B_r, seq.q_len - q0);
    const Mask mask = Mask::of(args, seq.q_len, seq.k_len);
    const float slope = Alibi ? alibi_slope(args.alibi_slopes, args.alibi_batch_stride, seq.index,
                                            head, args.scale_log2)
                              : 0.0f;
    const int position0 = q0 + Scores::row0() + band_shift(seq.q_len, seq.k_len, args.top_left);
    // Key blocks from the first that the tile's first row sees to the last its last row sees.
    const int last_keys = mask.key_end(q0 + q_rows - 1);
    const int blocks = last_keys <= 0 ? 0 : blocks_covering(last_keys, Tr::B_c);
    const int first_block = min(mask.key_begin(q0) / Tr::B_c, blocks);

    // Row `row` of a tensor of the sequence's entry (q_row0 and k_row0 added by the callers).
    const auto rows_at = [&](const void* base, const TensorStrides& st, int h, std::int64_t row) {
        return static_cast<const T*>(base) + seq.entry * st.batch + h * st.head + row * st.seq;
    };
    copy_tile_pair<typename Tr::QTile, typename Tr::DoTile, Tr::threads, Tr::async>(
        rows_at(args.q, args.q_stride, head, seq.q_row0 + q0), args.q_stride.seq, q_s,
        rows_at(args.d_o, args.d_o_stride, head, seq.q_row0 + q0), args.d_o_stride.seq, d_o_s,
        q_rows);

    // Each thread's two rows of the m16 score tile (lane / 4 and lane / 4 + 8): LSE and D.
    const int row0 = Scores::row0(), col0 = Scores::col0();
    float2 stats[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int q = q0 + row0 + lane_id() / 4 + 8 * h;
        stats[h] = q < seq.q_len ? float2{lse_base2(args.lse[seq.lse(args, head, q)]),
                                          args.d[seq.ws(args, head, q)]}
                                 : float2{INFINITY, 0.0f};
    }

    float dq[1][NG][4];
    zero(dq);
    for (int block = first_block; block < blocks; ++block) {
        const int k0 = block * Tr::B_c;
        const int k_rows = min(Tr::B_c, seq.k_len - k0);
        // The previous block's readers of K, V and dS are done.
        __syncthreads();
        copy_tile_pair<typename Tr::KTile, typename Tr::VTile, Tr::threads, Tr::async>(
            rows_at(args.k, args.k_stride, kv_head, seq.k_row0 + k0), args.k_stride.seq, k_s,
            rows_at(args.v, args.v_stride, kv_head, seq.k_row0 + k0), args.v_stride.seq, v_s,
            k_rows);
        finish_copies<Tr::async>();

        float s[1][NS][4], dp[1][NS][4];  // S and dP, then P and dS
        score_gemms<Tr, Scores, typename Tr::QTile, typename Tr::KTile, typename Tr::DoTile,
                    typename Tr::VTile>(s, dp, q_s, k_s, d_o_s, v_s);
        if constexpr (Softcap)
            softcap_scores(s, args.softcap_prescale);
        if (!mask.whole(q0, Tr::B_r, k0, Tr::B_c))
            mask_query_rows(mask, s, q0 + row0, k0 + col0);
        probabilities_and_ds<Softcap, Alibi>(
            s, dp, args.scale_log2, [&](int, int h, int) { return stats[h]; },
            AlibiTile(slope, position0, k0 + col0));
        store_tile_RF2SM<Tr::dtype, typename Tr::DsTile>(dp, ds_s, row0, col0);
        __syncthreads();

        // dQ += dS·K over k = the block's B_c keys.
        warp_gemm<Tr::dtype, Tr::B_c / 16, 1, false>(
            dq, SmemA<typename Tr::DsTile, 1>(ds_s, Grads::row0()),
            SmemB<typename Tr::KTile, NG, true>(k_s, Grads::col0()));
    }

    // dQ = scale · dS·K, staged through Q's tile once its copy has landed (a tile that sees no
    // key computed nothing) and no warp reads it.
    scale_accumulators(dq, args.softmax_scale);
    finish_copies<Tr::async>();
    store_tile_RF2SM<Tr::dtype, typename Tr::QTile>(dq, q_s, Grads::row0(), Grads::col0());
    __syncthreads();
    copy_tile_SM2GM<typename Tr::QTile, Tr::threads>(
        q_s,
        [&](int r) {
            return static_cast<T*>(args.dq) + seq.entry * args.dq_stride.batch +
                   head * args.dq_stride.head +
                   (std::int64_t{seq.q_row0} + q0 + r) * args.dq_stride.seq;
        },
        q_rows);
}

}  // namespace flash_attention::sm80
