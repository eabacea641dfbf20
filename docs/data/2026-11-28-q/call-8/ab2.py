# Same-process A/B of the output allocation: fa.forward(q, k, v) on a tiny shape, alternating
# empty_like(contiguous) (the change) and torch.empty(q.shape, dtype, device) (before).
import time, statistics, torch
import flash_attention_scratch as fa
from flash_attention_scratch import _ops
shape=(1,128,1,64)
q,k,v=(torch.randn(shape,dtype=torch.float16,device="cuda") for _ in range(3))
new=_ops._out_like
old=lambda q: torch.empty(q.shape, dtype=q.dtype, device=q.device)
def best(fn, n=200, reps=20):
    fn(); torch.cuda.synchronize(); b=1e9
    for _ in range(reps):
        s=time.perf_counter()
        for _ in range(n): fn()
        b=min(b,(time.perf_counter()-s)/n); torch.cuda.synchronize()
    return b*1e6
res={"empty_like":[], "empty":[]}
for r in range(8):
    order=(("empty_like",new),("empty",old)) if r%2==0 else (("empty",old),("empty_like",new))
    for name,f in order:
        _ops._out_like=f
        res[name].append(best(lambda: fa.forward(q,k,v)))
for name,xs in res.items():
    print(f"forward(q, k, v) {name:10s} median {statistics.median(xs):6.2f} us  rounds {' '.join(f'{x:.2f}' for x in xs)}")
_ops._out_like=new
q2=torch.randn(1,2,128,64,dtype=torch.float16,device="cuda").transpose(1,2)
o=_ops._out_like(q2); print("strided q -> out contiguous:", o.is_contiguous(), tuple(o.shape), o.dtype, o.device)
