"""What a run cost in machine minutes: per experiment and phase, the server starts per engine, and the share of the
run spent starting servers, beside a reference run (the run it replaces).

usage: python benchmarks/run_cost.py RUN_DIR [RUN_DIR ...] [--reference RUN_DIR_OR_TAR] [--json OUT]

A run folder's manifest.json lists every server with its start, stop and seconds to ready. A server serves one or
more phases: the timed pass, or the untimed trace, profiled and equal-work passes (from the record's
`extra.phases` with each phase's seconds in `extra.phase_s`, a server shared by several phases; else its
`phase`, or for older runs its `kind` / `profiled_pass` fields and its name's suffix). A shared server counts as
one start. Printed per run: the run's minutes (manifest duration), the server starts (how many served several
phases), per phase the servers that served it and its minutes (a single-phase server: start to stop; a shared
one: the phase's own seconds, its start and teardown under `start/stop`), the starts per engine with their
summed seconds to ready, and the share of the run's wall time during which a server was starting (overlapping
starts count once). With --reference, the same for that run side by side (a run folder, or a .tar.gz holding
one, such as ../shared/data/h200-runs/cross_engine-h200-a0121e8.tar.gz, the first reference).
Figures only; no pass/fail.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tarfile
import tempfile
from datetime import datetime
from pathlib import Path

PHASE_SUFFIXES = (("-trace", "trace"), ("-prof", "profile"), ("-equal", "equal_work"))


def when(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def phase_of(server: dict) -> str:
    extra = server.get("extra") or {}
    for key in ("phase", "kind"):
        value = extra.get(key)
        if isinstance(value, str) and value != "***":
            return {"measured": "timed", "timed": "timed"}.get(value, value)
    if extra.get("profiled_pass"):
        return "profile"
    name = server.get("name", "")
    for suffix, phase in PHASE_SUFFIXES:
        if name.endswith(suffix):
            return phase
    return "timed"


def engine_of(server: dict) -> str:
    versions = server.get("versions") or {}
    if versions.get("engine"):
        return str(versions["engine"])
    argv = " ".join(server.get("argv") or [])
    return "llamacpp" if "llama-server" in argv else "vllm" if "vllm" in argv else "other"


def merged_seconds(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def phases_of(server: dict) -> list[tuple[str, float | None]]:
    """The phases a server served, each with its seconds where the record has them: a server shared by several
    phases (`extra.phases`, `extra.phase_s`, cross_engine since issue 27) lists each; an older record, its one
    phase (seconds None: the whole server)."""
    extra = server.get("extra") or {}
    served = extra.get("phases")
    if isinstance(served, list) and served:
        secs = extra.get("phase_s") or {}
        return [(str(p), float(secs[p]) if isinstance(secs.get(p), int | float) else None) for p in served]
    return [(phase_of(server), None)]


def cost(run_dir: Path) -> dict:
    """A run's minutes, per phase (servers serving it, minutes), per engine (starts, seconds to ready), and the
    minutes a server was starting. A server shared by several phases is one start; each phase gets its own
    minutes from the record, and what the server spent outside them (start, teardown) counts as `start/stop`."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    servers = manifest.get("servers") or []
    phases: dict[str, dict[str, float]] = collections.defaultdict(lambda: {"servers": 0, "server_min": 0.0})
    engines: dict[str, dict[str, float]] = collections.defaultdict(lambda: {"starts": 0, "ready_s": 0.0})
    starting = []
    shared = 0
    for s in servers:
        if not (s.get("started_at") and s.get("stopped_at")):
            continue
        t0, t1 = when(s["started_at"]), when(s["stopped_at"])
        served = phases_of(s)
        shared += len(served) > 1
        for phase, secs in served:
            p = phases[phase]
            p["servers"] += 1
            p["server_min"] += (t1 - t0 if secs is None else secs) / 60
        if any(secs is not None for _, secs in served):
            rest = phases["start/stop"]
            rest["servers"] += 1
            rest["server_min"] += max(0.0, t1 - t0 - sum(secs or 0.0 for _, secs in served)) / 60
        e = engines[engine_of(s)]
        e["starts"] += 1
        ready = s.get("ready_s") or 0.0
        e["ready_s"] += ready
        starting.append((t0, t0 + ready))
    run_s = manifest.get("duration_s") or (when(manifest["ended_at"]) - when(manifest["started_at"]))
    return {"run": run_dir.name, "experiment": manifest.get("experiment"), "git": (manifest.get("git") or {}).get("sha"),
            "run_min": run_s / 60, "phases": dict(phases), "engines": dict(engines),
            "starts": sum(int(e["starts"]) for e in engines.values()), "shared_servers": shared,
            "starting_min": merged_seconds(starting) / 60, "starting_share": merged_seconds(starting) / run_s}


def load_reference(path: Path) -> dict:
    if path.is_dir():
        return cost(path)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/manifest.json") and m.name.count("/") == 1)
        tar.extract(member, tmp, filter="data")
        return cost(Path(tmp) / Path(member.name).parent)


def table(runs: list[dict]) -> str:
    rows = [("", *[r["run"][:34] for r in runs]),
            ("experiment", *[str(r["experiment"]) for r in runs]),
            ("commit", *[str(r["git"])[:7] for r in runs]),
            ("run minutes", *[f"{r['run_min']:.1f}" for r in runs]),
            ("server starts (shared by phases)", *[f"{r['starts']} ({r.get('shared_servers', 0)})" for r in runs]),
            ("minutes a server was starting", *[f"{r['starting_min']:.1f} ({r['starting_share']:.0%})" for r in runs])]
    for phase in sorted({p for r in runs for p in r["phases"]}):
        rows.append((f"phase {phase}: servers, minutes",
                     *[(lambda p: f"{p['servers']}, {p['server_min']:.1f}" if p else "-")(r["phases"].get(phase))
                       for r in runs]))
    for engine in sorted({e for r in runs for e in r["engines"]}):
        rows.append((f"{engine}: starts, s to ready",
                     *[(lambda e: f"{e['starts']}, {e['ready_s']:.0f}" if e else "-")(r["engines"].get(engine))
                       for r in runs]))
    width = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, width, strict=True)) for row in rows)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--reference", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    runs = [cost(p) for p in args.runs]
    if args.reference:
        ref = load_reference(args.reference)
        ref["run"] = f"reference: {ref['run']}"
        runs = [ref, *runs]
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
