#pragma once

// Warp-level GEMM on mma.sync m16n8k16 tiles: operand fragment sources (registers or
// shared memory through ldmatrix) and a k-loop that loads fragments a few k-tiles at
// a time, optionally double-buffered.
//
// Fragment shapes (per thread, PTX ISA "mma.m16n8k16" fragment layouts):
//   A  m16 x k16, row-major : uint32_t[4] (8 x 16-bit)
//   B  k16 x n8,  "col"     : uint32_t[2] (4 x 16-bit)
//   C  m16 x n8,  fp32      : float[4]; [0],[1] on row lane/4, [2],[3] on row lane/4 + 8,
//                             columns 2*(lane%4) and 2*(lane%4)+1

#include <cstdint>

#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/smem_tile.cuh"

namespace flash_attention {

// A operand already in registers for the whole k extent (Q held across the main
// loop, or P straight from the softmax): nothing to load per step.
template <int MTiles, int KTiles>
struct RegisterA {
    const std::uint32_t (&frags)[MTiles][KTiles][4];

    template <int Step>
    struct Frags {};

    template <int Step>
    __device__ __forceinline__ void load(Frags<Step>&, int) const {}

    template <int Step>
    __device__ __forceinline__ const std::uint32_t (&fragment(const Frags<Step>&, int step, int kt,
                                                              int mt) const)[4] {
        return frags[mt][step * Step + kt];
    }
};

// A operand (row-major m16 x k16 tiles) read from a shared-memory tile with
// ldmatrix.x4: lanes 0-15 address rows 0-15 of the left 8 columns, lanes 16-31 the
// right 8, which yields a0..a7 in mma order.
template <class Tile, int MTiles>
struct SmemA {
    LaneRowPointer<Tile> lane_row;

    __device__ __forceinline__ SmemA(std::uint32_t tile_base, int warp_row0)
        : lane_row(tile_base, warp_row0 + lane_id() % 16, lane_id() / 16) {}

    template <int Step>
    struct Frags {
        std::uint32_t r[MTiles][Step][4];
    };

    template <int Step>
    __device__ __forceinline__ void load(Frags<Step>& f, int step) const {
#pragma unroll
        for (int mt = 0; mt < MTiles; ++mt) {
#pragma unroll
            for (int kt = 0; kt < Step; ++kt) {
                ptx::ldmatrix_x4(f.r[mt][kt], lane_row.at(mt * 16, 2 * (step * Step + kt)));
            }
        }
    }

    template <int Step>
    __device__ __forceinline__ const std::uint32_t (&fragment(const Frags<Step>& f, int, int kt,
                                                              int mt) const)[4] {
        return f.r[mt][kt];
    }
};

// B operand read from a (k-major rows) shared-memory tile holding Bᵀ or B:
//  - Transposed = false: the tile is (n x k) row-major, e.g. K for S = Q·Kᵀ; that is
//    B in the "col" layout mma wants, so plain ldmatrix yields the fragments.
//  - Transposed = true: the tile is (k x n) row-major, e.g. V for O = P·V; .trans
//    transposes each 8x8 on the way into registers.
// One ldmatrix.x4 covers two n8 tiles of one k16 tile. The n extent starts at chunk0 (in 8-column
// chunks of a transposed tile: a warp's share of the backward's gradient columns), else at 0.
template <class Tile, int NTiles, bool Transposed>
struct SmemB {
    static_assert(NTiles % 2 == 0, "ldmatrix.x4 loads n8 tiles in pairs");
    LaneRowPointer<Tile> lane_row;
    int chunk0 = 0;

    // Matrix m = lane / 8 of the x4: for K, n-tile m/2 and k-half m%2; for V,
    // k-half m%2 (rows) and n-tile m/2 (chunks).
    __device__ __forceinline__ static LaneRowPointer<Tile> lane_pointer(std::uint32_t tile_base) {
        const int m = lane_id() / 8;
        const int r = lane_id() % 8;
        return Transposed ? LaneRowPointer<Tile>(tile_base, (m % 2) * 8 + r, m / 2)
                          : LaneRowPointer<Tile>(tile_base, (m / 2) * 8 + r, m % 2);
    }

    __device__ __forceinline__ explicit SmemB(std::uint32_t tile_base)
        : lane_row(lane_pointer(tile_base)) {}
    __device__ __forceinline__ SmemB(std::uint32_t tile_base, int col0)
        : lane_row(lane_pointer(tile_base)), chunk0(col0 / 8) {
        static_assert(Transposed, "a column offset into a transposed (k x n) tile");
    }

    template <int Step>
    struct Frags {
        std::uint32_t r[Step][NTiles][2];
    };

    template <int Step>
    __device__ __forceinline__ void load(Frags<Step>& f, int step) const {
#pragma unroll
        for (int kt = 0; kt < Step; ++kt) {
            const int k_tile = step * Step + kt;
#pragma unroll
            for (int pair = 0; pair < NTiles / 2; ++pair) {
                std::uint32_t x[4];
                if constexpr (Transposed) {
                    ptx::ldmatrix_x4_trans(x, lane_row.at(16 * k_tile, chunk0 + 2 * pair));
                } else {
                    ptx::ldmatrix_x4(x, lane_row.at(16 * pair, 2 * k_tile));
                }
                f.r[kt][2 * pair][0] = x[0];
                f.r[kt][2 * pair][1] = x[1];
                f.r[kt][2 * pair + 1][0] = x[2];
                f.r[kt][2 * pair + 1][1] = x[3];
            }
        }
    }
};

// C[MT][NT] += A · B over KTiles k16 tiles, the fragments of Step k-tiles loaded per
// step. With DoubleBuffer the loads for step s+1 are issued before the MMAs of step
// s, so shared-memory latency hides behind tensor-core work (at the cost of a second
// set of fragment registers).
template <DType dtype, int KTiles, int Step, bool DoubleBuffer, class ASource, class BSource,
          int MT, int NT>
__device__ __forceinline__ void warp_gemm(float (&c)[MT][NT][4], const ASource& a,
                                          const BSource& b) {
    static_assert(KTiles % Step == 0, "the load step divides the k extent");
    constexpr int steps = KTiles / Step;
    constexpr int buffers = DoubleBuffer && steps > 1 ? 2 : 1;
    typename ASource::template Frags<Step> fa[buffers];
    typename BSource::template Frags<Step> fb[buffers];
    const auto mmas = [&](int buffer, int step) {
#pragma unroll
        for (int kt = 0; kt < Step; ++kt) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    ptx::mma_m16n8k16<dtype>(c[mt][nt], a.fragment(fa[buffer], step, kt, mt),
                                             fb[buffer].r[kt][nt]);
                }
            }
        }
    };
    if constexpr (buffers == 1) {
#pragma unroll
        for (int s = 0; s < steps; ++s) {
            a.load(fa[0], s);
            b.load(fb[0], s);
            mmas(0, s);
        }
    } else {
        // The last step has nothing left to prefetch; peeling it keeps the loop free of
        // conditions, which NVVM needs to unroll it (unrolled, the buffer index is a
        // constant and both buffers stay in registers rather than local memory).
        a.load(fa[0], 0);
        b.load(fb[0], 0);
#pragma unroll
        for (int s = 0; s < steps - 1; ++s) {
            a.load(fa[(s + 1) % 2], s + 1);
            b.load(fb[(s + 1) % 2], s + 1);
            mmas(s % 2, s);
        }
        mmas((steps - 1) % 2, steps - 1);
    }
}

// The m16n8 fp32 accumulators of two adjacent n8 tiles hold exactly one m16k16
// A-operand tile (PTX ISA fragment layouts), so P = softmax(S) feeds the next MMA
// without leaving registers: `lo` the tile of columns 0-7, `hi` of 8-15.
template <DType dtype>
__device__ __forceinline__ void a_fragment(const float (&lo)[4], const float (&hi)[4],
                                           std::uint32_t (&a)[4]) {
    a[0] = ptx::pack_rn<dtype>(lo[0], lo[1]);
    a[1] = ptx::pack_rn<dtype>(lo[2], lo[3]);
    a[2] = ptx::pack_rn<dtype>(hi[0], hi[1]);
    a[3] = ptx::pack_rn<dtype>(hi[2], hi[3]);
}

template <DType dtype, int MT, int NT>
__device__ __forceinline__ void accumulators_to_a_fragments(const float (&s)[MT][NT][4],
                                                            std::uint32_t (&p)[MT][NT / 2][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int kt = 0; kt < NT / 2; ++kt)
            a_fragment<dtype>(s[mt][2 * kt], s[mt][2 * kt + 1], p[mt][kt]);
    }
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&c)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                c[mt][nt][e] = 0.0f;
        }
    }
}

}  // namespace flash_attention
