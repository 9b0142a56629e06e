"""Quick equals full: a seeded corpus of calls (random strides, size-1 dimensions included,
dtypes, devices, shapes and every optional argument) through the interface's quick path
(interface._quick) and, its resolutions cleared, the full path (the shared checks): a call the
quick path takes must be one the full path takes, with the same launch. The devices are those
of a tensor stand-in (``Placed``: a tensor that says it lives on the device it is given), on a
described CUDA machine of two GPUs, so that CUDA indexes and other indexed device types
(``xpu:0`` beside ``cuda:0``) meet as they would on a real one."""

from __future__ import annotations

import random

import torch

from runtime_fakes import HOPPER
from vendored_flash_attn import flash_attn_varlen_func, interface
from vendored_flash_attn.errors import FlashAttnInputError, FlashAttnUnavailableError

SEED, CALLS = 20261206, 600
_DEVICE_PROPERTIES = {"device", "is_cuda", "is_cpu", "is_meta", "is_xpu"}


class Placed(torch.Tensor):
    """A CPU tensor that answers ``device``, ``get_device()``, ``is_cuda`` and ``is_cpu`` as a
    tensor of ``device`` would; everything else is the CPU tensor's."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, device: str):
        tensor = torch.Tensor._make_subclass(cls, data)
        tensor.place = torch.device(device)
        return tensor

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        this = args[0] if args else None
        place = getattr(this, "place", None) if isinstance(this, Placed) else None
        if place is not None:
            owner = getattr(func, "__self__", None)
            name = getattr(owner, "__name__", None) if getattr(func, "__name__", "") == "__get__" else None
            if name in _DEVICE_PROPERTIES:
                return place if name == "device" else place.type == name[3:]
            if func is torch.Tensor.get_device:
                return -1 if place.type == "cpu" else place.index
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **(kwargs or {}))
        # what a method of a placed tensor makes (a contiguous copy) is on its device too
        if place is not None and type(result) is torch.Tensor:
            return Placed(result, str(place))
        return result


def _layout(rng: random.Random, data: torch.Tensor, p: float = 0.05) -> torch.Tensor:
    """``data``'s values in a random memory layout, with probability ``p``: every dimension
    strided, odd strides on its size-1 dimensions, or a broadcast first dimension."""
    if rng.random() >= p or data.dim() == 0:
        return data
    choice = rng.random()
    if choice < 0.3:
        choice = 0.0
    shape = tuple(data.shape)
    if choice < 0.3 or (choice < 0.9 and 1 not in shape):  # every dimension strided by 2, the last included
        wide = torch.zeros([2 * n for n in shape], dtype=data.dtype)
        view = wide[tuple(slice(None, None, 2) for _ in shape)]
        view.copy_(data)
        return view
    if choice < 0.9 and 1 in shape:  # size-1 dimensions get strides contiguity would not give
        strides = list(data.contiguous().stride())
        strides = [rng.choice((3, 7, 64)) if n == 1 else s for n, s in zip(shape, strides)]
        storage = torch.zeros(sum((n - 1) * s for n, s in zip(shape, strides)) + 1, dtype=data.dtype)
        view = storage.as_strided(shape, strides)
        view.copy_(data)
        return view
    return data[:1].expand(shape) if shape[0] > 0 else data  # stride 0 on the first dimension


def _index(values, rng: random.Random, p: float = 0.05) -> torch.Tensor:
    tensor = torch.tensor(values, dtype=torch.int32)
    if rng.random() < 0.02:
        tensor = tensor.long()
    return _layout(rng, tensor, p)


def _sometimes(rng: random.Random, p: float, value, otherwise=None):
    return value if rng.random() < p else otherwise


def _corpus(seed: int = SEED, count: int = CALLS):
    """(label, call keywords, device of each tensor) for ``count`` random calls."""
    rng = random.Random(seed)
    for number in range(count):
        torch.manual_seed(number)
        paged = rng.random() < 0.5
        # Half the calls wild (anything may be off), half tame (mostly valid, so that the quick
        # path is asked about many calls it could take).
        wild = rng.random() < 0.5
        batch = rng.choice((1, 1, 2, 3))
        heads, kv_heads = rng.choice(((8, 2), (8, 8), (8, 1), (8, 2)) + (((6, 4),) if wild else ()))
        d = rng.choice((128, 128, 64, 192))
        dv = d if rng.random() < 0.8 else rng.choice((128, 64))
        dtype = rng.choice((torch.bfloat16,) * 5 + (torch.float16, torch.float8_e4m3fn) + ((torch.float32,) if wild else ()))
        odd = 0.05 if wild else 0.15  # how often a tensor gets an odd layout
        q_lens = [rng.choice((1, 2, 3) + ((0,) if wild else ())) for _ in range(batch)]
        if rng.random() < 0.15:  # no query tokens at all: zero-size tensors, "contiguous" whatever their strides
            q_lens = [0] * batch
        total_q = sum(q_lens)
        cu_q = [0]
        for n in q_lens:
            cu_q.append(cu_q[-1] + n)
        if rng.random() < 0.05:
            cu_q = cu_q[:-1] or [0]
        call = dict(max_seqlen_q=max(q_lens), cu_seqlens_q=_index(cu_q, rng))  # total_q may be 0

        def make(*shape, kind=dtype, p=None):
            return _layout(rng, torch.randn(*shape).to(kind), odd if p is None else p)

        call["q"] = make(total_q, heads, d)
        kv_dtype = dtype if rng.random() < (0.9 if wild else 0.98) else rng.choice((torch.float16, torch.float8_e4m3fn))
        if paged:
            block_size = rng.choice((16, 16, 32, 12))
            columns = rng.choice((1, 1, 1, 2, 3))  # one column: a size-1 last dimension
            num_blocks = batch * columns + 1
            call["k"] = make(num_blocks, block_size, kv_heads, d, kind=kv_dtype)
            call["v"] = make(num_blocks, block_size, kv_heads, dv, kind=kv_dtype)
            rows = batch if rng.random() < 0.95 else batch + 1
            call["block_table"] = _index([[r * columns + c for c in range(columns)] for r in range(rows)], rng, p=0.4)
            used = [rng.randint(1, block_size * columns) for _ in range(batch)]
            call["seqused_k"] = _index(used if rng.random() < 0.95 else used + [1], rng)
            call["max_seqlen_k"] = max(used)
            if rng.random() < 0.05:
                call["cu_seqlens_k"] = _index(cu_q, rng)
        else:
            k_lens = [rng.randint(1, 6) for _ in range(batch)] if rng.random() < 0.85 else [0] * batch
            cu_k = [0]
            for n in k_lens:
                cu_k.append(cu_k[-1] + n)
            empty = None if cu_k[-1] else 0.5  # a K/V of no elements: its strides are anything
            call["k"] = make(cu_k[-1], kv_heads, d, kind=kv_dtype, p=empty)
            call["v"] = make(cu_k[-1], kv_heads, dv, kind=kv_dtype, p=empty)
            call["cu_seqlens_k"] = _index(cu_k if rng.random() < 0.95 else cu_k[:-1], rng)
            call["max_seqlen_k"] = max(k_lens)
            if rng.random() < 0.05 and max(k_lens):
                call["seqused_k"] = _index(k_lens, rng)
        out_dtype = torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype

        def pick(usual, *others, p=0.9):
            """``usual`` mostly (a call must often be valid to test the quick path), else one of ``others``."""
            return usual if rng.random() < (p if wild else max(p, 0.95)) or not others else rng.choice(others)

        options = dict(
            causal=pick(True, False, 1, p=0.6),
            softmax_scale=pick(None, 0.125, 1, p=0.7),
            window_size=pick(None, (-1, -1), [63, 0], (5, 3), (-1, -1), (2.0, 0), (1, 2, 3), p=0.6),
            softcap=pick(0.0, 0, 2.5, -1.0, True, p=0.6),
            num_splits=pick(0, 1, 3, 300, -1, True, p=0.6),
            return_softmax_lse=pick(False, True, 0, p=0.7),
            dropout_p=pick(0.0, 0, 0.1),
            out=pick(None, make(total_q, heads, dv, kind=out_dtype), p=0.5),
            scheduler_metadata=pick(None, _index(list(range(5)), rng), _index([[1, 2]], rng),
                                    _layout(rng, torch.zeros(5, dtype=torch.int64))),
            q_v=pick(None, make(total_q, heads, dv), p=0.97),
            alibi_slopes=pick(None, make(heads, kind=torch.float32), p=0.97),
            s_aux=pick(None, make(heads, kind=torch.bfloat16), p=0.97),
            cp_world_size=pick(1, 2, True, p=0.95),
            cp_rank=pick(0, 1, p=0.95),
            cp_tot_seqused_k=pick(None, _index([1] * batch, rng), p=0.97),
            fa_version=rng.choice((2, 3, 3, None, None, 4)),
        )
        if wild and rng.random() < 0.2:  # an out= of another dtype or shape
            options["out"] = rng.choice((make(total_q, heads, dv, kind=torch.float32),
                                         make(total_q + 1, heads, dv, kind=out_dtype)))
        if rng.random() < 0.05:
            call["max_seqlen_q"] = rng.choice((float(call["max_seqlen_q"]), -1, torch.tensor(1)))
        descale = pick(None, make(batch, kv_heads, kind=torch.float32), p=0.5)
        for name in ("q_descale", "k_descale", "v_descale"):
            options[name] = pick(descale, None, make(batch + 1, kv_heads, kind=torch.float32),
                                 make(batch, kv_heads, kind=torch.float16))
        call.update({name: value for name, value in options.items() if value is not None or rng.random() < 0.5})
        devices = {}
        for name, value in call.items():
            if isinstance(value, torch.Tensor):
                where = "cuda:0" if rng.random() < 0.97 else rng.choice(("cuda:1", "xpu:0", "cpu"))
                devices[name] = where
                call[name] = Placed(value, where)
        yield f"{number}", call, devices


class _Declined(Exception):
    """The public function's quick path declined (its full path, swapped for this, raised it)."""


def _refuse_the_full_path(call):
    raise _Declined


def test_the_quick_path_takes_only_what_the_full_path_takes(describe, fake_ops, fa4_kernels, monkeypatch):
    """Each call of the corpus through the full path with no kind resolved (interface._dispatch
    on its call object: it resolves the kind, checks the call, launches it or refuses it), then
    through the public function's quick path (the function itself, its kind now resolved, with
    its full path swapped for one that says it was reached). Where the quick path takes a call,
    the full path must have taken it too, with the same op call; the quick path never refuses
    (it takes or declines)."""
    from runtime_fakes import FA4_RECORD, make_build
    from vendored_flash_attn.families.fa4 import adapter as fa4
    from vendored_flash_attn.call.arguments import VarlenCall

    describe(caps=(HOPPER, HOPPER), build=make_build("full", fa4=FA4_RECORD), device_type="cuda")
    monkeypatch.setattr(interface, "_Tensor", Placed)  # the stand-in is what q is here
    public = flash_attn_varlen_func
    # the full path the generated function declines to (its closure's _dispatch), swapped
    monkeypatch.setattr(public.__closure__[public.__code__.co_freevars.index("_dispatch")], "cell_contents",
                        _refuse_the_full_path)
    refusals = (FlashAttnInputError, FlashAttnUnavailableError, fa4.FA4Unsupported)
    taken = {"both": 0, "full only": 0, "neither": 0}
    diverged = []
    reasons = {}
    for label, call, devices in _corpus():
        interface._resolved.clear()
        arguments = VarlenCall(**call)
        before = (len(fake_ops.calls), len(fa4_kernels))
        try:
            interface._dispatch(arguments)
            full_took, full = True, (fake_ops.calls[-1] if len(fake_ops.calls) > before[0] else None)
        except refusals as exc:
            full_took, full = False, exc
            reasons[str(exc)[:50]] = reasons.get(str(exc)[:50], 0) + 1
        before = (len(fake_ops.calls), len(fa4_kernels))
        try:
            public(**call)
            quick_took = True
        except _Declined:
            quick_took = False
        except fa4.FA4Unsupported as exc:  # FA4's adapter refused what the quick path handed it
            if full_took or (type(full), str(full)) != (type(exc), str(exc)):
                diverged.append(f"{label}: FA4 refused on the quick path ({exc!r}), the full path said {full!r}")
            taken["neither"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - whatever it is, the quick path must not raise it
            diverged.append(f"{label}: the quick path raised {exc!r}; it only takes or declines")
            continue
        if quick_took and not full_took:
            diverged.append(f"{label}: the quick path took a call the full path refuses ({full!r}); "
                            f"devices {devices}, layouts {_strides(call)}")
        elif quick_took and full is not None:
            name, quick = fake_ops.calls[-1]
            differ = [n for n in quick if not (quick[n] is full[1][n] if isinstance(quick[n], torch.Tensor)
                                                or quick[n] is None else quick[n] == full[1][n])]
            if name != full[0] or differ:
                diverged.append(f"{label}: the quick path called {name} with other {differ} than the full path")
        taken["both" if quick_took else "full only" if full_took else "neither"] += 1
    assert diverged == [], "\n".join(diverged[:10])
    # The corpus reaches both paths and both verdicts (else it proves nothing).
    assert taken["both"] >= 30 and taken["full only"] >= 20 and taken["neither"] >= 100, (taken, sorted(reasons.items(), key=lambda x: -x[1])[:15])


def _strides(call: dict) -> dict:
    return {n: (tuple(v.shape), v.stride()) for n, v in call.items() if isinstance(v, torch.Tensor)}
