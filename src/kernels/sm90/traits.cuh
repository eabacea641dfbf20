#pragma once

// Compile-time expansion of an sm90 KernelConfig: warpgroup roles, shared-memory layout
// of the Q tile and the K/V pipeline stages, barrier ids and register budgets.

#include <cstdint>

#include "config/config_space.hpp"
#include "flash_attention/kernel_config.hpp"
#include "kernels/config_code.hpp"
#include "kernels/primitives/element.cuh"
#include "kernels/primitives/sm90/tma.cuh"

namespace flash_attention::sm90 {

template <KernelConfig C>
struct Traits {
    static_assert(unpack(pack(C)) == C, "every field fits the packed kernel parameter");
    static_assert(C.family == Family::sm90, "an sm90 config");
    using T = typename Element<C.dtype>::type;
    static constexpr DType dtype = C.dtype;
    static constexpr int d_head = C.d_head;
    static constexpr int B_r = C.B_r;
    static constexpr int B_c = C.B_c;
    static constexpr int stages = C.stages;
    static constexpr int threads = C.n_threads();
    static constexpr bool q_in_registers = C.q_in_registers;

    // Warpgroup 0 produces (one thread issues every TMA copy); warpgroups 1..consumers
    // each compute 64 query rows.
    static constexpr int consumers = C.consumer_warpgroups();
    static constexpr int warpgroup_threads = 128;
    static constexpr int rows_per_consumer = 64;
    // setmaxnreg: the producer needs few registers; what it gives up lets each consumer
    // hold O, S and P (64K registers per SM, 128 threads per warpgroup).
    static constexpr int producer_registers = 24;
    static constexpr int consumer_registers = C.consumer_registers();
    static_assert(producer_registers + consumers * consumer_registers <= 65536 / 128,
                  "the register file holds every warpgroup's budget");

    // 128-byte-swizzled sub-tiles of 64 columns: [d_head / 64][rows][64].
    static constexpr int column_blocks = d_head / 64;
    static constexpr int bytes_per_row = 64 * 2;
    static constexpr int q_sub_tile_bytes = rows_per_consumer * bytes_per_row;
    static constexpr int q_consumer_bytes = column_blocks * q_sub_tile_bytes;  // also O's
    static constexpr int kv_sub_tile_bytes = B_c * bytes_per_row;
    static constexpr int kv_tile_bytes = column_blocks * kv_sub_tile_bytes;

    // Layout from a 1024-byte-aligned base (the swizzle's period): Q buffers (one region
    // per consumer in each, reused for its O), K stages, V stages, then the barriers.
    static constexpr int q_buffers = C.q_buffers();
    static constexpr int q_offset = 0;
    static constexpr int q_buffer_bytes = consumers * q_consumer_bytes;
    static constexpr int k_offset = q_offset + q_buffers * q_buffer_bytes;
    static constexpr int v_offset = k_offset + stages * kv_tile_bytes;
    static constexpr int barrier_offset = v_offset + stages * kv_tile_bytes;
    static constexpr int smem_bytes = 1024 + barrier_offset + 8 * (2 * q_buffers + 4 * stages);
    static_assert(smem_bytes == static_cast<int>(C.smem_bytes()),
                  "KernelConfig::smem_bytes() matches the layout");
    static_assert(sizeof(tma::Barrier) == 8, "an mbarrier is 8 bytes");

    // Named barriers (0 is __syncthreads): GEMM turns for ping-pong, one per consumer,
    // then one per consumer for its epilogue.
    static constexpr int turn_barrier_base = 1;
    static constexpr int epilogue_barrier_base = turn_barrier_base + consumers;
    static_assert(epilogue_barrier_base + consumers <= 16, "16 named barriers per CTA");

    static_assert(d_head % 64 == 0 && space::is_wgmma_n(B_c), "wgmma shapes instantiated");
    static_assert(B_r == consumers * rows_per_consumer, "64 query rows per consumer");
};

// The pipeline's mbarriers: a full/empty pair per Q buffer (one use per tile) and per
// stage for K and for V. "full": the producer's TMA copies landed; "empty": every consumer is done
// with the buffer (for Q: its O, staged there, has been stored).
template <int QBuffers, int Stages>
struct Barriers {
    tma::Barrier q_full[QBuffers], q_empty[QBuffers];
    tma::Barrier k_full[Stages], k_empty[Stages];
    tma::Barrier v_full[Stages], v_empty[Stages];
};

}  // namespace flash_attention::sm90
