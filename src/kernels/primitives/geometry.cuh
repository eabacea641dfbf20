#pragma once

// Thread geometry of the tensor-core instructions, named once: a warp of 32 lanes, an
// sm90 warpgroup of 4 consecutive warps (the unit that issues a wgmma), and the 16 rows
// of an m16 accumulator tile (one warp's share of a wgmma's 64 rows). In an m16n8
// accumulator a quad of 4 lanes shares a row: lane / 4 is the row, lane % 4 the column pair.

namespace flash_attention {

inline constexpr int warp_size = 32;
inline constexpr int warps_per_warpgroup = 4;
inline constexpr int warpgroup_threads = warps_per_warpgroup * warp_size;
inline constexpr int mma_m = 16;  // rows of one m16 accumulator tile

// The lane: sm80's fragment loaders call lane_id(), the other kernel code writes
// threadIdx.x % warp_size. The two are equal, but ptxas (CUDA 13.0) schedules the main
// loops differently for them, and each site keeps the form of the measured build: the
// release kernels' SASS stays identical to it (docs/PERF.md, issue 12).
__device__ __forceinline__ int lane_id() {
    return threadIdx.x % warp_size;
}

// This thread's warp within its warpgroup (0..3).
__device__ __forceinline__ int warp_in_warpgroup() {
    return static_cast<int>(threadIdx.x % warpgroup_threads) / warp_size;
}

}  // namespace flash_attention
