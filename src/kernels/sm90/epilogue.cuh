#pragma once

// The end of a consumer's tile: O rounded to 16 bits into the consumer's Q region (which Q
// no longer needs) in TMA's swizzled layout, then stored with TMA.

#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm90/ptx.cuh"
#include "kernels/primitives/sm90/tma.cuh"
#include "kernels/sm90/tensor_maps.hpp"
#include "kernels/sm90/tile_scheduler.cuh"
#include "kernels/sm90/traits.cuh"

namespace flash_attention::sm90 {

// O (fp32, this warpgroup's 64 rows) rounded to 16 bits into the consumer's Q region in
// TMA's swizzled layout, then one thread stores it with TMA. Each quad writes 16
// contiguous bytes of a row's 16-byte chunk; the 8 rows of a warp's store land in 8
// different chunks (the tile's swizzle), so the 32 lanes hit 32 different banks. Once the
// store has read the buffer, the issuing thread tells the producer it may load the next
// tile's Q there.
template <class Tr>
__device__ __forceinline__ void store_output(const Params& params, const Tile& t, int consumer,
                                             const float (&o)[1][Tr::d_head / 8][4],
                                             unsigned char* region, tma::Barrier& q_empty) {
    const int lane = threadIdx.x % warp_size;
    const int warp_row0 = warp_in_warpgroup() * mma_m;
    // With Q in registers this warp's lanes read these rows with ldmatrix at the tile's
    // start; a tile that sees no key reaches here with no other warp-level sync between
    // (compute-sanitizer racecheck reported it).
    __syncwarp();
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
    ptx::named_barrier_sync(Tr::barrier_id(NamedBarrier::epilogue, consumer), warpgroup_threads);
    if (threadIdx.x % warpgroup_threads == 0) {
        tma::store_tile<typename Tr::QTile>(
            region, &params.maps.o, t.q_row0 + consumer * Tr::rows_per_consumer, t.head, t.batch);
        q_empty.arrive();
    }
}

}  // namespace flash_attention::sm90
