"""benchmarks/wheel_size.py: measured slice modules summed into the `full` wheel, gaps named."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SPEC = importlib.util.spec_from_file_location("wheel_size", ROOT / "benchmarks/wheel_size.py")
ws = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(ws)

# The shape slice_h200.sh's test step writes (fa3-hd96-fa2-hd96-192, 2026-12-01).
SIZES = """\
-rwxr-xr-x 1 root root 12213576 Dec  1 09:18 /tmp/vfa-slice.x/build/_vendored_fa2_C.abi3.so
-rwxr-xr-x 1 root root  6605488 Dec  1 09:20 /tmp/vfa-slice.x/build/_vendored_fa3_C.abi3.so
-rw-r--r-- 1 root root 11745030 Dec  1 09:20 /tmp/vfa-slice.x/src/dist/vendored_flash_attn-0.1.0-cp310-abi3-linux_x86_64.whl
vendored_flash_attn/_vendored_fa2_C.abi3.so 10975664 9059659
vendored_flash_attn/_vendored_fa3_C.abi3.so 5812648 2614902
"""


def record_slice(tmp_path: Path, name: str, **kwargs) -> Path:
    """A results folder for slice ``name`` holding SIZES, recorded into tmp_path/sizes.json."""
    results = tmp_path / name
    results.mkdir()
    (results / "slice.txt").write_text(f"{name}\n")
    (results / "sizes.txt").write_text(SIZES)
    table = tmp_path / "sizes.json"
    ws.record(results, f"run {name}", table, **kwargs)
    return table


def test_parse_sizes_reads_the_wheel_and_its_members():
    parsed = ws.parse_sizes(SIZES)
    assert parsed["wheel_bytes"] == 11745030
    assert parsed["modules"]["_vendored_fa3_C"] == {"built": 6605488, "stored": 5812648, "zipped": 2614902}


def test_projection_sums_measured_slices_and_names_the_rest(tmp_path):
    table = record_slice(tmp_path, "a")
    measured = json.loads(table.read_text())["slices"]
    measured["b"] = {"wheel_bytes": 1_070_469, "modules": {"_vendored_fa3_C": {"built": 2_000_000}}, "run": "run b"}
    slices = {"a": {"what": "A"}, "b": {"what": "B"}, "c": {"what": "C kernels"}}
    result = ws.project(measured, slices)
    package = 11745030 - 9059659 - 2614902
    assert result["package_bytes"] == package
    assert result["modules_zipped_bytes"] == 9059659 + 2614902 + (1_070_469 - package)
    assert result["measured_wheel_bytes"] == result["modules_zipped_bytes"] + package
    assert result["unmeasured"] == [{"slice": "c", "what": "C kernels"}] and not result["complete"]
    assert result["rows"][0]["modules"]["_vendored_fa3_C"]["ratio"] == round(2614902 / 5812648, 3)


def test_command_prints_the_gap(tmp_path, capsys):
    out = tmp_path / "w.json"
    assert ws.main(["--out", str(out)]) == 0
    text = capsys.readouterr().out
    result = json.loads(out.read_text())
    if result["unmeasured"]:
        assert "NOT measured yet" in text and all(g["slice"] in text for g in result["unmeasured"])
    assert "Hopper-only" in text


def test_a_build_of_several_slices_covers_them(tmp_path):
    """hd128-256 was built as one slice, then cut in two (hd128, hd256) for the 15-minute
    bar: its record covers both, once; a slice in two records is an error."""
    table = record_slice(tmp_path, "ab", covers=["a", "b"])
    measured = json.loads(table.read_text())["slices"]
    assert measured["ab"]["covers"] == ["a", "b"]
    result = ws.project(measured, {"a": {}, "b": {}, "c": {"what": "C"}})
    assert [r["covers"] for r in result["rows"]] == [["a", "b"]]
    assert result["modules_zipped_bytes"] == 9059659 + 2614902  # counted once, not per slice
    assert [g["slice"] for g in result["unmeasured"]] == ["c"]
    measured["b"] = {"wheel_bytes": 1, "modules": {}, "run": "b alone"}
    with pytest.raises(ValueError, match="two measured builds"):
        ws.project(measured, {"a": {}, "b": {}})


def test_default_fa2_wheel_is_estimated_from_objects_built_both_ways(tmp_path):
    """FA2 objects of one unit set built sm_90-only and sm_80+PTX: their size ratio over the
    common units scales the measured (Hopper-only) FA2 modules; FA3 and the package stay."""
    table = record_slice(tmp_path, "a")
    hopper, default = tmp_path / "h.txt", tmp_path / "d.txt"
    hopper.write_text("100 CMakeFiles/_vendored_fa2_C.dir/x/flash_fwd_hdim128_bf16_sm80.cu.o\n"
                      "300 CMakeFiles/_vendored_fa2_C.dir/x/flash_fwd_split_hdim128_bf16_sm80.cu.o\n"
                      "999 CMakeFiles/_vendored_fa2_C.dir/x/flash_fwd_hdim256_bf16_sm80.cu.o\n"
                      "555 CMakeFiles/_vendored_fa3_C.dir/x/flash_fwd_hdim128_bf16_packgqa_sm90.cu.o\n")
    default.write_text("150 CMakeFiles/_vendored_fa2_C.dir/y/flash_fwd_hdim128_bf16_sm80.cu.o\n"
                       "450 CMakeFiles/_vendored_fa2_C.dir/y/flash_fwd_split_hdim128_bf16_sm80.cu.o\n"
                       "77 CMakeFiles/_vendored_fa2_C.dir/y/fa2_missing_kernels_1.cpp.o\n")
    assert len(ws.record_objects(hopper, ws.HOPPER_FA2, "h", table)["units"]) == 3
    ws.record_objects(default, ws.DEFAULT_FA2, "d", table)
    data = json.loads(table.read_text())
    result = ws.project(data["slices"], {"a": {}}, data["fa2_objects"])
    default_wheel = result["default_fa2_wheel"]
    assert default_wheel["units"] == ["flash_fwd_hdim128_bf16_sm80", "flash_fwd_split_hdim128_bf16_sm80"]
    assert default_wheel["ratio"] == 1.5  # (150 + 450) / (100 + 300); hdim256 is in one build only
    assert default_wheel["wheel_bytes"] == result["measured_wheel_bytes"] - 9059659 + round(9059659 * 1.5)
    assert default_wheel["estimate"] and [p["how"] for p in default_wheel["parts"]] == ["scaled"]
    assert ws.project(data["slices"], {"a": {}})["default_fa2_wheel"] is None
    empty = tmp_path / "e.txt"
    empty.write_text("555 CMakeFiles/_vendored_fa3_C.dir/x/flash_fwd_hdim128_bf16_packgqa_sm90.cu.o\n")
    with pytest.raises(ValueError, match="no FA2 unit object"):
        ws.record_objects(empty, ws.HOPPER_FA2, "e", table)


def test_a_default_fa2_build_replaces_the_scaled_module_of_the_slices_it_covers(tmp_path):
    """A build of slice a's FA2 with the default gencode (--default-fa2): a's FA2 module in the
    default wheel is that measured one, slice b's stays scaled by the object ratio; the
    prediction for a is kept beside its measurement."""
    for name in ("a", "b"):
        table = record_slice(tmp_path, name)
    default_build = tmp_path / "a-default"
    default_build.mkdir()
    (default_build / "slice.txt").write_text("a-default\n")
    (default_build / "sizes.txt").write_text(
        SIZES.replace("10975664 9059659", "17000000 14000000").replace(" 12213576 ", " 19000000 "))
    entry = ws.record(default_build, "run a default", table, covers=["a"], default_fa2=True)
    assert list(entry["modules"]) == ["_vendored_fa2_C"]  # its FA3 (if any) is not the question
    objects = tmp_path / "o.txt"
    for arch, size in ((ws.HOPPER_FA2, 100), (ws.DEFAULT_FA2, 150)):
        objects.write_text(f"{size} CMakeFiles/_vendored_fa2_C.dir/x/flash_fwd_hdim128_bf16_sm80.cu.o\n")
        ws.record_objects(objects, arch, arch, table)
    data = json.loads(table.read_text())
    assert list(data["slices"]) == ["a", "b"] and list(data["default_fa2"]) == ["a-default"]
    result = ws.project(data["slices"], {"a": {}, "b": {}}, data["fa2_objects"], data["default_fa2"])
    parts = {p["covers"][0]: p for p in result["default_fa2_wheel"]["parts"]}
    assert parts["a"]["how"] == "measured" and parts["a"]["zipped_bytes"] == 14_000_000
    assert parts["a"]["predicted_bytes"] == round(9059659 * 1.5)
    assert parts["b"]["how"] == "scaled" and parts["b"]["zipped_bytes"] == round(9059659 * 1.5)
    assert result["default_fa2_wheel"]["wheel_bytes"] == (
        result["measured_wheel_bytes"] - 2 * 9059659 + 14_000_000 + round(9059659 * 1.5))
    assert result["default_fa2_wheel"]["estimate"] and result["default_fa2_wheel"]["unused_records"] == []
    # A record whose --covers matches no Hopper-only record is named as unused, not summed.
    typo = {**data["default_fa2"], "a-typo": {**data["default_fa2"]["a-default"], "covers": ["a", "z"]}}
    with_typo = ws.project(data["slices"], {"a": {}, "b": {}}, data["fa2_objects"], typo)["default_fa2_wheel"]
    assert with_typo["unused_records"] == ["a-typo"]
    assert with_typo["wheel_bytes"] == result["default_fa2_wheel"]["wheel_bytes"]
    # Without the object ratio, b has no figure: no default wheel at all, not a partial sum.
    assert ws.project(data["slices"], {"a": {}, "b": {}}, {}, data["default_fa2"])["default_fa2_wheel"] is None
    # With only a, every FA2 module is measured: not an estimate.
    only_a = ws.project({"a": data["slices"]["a"]}, {"a": {}}, {}, data["default_fa2"])["default_fa2_wheel"]
    assert not only_a["estimate"] and only_a["default_fa2_zipped_bytes"] == 14_000_000
    wheel_without_fa2 = tmp_path / "nofa2"
    wheel_without_fa2.mkdir()
    (wheel_without_fa2 / "slice.txt").write_text("x\n")
    (wheel_without_fa2 / "sizes.txt").write_text(
        "\n".join(line for line in SIZES.splitlines() if "fa2" not in line) + "\n")
    with pytest.raises(ValueError, match="no _vendored_fa2_C member"):
        ws.record(wheel_without_fa2, "x", table, default_fa2=True)


def test_two_wheels_lever_sums_each_family_with_the_package(tmp_path):
    """FA2 and FA3 as two wheels: each family's measured modules summed, each with the package;
    the FA2 wheel with the default gencode from the default wheel's FA2 figure."""
    table = record_slice(tmp_path, "a")
    measured = json.loads(table.read_text())["slices"]
    measured["b"] = {"wheel_bytes": 3_000_000, "run": "run b",
                     "modules": {"_vendored_fa3_C": {"stored": 5_000_000, "zipped": 2_500_000}}}
    objects = tmp_path / "o.txt"
    for arch, size in ((ws.HOPPER_FA2, 100), (ws.DEFAULT_FA2, 200)):
        objects.write_text(f"{size} CMakeFiles/_vendored_fa2_C.dir/x/flash_fwd_hdim128_bf16_sm80.cu.o\n")
        ws.record_objects(objects, arch, arch, table)
    result = ws.project(measured, {"a": {}, "b": {}}, json.loads(table.read_text())["fa2_objects"])
    package = result["package_bytes"]
    two = result["two_wheels"]
    assert two["fa3_wheel_bytes"] == 2614902 + 2_500_000 + package
    assert two["fa2_hopper_wheel_bytes"] == 9059659 + package
    assert two["fa2_default_wheel_bytes"] == 2 * 9059659 + package and two["fa2_default_estimate"]
    measured["c"] = {"wheel_bytes": 1_000_000, "modules": {}, "run": "total only"}
    assert ws.project(measured, {"a": {}, "b": {}, "c": {}})["two_wheels"] is None


def test_fa4_kernels_are_recorded_deflated_and_added_to_the_release_wheel(tmp_path):
    """FA4's precompiled kernels (a precompile's --out folder) are stored as a wheel stores
    them (deflated) and added to the default wheel's figure as the release wheel."""
    table = record_slice(tmp_path, "a")
    kernels = tmp_path / "kernels" / "cu12.9" / "fp"
    kernels.mkdir(parents=True)
    (kernels / "k1.o").write_bytes(b"\0" * 100_000)  # deflates to almost nothing
    (kernels / "k2.o").write_bytes(bytes(range(256)) * 40)
    (kernels / "k1.lock").write_bytes(b"")
    entry = ws.record_fa4_kernels(tmp_path / "kernels", "precompile", table)
    assert entry["files"] == 3 and entry["stored"] == 100_000 + 10_240
    assert 0 < entry["zipped"] < 20_000
    objects = tmp_path / "o.txt"
    for arch, size in ((ws.HOPPER_FA2, 100), (ws.DEFAULT_FA2, 200)):
        objects.write_text(f"{size} CMakeFiles/_vendored_fa2_C.dir/x/flash_fwd_hdim128_bf16_sm80.cu.o\n")
        ws.record_objects(objects, arch, arch, table)
    data = json.loads(table.read_text())
    result = ws.project(data["slices"], {"a": {}}, data["fa2_objects"], None, data["fa4_kernels"])
    assert result["release_wheel_bytes"] == result["default_fa2_wheel"]["wheel_bytes"] + entry["zipped"]
    assert ws.project(data["slices"], {"a": {}}, data["fa2_objects"])["release_wheel_bytes"] is None
    with pytest.raises(ValueError, match="no file"):
        ws.record_fa4_kernels(tmp_path / "r" / "nothing-here-dir-missing", "x", table)
