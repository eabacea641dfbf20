"""The automatic choice of two builds, shape by shape: `flash_attention bench --best
--format json` outputs of build A, then `--`, then those of build B (repeats of each are
merged by their median). Prints each (dtype, d_head) pair's harmonic mean over sequence
lengths for both builds, their ratio, the worst single shape, and the kernels that ran.

    python3 scripts/compare_builds.py a1.json a2.json -- b1.json b2.json
"""

import json
import statistics
import sys
from collections import defaultdict


def load(paths):
    rates = defaultdict(list)  # (dtype, d_head, seq) -> TFLOP/s of each repeat
    kernels = defaultdict(set)
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for m in doc["measurements"]:
            key = (m["dtype"], m["d_head"], m["seq_q"])
            rates[key].append(m["tflops"])
            kernels[key[:2]].add(m["kernel"])
    return {k: statistics.median(v) for k, v in rates.items()}, kernels


def harmonic(values):
    return len(values) / sum(1 / v for v in values)


def main(argv):
    split = argv.index("--")
    a, kernels_a = load(argv[:split])
    b, kernels_b = load(argv[split + 1:])
    pairs = sorted({k[:2] for k in a} & {k[:2] for k in b})
    print(f"{'pair':<12} {'default':>8} {'tune':>8} {'ratio':>7} {'worst seq':>10}  same kernels")
    worst_pair = 1.0
    for dtype, d in pairs:
        seqs = sorted(s for (t, h, s) in a if (t, h) == (dtype, d) and (t, h, s) in b)
        ha = harmonic([a[(dtype, d, s)] for s in seqs])
        hb = harmonic([b[(dtype, d, s)] for s in seqs])
        ratios = {s: a[(dtype, d, s)] / b[(dtype, d, s)] for s in seqs}
        worst = min(ratios, key=ratios.get)
        same = kernels_a[(dtype, d)] == kernels_b[(dtype, d)]
        worst_pair = min(worst_pair, ha / hb)
        print(f"{dtype + ' d' + str(d):<12} {ha:8.1f} {hb:8.1f} {ha / hb:7.3f} {worst:>6} {ratios[worst]:.3f}  {same}")
    print(f"lowest harmonic-mean ratio default/tune: {worst_pair:.3f} (bar: >= 0.97)")


if __name__ == "__main__":
    main(sys.argv[1:])
