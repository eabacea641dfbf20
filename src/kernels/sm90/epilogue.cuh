#pragma once

// The end of a consumer's tile: its rows' log-sum-exp, and O rounded to 16 bits into the
// consumer's Q region (TMA's swizzled layout, which Q no longer needs) and stored by TMA.

#include "kernels/primitives/epilogue.cuh"
#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/sm90/tma.cuh"
#include "kernels/sm90/tensor_maps.hpp"
#include "kernels/sm90/tile_scheduler.cuh"
#include "kernels/sm90/traits.cuh"

namespace flash_attention::sm90 {

// Each quad writes 16 contiguous bytes of a row's 16-byte chunk; the 8 rows of a warp's
// store land in 8 different chunks (chunk ^ row % 8), so the 32 lanes hit 32 different
// banks. Once the store has read the buffer, the issuing thread tells the producer it
// may load the next tile's Q there. Every wgmma reading this consumer's Q has completed
// (the main loop ends on a wait), and no other warpgroup reads these rows.
template <class Tr, class Softmax>
__device__ __forceinline__ void epilogue(const Params& params, const Tile& t, int consumer,
                                         int first_row, const Softmax& softmax,
                                         const float (&o)[1][Tr::d_head / 8][4],
                                         unsigned char* region, tma::Barrier& q_empty) {
    const KernelArgs& args = params.args;
    store_log_sum_exp<1>(args.lse, (std::int64_t{t.batch} * args.heads + t.head) * args.seq_q,
                         args.seq_q, first_row, softmax);
    // With Q in registers this warp's lanes read these rows with ldmatrix at the tile's
    // start; a tile that sees no key reaches here with no other warp-level sync between
    // (compute-sanitizer racecheck reported it).
    __syncwarp();
    store_accumulators_RF2SM<Tr::dtype, typename Tr::QTile>(o, ptx::smem_address(region),
                                                            warp_in_warpgroup() * 16);
    // The TMA store reads through the async proxy: each writer fences its own stores,
    // then the warpgroup's barrier tells the issuing thread that all have.
    tma::fence_shared_to_async_proxy();
    ptx::named_barrier_sync(Tr::epilogue_barrier(consumer), k_warpgroup_threads);
    if (thread_in_warpgroup() == 0) {
        tma::store_tile<Tr::column_blocks, Tr::QTile::sub_tile_bytes>(
            region, &params.maps.o, t.q_row0 + consumer * Tr::rows_per_consumer, t.head, t.batch);
        q_empty.arrive();
    }
}

}  // namespace flash_attention::sm90
