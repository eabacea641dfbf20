#pragma once

// Which tiles a CTA computes, and in which order. A tile is B_r query rows of one
// (batch, head) and the K/V blocks they see. Tiles are numbered in one dimension with the
// query block fastest, so the CTAs running at one time share the K/V of a few heads in
// L2; with causal masking each head's longest tiles come first.

#include <cstdint>

#include "kernels/kernel_args.hpp"
#include "kernels/primitives/masking.cuh"

namespace flash_attention::sm90 {

struct Tile {
    int batch, head, kv_head;
    int q_row0;    // first query row of the tile
    int visited;   // K/V blocks the tile streams (fully masked ones are skipped)
    int unmasked;  // blocks before this one need no mask (per consumer: its own rows)
};

// Static round-robin: CTA c takes tiles c, c + gridDim.x, c + 2 gridDim.x, ... (one tile
// per CTA when the grid has one CTA per tile, several when it is persistent).
template <int B_r, int B_c>
struct StaticTileScheduler {
    // The tiles of a problem, for the launcher's grid. The kernel numbers tiles with
    // ints; the launcher checks that they fit.
    __host__ __device__ static constexpr std::int64_t tiles(int seq_q, int heads, int batch) {
        return std::int64_t{blocks_covering(seq_q, B_r)} * heads * batch;
    }

    const KernelArgs& args;
    int index;

    __device__ __forceinline__ explicit StaticTileScheduler(const KernelArgs& a)
        : args(a), index(static_cast<int>(blockIdx.x)) {}

    __device__ __forceinline__ bool valid() const {
        return index < blocks_covering(args.seq_q, B_r) * args.heads * args.batch;
    }
    __device__ __forceinline__ void advance() { index += static_cast<int>(gridDim.x); }

    __device__ __forceinline__ Tile tile() const {
        const int q_blocks = blocks_covering(args.seq_q, B_r);
        const int head_of_batch = index / q_blocks;
        const int q_block = args.causal ? q_blocks - 1 - index % q_blocks : index % q_blocks;
        Tile t;
        t.batch = head_of_batch / args.heads;
        t.head = head_of_batch % args.heads;
        t.kv_head = t.head / (args.heads / args.heads_kv);  // grouped-query attention
        t.q_row0 = q_block * B_r;
        const KeyBlocks blocks = key_blocks(args.seq_q, args.seq_k, args.causal, t.q_row0,
                                            min(B_r, args.seq_q - t.q_row0), B_c);
        t.visited = blocks.visited;
        t.unmasked = blocks.unmasked;
        return t;
    }
};

}  // namespace flash_attention::sm90
