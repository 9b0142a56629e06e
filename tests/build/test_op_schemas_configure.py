"""The configure checks that the flash-attention it builds registers the op schemas the
package calls (cmake/OpSchemas.cmake running cmake/vfa_build/knobs/op_schemas.py on the resolved sources)."""

from __future__ import annotations

import subprocess

from support.cmake_runner import configured


def test_the_configure_checks_the_op_schemas(tmp_path, sources):
    _, result = configured(tmp_path, sources, VFA_PRESET="minimal")
    assert result.returncode == 0, result.output
    assert "op schemas: the 5 ops python/ calls have upstream's schemas" in result.text


def test_the_configure_stops_when_upstream_registers_another_schema(synthetic, sources, tmp_path):
    """A flash-attention whose FA3 fwd takes one more argument (what a pin bump can bring):
    the configure stops, naming the op, the argument and the fix."""
    src = tmp_path / "fa"
    subprocess.run(["git", "clone", "-q", synthetic.fa_url, str(src)], check=True)
    registration = src / "hopper/flash_api_torch_lib.cpp"
    text = registration.read_text()
    assert '"    int      num_splits,"' in text
    registration.write_text(text.replace('"    int      num_splits,"',
                                         '"    int      num_splits,"\n            "    int      extra,"', 1))
    _, result = configured(tmp_path, sources, VFA_PRESET="minimal", FLASH_ATTN_SRC_DIR=str(src))
    assert result.returncode != 0, result.output
    assert "_vendored_fa3_C::fwd (hopper/flash_api_torch_lib.cpp): argument 32: upstream has " \
           "'int extra', op_schemas.py 'bool? pack_gqa'" in result.text, result.output
    assert "Update op_schemas.py to upstream's schemas" in result.text
