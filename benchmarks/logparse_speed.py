"""Lines/s of logparse.parse_log on a large synthetic log made by repeating the real fixture lines.

  .venv/bin/python benchmarks/logparse_speed.py [--lines 1000000] [--fixture tests/fixtures/logs/vllm-cpu-0.32-ngram.log]

Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from itertools import cycle, islice
from pathlib import Path

from specbook.engines.vllm.logparse import parse_log

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FIXTURE = ROOT / "tests" / "fixtures" / "logs" / "vllm-cpu-0.32-ngram.log"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    args = ap.parse_args()

    with args.fixture.open("rb") as handle:  # split on "\n" only, like the parser
        fixture_lines = list(handle)
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.log"
        with big.open("wb") as out:
            out.writelines(islice(cycle(fixture_lines), args.lines))
        size_mb = big.stat().st_size / 1e6

        t0 = time.perf_counter()
        parsed = parse_log(big)
        elapsed = time.perf_counter() - t0
        # a second pass under tracemalloc (which slows parsing) for the memory figure only
        tracemalloc.start()
        parse_log(big)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()

    print(f"fixture: {args.fixture.name} ({len(fixture_lines)} lines, repeated)")
    print(f"file: {parsed.total_lines} lines, {size_mb:.1f} MB")
    print(
        f"parse: {elapsed:.2f} s, {parsed.total_lines / elapsed:,.0f} lines/s, {size_mb / elapsed:.1f} MB/s"
    )
    print(f"records: {len(parsed.spec_decoding)} SpecDecoding, {len(parsed.engine_stats)} engine stats, "
          f"{parsed.unknown_lines} unknown, {parsed.broken_lines} broken")  # fmt: skip
    print(f"peak traced memory: {peak / 1e6:.1f} MB (records kept; the file itself is streamed)")
    print(f"whole-log AL: {parsed.acceptance_length()}")


if __name__ == "__main__":
    main()
