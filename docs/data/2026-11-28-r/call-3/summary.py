import sys, statistics, datetime
smi = []
for line in open(sys.argv[1]):
    p = [x.strip() for x in line.split(",")]
    try:
        t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp()
        smi.append((t, float(p[1]), float(p[2]), float(p[3]), p[4]))
    except (ValueError, IndexError):
        pass
print("who seq  clock_MHz  power_W  temp_C  power_cap_active  samples  | timing")
for line in open(sys.argv[2]):
    w = line.split()
    who, seq, t0, t1 = w[0], w[1], float(w[2]), float(w[3])
    # the middle of the window: skip the warm-up second
    sel = [s for s in smi if t0 + 1.0 <= s[0] <= t1 - 0.2]
    if not sel:
        print(who, seq, "no samples"); continue
    print(f"{who:5s} {seq:5s} {statistics.median(s[1] for s in sel):8.0f} {statistics.median(s[2] for s in sel):8.1f} "
          f"{statistics.median(s[3] for s in sel):6.0f} {sum(s[4] == 'Active' for s in sel) / len(sel):8.2f} {len(sel):8d}  | {' '.join(w[4:])}")
