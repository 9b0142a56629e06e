"""vLLM's attention calls, declared once: the parameters of upstream's
``vllm_flash_attn/flash_attn_interface.py`` functions (names, order, defaults, keyword-only
ones) as one table each, and from each table the two things the package uses:

* the **call object** (``VarlenCall``, ``SparseCall``, ``SparseVarlenCall``,
  ``SchedulerMetadataCall``): a dataclass of every argument of one call, by parameter name.
  The interface hands it to a family's adapter (fa2.py, fa3.py, fa4/adapter.py; for
  ``get_scheduler_metadata``, the adapter of the family declaring ``scheduler_metadata``)
  and to the shared checks (validation.py), which read the arguments they need by name;
* the **public function** (``Declared.function``): a function with exactly upstream's
  signature whose body builds the call object and hands it to the package's code. It is
  generated from the table, as ``collections.namedtuple`` and ``dataclasses`` generate
  theirs, so ``inspect.signature`` shows upstream's parameters and a call costs one object.
  Where the package has a quick path for the common calls (``quick``), the body first hands
  it the arguments it names, as plain positional arguments, and builds the call object only
  when the quick path declines: on every layer of every serving step, building the object
  and reading its fields back cost more than the checks themselves.

And the **launch contract** of the family adapters (``LAUNCH_PARAMETERS``): the arguments of a
checked call as every family's ``launch`` takes them, positionally, and the two calls of it,
generated from that table: the quick path's (``with_launch``) and ``launch_arguments`` (a call
object's, on the full path).

A parameter upstream adds is added to its table here, and read by name where it is used;
nothing else lists the parameters. ``fa_version``'s default differs from upstream's on
purpose (None: the selector chooses; upstream: ``DEFAULT_FA_VERSION = 2``);
tests/unit/test_call.py holds the tables to upstream's file at the pin.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import keyword
import linecache
import textwrap
import types
from typing import Callable, List, NamedTuple, Optional

import torch

EMPTY = inspect.Parameter.empty


def _generated(name: str, source: str, namespace: dict) -> Callable:
    """``source``'s function ``name``, compiled with its text where a traceback or a debugger
    looks for it."""
    filename = f"<vendored_flash_attn.call.arguments: {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102
    return namespace[name]


class Parameter(NamedTuple):
    """One parameter of one of upstream's functions."""

    name: str
    default: object = EMPTY       # EMPTY: required
    annotation: object = EMPTY    # as upstream writes it (EMPTY: none)
    keyword_only: bool = False


class Declared:
    """One of upstream's functions: its parameters, its call object and its public function."""

    def __init__(self, name: str, parameters: tuple[Parameter, ...], call_name: str, doc: str):
        names = [p.name for p in parameters]
        if len(set(names)) != len(names) or not all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
            raise ValueError(f"{name}: parameter names must be distinct identifiers: {names}")
        required = [p.default is EMPTY for p in parameters]
        if required != sorted(required, reverse=True):
            raise ValueError(f"{name}: a required parameter follows one with a default")
        self.name = name
        self.parameters = parameters
        # A dataclass with slots: its fields are read on every call, and a slot is read several
        # times faster than a named tuple's field. Not frozen: a frozen dataclass is built with
        # one object.__setattr__ per field (a microsecond a call); nothing sets a field after
        # the call object is built (``dataclasses.replace`` makes a changed copy).
        self.call_type = dataclasses.make_dataclass(
            call_name, [(p.name, object) if p.default is EMPTY else (p.name, object, dataclasses.field(default=p.default))
                        for p in parameters], slots=True)
        self.call_type.__module__, self.call_type.__doc__ = __name__, doc

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    def signature(self) -> inspect.Signature:
        """The signature the table declares, as ``inspect.signature`` shows the public function's."""
        kinds = {False: inspect.Parameter.POSITIONAL_OR_KEYWORD, True: inspect.Parameter.KEYWORD_ONLY}
        return inspect.Signature([inspect.Parameter(p.name, kinds[p.keyword_only], default=p.default,
                                                    annotation=p.annotation) for p in self.parameters])

    def function(self, dispatch: Callable, module: str, doc: str, quick: Optional[Callable] = None) -> Callable:
        """A function named like upstream's, with its signature, whose body is
        ``return dispatch(<call object of every argument>)``; with ``quick``, first
        ``result = quick(<the arguments it names>)``, returned unless it is None (declined).
        ``quick``'s parameters are declared names (any of them, in any order), plain
        positional ones: it reads the arguments it needs as its own locals."""
        params, star = [], False
        for i, p in enumerate(self.parameters):
            if p.keyword_only and not star:
                params.append("*")
                star = True
            params.append(p.name if p.default is EMPTY else f"{p.name}=_default_{i}")
        if quick is not None and hasattr(quick, "__quick_tree__"):
            return self._inlined(quick, params, dispatch, module, doc)
        head = ""
        if quick is not None:
            head = (f"    result = _quick({', '.join(self._quick_parameters(quick))})\n"
                    "    if result is not None:\n        return result\n")
        # The call object is filled slot by slot, not through its __init__ (a second frame).
        source = (f"def {self.name}({', '.join(params)}):\n{head}    call = _new(_Call)\n"
                  + "".join(f"    call.{name} = {name}\n" for name in self.names)
                  + "    return _dispatch(call)\n")
        namespace = {f"_default_{i}": p.default for i, p in enumerate(self.parameters)}
        namespace.update(_dispatch=dispatch, _quick=quick, _new=object.__new__, _Call=self.call_type)
        function = _generated(self.name, source, namespace)
        function.__module__, function.__qualname__, function.__doc__ = module, self.name, doc
        function.__annotations__ = {p.name: p.annotation for p in self.parameters if p.annotation is not EMPTY}
        return function

    def _inlined(self, quick: Callable, params: list[str], dispatch: Callable, module: str, doc: str) -> Callable:
        """The public function with a with_launch quick path's body inlined, in a try block: its
        ``return <result>`` returns from the public function, its ``return None`` (declined)
        raises _Declined, caught before the call object is built for ``dispatch``. One frame
        and one 28-argument call fewer on every quick call; the quick path's code runs as
        written (its globals, file and lines), and stays a function of its own (``quick``)."""
        self._quick_parameters(quick)
        node, filename = quick.__quick_tree__
        body = [copy.deepcopy(n) for n in node.body]
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # its docstring
        own = {"call", "_new", "_Call", "_dispatch", "_Declined"}
        clash = sorted(own & {n.id for b in body for n in ast.walk(b) if isinstance(n, ast.Name)})
        if clash:
            raise ValueError(f"{self.name}: the quick path uses the generated function's own names {clash}")
        body = [_DeclineRaised().visit(b) for b in body]
        plain = [p.split("=")[0] if p != "*" else p for p in params]
        source = (f"def _factory(_new, _Call, _dispatch, _Declined):\n"
                  f"    def {self.name}({', '.join(plain)}):\n"
                  "        try:\n            pass\n        except _Declined:\n            pass\n"
                  "        call = _new(_Call)\n"
                  + "".join(f"        call.{name} = {name}\n" for name in self.names)
                  + "        return _dispatch(call)\n"
                  f"    return {self.name}\n")
        tree = ast.parse(source)
        for n in ast.walk(tree):  # the generated lines point at the quick path's def
            if hasattr(n, "lineno"):
                n.lineno = n.end_lineno = node.lineno
        inner = tree.body[0].body[0]
        inner.body[0].body = body
        ast.fix_missing_locations(tree)
        namespace: dict = {}
        exec(compile(tree, filename, "exec"), namespace)  # noqa: S102
        made = namespace["_factory"](object.__new__, self.call_type, dispatch, _Declined)
        positional = tuple(p.default for p in self.parameters if not p.keyword_only and p.default is not EMPTY)
        function = types.FunctionType(made.__code__, quick.__globals__, self.name, positional or None,
                                      made.__closure__)
        function.__kwdefaults__ = {p.name: p.default for p in self.parameters
                                   if p.keyword_only and p.default is not EMPTY} or None
        function.__module__, function.__qualname__, function.__doc__ = module, self.name, doc
        function.__annotations__ = {p.name: p.annotation for p in self.parameters if p.annotation is not EMPTY}
        return function

    def _quick_parameters(self, quick: Callable) -> list[str]:
        kinds = {inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD}
        parameters = list(inspect.signature(quick).parameters.values())
        wrong = [p.name for p in parameters
                 if p.name not in self.names or p.kind not in kinds or p.default is not EMPTY]
        if wrong:
            raise ValueError(f"{self.name}: the quick path's parameters must be declared parameters, positional and "
                             f"without defaults: {wrong}")
        return [p.name for p in parameters]


def _options() -> tuple[Parameter, ...]:
    """What upstream's attention functions share, after their tensors, in its order."""
    return (Parameter("dropout_p", 0.0), Parameter("softmax_scale", None), Parameter("causal", False))


_SOFTCAP = Parameter("softcap", 0.0)  # 0.0 means deactivated
_ALIBI_TO_PROBS = (Parameter("alibi_slopes", None), Parameter("deterministic", False),
                   Parameter("return_attn_probs", False))

VARLEN = Declared("flash_attn_varlen_func", (
    Parameter("q"), Parameter("k"), Parameter("v"),
    Parameter("max_seqlen_q"), Parameter("cu_seqlens_q"), Parameter("max_seqlen_k"),
    Parameter("cu_seqlens_k", None),  # only used for non-paged prefill
    Parameter("seqused_k", None),
    Parameter("q_v", None),
    *_options(),
    Parameter("window_size", None, Optional[List[int]]),
    _SOFTCAP,
    *_ALIBI_TO_PROBS,
    Parameter("block_table", None),
    Parameter("return_softmax_lse", False),
    Parameter("out", None),
    # FA3 only (upstream's words)
    Parameter("scheduler_metadata", None),
    Parameter("q_descale", None), Parameter("k_descale", None), Parameter("v_descale", None),
    Parameter("num_splits", 0, int),
    # Version selector. Upstream: `fa_version: int = DEFAULT_FA_VERSION` (2); here None lets
    # the selector choose (docs/runtime.md).
    Parameter("fa_version", None, Optional[int]),
    Parameter("s_aux", None),
    Parameter("cp_world_size", 1), Parameter("cp_rank", 0), Parameter("cp_tot_seqused_k", None),
), "VarlenCall", "One call of flash_attn_varlen_func: every argument, by parameter name.")

_INDEXES = (Parameter("block_count"), Parameter("block_offset"), Parameter("column_count"),
            Parameter("column_index"))
_SPARSE_TAIL = (*_options(), _SOFTCAP, *_ALIBI_TO_PROBS, Parameter("return_softmax_lse", False, keyword_only=True),
                Parameter("out", None, keyword_only=True))

SPARSE = Declared("sparse_attn_func", (
    Parameter("q"), Parameter("k"), Parameter("v"), *_INDEXES, *_SPARSE_TAIL,
), "SparseCall", "One call of sparse_attn_func: every argument, by parameter name.")

SPARSE_VARLEN = Declared("sparse_attn_varlen_func", (
    Parameter("q"), Parameter("k"), Parameter("v"), *_INDEXES,
    Parameter("cu_seqlens_q"), Parameter("cu_seqlens_k"), Parameter("max_seqlen_q"), Parameter("max_seqlen_k"),
    *_SPARSE_TAIL,
), "SparseVarlenCall", "One call of sparse_attn_varlen_func: every argument, by parameter name.")

# "NOTE only used in FA3" (upstream's words): served by the family declaring scheduler_metadata.
SCHEDULER_METADATA = Declared("get_scheduler_metadata", (
    Parameter("batch_size"), Parameter("max_seqlen_q"), Parameter("max_seqlen_k"), Parameter("num_heads_q"),
    Parameter("num_heads_kv"), Parameter("headdim"),
    Parameter("cache_seqlens", annotation=torch.Tensor),
    Parameter("qkv_dtype", torch.bfloat16),
    Parameter("headdim_v", None),
    Parameter("cu_seqlens_q", None, Optional[torch.Tensor]),
    Parameter("cu_seqlens_k_new", None, Optional[torch.Tensor]),
    Parameter("cache_leftpad", None, Optional[torch.Tensor]),
    Parameter("page_size", None, Optional[int]),
    Parameter("max_seqlen_k_new", 0),
    Parameter("causal", False),
    Parameter("window_size", (-1, -1)),  # -1 means infinite context window
    Parameter("has_softcap", False),
    Parameter("num_splits", 0),  # Can be tuned for speed
    Parameter("pack_gqa", None),  # Can be tuned for speed
    Parameter("sm_margin", 0),  # Can be tuned if some SMs are used for communication
), "SchedulerMetadataCall", "One call of get_scheduler_metadata: every argument, by parameter name.")

VarlenCall = VARLEN.call_type
SparseCall = SPARSE.call_type
SparseVarlenCall = SPARSE_VARLEN.call_type
SchedulerMetadataCall = SCHEDULER_METADATA.call_type

DECLARED = {d.name: d for d in (VARLEN, SPARSE, SPARSE_VARLEN, SCHEDULER_METADATA)}


def maybe_contiguous(x):
    """Upstream's helper of the same file (exported by the interface as upstream's is): a
    tensor whose last dim is strided is copied (the kernels need stride 1)."""
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


class LaunchParameter(NamedTuple):
    """One argument of the launch contract."""

    name: str
    # How the full path makes it of a checked call object (``call``), its window (``window``,
    # validation.window_tuple(call.window_size)) and ``fp8`` (whether q is FP8): an expression.
    of_call: str
    # True: the quick path computes it (it answers it with its resolution); False: a declared
    # parameter of the call, which the quick path accepts only as the kernels take it and
    # passes as the caller gave it.
    computed: bool = False


# The launch contract: what every family adapter's ``launch(resolved, *LAUNCH)`` takes, in this
# order, positionally - a checked call's arguments as the kernels take them: ints, bools and
# floats of exact types, softmax_scale resolved (never None), the window as two ints (-1:
# unbounded). It returns the kernels' result, out first and softmax_lse second. Both calls of
# it are generated from this table: the quick path's (``with_launch``) and ``launch_arguments``
# (an adapter's declared ``forward(resolved, call, window, fp8)`` on the full path). What a family does not declare
# (q_v, alibi_slopes, s_aux, context parallelism) the shared checks refused when set: its
# launch takes it and leaves it unread. A parameter upstream adds is added here (and to each
# adapter's ``launch``, which tests/unit/test_call.py holds to LAUNCH by name and order).
LAUNCH_PARAMETERS = tuple(LaunchParameter(*entry) for entry in (
    ("q", "call.q"), ("k", "call.k"), ("v", "call.v"), ("cu_seqlens_q", "call.cu_seqlens_q"),
    ("cu_seqlens_k", "call.cu_seqlens_k"), ("seqused_k", "call.seqused_k"),
    ("max_seqlen_q", "int(call.max_seqlen_q)"), ("max_seqlen_k", "int(call.max_seqlen_k)"),
    ("block_table", "call.block_table"), ("out", "call.out"), ("scheduler_metadata", "call.scheduler_metadata"),
    ("q_descale", "call.q_descale"), ("k_descale", "call.k_descale"), ("v_descale", "call.v_descale"),
    ("softmax_scale", "float(scale_of(call))", True), ("causal", "bool(call.causal)"),
    ("window_left", "window[0]", True), ("window_right", "window[1]", True),
    ("softcap", "float(call.softcap)", True), ("num_splits", "int(call.num_splits)"),
    ("return_softmax_lse", "bool(call.return_softmax_lse)"), ("fp8", "fp8", True),
    ("q_v", "call.q_v"), ("alibi_slopes", "call.alibi_slopes"), ("s_aux", "call.s_aux"),
    ("cp_world_size", "int(call.cp_world_size)"), ("cp_rank", "int(call.cp_rank)"),
    ("cp_tot_seqused_k", "call.cp_tot_seqused_k"),
))
LAUNCH = tuple(p.name for p in LAUNCH_PARAMETERS)
#: What the quick path computes (it names each in its launch call); the rest it passes as given.
LAUNCH_COMPUTED = tuple(p.name for p in LAUNCH_PARAMETERS if p.computed)


def launch(resolved, **computed):
    """The quick path's launch call as its source writes it, ``launch(resolved, <each of
    LAUNCH_COMPUTED>=...)``: ``with_launch`` rewrites it into the adapter's launch with the
    whole contract in LAUNCH's order. Never runs."""
    raise RuntimeError("call.launch is a marker for call.with_launch; this function was not rewritten")


def with_launch(function: Callable, tuples: Optional[dict] = None) -> Callable:
    """``function`` (the interface's quick path) recompiled from its source with its one
    ``launch(resolved, name=value, ...)`` call rewritten into
    ``resolved.launch(resolved, <LAUNCH, in order>)``: each of LAUNCH_COMPUTED as the call
    names it, every other launch argument the function's own parameter of that name (the
    caller's argument, which the function must not rebind). The positional call of the
    contract is written here, from LAUNCH_PARAMETERS, not by hand; the function keeps its
    globals, lines and name, and pays no extra frame (it runs on every layer of every step).

    ``tuples``: {name of a named tuple: its fields}; each call ``name(field=value, ...)`` in
    the function, every field named once, becomes the plain tuple of the values in the
    fields' order (equal to the named tuple, and hashed alike, without its constructor's
    cost)."""
    try:
        filename = inspect.getsourcefile(function)
        lines, first = inspect.getsourcelines(function)
    except (OSError, TypeError) as exc:  # an install stripped of its .py files
        raise ImportError(f"{function.__module__}: its source file is needed (call.with_launch writes the quick "
                          f"path's launch out of it) and cannot be read: {exc}; reinstall the wheel as built, "
                          "with its .py files") from exc
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, first - 1)
    (node,) = tree.body
    node.decorator_list = []
    parameters = [a.arg for a in node.args.args]
    where = f"{function.__module__}.{function.__qualname__}"
    passed = [n for n in LAUNCH if n not in LAUNCH_COMPUTED]
    # Its parameters are the caller's arguments, passed on as given (and, inlined in the public
    # function, what the full path gets when it declines): never rebound.
    rebound = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                     & set(parameters))
    missing = [n for n in passed if n not in parameters]
    if rebound or missing:
        raise ValueError(f"{where}: the launch passes these as the caller gave them, so they must be parameters "
                         f"it never rebinds: rebound {rebound}, not parameters {missing}")
    if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) for n in ast.walk(node)
           if n is not node):
        raise ValueError(f"{where}: a quick path defines no function of its own (its returns are its own)")
    marks = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == launch.__name__]
    if len(marks) != 1:
        raise ValueError(f"{where}: needs exactly one launch(resolved, ...) call, found {len(marks)}")
    (mark,) = marks
    named = {k.arg: k.value for k in mark.keywords}
    if len(mark.args) != 1 or sorted(named) != sorted(LAUNCH_COMPUTED) or None in named:
        raise ValueError(f"{where}: launch(resolved, ...) must name each of {list(LAUNCH_COMPUTED)} once, "
                         f"got {[k.arg for k in mark.keywords]}")
    (resolved,) = mark.args
    mark.func = ast.Attribute(value=resolved, attr="launch", ctx=ast.Load())
    mark.args = [resolved] + [named[n] if n in named else ast.Name(id=n, ctx=ast.Load()) for n in LAUNCH]
    mark.keywords = []
    tree = _TuplesWrittenOut(dict(tuples or {}), where).visit(tree)
    ast.fix_missing_locations(tree)
    scratch: dict = {}
    exec(compile(tree, filename, "exec"), dict(function.__globals__), scratch)  # noqa: S102
    made = scratch[node.name]
    rewritten = types.FunctionType(made.__code__, function.__globals__, function.__name__, function.__defaults__,
                                   function.__closure__)
    rewritten.__qualname__, rewritten.__doc__, rewritten.__module__ = (function.__qualname__, function.__doc__,
                                                                       function.__module__)
    rewritten.__wrapped_source__ = function  # the function as written, for tests and readers
    rewritten.__quick_tree__ = (node, filename)  # what Declared.function inlines
    return rewritten


class _Declined(Exception):
    """An inlined quick path declined the call (its ``return None``)."""


class _DeclineRaised(ast.NodeTransformer):
    """An inlined quick path's ``return None`` -> ``raise _Declined``."""

    def visit_Return(self, node: ast.Return):
        if node.value is None or (isinstance(node.value, ast.Constant) and node.value.value is None):
            return ast.copy_location(ast.Raise(exc=ast.Name(id="_Declined", ctx=ast.Load()), cause=None), node)
        return node


class _TuplesWrittenOut(ast.NodeTransformer):
    """with_launch's ``tuples``: ``Name(field=value, ...)`` -> ``(value, ...)`` in the fields' order."""

    def __init__(self, tuples: dict, where: str):
        self.tuples, self.where = tuples, where

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if not (isinstance(node.func, ast.Name) and node.func.id in self.tuples):
            return node
        fields = tuple(self.tuples[node.func.id])
        named = {k.arg: k.value for k in node.keywords}
        if node.args or sorted(named) != sorted(fields) or len(node.keywords) != len(fields):
            raise ValueError(f"{self.where}: {node.func.id}(...) must name each of its fields {list(fields)} once, "
                             f"by keyword, got {[k.arg for k in node.keywords]} and {len(node.args)} positional")
        return ast.copy_location(ast.Tuple(elts=[named[f] for f in fields], ctx=ast.Load()), node)


def scale_of(call) -> float:
    """The call's softmax scale: its own, else upstream's default, 1 / sqrt(head size)."""
    scale = call.softmax_scale
    return call.q.shape[-1] ** (-0.5) if scale is None else scale


launch_arguments = _generated("launch_arguments", (
    "def launch_arguments(call, window, fp8):\n"
    f"    return ({', '.join(p.of_call for p in LAUNCH_PARAMETERS)})\n"), {"scale_of": scale_of})
launch_arguments.__module__ = __name__
launch_arguments.__doc__ = """``call``'s arguments as LAUNCH orders and types them; ``window``:
validation.window_tuple(call.window_size); ``fp8``: whether q is FP8. Generated from
LAUNCH_PARAMETERS."""
