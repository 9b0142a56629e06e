"""Resolving the pinned sources: fetch, verify, overrides, and every failure message."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from support.cmake_runner import PROJECT, build_info, clean_env, configure, fetch_sources, fetch_sources_command, run
from support.git_http_server import silent_server, stalling_git_server


def defines(pin, cache, **extra):
    return {"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(cache), **extra}


@pytest.fixture(scope="module")
def _filled_cache(synthetic, tmp_path_factory):
    root = tmp_path_factory.mktemp("filled")
    result = fetch_sources(defines(synthetic.write_pin(root / "pin.json"), root / "cache"))
    assert result.returncode == 0, result.output
    return root / "cache"


@pytest.fixture
def filled(_filled_cache, cache):
    """This test's own copy of a cache filled by a fetch of the pin."""
    shutil.copytree(_filled_cache, cache, symlinks=True)
    return cache


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
    assert "If this machine cannot reach file:///nonexistent/flash-attention.git, point FLASH_ATTN_MIRROR" in result.text
    assert "FLASH_ATTN_SRC_DIR at a local checkout" in result.text


def test_mirror_is_used_instead_of_the_canonical_url(synthetic, tmp_path, cache):
    pin = synthetic.write_pin(tmp_path / "pin.json", fa_url="file:///nonexistent/flash-attention.git")
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_MIRROR=synthetic.fa_url))
    assert result.returncode == 0, result.output
    assert result.sources()["flash_attention"]["url"] == synthetic.fa_url


def test_mirror_from_the_environment(synthetic, tmp_path, cache):
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


def test_half_fetched_cache_entry_is_refused(filled, synthetic, pin, cache):
    src = cache / "src" / f"flash-attention-{synthetic.fa_commit[:12]}"
    (src / ".vfa-source.json").unlink()
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0
    assert "interrupted fetch" in result.text and "Remove that folder" in result.text


def test_cache_entry_with_deleted_files_is_refused(filled, synthetic, pin, cache):
    shutil.rmtree(cache / "src" / f"cutlass-{synthetic.cutlass_commit[:12]}" / "include" / "cute")
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0
    assert "1 file missing (include/cute/tensor.hpp)" in result.text


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
    pin = synthetic.write_pin(tmp_path / "pin.json")
    data = json.loads(pin.read_text())
    data["cutlass"]["commit"] = synthetic.new_cutlass_commit("not the submodule's commit")
    pin.write_text(json.dumps(data))
    result = fetch_sources(defines(pin, cache))
    assert result.returncode == 0, result.output
    assert "Bump both together" in result.text


# --- content, not only the marker -------------------------------------------------


def _entry(cache, name, commit):
    return cache / "src" / f"{name}-{commit[:12]}"


def _edit_keeping_size_and_mtime(path):
    """The adversary of a stat-based check: same size, same mtime, other content."""
    before = path.stat()
    text = path.read_text()
    path.write_text(text[:-2] + "#\n" if text.endswith("}\n") else "#" + text[1:])
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size


def test_cache_entry_with_an_edited_file_is_refused(filled, synthetic, pin, cache):
    entry = _entry(cache, "flash-attention", synthetic.fa_commit)
    _edit_keeping_size_and_mtime(entry / "hopper/flash_api.cpp")
    # git's own view trusts its index: with the file marked unchanged it says "clean".
    subprocess.run(["git", "-C", str(entry), "update-index", "--assume-unchanged", "hopper/flash_api.cpp"],
                   check=True)
    status = subprocess.run(["git", "-C", str(entry), "status", "--porcelain", "--", "hopper"],
                            capture_output=True, text=True, check=True)
    assert status.stdout == ""
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0 and not result.sources()
    assert f"The cached flash_attention checkout '{entry}' does not hold commit {synthetic.fa_commit}" in result.text
    assert "1 file changed (hopper/flash_api.cpp)" in result.text
    assert f"Remove that folder (rm -rf '{entry}')" in result.text


@pytest.mark.parametrize("tamper, expected", [
    # A whole header folder gone, none of it on the required list.
    (lambda fa, cutlass: shutil.rmtree(cutlass / "include/cutlass"),
     "2 files missing (include/cutlass/cutlass.h, include/cutlass/numeric_types.h)"),
    # An instantiation the minimal preset selects.
    (lambda fa, cutlass: (fa / "hopper/instantiations/flash_fwd_hdim128_bf16_paged_sm90.cu").unlink(),
     "1 file missing (hopper/instantiations/flash_fwd_hdim128_bf16_paged_sm90.cu)"),
    # A header slipped in, ahead of the real one on the include path.
    (lambda fa, cutlass: (fa / "csrc/common/cuda_runtime.h").write_text("#define cudaSuccess 1\\n"),
     "1 file added (csrc/common/cuda_runtime.h)"),
])
def test_cache_entry_with_deleted_or_added_files_is_refused(filled, synthetic, pin, cache, tamper, expected):
    tamper(_entry(cache, "flash-attention", synthetic.fa_commit), _entry(cache, "cutlass", synthetic.cutlass_commit))
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0 and not result.sources()
    assert expected in result.text and "Remove that folder" in result.text


def test_cache_entry_of_a_commit_without_a_required_file_is_refused(filled, synthetic, pin, cache):
    data = json.loads(pin.read_text())
    data["cutlass"]["required_files"].append("include/cutlass/gemm/gemm.h")
    pin.write_text(json.dumps(data))
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0 and not result.sources()
    assert (f"cutlass commit {synthetic.cutlass_commit} lacks files the build needs "
            "(include/cutlass/gemm/gemm.h). The pin and the build disagree") in result.text
    # The pin this build read, not the default one.
    assert f"check cutlass.commit and cutlass.required_files in the pin file '{pin}'" in result.text


def test_cache_entry_without_its_git_folder_is_refused(filled, synthetic, pin, cache):
    entry = _entry(cache, "cutlass", synthetic.cutlass_commit)
    shutil.rmtree(entry / ".git")
    # Inside another repository, git would otherwise find that one.
    subprocess.run(["git", "init", "-q", str(cache)], check=True)
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0 and not result.sources()
    assert f"The cached cutlass checkout '{entry}' has no .git, so it cannot be verified" in result.text


def test_cache_entry_whose_marker_is_not_json_is_refused(filled, synthetic, pin, cache):
    marker = _entry(cache, "cutlass", synthetic.cutlass_commit) / ".vfa-source.json"
    marker.write_text("{not json")
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0 and not result.sources()
    assert f"its marker '{marker}' is not the JSON a fetch writes" in result.text
    assert "Remove that folder" in result.text


def test_dirty_source_dir_builds_with_a_loud_warning(synthetic, pin, cache, tmp_path):
    src = _clone(synthetic, tmp_path / "fa", synthetic.fa_commit)
    (src / "hopper/flash_api.cpp").write_text("#error not upstream\\n")
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_SRC_DIR=str(src)))
    assert result.returncode == 0, result.output
    assert "CMake Warning" in result.text
    assert f"its files differ from its commit {synthetic.fa_commit}: 1 file changed (hopper/flash_api.cpp)" in result.text
    fa = result.sources()["flash_attention"]
    assert fa["commit"] == synthetic.fa_commit
    assert (fa["matches_pin"], fa["dirty"], fa["verified"]) == (False, True, True)


def test_source_dir_that_is_not_a_git_checkout_is_unverified(synthetic, pin, cache, tmp_path):
    src = _clone(synthetic, tmp_path / "fa", synthetic.fa_commit)
    shutil.rmtree(src / ".git")
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_SRC_DIR=str(src)))
    assert result.returncode == 0, result.output
    assert "not a git checkout (no .git), so its content cannot be verified" in result.text
    fa = result.sources()["flash_attention"]
    assert (fa["matches_pin"], fa["verified"], fa["dirty"]) == (False, False, None)


# --- the pin -------------------------------------------------------------------------


def _pin_with(pin, component, key, value):
    data = json.loads(pin.read_text())
    data[component][key] = value
    pin.write_text(json.dumps(data))
    return pin


@pytest.mark.parametrize("component, key, value, expected", [
    ("flash_attention", "commit", "a" * 39, "flash_attention.commit must be a full 40-character commit hash"),
    ("cutlass", "commit", "a" * 42, "cutlass.commit must be a full 40-character commit hash"),
    ("cutlass", "commit", "A" * 40, "cutlass.commit must be a full 40-character commit hash in lower case"),
    ("flash_attention", "paths", "hopper", "flash_attention.paths must be a list of relative paths, got a STRING"),
    ("cutlass", "paths", [], "cutlass.paths is empty"),
    ("cutlass", "paths", ["../include"], "cutlass.paths[0] must be a relative path inside the repository"),
    ("flash_attention", "required_files", [7], "flash_attention.required_files[0] must be a relative path"),
    ("cutlass", "url", 3, "cutlass.url must be a string, got a NUMBER"),
])
def test_malformed_pin_names_the_file_and_key(pin, cache, component, key, value, expected):
    result = fetch_sources(defines(_pin_with(pin, component, key, value), cache))
    assert result.returncode != 0
    assert f"The pin file '{pin}': {expected}" in result.text
    assert not (cache / "src").exists(), "nothing may be fetched for a bad pin"


def test_pin_that_is_not_json(pin, cache):
    pin.write_text('{"flash_attention": ')
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0
    assert f"The pin file '{pin}' is not a JSON object" in result.text


# --- where the cache lives -------------------------------------------------------


def _read_only(path, cmd, env):
    """Runs cmd with <path> read-only: a read-only bind mount in a private mount
    namespace where the kernel allows one (root ignores file modes), else modes."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0:
        script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
        return run(["unshare", "-rm", "sh", "-c", script, str(path), *cmd], env=env)
    if os.geteuid() == 0:
        pytest.fail("cannot make a folder read-only for root here: no unshare")
    subprocess.run(["chmod", "-R", "a-w", str(path)], check=True)
    try:
        return run(cmd, env=env)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(path)], check=True)


def test_a_complete_cache_on_a_read_only_path_is_used(filled, synthetic, pin, cache):
    for lock in (cache / "src").glob(".*.lock"):
        lock.unlink()  # a cache filled elsewhere, copied here without locks
    result = _read_only(cache, fetch_sources_command(defines(pin, cache)), clean_env())
    assert result.returncode == 0, result.output
    assert {s["origin"] for s in result.sources().values()} == {"cache"}
    assert not list((cache / "src").glob(".*.lock"))


def test_an_empty_read_only_cache_says_so(synthetic, pin, cache):
    (cache / "src").mkdir(parents=True)
    result = _read_only(cache, fetch_sources_command(defines(pin, cache)), clean_env())
    assert result.returncode != 0
    assert f"The source cache '{cache / 'src'}' is not writable" in result.text
    assert "Set VFA_SOURCE_CACHE to a writable folder, or FLASH_ATTN_SRC_DIR" in result.text


def test_relative_paths_are_taken_from_the_project_directory(synthetic, tmp_path):
    # flash-attention only through its mirror, given as a relative local path: git
    # alone would take it from where it runs (here, then the temporary checkout).
    pin = synthetic.write_pin(tmp_path / "my-pin.json", fa_url="file:///nonexistent/flash-attention.git")
    relative = {"VFA_PIN_FILE": os.path.relpath(pin, PROJECT),
                "VFA_SOURCE_CACHE": os.path.relpath(tmp_path / "rel-cache", PROJECT),
                "FLASH_ATTN_MIRROR": os.path.relpath(synthetic.flash_attention, PROJECT)}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = fetch_sources(relative, cwd=elsewhere)
    assert result.returncode == 0, result.output
    assert result.sources()["cutlass"]["source_dir"].startswith(str(tmp_path / "rel-cache" / "src"))
    fa = result.sources()["flash_attention"]
    assert fa["matches_pin"] is True and fa["url"] == str(synthetic.flash_attention)
    assert not list(elsewhere.iterdir())


# --- network and locks --------------------------------------------------------------


@pytest.fixture
def silent_port():
    with silent_server() as port:
        yield port


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_mirror_that_never_answers_stops_at_the_stall_timeout(pin, cache, silent_port, scheme):
    start = time.monotonic()
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_MIRROR=f"{scheme}://127.0.0.1:{silent_port}/fa.git",
                                   VFA_FETCH_STALL_TIMEOUT="2"), timeout=120)
    assert result.returncode != 0
    assert time.monotonic() - start < 60
    assert (f"{scheme}://127.0.0.1:{silent_port}/fa.git accepted the connection but did not answer within "
            "VFA_FETCH_STALL_TIMEOUT=2 s") in result.text
    assert not list((cache / "src").glob("flash-attention-*")), "nothing may be left in the cache"


def test_a_mirror_that_never_answers_over_git_stops_at_the_fetch_timeout(pin, cache, silent_port):
    start = time.monotonic()
    result = fetch_sources(defines(pin, cache, CUTLASS_MIRROR=f"git://127.0.0.1:{silent_port}/cutlass.git",
                                   VFA_FETCH_TIMEOUT="2"), timeout=120)
    assert result.returncode != 0
    assert time.monotonic() - start < 60
    assert "did not answer within VFA_FETCH_TIMEOUT=2 s" in result.text
    assert not list((cache / "src").glob("cutlass-*"))


# The server answers the first contact (ls-remote: GET info/refs, POST ls-refs),
# then stops in the middle of the fetch: whichever limit comes first stops it.
@pytest.mark.parametrize("timeouts, expected", [
    ({"VFA_FETCH_STALL_TIMEOUT": "2"}, ["Operation too slow", "below 1 KB/s for VFA_FETCH_STALL_TIMEOUT=2 s"]),
    ({"VFA_FETCH_STALL_TIMEOUT": "100", "VFA_FETCH_TIMEOUT": "3"}, ["git did not finish within VFA_FETCH_TIMEOUT=3 s"]),
], ids=["stall-timeout", "fetch-timeout"])
def test_a_transfer_that_stalls_midway_stops_at_the_first_timeout(synthetic, pin, cache, timeouts, expected):
    with stalling_git_server(synthetic.root, answer=2) as base:
        start = time.monotonic()
        result = fetch_sources(defines(pin, cache, FLASH_ATTN_MIRROR=base + "flash-attention", **timeouts),
                               timeout=120)
    assert result.returncode != 0
    assert time.monotonic() - start < 60
    for text in expected:
        assert text in result.text
    assert not list((cache / "src").glob("flash-attention-*"))


def test_mirror_credentials_stay_out_of_logs_cache_and_build_info(synthetic, pin, cache):
    with stalling_git_server(synthetic.root, answer=1000) as base:
        secret_url = base.replace("http://", "http://ci:s3cret-token@") + "flash-attention"
        result = fetch_sources(defines(pin, cache, FLASH_ATTN_MIRROR=secret_url), timeout=120)
    assert result.returncode == 0, result.output
    fa = result.sources()["flash_attention"]
    assert fa["matches_pin"] is True and fa["url"] == base + "flash-attention"
    entry = _entry(cache, "flash-attention", synthetic.fa_commit)
    leaks = [p for p in cache.rglob("*") if p.is_file() and b"s3cret-token" in p.read_bytes()]
    assert "s3cret-token" not in result.output and leaks == []
    assert json.loads((entry / ".vfa-source.json").read_text())["url"] == base + "flash-attention"


def test_timeouts_must_be_whole_seconds(pin, cache):
    result = fetch_sources(defines(pin, cache, VFA_FETCH_TIMEOUT="10m"))
    assert result.returncode != 0
    assert "VFA_FETCH_TIMEOUT: '10m' is not a valid value" in result.text
    assert "an integer from 1 to 86400" in result.text


def test_lock_wait_names_the_holder_and_gives_up_then_a_killed_fetch_is_cleaned(synthetic, pin, cache):
    with stalling_git_server(synthetic.root, answer=2) as base:
        hung = defines(pin, cache, FLASH_ATTN_MIRROR=base + "flash-attention", VFA_FETCH_STALL_TIMEOUT="120")
        holder = subprocess.Popen(fetch_sources_command(hung), env=clean_env(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not list(cache.glob("src/flash-attention-*.partial-*")) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert list(cache.glob("src/flash-attention-*.partial-*")), "the first fetch did not start"

            start = time.monotonic()
            waiting = fetch_sources(defines(pin, cache, VFA_SOURCE_LOCK_TIMEOUT="1"), timeout=120)
            assert waiting.returncode != 0
            assert time.monotonic() - start < 30
            assert f"waiting up to 1 s (VFA_SOURCE_LOCK_TIMEOUT) for '{cache / 'src'}" in waiting.text
            assert f"held by pid {holder.pid} on host" in waiting.text
            assert "fetching flash_attention" in waiting.text
            assert "Gave up after VFA_SOURCE_LOCK_TIMEOUT=1 s" in waiting.text
            assert not _entry(cache, "flash-attention", synthetic.fa_commit).exists()
        finally:
            holder.kill()  # a fetch killed midway: its partial folder stays behind
            holder.wait()
    assert list(cache.glob("src/flash-attention-*.partial-*"))

    again = fetch_sources(defines(pin, cache))
    assert again.returncode == 0, again.output
    assert "left by a fetch that did not finish" in again.text
    assert not list(cache.glob("src/*.partial-*"))
    assert again.sources()["flash_attention"]["matches_pin"] is True


def test_fully_disconnected_from_the_environment(pin, cache):
    result = fetch_sources(defines(pin, cache), env=clean_env(FETCHCONTENT_FULLY_DISCONNECTED="ON"))
    assert result.returncode != 0
    assert "FETCHCONTENT_FULLY_DISCONNECTED is set, so flash_attention is not fetched" in result.text
    assert not list(cache.glob("src/*-*")), "nothing may be fetched"


def test_a_failed_fetch_says_what_every_repository_needs(synthetic, tmp_path, cache):
    pin = synthetic.write_pin(tmp_path / "pin.json", fa_url="file:///nonexistent/flash-attention.git",
                              cutlass_url="file:///nonexistent/cutlass.git")
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0
    assert f"flash_attention (commit {synthetic.fa_commit}): FAILED" in result.text
    assert f"cutlass (commit {synthetic.cutlass_commit}): FAILED" in result.text
    assert "point FLASH_ATTN_MIRROR at a mirror" in result.text
    assert "point CUTLASS_MIRROR at a mirror" in result.text


def test_a_failed_fetch_says_the_other_repository_is_fine(filled, synthetic, tmp_path, pin, cache):
    shutil.rmtree(_entry(cache, "flash-attention", synthetic.fa_commit))
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_MIRROR="file:///nonexistent/flash-attention.git"))
    assert result.returncode != 0
    assert f"flash_attention (commit {synthetic.fa_commit}): FAILED" in result.text
    cutlass = _entry(cache, "cutlass", synthetic.cutlass_commit)
    assert f"cutlass (commit {synthetic.cutlass_commit}): ok (cache: {cutlass}); nothing to do" in result.text


# --- the same rules in a configure -------------------------------------------------


@pytest.fixture(scope="module")
def relative_configure(synthetic, tmp_path_factory):
    """Fill a cache through fetch_sources, then configure from another working
    directory, both with the same paths relative to the project, and a dirty
    flash-attention checkout (relative too)."""
    root = tmp_path_factory.mktemp("relative")
    synthetic.write_pin(root / "pin.json")
    relative = {"VFA_PIN_FILE": os.path.relpath(root / "pin.json", PROJECT),
                "VFA_SOURCE_CACHE": os.path.relpath(root / "cache", PROJECT)}
    fetched = fetch_sources(relative, cwd=PROJECT)
    assert fetched.returncode == 0, fetched.output
    src = _clone(synthetic, root / "fa", synthetic.fa_commit)
    with (src / "hopper/flash_api.cpp").open("a") as f:
        f.write("// a local change\n")
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    result = configure(root / "build", {**relative, "FLASH_ATTN_SRC_DIR": os.path.relpath(src, PROJECT),
                                        "VFA_PRESET": "minimal", "VFA_COMPILER_CACHE": "off"}, cwd=elsewhere)
    assert result.returncode == 0, result.output
    return {"root": root, "result": result, "info": build_info(root / "build")}


def test_relative_paths_mean_the_same_in_a_configure(synthetic, relative_configure):
    root = relative_configure["root"]
    cutlass = _entry(root / "cache", "cutlass", synthetic.cutlass_commit)
    assert f"cutlass {synthetic.cutlass_commit} (cache) at {cutlass}" in relative_configure["result"].text
    assert f"flash_attention {synthetic.fa_commit} (source_dir) at {root / 'fa'}" in relative_configure["result"].text


def test_a_dirty_source_dir_is_recorded_in_the_build_info(synthetic, relative_configure):
    upstream = relative_configure["info"]["upstream"]
    assert upstream == {**upstream, "commit": synthetic.fa_commit, "matches_pin": False, "dirty": True,
                        "verified": True, "origin": "source_dir"}
    cutlass = relative_configure["info"]["cutlass"]
    assert cutlass == {**cutlass, "matches_pin": True, "dirty": False, "verified": True, "origin": "cache"}


def test_a_too_old_cmake_is_told_which_cmake_to_use():
    """Issue 19: the README's prefill command failed with the system CMake 3.25 ("CMake 3.26
    or higher is required"), naming neither the cmake that works nor how to get it."""
    old = [path for path in ("/usr/bin/cmake", "/usr/local/bin/cmake") if os.path.exists(path)]
    versions = {path: subprocess.run([path, "--version"], capture_output=True, text=True).stdout.split()[2]
                for path in old}
    too_old = [path for path, v in versions.items() if tuple(map(int, v.split(".")[:2])) < (3, 26)]
    if not too_old:
        pytest.skip(f"no cmake older than 3.26 on this machine ({versions})")
    result = subprocess.run([too_old[0], "-P", str(PROJECT / "cmake" / "fetch_sources.cmake")], cwd=PROJECT,
                            capture_output=True, text=True, env=clean_env(), timeout=60)
    message = " ".join(result.stderr.split())  # cmake wraps its messages
    assert result.returncode != 0
    assert "needs CMake 3.26 or newer" in message and ".venv/bin/cmake -P cmake/fetch_sources.cmake" in message
