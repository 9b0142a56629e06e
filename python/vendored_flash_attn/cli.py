"""``python -m vendored_flash_attn info``: what was built, what loads, what gets picked.

Works without a GPU and without build info (then it says so and exits 1, the only
non-zero exit). ``--json`` prints the same report as one JSON object.

Where the sources came from: the wheel's build_info.json names each source's pin URL only
(cmake/BuildInfo.cmake keeps the mirror a build fetched from, a reading of that machine, out
of the wheel so that builds are reproducible). The build dir's build_info.json has it,
scrubbed of credentials by the build (cmake/vfa_build/url_secrets.py). ``info`` reads it from
``--build-dir DIR``, else from ``build/*/`` under the current directory (pyproject.toml's
build-dir, where ``pip install .`` builds) -- only a build dir whose
``build_info.wheel.json`` is exactly the installed record, i.e. the build that made this
package.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Optional

from .selection import measured
from .declaration.build_info import BuildInfo, BuildInfoMissing
from .selection.environment import current_environment
from .declaration.families import registry

COMPONENT_FIELDS = ("built", "module", "gencode", "head_dims", "dtypes", "features", "sources", "reason",
                    "precompiled")
# The mirror knob of each source (the knob's value is not recorded: a URL may hold credentials).
MIRROR_KNOB_SOURCES = {"FLASH_ATTN_MIRROR": "upstream", "CUTLASS_MIRROR": "cutlass"}
SOURCE_MIRROR_KNOBS = {source: knob for knob, source in MIRROR_KNOB_SOURCES.items()}
# In a build dir (cmake/BuildInfo.cmake): the whole record, and exactly what the wheel got.
BUILD_DIR_RECORD = "build_info.json"
BUILD_DIR_WHEEL_RECORD = "build_info.wheel.json"
DEFAULT_BUILD_DIRS = "build/*"  # pyproject.toml's build-dir, build/{wheel_tag}


def _read_json(path: Path) -> Optional[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def find_build_dir_record(installed: dict, build_dir: Optional[str] = None) -> tuple[Optional[str], Optional[dict], str]:
    """(the build dir record's path, its content, why none) of the build that made the
    installed package: ``build_dir``, else a ``build/*`` folder of the current directory,
    whose wheel record equals ``installed``."""
    candidates = [Path(build_dir)] if build_dir else sorted(Path(".").glob(DEFAULT_BUILD_DIRS))
    for folder in candidates:
        if _read_json(folder / BUILD_DIR_WHEEL_RECORD) == installed:
            record = _read_json(folder / BUILD_DIR_RECORD)
            if record is not None:
                return str(folder / BUILD_DIR_RECORD), record, ""
    if build_dir:
        return None, None, (f"{build_dir} holds no {BUILD_DIR_RECORD} of the build that made this package "
                            f"(its {BUILD_DIR_WHEEL_RECORD} differs from the installed record)")
    return None, None, (f"not in the wheel, which names the pin's URL; `info --build-dir <build dir>` reads "
                        f"the {BUILD_DIR_RECORD} of the build that made it")


def _source_origins(raw: dict, record: Optional[dict]) -> dict:
    """Per source: the pin's URL (the wheel's record), and where the build got it (its build
    dir's record: origin and URL as the build recorded them)."""
    sources = {}
    for key in MIRROR_KNOB_SOURCES.values():
        wheel = raw.get(key) or {}
        built = (record or {}).get(key) or {}
        sources[key] = {"pin_url": wheel.get("url") if wheel.get("origin") != "source_dir" else None,
                        "origin": built.get("origin") if record else None,
                        "url": built.get("url") if record else None}
    return sources


def _component(raw: dict) -> dict:
    return {key: raw[key] for key in COMPONENT_FIELDS if key in raw}


def _build_summary(info: BuildInfo) -> dict:
    raw = info.raw
    summary = {
        "preset": info.preset,
        "upstream": raw.get("upstream", {}),
        "cutlass": raw.get("cutlass", {}),
    }
    # Every declared family, from its own record (FA4's is _fa4/build_info.json).
    for family in registry():
        comp = info.components[family.name]
        summary[family.name] = _component(
            raw.get(family.record_key, {"built": False}) if family.record_key is not None else {
                "built": comp.built, "module": comp.module, "gencode": list(comp.gencode),
                "dtypes": list(comp.dtypes), "features": list(comp.features), "sources": comp.sources,
                "reason": comp.reason, "precompiled": [dict(run) for run in comp.precompiled]})
    # The knobs (every build knob: value and origin), VFA_* settings that were no knob,
    # and the machine-dependent choices, as build_info.json has them.
    for key in ("torch", "cuda", "compiler", "compiler_cache", "cuda_driver_call", "split_compile", "build",
                "options", "unknown_settings"):
        if key in raw:
            summary[key] = raw[key]
    return summary


def collect(build_dir: Optional[str] = None) -> dict:
    """The whole report as plain data (what ``--json`` prints); ``build_dir``: where to read
    the build dir's record (find_build_dir_record)."""
    from .call.debug_checks import DEBUG_ENV
    from .selection.selector import ENV_VAR, requested_version, select_flash_attn_version, version_problem

    from . import __version__

    env = current_environment()
    report: dict[str, Any] = {"package": {"name": "vendored-flash-attn", "version": __version__},
                              "build": None, "build_error": None,
                              "runtime": env.runtime_versions(), "modules": {},
                              "environment": {ENV_VAR: env.getenv(ENV_VAR),
                                              DEBUG_ENV: env.getenv(DEBUG_ENV)},
                              "config_error": None, "devices": [], "selection": None}
    info: Optional[BuildInfo] = None
    try:
        info = env.build_info()
        report["build"] = _build_summary(info)
    except BuildInfoMissing as exc:
        report["build_error"] = str(exc)
    if info is not None:
        path, record, why = find_build_dir_record(info.raw, build_dir)
        report["build"]["build_dir_record"] = path
        report["build"]["build_dir_record_missing"] = why or None
        report["build"]["sources"] = _source_origins(info.raw, record)
    for family in registry():
        comp = info.component(family.version) if info else None
        if comp is not None and not comp.built:
            report["modules"][family.name] = {"built": False, "loads": False,
                                              "error": comp.reason or "not built"}
            continue
        error = env.load_module(family.version)
        report["modules"][family.name] = {"built": bool(comp and comp.built),
                                          "loads": error is None, "error": error}
    try:
        requested_version()
    except ValueError as exc:
        report["config_error"] = str(exc)
    count = env.device_count()
    with warnings.catch_warnings():
        # Fallbacks are part of the report; don't also print them as warnings.
        warnings.simplefilter("ignore")
        if count == 0 and report["config_error"] is None:
            selection = select_flash_attn_version()
            report["selection"] = {"version": selection.version, "reason": selection.reason}
        for index in range(count):
            major, minor = env.capability(index)
            device = {"index": index, "name": env.device_name(index),
                      "capability": f"{major}.{minor}", "selected": None, "reason": None,
                      "fallbacks": [], "unsupported": {}}
            if report["config_error"] is None:
                selection = select_flash_attn_version(device=index)
                device.update(selected=selection.version, reason=selection.reason, headline=selection.headline,
                              notes=list(selection.notes), fallbacks=list(selection.fallbacks))
            for family in registry():
                device["unsupported"][family.name] = version_problem(family.version, index)
            report["devices"].append(device)
    # What the defaults were decided on (measured.json): the generations of the GPUs here and
    # every generation measured.
    data = measured.load()
    majors = {int(d["capability"].split(".")[0]) for d in report["devices"]}
    majors |= {int(m) for m in (data.get("serving") or {}) if str(m).isdigit()}
    report["measured"] = {"error": data.get("error"),
                          "serving": {str(m): measured.serving(m, data) for m in sorted(majors)}}
    return report


def _precompiled_text(runs: list) -> str:
    """What a family ships compiled (FA4): per arch and Python; the rest compiles at first use."""
    import sys

    if not runs:
        return "none (each kernel compiles at its first use, then comes from the user cache)"
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    text = ", ".join(f"{run.get('arch')} Python {run.get('python')}: {run.get('kernels')} ({run.get('flavour')}"
                     + (f", Python {run['files_of']}'s files" if run.get("files_of") else "") + ")"
                     for run in runs)
    if not any(run.get("python") == here for run in runs):
        text += f"; none for this Python ({here}): its kernels compile at first use"
    return text


def _yes(flag: Any) -> str:
    return "yes" if flag else "NO"


def _list(values) -> str:
    return ", ".join(str(v) for v in values) if values else "-"


def _knob_value(build: dict, name: str, knob: dict) -> str:
    """A knob's recorded value; for a mirror knob, the URL its source was fetched from, as
    the build dir's record has it (the wheel's names the pin's URL)."""
    value = str(knob.get("value", ""))
    source = MIRROR_KNOB_SOURCES.get(name)
    if not source or value != "(not recorded)":
        return value
    url = ((build.get("sources") or {}).get(source) or {}).get("url")
    if url:
        return f"{url} (from {build['build_dir_record']}, credentials left out)"
    return "(set; the mirror's URL is in the build dir's build_info.json)"


def _origin_lines(build: dict, key: str) -> list[str]:
    """Where a source came from: the pin's URL, and what the build used, each labelled."""
    source = (build.get("sources") or {}).get(key)
    if not source:
        return []
    lines = [f"    the pin's URL:  {source['pin_url']}"] if source.get("pin_url") else []
    origin, url, pin = source.get("origin"), source.get("url"), source.get("pin_url")
    knob = SOURCE_MIRROR_KNOBS[key]
    if origin is None:
        lines.append(f"    fetched from:   {build.get('build_dir_record_missing')}")
        return lines
    where = f" ({build['build_dir_record']})"
    mirror = url and pin and url != pin
    if origin == "source_dir":
        lines.append(f"    built from:     a local source directory{where}")
    elif origin == "fetched":
        lines.append(f"    fetched from:   {url} (the mirror, {knob}){where}" if mirror
                     else f"    fetched from:   the pin's URL, by this build{where}")
    else:  # "cache": the source cache was filled before this build
        lines.append(f"    from the source cache, filled from {url} (a mirror){where}" if mirror
                     else f"    from the source cache, filled from the pin's URL{where}")
    return lines


def _knob_lines(build: dict) -> list[str]:
    """The knobs that were not at their default, and settings that were no knob."""
    options = build.get("options")
    if options is None:
        return []
    changed = [f"{name}={_knob_value(build, name, knob)} ({knob.get('origin', '?')})"
               for name, knob in sorted(options.items()) if knob.get("origin", "default") != "default"]
    lines = ["  knobs not at their default: " + (", ".join(changed) if changed else "none")]
    for unknown in build.get("unknown_settings") or []:
        source = "environment" if unknown.get("source") == "env" else "-D"
        hint = f"; did you mean {unknown['did_you_mean']}?" if unknown.get("did_you_mean") else ""
        lines.append(f"  IGNORED at build time, not a knob: {unknown.get('name')} ({source}{hint})")
    return lines


def render(report: dict) -> str:
    package = report.get("package") or {}
    lines: list[str] = [f"{package.get('name', 'vendored-flash-attn')} {package.get('version', '-')}", ""]
    build = report["build"]
    if build is None:
        lines += ["Build info: MISSING", f"  {report['build_error']}"]
    else:
        up, cut = build["upstream"], build["cutlass"]
        lines += [
            f"Build info (preset: {build['preset'] or '-'})",
            f"  upstream flash-attention: {up.get('commit', '-')} (matches pin: {_yes(up.get('matches_pin'))}"
            + (f", pin {up['pinned_commit']}" if not up.get("matches_pin") and up.get("pinned_commit") else "") + ")",
            *_origin_lines(build, "upstream"),
            f"  CUTLASS:                  {cut.get('commit', '-')} (matches pin: {_yes(cut.get('matches_pin'))})",
            *_origin_lines(build, "cutlass"),
        ]
        for key in registry().names():
            comp = build[key]
            if not comp.get("built"):
                lines.append(f"  {key.upper()}: not built" + (f" ({comp['reason']})" if comp.get("reason") else ""))
                continue
            lines.append(
                f"  {key.upper()}: {comp.get('module', '?')}  archs {_list(comp.get('gencode'))}  "
                f"head dims {_list(comp.get('head_dims'))}  dtypes {_list(comp.get('dtypes'))}  "
                f"features {_list(comp.get('features'))}")
            if "precompiled" in comp:
                lines.append(f"    precompiled kernels: {_precompiled_text(comp['precompiled'])}")
        versions = [f"torch {build.get('torch', {}).get('version', '-')}",
                    f"CUDA {build.get('cuda', {}).get('version', '-')}"]
        if "compiler" in build:
            comp = build["compiler"]
            versions.append("compiler " + (" ".join(f"{k}={v}" for k, v in comp.items())
                                           if isinstance(comp, dict) else str(comp)))
        lines.append("  built with: " + ", ".join(versions))
        cache = build.get("compiler_cache")
        if cache is not None:
            where = ", ".join(x for x in (cache.get("location"), cache.get("rw_mode")) if x)
            lines.append(f"  compiler cache: {cache.get('launcher') or '-'} "
                         f"({'enabled' if cache.get('enabled') else 'disabled'}{': ' + where if where else ''})")
            dist = cache.get("dist") or {}
            if dist.get("scheduler"):
                lines.append(f"  distributed compiles: {'yes' if dist.get('distributed') else 'no'} "
                             f"(sccache-dist scheduler {dist['scheduler']}, {dist.get('state', '-')}, "
                             f"{dist.get('remote_jobs', 0)} remote jobs)")
        driver = build.get("cuda_driver_call")
        if driver:
            lines.append(f"  CUTLASS driver calls: {driver.get('mode', '-')} ({driver.get('reason', '')})")
        split = build.get("split_compile")
        if split and split.get("threads") is not None:
            lines.append(f"  nvcc --split-compile={split['threads']}: {', '.join(split.get('units') or [])}")
        lines += _knob_lines(build)
    runtime = report["runtime"]
    lines += ["", "This machine",
              f"  torch {runtime.get('torch') or '-'}, CUDA runtime {runtime.get('cuda') or '-'}"]
    for key, module in report["modules"].items():
        state = "loads" if module["loads"] else f"does not load: {module['error']}"
        lines.append(f"  {key.upper()} module: {state}")
    for name, value in report["environment"].items():
        lines.append(f"  {name}: {value if value is not None else 'unset'}")
    if report["config_error"]:
        lines.append(f"  CONFIG ERROR: {report['config_error']}")
    lines += ["", "GPUs"]
    if not report["devices"]:
        selection = report["selection"]
        lines.append("  none visible" + (f"; selector picks {('FA' + str(selection['version'])) if selection['version'] else 'nothing'} ({selection['reason']})"
                                         if selection else ""))
    for device in report["devices"]:
        picked = device["selected"]
        # One short line per GPU (its family, and why in a few words); the notes on the
        # families passed over (the measured reasons a family that runs here is not the
        # default) under it, one a line.
        lines.append(f"  cuda:{device['index']} {device['name']} (compute capability {device['capability']}): "
                     + (f"FA{picked}" if picked else "no FlashAttention")
                     + f" - {device.get('headline') or device['reason']}")
        notes = device.get("notes") or ()
        for note in notes:
            lines.append(textwrap.fill(note, width=110, initial_indent="    ", subsequent_indent="      ",
                                       break_long_words=False, break_on_hyphens=False))
        for fallback in device["fallbacks"]:
            lines.append(f"    fallback: {fallback}")
        for key, problem in device["unsupported"].items():
            if problem and not any(problem in note for note in notes):  # said once
                lines.append(f"    {key.upper()} unusable: {problem}")
    figures = report.get("measured") or {}
    if figures.get("error") or figures.get("serving"):
        lines += ["", "Measured for the defaults (measured.json)"]
        if figures.get("error"):
            lines.append(f"  unreadable: {figures['error']}")
        for major in figures.get("serving") or {}:
            data = {"serving": {major: figures["serving"][major]}} if figures["serving"][major] else {"serving": {}}
            lines += [f"  compute capability {major}.x: " + line if i == 0 else f"  {line}"
                      for i, line in enumerate(measured.serving_lines(int(major), data))]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vendored_flash_attn",
                                     description="vendored-flash-attn tools")
    sub = parser.add_subparsers(dest="command")
    info = sub.add_parser("info", help="show build info, loadable modules and the version picked per GPU")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument("--build-dir", help="the build dir of the build that made this package, for where its "
                                          f"sources came from (default: {DEFAULT_BUILD_DIRS} of the current directory)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in ("info", "-h", "--help"):
        argv = ["info", *argv]  # `info` is the default command
    args = parser.parse_args(argv)
    report = collect(args.build_dir)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(render(report))
    if report["build"] is None:
        print("\nerror: no build info; install the package with `pip install .` or a built wheel",
              file=sys.stderr)
        return 1
    return 0
