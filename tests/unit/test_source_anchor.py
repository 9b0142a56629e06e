"""cmake/vfa_build/sources/source_anchor.py: the pin's anchor (what every pinned file is) lives in this repository,
agrees with the pin, and is written by one command from a fetch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vfa_build.sources import source_anchor

PROJECT = Path(__file__).resolve().parents[2]
PIN = PROJECT / "vendor/flash-attention/pin.json"


@pytest.mark.parametrize("component", ["flash_attention", "cutlass"])
def test_the_committed_anchor_agrees_with_the_pin(component):
    entry, manifest = source_anchor.load(PIN, component)
    pinned = json.loads(PIN.read_text())[component]
    assert entry["commit"] == pinned["commit"] and entry["paths"] == pinned["paths"]
    for required in pinned["required_files"]:
        assert required in manifest, f"{required} is required by the pin but not anchored"
    assert all(mode in ("644", "755") and len(sha) == 64 for mode, sha in manifest.values())


def _copy_pin_and_anchor(tmp_path):
    pin = tmp_path / "pin.json"
    pin.write_text(PIN.read_text())
    source_anchor.anchor_path(pin).write_text(source_anchor.anchor_path(PIN).read_text())
    return pin


@pytest.mark.parametrize("key, value", [("commit", "0" * 40), ("paths", ["csrc/flash_attn"])])
def test_a_pin_bumped_without_its_anchor_is_refused(tmp_path, key, value):
    pin = _copy_pin_and_anchor(tmp_path)
    data = json.loads(pin.read_text())
    data["flash_attention"][key] = value
    pin.write_text(json.dumps(data))
    with pytest.raises(source_anchor.AnchorError, match=f"disagree: flash_attention.{key} is .* A pin bump writes "
                                                        "the anchor again in the same change: python cmake/"
                                                        "vfa_build sources.source_anchor anchor"):
        source_anchor.load(pin, "flash_attention")


def test_an_anchor_edited_by_hand_is_refused(tmp_path):
    pin = _copy_pin_and_anchor(tmp_path)
    anchor = source_anchor.anchor_path(pin)
    data = json.loads(anchor.read_text())
    data["cutlass"]["files"][0][2] = "0" * 64  # a file's digest changed, the digest of the whole not
    anchor.write_text(json.dumps(data))
    with pytest.raises(source_anchor.AnchorError, match="cutlass.digest does not match its files"):
        source_anchor.load(pin, "cutlass")


def test_a_missing_anchor_says_how_to_write_it(tmp_path):
    pin = tmp_path / "pin.json"
    pin.write_text(PIN.read_text())
    with pytest.raises(source_anchor.AnchorError, match="there is no anchor .* Write it: python cmake/vfa_build sources.source_anchor"):
        source_anchor.load(pin, "cutlass")


def test_the_anchor_command_writes_from_a_fetch_what_the_files_are(synthetic, tmp_path):
    """The one documented command, against mirrors (the synthetic upstream): its anchor is each
    checked-out file's sha256 and mode."""
    pin = synthetic.write_pin(tmp_path / "pin.json")
    expected = source_anchor.anchor_path(pin).read_text()
    source_anchor.anchor_path(pin).unlink()
    env = {**os.environ, "FLASH_ATTN_MIRROR": synthetic.fa_url, "CUTLASS_MIRROR": synthetic.cutlass_url}
    done = subprocess.run([sys.executable, str(PROJECT / "cmake" / "vfa_build"), "sources.source_anchor", "anchor",
                           "--pin", str(pin)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert source_anchor.anchor_path(pin).read_text() == expected
    files = dict((p, (m, h)) for p, m, h in json.loads(expected)["flash_attention"]["files"])
    import hashlib
    api = synthetic.flash_attention / "hopper/flash_api.cpp"
    assert files["hopper/flash_api.cpp"] == ("644", hashlib.sha256(api.read_bytes()).hexdigest())
