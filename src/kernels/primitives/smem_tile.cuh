#pragma once

// Layout of a Rows x Cols tile of 16-bit elements in shared memory: row-major rows
// of Cols*2 bytes, addressed in 16-byte chunks (one ldmatrix row, one cp.async).

#include <cstdint>

namespace flash_attention {

template <int Rows, int Cols, bool Swizzled>
struct SmemTile {
    static constexpr int rows = Rows;
    static constexpr int cols = Cols;
    static constexpr int chunks_per_row = Cols / 8;
    static constexpr int row_bytes = Cols * 2;
    static constexpr int bytes = Rows * row_bytes;
    static constexpr bool swizzled = Swizzled;

    // ldmatrix reads one 16-byte chunk from each of 8 consecutive rows. With rows of
    // 128 bytes or more, those 8 chunks sit at the same bank offset: an 8-way bank
    // conflict. XOR-ing the chunk index with (row % 8) puts them in 8 distinct
    // 4-bank groups, conflict-free, and keeps each chunk inside its own row. Rows of 64
    // bytes (an e4m3 row at d_head 64) lie two to 128 bytes of banks: XOR-ing the chunk
    // index with (row / 2) % 4 puts the 8 rows' chunks in 2 x 4 distinct groups.
    static_assert(!Swizzled || chunks_per_row % 8 == 0 || chunks_per_row == 4,
                  "the XOR swizzle needs rows of 64 bytes or a multiple of 128");
    static_assert(Cols % 8 == 0, "rows are whole 16-byte chunks");
    // The chunks one row's swizzle permutes (the low bits of the chunk index), and its
    // pattern, which repeats every 8 rows.
    static constexpr int swizzle_chunks = chunks_per_row >= 8 ? 8 : 4;
    __device__ static constexpr int swizzle(int row) {
        return swizzle_chunks == 8 ? row & 7 : (row >> 1) & 3;
    }

    __device__ static constexpr std::uint32_t chunk_offset(int row, int chunk) {
        return static_cast<std::uint32_t>(row * row_bytes +
                                          (Swizzled ? (chunk ^ swizzle(row)) : chunk) * 16);
    }
};

// The address of one lane's ldmatrix row inside a tile, for the chunk pattern
// "row r + dr, chunk h + dc" with dr a multiple of 8 and dc even: the swizzle of
// (h + dc) under row r equals dc ^ (h ^ swizzle(r)) in the swizzled low bits, so the
// per-lane part (h ^ swizzle(r)) is computed once and each load adds only a compile-time
// row and chunk term.
template <class Tile>
struct LaneRowPointer {
    std::uint32_t row_address;  // tile base + r * row_bytes
    int lane_chunk;             // h ^ swizzle(r) when swizzled, else h

    __device__ __forceinline__ LaneRowPointer(std::uint32_t tile_base, int r, int h)
        : row_address(tile_base + r * Tile::row_bytes),
          lane_chunk(Tile::swizzled ? (h ^ Tile::swizzle(r)) : h) {}

    __device__ __forceinline__ std::uint32_t at(int dr, int dc) const {
        constexpr int low = Tile::swizzle_chunks - 1;
        const int chunk =
            Tile::swizzled ? (dc & ~low) | ((dc & low) ^ lane_chunk) : dc + lane_chunk;
        return row_address + dr * Tile::row_bytes + chunk * 16;
    }
};

}  // namespace flash_attention
