"""The table of an A/B run (scripts/gpu_check.sh ab): for each config and shape, the median
TFLOP/s over the rounds of this tree's binary and of the base's, and their ratio, from the CSV
files `flash_attention bench --format csv` wrote as ab_{tree,base}_{round}_{line}.csv."""

import argparse
import csv
import pathlib
import statistics
import sys


def read(folder):
    """{(config, dtype, d_head, causal, seq_q, seq_k): {"tree": [...], "base": [...]}}"""
    rows = {}
    for path in sorted(pathlib.Path(folder).glob("ab_*_*_*.csv")):
        side = path.name.split("_")[1]
        with path.open() as f:
            for r in csv.DictReader(f):
                key = (r["config"], r["dtype"], int(r["d_head"]), int(r["causal"]), int(r["seq_q"]),
                       int(r["seq_k"]))
                rows.setdefault(key, {}).setdefault(side, []).append(float(r["tflops"]))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", help="where the ab_*.csv files are")
    rows = read(parser.parse_args().folder)
    if not rows:
        print("ab_summary: no ab_*.csv files with results", file=sys.stderr)
        return 1
    print("| config | causal | seq_q | seq_k | tree TFLOP/s | base TFLOP/s | tree / base | rounds tree/base |")
    print("|---|---|---|---|---|---|---|---|")
    one_sided = 0
    for key in sorted(rows):
        tree, base = rows[key].get("tree", []), rows[key].get("base", [])
        if not tree or not base:
            one_sided += 1
            continue
        t, b = statistics.median(tree), statistics.median(base)
        rounds = " ".join(f"{x:.0f}/{y:.0f}" for x, y in zip(tree, base))
        print(f"| {key[0]} | {key[3]} | {key[4]} | {key[5]} | {t:.1f} | {b:.1f} | {t / b:.3f} | {rounds} |")
    if one_sided:
        print(f"ab_summary: {one_sided} of {len(rows)} config-shape pairs measured on one side only (left out)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
