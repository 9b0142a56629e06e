"""FA4 through vendored_flash_attn on a GPU (run by tests/gpu/fa4_h200.sh on the H200): selector answers, then fa_version=4 calls
against a float32 SDPA reference (error = ||out - ref|| / ||ref||), first call (JIT) and
warm times. bf16, head dim 128, 16 query / 4 KV heads."""
import json, os, sys, time
import torch
import torch.nn.functional as F
t0 = time.perf_counter()
import vendored_flash_attn as vfa
print(f"import vendored_flash_attn: {time.perf_counter() - t0:.3f} s; cutlass imported: {'cutlass' in sys.modules}")
print("default:", vfa.get_flash_attn_version(), "| supported 2/3/4:",
      [vfa.is_fa_version_supported(n) for n in (2, 3, 4)], "| reason 4:", vfa.fa_version_unsupported_reason(4))
os.environ["VLLM_FLASH_ATTN_VERSION"] = "4"
print("VLLM_FLASH_ATTN_VERSION=4 ->", vfa.get_flash_attn_version())
del os.environ["VLLM_FLASH_ATTN_VERSION"]
dev, dt, H, KVH, D = "cuda", torch.bfloat16, 16, 4, 128
torch.manual_seed(0)

def ref_attn(q, k, v, causal):  # q (s, H, d), k/v (sk, KVH, d), bottom-right causal
    q, k, v = (x.float().transpose(0, 1) for x in (q, k, v))
    k = k.repeat_interleave(H // KVH, 0); v = v.repeat_interleave(H // KVH, 0)
    sq, sk = q.shape[1], k.shape[1]
    mask = None
    if causal:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(0, 1)

def err(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()

results = []
def timed(fn):
    torch.cuda.synchronize(); t = time.perf_counter(); out = fn(); torch.cuda.synchronize()
    return out, time.perf_counter() - t

def varlen_case(name, lens, causal):
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=dev)
    T = int(cu[-1]); q = torch.randn(T, H, D, device=dev, dtype=dt)
    k = torch.randn(T, KVH, D, device=dev, dtype=dt); v = torch.randn(T, KVH, D, device=dev, dtype=dt) + 0.5
    call = lambda: vfa.flash_attn_varlen_func(q, k, v, max(lens), cu, max(lens), cu_seqlens_k=cu, causal=causal, fa_version=4)
    out, first = timed(call)
    _, warm = timed(call)
    ref = torch.cat([ref_attn(q[cu[i]:cu[i+1]], k[cu[i]:cu[i+1]], v[cu[i]:cu[i+1]], causal) for i in range(len(lens))])
    results.append({"case": name, "error": err(out, ref), "first_call_s": first, "warm_s": warm})

def paged_decode(name, seqs, ctx, page):
    nblk = seqs * ctx // page
    kc = torch.randn(nblk, page, KVH, D, device=dev, dtype=dt); vc = torch.randn(nblk, page, KVH, D, device=dev, dtype=dt) + 0.5
    bt = torch.randperm(nblk, device=dev, dtype=torch.int32).view(seqs, ctx // page)
    q = torch.randn(seqs, H, D, device=dev, dtype=dt)
    cu = torch.arange(seqs + 1, device=dev, dtype=torch.int32)
    used = torch.full((seqs,), ctx, device=dev, dtype=torch.int32)
    call = lambda: vfa.flash_attn_varlen_func(q, kc, vc, 1, cu, ctx, seqused_k=used, block_table=bt, causal=True, fa_version=4)
    out, first = timed(call)
    _, warm = timed(call)
    for _ in range(3): call()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20): call()
    torch.cuda.synchronize(); per = (time.perf_counter() - t) / 20
    refs = []
    for i in range(seqs):
        kk = kc[bt[i].long()].reshape(-1, KVH, D); vv = vc[bt[i].long()].reshape(-1, KVH, D)
        refs.append(ref_attn(q[i:i+1], kk, vv, True))
    results.append({"case": name, "error": err(out, torch.cat(refs)), "first_call_s": first, "warm_s": warm, "per_call_us": per * 1e6})

for name, fn in [("varlen causal (100, 513, 1024)", lambda: varlen_case("varlen causal (100, 513, 1024)", [100, 513, 1024], True)),
                 ("fixed 2x1000 full", lambda: varlen_case("fixed 2x1000 full", [1000, 1000], False)),
                 ("paged decode 8x4096 page 128", lambda: paged_decode("paged decode 8x4096 page 128", 8, 4096, 128))]:
    try:
        fn()
    except Exception as exc:  # report, go on
        results.append({"case": name, "failed": f"{type(exc).__name__}: {exc}"[:600]})
    print(json.dumps(results[-1]))
# refusals before any kernel
q = torch.randn(4, H, D, device=dev, dtype=dt); cu = torch.tensor([0, 4], dtype=torch.int32, device=dev)
for what, kw in [("alibi", {"alibi_slopes": torch.ones(H, device=dev)}), ("dropout", {"dropout_p": 0.1})]:
    try:
        vfa.flash_attn_varlen_func(q, q[:, :KVH], q[:, :KVH], 4, cu, 4, cu_seqlens_k=cu, fa_version=4, **kw)
        print("refusal", what, ": NOT refused")
    except Exception as exc:
        print("refusal", what, ":", type(exc).__name__, str(exc)[:200])
with open(os.path.join(os.environ.get("OUT", "/tmp"), "fa4_results.json"), "w") as f:
    json.dump(results, f, indent=1)
