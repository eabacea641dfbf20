"""cuDNN (PyTorch SDPA) on a decoding shape a few times, for ncu to profile its kernels:
how the peer reaches its K/V bandwidth (grid, threads, shared memory, DRAM throughput).

    ncu --launch-skip 5 --launch-count 4 python3 scripts/cudnn_decode.py BATCH SEQ_K
"""

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

batch, seq_k = int(sys.argv[1]), int(sys.argv[2])
q = torch.randn(batch, 32, 1, 128, dtype=torch.bfloat16, device="cuda")
# (batch, seq, heads, d) caches seen as (batch, heads, seq, d), as bench/serving.py passes them.
k = torch.randn(batch, seq_k, 8, 128, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
v = torch.randn(batch, seq_k, 8, 128, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(8):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
