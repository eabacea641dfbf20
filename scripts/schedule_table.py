#!/usr/bin/env python3
"""Static against dynamic tile schedule from `flash_attention bench --format csv` output
(several runs appended, header lines repeated): one row per (dtype, d_head, heads/kv, seq),
TFLOP/s of each and the ratio dynamic / static."""
import csv
import sys


def main(path):
    rows = {}
    with open(path) as f:
        lines = f.read().splitlines()
    header = lines[0].split(",")
    for line in lines:
        if line.startswith("config,"):
            continue
        r = dict(zip(header, next(csv.reader([line]))))
        dynamic = "+dynamic" in r["kernel"]
        key = (r["dtype"], int(r["d_head"]), f'{r["heads"]}/{r["heads_kv"]}', int(r["seq_q"]))
        rows.setdefault(key, {})["dynamic" if dynamic else "static"] = float(r["tflops"])
    print(f'{"shape (causal)":28} {"static":>8} {"dynamic":>8} {"dyn/static":>10}')
    for key in sorted(rows):
        v = rows[key]
        s, d = v.get("static"), v.get("dynamic")
        ratio = f"{d / s:10.3f}" if s and d else f'{"-":>10}'
        name = f"{key[0]} d{key[1]} h{key[2]} {key[3]}"
        print(f"{name:28} {s or 0:8.1f} {d or 0:8.1f} {ratio}")


if __name__ == "__main__":
    main(sys.argv[1])
