"""Short table of a device_check.sh run: the progression ladder, the best config per
(dtype, d_head) at the reference shape, and PyTorch's backends on the same shape."""

import csv
import re
import sys
from pathlib import Path


def read_csv(path):
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def main(out):
    out = Path(out)
    ladder = read_csv(out / "progression.csv")
    if ladder:
        print("progression, seq 4096 d_head 128 (TFLOP/s, gain over the previous step)")
        previous = None
        for row in ladder:
            rate = float(row["tflops"])
            gain = f"{100 * (rate / previous - 1):+.1f}%" if previous else ""
            print(f"  {rate:7.1f} {gain:>8}  spread {100 * (float(row['max_ms']) - float(row['min_ms'])) / float(row['median_ms']):4.1f}%  {row['kernel']}")
            previous = rate
    rows = read_csv(out / "tune_4096.csv")
    best = {}
    for row in rows:
        key = (row["dtype"], row["d_head"])
        if key not in best or float(row["tflops"]) > float(best[key]["tflops"]):
            best[key] = row
    torch_rates = {}
    torch_file = out / "torch.txt"
    if torch_file.exists():
        for line in torch_file.read_text().splitlines():
            m = re.match(r"(\w+) d=(\d+) .* (\S+): .* ([\d.]+) TFLOP/s", line)
            if m:
                dtype = {"bfloat16": "BF16", "float16": "FP16"}[m.group(1)]
                torch_rates[(dtype, m.group(2), m.group(3))] = float(m.group(4))
    if best:
        print(f"best of {len(rows)} built configs, seq 4096 batch 4 heads 16 (TFLOP/s; vs PyTorch FA2)")
        for key in sorted(best):
            row = best[key]
            fa2 = torch_rates.get((key[0], key[1], "flash(FA2)"))
            ratio = f"{100 * float(row['tflops']) / fa2:5.1f}% of FA2 {fa2:.1f}" if fa2 else ""
            print(f"  {key[0]} d{key[1]:>3} {float(row['tflops']):7.1f}  {ratio}  {row['kernel']}")


if __name__ == "__main__":
    main(sys.argv[1])
