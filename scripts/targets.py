#!/usr/bin/env python3
"""Issue 13's targets cell by cell: ours / cuDNN from bench/compare.py's tables against the ratios of
../shared/peers/targets-h100.md (fp16 d_head 128 takes the bf16 targets, as that file says).

    scripts/targets.py TARGETS_MD GRID_MD [GRID_CAUSAL_MD]

Prints one line a cell (ok / MISS, ours and cuDNN TFLOP/s, the ratio, the target) and the count met."""
import re
import sys


def targets(path):
    """{(causal, d_head, seq): target} from the two tables (non-causal first) of targets-h100.md."""
    out, causal = {}, None
    for line in open(path):
        if line.startswith("## "):
            causal = "causal" in line and "non-causal" not in line
        m = re.match(r"\|\s*(\d+)\s*\|(.*)\|\s*$", line)
        if m and causal is not None:
            cells = [float(c.split()[0]) for c in m.group(2).split("|")]
            for seq, t in zip([512, 1024, 2048, 4096, 8192, 16384], cells):
                out[(causal, int(m.group(1)), seq)] = t
    return out


def grid(path):
    """Rows (dtype, d_head, seq, ours, cuDNN) of a compare.py table."""
    rows = []
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[0] in ("bfloat16", "float16"):
            rows.append((cells[0], int(cells[1]), int(cells[2]), float(cells[3]), float(cells[5])))
    return rows


def main():
    t = targets(sys.argv[1])
    met = total = 0
    for causal, path in zip([False, True], sys.argv[2:4]):
        for dtype, d, seq, ours, cudnn in grid(path):
            ratio, target = ours / cudnn, t[(causal, d, seq)]
            ok = ratio >= target
            met, total = met + ok, total + 1
            print(f"{'ok  ' if ok else 'MISS'} {dtype:8s} d{d:<4d} {seq:5d}{' causal' if causal else '       '}"
                  f" {ours:7.1f} {cudnn:6.1f} {ratio:.3f} (target {target:.2f})")
    print(f"met {met}/{total}")


if __name__ == "__main__":
    main()
