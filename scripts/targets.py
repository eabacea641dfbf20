#!/usr/bin/env python3
"""Issue 13's targets cell by cell: ours / cuDNN from bench/compare.py's tables against the ratios of
../shared/peers/targets-h100.md (fp16 d_head 128 takes the bf16 targets, as that file says).

    scripts/targets.py TARGETS_MD GRID_MD [GRID_CAUSAL_MD]

Prints one line a cell (ok / MISS, ours and cuDNN TFLOP/s, the ratio, the target) and the count met."""
import re
import sys

from compare_tables import rows  # (dtype, d_head, seq) -> (ours, cuDNN) of a compare.py table


def targets(path):
    """{(causal, d_head, seq): target} from the two tables (non-causal first) of targets-h100.md."""
    out, causal, seqs = {}, None, []
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("## "):
            causal = "causal" in line and "non-causal" not in line
        elif cells[0] == "d_head":  # the header row names the lengths
            seqs = [int(c) for c in cells[1:]]
        elif causal is not None and re.fullmatch(r"\d+", cells[0]):
            for seq, cell in zip(seqs, cells[1:]):
                out[(causal, int(cells[0]), seq)] = float(cell.split()[0])
    return out


def main():
    t = targets(sys.argv[1])
    met = total = 0
    for causal, path in zip([False, True], sys.argv[2:4]):
        for (dtype, d, seq), (ours, cudnn) in rows(path).items():
            ratio, target = ours / cudnn, t[(causal, d, seq)]
            ok = ratio >= target
            met, total = met + ok, total + 1
            print(f"{'ok  ' if ok else 'MISS'} {dtype:8s} d{d:<4d} {seq:5d}{' causal' if causal else '       '}"
                  f" {ours:7.1f} {cudnn:6.1f} {ratio:.3f} (target {target:.2f})")
    print(f"met {met}/{total}")


if __name__ == "__main__":
    main()
