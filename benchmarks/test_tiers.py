"""What each test tier costs on a fresh clone: wall time, server starts per engine, the slowest tests.

usage: python benchmarks/test_tiers.py [--tiers fast full] [--cold-cache] [--unit-both-ways] [--keep]
       python benchmarks/test_tiers.py --read JUNIT.xml [JUNIT.xml ...] --starts STARTS.jsonl   (a run made already)

Clones this checkout's HEAD into a temporary folder (the README's fresh clone), times its set-up (`make setup
llamacpp`: venv, models, llama.cpp; the last says whether its cached build was reused), then runs each tier as
`make test` / `make test-full` run it (scripts/run_tests.py), with every server start recorded
($SPECBOOK_SERVER_STARTS_LOG, specbook.serve.server) and JUnit reports. It prints, per tier: the wall time, the tests
passed / failed / skipped, the server starts per engine and the seconds they took to be ready, and the 15 slowest
tests (a session fixture's set-up counts in the first test that uses it), beside the reference: the whole suite
before the tiers, measured at a0121e8's tests (REFERENCE below). By default the host's caches are used, as CI on
the same machine uses them (models in ~/.cache/specbook, the llama.cpp build cache beside them);
--cold-cache gives the clone an empty SPECBOOK_CACHE, so models and llama.cpp are made from nothing.
--unit-both-ways also times the unit tests alone, serially and in parallel (pytest-xdist, one worker per core), in
the same clone. Figures only; no pass/fail.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The whole suite before the tiers (issue #23; at a0121e8's tests plus the start recorder), on this 2-core host
# while other work loaded it (load average 3-6): what benchmarks/reference/test_tiers_a0121e8.json holds.
REFERENCE_FILE = ROOT / "benchmarks" / "reference" / "test_tiers_a0121e8.json"


def engine_of(record: dict) -> str:
    program = record.get("program") or ""
    argv = " ".join(record.get("argv") or [])
    if program == "llama-server":
        return "llama.cpp"
    if "vllm" in argv:
        return "vLLM"
    return "stub or other"


def starts_summary(path: Path) -> dict[str, dict[str, float]]:
    """Per engine: starts, ready starts and their summed seconds to ready."""
    out: dict[str, dict[str, float]] = collections.defaultdict(lambda: {"starts": 0, "ready": 0, "ready_s": 0.0})
    if not path.is_file():
        return {}
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        row = out[engine_of(rec)]
        if rec["event"] == "start":
            row["starts"] += 1
        elif rec["event"] == "ready":
            row["ready"] += 1
            row["ready_s"] += float(rec.get("ready_s") or 0.0)
    return dict(out)


def junit_cases(paths: list[Path]) -> list[dict]:
    cases = []
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError):
            continue
        for case in root.iter("testcase"):
            kinds = {child.tag for child in case}
            outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
            cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "time": float(case.get("time") or 0),
                          "outcome": outcome})
    return cases


def tier_figures(junits: list[Path], starts: Path, wall_s: float | None) -> dict:
    cases = junit_cases(junits)
    outcomes = collections.Counter(c["outcome"] for c in cases)
    return {"wall_s": wall_s, "tests": len(cases), "passed": outcomes["passed"], "failed": outcomes["failed"],
            "skipped": outcomes["skipped"], "test_s": sum(c["time"] for c in cases),
            "starts": starts_summary(starts),
            "slowest": sorted(cases, key=lambda c: -c["time"])[:15]}


def mmss(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def show(name: str, fig: dict, ref: dict | None) -> None:
    print(f"\n## {name}")
    rows = [("wall time", mmss(fig.get("wall_s")), mmss(ref.get("wall_s")) if ref else "-"),
            ("tests (passed / failed / skipped)", f"{fig['tests']} ({fig['passed']} / {fig['failed']} / {fig['skipped']})",
             f"{ref['tests']} ({ref['passed']} / {ref['failed']} / {ref['skipped']})" if ref else "-")]
    engines = sorted(set(fig["starts"]) | set((ref or {}).get("starts", {})))
    for engine in engines:
        mine, theirs = fig["starts"].get(engine), (ref or {}).get("starts", {}).get(engine)
        rows.append((f"{engine} server starts (summed s to ready)",
                     f"{mine['starts']:.0f} ({mine['ready_s']:.0f} s)" if mine else "0",
                     f"{theirs['starts']:.0f} ({theirs['ready_s']:.0f} s)" if theirs else ("0" if ref else "-")))
    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}  {'this run':>22}  {'reference':>22}")
    for label, a, b in rows:
        print(f"{label:{width}}  {a:>22}  {b:>22}")
    print("\nslowest 15 (seconds; a session fixture's set-up counts in its first test):")
    for case in fig["slowest"]:
        print(f"  {case['time']:7.1f}  {case['outcome']:7}  {case['test']}")


def run_tier(clone: Path, tier: str, env: dict[str, str], out: Path) -> dict:
    starts = out / f"{tier}-starts.jsonl"
    junit_dir = out / f"{tier}-junit"
    env = {**env, "SPECBOOK_SERVER_STARTS_LOG": str(starts)}
    target = "test" if tier == "fast" else "test-full"
    t0 = time.monotonic()
    with open(out / f"{tier}.log", "w") as log:
        proc = subprocess.run(["make", target, f"PYTEST_ARGS=--junit-dir {junit_dir}"], cwd=clone, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    fig = tier_figures(sorted(junit_dir.glob("*.xml")), starts, wall)
    fig["exit"] = proc.returncode
    return fig


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiers", nargs="+", default=["fast", "full"], choices=["fast", "full"])
    ap.add_argument("--cold-cache", action="store_true", help="an empty SPECBOOK_CACHE for the clone")
    ap.add_argument("--keep", action="store_true", help="keep the clone and its logs")
    ap.add_argument("--unit-both-ways", action="store_true", help="time the unit tests serially and in parallel")
    ap.add_argument("--read", nargs="+", type=Path, help="JUnit XML files of a run made already")
    ap.add_argument("--starts", type=Path, help="its SPECBOOK_SERVER_STARTS_LOG file")
    ap.add_argument("--wall-s", type=float, default=None)
    ap.add_argument("--write-reference", type=Path, help="save the --read figures as a reference file")
    args = ap.parse_args(argv)
    ref_doc = json.loads(REFERENCE_FILE.read_text()) if REFERENCE_FILE.is_file() else None
    ref = ref_doc["figures"] if ref_doc else None
    if args.read:
        fig = tier_figures(args.read, args.starts or Path("/nonexistent"), args.wall_s)
        if args.write_reference:
            args.write_reference.write_text(json.dumps({"what": "whole suite before the tiers", "figures": fig},
                                                       indent=1) + "\n")
        show("the run read", fig, ref)
        return 0
    work = Path(tempfile.mkdtemp(prefix="specbook-tiers-"))
    clone = work / "specbook"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    shared = ROOT.parent / "shared"
    if shared.is_dir() and not (work / "shared").exists():
        (work / "shared").symlink_to(shared)  # the data beside the checkout, as CI lays it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECBOOK_", "VIRTUAL_ENV"))}
    if args.cold_cache:
        env["SPECBOOK_CACHE"] = str(work / "cache")
    t0 = time.monotonic()
    with open(work / "setup.log", "w") as log:
        proc = subprocess.run(["make", "setup", "llamacpp"], cwd=clone, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        log.write(proc.stdout)
    setup_s = time.monotonic() - t0
    llama = [ln for ln in proc.stdout.splitlines() if ln.startswith("llama.cpp: ")]
    print(f"# test tiers on a fresh clone of {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}"
          f" ({os.cpu_count()} cores; caches: {'empty' if args.cold_cache else 'the host’s'})")
    print(f"set-up (make setup llamacpp): {mmss(setup_s)}; {llama[-1] if llama else 'no llama.cpp line'}")
    if proc.returncode != 0:
        print(f"set-up failed (exit {proc.returncode}): {work / 'setup.log'}")
        return 1
    if ref_doc:
        print(f"reference: {ref_doc.get('what')}")
    if args.unit_both_ways:
        for workers in ("0", "auto"):
            t0 = time.monotonic()
            run = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pytest", "tests/unit", "-q",
                                  "-p", "no:cacheprovider", *([] if workers == "0" else ["-n", workers])],
                                 cwd=clone, env=env, capture_output=True, text=True)
            last = (run.stdout.strip().splitlines() or ["?"])[-1]
            print(f"unit tests {'serially' if workers == '0' else 'in parallel (-n auto)'}: "
                  f"{mmss(time.monotonic() - t0)} wall; {last}")
    for tier in args.tiers:
        fig = run_tier(clone, tier, env, work)
        show(f"{tier} tier (make {'test' if tier == 'fast' else 'test-full'}; exit {fig['exit']})", fig, ref)
    if args.keep:
        print(f"\nkept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
