#pragma once

// A Rows x Cols tile of 16-bit elements in shared memory as TMA's 128-byte swizzle lays it
// out and wgmma reads it: Cols / 64 sub-tiles of [Rows][64] (rows of 128 bytes, the widest
// box the swizzle allows), each starting on the swizzle's 1024-byte period. Inside a
// sub-tile the 16-byte chunk c of row r sits at chunk c ^ (r % 8), so the 8 rows an
// ldmatrix phase or a quad's stores touch fall in 8 different bank groups. The type owns
// every offset into the tile and the wgmma descriptors that read it.

#include <cstdint>

namespace flash_attention {

// PTX ISA "Matrix Descriptor Format" (wgmma): start address, leading and stride byte
// offsets (all in 16-byte units), and the swizzle mode, 1 = 128-byte.
__device__ __forceinline__ std::uint64_t smem_descriptor_128b(std::uint32_t address,
                                                              std::uint32_t leading_bytes,
                                                              std::uint32_t stride_bytes) {
    return static_cast<std::uint64_t>((address & 0x3FFFF) >> 4) |
           static_cast<std::uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16 |
           static_cast<std::uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32 | std::uint64_t{1} << 62;
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
// ([Rows / 8][Cols / 64][8][64]): a run of whole groups is then one contiguous region, which
// one TMA box of a 5-D map fills with all d_head columns (a paged cache's run of rows,
// tma::load_group_rows()). wgmma reads it as well: only the strides of its descriptors
// change, the groups of a sub-tile being a group further apart instead of adjacent.
// WideAdvance: its descriptors advanced by advance_wide() instead of advance().
template <int Rows, int Cols, bool GroupMajor = false, bool WideAdvance = false>
struct Swizzle128Tile {
    static constexpr int rows = Rows;
    static constexpr int cols = Cols;
    static constexpr bool group_major = GroupMajor;
    static constexpr int sub_tile_cols = 64;
    static constexpr int row_bytes = sub_tile_cols * 2;
    static constexpr int sub_tiles = Cols / sub_tile_cols;
    static constexpr int group_rows = 8;  // the swizzle's period: 8 rows of 128 bytes
    static constexpr int bytes = sub_tiles * Rows * row_bytes;
    static_assert(Cols % sub_tile_cols == 0, "whole 64-column sub-tiles");
    static_assert(Rows % group_rows == 0, "whole 8-row swizzle periods (1024 bytes)");
    // From row r of sub-tile t to the same row of sub-tile t + 1, and from an 8-row group
    // of a sub-tile to its next group.
    static constexpr int sub_tile_stride = GroupMajor ? group_rows * row_bytes : Rows * row_bytes;
    static constexpr int group_stride =
        GroupMajor ? sub_tiles * group_rows * row_bytes : group_rows * row_bytes;

    // Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in sub-tile `sub_tile`.
    __device__ static constexpr int chunk_offset(int sub_tile, int row, int chunk) {
        const int row_offset =
            GroupMajor ? (row / group_rows) * group_stride + (row % group_rows) * row_bytes
                       : row * row_bytes;
        return sub_tile * sub_tile_stride + row_offset + ((chunk ^ (row % 8)) * 16);
    }
    // The same with `chunk` counted across the whole row (0 .. Cols / 8), as SmemTile's.
    __device__ static constexpr int chunk_offset(int row, int chunk) {
        return chunk_offset(chunk / 8, row, chunk % 8);
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
    // (16 columns). 8-row core-matrix groups are group_stride bytes apart; the leading
    // offset is unused with swizzling. The k-step starts 32 bytes further into each
    // 128-byte row: the hardware applies the swizzle to the full address, so the shifted
    // start stays consistent with TMA's layout.
    __device__ static std::uint64_t k_major(std::uint32_t base, int kk) {
        return advanced(smem_descriptor_128b(base, 16, group_stride),
                        (kk / 4) * sub_tile_stride + (kk % 4) * 32);
    }

    // As an MN-major wgmma operand (rows of n contiguous: V as the B of P·V), rows
    // [16 kk, 16 kk + 16) and every column: 8 k-rows of 128 bytes form a 1024-byte group;
    // the next 64 columns of n are a sub-tile further on (the leading offset).
    __device__ static std::uint64_t mn_major(std::uint32_t base, int kk) {
        return advanced(smem_descriptor_128b(base, sub_tile_stride, group_stride),
                        kk * (2 * group_stride));
    }
};

}  // namespace flash_attention
