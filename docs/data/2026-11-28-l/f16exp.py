import numpy as np
rng=np.random.default_rng(0)
def bf16(x):
    x=np.asarray(x,np.float32); b=x.view(np.uint32).astype(np.uint64)
    b=((b+0x7FFF+((b>>16)&1))>>16)<<16
    return b.astype(np.uint32).view(np.float32)
def run(dtype, n=1024, d=64, scale=None, trials=3):
    rnd=(lambda a: a.astype(np.float16).astype(np.float32)) if dtype=='fp16' else bf16
    res=[]
    for t in range(trials):
        q=rnd(rng.standard_normal((256,d)).astype(np.float32)); k=rnd(rng.standard_normal((n,d)).astype(np.float32)); v=rnd(rng.standard_normal((n,d)).astype(np.float32))
        sc=scale or 1/np.sqrt(d); l2=np.float32(sc*np.log2(np.e))
        s64=q.astype(np.float64)@k.T.astype(np.float64)*sc
        m=s64.max(1,keepdims=True); p=np.exp(s64-m); ref=(p@v)/p.sum(1,keepdims=True); lse=(m+np.log(p.sum(1,keepdims=True)))[:,0]
        s=(q@k.T).astype(np.float32); off=(s.max(1,keepdims=True)*l2).astype(np.float32)
        x=(s*l2-off).astype(np.float32)
        out={}
        for name in ('fp32exp','f16x'):
            if name=='fp32exp': P=np.exp2(x).astype(np.float32)
            else:
                xh=x.astype(np.float16).astype(np.float32)   # x rounded to fp16 (ex2.approx.f16x2 input)
                P=np.exp2(xh).astype(np.float16).astype(np.float32)  # result in fp16
            Pr=rnd(P)           # P as the GEMM's operand
            ssum=P.sum(1,keepdims=True) if name=='fp32exp' else P.sum(1,keepdims=True)
            o=(Pr@v)/ssum
            l=(off[:,0]/l2*sc + np.log(ssum[:,0]))
            out[name]=(np.abs(o-ref).max(), np.abs(l-lse).max())
        # naive same dtype: S rounded, softmax in dtype
        sn=rnd(q@k.T*sc); pn=rnd(np.exp(sn-sn.max(1,keepdims=True))); on=rnd(rnd(pn/rnd(pn.sum(1,keepdims=True)))@v)
        out['naive']=(np.abs(on-ref).max(),0)
        res.append(out)
    for k_ in res[0]:
        print(dtype, n, scale, k_, 'max|o-ref| %.2e  max|lse-ref| %.2e' % (max(r[k_][0] for r in res), max(r[k_][1] for r in res)))
for dt in ('bf16','fp16'):
    run(dt); run(dt, scale=1.0)
