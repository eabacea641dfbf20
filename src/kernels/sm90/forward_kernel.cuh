#pragma once

// The sm90 forward kernel (FlashAttention-3's structure): a producer warpgroup streams
// K and V through a `stages`-deep ring of shared-memory tiles with TMA, and each consumer
// warpgroup computes 64 query rows with wgmma, the online softmax running on the
// accumulators in registers. Needs sm_90a (wgmma, setmaxnreg).
//
//   producer (1 thread), per tile      consumer warpgroup w (128 threads, rows 64w..64w+63)
//   wait q_empty[b]; Q -> q_full[b]    wait q_full[b] (with qreg: Q -> registers)
//   for j: wait k_empty[s]             for j: wait k_full[s]; S = Q·K_jᵀ; arrive k_empty[s]
//          K_j -> k_full[s]                   mask, softmax, P = S as 16-bit
//          wait v_empty[s]                    wait v_full[s]; O += P·V_j; arrive v_empty[s]
//          V_j -> v_full[s]            O /= row sums; LSE; O -> Q's buffer -> TMA store;
//                                      arrive q_empty[b]
//
// With intra-warpgroup overlap the consumer issues S_{j+1} = Q·K_{j+1}ᵀ and O += P_j·V_j
// together and runs the softmax of S_{j+1} while the second GEMM is in flight. With
// ping-pong the consumers take turns issuing their GEMMs (named barriers), so one
// warpgroup's softmax runs while another's GEMMs own the tensor cores. A persistent CTA
// repeats the tile loop over several tiles; the K/V ring (stage s) and the Q buffers
// (b) carry on from tile to tile. docs/hopper.md has the diagrams.

#include <cstdint>

#include "kernels/primitives/masking.cuh"
#include "kernels/primitives/online_softmax.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm80/warp_gemm.cuh"
#include "kernels/primitives/sm90/ptx.cuh"
#include "kernels/primitives/sm90/tma.cuh"
#include "kernels/primitives/sm90/warpgroup_gemm.cuh"
#include "kernels/sm90/tensor_maps.hpp"
#include "kernels/sm90/traits.cuh"

namespace flash_attention::sm90 {

// One tile of work: B_r query rows of one (batch, head) and the K/V blocks they see.
// Tiles are numbered with the query block fastest, so the CTAs running at one time share
// the K/V of a few heads in L2; with causal masking each head's longest tiles come first.
struct Tile {
    int batch, head, kv_head;
    int q_row0;    // first query row of the tile
    int visited;   // K/V blocks the tile streams (fully masked ones are skipped)
    int unmasked;  // blocks before this one need no mask (per consumer: its own rows)
};

template <class Tr>
__device__ __forceinline__ int tile_count(const KernelArgs& args) {
    // At most INT_MAX: the launcher checks the product.
    return blocks_covering(args.seq_q, Tr::B_r) * args.heads * args.batch;
}

template <class Tr>
__device__ __forceinline__ Tile tile_at(const KernelArgs& args, int index) {
    const int q_blocks = blocks_covering(args.seq_q, Tr::B_r);
    const int head_of_batch = index / q_blocks;
    const int q_block = args.causal ? q_blocks - 1 - index % q_blocks : index % q_blocks;
    Tile t;
    t.batch = head_of_batch / args.heads;
    t.head = head_of_batch % args.heads;
    t.kv_head = t.head / (args.heads / args.heads_kv);  // grouped-query attention
    t.q_row0 = q_block * Tr::B_r;
    const KeyBlocks blocks = key_blocks(args.seq_q, args.seq_k, args.causal, t.q_row0,
                                        min(Tr::B_r, args.seq_q - t.q_row0), Tr::B_c);
    t.visited = blocks.visited;
    t.unmasked = blocks.unmasked;
    return t;
}

// A position in the K/V ring: block j lives in stage j % stages, and each reuse of a
// stage flips the parity of its barriers' phase.
template <int Stages>
struct RingSlot {
    int stage;
    std::uint32_t parity;
    __device__ __forceinline__ explicit RingSlot(int j)
        : stage(j % Stages), parity(static_cast<std::uint32_t>((j / Stages) & 1)) {}
};

// The Q buffer of the `iteration`-th tile a CTA works on, and its barriers' parity.
template <class Tr>
struct QSlot {
    int buffer;
    std::uint32_t parity;
    __device__ __forceinline__ explicit QSlot(int iteration)
        : buffer(iteration % Tr::q_buffers),
          parity(static_cast<std::uint32_t>((iteration / Tr::q_buffers) & 1)) {}
};

// The producer: one thread issues every copy, tile after tile. It refills a K/V stage
// once every consumer warp has emptied it, so up to `stages` blocks are in flight ahead
// (across tiles too), and loads a tile's Q once the consumers have stored the previous
// tile's O from that buffer.
template <class Tr>
__device__ __forceinline__ void produce(const Params& params, unsigned char* smem,
                                        Barriers<Tr::q_buffers, Tr::stages>& bars) {
    const KernelArgs& args = params.args;
    int ring = 0;  // K/V blocks loaded so far: the ring position of the next
    int iteration = 0;
    for (int index = blockIdx.x; index < tile_count<Tr>(args); index += gridDim.x, ++iteration) {
        const Tile t = tile_at<Tr>(args, index);
        // Q buffers are a ring too. Parity ^ 1: the first pass finds each buffer empty.
        const QSlot<Tr> q(iteration);
        bars.q_empty[q.buffer].wait(q.parity ^ 1);
        bars.q_full[q.buffer].arrive_expect_tx(Tr::q_buffer_bytes);
        for (int w = 0; w < Tr::consumers; ++w) {
            tma::load_tile<Tr::column_blocks, Tr::q_sub_tile_bytes>(
                smem + Tr::q_offset + q.buffer * Tr::q_buffer_bytes + w * Tr::q_consumer_bytes,
                &params.maps.q, t.q_row0 + w * Tr::rows_per_consumer, t.head, t.batch,
                bars.q_full[q.buffer]);
        }
        for (int j = 0; j < t.visited; ++j) {
            const RingSlot<Tr::stages> slot(ring + j);
            bars.k_empty[slot.stage].wait(slot.parity ^ 1);
            bars.k_full[slot.stage].arrive_expect_tx(Tr::kv_tile_bytes);
            tma::load_tile<Tr::column_blocks, Tr::kv_sub_tile_bytes>(
                smem + Tr::k_offset + slot.stage * Tr::kv_tile_bytes, &params.maps.k, j * Tr::B_c,
                t.kv_head, t.batch, bars.k_full[slot.stage]);
            bars.v_empty[slot.stage].wait(slot.parity ^ 1);
            bars.v_full[slot.stage].arrive_expect_tx(Tr::kv_tile_bytes);
            tma::load_tile<Tr::column_blocks, Tr::kv_sub_tile_bytes>(
                smem + Tr::v_offset + slot.stage * Tr::kv_tile_bytes, &params.maps.v, j * Tr::B_c,
                t.kv_head, t.batch, bars.v_full[slot.stage]);
        }
        ring += t.visited;
    }
}

// Ping-pong: consumer w may issue GEMMs only while it holds the turn, which passes
// w -> w + 1 -> ... -> 0 through named barriers of 256 threads (the waiting warpgroup
// and the one handing over). The last consumer opens the first turn (at its first
// acquire, so a CTA without GEMMs leaves every barrier untouched); every consumer hands
// over as often as it takes the turn, and finish() lets consumer 0 absorb the last
// consumer's final hand-over, so no barrier is left half-arrived at exit.
template <class Tr, bool Enabled>
struct GemmTurns {
    int consumer;
    bool started = false;
    __device__ __forceinline__ void acquire() {
        if constexpr (Enabled) {
            if (!started && consumer == Tr::consumers - 1)
                ptx::named_barrier_arrive(Tr::turn_barrier_base, 2 * Tr::warpgroup_threads);
            started = true;
            ptx::named_barrier_sync(Tr::turn_barrier_base + consumer, 2 * Tr::warpgroup_threads);
        }
    }
    __device__ __forceinline__ void release() const {
        if constexpr (Enabled) {
            ptx::named_barrier_arrive(Tr::turn_barrier_base + (consumer + 1) % Tr::consumers,
                                      2 * Tr::warpgroup_threads);
        }
    }
    __device__ __forceinline__ void finish() const {
        if (Enabled && started && consumer == 0)
            ptx::named_barrier_sync(Tr::turn_barrier_base, 2 * Tr::warpgroup_threads);
    }
};

// A consumer warpgroup's state and steps; consume() below is the algorithm.
template <class Tr>
struct Consumer {
    static constexpr DType dtype = Tr::dtype;
    static constexpr int s_tiles = Tr::B_c / 8;
    static constexpr int o_tiles = Tr::d_head / 8;

    const KernelArgs& args;
    const Tile& tile;
    Barriers<Tr::q_buffers, Tr::stages>& bars;
    std::uint32_t q_smem, k_smem, v_smem;  // shared-state-space addresses
    int consumer;                          // 0 .. consumers - 1
    int first_row;                         // of this warp, in the sequence
    int unmasked;                          // blocks before this one need no mask here
    int ring;                              // ring position of the tile's block 0
    // Q as A fragments when the config holds it in registers (else unused, and dropped).
    std::uint32_t q_frags[Tr::d_head / 16][4];

    __device__ __forceinline__ RingSlot<Tr::stages> slot(int j) const {
        return RingSlot<Tr::stages>(ring + j);
    }

    __device__ __forceinline__ std::uint32_t k_stage(int stage) const {
        return k_smem + stage * Tr::kv_tile_bytes;
    }
    __device__ __forceinline__ std::uint32_t v_stage(int stage) const {
        return v_smem + stage * Tr::kv_tile_bytes;
    }

    // Waits for K_j (V_j) to land; done before taking a GEMM turn, so a warpgroup never
    // holds the turn while it waits for memory.
    __device__ __forceinline__ void wait_k(int j) {
        bars.k_full[slot(j).stage].wait(slot(j).parity);
    }
    __device__ __forceinline__ void wait_v(int j) {
        bars.v_full[slot(j).stage].wait(slot(j).parity);
    }

    // Issues S = Q·K_jᵀ. The operand fences pin S's registers on both sides of the
    // asynchronous GEMM, so nothing reads or moves them before the matching wait.
    __device__ __forceinline__ void issue_qk(float (&s)[1][s_tiles][4], int j) {
        ptx::fence_operands(s[0]);
        ptx::wgmma_fence();
        if constexpr (Tr::q_in_registers) {
            warpgroup_gemm_qk<dtype, Tr::d_head, Tr::B_c>(s[0], q_frags, k_stage(slot(j).stage));
        } else {
            warpgroup_gemm_qk<dtype, Tr::d_head, Tr::B_c>(s[0], q_smem, k_stage(slot(j).stage));
        }
        ptx::wgmma_commit_group();
        ptx::fence_operands(s[0]);
    }

    // Issues O += P·V_j.
    __device__ __forceinline__ void issue_pv(float (&o)[1][o_tiles][4],
                                             const std::uint32_t (&p)[1][s_tiles / 2][4], int j) {
        ptx::fence_operands(o[0]);
        ptx::wgmma_fence();
        warpgroup_gemm_pv<dtype, Tr::d_head, Tr::B_c>(o[0], p[0], v_stage(slot(j).stage));
        ptx::wgmma_commit_group();
        ptx::fence_operands(o[0]);
    }

    // After a wait that retires an S GEMM: keeps Q's fragments (which it read
    // asynchronously) in their registers until then.
    __device__ __forceinline__ void keep_q() {
        if constexpr (Tr::q_in_registers)
            ptx::fence_operands(q_frags);
    }

    // Each warp tells the producer it has finished reading a stage (after its wgmma wait).
    __device__ __forceinline__ void release_k(int j) {
        __syncwarp();
        if (threadIdx.x % 32 == 0)
            bars.k_empty[slot(j).stage].arrive();
    }
    __device__ __forceinline__ void release_v(int j) {
        __syncwarp();
        if (threadIdx.x % 32 == 0)
            bars.v_empty[slot(j).stage].arrive();
    }

    __device__ __forceinline__ void mask(float (&s)[1][s_tiles][4], int j) const {
        if (j >= unmasked) {
            mask_scores(s, first_row, j * Tr::B_c, args.seq_q, args.seq_k, args.causal);
        }
    }
};

// One tile's main loop for one consumer warpgroup: the algorithm.
template <class Tr, bool Overlap, bool Pingpong>
__device__ __forceinline__ void consume(Consumer<Tr>& c, GemmTurns<Tr, Pingpong>& turns,
                                        float (&o)[1][Tr::d_head / 8][4],
                                        OnlineSoftmax<1, true>& softmax) {
    constexpr int s_tiles = Tr::B_c / 8;
    const int n = c.tile.visited;
    float s[1][s_tiles][4];
    std::uint32_t p[1][s_tiles / 2][4];
    if (n == 0)
        return;
    if constexpr (!Overlap) {
        for (int j = 0; j < n; ++j) {
            c.wait_k(j);
            turns.acquire();
            c.issue_qk(s, j);
            turns.release();
            ptx::wgmma_wait<0>();
            ptx::fence_operands(s[0]);
            c.keep_q();
            c.release_k(j);
            c.mask(s, j);
            softmax.update(s, o);
            accumulators_to_a_fragments<Tr::dtype>(s, p);
            c.wait_v(j);
            turns.acquire();
            c.issue_pv(o, p, j);
            turns.release();
            ptx::wgmma_wait<0>();
            ptx::fence_operands(o[0]);
            ptx::fence_operands(p[0]);
            c.release_v(j);
        }
    } else {
        // Block 0's scores first; then each iteration issues S_j and O += P_{j-1}·V_{j-1}
        // together and exponentiates S_j while the P·V GEMM runs.
        c.wait_k(0);
        turns.acquire();
        c.issue_qk(s, 0);
        turns.release();
        ptx::wgmma_wait<0>();
        ptx::fence_operands(s[0]);
        c.keep_q();
        c.release_k(0);
        c.mask(s, 0);
        softmax.exponentiate(s);  // O is still zero: nothing to rescale
        accumulators_to_a_fragments<Tr::dtype>(s, p);
        for (int j = 1; j < n; ++j) {
            c.wait_k(j);
            c.wait_v(j - 1);
            turns.acquire();
            c.issue_qk(s, j);
            c.issue_pv(o, p, j - 1);
            turns.release();
            ptx::wgmma_wait<1>();  // S_j is done; P_{j-1}·V_{j-1} may still run
            ptx::fence_operands(s[0]);
            c.keep_q();
            c.release_k(j);
            c.mask(s, j);
            softmax.exponentiate(s);
            ptx::wgmma_wait<0>();
            ptx::fence_operands(o[0]);
            ptx::fence_operands(p[0]);
            c.release_v(j - 1);
            softmax.rescale(o);
            accumulators_to_a_fragments<Tr::dtype>(s, p);
        }
        c.wait_v(n - 1);
        turns.acquire();
        c.issue_pv(o, p, n - 1);
        turns.release();
        ptx::wgmma_wait<0>();
        ptx::fence_operands(o[0]);
        ptx::fence_operands(p[0]);
        c.release_v(n - 1);
    }
}

// O (fp32, this warpgroup's 64 rows) rounded to 16 bits into the consumer's Q region in
// TMA's swizzled layout, then one thread stores it with TMA. Each quad writes 16
// contiguous bytes of a row's 16-byte chunk; the 8 rows of a warp's store land in 8
// different chunks (chunk ^ row % 8), so the 32 lanes hit 32 different banks. Once the
// store has read the buffer, the issuing thread tells the producer it may load the next
// tile's Q there.
template <class Tr>
__device__ __forceinline__ void store_output(const Params& params, const Tile& t, int consumer,
                                             const float (&o)[1][Tr::d_head / 8][4],
                                             unsigned char* region, tma::Barrier& q_empty) {
    const int lane = threadIdx.x % 32;
    const int warp_row0 = (threadIdx.x % Tr::warpgroup_threads) / 32 * 16;
    // With Q in registers this warp's lanes read these rows with ldmatrix at the tile's
    // start; a tile that sees no key reaches here with no other warp-level sync between
    // (compute-sanitizer racecheck reported it).
    __syncwarp();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = warp_row0 + lane / 4 + 8 * h;
#pragma unroll
        for (int nt = 0; nt < Tr::d_head / 8; ++nt) {
            const int chunk = (nt % 8) ^ (row % 8);
            const int offset = (nt / 8) * Tr::q_sub_tile_bytes + row * Tr::bytes_per_row +
                               chunk * 16 + (lane % 4) * 4;
            ptx::st_shared_4(ptx::smem_address(region + offset),
                             ptx::pack_rn<Tr::dtype>(o[0][nt][2 * h], o[0][nt][2 * h + 1]));
        }
    }
    // The TMA store reads through the async proxy: each writer fences its own stores,
    // then the warpgroup's barrier tells the issuing thread that all have.
    tma::fence_shared_to_async_proxy();
    ptx::named_barrier_sync(Tr::epilogue_barrier_base + consumer, Tr::warpgroup_threads);
    if (threadIdx.x % Tr::warpgroup_threads == 0) {
        tma::store_tile<Tr::column_blocks, Tr::q_sub_tile_bytes>(
            region, &params.maps.o, t.q_row0 + consumer * Tr::rows_per_consumer, t.head, t.batch);
        q_empty.arrive();
    }
}

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

    const int warpgroup = threadIdx.x / Tr::warpgroup_threads;
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
        tma::fence_barrier_init();
    }
    __syncthreads();

    if (warpgroup == 0) {
        ptx::setmaxnreg_dec<Tr::producer_registers>();
        if (threadIdx.x == 0)
            produce<Tr>(params, smem, bars);
        return;
    }

    ptx::setmaxnreg_inc<Tr::consumer_registers>();
    const int consumer = warpgroup - 1;
    const int smem_base = static_cast<int>(ptx::smem_address(smem));
    GemmTurns<Tr, C.pingpong> turns{consumer};
    int ring = 0;  // K/V blocks consumed so far, in step with the producer
    int iteration = 0;
    // One tile per CTA, or with `persistent` one CTA per SM walking the tiles.
    for (int index = blockIdx.x; index < tile_count<Tr>(args); index += gridDim.x, ++iteration) {
        const Tile tile = tile_at<Tr>(args, index);
        const QSlot<Tr> q(iteration);
        unsigned char* q_region =
            smem + Tr::q_offset + q.buffer * Tr::q_buffer_bytes + consumer * Tr::q_consumer_bytes;
        const int consumer_row0 = tile.q_row0 + consumer * Tr::rows_per_consumer;
        Consumer<Tr> c{
            .args = args,
            .tile = tile,
            .bars = bars,
            .q_smem = ptx::smem_address(q_region),
            .k_smem = static_cast<std::uint32_t>(smem_base + Tr::k_offset),
            .v_smem = static_cast<std::uint32_t>(smem_base + Tr::v_offset),
            .consumer = consumer,
            .first_row =
                consumer_row0 + static_cast<int>(threadIdx.x % Tr::warpgroup_threads) / 32 * 16,
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
        if constexpr (Tr::q_in_registers) {
            load_a_fragments_128b<Tr::d_head>(
                c.q_frags, c.q_smem,
                static_cast<int>(threadIdx.x % Tr::warpgroup_threads) / 32 * 16);
        }
        consume<Tr, C.intra_warpgroup_overlap>(c, turns, o, softmax);
        softmax.finalize(o);

        if (args.lse != nullptr && threadIdx.x % 4 == 0) {
            float* lse =
                args.lse + (std::int64_t{tile.batch} * args.heads + tile.head) * args.seq_q;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = c.first_row + (threadIdx.x % 32) / 4 + 8 * h;
                if (row < args.seq_q)
                    lse[row] = softmax.log_sum_exp(0, h);
            }
        }
        // Every wgmma reading this consumer's Q has completed (consume() ends on a wait),
        // and no other warpgroup reads these rows: O may overwrite them.
        store_output<Tr>(params, tile, consumer, o, q_region, bars.q_empty[q.buffer]);
        ring += tile.visited;
    }
    turns.finish();
#else
    // Built for sm_90a only (the family's CMake target); other targets get an empty body.
    (void)params;
#endif
}

}  // namespace flash_attention::sm90
