#!/usr/bin/env python3
"""What the compiled ops do when their own argument checks fail: raise, or kill the
process. The interface never relies on those checks (see validation.py); this probe
shows why, and tells whether that still holds after a pin or torch bump.

Each case runs in a subprocess with the interface's checks switched off (the shared
check patched to accept, so the bad call reaches the op with the arguments the
interface builds). One line per case: how the process ended and the op's error.

    python tests/gpu/op_refusal_probe.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys

CHILD = r"""
import sys, types, torch
from vendored_flash_attn import interface
# hand the call to the op as it is: the shared checks accept it (the quick path declines such a
# call, so the full path takes it, with these checks)
interface.check_varlen_call = lambda family, comp, device_type, call, window: types.SimpleNamespace(
    fp8=call.q.dtype == torch.float8_e4m3fn)
version, case = int(sys.argv[1]), sys.argv[2]
dev, bf16 = "cuda", torch.bfloat16
q = torch.randn(2, 8, 128, device=dev, dtype=bf16)
k = torch.randn(4, 16, 2, 128, device=dev, dtype=bf16)
v = torch.randn_like(k)
kw = dict(max_seqlen_q=1, cu_seqlens_q=torch.arange(3, dtype=torch.int32, device=dev),
          max_seqlen_k=20, seqused_k=torch.tensor([5, 20], dtype=torch.int32, device=dev),
          block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=dev), causal=True)
if case == "k-dtype":
    k = k.half()
elif case == "seqused_k-int64":
    kw["seqused_k"] = kw["seqused_k"].long()
elif case == "block_table-rows":
    kw["block_table"] = kw["block_table"][:1]
try:
    interface.flash_attn_varlen_func(q, k, v, fa_version=version, **kw)
    torch.cuda.synchronize()
    print("accepted")
except Exception as exc:
    print(f"raised {type(exc).__name__}: {str(exc).splitlines()[0]}")
"""

CASES = [(3, "k-dtype"), (3, "seqused_k-int64"), (3, "block_table-rows"), (2, "k-dtype"),
         (2, "seqused_k-int64")]


def run(version: int, case: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(version), case],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode < 0:
        ended = f"killed by {signal.Signals(-proc.returncode).name}"
    else:
        ended = f"exit {proc.returncode}"
    out = (proc.stdout.strip().splitlines() or [""])[-1]
    err = (proc.stderr.strip().splitlines() or [""])[-1]
    return {"fa_version": version, "case": case, "ended": ended, "output": out or err}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args(argv)
    results = [run(v, c) for v, c in CASES]
    for r in results:
        print(f"FA{r['fa_version']} {r['case']:18} {r['ended']:22} {r['output'][:110]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
