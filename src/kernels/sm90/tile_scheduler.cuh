#pragma once

// Which tiles a CTA computes, and in which order: a static round-robin over tiles numbered
// with the query block fastest (CTA c takes c, c + gridDim.x, ...). Issue 13 adds a
// dynamic scheduler beside it.

#include "kernels/kernel_args.hpp"
#include "kernels/primitives/masking.cuh"

namespace flash_attention::sm90 {

// One tile of work: B_r query rows of one (batch, head) and the K/V blocks they see.
// Tiles are numbered with the query block fastest, so the CTAs running at one time share
// the K/V of a few heads in L2; with causal masking each head's longest tiles come first.
struct Tile {
    int batch, head, kv_head;
    int q_row0;    // first query row of the tile
    int visited;   // K/V blocks the tile streams (fully masked ones are skipped)
    int unmasked;  // blocks before this one need no mask (per consumer: its own rows)
};

template <class Tr>
__device__ __forceinline__ int tile_count(const KernelArgs& args) {
    // At most INT_MAX: the launcher checks the product.
    return blocks_covering(args.seq_q, Tr::B_r) * args.heads * args.batch;
}

template <class Tr>
__device__ __forceinline__ Tile tile_at(const KernelArgs& args, int index) {
    const int q_blocks = blocks_covering(args.seq_q, Tr::B_r);
    const int head_of_batch = index / q_blocks;
    const int q_block = args.causal ? q_blocks - 1 - index % q_blocks : index % q_blocks;
    Tile t;
    t.batch = head_of_batch / args.heads;
    t.head = head_of_batch % args.heads;
    t.kv_head = t.head / (args.heads / args.heads_kv);  // grouped-query attention
    t.q_row0 = q_block * Tr::B_r;
    const KeyBlocks blocks = key_blocks(args.seq_q, args.seq_k, args.causal, t.q_row0,
                                        min(Tr::B_r, args.seq_q - t.q_row0), Tr::B_c);
    t.visited = blocks.visited;
    t.unmasked = blocks.unmasked;
    return t;
}

}  // namespace flash_attention::sm90
