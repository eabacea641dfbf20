"""Short summary of a scripts/device_check.sh run (reads the files it left in OUT)."""

import csv
import re
import sys
from pathlib import Path


def read_csv(path):
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if not line.startswith("flash_attention:")]
    return list(csv.DictReader(lines))


def torch_rates(out):
    rates = {}
    path = out / "torch.txt"
    if path.exists():
        for line in path.read_text().splitlines():
            m = re.match(r"(\w+) d=(\d+) seq=(\d+) .* (\S+): .* ([\d.]+) TFLOP/s", line)
            if m:
                dtype = {"bfloat16": "BF16", "float16": "FP16"}[m.group(1)]
                rates[(dtype, int(m.group(2)), int(m.group(3)), m.group(4))] = float(m.group(5))
    return rates


def main(out):
    out = Path(out)
    torch = torch_rates(out)
    bench = read_csv(out / "bench_tune.csv")
    if bench:
        best = {}
        for row in bench:
            key = (row["dtype"], int(row["d_head"]), int(row["seq_q"]))
            if key not in best or float(row["tflops"]) > float(best[key]["tflops"]):
                best[key] = row
        print(f"bench --set tune: best config per shape ({len(bench)} measurements)")
        for key in sorted(best):
            print(f"  {key[0]} d{key[1]:>3} seq {key[2]:>5} {float(best[key]['tflops']):7.1f}  {best[key]['kernel']}")
    for d in (128, 64):
        rows = read_csv(out / f"auto_vs_best_d{d}.csv")
        if not rows:
            continue
        auto = [r for r in rows if r["config"].startswith("automatic choice")]
        others = [r for r in rows if not r["config"].startswith("automatic choice")]
        if auto and others:
            top = max(others, key=lambda r: float(r["tflops"]))
            a = float(auto[0]["tflops"])
            fa2 = torch.get(("BF16", d, 4096, "flash(FA2)"))
            fa2_text = f"; PyTorch FA2 {fa2:.1f} ({100 * a / fa2:.1f}%)" if fa2 else ""
            print(f"bf16 d{d} seq 4096: automatic {a:.1f} ({auto[0]['kernel']}) vs best {float(top['tflops']):.1f} "
                  f"({100 * a / float(top['tflops']):.1f}%){fa2_text}")
    runs = [read_csv(out / f"auto_{i}.csv") for i in (1, 2)]
    if all(runs):
        worst = 0
        for a, b in zip(*runs):
            diff = abs(float(a["median_ms"]) / float(b["median_ms"]) - 1)
            worst = max(worst, diff)
        spread = max(100 * (float(r["max_ms"]) - float(r["min_ms"])) / float(r["median_ms"]) for r in runs[0] + runs[1])
        print(f"repeat: {len(runs[0])} medians, largest difference between the two runs {100 * worst:.2f}%, "
              f"largest spread within a run {spread:.1f}%")


if __name__ == "__main__":
    main(sys.argv[1])
