import csv, glob, os, sys
d = sys.argv[1]
want = ["gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second", "sm__cycles_elapsed.max",
        "sm__cycles_active.avg", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
        "lts__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_bytes.sum.per_second",
        "lts__t_sectors.sum", "l1tex__m_xbar2l1tex_read_bytes.sum.per_second", "dram__bytes_read.sum",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed", "smsp__issue_active.avg.pct_of_peak_sustained_active",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed", "launch__grid_size"]
rows = {}
for f in sorted(glob.glob(os.path.join(d, "*_raw.csv"))):
    n = os.path.basename(f)[:-8]
    with open(f) as fh:
        r = list(csv.reader(fh))
    if len(r) < 3:
        print(n, "no data"); continue
    names, units, vals = r[0], r[1], r[-1]
    m = {a: (b, c) for a, b, c in zip(names, units, vals)}
    rows[n] = m
    def num(x):
        try:
            return float(x.replace(",", ""))
        except ValueError:
            return None
    stalls = sorted(((num(v[1]), k) for k, v in m.items()
                     if "issue_stalled" in k and k.endswith(".ratio") and num(v[1]) is not None),
                    reverse=True)[:10]
    print(f"== {n}")
    for w in want:
        if w in m:
            print(f"  {w} = {m[w][1]} {m[w][0]}")
    for v, k in stalls:
        print(f"  stall {k} = {v:.3f}")
