"""GSM8K as a chat workload: k-shot multi-turn messages, greedy, with the usual answer extraction.

Shots come from the train split, questions from the test split. Data is read from local JSONL files
(one {"question", "answer"} object a line, as `openai/gsm8k` ships) or from the hub through the
`datasets` package. The subset drawn is recorded (source, file hashes, seed, indices) so a run can
say exactly which questions it asked.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from specbook.core.digest import sha256_bytes
from specbook.core.errors import WorkloadError

if TYPE_CHECKING:
    from specbook.serve.client import ChatRequest, RequestRecord
    from specbook.workloads.base import WorkloadDraw
    from specbook.workloads.params import Gsm8kWorkloadParams

NAME = "gsm8k"
HUB_ID = "openai/gsm8k"
HUB_CONFIG = "main"
DEFAULT_NUM_SHOTS = 5
ANSWER_MARK = "####"

_CALCULATOR_RE = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, e.g. <<16-3-4=9>>
_MARKED_RE = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")
_NUMBER_RE = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\.\d+")


@dataclass(frozen=True)
class GSM8KItem:
    split: str
    index: int  # line number (0-based) in the split: the stable identity of a question
    question: str
    answer: str  # the worked solution, ending in "#### N"
    target: str  # N, normalized

    @property
    def prompt_id(self) -> str:
        return f"{NAME}-{self.split}-{self.index:05d}"


@dataclass(frozen=True)
class GSM8KWorkload:
    """The questions asked, the shots shown before each, and how they were selected."""

    items: list[GSM8KItem]
    shots: list[GSM8KItem]
    selection: dict[str, Any] = field(default_factory=dict)

    def by_prompt_id(self) -> dict[str, GSM8KItem]:
        return {it.prompt_id: it for it in self.items}


def normalize_number(text: str) -> str | None:
    """'$1,234.50.' -> '1234.50'; None when no number is left."""
    s = text.strip().replace(",", "").replace("$", "").rstrip(".").strip()
    try:
        Decimal(s)
    except InvalidOperation:
        return None
    return s or None


def extract_answer(text: str) -> str | None:
    """The number after the first "#### ", else the last number in the text; normalized."""
    m = _MARKED_RE.search(text)
    if m:
        return normalize_number(m.group(1))
    nums = _NUMBER_RE.findall(text)
    return normalize_number(nums[-1]) if nums else None


def numbers_equal(a: str | None, b: str | None) -> bool:
    """Numeric comparison: '18', '18.0' and '18.00' are equal; None never equals anything."""
    if a is None or b is None:
        return False
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return False


def _target_of(answer: str, where: str) -> str:
    if ANSWER_MARK not in answer:
        raise WorkloadError(f"{where}: answer has no '{ANSWER_MARK} N' line")
    target = normalize_number(answer.rsplit(ANSWER_MARK, 1)[1])
    if target is None:
        raise WorkloadError(f"{where}: answer after '{ANSWER_MARK}' is not a number")
    return target


def _rows_to_items(rows: Sequence[Mapping[str, Any]], split: str, source: str) -> list[GSM8KItem]:
    items = []
    for i, row in enumerate(rows):
        where = f"{source} line {i + 1}"
        q, a = row.get("question"), row.get("answer")
        if not isinstance(q, str) or not isinstance(a, str):
            raise WorkloadError(f"{where}: needs string fields 'question' and 'answer'")
        items.append(GSM8KItem(split=split, index=i, question=q, answer=a, target=_target_of(a, where)))
    if not items:
        raise WorkloadError(f"{source}: no questions")
    return items


def _read_jsonl(path: Path) -> tuple[list[dict[str, Any]], str]:
    if not path.is_file():
        raise WorkloadError(f"GSM8K file not found: {path}")
    raw = path.read_bytes()
    rows = []
    for n, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path} line {n}: not JSON ({exc.msg})") from exc
    return rows, sha256_bytes(raw)


def _load_hub(split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as exc:
        raise WorkloadError(
            "GSM8K from the hub needs the `datasets` package, which is not installed; "
            "pass local JSONL paths instead (test_path=..., train_path=...) or pip install datasets"
        ) from exc
    try:
        ds = datasets.load_dataset(HUB_ID, HUB_CONFIG, split=split)
    except Exception as exc:  # offline, no access, renamed: all end the same way for the user
        raise WorkloadError(
            f"cannot load {HUB_ID} ({HUB_CONFIG}, {split}) from the hub: {exc}; "
            f"pass local JSONL paths instead (test_path=..., train_path=...)"
        ) from exc
    return [{"question": r["question"], "answer": r["answer"]} for r in ds]


def load_split(split: str, path: str | Path | None = None) -> tuple[list[GSM8KItem], dict[str, Any]]:
    """All items of one split and where they came from ({"source", "sha256"})."""
    if path is not None:
        rows, digest = _read_jsonl(Path(path))
        source = {"source": str(path), "sha256": digest}
        return _rows_to_items(rows, split, str(path)), source
    rows = _load_hub(split)
    return _rows_to_items(rows, split, f"{HUB_ID}:{split}"), {
        "source": f"hub:{HUB_ID}/{HUB_CONFIG}",
        "sha256": None,
    }


def select_indices(total: int, n: int | None, seed: int) -> list[int]:
    """n distinct indices of range(total), drawn with random.Random(seed), sorted; all when n is None."""
    if n is None:
        return list(range(total))
    if n < 1 or n > total:
        raise WorkloadError(f"gsm8k subset size n={n} must be in 1..{total} (questions in the split)")
    return sorted(random.Random(seed).sample(range(total), n))


def load_gsm8k(
    test_path: str | Path | None = None,
    train_path: str | Path | None = None,
    *,
    n: int | None = None,
    seed: int = 0,
    num_shots: int = DEFAULT_NUM_SHOTS,
) -> GSM8KWorkload:
    """n test questions drawn with `seed` (all when n is None) and the first `num_shots` train items as
    shots (fixed, so every question sees the same prefix). A path left None is read from the hub.
    """
    if num_shots < 0:
        raise WorkloadError(f"gsm8k num_shots must be >= 0, got {num_shots}")
    test, test_src = load_split("test", test_path)
    idx = select_indices(len(test), n, seed)
    shots: list[GSM8KItem] = []
    train_src: dict[str, Any] = {"source": None, "sha256": None}
    if num_shots:
        train, train_src = load_split("train", train_path)
        if num_shots > len(train):
            raise WorkloadError(f"gsm8k num_shots={num_shots} exceeds the {len(train)} train items")
        shots = train[:num_shots]
    selection = {
        "workload": NAME,
        "test_source": test_src["source"],
        "test_sha256": test_src["sha256"],
        "train_source": train_src["source"],
        "train_sha256": train_src["sha256"],
        "test_size": len(test),
        "n": len(idx),
        "seed": seed,
        "indices": idx,
        "num_shots": num_shots,
        "shot_indices": [s.index for s in shots],
    }
    return GSM8KWorkload(items=[test[i] for i in idx], shots=shots, selection=selection)


def strip_calculator(text: str) -> str:
    return _CALCULATOR_RE.sub("", text)


def user_turn(question: str) -> str:
    return f"Question: {question}\nAnswer:"


def build_messages(item: GSM8KItem, shots: Sequence[GSM8KItem]) -> list[dict[str, str]]:
    """k-shot multi-turn chat: (user question, assistant worked answer ending "#### N") per shot, then
    the question. Calculator annotations are stripped from the shots' answers (they are not prose).
    """
    msgs: list[dict[str, str]] = []
    for shot in shots:
        msgs.append({"role": "user", "content": user_turn(shot.question)})
        msgs.append({"role": "assistant", "content": strip_calculator(shot.answer)})
    msgs.append({"role": "user", "content": user_turn(item.question)})
    return msgs


def make_requests(
    workload: GSM8KWorkload,
    *,
    max_tokens: int = 256,
    seed: int | None = None,
    extra_body: Mapping[str, Any] | None = None,
) -> list[ChatRequest]:
    """One greedy chat request per question, prompt ids like `gsm8k-test-00017`."""
    from specbook.serve.client import ChatRequest

    return [
        ChatRequest(
            prompt_id=it.prompt_id,
            messages=build_messages(it, workload.shots),
            max_tokens=max_tokens,
            temperature=0.0,
            seed=seed,
            extra_body=dict(extra_body or {}),
            category=NAME,
        )
        for it in workload.items
    ]


def draw(params: Gsm8kWorkloadParams, seed: int, test_path: Path | None, train_path: Path | None) -> WorkloadDraw:
    """The registry's entry: `params.subset` questions drawn with `seed`, their requests and their grader."""
    from specbook.workloads.base import WorkloadDraw

    wl = load_gsm8k(test_path, train_path, n=params.subset, seed=seed, num_shots=params.shots)
    requests = make_requests(wl, max_tokens=params.max_tokens, seed=params.request_seed)
    return WorkloadDraw(NAME, requests, wl.selection, grader=lambda frame: grade(frame, wl))


def _records_as_frame(records: Sequence[RequestRecord] | pd.DataFrame) -> pd.DataFrame:
    if isinstance(records, pd.DataFrame):
        frame = records
    else:
        frame = pd.DataFrame(
            [r.model_dump() if hasattr(r, "model_dump") else dict(r) for r in records],
        )
    missing = [c for c in ("prompt_id", "output_text") if c not in frame.columns]
    if missing:
        raise WorkloadError(f"gsm8k scoring needs columns {missing}; got {list(frame.columns)}")
    return frame


def grade(
    records: Sequence[RequestRecord] | pd.DataFrame, workload: GSM8KWorkload | None = None
) -> pd.DataFrame:
    """One row per record: target, extracted answer, correct. A failed request counts as wrong.

    Targets come from the workload, or (workload None) from a `target` column of the records frame.
    """
    frame = _records_as_frame(records)
    out = frame.copy()
    if workload is not None:
        items = workload.by_prompt_id()
        unknown = sorted(set(frame["prompt_id"]) - set(items))
        if unknown:
            raise WorkloadError(f"records have prompt ids not in this gsm8k workload: {unknown[:5]}")
        out["target"] = [items[p].target for p in out["prompt_id"]]
    elif "target" not in out.columns:
        raise WorkloadError("gsm8k scoring needs the workload, or a 'target' column in the records frame")
    else:
        out["target"] = [normalize_number(str(t)) for t in out["target"]]
    errors = out["error"] if "error" in out.columns else pd.Series([None] * len(out), index=out.index)
    failed = errors.notna() & (errors.astype(str) != "")
    out["extracted"] = [
        None if bad else extract_answer(str(t or ""))
        for t, bad in zip(out["output_text"], failed, strict=True)
    ]
    out["correct"] = [numbers_equal(e, t) for e, t in zip(out["extracted"], out["target"], strict=True)]
    out["failed"] = failed.to_numpy()
    return out


def score(
    records: Sequence[RequestRecord] | pd.DataFrame,
    workload: GSM8KWorkload | None = None,
    *,
    by: str | Sequence[str] | None = None,
) -> pd.DataFrame:
    """Accuracy with exact counts: correct, total, accuracy, failed (requests that errored), one row
    overall or one per group of `by` (e.g. run_id, arm) when the records frame has those columns.
    """
    graded = grade(records, workload)
    keys = [] if by is None else ([by] if isinstance(by, str) else list(by))
    missing = [k for k in keys if k not in graded.columns]
    if missing:
        raise WorkloadError(f"gsm8k score by={missing}: not columns of the records frame")

    def row(part: pd.DataFrame) -> dict[str, Any]:
        correct, total = int(part["correct"].sum()), len(part)
        return {
            "correct": correct,
            "total": total,
            "accuracy": correct / total if total else float("nan"),
            "failed": int(part["failed"].sum()),
        }

    if not keys:
        return pd.DataFrame([row(graded)])
    rows = []
    for key, part in graded.groupby(keys, sort=False):
        key_t = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(keys, key_t, strict=True)), **row(part)})
    return pd.DataFrame(rows)
