"""How evenly the sm90 kernels' causal tile order spreads work over the SMs: a model, no GPU.

CTAs take tiles in number order (plain CTAs as the hardware hands them out, or the dynamic
schedule's counter) and each SM runs one tile at a time, so an SM that frees up takes the next
number. A causal tile of query block q (of n) costs q + 1 units; every unit takes the same time.
The model reports the mean work per SM over the time the last SM finishes: 1.0 is a perfect
spread. It ignores L2 (which the section size bounds) and per-tile fixed costs.

Orders, as tile_scheduler.cuh numbers them: head after head (each head's longest tile first,
the order before sections), and sections of S heads whose query blocks are taken in turn
(KernelArgs::section_heads). The grid: 16k tokens, hidden 2048, as bench/compare.py.

    python3 bench/tile_order.py                 # the grid, head after head against sections
    python3 bench/tile_order.py --sections 3    # one section size everywhere
    python3 bench/tile_order.py --backward      # the backward's key-block CTAs (below)

The backward (key_block_scheduler.hpp) runs a CTA a key block of a (K/V head, sequence) pair; a
causal key block's walk costs the group's heads times the query blocks that see it, plus one for
the CTA's fixed work. Its sections hold at most two waves of CTAs: before balancing, sections of
exactly two waves and a smaller last one, whose longest walks start only as the section before
ends; balanced, as many sections as that takes, their sizes within one. The model gives the
measured -11% of one pair a section against two waves (32/8 heads at 8k, H200, 2026-12-02).
Non-causal CTAs all cost the same, and the grid's last wave is what is left of them. The last two
columns count a walk's cost outside its steps (--fixed, in steps) against the steps: in waves as
launched, and with stream-K's last round cut into one range of steps an SM, each piece paying the
fixed cost again and a partial piece its fp32 dK and dV (--partial); design.md §12 has the plan.
"""

import argparse
import heapq


def spread(heads: int, q_blocks: int, section: int, sms: int) -> float:
    """Mean work per SM over the finishing time of the last SM."""
    costs = []
    for first in range(0, heads, section):
        in_section = min(section, heads - first)
        for rank in range(q_blocks):  # longest first
            costs += [q_blocks - rank] * in_section
    return spread_of(costs, sms)


def backward_spread(pairs: int, group: int, seq: int, B_r: int, B_c: int, sms: int, balanced: bool) -> float:
    """The backward's causal grid: sections of at most two waves of key-block CTAs."""
    key_blocks, q_blocks = -(-seq // B_c), -(-seq // B_r)
    two_waves = max(1, -(-2 * sms // key_blocks))
    if balanced:
        count = -(-pairs // two_waves)
        sizes = [pairs // count + 1] * (pairs % count) + [pairs // count] * (count - pairs % count)
    else:
        sizes = [min(two_waves, pairs - first) for first in range(0, pairs, two_waves)]
    costs = []
    for size in sizes:
        for key_block in range(key_blocks):  # longest walks first
            costs += [group * (q_blocks - key_block * B_c // B_r) + 1] * size
    return spread_of(costs, sms)


def backward_noncausal_spread(pairs: int, seq: int, B_c: int, sms: int) -> float:
    """The backward's non-causal grid: key-block CTAs of one length, in waves."""
    return spread_of([1] * (pairs * -(-seq // B_c)), sms)


def backward_streamk_spread(pairs: int, seq: int, B_r: int, B_c: int, sms: int, fixed: float,
                            partial: float) -> float:
    """The non-causal grid with stream-K's last round (design.md §12): a key block's walk is W
    steps plus `fixed` (its K and V, the pipeline's ramp, the last dQ), in steps; the last,
    part-filled round's key blocks (or, where it holds under a third of the SMs, the last
    sms + T mod sms) are cut into `sms` equal ranges of steps, each piece paying `fixed` and, where
    it does not hold a whole walk, `partial` more (dK and dV in fp32 to a slot, or read back).
    Useful work is the steps alone, so the spread counts what the fixed costs take too."""
    walk = -(-seq // B_r)
    tiles = pairs * -(-seq // B_c)
    tail = tiles % sms
    if tail == 0 or tiles < 2 * sms:
        return backward_noncausal_spread(pairs, seq, B_c, sms) * walk / (walk + fixed)
    if 3 * tail < sms:
        tail += sms
    costs = [walk + fixed] * (tiles - tail)
    units = tail * walk
    for r in range(sms):
        start, end = r * units // sms, (r + 1) * units // sms
        cost, at = 0.0, start
        while at < end:
            piece_end = min(end, (at // walk + 1) * walk)
            whole = at % walk == 0 and piece_end - at == walk
            cost += piece_end - at + fixed + (0 if whole else partial)
            at = piece_end
        costs.append(cost)
    return tiles * walk / sms / finish_of(costs, sms)


def finish_of(costs: list, sms: int) -> float:
    """When the last SM finishes, costs taken in order by the SM that frees first."""
    free = [0] * sms  # when each SM frees up
    finish = 0
    for cost in costs:
        start = heapq.heappop(free)
        finish = max(finish, start + cost)
        heapq.heappush(free, start + cost)
    return finish


def spread_of(costs: list, sms: int) -> float:
    """Mean work per SM over the finishing time of the last SM, costs taken in order."""
    return sum(costs) / sms / finish_of(costs, sms)


def walk_share(seq: int, B_r: int, args) -> float:
    """The part of a non-causal walk's time its steps take (the rest: --fixed)."""
    walk = -(-seq // B_r)
    return walk / (walk + args.fixed)


def default_section(seq: int, d_head: int, B_r: int, l2_bytes: int) -> int:
    """forward.cpp's section_heads() for bf16/fp16 and no GQA."""
    if seq < 8 * B_r:
        return 1
    kv_head_bytes = 2 * seq * d_head * 2
    kv_heads = max(1, l2_bytes // 3 // kv_head_bytes)
    return 1 << (kv_heads.bit_length() - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--l2-mib", type=int, default=50)
    parser.add_argument("--sections", type=int, default=0,
                        help="heads a section everywhere (default: forward.cpp's rule)")
    parser.add_argument("--backward", action="store_true", help="the backward's causal grid and GQA rows")
    parser.add_argument("--fixed", type=float, default=1.0,
                        help="backward: a walk's cost outside its steps, in steps (stream-K's columns)")
    parser.add_argument("--partial", type=float, default=2.0,
                        help="backward: a stream-K piece's partial dK and dV stored or read back, in steps")
    args = parser.parse_args()
    if args.backward:
        # The built-in table's sm90 backward tiles (B_r queries a step, B_c keys a CTA).
        print(f"{'d_head':>6} {'seq':>6} {'pairs':>6}  two-wave sections  balanced  non-causal"
              f"  (with fixed costs: waves  stream-K)")
        rows = [(d, B_r, B_c, seq, (16384 // seq) * (2048 // d), 1)
                for d, B_r, B_c in ((64, 128, 128), (128, 64, 128), (256, 64, 64))
                for seq in (1024, 2048, 4096, 8192, 16384)]
        rows += [(128, 64, 128, seq, 8, 4) for seq in (8192, 32768)]  # 32/8 heads, batch 1
        for d, B_r, B_c, seq, pairs, group in rows:
            label = f"{pairs} ({pairs * group}/{pairs} heads)" if group > 1 else str(pairs)
            print(f"{d:>6} {seq:>6} {label:>6}  {backward_spread(pairs, group, seq, B_r, B_c, args.sms, False):17.3f}"
                  f"  {backward_spread(pairs, group, seq, B_r, B_c, args.sms, True):8.3f}"
                  f"  {backward_noncausal_spread(pairs, seq, B_c, args.sms):10.3f}"
                  + ("" if group > 1 else
                     f"  {backward_noncausal_spread(pairs, seq, B_c, args.sms) * walk_share(seq, B_r, args):24.3f}"
                     f"  {backward_streamk_spread(pairs, seq, B_r, B_c, args.sms, args.fixed, args.partial):8.3f}"))
        return
    # The built-in table's causal tiles: B_r 192 at d_head 64, 128 at d_head 256; d_head 128 takes
    # B_r 128 up to 4k keys and 192 from 8k: both shown.
    print(f"{'d_head':>6} {'B_r':>4} {'seq':>6} {'heads':>6}  head after head  sections")
    for d_head, B_r in ((64, 192), (128, 128), (128, 192), (256, 128)):
        for seq in (512, 1024, 2048, 4096, 8192, 16384):
            heads = (16384 // seq) * (2048 // d_head)
            q_blocks = -(-seq // B_r)
            section = args.sections or default_section(seq, d_head, B_r, args.l2_mib << 20)
            section = min(section, heads)
            print(f"{d_head:>6} {B_r:>4} {seq:>6} {heads:>6}  {spread(heads, q_blocks, 1, args.sms):15.3f}"
                  f"  {spread(heads, q_blocks, section, args.sms):.3f} ({section})")


if __name__ == "__main__":
    main()
