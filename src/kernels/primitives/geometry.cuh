#pragma once

// Thread geometry both families share: warps of 32 lanes, and the warpgroups of 4
// consecutive warps that issue wgmma together (sm90).

namespace flash_attention {

inline constexpr int k_warp_threads = 32;
inline constexpr int k_warpgroup_warps = 4;
inline constexpr int k_warpgroup_threads = k_warp_threads * k_warpgroup_warps;

__device__ __forceinline__ int lane_id() {
    return static_cast<int>(threadIdx.x % k_warp_threads);
}
__device__ __forceinline__ int warp_id() {
    return static_cast<int>(threadIdx.x / k_warp_threads);
}
__device__ __forceinline__ int warpgroup_id() {
    return static_cast<int>(threadIdx.x / k_warpgroup_threads);
}
// This warp's index inside its warpgroup, 0..3.
__device__ __forceinline__ int warp_in_warpgroup() {
    return static_cast<int>(threadIdx.x % k_warpgroup_threads) / k_warp_threads;
}
// This thread's index inside its warpgroup, 0..127.
__device__ __forceinline__ int thread_in_warpgroup() {
    return static_cast<int>(threadIdx.x % k_warpgroup_threads);
}

}  // namespace flash_attention
