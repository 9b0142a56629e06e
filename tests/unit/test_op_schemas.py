"""The op schemas the package calls are upstream's: the reader of upstream's registration
sources (cmake/vfa_build/knobs/op_schemas.py, run by every configure) on upstream's two layouts, its
comparison with op_schemas.py, and the record of the pinned commit it was checked at."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.synthetic_upstream import flash_attention_files
from vendored_flash_attn.declaration import op_schemas
from vfa_build.knobs import op_schemas as reader  # the build's reader of upstream's registrations

ROOT = Path(__file__).resolve().parents[2]

PINNED = json.loads((ROOT / "vendor/flash-attention/pin.json").read_text())["flash_attention"]["commit"]


def test_the_schemas_were_checked_against_the_pinned_upstream():
    """A pin bump fails here until `python cmake/vfa_build knobs.op_schemas check <new sources> --commit C`
    passed (it fails when upstream changed an op's schema) and its entry was recorded; so does
    an edit of op_schemas.py that was not checked against upstream's sources."""
    recorded = op_schemas.CHECKED_AGAINST.get(PINNED)
    assert recorded is not None, (
        f"op_schemas.CHECKED_AGAINST has no entry for the pinned flash-attention {PINNED}: run "
        f"python cmake/vfa_build knobs.op_schemas check <its source folder> --commit {PINNED}")
    assert recorded == reader.fingerprint(op_schemas.OP_SCHEMAS), (
        "op_schemas.py changed since it was checked against the pinned upstream's registrations: "
        f"run python cmake/vfa_build knobs.op_schemas check <its source folder> --commit {PINNED}")


@pytest.mark.parametrize("namespace", sorted(op_schemas.REGISTRATION_SOURCES))
def test_the_reader_reads_upstreams_layout(namespace):
    """The synthetic upstream writes its registrations in upstream's layouts (FA2: several
    arguments per literal; FA3: one padded argument per literal, comments between)."""
    source = flash_attention_files()[op_schemas.REGISTRATION_SOURCES[namespace]]
    registered = reader.registered_schemas(source)
    ours = {op: schema for (ns, op), schema in op_schemas.OP_SCHEMAS.items() if ns == namespace}
    assert set(ours) <= set(registered)
    for op, schema in ours.items():
        assert reader.canonical(registered[op]) == reader.canonical(schema)
        assert registered[op] != schema or namespace == op_schemas.FA2_NAMESPACE  # FA3: re-spaced


def test_the_reader_joins_literals_and_skips_comments():
    source = '''
    // ops.def("commented(int x) -> Tensor");
    STABLE_TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
        ops.def("a(Tensor!  q,"   // a "quoted" comment
                "    int      n) /* not a comment */ -> Tensor");
        /* ops.def("b(int y) -> Tensor"); */
        ops.def("c(int \\"odd\\") -> Tensor");
    }
    STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CUDA, ops) {
        ops.impl("a", TORCH_BOX(&a));
    }
    '''
    schemas = reader.registered_schemas(source)
    assert schemas == {"a": "a(Tensor!  q,    int      n) /* not a comment */ -> Tensor",
                       "c": 'c(int "odd") -> Tensor'}
    assert reader.canonical(schemas["a"]) == "a(Tensor! q,int n)/* not a comment */->Tensor"


def test_a_def_the_reader_cannot_follow_is_an_error():
    source = 'TORCH_LIBRARY(ns, m) {\n  m.def(SCHEMA_FROM_A_MACRO);\n}\n'
    with pytest.raises(reader.RegistrationError, match="line 2: m.def"):
        reader.registered_schemas(source)


def _upstream_copy(tmp_path: Path, edit=None) -> Path:
    files = flash_attention_files()
    for relative in op_schemas.REGISTRATION_SOURCES.values():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        text = files[relative]
        path.write_text(edit(relative, text) if edit else text)
    return tmp_path


def test_the_check_passes_upstreams_schemas_and_prints_the_record(tmp_path):
    upstream = _upstream_copy(tmp_path)
    assert reader.differences(upstream) == []
    result = subprocess.run([sys.executable, str(ROOT / "cmake" / "vfa_build"), "knobs.op_schemas", "check", str(upstream),
                             "--commit", "f" * 40], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    digest = reader.fingerprint(op_schemas.OP_SCHEMAS)
    assert f'add to op_schemas.CHECKED_AGAINST: "{"f" * 40}": "{digest}"' in result.stdout


@pytest.mark.parametrize("old, new, message", [
    # upstream adds an argument in the middle of FA3's fwd: every later argument would shift.
    ('"    int      num_splits,"', '"    int      num_splits,"\n            "    int      extra,"',
     "_vendored_fa3_C::fwd (hopper/flash_api_torch_lib.cpp): argument 32: upstream has 'int extra', "
     "op_schemas.py 'bool? pack_gqa'"),
    # a type change in FA2's varlen_fwd.
    ("Tensor? seqused_k, Tensor? leftpad_k", "Tensor seqused_k, Tensor? leftpad_k",
     "_vendored_fa2_C::varlen_fwd (csrc/flash_attn/flash_api_torch_lib.cpp): argument 7: upstream "
     "has 'Tensor seqused_k', op_schemas.py 'Tensor? seqused_k'"),
    # an op renamed away.
    ('ops.def("varlen_fwd_sparse(', 'ops.def("varlen_fwd_sparse_v2(',
     "_vendored_fa2_C::varlen_fwd_sparse: csrc/flash_attn/flash_api_torch_lib.cpp registers no op "
     "varlen_fwd_sparse (it registers: fwd_sparse, tiny_varlen_fwd, varlen_fwd, varlen_fwd_sparse_v2)"),
])
def test_the_check_names_what_upstream_changed(tmp_path, old, new, message):
    def edit(relative, text):
        return text.replace(old, new, 1)

    upstream = _upstream_copy(tmp_path, edit)
    problems = reader.differences(upstream)
    assert len(problems) >= 1 and any(p.startswith(message) for p in problems), problems
    result = subprocess.run([sys.executable, str(ROOT / "cmake/vfa_build/knobs/op_schemas.py"), "check", str(upstream)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert "Update op_schemas.py to upstream's schemas" in result.stderr


def test_the_namespaces_are_the_declared_ones():
    """op_schemas.py writes the op namespaces out (cmake/vfa_build/knobs/op_schemas.py loads it by path): they
    must be the compiled families' declared ``op_namespace``s, each with its ``forward_op``."""
    from vendored_flash_attn.declaration.families import registry

    declared = {f.op_namespace: f.forward_op for f in registry() if f.op_namespace}
    assert set(op_schemas.REGISTRATION_SOURCES) == set(declared)
    assert {ns for ns, _ in op_schemas.OP_SCHEMAS} == set(declared)
    for namespace, forward_op in declared.items():
        assert (namespace, forward_op) in op_schemas.OP_SCHEMAS
