#pragma once

// Tensor-memory-accelerator copies and the mbarriers they complete on (sm_90), through
// CCCL's cuda::ptx. A tile (a Swizzle128Tile: R rows x d_head columns) travels as
// d_head / 64 boxes of R x 64 elements, each landing in its own sub-tile that wgmma
// reads directly; a group-major tile's run of rows as one box of all its columns.

#include <cstdint>
#include <cuda/ptx>

namespace flash_attention {

// A position in a ring of pipeline stages (the forward's K/V blocks, the backward's Q and dO
// blocks): item j lives in stage j % Stages, and each reuse of a stage flips the parity of its
// barriers' phase.
template <int Stages>
struct RingSlot {
    int stage;
    std::uint32_t parity;
    __device__ __forceinline__ explicit RingSlot(int j)
        : stage(j % Stages), parity(static_cast<std::uint32_t>((j / Stages) & 1)) {}
};

}  // namespace flash_attention

namespace flash_attention::tma {

// One mbarrier in shared memory: a phase completes when `count` threads have arrived
// and every byte announced with arrive_expect_tx has landed.
class Barrier {
  public:
    __device__ __forceinline__ void init(std::uint32_t count) {
        cuda::ptx::mbarrier_init(&state_, count);
    }
    __device__ __forceinline__ void arrive() { cuda::ptx::mbarrier_arrive(&state_); }
    // The producer's arrival: announces `bytes` that TMA copies will deliver to this phase.
    __device__ __forceinline__ void arrive_expect_tx(std::uint32_t bytes) {
        cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                             cuda::ptx::space_shared, &state_, bytes);
    }
    // Waits until the phase of this parity has completed. A fresh barrier counts its
    // phase "-1" (parity 1) as complete, so the first wait for parity 1 returns at once.
    __device__ __forceinline__ void wait(std::uint32_t parity) {
        while (!cuda::ptx::mbarrier_try_wait_parity(&state_, parity)) {
        }
    }
    __device__ __forceinline__ std::uint64_t* get() { return &state_; }

  private:
    std::uint64_t state_;
};

// Makes mbarrier initialisation visible to the async proxy (the TMA unit) before use.
__device__ __forceinline__ void fence_barrier_init() {
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

// Orders this thread's ordinary shared-memory writes before later async-proxy accesses
// (a TMA store reading them, a wgmma reading them).
__device__ __forceinline__ void fence_shared_to_async_proxy() {
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
}

// A Tile's boxes, one a sub-tile (64 or 32 columns), at `at` in the map (at[0], the column, set
// for each box).
template <class Tile, int Rank>
__device__ __forceinline__ void load_boxes(void* smem, const void* map, std::int32_t (&at)[Rank],
                                           Barrier& barrier) {
    static_assert(!Tile::group_major, "a tile of whole sub-tiles");
#pragma unroll
    for (int c = 0; c < Tile::sub_tiles; ++c) {
        at[0] = c * Tile::sub_tile_cols;
        cuda::ptx::cp_async_bulk_tensor(
            cuda::ptx::space_cluster, cuda::ptx::space_global,
            static_cast<unsigned char*>(smem) + c * Tile::sub_tile_stride, map, at, barrier.get());
    }
}

// Loads rows [row, row + R) of (head, batch), all d_head columns, into a Tile; rows past
// the tensor's end arrive as zeros. `map` is a 4-D tensor map (d_head, seq, heads, batch)
// with a box of 64 x R.
template <class Tile>
__device__ __forceinline__ void load_tile(void* smem, const void* map, int row, int head, int batch,
                                          Barrier& barrier) {
    std::int32_t at[4] = {0, row, head, batch};
    load_boxes<Tile>(smem, map, at, barrier);
}

// The same from column col0 on (a Tile's columns of a wider row: FP8 attention's copy of V,
// whose rows hold every key); columns past the row's end arrive as zeros.
template <class Tile>
__device__ __forceinline__ void load_tile_at(void* smem, const void* map, int col0, int row,
                                             int head, int batch, Barrier& barrier) {
    static_assert(!Tile::group_major, "a tile of whole sub-tiles");
#pragma unroll
    for (int c = 0; c < Tile::sub_tiles; ++c) {
        const std::int32_t at[4] = {col0 + c * Tile::sub_tile_cols, row, head, batch};
        cuda::ptx::cp_async_bulk_tensor(
            cuda::ptx::space_cluster, cuda::ptx::space_global,
            static_cast<unsigned char*>(smem) + c * Tile::sub_tile_stride, map, at, barrier.get());
    }
}

// Loads the rows of R / G positions from `position` on of the G query heads of K/V head
// `kv_head` into a Tile, position-major (row p x G + h: position + p, head kv_head x G + h;
// pack_gqa); positions past the tensor's end arrive as zeros. `map` is a 5-D tensor map
// (d_head, G, seq, heads / G, batch) with a box of 64 x G x R / G.
template <class Tile>
__device__ __forceinline__ void load_packed_tile(void* smem, const void* map, int position,
                                                 int kv_head, int batch, Barrier& barrier) {
    std::int32_t at[5] = {0, 0, position, kv_head, batch};
    load_boxes<Tile>(smem, map, at, barrier);
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory into
// shared memory, completing on `barrier` (PTX ISA, cp.async.bulk.shared::cluster.global).
__device__ __forceinline__ void load_bytes(void* smem, const void* global, std::uint32_t bytes,
                                           Barrier& barrier) {
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, smem, global, bytes,
                             barrier.get());
}

// Loads a run of a paged cache's rows into a group-major Tile (GroupMajor: its 8-row
// groups hold every column) from tile_row (a multiple of 8) on: rows [row, row + R) of page
// `page`, head `head`, all d_head columns, in one copy. `map` is 5-D (a sub-tile's columns, 8
// rows, heads x sub-tiles, 8-row groups of a page, pages) with a box of (sub-tile columns, 8,
// sub-tiles, R / 8, 1): its third dimension steps a sub-tile's row (128 or 64 bytes), so a
// head's sub-tiles and the next head's follow each other (the cache's heads are d_head
// apart), and the box lands as the run's groups, each with its sub-tiles in turn, as the
// Tile lays them out.
template <class Tile>
__device__ __forceinline__ void load_group_rows(void* smem, int tile_row, const void* map, int row,
                                                int head, int page, Barrier& barrier) {
    static_assert(Tile::group_major, "a tile whose 8-row groups hold every column");
    const std::int32_t coords[5] = {0, 0, head * Tile::sub_tiles, row / Tile::group_rows, page};
    cuda::ptx::cp_async_bulk_tensor(
        cuda::ptx::space_cluster, cuda::ptx::space_global,
        static_cast<unsigned char*>(smem) + Tile::group_offset(tile_row), map, coords,
        barrier.get());
}

// A Tile's boxes stored at `at` (load_boxes()), issued and committed as one bulk group:
// wait_stores_read() before the shared memory is reused.
template <class Tile, int Rank>
__device__ __forceinline__ void store_boxes(const void* smem, const void* map,
                                            std::int32_t (&at)[Rank]) {
#pragma unroll
    for (int c = 0; c < Tile::sub_tiles; ++c) {
        at[0] = c * Tile::sub_tile_cols;
        cuda::ptx::cp_async_bulk_tensor(
            cuda::ptx::space_global, cuda::ptx::space_shared, map, at,
            static_cast<const unsigned char*>(smem) + c * Tile::sub_tile_stride);
    }
    cuda::ptx::cp_async_bulk_commit_group();
}

// Stores a tile laid out as load_tile() leaves it; rows past the tensor's end are not
// written.
template <class Tile>
__device__ __forceinline__ void store_tile(const void* smem, const void* map, int row, int head,
                                           int batch) {
    std::int32_t at[4] = {0, row, head, batch};
    store_boxes<Tile>(smem, map, at);
}

// Stores a tile laid out as load_packed_tile() leaves it; positions past the tensor's end
// are not written.
template <class Tile>
__device__ __forceinline__ void store_packed_tile(const void* smem, const void* map, int position,
                                                  int kv_head, int batch) {
    std::int32_t at[5] = {0, 0, position, kv_head, batch};
    store_boxes<Tile>(smem, map, at);
}

// Waits until every store (or bulk reduce) this thread issued has read its shared memory.
__device__ __forceinline__ void wait_stores_read() {
    cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
}

// Waits until every store (or bulk reduce) this thread issued has completed.
__device__ __forceinline__ void wait_stores_done() {
    cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}

}  // namespace flash_attention::tma
