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
Non-causal CTAs all cost the same, and the grid's last wave is what is left of them.
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


def spread_of(costs: list, sms: int) -> float:
    """Mean work per SM over the finishing time of the last SM, costs taken in order."""
    free = [0] * sms  # when each SM frees up
    finish = 0
    for cost in costs:
        start = heapq.heappop(free)
        finish = max(finish, start + cost)
        heapq.heappush(free, start + cost)
    return sum(costs) / sms / finish


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
    args = parser.parse_args()
    if args.backward:
        # The built-in table's sm90 backward tiles (B_r queries a step, B_c keys a CTA).
        print(f"{'d_head':>6} {'seq':>6} {'pairs':>6}  two-wave sections  balanced  non-causal")
        rows = [(d, B_r, B_c, seq, (16384 // seq) * (2048 // d), 1)
                for d, B_r, B_c in ((64, 128, 128), (128, 64, 128), (256, 64, 64))
                for seq in (1024, 2048, 4096, 8192, 16384)]
        rows += [(128, 64, 128, seq, 8, 4) for seq in (8192, 32768)]  # 32/8 heads, batch 1
        for d, B_r, B_c, seq, pairs, group in rows:
            label = f"{pairs} ({pairs * group}/{pairs} heads)" if group > 1 else str(pairs)
            print(f"{d:>6} {seq:>6} {label:>6}  {backward_spread(pairs, group, seq, B_r, B_c, args.sms, False):17.3f}"
                  f"  {backward_spread(pairs, group, seq, B_r, B_c, args.sms, True):8.3f}"
                  f"  {backward_noncausal_spread(pairs, seq, B_c, args.sms):10.3f}")
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
