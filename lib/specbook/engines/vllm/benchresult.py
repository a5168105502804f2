"""vLLM's own benchmark outputs: `vllm bench serve --save-result` JSON files and `vllm bench sweep serve` folders.

What vLLM 0.32 writes (vllm/benchmarks/serve.py, vllm/benchmarks/sweep/serve.py; captures in
tests/fixtures/vllm_bench/):

    result file   one JSON object: run set-up (backend, model_id, num_prompts, max_concurrency, request_rate,
                  any `--metadata KEY=VALUE`), figures (duration, completed, failed, total_output_tokens,
                  output_throughput = total_output_tokens / duration, {mean,median,std,p99}_{ttft,tpot,itl}_ms)
                  and, when the server speculates, the /metrics deltas over the benchmark:
                  spec_decode_num_drafts, _draft_tokens, _accepted_tokens, spec_decode_acceptance_length
                  (1 + accepted / drafts: specbook's AL), spec_decode_acceptance_rate (a percentage) and
                  spec_decode_per_position_acceptance_rates (accepted at position i / drafts, i = 1..k).
                  `--append-result` writes several such objects into one file, one per line.
    sweep folder  OUTPUT_DIR/EXPERIMENT/<combination>/run=N.json: the result above plus `run_number` and the
                  combination's serve/bench parameters as top-level keys; `summary.json` (the runs of a
                  combination as one list), `warmup.json` (an unmeasured run), `*.failure.json` (a failed run,
                  with --continue-on-error) and `summary.csv`. Runs are read from run=N.json; failures are
                  counted.

A result keeps per-position rates, not counts; the counts come back as rate x drafts (exact: vLLM divided
integers), so every figure goes through the acceptance model like a counter delta specbook took itself.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbook.core.acceptance import Acceptance
from specbook.core.errors import IngestError

SOURCE = "vllm bench serve result"
# Keys every `vllm bench serve` generation result carries (the set-up and the figures always written).
_SIGNATURE = ("duration", "completed", "output_throughput", "total_output_tokens")
_SETUP = ("backend", "endpoint_type")
RUN_GLOB = "run=*.json"
FAILURE_GLOB = "*.failure.json"


@dataclass(frozen=True)
class BenchRun:
    """One benchmark run of `vllm bench serve`: its set-up, figures and acceptance counts as vLLM saved them."""

    file: Path
    data: Mapping[str, Any] = field(repr=False)
    index: int = 0  # position of the object in its file (`--append-result` files hold several)
    combination: str | None = None  # sweep: the combination's folder, relative to the sweep folder

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def text(self, key: str) -> str | None:
        value = self.data.get(key)
        return value if isinstance(value, str) else None

    def number(self, key: str) -> float | None:
        value = self.data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return float(value)

    @property
    def has_spec_decode(self) -> bool:
        return "spec_decode_num_drafts" in self.data

    def acceptance(self) -> Acceptance | None:
        """The run's /metrics deltas through the acceptance model; None when the result has none (no speculation,
        or no draft token in the run: vLLM then omits the spec_decode keys)."""
        if not self.has_spec_decode:
            return None
        drafts = self._count("spec_decode_num_drafts")
        rates = self.data.get("spec_decode_per_position_acceptance_rates") or []
        if not isinstance(rates, list) or not all(
                isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) and r >= 0 for r in rates):
            raise IngestError(f"{self.where}: spec_decode_per_position_acceptance_rates is not a list of rates")
        return Acceptance.from_counts(
            SOURCE, drafts=drafts, draft_tokens=self._count("spec_decode_draft_tokens"),
            accepted_tokens=self._count("spec_decode_accepted_tokens"),
            accepted_per_position=[round(float(r) * drafts) for r in rates],
        )

    def _count(self, key: str) -> int:
        value = self.data.get(key)
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
                or value != int(value)):
            raise IngestError(f"{self.where}: {key} = {value!r} is not a count")
        return int(value)

    @property
    def where(self) -> str:
        return f"vllm bench result {self.file}" + (f" (object {self.index})" if self.index else "")


def looks_like_result(obj: Any) -> bool:
    """True for a dict `vllm bench serve --save-result` wrote (a generation benchmark)."""
    return isinstance(obj, dict) and all(k in obj for k in _SIGNATURE) and any(k in obj for k in _SETUP)


def _json_objects(text: str) -> Iterator[Any]:
    """The JSON values of a text, one after another (a file `--append-result` wrote holds several)."""
    decoder = json.JSONDecoder()
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return
        value, pos = decoder.raw_decode(text, pos)
        yield value


def detect_result(head: str) -> bool:
    """Whether a file's head looks like a vLLM bench result: JSON whose first object carries the result keys.

    Reads at most the head (1 MiB); a result without --save-detailed is a few kB. A head cut inside the first
    object still counts when the signature keys appear in it."""
    text = head.lstrip()
    if not text.startswith(("{", "[")):
        return False
    try:
        first = next(_json_objects(text), None)
    except (json.JSONDecodeError, RecursionError):
        return all(f'"{k}":' in text for k in _SIGNATURE) and any(f'"{k}":' in text for k in _SETUP)
    if isinstance(first, list):  # a sweep's summary.json: its runs as a list
        return bool(first) and looks_like_result(first[0])
    return looks_like_result(first)


def read_result_file(path: str | Path, combination: str | None = None) -> list[BenchRun]:
    """The runs a result file holds: one (--save-result), several (--append-result) or a summary.json's list."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise IngestError(f"vllm bench result {path} cannot be read: {exc}") from exc
    try:
        values = list(_json_objects(text))
    except json.JSONDecodeError as exc:
        raise IngestError(f"vllm bench result {path}: not JSON at line {exc.lineno} column {exc.colno}: "
                          f"{exc.msg}") from exc
    except RecursionError as exc:
        raise IngestError(f"vllm bench result {path}: JSON nested too deeply to be a result") from exc
    objects = [o for v in values for o in (v if isinstance(v, list) else [v])]
    bad = [i for i, o in enumerate(objects) if not looks_like_result(o)]
    if not objects or bad:
        raise IngestError(f"{path} is not a vllm bench serve result: object {bad[0] if bad else 0} lacks "
                          f"{', '.join(_SIGNATURE)} and backend")
    return [BenchRun(path, o, i, combination) for i, o in enumerate(objects)]


@dataclass(frozen=True)
class SweepFolder:
    """A `vllm bench sweep serve` output folder: its measured runs and how many runs failed."""

    folder: Path
    runs: list[BenchRun]
    failures: list[Path]


def is_sweep_folder(folder: str | Path) -> bool:
    folder = Path(folder)
    return folder.is_dir() and (any(folder.rglob(RUN_GLOB)) or any(folder.rglob(FAILURE_GLOB)))


def _run_number(path: Path) -> int:
    try:
        return int(path.stem.split("=", 1)[1])
    except (IndexError, ValueError):
        return -1


def read_sweep_folder(folder: str | Path) -> SweepFolder:
    """Every run=N.json under a sweep folder (an experiment folder or the output dir above several), in
    combination then run order; IngestError naming the folder when it holds none."""
    folder = Path(folder)
    files = sorted((p for p in folder.rglob(RUN_GLOB) if not p.name.endswith(".failure.json")),
                   key=lambda p: (str(p.parent), _run_number(p)))
    failures = sorted(folder.rglob(FAILURE_GLOB))
    if not files:
        raise IngestError(f"{folder} holds no run=N.json: not a vllm bench sweep serve output folder"
                          + (f" with a measured run ({len(failures)} failed runs)" if failures else ""))
    runs = [run for p in files for run in read_result_file(p, combination=str(p.parent.relative_to(folder)))]
    return SweepFolder(folder, runs, failures)
