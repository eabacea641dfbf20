#pragma once

// A Rows x Cols tile of 16-bit elements in shared memory as TMA's 128- or 64-byte swizzle
// lays it out and wgmma reads it: sub-tiles of [Rows][64] (128-byte swizzle, rows of 128
// bytes, the widest box that swizzle allows) or [Rows][32] (64-byte swizzle, rows of 64
// bytes), each starting on its swizzle's period of 8 rows (1024 or 512 bytes). Inside a
// sub-tile the 16-byte chunk c of row r sits at chunk c ^ (the row's 128-byte line within the
// period), so the 8 rows an ldmatrix phase or a quad's stores touch fall in 8 different bank
// groups. The type owns every offset into the tile and the wgmma descriptors that read it.
// The 64-byte swizzle serves head dims that are not whole 64-column sub-tiles (96: three
// 32-column sub-tiles, where the 128-byte swizzle would pad to 128 columns and P·V's
// MN-major wgmma, whose N is whole swizzle atoms, would compute a quarter of padding).

#include <cstdint>

namespace flash_attention {

// PTX ISA "Matrix Descriptor Format" (wgmma): start address, leading and stride byte
// offsets (all in 16-byte units), and the swizzle mode (bits 62-63): 1 = 128-byte, 2 = 64-byte.
template <int SwizzleBytes>
__device__ __forceinline__ std::uint64_t smem_descriptor(std::uint32_t address,
                                                         std::uint32_t leading_bytes,
                                                         std::uint32_t stride_bytes) {
    static_assert(SwizzleBytes == 128 || SwizzleBytes == 64, "the 128- or 64-byte swizzle");
    constexpr std::uint64_t mode = SwizzleBytes == 128 ? 1 : 2;
    return static_cast<std::uint64_t>((address & 0x3FFFF) >> 4) |
           static_cast<std::uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16 |
           static_cast<std::uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32 | mode << 62;
}

// `descriptor` moved `bytes` (a multiple of 16) further into its tile. Only the start
// address field (bits 0-13, in 16-byte units) changes: shared-memory addresses stay below
// 256 KiB (the field's reach; an H100 has 228 KiB), so the sum never carries into the
// other fields, and the low word takes one 32-bit add. A GEMM's k-steps are then one base
// descriptor plus constants: one uniform add per wgmma instead of rebuilding each
// descriptor from its address (four to five uniform-datapath instructions).
__device__ __forceinline__ std::uint64_t advance(std::uint64_t descriptor, std::uint32_t bytes) {
    const std::uint32_t start = static_cast<std::uint32_t>(descriptor) + (bytes >> 4);
    return (descriptor & ~std::uint64_t{0xFFFFFFFF}) | start;
}

// The same as one 64-bit add (no carry leaves the start field, as above). Which form gives
// fewer instructions depends on the kernel (ptxas, CUDA 13.0): the 64-bit add spares moves of
// each descriptor's constant high word, but keeps 64-bit bases live in register pairs, which
// grew the forward's d_head 256 loop by 10%. Tiles choose it with WideAdvance.
__device__ __forceinline__ std::uint64_t advance_wide(std::uint64_t descriptor,
                                                      std::uint32_t bytes) {
    return descriptor + (bytes >> 4);
}

// GroupMajor: the 8-row groups outermost instead, each holding its rows of every sub-tile
// ([Rows / 8][sub-tiles][8][row]): a run of whole groups is then one contiguous region, which
// one TMA box of a 5-D map fills with all d_head columns (a paged cache's run of rows,
// tma::load_group_rows()). wgmma reads it as well: only the strides of its descriptors
// change, the groups of a sub-tile being a group further apart instead of adjacent.
// WideAdvance: its descriptors advanced by advance_wide() instead of advance().
template <int Rows, int Cols, int SwizzleBytes = 128, bool GroupMajor = false,
          bool WideAdvance = false>
struct SwizzledTile {
    static constexpr int rows = Rows;
    static constexpr int cols = Cols;
    static constexpr int swizzle_bytes = SwizzleBytes;
    static constexpr bool group_major = GroupMajor;
    static constexpr int row_bytes = SwizzleBytes;  // a sub-tile's row: one swizzle line
    static constexpr int sub_tile_cols = row_bytes / 2;
    static constexpr int chunks = row_bytes / 16;  // 16-byte chunks of a sub-tile's row
    static constexpr int sub_tiles = Cols / sub_tile_cols;
    static constexpr int group_rows = 8;  // the swizzle's period: 8 rows
    static constexpr int bytes = sub_tiles * Rows * row_bytes;
    static_assert(SwizzleBytes == 128 || SwizzleBytes == 64, "the 128- or 64-byte swizzle");
    static_assert(Cols % sub_tile_cols == 0, "whole sub-tiles");
    static_assert(Rows % group_rows == 0, "whole 8-row swizzle periods");
    // From row r of sub-tile t to the same row of sub-tile t + 1, and from an 8-row group
    // of a sub-tile to its next group.
    static constexpr int sub_tile_stride = GroupMajor ? group_rows * row_bytes : Rows * row_bytes;
    static constexpr int group_stride =
        GroupMajor ? sub_tiles * group_rows * row_bytes : group_rows * row_bytes;

    // Byte offset of 16-byte chunk `chunk` (0 .. chunks - 1) of row `row` in sub-tile
    // `sub_tile`. The swizzle XORs the chunk with the row's 128-byte line in its period
    // (address bits 7.. onto bits 4..): the row itself (128-byte rows), or its half (64-byte).
    __device__ static constexpr int chunk_offset(int sub_tile, int row, int chunk) {
        const int row_offset =
            GroupMajor ? (row / group_rows) * group_stride + (row % group_rows) * row_bytes
                       : row * row_bytes;
        const int line = (row % group_rows) * row_bytes / 128;
        return sub_tile * sub_tile_stride + row_offset + ((chunk ^ (line % chunks)) * 16);
    }
    // The same with `chunk` counted across the whole row (0 .. Cols / 8), as SmemTile's.
    __device__ static constexpr int chunk_offset(int row, int chunk) {
        return chunk_offset(chunk / chunks, row, chunk % chunks);
    }
    // chunk_offset(row, chunk) from the row's chunk_offset(row, 0) (or that plus a tile's base:
    // tiles start on the swizzle's period, so the low bits are the offset's): the swizzle XORs
    // the chunk's bits (4 .. 6 of the address; 4 .. 5 at 64 bytes) with the row's line and no
    // other bit depends on the chunk but its sub-tile, so a walk over a row's chunks keeps one
    // offset and pays an XOR and an add a chunk (both immediates for a constant chunk).
    __device__ static constexpr std::uint32_t chunk_offset_from(std::uint32_t row_offset,
                                                                int chunk) {
        return (row_offset ^ static_cast<std::uint32_t>(chunk % chunks * 16)) +
               static_cast<std::uint32_t>(chunk / chunks * sub_tile_stride);
    }
    // Where row `row` (a multiple of 8) of the tile's first sub-tile starts.
    __device__ static constexpr int group_offset(int row) {
        return (row / group_rows) * group_stride;
    }

    // `descriptor` moved `bytes` further into the tile, by this tile's form of the add.
    __device__ static std::uint64_t advanced(std::uint64_t descriptor, std::uint32_t bytes) {
        if constexpr (WideAdvance)
            return advance_wide(descriptor, bytes);
        else
            return advance(descriptor, bytes);
    }

    // As a K-major wgmma operand (rows of k contiguous: Q and K of S = Q·Kᵀ), k-step kk
    // (16 columns, 32 bytes). 8-row core-matrix groups are group_stride bytes apart; the
    // leading offset is unused with swizzling. The k-step starts 32 bytes further into each
    // swizzled row: the hardware applies the swizzle to the full address, so the shifted
    // start stays consistent with TMA's layout.
    __device__ static std::uint64_t k_major(std::uint32_t base, int kk) {
        constexpr int steps = sub_tile_cols / 16;  // k-steps a sub-tile
        return advanced(smem_descriptor<SwizzleBytes>(base, 16, group_stride),
                        (kk / steps) * sub_tile_stride + (kk % steps) * 32);
    }

    // As an MN-major wgmma operand (rows of n contiguous: V as the B of P·V), rows
    // [16 kk, 16 kk + 16) and every column: 8 k-rows of a sub-tile form a group; the next
    // sub-tile's columns of n are a sub-tile further on (the leading offset).
    __device__ static std::uint64_t mn_major(std::uint32_t base, int kk) {
        return advanced(smem_descriptor<SwizzleBytes>(base, sub_tile_stride, group_stride),
                        kk * (2 * group_stride));
    }
};

// The swizzles as the hardware applies them to a shared-memory address (PTX ISA, "Tensor-map
// swizzle modes" and wgmma's matrix descriptors; CUTLASS names them Swizzle<3,4,3> and
// Swizzle<2,4,3>): the 16-byte chunk bits [4, 4 + b) XORed with bits [7, 7 + b), b = 3 (128-byte)
// or 2 (64-byte). chunk_offset() must give the same address for every row and chunk of a tile
// whose base is aligned to the period, or TMA's writes and wgmma's reads would disagree with it.
template <class Tile>
constexpr bool matches_address_swizzle() {
    constexpr int mask = Tile::chunks - 1;
    for (int sub_tile = 0; sub_tile < Tile::sub_tiles; ++sub_tile) {
        for (int row = 0; row < Tile::rows; ++row) {
            for (int chunk = 0; chunk < Tile::chunks; ++chunk) {
                // The chunk's place before swizzling: its sub-tile, 8-row group, row, chunk.
                const int plain = sub_tile * Tile::sub_tile_stride +
                                  row / Tile::group_rows * Tile::group_stride +
                                  row % Tile::group_rows * Tile::row_bytes + chunk * 16;
                if (Tile::chunk_offset(sub_tile, row, chunk) !=
                    (plain ^ (((plain >> 7) & mask) << 4)))
                    return false;
            }
        }
    }
    return true;
}

// The 128-byte swizzle's tiles (64-column sub-tiles), which every tile but the forward's at a
// head dim of odd 32-column sub-tiles uses.
template <int Rows, int Cols, bool GroupMajor = false, bool WideAdvance = false>
using Swizzle128Tile = SwizzledTile<Rows, Cols, 128, GroupMajor, WideAdvance>;

static_assert(matches_address_swizzle<Swizzle128Tile<64, 128>>() &&
                  matches_address_swizzle<Swizzle128Tile<16, 256, true>>() &&
                  matches_address_swizzle<SwizzledTile<64, 96, 64>>() &&
                  matches_address_swizzle<SwizzledTile<16, 96, 64, true>>(),
              "chunk_offset() is the hardware's swizzle of the unswizzled layout");

}  // namespace flash_attention
