#!/usr/bin/env python3
"""FA4's FP8 KV path (bf16 q, FP8 K/V in a paged cache, dequantized in the kernel, sm90)
case by case against float64: which part of a call decides its error. A diagnosis, run on
the H200 by `tests/gpu/fa4_h200.sh fp8-probe` (the wheel and FA4's dependencies installed).

Each kernel source is a fresh process: `shipped` (the wheel's precompiled kernels) and `jit`
(VFA_FA4_SHIPPED_KERNELS=off: compiled on this GPU at first use). In each: the decode case of
fp8_accuracy.py (4 sequences x 1024 keys, V of mean 0.5, Llama-3.1-8B heads 32/8) through
the package with vLLM's descales (q, k, v ones), with q_descale=None, with num_splits=1, and
upstream's own call (`_flash_attn_fwd`, as its tests/cute/test_flash_attn_fp8_kv_cache.py
makes it: q_descale=None, num_splits=1); the bf16 kernel on the same values; and head dim
512 with pages of 64, the shape upstream's test covers. Prints a table, writes JSON.

    python tests/gpu/fa4_fp8_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child() -> list[dict]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import dataclasses

    import common
    import fp8_accuracy
    import torch

    from vendored_flash_attn import flash_attn_varlen_func
    from vendored_flash_attn.families.fa4 import adapter as fa4

    rows = []
    interface = fa4.load().interface
    shapes = []
    for head_dim in [int(d) for d in os.environ.get("FA4_FP8_PROBE_HEAD_DIMS", "128,512").split(",")]:
        # FA4 takes FP8 KV on sm90 with pages of its tile_n for the head dim (fa4/adapter.py's rule).
        tile_n = interface._tile_size_fwd_sm90(head_dim, head_dim, True, False).n_block_size
        shapes.append((head_dim, tile_n, (8, 4) if head_dim == 512 else (32, 8)))
    for head_dim, page, heads in shapes:
        q_lens, k_lens = (1,) * 4, (1024,) * 4
        model = dataclasses.replace(common.LLAMA_8B, head_dim=head_dim, heads_q=heads[0], heads_kv=heads[1])
        x = fp8_accuracy.long_context_inputs("v_mean", q_lens, k_lens, seed=7, model=model, page=page)
        ref = fp8_accuracy.reference64(x["q"], x["k"], x["v"], q_lens, k_lens, causal=True)
        q = x["q"].to(torch.bfloat16)
        ones = x["descale"].contiguous()
        base = dict(max_seqlen_q=1, cu_seqlens_q=x["cu_seqlens_q"], max_seqlen_k=1024, seqused_k=x["seqused_k"],
                    block_table=x["block_table"], causal=True, fa_version=4)
        calls = {
            "package, q/k/v descales (vLLM)": lambda: flash_attn_varlen_func(
                q, x["k_cache"], x["v_cache"], q_descale=ones, k_descale=ones, v_descale=ones, **base),
            "package, q_descale=None": lambda: flash_attn_varlen_func(
                q, x["k_cache"], x["v_cache"], k_descale=ones, v_descale=ones, **base),
            "package, num_splits=1": lambda: flash_attn_varlen_func(
                q, x["k_cache"], x["v_cache"], q_descale=ones, k_descale=ones, v_descale=ones, num_splits=1, **base),
            "upstream _flash_attn_fwd (its test's call)": lambda: fa4.load().interface._flash_attn_fwd(
                q=q, k=x["k_cache"], v=x["v_cache"], softmax_scale=head_dim ** -0.5, causal=True, q_descale=None,
                k_descale=ones, v_descale=ones, cu_seqlens_q=x["cu_seqlens_q"], seqused_k=x["seqused_k"],
                max_seqlen_q=1, max_seqlen_k=1024, page_table=x["block_table"], num_splits=1,
                fp8_kv_dequant=True)[0],
            "bf16 kernel, same values": lambda: flash_attn_varlen_func(
                q, x["k_cache"].to(torch.bfloat16), x["v_cache"].to(torch.bfloat16), **base),
        }
        for label, call in calls.items():
            try:
                out = call()
                out = out[0] if isinstance(out, tuple) else out
                torch.cuda.synchronize()
                rows.append({"head_dim": head_dim, "page": page, "call": label,
                             "rel_l2": common.relative_l2(out, ref), "finite": bool(torch.isfinite(out).all())})
            except Exception as exc:  # noqa: BLE001 - the table says which call failed
                rows.append({"head_dim": head_dim, "page": page, "call": label, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--head-dims", default="128,512", help="head dims to probe (pages of FA4's tile_n)")
    parser.add_argument("--jit-only", action="store_true", help="only kernels compiled here (no shipped ones)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("FA4_FP8_PROBE_ROWS " + json.dumps(child()))
        return 0
    results = []
    sources = (("shipped", "on"), ("jit", "off")) if not args.jit_only else (("jit", "off"),)
    for source, switch in sources:
        env = {**os.environ, "VFA_FA4_SHIPPED_KERNELS": switch, "FA4_FP8_PROBE_HEAD_DIMS": args.head_dims}
        proc = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("FA4_FP8_PROBE_ROWS ")]
        if proc.returncode or not lines:
            results.append({"source": source, "error": (proc.stderr or proc.stdout)[-2000:]})
            continue
        results += [{"source": source, **row} for row in json.loads(lines[-1][len("FA4_FP8_PROBE_ROWS "):])]
    print(f"{'kernels':8s} {'hd':>4s} {'page':>4s}  {'call':44s} {'rel. L2 vs float64':>20s}")
    for row in results:
        value = row.get("error") or (f"{row['rel_l2'] * 100:.3f} %" + ("" if row["finite"] else " NON-FINITE"))
        print(f"{row['source']:8s} {row.get('head_dim', '-'):>4} {row.get('page', '-'):>4}  {row.get('call', '-'):44s} {value}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"fa4_fp8_probe{'-jit' if args.jit_only else ''}.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
