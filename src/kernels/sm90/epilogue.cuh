#pragma once

// The end of a consumer's tile: O rounded to 16 bits into the consumer's Q region (which Q
// no longer needs) or a region of its own (Traits::o_apart) in TMA's swizzled layout, then
// stored with TMA.

#include <cuda/atomic>

#include <cstdint>

#include "kernels/primitives/epilogue.cuh"
#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/range_fold.cuh"
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

// Where row `row` of tile t's sequence lies: its query position in the sequence and its head
// (pack_gqa: row_position(), and the group's head the row's remainder names).
struct QueryRow {
    int position, head;
};
template <class Tr>
__device__ __forceinline__ QueryRow query_row(const KernelArgs& args, const Tile& t, int row) {
    const int position = row_position<Tr>(args, row);
    return {position, Tr::pack_gqa ? t.head + (row - (position << args.pack_shift)) : t.head};
}

// pack_gqa: the LSE of this thread's two rows (store_lse()'s, each at its own head's row).
template <class Tr, class Softmax>
__device__ __forceinline__ void store_packed_lse(const KernelArgs& args, const Tile& t,
                                                 int first_row, const Softmax& softmax) {
    const int lane = threadIdx.x % warp_size;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = first_row + lane / 4 + 8 * h;
        if (row < t.q_rows) {
            const QueryRow at = query_row<Tr>(args, t, row);
            args.lse[(std::int64_t{t.q.entry} * args.heads + at.head) * args.seqs.q_view_seq +
                     t.q.row0 + at.position] = softmax.log_sum_exp(0, h);
        }
    }
}

// O (fp32, this warpgroup's 64 rows) rounded to 16 bits into its staging region (above) in
// TMA's swizzled layout, then one thread stores it with TMA. Each quad writes 16
// contiguous bytes of a row's 16-byte chunk; the 8 rows of a warp's store land in 8
// different chunks (the tile's swizzle), so the 32 lanes hit 32 different banks. The
// region goes back through `pending` (above). TMA clips rows only at the
// view's end: when the sequence ends inside the view (packed sequences), rows past it are
// another sequence's, and a consumer whose rows cross that end stores its rows itself.
// write false: a stream-K partial (below), which stores no O but takes the region and hands
// it back in turn, as the barriers' phases count.
template <class Tr, bool PerSequence>
__device__ __forceinline__ void store_output(const Params& params, const Tile& t, int consumer,
                                             const float (&o)[1][Tr::o_cols / 8][4],
                                             const OStaging<Tr>& staging, PendingStore& pending,
                                             bool write = true) {
    unsigned char* const region = staging.region;
    const int lane = threadIdx.x % warp_size;
    const int warp_row0 = warp_in_warpgroup() * mma_m;
    const int row0 = t.q_row0 + consumer * Tr::rows_per_consumer;  // in the sequence
    const int rows = t.q_rows - row0;  // of this consumer's, in the sequence
    // FP8's bf16 O does not fit its Q rows: stored from the registers.
    const bool by_tma = !Tr::fp8 && (!PerSequence || rows >= Tr::rows_per_consumer ||
                                     t.q.row0 + t.q.len == params.args.seqs.q_view_seq);
    // With Q in registers this warp's lanes read these rows with ldmatrix at the tile's
    // start; a tile that sees no key reaches here with no other warp-level sync between
    // (compute-sanitizer racecheck reported it).
    __syncwarp();
    staging.wait_free(consumer);
    if (!write) {
    } else if (by_tma) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = warp_row0 + lane / 4 + 8 * h;
#pragma unroll
            for (int nt = 0; nt < Tr::o_cols / 8; ++nt) {
                const int offset = Tr::OTile::chunk_offset(row, nt) + (lane % 4) * 4;
                ptx::st_shared_4(ptx::smem_address(region + offset),
                                 ptx::pack_rn<Tr::out_dtype>(o[0][nt][2 * h], o[0][nt][2 * h + 1]));
            }
        }
        // The TMA store reads through the async proxy: each writer fences its own stores,
        // then the warpgroup's barrier tells the issuing thread that all have.
        tma::fence_shared_to_async_proxy();
    } else {
        // From the accumulators, once per sequence and head, in 16-byte pieces.
        const KernelArgs& args = params.args;
        using T = typename Tr::OutT;
        // O's row of this consumer's first row (pack_gqa: its first position's, group head 0).
        const int position0 = row_position<Tr>(args, row0);
        T* base = static_cast<T*>(args.o) + std::int64_t{t.q.entry} * args.o_stride.batch +
                  std::int64_t{t.q.row0 + position0} * args.o_stride.seq +
                  std::int64_t{t.head} * args.o_stride.head;
        // This consumer's row `row`: pack_gqa rows lie at their own position and head.
        const auto row_output = [&](int row) {
            if constexpr (Tr::pack_gqa) {
                const QueryRow at = query_row<Tr>(args, t, row0 + row);
                return base + std::int64_t{at.position - position0} * args.o_stride.seq +
                       std::int64_t{at.head - t.head} * args.o_stride.head;
            } else {
                return base + std::int64_t{row} * args.o_stride.seq;
            }
        };
        // O's columns, not the tile's padding.
        store_accumulator_rows<Tr::out_dtype, Tr::d_v / 8>(o[0], 1.0f, [&](int h) {
            const int row = warp_row0 + lane / 4 + 8 * h;
            return row < rows ? row_output(row) : nullptr;
        });
    }
    ptx::named_barrier_sync(Tr::barrier_id(NamedBarrier::epilogue, consumer), warpgroup_threads);
    if (threadIdx.x % warpgroup_threads == 0) {
        if (write && by_tma) {
            if constexpr (Tr::pack_gqa) {
                tma::store_packed_tile<typename Tr::OTile>(
                    region, &params.maps.o, t.q.row0 + row_position<Tr>(params.args, row0),
                    t.kv_head, t.q.entry);
            } else {
                tma::store_tile<typename Tr::OTile>(region, &params.maps.o, t.q.row0 + row0, t.head,
                                                    t.q.entry);
            }
        }
        pending.empty = staging.empty;
        if constexpr (Tr::q_buffers == 1)
            pending.hand_back();
    }
}

// Stream-K (tile_scheduler.cuh): the LSE of a thread's two rows (its m16 tile's rows lane / 4
// and + 8), as store_lse() reads a softmax's.
struct RowLse {
    float v[2];
    template <class Softmax>
    __device__ __forceinline__ static RowLse of(const Softmax& softmax) {
        return {{softmax.log_sum_exp(0, 0), softmax.log_sum_exp(0, 1)}};
    }
    __device__ __forceinline__ float log_sum_exp(int, int h) const { return v[h]; }
};

// A consumer's partial-result slot of CTA `cta` (StreamKSplit): thread t's float4 nt of O at
// nt x 128 + t, so a warp's stores and loads are 512 contiguous bytes, then, past every
// slot's O, its rows' LSE as one float2 a thread.
template <class Tr>
struct PartialSlot {
    static_assert(partial_lse_floats == 2 * warpgroup_threads, "a float2 a thread");
    static constexpr int o_float4s = partial_o_floats(Tr::o_cols) / 4;
    float4* o;
    float2* lse;
    int* flag;

    __device__ __forceinline__ PartialSlot(const StreamKSplit& split, int cta, int consumer) {
        const int slots = static_cast<int>(gridDim.x) * Tr::consumers;
        const int slot = cta * Tr::consumers + consumer;
        float4* const base = reinterpret_cast<float4*>(split.partials);
        o = base + std::int64_t{slot} * o_float4s;
        lse = reinterpret_cast<float2*>(base + std::int64_t{slots} * o_float4s) +
              slot * warpgroup_threads;
        flag = split.flags + slot;
    }
};

// A piece that does not end its tile: O (normalised) and the LSE into this CTA's slot, then
// its flag. The flag's release by one thread publishes every thread's stores, which precede
// it through the warpgroup's barrier (the pattern of CUTLASS's split-K semaphores).
template <class Tr>
__device__ __forceinline__ void store_partial(const StreamKSplit& split, int consumer,
                                              const float (&o)[1][Tr::o_cols / 8][4],
                                              const RowLse& lse) {
    const int t = static_cast<int>(threadIdx.x) % warpgroup_threads;
    const PartialSlot<Tr> slot(split, static_cast<int>(blockIdx.x), consumer);
#pragma unroll
    for (int nt = 0; nt < Tr::o_cols / 8; ++nt)
        __stcg(slot.o + nt * warpgroup_threads + t,
               make_float4(o[0][nt][0], o[0][nt][1], o[0][nt][2], o[0][nt][3]));
    __stcg(slot.lse + t, make_float2(lse.v[0], lse.v[1]));
    ptx::named_barrier_sync(Tr::barrier_id(NamedBarrier::epilogue, consumer), warpgroup_threads);
    if (t == 0)
        cuda::atomic_ref<int, cuda::thread_scope_device>(*slot.flag)
            .store(1, cuda::memory_order_release);
}

// The piece that ends a split tile: merges the partials of CTAs first_cta .. blockIdx.x - 1
// (the tile's earlier pieces, in key order) into its own O (normalised) and LSE, after its own
// (RangeFold). One thread waits for each slot's flag and zeroes it for the stream's next launch;
// the warpgroup's barrier hands the acquired stores on to the others, which read past L1.
template <class Tr>
__device__ __forceinline__ void merge_partials(const StreamKSplit& split, int consumer,
                                               int first_cta, float (&o)[1][Tr::o_cols / 8][4],
                                               RowLse& lse) {
    const int t = static_cast<int>(threadIdx.x) % warpgroup_threads;
    // Its own O first: the fold's first weight is 1 (0 for a row that saw no key, whose O is
    // already 0), so O is the accumulator as it stands.
    RangeFold fold[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
        fold[h].add(lse.v[h]);
    for (int cta = first_cta; cta < static_cast<int>(blockIdx.x); ++cta) {
        const PartialSlot<Tr> slot(split, cta, consumer);
        if (t == 0) {
            cuda::atomic_ref<int, cuda::thread_scope_device> flag(*slot.flag);
            while (flag.load(cuda::memory_order_acquire) == 0) {
            }
            flag.store(0, cuda::memory_order_relaxed);
        }
        __syncwarp();  // bar.sync is .aligned: the warp reconverges after thread 0's spin
        ptx::named_barrier_sync(Tr::barrier_id(NamedBarrier::epilogue, consumer),
                                warpgroup_threads);
        const float2 other = __ldcg(slot.lse + t);
        const RangeFold::Weights w[2] = {fold[0].add(other.x), fold[1].add(other.y)};
#pragma unroll
        for (int nt = 0; nt < Tr::o_cols / 8; ++nt) {
            const float4 x = __ldcg(slot.o + nt * warpgroup_threads + t);
            o[0][nt][0] = RangeFold::merge(o[0][nt][0], x.x, w[0]);
            o[0][nt][1] = RangeFold::merge(o[0][nt][1], x.y, w[0]);
            o[0][nt][2] = RangeFold::merge(o[0][nt][2], x.z, w[1]);
            o[0][nt][3] = RangeFold::merge(o[0][nt][3], x.w, w[1]);
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float normaliser = fold[h].normaliser();
#pragma unroll
        for (int nt = 0; nt < Tr::o_cols / 8; ++nt) {
            o[0][nt][2 * h] *= normaliser;
            o[0][nt][2 * h + 1] *= normaliser;
        }
        lse.v[h] = fold[h].log_sum_exp();
    }
}

}  // namespace flash_attention::sm90
