# How much a stream-ordered alloc + 4-byte memset + free in the timed window costs a ~100 us kernel.
import ctypes, glob, statistics, torch
lib = ctypes.CDLL(sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*"))[0])
dev = torch.device("cuda")
n = 3072
a = [torch.randn(n, n, dtype=torch.bfloat16, device=dev) for _ in range(8)]
b = [torch.randn(n, n, dtype=torch.bfloat16, device=dev) for _ in range(8)]
stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
buf = torch.zeros(256, dtype=torch.int32, device=dev)
pool = ctypes.c_void_p()
lib.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), 0)

def plain(i):
    torch.mm(a[i % 8], b[i % 8])

def memset(i):
    assert lib.cudaMemsetAsync(ctypes.c_void_p(buf.data_ptr()), 0, 4, stream) == 0
    torch.mm(a[i % 8], b[i % 8])

def scratch(i):
    p = ctypes.c_void_p()
    assert lib.cudaMallocFromPoolAsync(ctypes.byref(p), 4, pool, stream) == 0
    assert lib.cudaMemsetAsync(p, 0, 4, stream) == 0
    torch.mm(a[i % 8], b[i % 8])
    assert lib.cudaFreeAsync(p, stream) == 0

def fill(i):
    buf[:1].zero_()
    torch.mm(a[i % 8], b[i % 8])

impls = dict(plain=plain, memset=memset, scratch=scratch, fill=fill)
times = {k: [] for k in impls}
for k, f in impls.items():
    for i in range(50):
        f(i)
torch.cuda.synchronize()
for r in range(20):
    for k, f in impls.items():
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(25)]
        for i, (s, e) in enumerate(ev):
            s.record(); f(i); e.record()
        ev[-1][1].synchronize()
        times[k] += [s.elapsed_time(e) * 1000 for s, e in ev]
for k, t in times.items():
    print(f"{k:8s} median {statistics.median(t):8.2f} us  min {min(t):8.2f}  max {max(t):8.2f}")
