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
    args = parser.parse_args()
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
