#pragma once

// Cooperative GMEM -> SMEM copy of a tile, 16 bytes per thread per step, with
// cp.async or with plain loads and stores through registers.

#include <cstdint>

#include "kernels/primitives/ptx.cuh"

namespace flash_attention {

// Thread t copies chunk (t % chunks_per_row) of rows t / chunks_per_row + i * row_step:
// consecutive threads read consecutive 16-byte chunks of a row, so every warp's
// load is whole 128-byte lines. Where the threads do not cover whole rows (d_head 192's 24
// chunks a row), thread t copies chunks t + i * Threads of the tile in row-major order
// instead: the same lines per warp, each chunk's row and column computed as it goes.
template <class Tile, int Threads, bool Async, class T>
class TileCopyGM2SM {
  public:
    static constexpr bool whole_rows = Threads % Tile::chunks_per_row == 0;
    static_assert(whole_rows || (Tile::rows * Tile::chunks_per_row) % Threads == 0,
                  "every thread copies the same number of chunks");
    static constexpr int row_step = whole_rows ? Threads / Tile::chunks_per_row : 1;
    static_assert(Tile::rows % row_step == 0, "every thread copies the same number of chunks");
    static constexpr int chunks_per_thread = Tile::rows * Tile::chunks_per_row / Threads;

    __device__ __forceinline__ TileCopyGM2SM(const T* gmem_tile, std::int64_t gmem_row_stride,
                                             std::uint32_t smem_tile)
        : row_stride_(gmem_row_stride) {
        if constexpr (whole_rows) {
            const int row = threadIdx.x / Tile::chunks_per_row;
            const int chunk = threadIdx.x % Tile::chunks_per_row;
            gmem_ = gmem_tile + row * gmem_row_stride + chunk * 8;
            smem_ = smem_tile + Tile::chunk_offset(row, chunk);
            thread_row_ = row;
            chunk_ = chunk;
        } else {
            gmem_ = gmem_tile;
            smem_ = smem_tile;
            thread_row_ = 0;
            chunk_ = 0;
        }
    }

    // Copies the tile's first `rows` rows and zero-fills the rest: the last block of a
    // sequence whose length is not a multiple of the tile.
    __device__ __forceinline__ void copy_rows(int rows) const {
        if (rows >= Tile::rows) {
            copy();
            return;
        }
        if constexpr (whole_rows) {
            // A row past the end reads nothing; its address still points inside the tile's
            // first row, which exists.
            const T* first_row = gmem_ - thread_row_ * row_stride_;
#pragma unroll
            for (int i = 0; i < chunks_per_thread; ++i) {
                const bool valid = thread_row_ + i * row_step < rows;
                const T* src = valid ? gmem_ + i * row_step * row_stride_ : first_row;
                if constexpr (Async) {
                    ptx::cp_async_16_zfill(smem(i), src, valid);
                } else {
                    ptx::st_shared_16(smem(i), valid ? ptx::ld_global_16(src) : uint4{0, 0, 0, 0});
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < chunks_per_thread; ++i) {
                const Chunk c = chunk_of(i);
                const bool valid = c.row < rows;
                const T* src = valid ? gmem(c) : gmem_;  // the tile's first row exists
                if constexpr (Async) {
                    ptx::cp_async_16_zfill(smem(c), src, valid);
                } else {
                    ptx::st_shared_16(smem(c), valid ? ptx::ld_global_16(src) : uint4{0, 0, 0, 0});
                }
            }
        }
    }

    // Issues (async) or performs (sync) the copy of the current tile.
    __device__ __forceinline__ void copy() const {
        if constexpr (!whole_rows) {
            // All loads before any store (sync), as below.
            uint4 staged[Async ? 1 : chunks_per_thread];
#pragma unroll
            for (int i = 0; i < chunks_per_thread; ++i) {
                if constexpr (Async)
                    ptx::cp_async_16(smem(chunk_of(i)), gmem(chunk_of(i)));
                else
                    staged[i] = ptx::ld_global_16(gmem(chunk_of(i)));
            }
            if constexpr (!Async) {
#pragma unroll
                for (int i = 0; i < chunks_per_thread; ++i)
                    ptx::st_shared_16(smem(chunk_of(i)), staged[i]);
            }
        } else if constexpr (Async) {
#pragma unroll
            for (int i = 0; i < chunks_per_thread; ++i) {
                ptx::cp_async_16(smem(i), gmem_ + i * row_step * row_stride_);
            }
        } else {
            // All loads before any store: chunks_per_thread loads in flight at once.
            uint4 staged[chunks_per_thread];
#pragma unroll
            for (int i = 0; i < chunks_per_thread; ++i) {
                staged[i] = ptx::ld_global_16(gmem_ + i * row_step * row_stride_);
            }
#pragma unroll
            for (int i = 0; i < chunks_per_thread; ++i) {
                ptx::st_shared_16(smem(i), staged[i]);
            }
        }
    }

    // Moves the GMEM window down by `rows` rows (the next K or V block).
    __device__ __forceinline__ void advance(int rows) {
        gmem_ += rows * row_stride_;
    }

  private:
    // Without whole rows: this thread's chunk i, its row and column in the tile.
    struct Chunk {
        int row, chunk;
    };
    __device__ __forceinline__ static Chunk chunk_of(int i) {
        const unsigned index = threadIdx.x + static_cast<unsigned>(i * Threads);
        return {static_cast<int>(index / Tile::chunks_per_row),
                static_cast<int>(index % Tile::chunks_per_row)};
    }
    __device__ __forceinline__ const T* gmem(Chunk c) const {
        return gmem_ + c.row * row_stride_ + c.chunk * 8;
    }
    __device__ __forceinline__ std::uint32_t smem(Chunk c) const {
        return smem_ + Tile::chunk_offset(c.row, c.chunk);
    }

    // When row_step is a multiple of 8 every chunk i keeps the thread's swizzle
    // pattern, so the offset is a compile-time multiple of the row size.
    __device__ __forceinline__ std::uint32_t smem(int i) const {
        if constexpr (!Tile::swizzled || row_step % 8 == 0) {
            return smem_ + i * row_step * Tile::row_bytes;
        } else {
            const int row = thread_row_ + i * row_step;
            return smem_ - Tile::chunk_offset(thread_row_, chunk_) +
                   Tile::chunk_offset(row, chunk_);
        }
    }

    const T* gmem_;  // whole rows: this thread's first chunk; else the tile's first row
    std::int64_t row_stride_;
    std::uint32_t smem_;  // the same in shared memory
    int thread_row_;      // whole rows: the tile row of this thread's first chunk
    int chunk_;
};

// Elements of type T in a 16-byte chunk (8 of 16 bits, 16 of e4m3).
template <class T>
inline constexpr int chunk_elements = 16 / static_cast<int>(sizeof(T));

// Cooperative GMEM -> SMEM copy (cp.async) of a tile whose rows lie anywhere: row r comes
// from row_source(r), a T* or null for a row that reads as zeros. The thread-to-chunk
// mapping is TileCopyGM2SM's: whole 128-byte lines per warp wherever a row is. Threads of
// the CTA's CtaThreads copy together: all of them, or each power-of-two group of Threads
// its own tile (a split-KV key warp's stream; thread index modulo Threads).
template <class Tile, int Threads, int CtaThreads = Threads>
class RowGatherCopyGM2SM {
  public:
    static_assert(Threads % Tile::chunks_per_row == 0, "threads cover whole rows");
    static_assert(CtaThreads % Threads == 0 && (Threads & (Threads - 1)) == 0,
                  "groups of a power of two threads: the modulo is a mask");
    // The rows of a paged cache's groups (copy_groups), each contiguous.
    static constexpr int group = 16;
    // The threads that copy: all of them, or, where rows are narrow (an e4m3 row of d_head 64
    // is 4 chunks), those that cover one group's rows, so that a thread's rows still fall
    // into known groups; the others issue nothing.
    static constexpr int copy_threads =
        Threads < group * Tile::chunks_per_row ? Threads : group * Tile::chunks_per_row;
    static constexpr int row_step = copy_threads / Tile::chunks_per_row;
    static_assert(Tile::rows % row_step == 0, "every thread copies the same number of chunks");
    static constexpr int chunks_per_thread = Tile::rows / row_step;

    // This thread's first row (the others follow row_step apart) and its chunk of each.
    // Without groups the thread index is used as it is: nvcc 13.0's ptxas, given the modulo
    // in the one-warp d_head 256 paged split-KV kernel, put the copies' L2 policy in an odd
    // uniform register (LDGSTS desc[UR1]), an illegal instruction at run time.
    // (Unsigned: a signed division costs its sign fix-up in every address.)
    __device__ __forceinline__ static int thread_row() {
        const unsigned t = threadIdx.x;
        return static_cast<int>((CtaThreads == Threads ? t : t % Threads) / Tile::chunks_per_row);
    }
    __device__ __forceinline__ static int thread_chunk() {
        return static_cast<int>(threadIdx.x % Tile::chunks_per_row);
    }
    __device__ __forceinline__ static bool copies() {
        return copy_threads == Threads || thread_row() < row_step;
    }

    // `fallback`: any readable address, given to the rows that read nothing.
    template <class T, class RowSource>
    __device__ __forceinline__ static void copy(std::uint32_t smem_tile,
                                                const RowSource& row_source, const T* fallback) {
        if (!copies())
            return;
        const int row = thread_row();
        const int chunk = thread_chunk();
#pragma unroll
        for (int i = 0; i < chunks_per_thread; ++i) {
            const int r = row + i * row_step;
            const T* src = row_source(r);
            ptx::cp_async_16_zfill(smem_tile + Tile::chunk_offset(r, chunk),
                                   (src != nullptr ? src : fallback) + chunk * chunk_elements<T>,
                                   src != nullptr);
        }
    }

    // The same for a whole tile of rows row_stride apart from `first_row`: no predicates, and
    // a thread's rows a constant step apart (the steady state of a contiguous K/V cache),
    // under the L2 policy `l2` (ptx::l2_policy).
    template <class T>
    __device__ __forceinline__ static void copy_strided(std::uint32_t smem_tile, const T* first_row,
                                                        std::int64_t row_stride, std::uint64_t l2) {
        if (!copies())
            return;
        const int row = thread_row();
        const int chunk = thread_chunk();
        const T* src = first_row + row * row_stride + chunk * chunk_elements<T>;
        const std::int64_t step = row_step * row_stride;
#pragma unroll
        for (int i = 0; i < chunks_per_thread; ++i) {
            ptx::cp_async_16_zfill(smem_tile + Tile::chunk_offset(row + i * row_step, chunk), src,
                                   true, l2);
            src += step;
        }
    }

    // The same for a whole tile of 16-row groups that are each contiguous (row_stride apart)
    // wherever the group lies, every group in memory: a paged KV cache's block whose pages
    // all exist (group_source(g) is row 16 g's address, asked once per group a thread
    // touches). No predicates, and a thread's rows in a group a constant step apart: with
    // the gather below for every block, decoding b16 x 8192 on 16-row pages took 140 µs,
    // with this 133 (contiguous 128; H200, docs/PERF.md 2026-11-26).
    template <class GroupSource>
    __device__ __forceinline__ static void copy_whole_groups(std::uint32_t smem_tile,
                                                             const GroupSource& group_source,
                                                             std::int64_t row_stride,
                                                             std::uint64_t l2) {
        static_assert(group % row_step == 0, "a thread's rows fall into known groups");
        if (!copies())
            return;
        const int row = thread_row();
        const int chunk = thread_chunk();
        const std::int64_t offset =
            row * row_stride +
            chunk * chunk_elements<std::remove_cvref_t<decltype(*group_source(0))>>;
        const std::int64_t step = row_step * row_stride;
        decltype(group_source(0)) src = nullptr;
#pragma unroll
        for (int i = 0; i < chunks_per_thread; ++i) {
            if ((i * row_step) % group == 0)
                src = group_source((i * row_step) / group) + offset;
            ptx::cp_async_16_zfill(smem_tile + Tile::chunk_offset(row + i * row_step, chunk), src,
                                   true, l2);
            src += step;
        }
    }

    // The same for a tile made of 16-row groups that are each contiguous (row_stride apart)
    // wherever the group lies: the pages of a paged KV cache, whose size is a multiple of
    // 16. group_source(g) is row 16 g's address (or null: the group reads as zeros), asked
    // with a compile-time g once per group a thread touches; rows from `valid_rows` on read
    // as zeros. Under the L2 policy `l2`.
    template <class T, class GroupSource>
    __device__ __forceinline__ static void copy_groups(std::uint32_t smem_tile,
                                                       const GroupSource& group_source,
                                                       std::int64_t row_stride, int valid_rows,
                                                       const T* fallback, std::uint64_t l2) {
        // A thread's first row is below row_step, so with row_step dividing 16 its row
        // i * row_step + row stays in group i * row_step / 16.
        static_assert(group % row_step == 0, "a thread's rows fall into known groups");
        if (!copies())
            return;
        const int row = thread_row();
        const int chunk = thread_chunk();
        const T* base = nullptr;
#pragma unroll
        for (int i = 0; i < chunks_per_thread; ++i) {
            const int r = row + i * row_step;
            if ((i * row_step) % group == 0)
                base = group_source((i * row_step) / group);
            const T* src =
                base == nullptr || r >= valid_rows ? nullptr : base + (r % group) * row_stride;
            ptx::cp_async_16_zfill(smem_tile + Tile::chunk_offset(r, chunk),
                                   (src != nullptr ? src : fallback) + chunk * chunk_elements<T>,
                                   src != nullptr, l2);
        }
    }
};
}  // namespace flash_attention
