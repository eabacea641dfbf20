"""Two bench/compare.py tables of the same grid, before and after a change (pairs of
BEFORE.md AFTER.md): per shape, our TFLOP/s after over before, and our ratio to cuDNN in
each run (cuDNN measured in the same process normalises the power-capped clock).

    python3 scripts/compare_tables.py before.md after.md [before_causal.md after_causal.md]
"""

import statistics
import sys
from pathlib import Path


def rows(path):
    """(dtype, d_head, seq) -> (ours, cuDNN) TFLOP/s."""
    table = {}
    for line in Path(path).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[1].isdigit():
            value = lambda c: None if c == "n/a" else float(c)
            table[(cells[0], int(cells[1]), int(cells[2]))] = (value(cells[3]), value(cells[5]))
    return table


def main(paths):
    print(f"{'shape':<28} {'before':>7} {'after':>7} {'after/before':>12} {'vs cuDNN before':>16} {'after':>6}")
    changes = []
    for before_path, after_path in zip(paths[::2], paths[1::2]):
        causal = "causal" in after_path
        before, after = rows(before_path), rows(after_path)
        for key in sorted(before.keys() & after.keys()):
            (ob, cb), (oa, ca) = before[key], after[key]
            if None in (ob, oa, cb, ca):
                continue
            shape = f"{key[0]} d{key[1]} {key[2]}{' causal' if causal else ''}"
            changes.append(oa / ob)
            print(f"{shape:<28} {ob:7.1f} {oa:7.1f} {oa / ob:12.3f} {ob / cb:16.3f} {oa / ca:6.3f}")
    if changes:
        print(f"after/before over {len(changes)} shapes: median {statistics.median(changes):.3f}, "
              f"min {min(changes):.3f}, max {max(changes):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
