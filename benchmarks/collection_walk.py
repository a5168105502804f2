"""Follow the params through an experiment's collection: which specbook modules it visits, and how often a call
climbs back up a layer.

usage: python benchmarks/collection_walk.py EXPERIMENT PARAMS [-p key=value ...] [--json OUT]
       python benchmarks/collection_walk.py --compare BEFORE.json AFTER.json

Runs the experiment's `collect(params, run)` in this process, against real servers, into a temporary run folder,
with a profile hook on every Python call. A call counts when its callee's code lies in specbook; its caller is the
nearest specbook frame below it (calls through the standard library or pandas are seen through). Printed: the
specbook modules visited, in order of first visit; the calls whose callee sits in a higher layer than its caller
(a climb back up: a lower layer calling into a higher one, directly or through a callback it was handed), as
distinct caller -> callee module pairs and as call counts.

The layers are the folders of lib/specbook (tests/unit/test_layers.py). For a checkout from before the folders
(top-level modules such as specbook.harness), each old module is given the layer its code moved to
(OLD_LAYOUT below), so a walk made at an older commit is counted on the same scale. Run it from that checkout
(its own lib on PYTHONPATH) to measure the before.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

LAYERS = [("core",), ("store",), ("serve",), ("models", "workloads", "traces"), ("engines",),
          ("measure", "executors"), ("report",), ("experiments",), ("run",),
          ("cli", "notebook", "ingest", "__main__", "__init__")]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
# Top-level modules of the layout before the folders -> the package their code now lives in.
OLD_LAYOUT = {
    "errors": "core", "paths": "core", "dotted": "core", "digest": "core", "diskwrite": "core", "secrets": "core",
    "envline": "core", "progress": "core", "params": "core", "acceptance": "core", "stats": "core",
    "verdicts": "core", "request_failures": "core",
    "manifest": "store", "runstore": "store", "fingerprint": "store",
    "server": "serve", "client": "serve", "metrics": "serve", "hostload": "serve",
    "harness": "measure", "categories": "measure", "costsplit": "measure",
    "arms": "experiments", "attribution": "experiments", "guards": "experiments", "pins": "experiments",
    "setups": "experiments", "flip": "experiments", "sequential": "experiments", "steady": "experiments",
    "decision": "experiments", "equalwork": "traces",
    "report_view": "report", "plots": "report", "report_tables": "report", "runindex": "report",
    "rundiff": "report",
    "runner": "run", "resume": "run", "runguard": "run", "kernels": "run", "hostlock": "run",
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    if top == "traces" and len(parts) > 2 and parts[2] == "tracepass":
        return "measure"  # the old layout's trace pass, now in measure
    return OLD_LAYOUT.get(top, top)


class Walk:
    def __init__(self) -> None:
        self.visited: list[str] = []
        self.climbs: dict[tuple[str, str], int] = {}
        self.calls = 0

    def hook(self, frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        # `specbook` itself: its old-name import hook, which Python's import system calls on every import (no
        # caller of ours calls it)
        if not callee.startswith("specbook."):
            return
        caller_frame = frame.f_back
        while caller_frame is not None and not caller_frame.f_globals.get("__name__", "").startswith("specbook"):
            caller_frame = caller_frame.f_back
        self.calls += 1
        if callee not in self.visited:
            self.visited.append(callee)
        if caller_frame is None:
            return
        caller = caller_frame.f_globals["__name__"]
        a, b = layer_of(caller), layer_of(callee)
        if a in RANK and b in RANK and RANK[b] > RANK[a]:
            self.climbs[(caller, callee)] = self.climbs.get((caller, callee), 0) + 1

    def summary(self) -> dict:
        return {"modules_visited": self.visited, "n_modules": len(self.visited),
                "climbs": [{"caller": a, "callee": b, "calls": n} for (a, b), n in sorted(self.climbs.items())],
                "n_climb_pairs": len(self.climbs), "n_climb_calls": sum(self.climbs.values()),
                "specbook_calls": self.calls}


def run_walk(experiment: str, params_file: str, overrides: list[str]) -> dict:
    import specbook

    try:  # the layout with folders
        from specbook.core.params import load_params
        from specbook.store.runstore import RunContext
    except ImportError:  # before the folders
        from specbook.params import load_params
        from specbook.runstore import RunContext
    import specbook.experiments  # noqa: F401  (experiments register at import)
    from specbook.experiments.registry import get_experiment

    spec = get_experiment(experiment)
    params = load_params(spec.params_model, params_file, overrides=overrides)
    with tempfile.TemporaryDirectory() as tmp:
        run = RunContext(Path(tmp) / "run")
        run.run_dir.mkdir(parents=True, exist_ok=True)
        walk = Walk()
        sys.setprofile(walk.hook)
        try:
            spec.require("collect")(params, run)
        finally:
            sys.setprofile(None)
    out = walk.summary()
    out.update(experiment=experiment, params=params_file, overrides=overrides, specbook=specbook.__file__)
    return out


def print_walk(w: dict) -> None:
    print(f"{w['experiment']}: {w['n_modules']} specbook modules visited, {w['n_climb_pairs']} caller -> callee "
          f"pairs climb a layer ({w['n_climb_calls']} calls of {w['specbook_calls']})")
    for c in w["climbs"]:
        print(f"  climb: {c['caller']} ({layer_of(c['caller'])}) -> {c['callee']} ({layer_of(c['callee'])}) "
              f"x{c['calls']}")


def compare(before: dict, after: dict) -> None:
    print(f"{'':28s} {'before':>10s} {'after':>10s}")
    for key, what in (("n_modules", "modules visited"), ("n_climb_pairs", "climbing pairs"),
                      ("n_climb_calls", "climbing calls")):
        print(f"{what:28s} {before[key]:>10} {after[key]:>10}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", nargs="?")
    ap.add_argument("params", nargs="?")
    ap.add_argument("-p", dest="overrides", action="append", default=[])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        print_walk(before)
        print_walk(after)
        compare(before, after)
        return 0
    if not (args.experiment and args.params):
        ap.error("EXPERIMENT and PARAMS are required (or --compare)")
    walk = run_walk(args.experiment, args.params, args.overrides)
    print_walk(walk)
    if args.json:
        args.json.write_text(json.dumps(walk, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
