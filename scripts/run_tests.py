"""Run one test tier: `make test` runs the fast tier, `make test-full` the full one.

usage: python scripts/run_tests.py fast|full [--unit-workers N] [--junit-dir DIR] [PYTEST_ARGS...]

Each tier is two pytest runs: the unit tests in parallel (pytest-xdist, one worker per core by default; they
start no engine server), then the integration and e2e tests one at a time (real engine servers: on a small
machine two at once would measure each other). The fast tier leaves out tests marked `slow`; the full tier
runs everything. The last line sums both runs ("fast: N passed, N failed, N skipped"), and the exit code
is non-zero if either run failed or collected no test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIERS = {"fast": ["-m", "not slow"], "full": []}
PARTS = {"unit": ["tests/unit"], "engines": ["tests/integration", "tests/e2e"]}


def counts(junit: Path) -> dict[str, int]:
    """passed / failed / skipped from a JUnit XML report (errors count as failed)."""
    import xml.etree.ElementTree as ET

    out = {"passed": 0, "failed": 0, "skipped": 0}
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return out
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            out["failed"] += 1
        elif "skipped" in kinds:
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tier", choices=sorted(TIERS))
    ap.add_argument("--unit-workers", default=os.environ.get("UNIT_WORKERS", "auto"),
                    help="pytest-xdist workers for the unit tests: a number, 'auto' (one per core) or 0 (serial)")
    ap.add_argument("--junit-dir", type=Path, default=None, help="where the two JUnit XML reports go")
    args, pytest_args = ap.parse_known_args(argv)
    junit_dir = args.junit_dir or Path(os.environ.get("TMPDIR", "/tmp")) / f"specbook-tests-{os.getpid()}"
    junit_dir.mkdir(parents=True, exist_ok=True)
    total = {"passed": 0, "failed": 0, "skipped": 0}
    failed_parts = []
    t0 = time.monotonic()
    for part, paths in PARTS.items():
        workers = [] if part != "unit" or str(args.unit_workers) == "0" else ["-n", str(args.unit_workers)]
        junit = junit_dir / f"{args.tier}-{part}.xml"
        cmd = [sys.executable, "-m", "pytest", *paths, "-q", "-rs", "--durations=15", *TIERS[args.tier],
               *workers, f"--junitxml={junit}", *pytest_args]
        print(f"\n=== {args.tier} tier, {part}: {' '.join(cmd[1:])}", flush=True)
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        part_counts = counts(junit)
        for k, v in part_counts.items():
            total[k] += v
        if rc != 0:  # 5: no test collected, which a tier never means to do
            failed_parts.append(f"{part} (pytest exit {rc})")
    minutes = (time.monotonic() - t0) / 60
    if failed_parts:
        print(f"\n{args.tier} tier: failed in {', '.join(failed_parts)}", flush=True)
    print(f"\n{args.tier} tier: both runs took {minutes:.1f} min", flush=True)
    # the plain closing line (one word and a colon before the counts): the sum of both runs
    print(f"{args.tier}: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped", flush=True)
    return 1 if failed_parts else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
