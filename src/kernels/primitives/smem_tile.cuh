#pragma once

// Layouts of tiles of 16-bit elements in shared memory, addressed in 16-byte chunks of
// 8 elements (one ldmatrix row, one cp.async, one vector store): the types own the
// offset arithmetic, so callers name a (row, chunk) and never a byte.

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
    // 4-bank groups, conflict-free, and keeps each chunk inside its own row.
    static_assert(!Swizzled || chunks_per_row % 8 == 0,
                  "the XOR swizzle needs rows of a multiple of 8 chunks (128 bytes)");
    static_assert(Cols % 8 == 0, "rows are whole 16-byte chunks");

    __device__ static constexpr std::uint32_t chunk_offset(int row, int chunk) {
        return static_cast<std::uint32_t>(row * row_bytes +
                                          (Swizzled ? (chunk ^ (row & 7)) : chunk) * 16);
    }
};

// The layout TMA's 128-byte swizzle writes and wgmma reads (sm90): Cols / 64 sub-tiles of
// Rows x 64 elements, one after another, each row 128 bytes with its chunk c stored at
// c ^ (row % 8). The 8 rows an ldmatrix phase or a quad's stores touch land in 8
// different bank groups. Tiles start on the swizzle's 1024-byte period.
template <int Rows, int Cols>
struct Swizzled128Tile {
    static constexpr int rows = Rows;
    static constexpr int cols = Cols;
    static constexpr int row_bytes = 128;  // of a sub-tile: the swizzle's width
    static constexpr int sub_tiles = Cols / 64;
    static constexpr int sub_tile_bytes = Rows * row_bytes;
    static constexpr int bytes = sub_tiles * sub_tile_bytes;
    static constexpr int chunks_per_row = Cols / 8;
    static_assert(Cols % 64 == 0, "whole 64-column sub-tiles");

    // Chunk `chunk` (columns 8 chunk .. 8 chunk + 7) of row `row`.
    __host__ __device__ static constexpr std::uint32_t chunk_offset(int row, int chunk) {
        return static_cast<std::uint32_t>((chunk / 8) * sub_tile_bytes + row * row_bytes +
                                          ((chunk % 8) ^ (row % 8)) * 16);
    }
    // Where k-step kk (16 columns) of a K-major operand starts: sub-tile kk / 4, 32 bytes
    // per step into its rows (wgmma applies the swizzle to the full address).
    __host__ __device__ static constexpr std::uint32_t k_step_offset(int kk) {
        return static_cast<std::uint32_t>((kk / 4) * sub_tile_bytes + (kk % 4) * 32);
    }
    // Where rows [row, row + 16) of sub-tile `sub_tile` start (an MN-major operand's k-step).
    __host__ __device__ static constexpr std::uint32_t rows_offset(int sub_tile, int row) {
        return static_cast<std::uint32_t>(sub_tile * sub_tile_bytes + row * row_bytes);
    }
};

// The address of one lane's ldmatrix row inside a tile, for the chunk pattern
// "row r + dr, chunk h + dc" with dr a multiple of 8 and dc even: the swizzle of
// (h + dc) under row r equals dc ^ (h ^ (r % 8)), so the per-lane part (h ^ r % 8)
// is computed once and each load adds only a compile-time row and chunk term.
template <class Tile>
struct LaneRowPointer {
    std::uint32_t row_address;  // tile base + r * row_bytes
    int lane_chunk;             // h ^ (r % 8) when swizzled, else h

    __device__ __forceinline__ LaneRowPointer(std::uint32_t tile_base, int r, int h)
        : row_address(tile_base + r * Tile::row_bytes),
          lane_chunk(Tile::swizzled ? (h ^ (r & 7)) : h) {}

    __device__ __forceinline__ std::uint32_t at(int dr, int dc) const {
        const int chunk = Tile::swizzled ? (dc & ~7) | ((dc & 7) ^ lane_chunk) : dc + lane_chunk;
        return row_address + dr * Tile::row_bytes + chunk * 16;
    }
};

}  // namespace flash_attention
