# Same-process A/B of the wrapper's stream getter: fa.forward(q, k, v, out=out) on a tiny shape,
# alternating the raw getter and the public torch.cuda.current_stream() route.
import time, statistics, torch
import flash_attention_scratch as fa
from flash_attention_scratch import _ops
shape=(1,128,1,64)
q,k,v,out=(torch.randn(shape,dtype=torch.float16,device="cuda") for _ in range(4))
raw=_ops._raw_stream
def best(fn, n=200, reps=20):
    fn(); torch.cuda.synchronize(); b=1e9
    for _ in range(reps):
        s=time.perf_counter()
        for _ in range(n): fn()
        b=min(b,(time.perf_counter()-s)/n); torch.cuda.synchronize()
    return b*1e6
res={"raw":[], "public":[]}
for r in range(8):
    for name,g in (("raw",raw),("public",None)) if r%2==0 else (("public",None),("raw",raw)):
        _ops._raw_stream=g
        res[name].append(best(lambda: fa.forward(q,k,v,out=out)))
for name,xs in res.items():
    print(f"{name:7s} median {statistics.median(xs):6.2f} us  rounds {' '.join(f'{x:.2f}' for x in xs)}")
