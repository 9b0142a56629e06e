"""Resolving the pinned sources: fetch, verify, overrides, and every failure message."""

from __future__ import annotations

# One file over 500 lines, on purpose: one concern, the pinned sources' fetch and verification,
# whose failure modes (each with its message) share the fixtures defined here.

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.cmake_runner import (PROJECT, build_info, checkout_copy, clean_env, compile_commands, configure,
                                  configure_command,
                                  fetch_sources, fetch_sources_command, run, tool)
from support.git_http_server import answers_everything_server, silent_server, stalling_git_server


def defines(pin, cache, **extra):
    """The knobs of a test: its pin, its source cache and its own staged store beside the cache
    (a store is shared by every build of a user; a test that tampers with one keeps it to itself)."""
    return {"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(cache),
            "VFA_STAGED_SOURCES": str(Path(cache).parent / "staged"), **extra}


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
    synthetic.write_anchor(pin)
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
    assert "Something edited it after the fetch" in result.text  # its own git disagrees: the entry first


def _anchor_edited(pin: Path, edit) -> Path:
    """The pin's anchor with its flash_attention files edited by <edit> and its digest recomputed:
    an anchor that is consistent in itself but does not describe the pinned commit."""
    from vfa_build.sources import source_anchor, staged_tree

    path = source_anchor.anchor_path(pin)
    data = json.loads(path.read_text())
    files = data["flash_attention"]["files"]
    edit(files)
    manifest = {rel: (mode, sha) for rel, mode, sha in files}
    data["flash_attention"] = source_anchor.component_entry(data["flash_attention"]["commit"],
                                                            data["flash_attention"]["paths"], manifest)
    data.pop("about", None)
    source_anchor.write_anchor(path, data)
    return path


@pytest.mark.parametrize("edit, shown", [
    # a digest recomputed for other bytes
    (lambda files: next(f for f in files if f[0] == "hopper/flash_api.cpp").__setitem__(2, "0" * 64),
     "1 file changed (hopper/flash_api.cpp)"),
    # a file of the commit the anchor lacks
    (lambda files: files.remove(next(f for f in files if f[0] == "hopper/flash_api.cpp")),
     "hopper/flash_api.cpp"),
], ids=["wrong-digest", "file-the-anchor-lacks"])
def test_an_anchor_that_disagrees_with_an_unmodified_cache_is_named_with_its_fix(filled, synthetic, pin, cache,
                                                                                 edit, shown):
    """Issue 43: a wrong anchor was blamed on the cache ("Something edited it after the fetch.
    Remove that folder"), a fix that cannot help; the anchor was never named."""
    anchor_file = _anchor_edited(pin, edit)
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0 and not result.sources(), result.output[-3000:]
    entry = _entry(cache, "flash-attention", synthetic.fa_commit)
    text = result.text
    assert (f"does not hold commit {synthetic.fa_commit} unmodified as the pin's anchor '{anchor_file}' "
            "records it") in text
    assert shown in text
    assert "so one of two is wrong. The anchor, if it does not describe that commit" in text
    assert f"python cmake/vfa_build sources.source_anchor anchor --pin '{pin}'" in text
    assert "Something edited it after the fetch" not in text
    assert f"rm -rf '{entry}'" in text  # the other cause (a forged .git agrees too), second


def _forge_subtree(entry: Path, folder: str, file: str, text: str) -> None:
    """An attacker's edit that git's own checks do not see: <folder>/<file> edited, and the object
    named by the commit's real <folder> tree id rewritten to list the edited blob. git re-hashes
    the commit and its root tree when it reads them, not the subtrees a comparison walks."""
    git = ["git", "-C", str(entry)]
    objects = entry / ".git/objects"
    for pack in list((objects / "pack").glob("*.pack")):  # a pack's objects are found before loose ones
        data = pack.read_bytes()
        for leftover in (objects / "pack").glob(pack.stem + ".*"):
            leftover.unlink()
        subprocess.run([*git, "unpack-objects", "-q"], input=data, check=True)
    tree = subprocess.run([*git, "rev-parse", f"HEAD:{folder}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (entry / folder / file).write_text(text)
    blob = subprocess.run([*git, "hash-object", "-w", f"{folder}/{file}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    listing = subprocess.run([*git, "ls-tree", tree], capture_output=True, text=True, check=True).stdout
    forged_listing = re.sub(rf"blob [0-9a-f]{{40}}\t{re.escape(file)}$", f"blob {blob}\t{file}", listing, flags=re.M)
    forged = subprocess.run([*git, "mktree"], input=forged_listing, capture_output=True, text=True,
                            check=True).stdout.strip()
    real = objects / tree[:2] / tree[2:]
    real.chmod(0o644)
    real.write_bytes((objects / forged[:2] / forged[2:]).read_bytes())
    # What the cache's git now says: the edited file is the commit's.
    shown = subprocess.run([*git, "show", f"{synthetic_commit(entry)}:{folder}/{file}"], capture_output=True,
                           text=True, check=True).stdout
    assert shown == text, "the forgery did not take"


def synthetic_commit(entry: Path) -> str:
    return subprocess.run(["git", "-C", str(entry), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_forged_subtree_object_in_the_cache_does_not_pass(filled, synthetic, pin, cache, tmp_path):
    """The anchor is in this repository, not in the cache: the edited file is hashed and compared
    with it, and nothing in the entry's .git is believed (on 0d62d60 this configure passed with
    matches_pin: true over the injected code)."""
    entry = _entry(cache, "flash-attention", synthetic.fa_commit)
    _forge_subtree(entry, "hopper", "flash_api.cpp", '#error "injected through a forged tree object"\n')
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0 and not result.sources(), result.output[-3000:]
    assert f"The cached flash_attention checkout '{entry}' does not hold commit {synthetic.fa_commit}" in result.text
    assert "1 file changed (hopper/flash_api.cpp)" in result.text


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


# --- links, modes and entries git cannot record -------------------------------------------
# a199453 hashed each file through `hash-object --stdin-paths` (which reads through a link)
# and took every mode as 100644: a file replaced by a link to an identical copy elsewhere
# passed, and a later edit of that copy was compiled under matches_pin: true.


def _replace_by_a_link_to_a_copy(path, elsewhere):
    elsewhere.mkdir(parents=True, exist_ok=True)
    copy = elsewhere / path.name
    shutil.copy2(path, copy)
    path.unlink()
    path.symlink_to(copy)
    return copy


def test_a_file_replaced_by_a_symlink_to_identical_content_is_refused(filled, synthetic, pin, cache, tmp_path):
    entry = _entry(cache, "flash-attention", synthetic.fa_commit)
    _replace_by_a_link_to_a_copy(entry / "hopper/flash_api.cpp", tmp_path / "elsewhere")
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0 and not result.sources()
    assert "1 file replaced by a symlink (hopper/flash_api.cpp)" in result.text
    assert f"Remove that folder (rm -rf '{entry}')" in result.text


def test_a_source_dir_with_a_symlink_does_not_match_the_pin(synthetic, pin, cache, tmp_path):
    src = _clone(synthetic, tmp_path / "fa", synthetic.fa_commit)
    _replace_by_a_link_to_a_copy(src / "csrc/common/registration.h", tmp_path / "elsewhere")
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_SRC_DIR=str(src)))
    assert result.returncode == 0, result.output
    assert "1 file replaced by a symlink (csrc/common/registration.h)" in result.text
    fa = result.sources()["flash_attention"]
    assert (fa["matches_pin"], fa["dirty"]) == (False, True)


def test_a_mode_other_than_the_commits_is_refused(filled, synthetic, pin, cache):
    header = _entry(cache, "cutlass", synthetic.cutlass_commit) / "include/cute/tensor.hpp"
    header.chmod(0o755)
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0 and not result.sources()
    assert "1 file with another mode than the anchor's (include/cute/tensor.hpp: 755, not 644)" in result.text


@pytest.mark.parametrize("plant, shown", [
    # A fifo where a header is looked for first (-I hopper before the toolkit's): a process
    # writing into it would feed the compile any bytes. git does not list fifos at all.
    (lambda fa: os.mkfifo(fa / "hopper/cuda_runtime.h"),
     "1 entry that is not a regular file or folder (a fifo, socket or device) (hopper/cuda_runtime.h)"),
    # A nested repository: git lists its folder and records nothing in it, so a header in it
    # (cute/tensor.hpp, found under -I hopper before CUTLASS's) was never compared.
    (lambda fa: (subprocess.run(["git", "init", "-q", str(fa / "hopper/cute")], check=True),
                 (fa / "hopper/cute/tensor.hpp").write_text('#error "planted"\n')), "files added (hopper/cute/.git/"),
], ids=["fifo", "nested-repository"])
def test_entries_git_cannot_record_are_refused(filled, synthetic, pin, cache, plant, shown):
    """Hashed file by file, not through git: each such entry is a difference of its own."""
    plant(_entry(cache, "flash-attention", synthetic.fa_commit))
    result = fetch_sources(defines(pin, cache), timeout=120)
    assert result.returncode != 0 and not result.sources()
    assert shown in result.text


def test_an_attribute_of_the_checkout_does_not_hide_an_edit(filled, synthetic, pin, cache):
    # The repository's root .gitattributes is outside the checked folders; with `text` git
    # would hash a CRLF copy of a file as the LF original.
    entry = _entry(cache, "flash-attention", synthetic.fa_commit)
    (entry / ".gitattributes").write_text("* text\n")
    api = entry / "hopper/flash_api.cpp"
    api.write_bytes(api.read_bytes().replace(b"\n", b"\r\n"))
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0 and not result.sources()
    assert "1 file changed (hopper/flash_api.cpp)" in result.text


# --- verified where used: the check runs again at build time -----------------------------


def _configured(pin, cache, build, **extra):
    result = configure(build, defines(pin, cache, VFA_PRESET="minimal", VFA_COMPILER_CACHE="off", **extra))
    assert result.returncode == 0, result.output[-5000:]
    return build


def _object_of(build, source_suffix):
    """The unit's object as ninja names it (relative to the build dir)."""
    output = next(c["output"] for c in compile_commands(build) if c["file"].endswith(source_suffix))
    return os.path.relpath(build / output, build)


def _build(build, *targets):
    return run([tool("cmake"), "--build", str(build), "--target", *targets], cwd=build)


def _staged(cache, name):
    """The staged copy a build of this test reads (its store is beside the cache: defines())."""
    (copy,) = (Path(cache).parent / "staged").glob(f"{name}-*")
    return copy


@pytest.mark.parametrize("tamper", ["edit", "symlink"])
def test_an_edit_after_configure_stops_the_next_build(filled, synthetic, pin, cache, tmp_path, tamper):
    """pip configures every build; `cmake --build`/ninja on a build dir does not. The configure
    staged the verified copy the build reads; the edit comes after it."""
    build = _configured(pin, cache, tmp_path / "build")
    staged = _staged(cache, "flash-attention")
    api = staged / "hopper/flash_api.cpp"
    assert any(c["file"] == str(api) for c in compile_commands(build)), "the build does not read the staged copy"
    if tamper == "edit":
        _edit_keeping_size_and_mtime(api)
        shown = "1 file changed (hopper/flash_api.cpp)"
    else:
        _replace_by_a_link_to_a_copy(api, tmp_path / "elsewhere")
        shown = "1 file replaced by a symlink (hopper/flash_api.cpp)"
    obj = _object_of(build, "hopper/flash_api.cpp")
    built = _build(build, obj)
    assert built.returncode != 0, built.output[-3000:]
    assert "the upstream sources changed since this build was configured" in built.text
    assert (f"flash_attention: the staged copy '{staged}' no longer holds commit {synthetic.fa_commit} as the "
            f"anchor says: {shown}") in built.text
    assert "Configure again, which stages it anew from the verified source" in built.text
    assert not (build / obj).exists(), "the unit was compiled from bytes nobody verified"
    assert not (build / "vfa_verified_sources.snapshot").exists()


def test_an_edit_of_the_cache_entry_after_configure_is_not_compiled(filled, synthetic, pin, cache, tmp_path):
    """The cache entry is read once, into the staged copy: what a writer of the cache does later
    reaches no compile."""
    build = _configured(pin, cache, tmp_path / "build")
    entry = _entry(cache, "flash-attention", synthetic.fa_commit)
    (entry / "hopper/flash_api.cpp").write_text('#error "edited in the cache after the configure"\n')
    assert not [c for c in compile_commands(build) if str(cache) in c["command"] or str(cache) in c["file"]]
    built = _build(build, "vfa_verified_sources")
    assert built.returncode == 0, built.output[-3000:]


@pytest.mark.parametrize("owner", ["world-writable", "foreign-owned"])
def test_a_cache_entry_others_can_write_is_read_only_through_the_staged_copy(filled, synthetic, pin, cache, tmp_path,
                                                                            owner):
    """Anyone on the machine may write such an entry: the build compiles none of it, only the
    copy this user staged and verified (on 0d62d60 the compile read the entry itself)."""
    if owner == "foreign-owned" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    for name, commit in (("flash-attention", synthetic.fa_commit), ("cutlass", synthetic.cutlass_commit)):
        entry = _entry(cache, name, commit)
        for path in [entry, *entry.rglob("*")]:
            if owner == "world-writable":
                path.chmod(path.stat().st_mode | 0o022)
            else:
                os.lchown(path, 4321, 4321)
    build = _configured(pin, cache, tmp_path / "build")
    store = Path(cache).parent / "staged"
    read = [c["file"] for c in compile_commands(build)]
    read += [i for c in compile_commands(build) for i in re.findall(r"(?:^|\s)-I(\S+)", c["command"])]
    upstream = [p for p in read if not p.startswith(str(build))]
    assert upstream and all(p.startswith(str(store)) for p in upstream), [p for p in upstream
                                                                          if not p.startswith(str(store))][:3]
    for copy in store.iterdir():
        for path in [copy, *copy.rglob("*")]:
            st = path.lstat()
            assert st.st_uid == os.geteuid() and not st.st_mode & 0o022, path


def test_a_staged_store_others_can_write_is_refused(filled, pin, cache, tmp_path):
    store = Path(cache).parent / "staged"
    store.mkdir(mode=0o777)
    store.chmod(0o777)
    result = fetch_sources(defines(pin, cache))
    assert result.returncode != 0
    assert f"the staging folder '{store}' is not this user's alone: group or others may write it (mode 777)" in result.text


FAKE_COMPILER = Path(__file__).resolve().parents[1] / "support" / "fake_compiler.py"


def _wait_for(path: Path, process: subprocess.Popen, bound: float = 300) -> None:
    deadline = time.monotonic() + bound
    while not path.exists():
        assert process.poll() is None, "the build ended before the unit started"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_an_edit_during_a_compile_undone_before_it_ends_fails_this_build(filled, synthetic, pin, cache, tmp_path):
    """The build-time check ran before the compiles; the edit comes while a unit compiles and is
    undone, size and mtime included, before it ends: the object may hold the edit. The proof before
    the link (inode and ctime of every staged entry since the check) fails this build and removes
    its objects, so the next build compiles them again (on 0d62d60 it linked, and the next build too)."""
    launcher = f"{sys.executable};{FAKE_COMPILER}"
    build = _configured(pin, cache, tmp_path / "build", CMAKE_CXX_COMPILER_LAUNCHER=launcher,
                        CMAKE_CUDA_COMPILER_LAUNCHER=launcher, VFA_BUILD_PROGRESS="off", VFA_BUILD_FA2="off",
                        VFA_BUILD_FA4="off")
    markers, go = tmp_path / "markers", tmp_path / "go"
    markers.mkdir()
    env = clean_env(FAKE_COMPILE_PLAN=json.dumps([["hopper/flash_api.cpp", f"wait-for:{go}"]]),
                    FAKE_MARKERS=str(markers))
    command = [tool("cmake"), "--build", str(build), "--target", "_vendored_fa3_C"]
    building = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    obj = Path(_object_of(build, "hopper/flash_api.cpp")).name
    _wait_for(markers / f"{obj}.started", building)
    api = _staged(cache, "flash-attention") / "hopper/flash_api.cpp"
    original, times = api.read_bytes(), os.stat(api)
    api.write_text('#error "compiled while it was edited"\n')
    api.write_bytes(original)
    os.utime(api, ns=(times.st_atime_ns, times.st_mtime_ns))
    go.touch()
    output, _ = building.communicate(timeout=600)
    text = " ".join(output.split())
    assert building.returncode != 0, output[-3000:]
    assert f"the staged copy '{api.parents[1]}' changed while this build compiled (hopper/flash_api.cpp)" in text
    assert "before _vendored_fa3_C is linked" in text
    assert not list(build.glob("CMakeFiles/_vendored_fa3_C.dir/**/*.o")), "an object of the edited bytes is left"
    again = run(command, env=clean_env())
    assert again.returncode == 0, again.output[-3000:]
    assert (build / _object_of(build, "hopper/flash_api.cpp")).exists()


@pytest.mark.parametrize("edit", ["spec", "stub", "stub writable by others"])
def test_the_build_dirs_own_inputs_edited_after_configure_stop_the_build(filled, pin, cache, tmp_path, edit):
    """The check's spec says what to check; the generated stub is compiled. Each is held to the
    digest the configure wrote, which lives in the build file's command (on 0d62d60 an emptied
    spec checked nothing and an edited stub was compiled); the stub, staged by content like the
    sources, also to their rules (a copy another user could write is not compiled)."""
    build = _configured(pin, cache, tmp_path / "build")
    if edit == "spec":
        spec = build / "vfa_verified_sources.json"
        data = json.loads(spec.read_text())
        data["components"] = []
        spec.write_text(json.dumps(data))
        shown = f"the source check's spec '{spec}' is not the one this build was configured with"
    elif edit == "stub":
        stub = _stub(build)
        stub.write_text(stub.read_text() + '\n#error "edited after the configure"\n')
        shown = f"the generated file '{stub}' is not what the configure wrote"
    else:
        stub = _stub(build)
        stub.chmod(0o666)
        shown = f"the generated file '{stub}' is not what the configure wrote (edited since: 1 entry that another user"
    built = _build(build, "vfa_verified_sources")
    assert built.returncode != 0, built.output[-3000:]
    assert shown in built.text


def test_a_clean_source_dir_edited_after_configure_stops_the_next_build(synthetic, pin, cache, tmp_path):
    src = _clone(synthetic, tmp_path / "fa", synthetic.fa_commit)
    build = _configured(pin, cache, tmp_path / "build", FLASH_ATTN_SRC_DIR=str(src))
    assert build_info(build)["upstream"]["matches_pin"] is True
    (src / "csrc/common/registration.h").write_text("#error edited after the configure\n")
    built = _build(build, "vfa_verified_sources")
    assert built.returncode != 0
    assert "1 file changed (csrc/common/registration.h)" in built.text
    assert f"Restore those files (git -C '{src}' status shows them), or configure again" in built.text


def test_the_build_time_check_passes_an_unchanged_tree_and_keeps_its_snapshot(filled, synthetic, pin, cache,
                                                                               tmp_path):
    build = _configured(pin, cache, tmp_path / "build")
    first = _build(build, "vfa_verified_sources")
    assert first.returncode == 0, first.output
    snapshot = build / "vfa_verified_sources.snapshot"
    # The staged sources and the generated FA2 file's staged folder (its content-addressed copy).
    assert sorted(json.loads(snapshot.read_text())) == sorted(
        str(_staged(cache, name)) for name in ("flash-attention", "cutlass", "fa2_missing_kernels"))
    written = snapshot.stat().st_mtime_ns
    time.sleep(0.05)
    again = _build(build, "vfa_verified_sources")
    assert again.returncode == 0, again.output
    assert "Verifying the upstream sources" in again.output  # it ran again ...
    assert snapshot.stat().st_mtime_ns == written  # ... and left the snapshot, so nothing after it reruns


def test_a_dirty_source_dir_is_not_held_to_the_pin_at_build_time(synthetic, pin, cache, tmp_path):
    # The build info says matches_pin: false already: nothing to hold it to.
    src = _clone(synthetic, tmp_path / "fa", synthetic.fa_commit)
    (src / "csrc/common/registration.h").write_text("// a local change\n")
    build = _configured(pin, cache, tmp_path / "build", FLASH_ATTN_SRC_DIR=str(src))
    assert build_info(build)["upstream"]["matches_pin"] is False
    (src / "csrc/common/registration.h").write_text("// another local change\n")
    built = _build(build, "vfa_verified_sources")
    assert built.returncode == 0, built.output
    assert "flash-attention" not in (build / "vfa_verified_sources.snapshot").read_text()


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


def test_a_server_that_answers_everything_but_serves_no_git_stops_at_the_first_contact(pin, cache):
    """200 and an empty body for every request: git took it for a dumb-HTTP repository without
    refs, and the partial clone's lazy fetches asked it again and again (1096 requests in 15 s
    measured) until VFA_FETCH_TIMEOUT."""
    with answers_everything_server() as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/fa.git"
        result = fetch_sources(defines(pin, cache, FLASH_ATTN_MIRROR=url, VFA_FETCH_STALL_TIMEOUT="3",
                                       VFA_FETCH_TIMEOUT="60"), timeout=120)
        requests = server.requests
    assert result.returncode != 0
    assert requests <= 8, f"{requests} requests"
    assert f"{url} answered, but not as a git repository: it lists no branch, tag or HEAD" in result.text
    assert "Check the URL (FLASH_ATTN_MIRROR, or the pin's url)" in result.text
    assert not list((cache / "src").glob("flash-attention-*"))


def _session_processes(sid: int) -> list[str]:
    """The processes of session <sid> still alive: (pid, command) from /proc."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name} {cmdline[:80]}")
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_a_mirror_that_lists_the_ref_and_answers_200_to_everything_stops_without_forking(synthetic, pin, cache):
    """It passes the first contact (it lists the pinned commit); then git's partial clone asked it
    again for every object it lacked, each lazy fetch a new git, over a thousand processes in 10 s,
    and the timeout ended only the first (0d62d60). Every git call now runs without lazy fetch, in a
    process group of its own that a timeout ends whole. The test bounds itself: it ends its own
    session after 90 s whatever happens."""
    with answers_everything_server(listed_commit=synthetic.fa_commit) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/fa.git"
        command = fetch_sources_command(defines(pin, cache, FLASH_ATTN_MIRROR=url, VFA_FETCH_TIMEOUT="10",
                                                VFA_FETCH_STALL_TIMEOUT="5"))
        start = time.monotonic()
        fetching = subprocess.Popen(command, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
        try:
            output, _ = fetching.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            output = "(still running after 90 s)"
        took = time.monotonic() - start
        left = _session_processes(fetching.pid)
        os.killpg(fetching.pid, signal.SIGKILL) if left or fetching.poll() is None else None
        fetching.wait()
        requests = server.requests
    text = " ".join(output.split())
    assert fetching.returncode != 0
    assert took < 60, f"{took:.0f} s, {requests} requests: {output[-2000:]}"
    assert left == [], f"{len(left)} processes left: {left[:5]}"
    assert requests < 100, f"{requests} requests"
    assert f"flash_attention (commit {synthetic.fa_commit}): FAILED" in text
    assert url in text
    assert not list((cache / "src").glob("flash-attention-*"))


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


# A password with '@' in it, and a query string: both once survived a scrubber.
# (curl refuses a raw '@' in a password it is to use; git users write %40.)
SECRET_URL_FORMS = {"password": "http://ci:s3cret-token@{host}/flash-attention",
                    "password-encoded-at": "http://ci:s3cret%40-token@{host}/flash-attention",
                    "password-with-at": "http://ci:s3cret@-token@{host}/flash-attention",
                    "query": "http://{host}/flash-attention?token=s3cret-token"}


@pytest.mark.parametrize("form", ["password", "password-encoded-at"])
def test_mirror_credentials_stay_out_of_logs_cache_and_build_info(synthetic, pin, cache, form):
    with stalling_git_server(synthetic.root, answer=1000) as base:
        secret_url = SECRET_URL_FORMS[form].format(host=base.split("//")[1].rstrip("/"))
        # In the environment: a -D value would be refused (below).
        result = fetch_sources(defines(pin, cache), env=clean_env(FLASH_ATTN_MIRROR=secret_url), timeout=120)
    assert result.returncode == 0, result.output
    fa = result.sources()["flash_attention"]
    assert fa["matches_pin"] is True and fa["url"] == base + "flash-attention"
    entry = _entry(cache, "flash-attention", synthetic.fa_commit)
    leaks = [p for p in cache.rglob("*") if p.is_file() and b"s3cret-token" in p.read_bytes()]
    assert "s3cret-token" not in result.output and leaks == []
    assert json.loads((entry / ".vfa-source.json").read_text())["url"] == base + "flash-attention"
    assert "s3cret" not in result.output


def test_credentials_in_a_failing_mirrors_url_stay_out_of_the_message(pin, cache):
    # git repeats the URL it could not reach in its error; the query string too.
    result = fetch_sources(defines(pin, cache), env=clean_env(
        FLASH_ATTN_MIRROR="file:///nonexistent/fa.git?token=s3cret-token",
        CUTLASS_MIRROR="https://ci:s3cret@-token@127.0.0.1:9/cutlass.git"))
    assert result.returncode != 0
    assert "s3cret" not in result.output
    assert "file:///nonexistent/fa.git" in result.text and "https://127.0.0.1:9/cutlass.git" in result.text


@pytest.mark.parametrize("form", sorted(SECRET_URL_FORMS))
def test_credentials_in_a_cmake_definition_are_refused(pin, cache, form):
    secret_url = SECRET_URL_FORMS[form].format(host="git.example")
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_MIRROR=secret_url))
    assert result.returncode != 0
    assert "FLASH_ATTN_MIRROR was given as a CMake definition" in result.text
    assert "credential helper" in result.text and "in the environment" in result.text
    assert "s3cret" not in result.output.replace(secret_url, "")  # only cmake's own echo, if any
    assert not (cache / "src").exists() or not list((cache / "src").glob("flash-attention-*"))


def test_an_interrupt_during_a_fetch_stops_and_says_so(synthetic, pin, cache):
    with stalling_git_server(synthetic.root, answer=2) as base:
        command = fetch_sources_command(defines(pin, cache, FLASH_ATTN_MIRROR=base + "flash-attention",
                                                VFA_FETCH_STALL_TIMEOUT="120"))
        # Its own process group, as a shell gives a job: Ctrl-C reaches every process in it. With
        # SIGINT ignored, as a script's background job or a CI runner's step has it: then CMake
        # lives on (a CMake that does not ignore it just dies), while git, whose signals CMake
        # resets, ends, and CMake read that as a timeout and went on to the next repository.
        proc = subprocess.Popen(["sh", "-c", 'trap "" INT; exec "$@"', "sh", *command], env=clean_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while not list(cache.glob("src/flash-attention-*.partial-*")) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(2)  # past the first contact, into the fetch the server never answers
            os.killpg(proc.pid, signal.SIGINT)
            output, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = " ".join(output.split())
    assert proc.returncode != 0
    assert "interrupted (User interrupt) while running git" in text and "stopped here" in text
    assert "VFA_FETCH_TIMEOUT" not in text and "does not answer" not in text
    assert not list(cache.glob("src/cutlass-*")), "it went on to fetch the next repository"


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

            waiting = fetch_sources(defines(pin, cache, VFA_SOURCE_LOCK_TIMEOUT="1"), timeout=120)
            assert waiting.returncode != 0
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


# --- the cache's marker and what a configure records -------------------------------------


def test_a_mirror_path_with_a_backslash_and_a_quote_is_recorded_readably(synthetic, pin, cache, tmp_path):
    """The marker was written by pasting strings into JSON: a '\\' in a mirror's path made the
    entry unreadable ("not the JSON a fetch writes"), and the fix it named (remove it, fetch
    again) wrote the same marker again."""
    mirror = tmp_path / 'odd\\dir "x"' / "flash-attention.git"
    mirror.parent.mkdir()
    subprocess.run(["git", "clone", "-q", "--bare", synthetic.fa_url, str(mirror)], check=True)
    url = f"file://{mirror}"  # a URL is taken as it is (a path's '\\' would be a separator to CMake)
    first = fetch_sources(defines(pin, cache, FLASH_ATTN_MIRROR=url))
    assert first.returncode == 0, first.output
    assert first.sources()["flash_attention"]["url"] == url
    marker = _entry(cache, "flash-attention", synthetic.fa_commit) / ".vfa-source.json"
    assert json.loads(marker.read_text())["url"] == url
    again = fetch_sources(defines(pin, cache, FLASH_ATTN_MIRROR=url))
    assert again.returncode == 0, again.output
    assert again.sources()["flash_attention"]["origin"] == "cache"


def test_a_configure_that_waited_for_anothers_fetch_records_cache(filled, synthetic, pin, cache, tmp_path):
    """It took the entry from the cache; "fetched" would say it fetched."""
    import fcntl

    entry = _entry(cache, "flash-attention", synthetic.fa_commit)
    shutil.move(entry, tmp_path / "fetched-by-the-other-build")
    lock = cache / "src" / f".{entry.name}.lock"
    log = tmp_path / "waiting.log"
    with lock.open("a") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)  # the other build, fetching (CMake's file(LOCK) is fcntl too)
        with log.open("w") as out:
            waiting = subprocess.Popen(fetch_sources_command(defines(pin, cache)), env=clean_env(), stdout=out,
                                       stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while "waiting up to" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "waiting up to" in log.read_text(), log.read_text()
            shutil.move(tmp_path / "fetched-by-the-other-build", entry)  # its fetch is done
        finally:
            fcntl.lockf(held, fcntl.LOCK_UN)
        waiting.wait(timeout=120)
    output = log.read_text()
    assert waiting.returncode == 0, output
    assert "was fetched by another build while this one waited" in output
    fa = next(json.loads(line[len("VFA_SOURCE "):]) for line in output.splitlines()
              if line.startswith("VFA_SOURCE ") and '"flash_attention"' in line)
    assert fa["origin"] == "cache" and fa["matches_pin"] is True


# --- the same rules in a configure -------------------------------------------------


@pytest.fixture(scope="module")
def relative_configure(synthetic, tmp_path_factory):
    """Fill a cache through fetch_sources, then configure from another working
    directory, both with the same paths relative to the project, and a dirty
    flash-attention checkout (relative too)."""
    root = tmp_path_factory.mktemp("relative")
    synthetic.write_pin(root / "pin.json")
    relative = {"VFA_PIN_FILE": os.path.relpath(root / "pin.json", PROJECT),
                "VFA_SOURCE_CACHE": os.path.relpath(root / "cache", PROJECT),
                "VFA_STAGED_SOURCES": os.path.relpath(root / "staged", PROJECT)}
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
    assert f"cutlass {synthetic.cutlass_commit} (cache) at " in relative_configure["result"].text
    assert f", staged from {cutlass}\n" in relative_configure["result"].output
    assert f"(cache) at {root / 'staged'}/cutlass-" in relative_configure["result"].text
    assert f"flash_attention {synthetic.fa_commit} (source_dir) at {root / 'fa'}" in relative_configure["result"].text


def test_a_dirty_source_dir_is_recorded_in_the_build_info(synthetic, relative_configure):
    upstream = relative_configure["info"]["upstream"]
    assert upstream == {**upstream, "commit": synthetic.fa_commit, "matches_pin": False, "dirty": True,
                        "verified": True, "origin": "source_dir"}
    cutlass = relative_configure["info"]["cutlass"]
    assert cutlass == {**cutlass, "matches_pin": True, "dirty": False, "verified": True, "origin": "cache"}


# --- verifying runs nothing of the verified repository ------------------------------


def _with_clean_filter(repo, marker):
    """A repository whose own config names a clean filter (a command) for every file,
    as a checkout from someone else could: git runs it whenever it hashes a file
    the way `git add` does."""
    subprocess.run(["git", "-C", str(repo), "config", "filter.planted.clean", f"touch '{marker}'; cat"], check=True)
    (repo / ".gitattributes").write_text("* filter=planted\n")
    # Under the pin's paths too: a .gitattributes there applies to the files beside it.
    (repo / "hopper/.gitattributes").write_text("* filter=planted\n")
    return repo


def test_verifying_a_source_dir_runs_none_of_its_configured_commands(synthetic, pin, cache, tmp_path):
    src = _with_clean_filter(_clone(synthetic, tmp_path / "fa", synthetic.fa_commit), tmp_path / "ran")
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_SRC_DIR=str(src)))
    assert result.returncode == 0, result.output
    assert not (tmp_path / "ran").exists(), "the verification ran the repository's clean filter"
    # The planted hopper/.gitattributes is a file the commit does not have: seen, not run.
    assert "1 file added (hopper/.gitattributes)" in result.text
    assert result.sources()["flash_attention"]["dirty"] is True


def test_verifying_a_cache_entry_runs_none_of_its_configured_commands(filled, synthetic, pin, cache, tmp_path):
    _with_clean_filter(_entry(cache, "flash-attention", synthetic.fa_commit), tmp_path / "ran")
    (_entry(cache, "flash-attention", synthetic.fa_commit) / "hopper/.gitattributes").unlink()
    result = fetch_sources(defines(pin, cache))
    assert not (tmp_path / "ran").exists(), "the verification ran the repository's clean filter"
    assert result.returncode == 0, result.output
    assert result.sources()["flash_attention"]["matches_pin"] is True


# --- what the compile can see -----------------------------------------------------------


def _compile_only(command: str) -> subprocess.CompletedProcess:
    """A C++ unit's compile command from compile_commands.json, checked for syntax only."""
    args = command.split()
    out = args.index("-o")
    del args[out:out + 2]
    return subprocess.run([*args, "-fsyntax-only"], capture_output=True, text=True)


def test_files_outside_the_verified_paths_are_not_on_the_include_path(filled, synthetic, pin, cache, tmp_path):
    # A header planted in a cache entry beside the verified folders: csrc/ is not
    # under the pin's paths, so the content check does not look there. Were csrc/ on
    # the include path, it would shadow CUTLASS's header of the same name.
    fa = _entry(cache, "flash-attention", synthetic.fa_commit)
    for planted in ("csrc/cutlass/numeric_types.h", "csrc/cute/tensor.hpp"):
        (fa / planted).parent.mkdir(parents=True, exist_ok=True)
        (fa / planted).write_text('#error "a planted header was compiled"\n')
    build = tmp_path / "build"
    result = configure(build, defines(pin, cache, VFA_PRESET="minimal", VFA_COMPILER_CACHE="off"))
    assert result.returncode == 0, result.output
    fa2_api = next(c["command"] for c in compile_commands(build) if c["file"].endswith("csrc/flash_attn/flash_api.cpp"))
    compiled = _compile_only(fa2_api)
    assert "planted" not in compiled.stderr and compiled.returncode == 0, compiled.stderr
    verified = [fa / p for p in json.loads(pin.read_text())["flash_attention"]["paths"]]
    verified += [_entry(cache, "cutlass", synthetic.cutlass_commit) / "include"]
    for entry in compile_commands(build):
        for include in re.findall(r"(?:^|\s)-I(\S+)", entry["command"]):
            inside = Path(include)
            if str(inside).startswith(str(cache)):
                assert any(inside == v or v in inside.parents for v in verified), (
                    f"{inside} is on the include path but not under the pin's paths")


def test_an_include_dir_outside_the_pins_paths_is_refused(synthetic, pin, cache, tmp_path):
    # A pin that no longer verifies csrc/common, which FA2 and FA3 include from.
    data = json.loads(pin.read_text())
    data["flash_attention"]["paths"].remove("csrc/common")
    data["flash_attention"]["required_files"] = [
        f for f in data["flash_attention"]["required_files"] if not f.startswith("csrc/common/")]
    pin.write_text(json.dumps(data))
    synthetic.write_anchor(pin)
    src = _clone(synthetic, tmp_path / "fa", synthetic.fa_commit)
    result = configure(tmp_path / "build", defines(pin, cache, FLASH_ATTN_SRC_DIR=str(src), VFA_PRESET="minimal",
                                                   VFA_COMPILER_CACHE="off"))
    assert result.returncode != 0
    paths = ", ".join(data["flash_attention"]["paths"])
    assert "families.fa2.build.include_dirs names the include directory 'csrc/common'" in result.text
    assert f"it is not under flash_attention.paths ({paths}) of the pin file '{pin}'" in result.text


def _project_declaring(tmp_path, family, field, value):
    """A copy of the project whose declaration gives <family> another build.<field>."""
    project = checkout_copy(tmp_path / "project")
    path = project / "cmake" / "knobs.json"
    data = json.loads(path.read_text())
    data["families"][family]["build"][field] = value
    path.write_text(json.dumps(data, indent=2) + "\n")
    return project


@pytest.mark.parametrize("field, value, shown", [
    # '..' from a verified folder: csrc/ itself, where a planted csrc/cutlass/numeric_types.h would
    # shadow CUTLASS's header (the prefix check took 'csrc/flash_attn/..' for a folder under csrc/flash_attn).
    ("include_dirs", [["flash_attention", "csrc/flash_attn/..", "csrc/flash_attn/src", "csrc/common"],
                      ["cutlass", "include"]],
     "families.fa2.build.include_dirs names the include directory 'csrc/flash_attn/..'"),
    # A file of the upstream tree that no check covers (outside the pin's paths).
    ("sources", ["csrc/flash_attn/flash_api.cpp", "setup.py"], "families.fa2.build.sources names 'setup.py'"),
], ids=["include-dotdot", "source-outside"])
def test_a_declared_path_outside_the_verified_tree_stops_the_configure(filled, pin, cache, tmp_path, field, value,
                                                                       shown):
    project = _project_declaring(tmp_path, "fa2", field, value)
    result = configure(tmp_path / "build", defines(pin, cache, VFA_PRESET="minimal", VFA_COMPILER_CACHE="off"),
                       source_dir=project)
    assert result.returncode != 0, result.output[-3000:]
    assert shown in result.text
    assert "Fix families.fa2.build." in result.text


# --- the user's git settings do not change what a fetch writes ----------------------------


def test_the_users_git_settings_do_not_change_what_a_fetch_writes(synthetic, pin, cache, tmp_path):
    home = tmp_path / "home"
    (home / "templates/hooks").mkdir(parents=True)
    hook = home / "templates/hooks/post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch '{tmp_path / 'hook-ran'}'\n")
    hook.chmod(0o755)
    (home / "attributes").write_text("*.h text eol=crlf\n")
    (home / ".gitconfig").write_text(
        "[core]\n\tautocrlf = true\n\tattributesFile = " + str(home / "attributes") + "\n"
        "[init]\n\ttemplateDir = " + str(home / "templates") + "\n")
    fetched = fetch_sources(defines(pin, cache), env=clean_env(HOME=str(home), XDG_CONFIG_HOME=str(home)))
    assert fetched.returncode == 0, fetched.output
    assert fetched.sources()["flash_attention"]["matches_pin"] is True
    crlf = [p for p in cache.rglob("*") if p.is_file() and ".git" not in p.parts and b"\r\n" in p.read_bytes()]
    assert crlf == [], f"CRLF written: {crlf[:3]}"
    assert not (tmp_path / "hook-ran").exists(), "a hook of the user's git template ran"
    # Every other user of the cache sees it as fetched: unmodified.
    again = fetch_sources(defines(pin, cache), env=clean_env(HOME=str(tmp_path)))
    assert again.returncode == 0, again.output
    assert {s["origin"] for s in again.sources().values()} == {"cache"}


# --- generated files are staged by content, like the sources ---------------------------------


def _stub(build):
    (stub,) = [c["file"] for c in compile_commands(build) if "fa2_missing_kernels" in c["file"]]
    return Path(stub)


def test_the_quick_start_works_with_a_read_only_source_cache(filled, pin, cache, tmp_path):
    for lock in (cache / "src").glob(".*.lock"):
        lock.unlink()
    build = tmp_path / "build"
    command = configure_command(build, defines(pin, cache, VFA_PRESET="minimal", VFA_COMPILER_CACHE="off"))
    result = _read_only(cache, command, clean_env())
    assert result.returncode == 0, result.output
    # Compiled from the user's staged store (defines(): beside the cache), not from the build dir.
    assert _stub(build).parent.parent == cache.parent / "staged"
    assert sorted(p.name for p in cache.iterdir()) == ["src"], "the configure wrote into the source cache"


def test_the_generated_file_compiles_to_the_same_bytes_in_any_build_dir(filled, pin, cache, tmp_path):
    """Its path depends on its content only (the compiler cache keys on it: a generated file in
    the build dir missed the cache in every new build dir), and its bytes on neither path."""
    objects, stubs = [], []
    for name in ("build-a", "elsewhere/build-b"):
        build = tmp_path / name
        result = configure(build, defines(pin, cache, VFA_PRESET="minimal", VFA_COMPILER_CACHE="off"))
        assert result.returncode == 0, result.output
        entry = next(c for c in compile_commands(build) if "fa2_missing_kernels" in c["file"])
        stubs.append(Path(entry["file"]))
        args = entry["command"].split()
        out = args[args.index("-o") + 1]
        compiled = subprocess.run(args, cwd=entry["directory"], capture_output=True, text=True)
        assert compiled.returncode == 0, compiled.stderr
        objects.append((Path(entry["directory"]) / out).read_bytes())
        assert str(build).encode() not in objects[-1], "the build dir's path is in the compiled stub"
        assert str(stubs[-1].parent).encode() not in objects[-1], "the staged store's path is in the compiled stub"
    assert stubs[0] == stubs[1] and stubs[0].parent.parent == cache.parent / "staged", stubs
    assert objects[0] == objects[1]


@pytest.mark.parametrize("tamper", ["cut short", "writable by others"])
def test_an_edited_generated_file_is_written_anew_by_the_next_configure(filled, pin, cache, tmp_path, tamper):
    """The staged copy is reused only when its bytes are what the configure computes and only
    this user can write it (cmake/vfa_build/sources/staged_tree.py), as the staged sources are."""
    build = tmp_path / "build"
    knobs = defines(pin, cache, VFA_PRESET="minimal", VFA_COMPILER_CACHE="off")
    result = configure(build, knobs)
    assert result.returncode == 0, result.output
    stub = _stub(build)
    written = stub.read_text()
    if tamper == "cut short":
        stub.write_text(written[: len(written) // 2])  # as by a full disk
    else:
        stub.chmod(0o666)
    again = configure(build, knobs)  # what every pip build of this build dir runs first
    assert again.returncode == 0, again.output
    assert _stub(build) == stub and stub.read_text() == written
    assert stub.stat().st_mode & 0o777 == 0o644


# --- messages that name the right cause --------------------------------------------------


def test_a_source_dir_that_is_a_file_says_so(pin, cache, tmp_path):
    (tmp_path / "flash-attention.tar").write_text("not a folder")
    result = fetch_sources(defines(pin, cache, FLASH_ATTN_SRC_DIR=str(tmp_path / "flash-attention.tar")))
    assert result.returncode != 0
    assert f"FLASH_ATTN_SRC_DIR points to '{tmp_path / 'flash-attention.tar'}', which is a file, not a folder" in result.text
    assert "does not exist" not in result.text


def test_a_relative_xdg_cache_home_is_ignored_and_nothing_is_written_where_cmake_runs(synthetic, pin, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = fetch_sources({"VFA_PIN_FILE": str(pin)}, cwd=elsewhere,
                           env=clean_env(XDG_CACHE_HOME="relative-cache", HOME=str(home)))
    assert result.returncode == 0, result.output
    assert "XDG_CACHE_HOME='relative-cache' is not an absolute path" in result.text
    fa = result.sources()["flash_attention"]
    assert fa["source_dir"].startswith(str(home / ".cache/vendored-flash-attn/src/")) and fa["matches_pin"] is True
    assert not list(elsewhere.iterdir())


def _with_a_full_disk(folder, size, cmd, env):
    """Runs cmd with <folder> on a tmpfs of <size>, in a private mount namespace."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.fail("cannot mount a small filesystem here: no unshare -rm (user and mount namespaces)")
    folder.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o size={size} tmpfs "$0" && exec "$@"'
    return run(["unshare", "-rm", "sh", "-c", script, str(folder), *cmd], env=env)


@pytest.mark.parametrize("size", ["64k", "256k"])  # full during the fetch, and during the checkout
def test_a_disk_that_fills_during_a_fetch_is_named_as_the_cause(pin, cache, size):
    result = _with_a_full_disk(cache, size, fetch_sources_command(defines(pin, cache)), clean_env())
    assert result.returncode != 0
    assert f"git could not write into '{cache / 'src'}'" in result.text
    assert "this machine's disk, not the network" in result.text
    assert "Free space there, or set VFA_SOURCE_CACHE to a folder with room" in result.text
    assert "point FLASH_ATTN_MIRROR" not in result.text and "point CUTLASS_MIRROR" not in result.text
    assert "more lines" in result.text or result.text.count("unable to write file") <= 5


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
