"""Agreement of repeated `flash_attention bench --format json` runs (issue 3's last bar).

    python3 scripts/repeatability.py LABEL_1.json LABEL_2.json ...

Files whose names differ only in a trailing _N are repeats of one bench. For every shape
it prints the median of each repeat, the largest disagreement between them, the spread
within a repeat, the fraction of runs more than 1.5% above the fastest decile (a slow
mode: the clock under the power cap), and the drift within each repeat (median of the
second half of its runs over the first half).
"""

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

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
              f"{'slow':>5}  drift per repeat")
        for (kernel, dtype, d, seq, causal), ms in sorted(shapes.items(), key=lambda kv: kv[0][1:]):
            medians = [m["median_ms"] for m in ms]
            disagree = max(medians) / min(medians) - 1
            worst_overall = max(worst_overall, disagree)
            spread = max((m["max_ms"] - m["min_ms"]) / m["median_ms"] for m in ms)
            times = [t for m in ms for t in m["times_ms"]]
            fast = sorted(times)[len(times) // 10]
            slow = sum(t > 1.015 * fast for t in times) / len(times)
            drift = []
            for m in ms:
                t = m["times_ms"]
                drift.append(statistics.median(t[len(t) // 2 :]) / statistics.median(t[: len(t) // 2]) - 1)
            drift_text = " ".join(f"{100 * x:+.1f}%" for x in drift)
            print(f"{dtype:5} {d:>3} {seq:>5}{' c' if causal else '  '} "
                  f"{' '.join(f'{x:.4f}' for x in medians):>26} {100 * disagree:7.2f}% "
                  f"{100 * spread:6.1f}% {100 * slow:4.0f}%  {drift_text}")
    print(f"\nlargest disagreement between repeated medians: {100 * worst_overall:.2f}%")


if __name__ == "__main__":
    main(sys.argv[1:])
