"""What every workload hands an experiment: the requests (each with its category), how they were drawn, and
an optional grader; plus the pieces the loaders share (JSONL reading, the hub, the stratified draw)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.digest import sha256_bytes
from specbook.core.errors import WorkloadError

if TYPE_CHECKING:
    import pandas as pd

    from specbook.serve.client import ChatRequest


@dataclass(frozen=True)
class WorkloadDraw:
    """The requests one draw of a workload sends, in the order its categories are measured."""

    name: str
    requests: list[ChatRequest]
    selection: dict[str, Any] = field(default_factory=dict)  # source, sha256, seed, ids: what was asked
    grader: Callable[[pd.DataFrame], pd.DataFrame] | None = None  # adds `correct` (gsm8k); None: ungraded

    @property
    def categories(self) -> list[str]:
        """The requests' categories in first-appearance order."""
        return list(dict.fromkeys(r.category or "" for r in self.requests))

    def grade(self, records: pd.DataFrame) -> pd.DataFrame:
        """The records frame with the grader's columns (`correct`, ...) where this workload has a grader."""
        return records if self.grader is None else self.grader(records)


def read_jsonl(path: Path, what: str) -> tuple[list[dict[str, Any]], str]:
    """The objects of a JSONL file and its sha256; WorkloadError naming the file (and line) otherwise."""
    if not path.is_file():
        raise WorkloadError(f"{what}: file not found: {path}")
    raw = path.read_bytes()
    rows = []
    for n, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{what}: {path} line {n}: not JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise WorkloadError(f"{what}: {path} line {n}: not a JSON object")
        rows.append({**row, "_line": n})
    if not rows:
        raise WorkloadError(f"{what}: {path} holds no rows")
    return rows, sha256_bytes(raw)


def load_hub(hub_id: str, split: str, what: str, config: str | None = None) -> list[dict[str, Any]]:
    """Rows of a hub dataset through `datasets.load_dataset` (only when no local path is given)."""
    try:
        import datasets
    except ImportError as exc:
        raise WorkloadError(f"{what}: loading {hub_id!r} from the hub needs the `datasets` package, which is not "
                            f"installed; give a local path instead (or pip install datasets)") from exc
    try:
        ds = datasets.load_dataset(hub_id, config, split=split)
    except Exception as exc:  # offline, no access, renamed: all end the same way for the user
        raise WorkloadError(f"{what}: cannot load {hub_id!r} (split {split!r}) from the hub: {exc}; "
                            f"give a local path instead") from exc
    return [{**dict(r), "_line": i + 1} for i, r in enumerate(ds)]


def stratified_sample(rows: Sequence[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], str],
                      strata: Sequence[str], per_stratum: int | None, seed: int, what: str) -> list[Mapping[str, Any]]:
    """`per_stratum` rows of each stratum (all when None), drawn with random.Random(f"{seed}:{stratum}") so
    one stratum's draw does not move when another is added; strata in the given order, rows in file order."""
    out: list[Mapping[str, Any]] = []
    for stratum in strata:
        members = [r for r in rows if key(r) == stratum]
        if not members:
            raise WorkloadError(f"{what}: category {stratum!r} has no rows")
        if per_stratum is None:
            out.extend(members)
            continue
        if per_stratum > len(members):
            raise WorkloadError(f"{what}: per_category={per_stratum} exceeds the {len(members)} rows of "
                                f"category {stratum!r}")
        picked = sorted(random.Random(f"{seed}:{stratum}").sample(range(len(members)), per_stratum))
        out.extend(members[i] for i in picked)
    return out
