#pragma once

// The sm90 forward kernel (FlashAttention-3's structure): a producer warpgroup streams Q,
// K and V with TMA; each consumer warpgroup computes 64 query rows with wgmma, the
// online softmax running on the accumulators in registers. Needs sm_90a (wgmma,
// setmaxnreg). The body orchestrates: set up shared memory and the barriers, split the
// warpgroups into roles, and for each tile the scheduler hands a consumer: load Q, run
// the main loop (mainloop.cuh), run the epilogue (epilogue.cuh). A persistent CTA walks
// several tiles; the K/V ring and the Q buffers carry on from tile to tile.
// docs/hopper.md has the diagrams.

#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/online_softmax.cuh"
#include "kernels/primitives/sm80/warp_gemm.cuh"
#include "kernels/primitives/sm90/ptx.cuh"
#include "kernels/primitives/sm90/tma.cuh"
#include "kernels/sm90/epilogue.cuh"
#include "kernels/sm90/mainloop.cuh"
#include "kernels/sm90/tensor_maps.hpp"
#include "kernels/sm90/tile_scheduler.cuh"
#include "kernels/sm90/traits.cuh"

namespace flash_attention::sm90 {

template <class Tr>
__device__ __forceinline__ void init_barriers(Barriers<Tr::q_buffers, Tr::stages>& bars) {
    for (int b = 0; b < Tr::q_buffers; ++b) {
        bars.q_full[b].init(1);
        bars.q_empty[b].init(Tr::consumers);  // each consumer's storing thread
    }
    for (int s = 0; s < Tr::stages; ++s) {
        bars.k_full[s].init(1);
        bars.v_full[s].init(1);
        // One arrival per consumer warp, each after its own wgmma wait.
        bars.k_empty[s].init(k_warpgroup_warps * Tr::consumers);
        bars.v_empty[s].init(k_warpgroup_warps * Tr::consumers);
    }
    tma::fence_barrier_init();
}

// A consumer warpgroup, tile after tile.
template <class Tr>
__device__ __forceinline__ void consume(const Params& params, const SharedStorage<Tr>& smem,
                                        Barriers<Tr::q_buffers, Tr::stages>& bars, int consumer) {
    const KernelArgs& args = params.args;
    GemmTurns<Tr> turns{consumer};
    int ring = 0;  // K/V blocks consumed so far, in step with the producer
    int iteration = 0;
    for (StaticTileScheduler<Tr::B_r, Tr::B_c> tiles(args); tiles.valid();
         tiles.advance(), ++iteration) {
        const Tile tile = tiles.tile();
        const QSlot<Tr> q(iteration);
        unsigned char* q_region = smem.q(q.buffer, consumer);
        const int consumer_row0 = tile.q_row0 + consumer * Tr::rows_per_consumer;
        Consumer<Tr> c{
            .args = args,
            .tile = tile,
            .bars = bars,
            .turns = turns,
            .q_smem = smem.q_address(q.buffer, consumer),
            .k_smem = smem.k_address(0),
            .v_smem = smem.v_address(0),
            .consumer = consumer,
            .first_row = consumer_row0 + warp_in_warpgroup() * 16,
            // This consumer's own rows may need fewer masked blocks than the tile's.
            .unmasked =
                key_blocks(args.seq_q, args.seq_k, args.causal, consumer_row0,
                           max(1, min(Tr::rows_per_consumer, args.seq_q - consumer_row0)), Tr::B_c)
                    .unmasked,
            .ring = ring,
        };
        float o[1][Tr::d_head / 8][4];
        zero(o);
        OnlineSoftmax<1, true> softmax(args.softmax_scale, args.scale_log2);

        bars.q_full[q.buffer].wait(q.parity);
        c.load_q_fragments();
        mainloop<Tr>(c, o, softmax);
        softmax.finalize(o);
        epilogue<Tr>(params, tile, consumer, c.first_row, softmax, o, q_region,
                     bars.q_empty[q.buffer]);
        ring += tile.visited;
    }
    turns.finish();
}

template <unsigned long long Code>
__global__ void __launch_bounds__(Traits<unpack(Code)>::threads, 1)
    forward_kernel(const __grid_constant__ Params params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = Traits<unpack(Code)>;
    extern __shared__ unsigned char smem_raw[];
    const SharedStorage<Tr> smem(smem_raw);
    auto& bars = smem.barriers();
    if (threadIdx.x == 0)
        init_barriers<Tr>(bars);
    __syncthreads();

    // setmaxnreg moves registers from the producer to the consumers; each role is one
    // branch of this if, as setmaxnreg requires.
    if (warpgroup_id() == 0) {
        ptx::setmaxnreg_dec<Tr::producer_registers>();
        if (threadIdx.x == 0)
            produce<Tr>(params, smem, bars);
        return;
    }
    ptx::setmaxnreg_inc<Tr::consumer_registers>();
    consume<Tr>(params, smem, bars, warpgroup_id() - 1);
#else
    // Built for sm_90a only (the family's CMake target); other targets get an empty body.
    (void)params;
#endif
}

}  // namespace flash_attention::sm90
