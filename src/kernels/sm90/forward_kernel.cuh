#pragma once

// The sm90 forward kernel (FlashAttention-3's structure): a producer warpgroup streams Q,
// K and V with TMA, and each consumer warpgroup computes 64 query rows with wgmma, the
// online softmax running on the accumulators in registers. Needs sm_90a (wgmma,
// setmaxnreg). This body sets up shared memory and the barriers, splits the warpgroups
// into roles, and walks the tiles the scheduler (tile_scheduler.cuh) hands the CTA: load Q,
// run the main loop (mainloop.cuh: the producer, the GEMM turns, the consumer's steps),
// store the LSE and run the epilogue (epilogue.cuh). A persistent CTA walks several
// tiles; the K/V ring and the Q buffers carry on from tile to tile. docs/hopper.md has the
// diagrams.

#include <cstdint>

#include "kernels/primitives/epilogue.cuh"
#include "kernels/primitives/geometry.cuh"
#include "kernels/sm90/epilogue.cuh"
#include "kernels/sm90/mainloop.cuh"
#include "kernels/sm90/tile_scheduler.cuh"

namespace flash_attention::sm90 {

// A consumer warpgroup's walk over its CTA's tiles: opens each (its view of the tile, once
// the tile's Q has landed) and finishes it (the epilogue).
template <class Tr, class Scheduler>
struct ConsumerTiles {
    const Params& params;
    const Scheduler& scheduler;
    Barriers<Tr::q_buffers, Tr::stages>& bars;
    unsigned char* smem;
    int consumer;
    PendingStore& pending_store;
    typename Consumer<Tr>::QFragments& q_frags;

    __device__ __forceinline__ Consumer<Tr> first() const { return open(scheduler.first(), 0, 0); }

    __device__ __forceinline__ Consumer<Tr> after(const Consumer<Tr>& c) const {
        return open(c.index + static_cast<int>(gridDim.x), c.iteration + 1,
                    c.ring + c.tile.visited);
    }

    // The CTA's `iteration`-th tile (`index`: where the static stride leaves it; the dynamic
    // schedule reads the producer's choice), once its Q has landed and, with Q in
    // registers, been loaded; not valid() past the last.
    __device__ __forceinline__ Consumer<Tr> open(int index, int iteration, int ring) const {
        const KernelArgs& args = params.args;
        const QSlot<Tr> q(iteration);
        Consumer<Tr> c{};
        c.args = &args;
        c.bars = &bars;
        c.iteration = iteration;
        c.ring = ring;
        c.consumer = consumer;
        c.pending_store = &pending_store;
        c.q_frags = &q_frags;
        c.index = scheduler.consumer_tile(index, q, bars);
        if (!c.valid())
            return c;
        c.tile = tile_at<Tr>(args, c.index);
        c.q_region =
            smem + Tr::q_offset + q.buffer * Tr::q_buffer_bytes + consumer * Tr::QTile::bytes;
        c.q_smem = ptx::smem_address(c.q_region);
        c.k_smem = ptx::smem_address(smem + Tr::k_offset);
        c.v_smem = ptx::smem_address(smem + Tr::v_offset);
        const int consumer_row0 = c.tile.q_row0 + consumer * Tr::rows_per_consumer;
        c.first_row = consumer_row0 + warp_in_warpgroup() * mma_m;
        // This consumer's own rows may need fewer masked blocks than the tile's.
        c.unmasked =
            key_blocks(args.seq_q, args.seq_k, args.causal, consumer_row0,
                       max(1, min(Tr::rows_per_consumer, args.seq_q - consumer_row0)), Tr::B_c)
                .unmasked;
        bars.q_full[q.buffer].wait(q.parity);
        if constexpr (Tr::q_in_registers)
            load_a_fragments<typename Tr::QTile>(q_frags, c.q_smem, warp_in_warpgroup() * mma_m);
        return c;
    }

    // The epilogue: O normalised, the LSE, and O stored through the tile's Q buffer. Every
    // wgmma reading this consumer's Q has completed (the main loop ends on a wait), and no
    // other warpgroup reads these rows: O may overwrite them.
    template <class Softmax>
    __device__ __forceinline__ void finish(const Consumer<Tr>& c, float (&o)[1][Tr::d_head / 8][4],
                                           Softmax& softmax) const {
        const KernelArgs& args = params.args;
        softmax.finalize(o);
        if (args.lse != nullptr && threadIdx.x % 4 == 0) {
            store_lse<1>(
                args.lse + (std::int64_t{c.tile.batch} * args.heads + c.tile.head) * args.seq_q,
                c.first_row, args.seq_q, softmax);
        }
        store_output<Tr>(params, c.tile, consumer, o, c.q_region,
                         bars.q_empty[QSlot<Tr>(c.iteration).buffer], pending_store);
    }
};

template <unsigned long long Code>
__global__ void __launch_bounds__(Traits<unpack(Code)>::threads, 1)
    forward_kernel(const __grid_constant__ Params params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = Traits<unpack(Code)>;
    constexpr KernelConfig C = unpack(Code);
    const KernelArgs& args = params.args;

    extern __shared__ unsigned char smem_raw[];
    // TMA's 128-byte swizzle repeats every 1024 bytes and wgmma assumes tiles start on
    // that period; dynamic shared memory is only guaranteed 16-byte alignment.
    unsigned char* smem = smem_raw + ((1024 - ptx::smem_address(smem_raw) % 1024) % 1024);
    auto& bars = *reinterpret_cast<Barriers<Tr::q_buffers, Tr::stages>*>(smem + Tr::barrier_offset);

    const TileScheduler<Tr, Tr::dynamic_schedule> scheduler{
        params.tile_counter,
        reinterpret_cast<TileSlots<Tr::q_buffers>*>(smem + Tr::tile_slot_offset)};

    const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / warpgroup_threads, 0);
    if (threadIdx.x == 0) {
        for (int b = 0; b < Tr::q_buffers; ++b) {
            bars.q_full[b].init(1);
            bars.q_empty[b].init(Tr::consumers);  // each consumer's storing thread
        }
        for (int s = 0; s < Tr::stages; ++s) {
            bars.k_full[s].init(1);
            bars.v_full[s].init(1);
            // One arrival per consumer warp, each after its own wgmma wait.
            bars.k_empty[s].init(4 * Tr::consumers);
            bars.v_empty[s].init(4 * Tr::consumers);
        }
        scheduler.init();
        tma::fence_barrier_init();
    }
    __syncthreads();

    if (warpgroup == 0) {
        ptx::setmaxnreg_dec<Tr::producer_registers>();
        if (threadIdx.x == 0)
            produce<Tr>(params, smem, bars, scheduler);
        return;
    }

    ptx::setmaxnreg_inc<Tr::consumer_registers>();
    GemmTurns<Tr, C.sm90.pingpong> turns{warpgroup - 1};
    PendingStore pending_store;  // the previous tile's O store (epilogue.cuh)
    typename Consumer<Tr>::QFragments q_frags;
    const ConsumerTiles<Tr, decltype(scheduler)> tiles{params,        scheduler,     bars,   smem,
                                                       warpgroup - 1, pending_store, q_frags};
    using Softmax = ConsumerSoftmax<Tr>;
    float o[1][Tr::d_head / 8][4];
    // One tile per CTA, or with `persistent` one CTA per SM walking the tiles: the static
    // schedule's stride, or the tile the producer published for the dynamic one.
    if constexpr (!C.sm90.chain) {
        for (Consumer<Tr> c = tiles.first(); c.valid(); c = tiles.after(c)) {
            zero(o);
            Softmax softmax(args.softmax_scale, args.scale_log2);
            consume<Tr, C.sm90.intra_warpgroup_overlap>(c, turns, o, softmax);
            pending_store.hand_back();  // a tile without GEMMs hands it back here
            tiles.finish(c, o, softmax);
        }
    } else {
        // Chained tiles (mainloop.cuh, chain_into): from one tile with keys to the next the
        // boundary is an overlapped step; the last tile, or one next to a tile without keys,
        // ends and begins as above.
        float s[1][Tr::B_c / 8][4];
        std::uint32_t p[1][Tr::B_c / 16][4];
        Softmax softmax(args.softmax_scale, args.scale_log2);
        Consumer<Tr> c = tiles.first();
        bool begun = false;  // c's block 0 is already probabilities in p
        while (c.valid()) {
            if (!begun) {
                zero(o);
                softmax = Softmax(args.softmax_scale, args.scale_log2);
                begin_tile(c, turns, s, o, p, softmax);
            }
            overlapped_steps(c, turns, s, o, p, softmax);
            // The store issued at the boundary into c (a tile ago) frees its Q buffer for
            // the tile after next.
            pending_store.hand_back();
            Consumer<Tr> next = tiles.after(c);
            begun = next.valid() && next.tile.visited > 0 && c.tile.visited > 0;
            if (begun) {
                Softmax next_softmax(args.softmax_scale, args.scale_log2);
                chain_into(c, next, turns, s, o, p, next_softmax);
                tiles.finish(c, o, softmax);
                zero(o);
                softmax = next_softmax;
            } else {
                if (c.tile.visited > 0)
                    accumulate(c, turns, o, p, c.tile.visited - 1);
                tiles.finish(c, o, softmax);
            }
            c = next;
        }
    }
    pending_store.hand_back();  // shared memory must outlive the last store's read
    turns.finish();
#else
    // Built for sm_90a only (the family's CMake target); other targets get an empty body.
    (void)params;
#endif
}

}  // namespace flash_attention::sm90
