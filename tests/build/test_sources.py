"""Resolving the pinned sources: fetch, verify, overrides, and every failure message."""

from __future__ import annotations

import shutil
import subprocess

from support.cmake_runner import fetch_sources


def defines(pin, cache, **extra):
    return {"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(cache), **extra}


def test_fetch_by_commit_then_reuse_the_cache(synthetic, pin, cache):
    first = fetch_sources(defines(pin, cache))
    assert first.returncode == 0, first.output
    fa = first.sources()["flash_attention"]
    assert fa["origin"] == "fetched"
    assert fa["commit"] == synthetic.fa_commit and fa["matches_pin"] is True
    assert fa["source_dir"].startswith(str(cache)) and synthetic.fa_commit[:12] in fa["source_dir"]
    assert first.sources()["cutlass"]["commit"] == synthetic.cutlass_commit

    # Only the folders the build compiles are checked out.
    src = cache / "src" / f"flash-attention-{synthetic.fa_commit[:12]}"
    assert (src / "hopper/flash_api.cpp").exists()
    assert not (src / "assets").exists()

    # A second resolution is served from the cache, even with the remote gone.
    second = fetch_sources(defines(pin, cache, FLASH_ATTN_MIRROR="file:///nonexistent/mirror"))
    assert second.returncode == 0, second.output
    assert second.sources()["flash_attention"]["origin"] == "cache"
    assert second.sources()["flash_attention"]["source_dir"] == fa["source_dir"]


def test_fetch_through_a_tag_that_points_at_the_pin(synthetic, tmp_path, cache):
    synthetic.tag_fa("v-good", synthetic.fa_commit)
    pin = synthetic.write_pin(tmp_path / "pin.json", fa_tag="v-good")
    result = fetch_sources(defines(pin, cache))
    assert result.returncode == 0, result.output
    assert result.sources()["flash_attention"]["commit"] == synthetic.fa_commit


def test_a_moved_tag_stops_the_build(synthetic, tmp_path, cache):
    other = synthetic.new_fa_commit("tag moves here")
    synthetic.tag_fa("v-moved", other)
    pin = synthetic.write_pin(tmp_path / "pin.json", fa_tag="v-moved")
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0
    assert "now points at" in result.text and other in result.text
    assert "supply-chain event" in result.text
    assert not list((cache / "src").glob("flash-attention-*[!k]")), "nothing may be left in the cache"


def test_commit_missing_from_the_remote(synthetic, tmp_path, cache):
    pin = synthetic.write_pin(tmp_path / "pin.json", fa_commit="0" * 40)
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0
    assert "Could not fetch flash_attention commit " + "0" * 40 in result.text
    assert "FLASH_ATTN_MIRROR" in result.text and "FLASH_ATTN_SRC_DIR" in result.text


def test_no_network_and_no_override_says_how_to_build_offline(synthetic, tmp_path, cache):
    pin = synthetic.write_pin(tmp_path / "pin.json", fa_url="file:///nonexistent/flash-attention.git")
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0
    assert "Could not fetch flash_attention" in result.text
    assert "point FLASH_ATTN_MIRROR at a mirror" in result.text
    assert "FLASH_ATTN_SRC_DIR at a local checkout" in result.text


def test_mirror_is_used_instead_of_the_canonical_url(synthetic, tmp_path, cache):
    pin = synthetic.write_pin(tmp_path / "pin.json", fa_url="file:///nonexistent/flash-attention.git")
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_MIRROR=synthetic.fa_url))
    assert result.returncode == 0, result.output
    assert result.sources()["flash_attention"]["url"] == synthetic.fa_url


def test_mirror_from_the_environment(synthetic, tmp_path, cache):
    from support.cmake_runner import clean_env

    pin = synthetic.write_pin(tmp_path / "pin.json", fa_url="file:///nonexistent/flash-attention.git")
    result = fetch_sources(defines(pin, cache), env=clean_env(FLASH_ATTN_MIRROR=synthetic.fa_url))
    assert result.returncode == 0, result.output


def _clone(synthetic, dest, commit=None):
    subprocess.run(["git", "clone", "-q", synthetic.fa_url, str(dest)], check=True)
    if commit:
        subprocess.run(["git", "-C", str(dest), "checkout", "-q", commit], check=True)
    return dest


def test_local_source_dir_at_the_pin(synthetic, pin, cache, tmp_path):
    src = _clone(synthetic, tmp_path / "fa", synthetic.fa_commit)
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_SRC_DIR=str(src)))
    assert result.returncode == 0, result.output
    fa = result.sources()["flash_attention"]
    assert fa == {**fa, "origin": "source_dir", "matches_pin": True, "source_dir": str(src)}


def test_local_source_dir_at_another_commit_builds_with_a_loud_warning(synthetic, pin, cache, tmp_path):
    other = synthetic.new_fa_commit("local work")
    src = _clone(synthetic, tmp_path / "fa", other)
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_SRC_DIR=str(src)))
    assert result.returncode == 0, result.output
    assert "CMake Warning" in result.text and f"is at commit {other}" in result.text
    fa = result.sources()["flash_attention"]
    assert fa["matches_pin"] is False and fa["commit"] == other


def test_fetchcontent_source_dir_is_honoured(synthetic, pin, cache, tmp_path):
    src = _clone(synthetic, tmp_path / "fa", synthetic.fa_commit)
    result = fetch_sources(defines(pin, cache, FETCHCONTENT_SOURCE_DIR_FLASH_ATTENTION=str(src)))
    assert result.returncode == 0, result.output
    assert result.sources()["flash_attention"]["source_dir"] == str(src)


def test_missing_source_dir(pin, cache, tmp_path):
    result = fetch_sources(defines(pin, cache, CUTLASS_SRC_DIR=str(tmp_path / "nope")))
    assert result.returncode != 0
    assert f"CUTLASS_SRC_DIR points to '{tmp_path / 'nope'}', which does not exist" in result.text


def test_incomplete_source_dir(synthetic, pin, cache, tmp_path):
    src = _clone(synthetic, tmp_path / "fa", synthetic.fa_commit)
    (src / "hopper/flash_api.cpp").unlink()
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_SRC_DIR=str(src)))
    assert result.returncode != 0
    assert "is not a complete flash_attention source tree: missing hopper/flash_api.cpp" in result.text


def test_half_fetched_cache_entry_is_refused(synthetic, pin, cache):
    assert fetch_sources(defines(pin, cache)).returncode == 0
    src = cache / "src" / f"flash-attention-{synthetic.fa_commit[:12]}"
    (src / ".vfa-source.json").unlink()
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0
    assert "interrupted fetch" in result.text and "Remove that folder" in result.text


def test_cache_entry_with_deleted_files_is_refused(synthetic, pin, cache):
    assert fetch_sources(defines(pin, cache)).returncode == 0
    shutil.rmtree(cache / "src" / f"cutlass-{synthetic.cutlass_commit[:12]}" / "include" / "cute")
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0
    assert "files are missing (include/cute/tensor.hpp)" in result.text


def test_fully_disconnected_needs_a_filled_cache(pin, cache):
    result = fetch_sources(defines(pin, cache, FETCHCONTENT_FULLY_DISCONNECTED="ON"))
    assert result.returncode != 0
    assert "FETCHCONTENT_FULLY_DISCONNECTED is set" in result.text


def test_pin_must_name_a_full_commit(synthetic, tmp_path, cache):
    pin = synthetic.write_pin(tmp_path / "pin.json", fa_commit="617264c1")
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0
    assert "must be a full 40-character commit hash" in result.text


def test_cutlass_pin_disagreeing_with_the_submodule_warns(synthetic, tmp_path, cache):
    import json

    pin = synthetic.write_pin(tmp_path / "pin.json")
    data = json.loads(pin.read_text())
    data["cutlass"]["commit"] = synthetic.new_cutlass_commit("not the submodule's commit")
    pin.write_text(json.dumps(data))
    result = fetch_sources(defines(pin, cache))
    assert result.returncode == 0, result.output
    assert "Bump both together" in result.text
