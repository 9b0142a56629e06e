"""vLLM's call signatures are declared once (vendored_flash_attn/call/arguments.py): the declaration is
upstream's, the public functions have exactly its signatures, the call object carries every
argument by name, and a parameter added to a table reaches the function and its call object
with nothing else changed."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest

import vendored_flash_attn
from vendored_flash_attn.call import arguments as declared

ROOT = Path(__file__).resolve().parents[2]

# Upstream's signatures at the pin (vllm_flash_attn/flash_attn_interface.py, 617264c1): each
# parameter's name, kind and default as upstream's source writes it (None: required). Written
# out because upstream's file is not part of this repository;
# test_the_data_is_upstreams_file holds it to the file where a checkout carries it
# (.upstream-tests/flash_attn_interface.py, as tests/gpu/serving_h200.sh says how).
P, K = "positional_or_keyword", "keyword_only"
_OPTIONS = [("dropout_p", P, "0.0"), ("softmax_scale", P, "None"), ("causal", P, "False"),
            ("softcap", P, "0.0"), ("alibi_slopes", P, "None"), ("deterministic", P, "False"),
            ("return_attn_probs", P, "False"), ("return_softmax_lse", K, "False"), ("out", K, "None")]
_INDEXES = [(n, P, None) for n in ("block_count", "block_offset", "column_count", "column_index")]
UPSTREAM = {
    "flash_attn_varlen_func": [
        ("q", P, None), ("k", P, None), ("v", P, None), ("max_seqlen_q", P, None), ("cu_seqlens_q", P, None),
        ("max_seqlen_k", P, None), ("cu_seqlens_k", P, "None"), ("seqused_k", P, "None"), ("q_v", P, "None"),
        ("dropout_p", P, "0.0"), ("softmax_scale", P, "None"), ("causal", P, "False"),
        ("window_size", P, "None"), ("softcap", P, "0.0"), ("alibi_slopes", P, "None"),
        ("deterministic", P, "False"), ("return_attn_probs", P, "False"), ("block_table", P, "None"),
        ("return_softmax_lse", P, "False"), ("out", P, "None"), ("scheduler_metadata", P, "None"),
        ("q_descale", P, "None"), ("k_descale", P, "None"), ("v_descale", P, "None"), ("num_splits", P, "0"),
        ("fa_version", P, "DEFAULT_FA_VERSION"), ("s_aux", P, "None"), ("cp_world_size", P, "1"),
        ("cp_rank", P, "0"), ("cp_tot_seqused_k", P, "None")],
    "sparse_attn_func": [("q", P, None), ("k", P, None), ("v", P, None)] + _INDEXES + _OPTIONS,
    "sparse_attn_varlen_func": [("q", P, None), ("k", P, None), ("v", P, None)] + _INDEXES + [
        ("cu_seqlens_q", P, None), ("cu_seqlens_k", P, None), ("max_seqlen_q", P, None),
        ("max_seqlen_k", P, None)] + _OPTIONS,
    "get_scheduler_metadata": [
        ("batch_size", P, None), ("max_seqlen_q", P, None), ("max_seqlen_k", P, None), ("num_heads_q", P, None),
        ("num_heads_kv", P, None), ("headdim", P, None), ("cache_seqlens", P, None),
        ("qkv_dtype", P, "torch.bfloat16"), ("headdim_v", P, "None"), ("cu_seqlens_q", P, "None"),
        ("cu_seqlens_k_new", P, "None"), ("cache_leftpad", P, "None"), ("page_size", P, "None"),
        ("max_seqlen_k_new", P, "0"), ("causal", P, "False"), ("window_size", P, "(-1, -1)"),
        ("has_softcap", P, "False"), ("num_splits", P, "0"), ("pack_gqa", P, "None"), ("sm_margin", P, "0")],
}
# Where this package differs on purpose: fa_version=None asks the selector (docs/runtime.md).
DIFFERENCES = {("flash_attn_varlen_func", "fa_version"): "None"}


def _as_data(name: str, signature: inspect.Signature) -> list[tuple]:
    kinds = {inspect.Parameter.POSITIONAL_OR_KEYWORD: P, inspect.Parameter.KEYWORD_ONLY: K}
    return [(p.name, kinds[p.kind],
             None if p.default is inspect.Parameter.empty else repr(p.default)) for p in signature.parameters.values()]


def _upstream_with_our_differences(name: str) -> list[tuple]:
    return [(n, kind, DIFFERENCES.get((name, n), default)) for n, kind, default in UPSTREAM[name]]


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_the_declaration_is_upstreams_signature(name):
    assert _as_data(name, declared.DECLARED[name].signature()) == _upstream_with_our_differences(name)


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_the_public_functions_have_the_declared_signature(name):
    public = getattr(vendored_flash_attn, name)
    assert inspect.signature(public) == declared.DECLARED[name].signature()
    assert _as_data(name, inspect.signature(public)) == _upstream_with_our_differences(name)
    assert public.__name__ == name and public.__doc__


def test_the_annotations_are_upstreams_where_it_writes_them():
    params = inspect.signature(vendored_flash_attn.flash_attn_varlen_func).parameters
    assert str(params["window_size"].annotation) == "typing.Optional[typing.List[int]]"
    assert params["num_splits"].annotation is int
    assert str(params["fa_version"].annotation) == "typing.Optional[int]"  # upstream: int (its default is 2)


def _upstream_signatures(source: bytes) -> dict[str, list[tuple]]:
    """The signatures of upstream's file, read with ast (nothing of it is executed)."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in UPSTREAM:
            args = node.args
            positional = [None] * (len(args.args) - len(args.defaults)) + [ast.unparse(d) for d in args.defaults]
            found[node.name] = ([(a.arg, P, d) for a, d in zip(args.args, positional)]
                                + [(a.arg, K, None if d is None else ast.unparse(d))
                                   for a, d in zip(args.kwonlyargs, args.kw_defaults)])
    return found


def test_the_data_is_upstreams_file():
    """UPSTREAM against upstream's own file at the pin, where the checkout carries it (its git
    blob checked first: benchmarks/upstream_interface.py)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import upstream_interface
    finally:
        sys.path.pop(0)
    if not upstream_interface.CARRIED.is_file():
        pytest.skip(f"upstream's file is not carried ({upstream_interface.CARRIED.relative_to(ROOT)}); "
                    "tests/gpu/serving_h200.sh says how to write it")
    source, info = upstream_interface.read_source(upstream_interface.CARRIED)
    assert info["matches_pin"]
    assert _upstream_signatures(source) == UPSTREAM


def test_the_ast_reader_sees_what_it_must():
    """The reader test_the_data_is_upstreams_file relies on: names, kinds and defaults as written."""
    source = b"def sparse_attn_func(q, k=None, *, out=None, flag: bool = DEFAULT):\n    pass\n"
    assert _upstream_signatures(source) == {
        "sparse_attn_func": [("q", P, None), ("k", P, "None"), ("out", K, "None"), ("flag", K, "DEFAULT")]}


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_the_call_object_holds_every_argument_by_its_name(name):
    spec = declared.DECLARED[name]
    seen = []
    function = spec.function(seen.append, __name__, "doc")
    args = {p.name: object() for p in spec.parameters}  # a distinct value per parameter
    positional = [args[p.name] for p in spec.parameters if not p.keyword_only]
    function(*positional, **{p.name: args[p.name] for p in spec.parameters if p.keyword_only})
    (call,) = seen
    assert isinstance(call, spec.call_type)
    assert {n: getattr(call, n) for n in spec.names} == args
    # defaults: only the required parameters given
    seen.clear()
    function(*(args[p.name] for p in spec.parameters if p.default is declared.EMPTY))
    assert all(getattr(seen[0], p.name) == p.default for p in spec.parameters if p.default is not declared.EMPTY)


def test_the_call_object_is_built_like_its_function_and_copied_with_changes():
    import dataclasses

    call = declared.VarlenCall(1, 2, 3, 4, 5, 6, block_table=7)
    assert (call.q, call.block_table, call.num_splits, call.fa_version) == (1, 7, 0, None)
    changed = dataclasses.replace(call, num_splits=2)
    assert (changed.num_splits, call.num_splits, changed.block_table) == (2, 0, 7)
    with pytest.raises(TypeError):
        declared.VarlenCall(1, 2, 3, 4, 5, 6, not_a_parameter=1)


def test_a_parameter_added_to_a_table_reaches_the_function_and_its_call_object():
    """What upstream adding a parameter takes here: one entry in the table."""
    grown = declared.Declared("flash_attn_varlen_func", declared.VARLEN.parameters + (
        declared.Parameter("new_option", 3),), "GrownCall", "doc")
    seen = []
    function = grown.function(seen.append, __name__, "doc")
    assert list(inspect.signature(function).parameters)[-1] == "new_option"
    function(1, 2, 3, 4, 5, 6, new_option=9)
    assert seen[0].new_option == 9 and seen[0].cp_tot_seqused_k is None


@pytest.mark.parametrize("parameters, message", [
    ((declared.Parameter("q"), declared.Parameter("q")), "distinct identifiers"),
    ((declared.Parameter("q"), declared.Parameter("class")), "distinct identifiers"),
    ((declared.Parameter("q", None), declared.Parameter("k")), "a required parameter follows"),
])
def test_a_malformed_table_is_refused(parameters, message):
    with pytest.raises(ValueError, match=message):
        declared.Declared("f", parameters, "FCall", "doc")


def test_the_quick_path_gets_the_arguments_it_names_and_its_answer_stands():
    """With a quick path, the generated function first hands it the arguments it names (in its
    order, whatever the table's); its result is returned, and only None (declined) builds the
    call object for the dispatcher."""
    seen, dispatched = [], []
    answer = []

    def quick(v, fa_version, q):
        seen.append((v, fa_version, q))
        return answer[0]

    function = declared.VARLEN.function(dispatched.append, __name__, "doc", quick=quick)
    answer.append("quick's result")
    assert function(1, 2, 3, 4, 5, 6, fa_version=9) == "quick's result"
    assert seen == [(3, 9, 1)] and dispatched == []
    answer[0] = None
    function(1, 2, 3, 4, 5, 6, fa_version=9)
    assert seen[-1] == (3, 9, 1) and [(c.q, c.v, c.fa_version) for c in dispatched] == [(1, 3, 9)]
    assert inspect.signature(function) == declared.VARLEN.signature()


def _quick_writing(body: str):
    """A quick path of this source (a function of a file, as with_launch reads it)."""
    import importlib.util
    import tempfile

    parameters = ", ".join(n for n in declared.LAUNCH if n not in declared.LAUNCH_COMPUTED)
    folder = Path(tempfile.mkdtemp())
    (folder / "quick_source.py").write_text(
        f"from vendored_flash_attn.call.arguments import launch\n\n\ndef quick(resolved, {parameters}):\n{body}",
        encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"quick_source_{abs(hash(body))}", folder / "quick_source.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.quick


_COMPUTED = "softmax_scale=0.5, window_left=-1, window_right=-1, softcap=0.0, fp8=False"


def test_with_launch_writes_the_contracts_call():
    """The quick path's launch(resolved, <computed>=...) becomes resolved.launch(resolved,
    <LAUNCH in order>): the computed arguments as named, the rest the function's own."""
    quick = declared.with_launch(_quick_writing(f"    return launch(resolved, {_COMPUTED})\n"))
    got = []

    class Resolved:
        def launch(self, *args):
            got.append(args)
            return "result"

    resolved = Resolved()
    passed = [n for n in declared.LAUNCH if n not in declared.LAUNCH_COMPUTED]
    assert quick(resolved, *passed) == "result"
    computed = dict(softmax_scale=0.5, window_left=-1, window_right=-1, softcap=0.0, fp8=False)
    assert got == [(resolved, *(computed[n] if n in computed else n for n in declared.LAUNCH))]


@pytest.mark.parametrize("body, message", [
    ("    return launch(resolved, softmax_scale=0.5)\n", "must name each of"),
    (f"    launch(resolved, {_COMPUTED})\n    return launch(resolved, {_COMPUTED})\n", "exactly one"),
    (f"    q = None\n    return launch(resolved, {_COMPUTED})\n", r"rebound \['q'\]"),
    (f"    return launch(resolved, {_COMPUTED}, q=1)\n", "must name each of"),
])
def test_with_launch_refuses_a_quick_path_it_cannot_write_out(body, message):
    with pytest.raises(ValueError, match=message):
        declared.with_launch(_quick_writing(body))


@pytest.mark.parametrize("quick, wrong", [
    (lambda q, not_a_parameter: None, "not_a_parameter"),
    (lambda q, k=None: None, "k"),
    (lambda q, *, k: None, "k"),
    (lambda q, **rest: None, "rest"),
])
def test_a_quick_path_of_other_parameters_is_refused(quick, wrong):
    with pytest.raises(ValueError, match=rf"quick path's parameters must be declared parameters.*'{wrong}'"):
        declared.VARLEN.function(print, __name__, "doc", quick=quick)


def test_every_adapters_launch_takes_the_launch_contract():
    """What the generated function's quick path and launch_arguments call: every declared
    family's adapter has a launch whose parameters are call.LAUNCH, after ``resolved``, in
    order; and no other function of an adapter's module takes the contract's arguments (a
    second, hand-written copy of the list)."""
    import importlib

    from vendored_flash_attn.declaration.families import registry

    for family in registry():
        launch = family.adapter_function().launch
        assert list(inspect.signature(launch).parameters) == ["resolved", *declared.LAUNCH], family.name
        module = importlib.import_module(family.adapter.partition(":")[0])
        for name, value in vars(module).items():
            if inspect.isfunction(value) and value.__module__ == module.__name__ and value is not launch:
                taken = set(inspect.signature(value).parameters) & set(declared.LAUNCH)
                assert len(taken) < len(declared.LAUNCH) // 2, f"{module.__name__}.{name} takes {sorted(taken)}"


def test_launch_arguments_are_the_calls_in_the_contracts_order():
    values = {p.name: object() for p in declared.VARLEN.parameters}
    numbers = dict(max_seqlen_q=11, max_seqlen_k=12, softmax_scale=0.5, causal=1, softcap=3, num_splits=4,
                   return_softmax_lse=0, cp_world_size=5, cp_rank=6)
    call = declared.VarlenCall(**{**values, **numbers})
    got = dict(zip(declared.LAUNCH, declared.launch_arguments(call, (7, 8), "fp8?")))
    assert len(got) == len(declared.LAUNCH) == len(declared.launch_arguments(call, (7, 8), "fp8?"))
    # typed as the kernels take them
    assert (got["causal"], got["softcap"], got["return_softmax_lse"]) == (True, 3.0, False)
    assert type(got["softcap"]) is float and type(got["softmax_scale"]) is float
    assert (got["window_left"], got["window_right"], got["fp8"]) == (7, 8, "fp8?")
    for name in set(declared.LAUNCH) & set(values):
        assert got[name] == numbers.get(name, values[name]), name


def test_the_interface_names_no_adapter():
    """interface.py reaches every family's code through the declaration (its ``adapter``), never
    by importing an adapter module by name: get_scheduler_metadata goes to the family declaring
    scheduler_metadata."""
    from vendored_flash_attn.declaration.families import registry

    adapters = {f.adapter.partition(":")[0] for f in registry()}
    tree = ast.parse((ROOT / "python" / "vendored_flash_attn" / "interface.py").read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = f"vendored_flash_attn.{node.module}" if node.level else node.module
            imported |= {module, *(f"{module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
    assert adapters and not adapters & imported, adapters & imported


def _launch_calls():
    """Calls the quick path takes, each launch argument distinct where the call sets it: an
    asymmetric window, a scale, a softcap, split counts, out=, descales, LSE asked or not."""
    import torch
    from calls import descales, paged_call, varlen_call

    out = torch.empty(6, 8, 128, dtype=torch.bfloat16)
    return [
        dict(varlen_call(), causal=False, window_size=(63, 5), softcap=2.5, softmax_scale=0.25,
             return_softmax_lse=True),
        dict(paged_call(), causal=True, softcap=0, window_size=[-1, -1], num_splits=3, max_seqlen_q=1, out=out,
             **descales()),
        dict(paged_call(kv_heads=1), causal=True, softmax_scale=0.3),
        dict(varlen_call(d=64), causal=True, softcap=1),
        dict(paged_call(torch.float8_e4m3fn), causal=True, window_size=(7, 0), out=out, **descales()),
    ]


@pytest.mark.parametrize("version", [2, 3, 4])
def test_the_quick_paths_launch_is_the_full_paths(describe, fake_ops, monkeypatch, version):
    """Each call twice, its adapter's launch replaced by a recorder: the first on the full path
    (the call object, the shared checks, forward -> launch(*launch_arguments(...))), the second
    on the quick path (the generated function's launch with the quick path's answer). The
    launch sees the same argument under each of LAUNCH's names, of the same type: a launch
    argument swapped, dropped or typed differently on either side fails it."""
    import importlib

    from runtime_fakes import FA4_RECORD, HOPPER, make_build
    from vendored_flash_attn import interface
    from vendored_flash_attn.declaration.families import registry
    from vendored_flash_attn.errors import FlashAttnInputError
    from vendored_flash_attn.declaration.kernels import dtype_name

    describe(caps=(HOPPER,), build=make_build("full", fa4=FA4_RECORD))
    family = registry()[version]
    module = importlib.import_module(family.adapter.partition(":")[0])
    seen = []

    def recorder(resolved, *args):
        assert len(args) == len(declared.LAUNCH)
        seen.append(dict(zip(declared.LAUNCH, args)))
        return args[0], "lse"

    monkeypatch.setattr(module, "launch", recorder)
    monkeypatch.setattr(module.forward, "launch", recorder)
    full = []
    real = interface.check_varlen_call
    monkeypatch.setattr(interface, "check_varlen_call", lambda *a, **k: full.append(a) or real(*a, **k))
    compared = 0
    for call in _launch_calls():
        if dtype_name(call["q"].dtype) not in family.dtypes:
            continue
        seen.clear()
        full.clear()
        try:  # what the family does not take (FA2: no split-KV) the full path refuses: not a launch
            results = [vendored_flash_attn.flash_attn_varlen_func(**call, fa_version=version)]
        except FlashAttnInputError:
            continue
        results.append(vendored_flash_attn.flash_attn_varlen_func(**call, fa_version=version))
        assert len(full) == 1, "the second call did not take the quick path"
        first, second = seen
        differ = [n for n in declared.LAUNCH if not (
            first[n] is second[n] if first[n] is None or hasattr(first[n], "shape")
            else (type(first[n]), first[n]) == (type(second[n]), second[n]))]
        assert differ == [], {n: (first[n], second[n]) for n in differ}
        assert type(results[0]) is type(results[1])
        compared += 1
    assert compared >= 3



def test_with_launch_writes_named_tuples_out_as_plain_tuples():
    """``tuples``: a named tuple built by field name becomes the plain tuple of its values in
    the fields' order (equal to the named tuple and hashed alike); a field missing, repeated
    or unknown is refused."""
    from typing import NamedTuple

    class Key(NamedTuple):
        a: int
        b: int

    body = f"    return Key(b=q, a=k), launch(resolved, {_COMPUTED})\n"
    quick = declared.with_launch(_quick_writing(body), tuples={"Key": Key._fields})

    class Resolved:
        def launch(self, *args):
            return None

    passed = [n for n in declared.LAUNCH if n not in declared.LAUNCH_COMPUTED]
    key, _ = quick(Resolved(), *passed)
    assert type(key) is tuple and key == Key(a="k", b="q") and hash(key) == hash(Key(a="k", b="q"))
    for wrong in ("Key(a=q)", "Key(a=q, b=k, c=v)", "Key(q, b=k)"):
        with pytest.raises(ValueError, match="must name each of its fields"):
            declared.with_launch(_quick_writing(f"    return {wrong}, launch(resolved, {_COMPUTED})\n"),
                                 tuples={"Key": Key._fields})


def test_a_with_launch_quick_path_runs_inline_in_the_public_function():
    """The public function runs a with_launch quick path's code itself (no call of it, one frame
    fewer on every quick call): its result returns from the public function, its ``return None``
    goes on to the call object and the dispatcher, and the caller's arguments reach both as
    given."""
    import importlib.util
    import tempfile

    parameters = ", ".join(n for n in declared.LAUNCH if n not in declared.LAUNCH_COMPUTED)
    folder = Path(tempfile.mkdtemp())
    (folder / "inline_source.py").write_text(f"""from vendored_flash_attn.call.arguments import launch

SEEN = []


class Resolved:
    def launch(self, *args):
        SEEN.append(args)
        return ("out", "lse")


RESOLVED = Resolved()


def quick({parameters}):
    \"\"\"Declines q == 'decline'.\"\"\"
    if q == "decline":
        return None
    result = launch(RESOLVED, {_COMPUTED})
    return result[0]
""", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("inline_source", folder / "inline_source.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dispatched = []
    function = declared.VARLEN.function(dispatched.append, __name__, "doc",
                                        quick=declared.with_launch(module.quick))
    assert "quick" not in function.__code__.co_names and "launch" in function.__code__.co_names
    assert inspect.signature(function) == declared.VARLEN.signature()
    assert function("q", "k", "v", 1, "cu", 2) == "out" and dispatched == []
    (args,) = module.SEEN
    assert args[1:4] == ("q", "k", "v") and args[declared.LAUNCH.index("max_seqlen_q") + 1] == 1
    assert function("decline", "k", "v", 1, "cu", 2, softcap=3) is None
    (call,) = dispatched
    assert (call.q, call.cu_seqlens_q, call.softcap, call.num_splits) == ("decline", "cu", 3, 0)
