"""What upstream's own FA3 op does with the scheduler metadata upstream's test file
computes for its paged decode case (get_scheduler_metadata with max_seqlen_q=1, causal,
no page_size; the call then pages K/V in blocks of 16 or 32), per head dim. Calls the
compiled ops directly, so the package's own metadata check plays no part.

    python tests/gpu/metadata_probe.py      (an H200; every FA3 head dim the wheel built)

Measured 2026-11-30 on the H200 (docs/gpu-results.md): at head dim 128 the op refuses
that metadata ('scheduler_metadata must have shape (metadata_size)': 9 entries, the
paged call needs 13; with page_size given it has 13 and the output equals the call
without metadata); at head dim 256 both have 9 entries and the output is identical.
"""

import importlib

import torch

from vendored_flash_attn.declaration.build_info import load_build_info

importlib.import_module("vendored_flash_attn._vendored_fa3_C")  # registers the ops
ops = torch.ops._vendored_fa3_C
torch.manual_seed(0)
for hd in sorted(load_build_info().fa3.head_dims):  # the head dims this wheel's FA3 has
    for bs in (16, 32):
        dt = torch.bfloat16
        kv = [1328, 18, 463]
        b, hq, hk, nb = 3, 16, 2, 2048
        q = torch.randn(b, hq, hd, device="cuda", dtype=dt)
        kc = torch.randn(nb, bs, hk, hd, device="cuda", dtype=dt)
        vc = torch.randn_like(kc)
        sk = torch.tensor(kv, dtype=torch.int32, device="cuda")
        bt = torch.randint(0, nb, (b, (max(kv) + bs - 1) // bs), dtype=torch.int32, device="cuda")
        cu = torch.arange(b + 1, dtype=torch.int32, device="cuda")

        def metadata(page_size):
            return ops.get_scheduler_metadata(b, 1, max(kv), hq, hk, hd, hd, dt, sk, None, None, None, None,
                                              None, page_size, 0, True, -1, -1, False, 0, None, 0)

        def call(m):
            return ops.fwd(q, kc, vc, None, None, None, None, cu, None, None, None, sk, 1, max(kv), bt, None,
                           None, None, None, None, None, None, None, hd ** -0.5, True, -1, -1, 0.0, True, m, 0,
                           None, 0, None, 1, 0, None)[0]

        ref = call(None)
        for name, m in (("no page_size", metadata(None)), ("page_size", metadata(bs))):
            try:
                out = call(m)
                torch.cuda.synchronize()
                print(hd, bs, name, "size", m.numel(), "accepted; max diff vs none",
                      (out.float() - ref.float()).abs().max().item())
            except Exception as e:  # noqa: BLE001 - the op's refusal is the result
                print(hd, bs, name, "size", m.numel(), "refused by the op:", str(e).splitlines()[0][:140])
