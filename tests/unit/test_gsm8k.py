"""specbook.workloads.gsm8k: loading, selection, 5-shot chat messages, extraction, scoring."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pandas as pd
import pytest

from specbook.core.errors import WorkloadError
from specbook.serve.client import ChatRequest, RequestRecord, records_frame
from specbook.workloads import get_workload, list_workloads
from specbook.workloads.gsm8k import (
    build_messages,
    extract_answer,
    grade,
    load_gsm8k,
    make_requests,
    normalize_number,
    numbers_equal,
    score,
)

SHARED = Path("/work/shared/data/gsm8k")


def write_jsonl(path: Path, n: int, offset: int = 0) -> Path:
    rows = [
        {"question": f"Tom has {i + offset} apples and buys 2 more. How many?",
         "answer": f"He has {i + offset} + 2 = <<{i + offset}+2={i + offset + 2}>>{i + offset + 2} apples.\n#### {i + offset + 2}"}
        for i in range(n)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    return write_jsonl(tmp_path / "test.jsonl", 40), write_jsonl(tmp_path / "train.jsonl", 10, offset=1000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She makes 9 * 2 = $18 every day.\n#### 18", "18"),
        ("#### $1,234.", "1234"),
        ("####-7", "-7"),
        ("#### 3.50\nQuestion: next one has 99", "3.50"),
        ("So the answer is 42.", "42"),
        ("It costs $1,200.50 in total, i.e. 1200.5", "1200.5"),
        ("first 5 then 6 and finally 10.", "10"),
        ("no number here", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_numeric_comparison():
    assert numbers_equal("18", "18.00") and numbers_equal(normalize_number("$1,000."), "1000")
    assert not numbers_equal("18", "18.5") and not numbers_equal(None, "1")


def test_load_subset_is_deterministic_and_recorded(files):
    test, train = files
    a = load_gsm8k(test, train, n=7, seed=3)
    b = load_gsm8k(test, train, n=7, seed=3)
    c = load_gsm8k(test, train, n=7, seed=4)
    assert a.selection["indices"] == b.selection["indices"] != c.selection["indices"]
    assert a.selection["indices"] == sorted(a.selection["indices"]) and len(set(a.selection["indices"])) == 7
    assert a.selection["test_source"] == str(test) and len(a.selection["test_sha256"]) == 64
    assert a.selection["shot_indices"] == [0, 1, 2, 3, 4] and a.selection["n"] == 7
    assert [it.prompt_id for it in a.items] == [f"gsm8k-test-{i:05d}" for i in a.selection["indices"]]
    assert a.items[0].target == str(a.selection["indices"][0] + 2)


def test_messages_are_five_shot_chat(files):
    w = load_gsm8k(*files, n=2, seed=0)
    msgs = build_messages(w.items[0], w.shots)
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 5 + ["user"]
    assert msgs[0]["content"] == "Question: Tom has 1000 apples and buys 2 more. How many?\nAnswer:"
    assert msgs[1]["content"] == "He has 1000 + 2 = 1002 apples.\n#### 1002"  # calculator notes stripped
    assert msgs[-1]["content"] == f"Question: {w.items[0].question}\nAnswer:"


def test_make_requests_are_greedy_chat_requests(files):
    w = load_gsm8k(*files, n=3, seed=1)
    reqs = make_requests(w, max_tokens=128)
    assert all(isinstance(r, ChatRequest) for r in reqs)
    assert [r.prompt_id for r in reqs] == [it.prompt_id for it in w.items]
    assert {r.temperature for r in reqs} == {0.0} and {r.max_tokens for r in reqs} == {128}
    assert reqs[0].endpoint == "/v1/chat/completions"


def test_score_exact_counts_from_records_and_frame(files):
    w = load_gsm8k(*files, n=4, seed=0)
    it = w.items
    records = [
        RequestRecord(prompt_id=it[0].prompt_id, output_text=f"so {it[0].target} apples\n#### {it[0].target}"),
        RequestRecord(prompt_id=it[1].prompt_id, output_text=f"The answer is {it[1].target}.00."),
        RequestRecord(prompt_id=it[2].prompt_id, output_text="#### 123456"),
        RequestRecord(prompt_id=it[3].prompt_id, output_text="", error="ReadTimeout"),
    ]
    s = score(records, w)
    assert s.to_dict("records") == [{"correct": 2, "total": 4, "accuracy": 0.5, "failed": 1}]
    frame = records_frame(records).assign(run_id=["r0", "r0", "r1", "r1"])
    by = score(frame, w, by="run_id").set_index("run_id")
    assert by.loc["r0", "correct"] == 2 and by.loc["r1", "correct"] == 0 and by.loc["r1", "failed"] == 1
    g = grade(frame, w)
    assert list(g["extracted"][:3]) == [it[0].target, f"{it[1].target}.00", "123456"]
    assert pd.isna(g["extracted"].iloc[3]) and list(g["failed"]) == [False, False, False, True]


def test_score_from_frame_with_target_column():
    frame = pd.DataFrame({"prompt_id": ["p1", "p2"], "output_text": ["#### 7", "#### 8"], "target": ["7", "9"]})
    assert score(frame).loc[0, "correct"] == 1


def test_bad_inputs_name_the_file_or_field(tmp_path, files):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a\\n#### 1"}\nnot json\n', encoding="utf-8")
    with pytest.raises(WorkloadError, match="bad.jsonl line 2"):
        load_gsm8k(bad, files[1])
    nomark = tmp_path / "nomark.jsonl"
    nomark.write_text('{"question": "q", "answer": "no final mark"}\n', encoding="utf-8")
    with pytest.raises(WorkloadError, match="nomark.jsonl line 1.*####"):
        load_gsm8k(nomark, files[1])
    with pytest.raises(WorkloadError, match="missing.jsonl"):
        load_gsm8k(tmp_path / "missing.jsonl", files[1])
    with pytest.raises(WorkloadError, match="n=41"):
        load_gsm8k(*files, n=41)
    w = load_gsm8k(*files, n=1)
    with pytest.raises(WorkloadError, match="gsm8k-test-99999"):
        score([RequestRecord(prompt_id="gsm8k-test-99999", output_text="1")], w)


def test_hub_without_datasets_says_to_pass_a_path(monkeypatch, files):
    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("No module named 'datasets'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(WorkloadError, match="test_path="):
        load_gsm8k(None, files[1])


def test_registry():
    assert "gsm8k" in list_workloads() and get_workload("gsm8k").NAME == "gsm8k"
    with pytest.raises(WorkloadError, match="known"):
        get_workload("mmlu")


@pytest.mark.skipif(not (SHARED / "test.jsonl").is_file(), reason="shared GSM8K copy not on this machine")
def test_real_gsm8k_files():
    w = load_gsm8k(SHARED / "test.jsonl", SHARED / "train.jsonl", n=50, seed=0)
    assert w.selection["test_size"] == 1319 and len(w.items) == 50
    # every reference solution grades as correct against its own target
    records = [RequestRecord(prompt_id=it.prompt_id, output_text=it.answer) for it in w.items]
    assert score(records, w).loc[0, "correct"] == 50
    janet = load_gsm8k(SHARED / "test.jsonl", SHARED / "train.jsonl", num_shots=5).items[0]
    assert janet.prompt_id == "gsm8k-test-00000" and janet.target == "18"
