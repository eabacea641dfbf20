#pragma once

// The end of a consumer's tile: O rounded to 16 bits into the consumer's Q region (which Q
// no longer needs) or a region of its own (Traits::o_apart) in TMA's swizzled layout, then
// stored with TMA.

#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm90/ptx.cuh"
#include "kernels/primitives/sm90/tma.cuh"
#include "kernels/sm90/tensor_maps.hpp"
#include "kernels/sm90/tile_scheduler.cuh"
#include "kernels/sm90/traits.cuh"

namespace flash_attention::sm90 {

// The buffer whose O store the storing thread has issued: handed back (its empty barrier)
// once the store has read it. With two Q buffers that waits until the next tile's first
// GEMM has run, since the producer needs this buffer only for the tile after next: the
// store's read of shared memory (about as long as a K/V block's GEMM at short lengths) then
// no longer holds up the warpgroup's next wgmma. With one buffer, or O's own region (the
// next consumer's store waits for it), handed back at once.
struct PendingStore {
    tma::Barrier* empty = nullptr;  // set in the storing thread only

    __device__ __forceinline__ void hand_back() {
        if (empty != nullptr) {
            tma::wait_stores_read();
            empty->arrive();
            empty = nullptr;
        }
    }
};

// O apart (Traits::o_apart): the barrier of O's region, after the pipeline's.
template <class Tr>
__device__ __forceinline__ tma::Barrier* o_region_empty(unsigned char* smem) {
    return reinterpret_cast<tma::Barrier*>(smem + Tr::o_barrier_offset);
}

// Where a consumer stages its O: its Q region, handed back through its rows' q_empty,
// or (O apart) the one O region, whose uses run each tile's consumers in turn: use `use`
// waits until the store of use - 1 has read the region (its barrier's phase use - 1). The
// storing thread waits, the one that completed this consumer's previous phase: a parity
// names a phase only while the barrier is at most one phase behind, and the consumer's
// other warps can reach here before that thread has arrived (a tile without GEMMs has no
// warpgroup-wide step; racecheck found their writes under the previous store's read).
template <class Tr>
struct OStaging {
    unsigned char* region;
    tma::Barrier* empty;
    int use;

    __device__ __forceinline__ void wait_free(int consumer) const {
        if constexpr (Tr::o_apart) {
            if (threadIdx.x % warpgroup_threads == 0 && use > 0)
                empty->wait(static_cast<std::uint32_t>((use - 1) & 1));
            ptx::named_barrier_sync(Tr::barrier_id(NamedBarrier::epilogue, consumer),
                                    warpgroup_threads);
        }
    }
};

// O (fp32, this warpgroup's 64 rows) rounded to 16 bits into its staging region (above) in
// TMA's swizzled layout, then one thread stores it with TMA. Each quad writes 16
// contiguous bytes of a row's 16-byte chunk; the 8 rows of a warp's store land in 8
// different chunks (the tile's swizzle), so the 32 lanes hit 32 different banks. The
// region goes back through `pending` (above). TMA clips rows only at the
// view's end: when the sequence ends inside the view (packed sequences), rows past it are
// another sequence's, and a consumer whose rows cross that end stores its rows itself.
template <class Tr, bool PerSequence>
__device__ __forceinline__ void store_output(const Params& params, const Tile& t, int consumer,
                                             const float (&o)[1][Tr::d_head / 8][4],
                                             const OStaging<Tr>& staging, PendingStore& pending) {
    unsigned char* const region = staging.region;
    const int lane = threadIdx.x % warp_size;
    const int warp_row0 = warp_in_warpgroup() * mma_m;
    const int row0 = t.q_row0 + consumer * Tr::rows_per_consumer;  // in the sequence
    const int rows = t.q.len - row0;  // of this consumer's, in the sequence
    const bool by_tma = !PerSequence || rows >= Tr::rows_per_consumer ||
                        t.q.row0 + t.q.len == params.args.seqs.q_view_seq;
    // With Q in registers this warp's lanes read these rows with ldmatrix at the tile's
    // start; a tile that sees no key reaches here with no other warp-level sync between
    // (compute-sanitizer racecheck reported it).
    __syncwarp();
    staging.wait_free(consumer);
    if (by_tma) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = warp_row0 + lane / 4 + 8 * h;
#pragma unroll
            for (int nt = 0; nt < Tr::d_head / 8; ++nt) {
                const int offset = Tr::QTile::chunk_offset(nt / 8, row, nt % 8) + (lane % 4) * 4;
                ptx::st_shared_4(ptx::smem_address(region + offset),
                                 ptx::pack_rn<Tr::dtype>(o[0][nt][2 * h], o[0][nt][2 * h + 1]));
            }
        }
        // The TMA store reads through the async proxy: each writer fences its own stores,
        // then the warpgroup's barrier tells the issuing thread that all have.
        tma::fence_shared_to_async_proxy();
    } else {
        // From the accumulators: 4 bytes a lane, a quad's 16 contiguous, once per
        // sequence and head.
        const KernelArgs& args = params.args;
        using T = typename Tr::T;
        T* base = static_cast<T*>(args.o) + std::int64_t{t.q.entry} * args.o_stride.batch +
                  std::int64_t{t.q.row0 + row0} * args.o_stride.seq +
                  std::int64_t{t.head} * args.o_stride.head + 2 * (lane % 4);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = warp_row0 + lane / 4 + 8 * h;
            if (row >= rows)
                continue;
#pragma unroll
            for (int nt = 0; nt < Tr::d_head / 8; ++nt) {
                ptx::st_global_4(base + std::int64_t{row} * args.o_stride.seq + nt * 8,
                                 ptx::pack_rn<Tr::dtype>(o[0][nt][2 * h], o[0][nt][2 * h + 1]));
            }
        }
    }
    ptx::named_barrier_sync(Tr::barrier_id(NamedBarrier::epilogue, consumer), warpgroup_threads);
    if (threadIdx.x % warpgroup_threads == 0) {
        if (by_tma) {
            tma::store_tile<typename Tr::QTile>(region, &params.maps.o, t.q.row0 + row0, t.head,
                                                t.q.entry);
        }
        pending.empty = staging.empty;
        if constexpr (Tr::q_buffers == 1)
            pending.hand_back();
    }
}

}  // namespace flash_attention::sm90
