"""Agreement of repeated `flash_attention bench --format json` runs (issue 3's last bar).

    python3 scripts/repeatability.py LABEL_1.json LABEL_2.json ...

Files whose names differ only in a trailing _N are repeats of one bench. For every shape
it prints the median of each repeat, the largest disagreement between them, the spread
within a repeat, and two diagnostics for bimodal timings: the fraction of runs in the
slow mode (runs more than 1.5% above the fastest decile) and the median of each input
slot (the bench rotates its inputs among copies; a slow slot points at memory
placement, a slow stretch of consecutive runs at the clock).
"""

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

L2_BYTES = 50 * 1024 * 1024  # H100; only used to rebuild the slot of each run
WARMUP = 5  # flash_attention bench's default


def slots(m):
    q = m["batch"] * m["seq_q"] * m["heads"] * m["d_head"]
    kv = m["batch"] * m["seq_k"] * m["heads_kv"] * m["d_head"]
    slot_bytes = 2.0 * (2 * q + 2 * kv)
    return min(max(int(4.0 * L2_BYTES / slot_bytes) + 1, 4), 64)


def main(paths):
    groups = defaultdict(lambda: defaultdict(list))  # bench -> shape -> [measurement per repeat]
    for path in map(Path, paths):
        bench = re.sub(r"_\d+$", "", path.stem)
        for m in json.loads(path.read_text())["measurements"]:
            shape = (m["kernel"], m["dtype"], m["d_head"], m["seq_q"], m["causal"])
            groups[bench][shape].append(m)
    worst_overall = 0.0
    for bench, shapes in groups.items():
        print(f"\n{bench}")
        print(f"{'dtype':5} {'d':>3} {'seq':>5} {'medians (ms)':>28} {'disagree':>8} {'spread':>7} "
              f"{'slow':>5}  slot medians / fastest")
        for (kernel, dtype, d, seq, causal), ms in sorted(shapes.items(), key=lambda kv: kv[0][1:]):
            medians = [m["median_ms"] for m in ms]
            disagree = max(medians) / min(medians) - 1
            worst_overall = max(worst_overall, disagree)
            spread = max((m["max_ms"] - m["min_ms"]) / m["median_ms"] for m in ms)
            times = [t for m in ms for t in m["times_ms"]]
            fast = sorted(times)[len(times) // 10]
            slow = sum(t > 1.015 * fast for t in times) / len(times)
            n = slots(ms[0])
            by_slot = defaultdict(list)
            for m in ms:
                for i, t in enumerate(m["times_ms"]):
                    by_slot[(WARMUP + i) % n].append(t)
            slot_text = " ".join(f"{statistics.median(by_slot[s]) / fast:.3f}" for s in sorted(by_slot))
            print(f"{dtype:5} {d:>3} {seq:>5}{' c' if causal else '  '} "
                  f"{' '.join(f'{x:.4f}' for x in medians):>26} {100 * disagree:7.2f}% "
                  f"{100 * spread:6.1f}% {100 * slow:4.0f}%  {slot_text}")
    print(f"\nlargest disagreement between repeated medians: {100 * worst_overall:.2f}%")


if __name__ == "__main__":
    main(sys.argv[1:])
