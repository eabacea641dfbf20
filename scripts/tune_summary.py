"""Per shape of `flash_attention tune --format csv` output: the fastest config against the
automatic choice of the release build (from `choose`), to see where the built-in table
could take another config.

    python3 scripts/tune_summary.py --release choices.csv tune_a.csv tune_b.csv

choices.csv: lines "dtype,d_head,seq,causal,config" (causal 0/1), as the device script's
`tune` stage writes them with `flash_attention choose`.
"""

import argparse
import csv
import io


def rows(path):
    with open(path) as f:
        text = "".join(line for line in f if line.startswith(("config,", '"(')))
    return list(csv.DictReader(io.StringIO(text)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--release", required=True)
    parser.add_argument("csv", nargs="+")
    args = parser.parse_args()
    release = {}
    with open(args.release) as f:
        for line in f:
            dtype, d, seq, causal, config = line.rstrip("\n").split(",", 4)
            release[(dtype, d, seq, causal)] = config
    shapes = {}
    for path in args.csv:
        for r in rows(path):
            key = (r["dtype"], r["d_head"], r["seq_q"], r["causal"])
            shapes.setdefault(key, {})[r["config"]] = float(r["tflops"])
    print(f"{'shape':28s} {'release':>8s} {'best':>8s} {'best/rel':>8s}  best config")
    for key in sorted(shapes, key=lambda k: (k[0], int(k[1]), k[3], int(k[2]))):
        measured = shapes[key]
        best = max(measured, key=measured.get)
        rel = measured.get(release.get(key, ""), float("nan"))
        name = f"{key[0]} d{key[1]} {key[2]}{' causal' if key[3] == '1' else ''}"
        print(f"{name:28s} {rel:8.1f} {measured[best]:8.1f} {measured[best] / rel:8.3f}  {best}")


if __name__ == "__main__":
    main()
