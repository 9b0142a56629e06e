"""The end of a build with the compiler cache: ``compiler_cache_probe.py stats`` and ``stop``.

``stats`` writes sccache's statistics (the text ``sccache --show-stats`` prints) into the
build's compile log and prints one line saying how many units the cache answered and, with
a scheduler, one saying how many compiles ran on build servers and how many here. With
--settings it reads the build's own servers and the launcher's fallbacks and writes them
into B/build_info.json's compiler_cache.dist: ``build`` (remote compiles, compiles here,
fallbacks, the units) and ``used`` (did any compile of this build run on a build server);
this machine's readings, which the wheel's build info does not hold. ``stop`` stops the
build's own servers (tests; a build dir being removed).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from vfa_build.cluster.dist_off import DIST_OFF  # exists once the launcher turned the cluster off in this build (cmake/vfa_build/cluster/dist_off.py)
from vfa_build.cluster.dist_trust import VERIFIED  # this build's checked units (cmake/vfa_build/cluster/dist_trust.py)
from vfa_build.compiler_cache.sccache_stats import (COUNTS, UNIT_LANGUAGES, ProbeFailure, counters, dist_status, run, show_stats,
                           unit_counts, with_saved)

# Written by cmake/vfa_build/compiler_cache/sccache_launcher.py (which keeps its own copy of this name, to stay small).
FALLBACKS = "vfa-dist-fallbacks.tsv"  # one line per unit the launcher compiled here after a cluster failure


def launcher_settings(settings_path: Path) -> dict:
    return json.loads(settings_path.read_text(encoding="utf-8"))


def fallback_lines(build_dir: Path) -> list[list[str]]:
    try:
        return [line.split("\t") for line in (build_dir / FALLBACKS).read_text(encoding="utf-8").splitlines() if line]
    except OSError:
        return []


def build_report(sccache: str, settings: dict) -> dict:
    """What this build's servers and launcher did: remote compiles, fallbacks, failures."""
    build_dir = Path(settings["build_dir"])
    env = dict(os.environ, **settings["server"])
    main = with_saved(unit_counts(show_stats(sccache, env)), build_dir, "server")
    local = (with_saved(unit_counts(show_stats(sccache, dict(os.environ, **settings["local"]))), build_dir, "local")
             if settings["local"] else None)
    lines = fallback_lines(build_dir)
    fallbacks = [line for line in lines if line[2:3] != ["source-error"]]  # sccache_launcher.SOURCE_ERROR
    # sccache counts a job that ran on a build server and failed there among its dist_compiles.
    failed_remote = sum(1 for line in lines if line[2:3] in (["job-failed"], ["source-error"]))
    return {"dist": settings["dist"], "scheduler": settings["scheduler"],
            "remote_compiles": max(main["remote"] - failed_remote, 0), "remote_jobs_failed": failed_remote,
            "compiles_here": max(main["compilations"] - main["remote"], 0) + (local or {}).get("compilations", 0),
            "sccache_fallbacks": main["dist_errors"], "launcher_fallbacks": len(fallbacks),
            "compile_requests": main["requests"] + (local or {}).get("requests", 0),
            "cluster_turned_off": (build_dir / DIST_OFF).exists(),
            "fallback_units": [line[1] for line in fallbacks if len(line) > 1]}


def record_build(settings: dict, report: dict) -> None:
    """Into the build dir's build_info.json (compiler_cache.dist): `build`, the counts, and
    `used`, whether any compile of the build ran on a build server. The wheel's record holds
    no compiler_cache block (BuildInfo.cmake: this machine's readings)."""
    if not report["compile_requests"]:
        return  # nothing was compiled: what an earlier build recorded still holds
    info_path = Path(settings["build_dir"]) / "build_info.json"
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
        info["compiler_cache"]["dist"]["used"] = report["remote_compiles"] > 0
        info["compiler_cache"]["dist"]["build"] = report
    except (OSError, ValueError, KeyError, TypeError):
        return
    tmp = info_path.with_name(info_path.name + ".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, info_path)


def verification_report(settings: dict, build: str | None = None) -> dict:
    """What dist_trust.py checked in this build (VERIFIED: the lines of <build>, this_build(); run
    by hand, outside a build tool, the last build recorded) and where the build dir's objects
    came from (ORIGIN): the objects the cluster built, how many of them were checked here, by
    server."""
    from vfa_build.cluster.dist_trust import cluster_objects, verified_lines, verify_every
    build_dir = settings["build_dir"]
    lines = verified_lines(build_dir, build, latest=True)
    objects = cluster_objects(build_dir)
    servers = sorted({s for servers, _ in objects.values() for s in servers.split(",") if s})
    checked_servers = sorted({line[2] for line in lines if line[3] == "same" and line[2] and "," not in line[2]})
    return {"every": verify_every(build_dir), "checked": len(lines),
            "same": sum(1 for line in lines if line[3] == "same"),
            "differ": sum(1 for line in lines if line[3] != "same"),
            "seconds": round(sum(float(line[4]) for line in lines), 1),
            "why": {why: sum(1 for line in lines if line[5] == why) for why in sorted({line[5] for line in lines})},
            "objects_from_cluster": len(objects), "objects_verified": sum(1 for _, v in objects.values() if v),
            "servers": servers, "servers_checked": [s for s in servers if s in checked_servers]}


def record_in_wheel(settings: dict, verify: dict) -> None:
    """Into the wheel's record (B/build_info.wheel.json, installed as the package's
    build_info.json): how many of the objects linked came from the cluster and how many of them
    were checked here. Counts only: which servers and scheduler are this machine's readings."""
    path = Path(settings["build_dir"]) / "build_info.wheel.json"
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    info["cluster"] = {"objects_from_cluster": verify["objects_from_cluster"],
                       "objects_verified": verify["objects_verified"], "verify_every": verify["every"]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def verification_line(verify: dict) -> str:
    if verify["every"] <= 0:
        return (f"VFA_DIST_VERIFY=0: {verify['objects_from_cluster']} objects of this build dir came from the "
                "sccache-dist cluster, none checked here (release builds set VFA_DIST_VERIFY=10)")
    return (f"VFA_DIST_VERIFY={verify['every']}: {verify['checked']} units the cluster built were compiled again "
            f"here in this build ({verify['seconds']:.1f} s), {verify['same']} of them the same; build servers with "
            f"a checked unit: {len(verify['servers_checked'])} of {len(verify['servers'])}; objects of this build "
            f"dir from the cluster: {verify['objects_from_cluster']}, {verify['objects_verified']} of them checked")


def stop_servers(sccache: str, settings: dict, build_server: bool) -> None:
    for overrides in ([settings["server"]] if build_server and settings["server"] else []) + \
            ([settings["local"]] if settings["local"] else []):
        run([sccache, "--stop-server"], dict(os.environ, **overrides))


def hits_line(counts: dict[str, int]) -> str:
    """How many of the build's units the compiler cache answered (unit_counts: a CUDA unit is
    one "CUDA" compile, its device-code, PTX and CUBIN steps are counted apart)."""
    parts, hits, total = [], 0, 0
    for language, name in UNIT_LANGUAGES.items():
        h = counts.get(f"hits:{language}", 0)
        n = h + counts.get(f"misses:{language}", 0)
        if n:
            parts.append(f"{name} {h}/{n}")
            hits, total = hits + h, total + n
    if not total:
        return "no unit compiled"
    return f"{hits} of {total} units from the cache ({', '.join(parts)})"


def log_stats(settings: dict | None, text: str) -> str | None:
    """sccache's statistics table into the build's compile log (cmake/vfa_build/units/compile_unit.py's), which
    it returns; None without a build dir or when the log cannot be written."""
    if settings is None:
        return None
    from vfa_build.units.compile_unit import COMPILE_LOG, append_log  # the log every unit's output goes to
    log = str(Path(settings["build_dir"]) / COMPILE_LOG)
    return log if append_log(log, f"==> sccache --show-stats (the build's compiler cache)\n{text}") else None


def stats(args) -> int:
    settings = launcher_settings(Path(args.settings)) if args.settings else None
    if settings is not None:
        # A server this asks for is started like the compiles' (no idle timeout) and stopped
        # when the build ends, as theirs are (cmake/vfa_build/compiler_cache/sccache_launcher.py).
        from vfa_build.compiler_cache.sccache_servers import claim_servers, server_env
        from vfa_build.units.compile_unit import this_build
        build = this_build()
        claim_servers(settings, args.settings, build)
        env = server_env(settings, settings["server"], build)
    else:
        env = dict(os.environ)
    text = run([args.sccache, "--show-stats"], env)
    log = log_stats(settings, text.stdout)
    if log is None:
        print(text.stdout, end="")
    else:
        try:
            summary = hits_line(with_saved(unit_counts(show_stats(args.sccache, env)), Path(settings["build_dir"]),
                                           "server"))
        except (ProbeFailure, json.JSONDecodeError, KeyError) as exc:
            summary = f"statistics unreadable ({exc})"
        print(f"vendored-flash-attn: compiler cache: {summary}; sccache's statistics are in {log}")
    if settings is not None:
        # dist_output.py: the cluster's answers that came after their unit stopped waiting.
        from vfa_build.cluster.dist_output import discard_late
        late = discard_late(settings["build_dir"])
        for unit in late:
            print(f"vendored-flash-attn: discarded the sccache-dist cluster's answer for {unit}: it came after the "
                  "unit's bound, when the unit had been compiled here (the object built here is the one linked)")
        try:
            report = build_report(args.sccache, settings)
        except (ProbeFailure, json.JSONDecodeError, KeyError) as exc:
            print(f"distributed compiles: unknown ({exc})")
            return 0
        report["late_answers_discarded"] = len(late)
        report["verify"] = verify = verification_report(settings, build)
        if settings["dist"] != "none" or verify["objects_from_cluster"]:
            record_in_wheel(settings, verify)
        record_build(settings, report)
        if settings["dist"] != "none":
            fell_back = report["sccache_fallbacks"] + report["launcher_fallbacks"]
            print(f"distributed compiles (scheduler {settings['scheduler']}, {settings['dist']}): "
                  f"{report['remote_compiles']} ran on build servers, {report['compiles_here']} here ({fell_back} of "
                  f"them after a failed remote attempt)")
            if settings["dist"] == "on" and report["compiles_here"] and not report["remote_compiles"]:
                print(f"vendored-flash-attn: none of this build's {report['compiles_here']} compiles ran on the "
                      f"sccache-dist cluster {settings['scheduler']} (its scheduler or servers did not take them; "
                      "`sccache --dist-status` with this SCCACHE_CONF and the cluster's logs say why)")
            print(f"vendored-flash-attn: {verification_line(verify)}")
            if report["cluster_turned_off"]:
                print(f"the cluster failed {report['launcher_fallbacks']} compiles of this build, which then ran "
                      f"here: {Path(settings['build_dir']) / FALLBACKS} lists them")
        # The next build tries the cluster again and counts from zero (a server named by
        # SCCACHE_SERVER_PORT/UDS keeps its counts: zeroed at configure, read by whoever set it).
        stop_servers(args.sccache, settings, build_server=False)
        if settings.get("own_server"):
            run([args.sccache, "--zero-stats"], env)
        for name in (FALLBACKS, DIST_OFF, COUNTS, VERIFIED):  # this build's; the origins (ORIGIN) stay
            (Path(settings["build_dir"]) / name).unlink(missing_ok=True)
        return 0
    try:
        c = counters(show_stats(args.sccache, env))
        status = dist_status(args.sccache, env)
    except (ProbeFailure, json.JSONDecodeError, KeyError) as exc:
        print(f"distributed compiles: unknown ({exc})")
        return 0
    if status["state"] != "disabled":
        local = max(c["compilations"] - c["remote"], 0)
        print(f"distributed compiles (scheduler {status['scheduler']}, {status['state']}): {c['remote']} ran on "
              f"build servers, {local} here ({c['dist_errors']} of them after a failed remote attempt)")
    return 0


def stop(args) -> int:
    settings = launcher_settings(Path(args.settings))
    stop_servers(settings["sccache"], settings, build_server=True)
    return 0
