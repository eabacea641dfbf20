#pragma once

// Compile-time expansion of an sm90 KernelConfig: warpgroup roles, shared-memory layout
// of the Q tile and the K/V pipeline stages, barrier ids and register budgets.

#include <cstdint>

#include "config/config_space.hpp"
#include "flash_attention/kernel_config.hpp"
#include "kernels/config_code.hpp"
#include "kernels/primitives/element.cuh"
#include "kernels/primitives/ptx.cuh"
#include "kernels/primitives/sm90/tma.cuh"
#include "kernels/primitives/smem_tile.cuh"

namespace flash_attention::sm90 {

template <KernelConfig C>
struct Traits {
    static_assert(unpack(pack(C)) == C, "every field fits the packed kernel parameter");
    static_assert(C.family == Family::sm90, "an sm90 config");
    using T = typename Element<C.dtype>::type;
    static constexpr KernelConfig config = C;
    static constexpr DType dtype = C.dtype;
    static constexpr int d_head = C.d_head;
    static constexpr int B_r = C.B_r;
    static constexpr int B_c = C.B_c;
    static constexpr int stages = C.stages;
    static constexpr int threads = C.n_threads();
    static constexpr bool q_in_registers = C.q_in_registers;
    static constexpr bool overlap = C.intra_warpgroup_overlap;
    static constexpr bool pingpong = C.pingpong;

    // Warpgroup 0 produces (one thread issues every TMA copy); warpgroups 1..consumers
    // each compute 64 query rows.
    static constexpr int consumers = C.consumer_warpgroups();
    static constexpr int rows_per_consumer = 64;
    // setmaxnreg: the producer needs few registers; what it gives up lets each consumer
    // hold O, S and P (64K registers per SM, 128 threads per warpgroup).
    static constexpr int producer_registers = 24;
    static constexpr int consumer_registers = C.consumer_registers();
    static_assert(producer_registers + consumers * consumer_registers <= 65536 / 128,
                  "the register file holds every warpgroup's budget");

    // Tiles in TMA's 128-byte-swizzled layout: a consumer's 64 rows of Q (reused for its
    // O), a K or V stage of B_c rows.
    using QTile = Swizzled128Tile<rows_per_consumer, d_head>;
    using KVTile = Swizzled128Tile<B_c, d_head>;
    static constexpr int column_blocks = QTile::sub_tiles;
    static constexpr int kv_tile_bytes = KVTile::bytes;
    static constexpr int q_buffers = C.q_buffers();
    static constexpr int q_buffer_bytes = consumers * QTile::bytes;

    // Named barriers (0 is __syncthreads): a GEMM turn per consumer for ping-pong, then
    // an epilogue barrier per consumer.
    static constexpr int turn_barrier(int consumer) { return 1 + consumer; }
    static constexpr int epilogue_barrier(int consumer) { return 1 + consumers + consumer; }
    static_assert(epilogue_barrier(consumers - 1) < 16, "16 named barriers per CTA");

    static_assert(B_r == consumers * rows_per_consumer, "64 query rows per consumer");
    static_assert(space::is_wgmma_n(B_c), "a wgmma N this library instantiates");
};

// The pipeline's mbarriers: a full/empty pair per Q buffer (one use per tile) and per
// stage for K and for V. "full": the producer's TMA copies landed; "empty": every consumer
// is done with the buffer (for Q: its O, staged there, has been stored).
template <int QBuffers, int Stages>
struct Barriers {
    tma::Barrier q_full[QBuffers], q_empty[QBuffers];
    tma::Barrier k_full[Stages], k_empty[Stages];
    tma::Barrier v_full[Stages], v_empty[Stages];
};

// The CTA's shared memory from a 1024-byte-aligned base (the swizzle's period): Q buffers
// (one region per consumer in each, reused for its O), K stages, V stages, then the
// barriers. The one place that knows where each tile lives.
template <class Tr>
struct SharedStorage {
    static constexpr int q_offset = 0;
    static constexpr int k_offset = q_offset + Tr::q_buffers * Tr::q_buffer_bytes;
    static constexpr int v_offset = k_offset + Tr::stages * Tr::kv_tile_bytes;
    static constexpr int barrier_offset = v_offset + Tr::stages * Tr::kv_tile_bytes;
    using BarrierSet = Barriers<Tr::q_buffers, Tr::stages>;
    // The alignment pad in front, and the layout.
    static constexpr int bytes = 1024 + barrier_offset + static_cast<int>(sizeof(BarrierSet));
    static_assert(bytes == static_cast<int>(Tr::config.smem_bytes()),
                  "KernelConfig::smem_bytes() matches the layout");
    static_assert(sizeof(tma::Barrier) == 8, "an mbarrier is 8 bytes");

    unsigned char* base;
    // base in the shared state space, for wgmma descriptors and ldmatrix: computed once,
    // so that no main loop converts a generic pointer again.
    std::uint32_t address;

    // Dynamic shared memory is only guaranteed 16-byte alignment; TMA's swizzle and wgmma
    // need the tiles on the 1024-byte period.
    __device__ __forceinline__ explicit SharedStorage(unsigned char* raw)
        : base(raw + ((1024 - ptx::smem_address(raw) % 1024) % 1024)),
          address(ptx::smem_address(base)) {}

    __device__ __forceinline__ unsigned char* q(int buffer, int consumer) const {
        return base + q_offset + buffer * Tr::q_buffer_bytes + consumer * Tr::QTile::bytes;
    }
    __device__ __forceinline__ unsigned char* k(int stage) const {
        return base + k_offset + stage * Tr::kv_tile_bytes;
    }
    __device__ __forceinline__ unsigned char* v(int stage) const {
        return base + v_offset + stage * Tr::kv_tile_bytes;
    }
    __device__ __forceinline__ std::uint32_t q_address(int buffer, int consumer) const {
        return address + q_offset + buffer * Tr::q_buffer_bytes + consumer * Tr::QTile::bytes;
    }
    __device__ __forceinline__ std::uint32_t k_address(int stage) const {
        return address + k_offset + stage * Tr::kv_tile_bytes;
    }
    __device__ __forceinline__ std::uint32_t v_address(int stage) const {
        return address + v_offset + stage * Tr::kv_tile_bytes;
    }
    __device__ __forceinline__ BarrierSet& barriers() const {
        return *reinterpret_cast<BarrierSet*>(base + barrier_offset);
    }
};

}  // namespace flash_attention::sm90
