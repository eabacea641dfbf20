"""Side-by-side table of a few Nsight Compute metrics from several reports' details pages.

    python3 scripts/ncu_table.py ours=ours_details.csv cudnn=cudnn_details.csv

Each CSV is `ncu --import REPORT --page details --csv`; the first kernel of each is shown.
"""

import csv
import sys

METRICS = [
    "Duration",
    "Elapsed Cycles",
    "SM Frequency",
    "Compute (SM) Throughput",
    "Memory Throughput",
    "L1/TEX Cache Throughput",
    "Mem Busy",
    "Max Bandwidth",
    "Mem Pipes Busy",
    "One or More Eligible",
    "Eligible Warps Per Scheduler",
    "Executed Ipc Active",
    "Issue Slots Busy",
    "Registers Per Thread",
    "Achieved Occupancy",
    "Warp Cycles Per Issued Instruction",
    "L2 Hit Rate",
    "DRAM Throughput",
    "Shared Memory Configuration Size",
    "Grid Size",
    "Block Size",
]


def first_kernel(path):
    """{metric name: 'value unit'} of the first kernel in a details CSV."""
    values = {}
    kernel = None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            kernel = kernel or row.get("ID")
            if row.get("ID") != kernel:
                break
            values.setdefault(row["Metric Name"], f'{row["Metric Value"]} {row["Metric Unit"]}'.strip())
            values.setdefault("kernel", row.get("Kernel Name", "")[:60])
    return values


def main():
    columns = [arg.split("=", 1) for arg in sys.argv[1:]]
    tables = [(name, first_kernel(path)) for name, path in columns]
    print("| metric | " + " | ".join(name for name, _ in tables) + " |")
    print("|---" * (len(tables) + 1) + "|")
    for metric in ["kernel"] + METRICS:
        print(f"| {metric} | " + " | ".join(t.get(metric, "n/a") for _, t in tables) + " |")


if __name__ == "__main__":
    main()
