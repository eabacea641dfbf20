#pragma once

// Which tiles a CTA computes, and in which order. Tiles are numbered in sections of heads
// whose K/V fits in L2 (KernelArgs::section_heads), so the CTAs running at one time share
// it; within a section the query block is slowest, so with causal masking every head's
// longest tiles come first and the last to start are the shortest of the section.
//
// Static schedule: CTA c takes tiles c, c + gridDim.x, ... A persistent grid (one CTA per
// SM) then gives each CTA a fixed share, and causal tiles differ in length: with 128
// query blocks per head and 132 CTAs, CTA c walks the blocks in steps of 132 mod 128 = 4,
// and CTA 0 gets about 1.6 times the mean work (issue 13), so the grid waits on it.
//
// Dynamic schedule: CTA c starts with tile c, and whenever its producer starts loading a
// tile it takes the next one from a global counter (atomicAdd), so a CTA that drew short
// tiles simply takes more: the list is walked greedily, longest first within a head, and
// the last tiles of the list are the shortest. The producer publishes each tile's index
// beside the Q buffer it loads into, and the consumers read it there once that buffer's
// q_full barrier completes (mbarrier arrive releases, the wait acquires), then arrive on
// the slot's own barrier, which the producer waits on before it writes the slot again; an
// index past the last tile, published the same way, tells them to stop.
//
// Stream-K (Traits::stream_k, dense non-causal problems): the static stride for the whole
// rounds of the grid, then the last, part-filled round's tiles split along their keys: their
// key blocks, tile after tile, are dealt out to the CTAs as equal contiguous ranges, so every
// CTA ends together instead of a part of them idling through a whole tile. A range is
// shorter than a tile, so it holds at most two pieces: the end of one tile and the start of
// the next. A piece that does not end its tile leaves its O and LSE as a partial result in
// its CTA's slot (StreamKSplit) and runs first; the piece that ends a tile runs last and
// merges the partials of the lower-numbered CTAs that hold the tile's earlier pieces, each
// stored before its CTA's own merge: a CTA waits only on lower-numbered ones, which the
// hardware dispatches first, so the waits cannot cycle.

#include "kernels/kernel_args.hpp"
#include "kernels/primitives/geometry.cuh"
#include "kernels/primitives/masking.cuh"
#include "kernels/primitives/sequences.cuh"
#include "kernels/primitives/sm90/tma.cuh"
#include "kernels/sm90/tensor_maps.hpp"
#include "kernels/tile_order.hpp"

namespace flash_attention::sm90 {

// A tile's share of a stream-K piece (above): all of it, a part whose O is left as a partial
// result, or the part that ends it and merges the others' partials.
enum class Part : int { whole, partial, merging };

// One tile of work: B_r query rows of one (sequence, head) and the K/V blocks they see.
// pack_gqa (Traits::pack_gqa): B_r rows of one (sequence, K/V head), each a (query position,
// query head) pair of the heads it serves (KernelArgs::pack_shift); rows count such pairs.
struct Tile {
    int sequence;  // b: the batch entry, or a packed batch's sequence
    int head;      // the query head (pack_gqa: the group's first)
    int kv_head;
    Span q, k;     // the sequence's queries (and O's rows) and its keys in their views
    int q_rows;    // the sequence's query rows: q.len, pack_gqa: q.len times the group's heads
    int q_row0;    // first query row of the tile, in the sequence
    int rows;      // query rows of the tile in the sequence; 0: nothing to do (see below)
    int first;     // the first K/V block it streams: a sliding window's start, else 0
    int visited;   // K/V blocks the tile streams from `first` (fully masked ones are skipped)
    int unmasked;  // blocks before this one need no mask (per consumer: its own rows)
    // Keys of the last visited block that belong to the sequence, when rows of the view
    // follow them (the next sequence, a cache's unused rows, a page's stale rows): those V rows are
    // read but may hold anything, NaN included, and P·V would spread 0 · NaN over the row, so they
    // are zeroed in shared memory first. B_c when the block ends the view (TMA fills zeros there)
    // or lies wholly inside the sequence.
    int last_block_keys;
    Part part;  // stream-K: which piece of the tile (blocks [first, first + visited))

    __device__ __forceinline__ bool empty() const { return rows <= 0; }
};

// A dense problem's tile: its head of the batch (sequence * heads + head) and its query
// block's rank in the head, the longest first with causal masking. Tile numbers run over
// sections of args.section_heads heads of the batch (section_position, tile_order.hpp): with
// sections of one head the query block is fastest.
struct DensePosition {
    int head_of_batch, rank;
};
__device__ __forceinline__ DensePosition dense_position(const KernelArgs& args, int index,
                                                        int q_blocks) {
    if (args.section_heads == 1)  // one division a tile, as before sections (non-causal, short)
        return {index / q_blocks, index % q_blocks};
    const SectionPosition at =
        section_position(index, q_blocks, args.section_heads, args.batch * args.heads);
    return {at.unit, at.rank};
}
// The same through the launch's divisors (args.tile_divisors), for forward()'s dense tiles.
__device__ __forceinline__ DensePosition dense_position_fast(const KernelArgs& args, int index) {
    const TileDivisors& d = args.tile_divisors;
    if (d.section_heads.divisor == 1) {
        const int head_of_batch = d.q_blocks.quotient(index);
        return {head_of_batch, index - head_of_batch * d.q_blocks.divisor};
    }
    const int section = d.section_tiles.quotient(index);
    const int first = section * d.section_heads.divisor;
    const int in_section = index - section * d.section_tiles.divisor;
    // The last section may hold fewer heads: a division of its own.
    const int heads = min(d.section_heads.divisor, args.batch * args.heads - first);
    const int rank = heads == d.section_heads.divisor ? d.section_heads.quotient(in_section)
                                                      : in_section / heads;
    return {first + in_section - rank * heads, rank};
}

// The launch's divisors for tiles of B_r query rows (launch.cuh).
inline TileDivisors tile_divisors(const KernelArgs& args, int B_r) {
    const int q_blocks = blocks_covering(args.seq_q, B_r);
    return {FastDivisor(q_blocks), FastDivisor(args.section_heads),
            FastDivisor(args.section_heads * q_blocks), FastDivisor(args.heads),
            FastDivisor(args.heads / args.heads_kv)};
}

// The query position of a sequence's row `row`: the row itself, or in pack_gqa tiles the
// position of its (position, head) pair (KernelArgs::pack_shift).
template <class Tr>
__device__ __forceinline__ int row_position(const KernelArgs& args, int row) {
    if constexpr (Tr::pack_gqa)
        return row >> args.pack_shift;
    else
        return row;
}

// The key blocks that rows [row0, row0 + rows) of a sequence visit: key_blocks() over the
// positions they hold, `diagonal` the causal diagonal's query length (diagonal_queries()).
template <class Tr>
__device__ __forceinline__ KeyBlocks row_key_blocks(const KernelArgs& args, int diagonal, int seq_k,
                                                    int row0, int rows) {
    if constexpr (!Tr::pack_gqa)
        return key_blocks(diagonal, seq_k, args.causal, row0, rows, Tr::B_c);
    const int first = row_position<Tr>(args, row0);
    const int last = row_position<Tr>(args, row0 + rows - 1);
    return key_blocks(diagonal, seq_k, args.causal, first, last - first + 1, Tr::B_c);
}

// Packed queries (cu_seqlens_q): tiles are numbered with the query block fastest, then the
// head, then the sequence, so the CTAs running at one time share the K/V of a few heads in
// L2, each head's longest tiles first with causal masking. Sequence b's
// numbers start at heads * first_packed_tile(b), and each of its heads has
// first_packed_tile(b + 1) - first_packed_tile(b) numbers, at least its
// ceil(len_b / B_r) tiles (floor((x + L) / B) - floor(x / B) + 1 >= ceil(L / B)): the
// numbering needs no prefix sum over the batch, and the few numbers past a head's tiles
// are empty tiles the scheduler skips.
// With pack_gqa a sequence's rows are its queries times the group's heads (the same bound
// holds for x and L so scaled); the launcher checks that they fit an int.
template <bool Packed = false>
__device__ __forceinline__ int first_packed_tile(const KernelArgs& args, int b, int B_r) {
    const int offset = clamp_to(__ldg(args.seqs.cu_seqlens_q + b), 0, args.seqs.q_view_seq);
    return (Packed ? offset << args.pack_shift : offset) / B_r + b;
}

// Rows of one TMA copy of a paged K/V block (a run: one box of all its columns, group-major
// tiles): runs never cross a page and tile the block, so they divide both the page size and
// B_c (multiples of 16: runs start on the swizzle's 8-row phase); of those, 32 rows where 32
// divides both, else 16. Measured at d_head 128 (chunked prefill, H200, docs/PERF.md
// 2026-11-26): 64-row pages ran 1-2% slower in 64-row boxes than in 32-row ones, and
// 16-row boxes 2-4% slower still; 256-row pages the same in 128- and 32-row boxes.
__host__ __device__ constexpr int paged_copy_rows(int page_size, int B_c) {
    int a = page_size, b = B_c;
    while (b != 0) {
        const int r = a % b;
        a = b;
        b = r;
    }
    return a % 32 == 0 ? 32 : 16;
}

// How many tile numbers there are (the grid of a non-persistent launch; the host checks
// that it fits an int). Packed: pack_gqa tiles, a head's rows per K/V head.
__host__ __device__ inline std::int64_t tile_numbers(const KernelArgs& args, int B_r,
                                                     bool packed = false) {
    const int shift = packed ? args.pack_shift : 0;  // the launcher bounds seq << shift
    const std::int64_t heads = packed ? args.heads_kv : args.heads;
    if (args.seqs.cu_seqlens_q != nullptr)
        return ((std::int64_t{args.seqs.q_view_seq} << shift) / B_r + args.batch) * heads;
    return std::int64_t{blocks_covering(args.seq_q << shift, B_r)} * heads * args.batch;
}

template <class Tr>
__device__ __forceinline__ int tile_count(const KernelArgs& args) {
    return static_cast<int>(tile_numbers(args, Tr::B_r, Tr::pack_gqa));
}

// The tile numbered `index`. PerSequence is a separate instantiation of the kernel's body
// (forward_kernel.cuh): in forward()'s dense problems every field comes from the call's
// parameters, so nothing of the per-sequence machinery is held in registers there.
// Variants (a per-sequence instantiation of its own): the blocks of KernelArgs::band.
template <class Tr, bool PerSequence, bool Variants = false>
__device__ __forceinline__ Tile tile_at(const KernelArgs& args, int index) {
    static_assert(PerSequence || !Variants, "the variant kernels run the per-sequence body");
    static_assert(!Tr::pack_gqa || !Variants, "pack_gqa tiles run the plain per-sequence body");
    if constexpr (!PerSequence) {
        const TileDivisors& d = args.tile_divisors;
        const int q_blocks =
            Tr::fast_tile_decode ? d.q_blocks.divisor : blocks_covering(args.seq_q, Tr::B_r);
        const DensePosition at = Tr::fast_tile_decode ? dense_position_fast(args, index)
                                                      : dense_position(args, index, q_blocks);
        const int q_block = args.causal ? q_blocks - 1 - at.rank : at.rank;
        const int b = Tr::fast_tile_decode ? d.heads.quotient(at.head_of_batch)
                                           : at.head_of_batch / args.heads;
        Tile t;
        t.sequence = b;
        t.head = Tr::fast_tile_decode ? at.head_of_batch - b * args.heads
                                      : at.head_of_batch % args.heads;
        // Grouped-query attention: the K/V head of a group of query heads.
        t.kv_head =
            Tr::fast_tile_decode ? d.group.quotient(t.head) : t.head / (args.heads / args.heads_kv);
        t.q = {b, 0, args.seq_q};
        t.k = {b, 0, args.seq_k};
        t.q_rows = args.seq_q;
        t.q_row0 = q_block * Tr::B_r;
        t.rows = min(Tr::B_r, args.seq_q - t.q_row0);
        const KeyBlocks blocks =
            key_blocks(args.diagonal_seq_q, args.seq_k, args.causal, t.q_row0, t.rows, Tr::B_c);
        t.first = 0;
        t.visited = blocks.visited;
        t.unmasked = blocks.unmasked;
        t.last_block_keys = Tr::B_c;  // rows past seq_k are past the tensor: TMA's zeros
        t.part = Part::whole;
        return t;
    }
    const SequenceArgs& seqs = args.seqs;
    // A tile's unit: a query head, or with pack_gqa a K/V head and the query heads it serves
    // (the launcher numbers their tiles in sections of one unit).
    const int units = Tr::pack_gqa ? args.heads_kv : args.heads;
    const auto rows_of = [&args](int queries) {
        return Tr::pack_gqa ? queries << args.pack_shift : queries;
    };
    int b, local;  // the sequence, and the tile's number among its unit's
    Tile t;
    int& unit = Tr::pack_gqa ? t.kv_head : t.head;
    if (seqs.cu_seqlens_q == nullptr) {
        const DensePosition at =
            dense_position(args, index, blocks_covering(rows_of(args.seq_q), Tr::B_r));
        b = at.head_of_batch / units;
        unit = at.head_of_batch % units;
        local = at.rank;
    } else {
        // The last sequence whose numbers start at or before `index` (binary search; the
        // offsets stay in L1 after the first tiles).
        int lo = 0;
        int hi = args.batch - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (first_packed_tile<Tr::pack_gqa>(args, mid, Tr::B_r) * units <= index)
                lo = mid;
            else
                hi = mid - 1;
        }
        b = lo;
        const int first = first_packed_tile<Tr::pack_gqa>(args, b, Tr::B_r);
        const int per_head = first_packed_tile<Tr::pack_gqa>(args, b + 1, Tr::B_r) - first;
        const int r = index - first * units;
        unit = per_head > 0 ? r / per_head : units;  // non-monotone offsets: empty
        local = per_head > 0 ? r % per_head : 0;
    }
    t.sequence = b;
    if constexpr (Tr::pack_gqa)
        t.head = t.kv_head << args.pack_shift;
    else
        t.kv_head = t.head / (args.heads / args.heads_kv);  // grouped-query attention
    t.q = sequence_span(seqs.cu_seqlens_q, nullptr, 0, b, seqs.q_view_seq);
    t.q_rows = rows_of(t.q.len);
    // Paged: entry b is the sequence's row of the block table.
    const bool paged = seqs.block_table != nullptr;
    t.k = sequence_span(seqs.cu_seqlens_k, seqs.seqused_k, seqs.seqused_k_add, b, seqs.k_view_seq,
                        paged ? seqs.max_pages * seqs.k_view_seq : 0);
    const int q_blocks = blocks_covering(t.q_rows, Tr::B_r);
    const int q_block = args.causal ? q_blocks - 1 - local : local;
    t.q_row0 = q_block * Tr::B_r;
    t.rows = unit < units && local < q_blocks ? min(Tr::B_r, t.q_rows - t.q_row0) : 0;
    t.first = 0;
    if constexpr (Variants) {
        const BandBlocks blocks =
            band_blocks(band_shift(t.q.len, t.k.len, args.top_left), args.band, t.k.len, t.q_row0,
                        max(t.rows, 1), Tr::B_c);
        t.first = t.empty() ? 0 : blocks.first;
        t.visited = t.empty() ? 0 : blocks.end - blocks.first;
        t.unmasked = blocks.unmasked_end;
    } else {
        const KeyBlocks blocks =
            row_key_blocks<Tr>(args, diagonal_queries(t.q.len, t.k.len, args.top_left), t.k.len,
                               t.q_row0, max(t.rows, 1));
        t.visited = t.empty() ? 0 : blocks.visited;
        t.unmasked = blocks.unmasked;
    }
    const int end = t.k.row0 + t.k.len;  // the first row past the sequence's keys
    const int end_block = t.first + t.visited;
    t.last_block_keys = end_block * Tr::B_c > t.k.len && (paged || end < seqs.k_view_seq)
                            ? t.k.len - (end_block - 1) * Tr::B_c
                            : Tr::B_c;
    t.part = Part::whole;
    return t;
}

// The first key block (a unit) of CTA c's range: ranges are [start(c), start(c + 1)).
__device__ __forceinline__ int stream_k_start(const StreamKSplit& split, int c) {
    return c * split.units / static_cast<int>(gridDim.x);
}

// The CTA whose range holds unit u: the last c with start(c) <= u, which is the last with
// c x units < (u + 1) x gridDim.x.
__device__ __forceinline__ int stream_k_owner(const StreamKSplit& split, int u) {
    return ((u + 1) * static_cast<int>(gridDim.x) - 1) / split.units;
}

// The first CTA holding a piece of the tile this CTA's range starts in (its merging piece's).
template <class Tr>
__device__ __forceinline__ int stream_k_first_owner(const KernelArgs& args,
                                                    const StreamKSplit& split) {
    const int n = blocks_covering(args.seq_k, Tr::B_c);
    return stream_k_owner(split, stream_k_start(split, static_cast<int>(blockIdx.x)) / n * n);
}

// This CTA's piece `second` (0 or 1) of the split tiles, as a dense tile of its blocks
// [first, first + visited); an empty tile where the CTA has no such piece. Two pieces: the
// start of the next tile first (a partial), then the end of the tile the range starts in.
template <class Tr>
__device__ __forceinline__ Tile stream_k_piece(const KernelArgs& args, const StreamKSplit& split,
                                               bool second) {
    const int c = static_cast<int>(blockIdx.x);
    const int n = blocks_covering(args.seq_k, Tr::B_c);
    const int s = stream_k_start(split, c);
    const int e = stream_k_start(split, c + 1);
    const int t0 = s / n;
    const int t0_end = (t0 + 1) * n;
    const bool spans = e > t0_end;
    int t = t0, first = s - t0 * n, end = min(e, t0_end) - t0 * n;
    if (spans && !second) {
        t = t0 + 1;
        first = 0;
        end = e - t0_end;
    }
    Tile tile = tile_at<Tr, false>(args, split.whole + t);
    tile.first = first;
    tile.visited = end - first;
    tile.part = end < n ? Part::partial : first > 0 ? Part::merging : Part::whole;
    if (second && !spans)
        tile.rows = 0;
    return tile;
}

// The dynamic schedule's shared state, after the pipeline's barriers: per Q buffer, the
// index of the tile it holds and a barrier on which every consumer thread arrives once it
// has read that index, before the producer may write the next one there. (The Q buffer's
// own q_empty barrier orders the same accesses, through the warpgroup's named barrier
// before its storing thread arrives; compute-sanitizer's racecheck does not follow that
// chain, and a direct arrival per reader costs a few instructions per tile.)
template <int QBuffers>
struct TileSlots {
    tma::Barrier read[QBuffers];
    int index[QBuffers];
};

// The producer's and the consumers' view of the schedule. `slots` (shared memory) and
// `counter` (global: the next tile to claim and the CTAs done claiming; zero at the launch,
// and left zero for the stream's next launch, StreamCounters) are used only when Dynamic;
// `split` only when Split (Traits::stream_k, in the dense kernel), where numbers from
// split.whole on are the CTA's two pieces: whole + blockIdx.x and the one a round later.
template <class Tr, bool Dynamic, bool Split = false>
struct TileScheduler {
    static_assert(sizeof(TileSlots<Tr::q_buffers>) <= 16 * Tr::q_buffers,
                  "the layout reserves 16 bytes per Q buffer");
    static_assert(!(Dynamic && Split), "stream-K splits the static schedule's last round");
    static constexpr bool split_tiles = Split;
    int* counter;
    TileSlots<Tr::q_buffers>* slots;
    const StreamKSplit& split;

    // The loops' bound: the tile numbers, or the split's two pieces a CTA.
    __device__ __forceinline__ int count(const KernelArgs& args) const {
        if (Split && split.partials != nullptr)
            return split.whole + 2 * static_cast<int>(gridDim.x);
        return tile_count<Tr>(args);
    }

    // The tile (or piece) numbered `index`.
    template <bool PerSequence, bool Variants>
    __device__ __forceinline__ Tile tile(const KernelArgs& args, int index) const {
        if (Split && split.partials != nullptr && index >= split.whole)
            return stream_k_piece<Tr>(args, split,
                                      index >= split.whole + static_cast<int>(gridDim.x));
        return tile_at<Tr, PerSequence, Variants>(args, index);
    }

    // Thread 0, before the CTA's first __syncthreads.
    __device__ __forceinline__ void init() const {
        if constexpr (Dynamic) {
            for (int b = 0; b < Tr::q_buffers; ++b)
                slots->read[b].init(Tr::consumers * warpgroup_threads);
        }
    }

    __device__ __forceinline__ int first() const { return static_cast<int>(blockIdx.x); }

    // Producer: claims the tile after the one whose Q it has just issued, so the atomic's
    // round trip hides behind that tile's K/V copies (static: nothing to claim).
    __device__ __forceinline__ int claim() const {
        if constexpr (Dynamic)
            return static_cast<int>(gridDim.x) + atomicAdd(counter, 1);
        else
            return 0;
    }

    // Producer: the tile after `index`.
    __device__ __forceinline__ int next(int index, int claimed) const {
        if constexpr (Dynamic)
            return claimed;
        else
            return index + static_cast<int>(gridDim.x);
    }

    // Producer: records the tile whose Q is about to load into q's buffer, once the
    // consumers have read the index it held before; the Q barrier's arrival that follows
    // makes it visible to them.
    template <class QSlot>
    __device__ __forceinline__ void publish(const QSlot& q, int index) const {
        if constexpr (Dynamic) {
            slots->read[q.buffer].wait(q.parity ^ 1);
            slots->index[q.buffer] = index;
        }
    }

    // Producer, after its last tile: the consumers' next Q buffer carries an index past
    // the last tile, and its barrier completes without a copy. As before any tile, it
    // first waits until the consumers have emptied the buffer (q_empty): reading the
    // previous index (the slot's barrier) is not enough, since a consumer that has read
    // it may not yet have waited on that phase of q_full, and a phase completed twice
    // over looks incomplete to a parity wait, which would then never return.
    // Also counts the CTA done claiming; the launch's last to be done zeroes both counters.
    // The fences order each CTA's claims before its count, and that count before the reset.
    template <class QSlot, class Bars>
    __device__ __forceinline__ void finish(const QSlot& q, Bars& bars, int past_end) const {
        if constexpr (Dynamic) {
            __threadfence();
            if (atomicAdd(counter + 1, 1) == static_cast<int>(gridDim.x) - 1) {
                __threadfence();
                counter[0] = 0;
                counter[1] = 0;
            }
            for (int w0 = 0; w0 < Tr::consumers; w0 += Tr::consumers_per_q_pair)
                bars.q_empty[Tr::q_pair(q.buffer, w0)].wait(q.parity ^ 1);
            publish(q, past_end);
            for (int w0 = 0; w0 < Tr::consumers; w0 += Tr::consumers_per_q_pair)
                bars.q_full[Tr::q_pair(q.buffer, w0)].arrive();
        }
    }

    // Consumer `consumer`: the tile of this iteration. Static: `index` as the stride left it.
    // Dynamic: waits for its Q rows' barrier and reads what the producer published.
    template <class QSlot, class Bars>
    __device__ __forceinline__ int consumer_tile(int index, const QSlot& q, int consumer,
                                                 Bars& bars) const {
        if constexpr (Dynamic) {
            bars.q_full[Tr::q_pair(q.buffer, consumer)].wait(q.parity);
            const int published = slots->index[q.buffer];
            slots->read[q.buffer].arrive();
            return published;
        } else {
            return index;
        }
    }
};

}  // namespace flash_attention::sm90
