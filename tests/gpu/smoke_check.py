"""A first look after a build on a GPU machine: one call per FA version the wheel built,
against torch SDPA (GQA 32/8, causal), at a head dim and 16-bit dtype that version built
(head dim 128 where built: gpu_helpers.smoke_calls reads the build info, so a slice of
`full` without 128 is called at a head dim it has). Not a pytest file; the GPU test suite
is the real check."""

import time

import torch
import torch.nn.functional as F

import vendored_flash_attn as vfa
from vendored_flash_attn.declaration.build_info import load_build_info

from gpu_helpers import TORCH_DTYPES, smoke_calls

torch.manual_seed(0)
seqlens = [200, 333]
cu = torch.tensor([0, 200, 533], dtype=torch.int32, device="cuda")


def reference(q, k, v):
    outs = []
    for b, n in enumerate(seqlens):
        s = slice(int(cu[b]), int(cu[b + 1]))
        qb = q[s].float().transpose(0, 1)
        kb = k[s].float().repeat_interleave(4, dim=1).transpose(0, 1)
        vb = v[s].float().repeat_interleave(4, dim=1).transpose(0, 1)
        outs.append(F.scaled_dot_product_attention(qb, kb, vb, is_causal=True).transpose(0, 1))
    return torch.cat(outs)


calls = smoke_calls(load_build_info())
assert calls, "the build info lists no FA version with a 16-bit dtype and a head dim"
print("selector picks", vfa.get_flash_attn_version())
for version, head_dim, dtype in calls:
    q = torch.randn(533, 32, head_dim, device="cuda", dtype=TORCH_DTYPES[dtype])
    k = torch.randn(533, 8, head_dim, device="cuda", dtype=TORCH_DTYPES[dtype])
    v = torch.randn(533, 8, head_dim, device="cuda", dtype=TORCH_DTYPES[dtype])
    ref = reference(q, k, v)
    start = time.perf_counter()
    out = vfa.flash_attn_varlen_func(q, k, v, max(seqlens), cu, max(seqlens), cu, causal=True,
                                     fa_version=version)
    torch.cuda.synchronize()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    print(f"FA{version} {dtype} head dim {head_dim}: rel L2 error {err:.2e}, "
          f"first call {time.perf_counter() - start:.3f} s")
    assert err < 2e-2, err
