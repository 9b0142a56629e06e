"""A first look after a build on a GPU machine: one FA2 and one FA3 call
against torch SDPA (bf16, GQA 32/8, head dim 128, causal). Not a pytest file;
the GPU test suite is the real check."""

import time

import torch
import torch.nn.functional as F

import vendored_flash_attn as vfa

torch.manual_seed(0)
seqlens = [200, 333]
cu = torch.tensor([0, 200, 533], dtype=torch.int32, device="cuda")
q = torch.randn(533, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(533, 8, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn(533, 8, 128, device="cuda", dtype=torch.bfloat16)


def reference():
    outs = []
    for b, n in enumerate(seqlens):
        s = slice(int(cu[b]), int(cu[b + 1]))
        qb = q[s].float().transpose(0, 1)
        kb = k[s].float().repeat_interleave(4, dim=1).transpose(0, 1)
        vb = v[s].float().repeat_interleave(4, dim=1).transpose(0, 1)
        outs.append(F.scaled_dot_product_attention(qb, kb, vb, is_causal=True).transpose(0, 1))
    return torch.cat(outs)


ref = reference()
print("selector picks", vfa.get_flash_attn_version())
for version in (2, 3):
    start = time.perf_counter()
    out = vfa.flash_attn_varlen_func(q, k, v, max(seqlens), cu, max(seqlens), cu, causal=True, fa_version=version)
    torch.cuda.synchronize()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    print(f"FA{version}: rel L2 error {err:.2e}, first call {time.perf_counter() - start:.3f} s")
    assert err < 2e-2, err
