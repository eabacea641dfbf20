import time, torch
import flash_attention_scratch as fa
from flash_attention_scratch import _ops, _C
shape=(1,128,1,64)
q,k,v,out=(torch.randn(shape,dtype=torch.float16,device="cuda") for _ in range(4))
dev=q.device
stream=torch.cuda.current_stream().cuda_stream
def t(name, fn, n=200, gpu=False):
    fn(); torch.cuda.synchronize()
    best=1e9
    for _ in range(30):
        s=time.perf_counter()
        for _ in range(n): fn()
        best=min(best,(time.perf_counter()-s)/n)
        if gpu: torch.cuda.synchronize()
    print(f"{name:60s} {best*1e6:7.2f} us")
t("fa.forward(q,k,v,out=out)", lambda: fa.forward(q,k,v,out=out), gpu=True)
t("_C.forward positional (direct)", lambda: _C.forward(q,k,v,out,None,None,stream), gpu=True)
t("_ops._run(...)", lambda: _ops._run(q,k,v,out,None,None,0,None), gpu=True)
t("_C.forward with kwargs of _run", lambda: _C.forward(q,k,v,out,None,None,stream,0,None,window_left=-1,window_right=-1,softcap=0.0,sinks=0), gpu=True)
t("_check x3", lambda: (_ops._check("q",q),_ops._check("k",k,dev),_ops._check("v",v,dev)))
t("_check_no_grad", lambda: _ops._check_no_grad(q,k,v,sinks=None))
t("_variants", lambda: _ops._variants((-1,-1),0.0,None))
t("_causal", lambda: _ops._causal(False,"bottom_right"))
t("_check_sinks None", lambda: _ops._check_sinks(None,q,q.shape[2]))
t("torch.compiler.is_compiling()", lambda: torch.compiler.is_compiling())
t("torch.cuda.current_stream(dev).cuda_stream", lambda: torch.cuda.current_stream(dev).cuda_stream)
t("torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream().cuda_stream)
t("torch.cuda.current_device()", lambda: torch.cuda.current_device())
t("q.device", lambda: q.device)
t("q.device.index", lambda: q.device.index)
t("_variant_kwargs", lambda: _ops._variant_kwargs(q))
t("torch.empty like", lambda: torch.empty(q.shape,dtype=q.dtype,device=q.device))
t("torch.is_grad_enabled()", lambda: torch.is_grad_enabled())
with torch.no_grad():
    t("fa.forward(out=out) under no_grad", lambda: fa.forward(q,k,v,out=out), gpu=True)
t("fa.forward(q,k,v,out=out) again", lambda: fa.forward(q,k,v,out=out), gpu=True)
t("torch.empty_like(q)", lambda: torch.empty_like(q))
t("torch.empty_like(q, contiguous)", lambda: torch.empty_like(q, memory_format=torch.contiguous_format))
t("q.new_empty(q.shape)", lambda: q.new_empty(q.shape))
t("_ops._current_stream(dev)", lambda: _ops._current_stream(dev))
t("fa.forward(q,k,v)", lambda: fa.forward(q,k,v), gpu=True)
t("torch.ops custom op", lambda: torch.ops.flash_attention_scratch.forward(q, k, v, None, False, None), gpu=True)
