"""The workload registry: Spec-Bench's loader against the real shared file, the stratified draw, the jsonl
workload and its errors, the params schema per workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from specbook.core.errors import ParamsError, WorkloadError
from specbook.workloads import draw_workload, get_workload, list_workloads
from specbook.workloads.base import stratified_sample
from specbook.workloads.params import (
    SPEC_BENCH_GROUPS,
    Gsm8kWorkloadParams,
    JsonlWorkloadParams,
    SpecBenchWorkloadParams,
    WorkloadParams,
)
from specbook.workloads.spec_bench import group_of

SPEC_BENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"
SPEC_BENCH_SHA256 = "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"
ADAPTER = TypeAdapter(WorkloadParams)


@pytest.fixture
def spec_bench_path() -> Path:
    if not SPEC_BENCH.is_file():
        pytest.skip(f"SPEC-BENCH DATA ABSENT: {SPEC_BENCH} (the shared Spec-Bench question.jsonl beside the "
                    f"checkout) is needed for the loader tests")
    return SPEC_BENCH


def spec_bench(path: Path, **kw) -> SpecBenchWorkloadParams:
    return ADAPTER.validate_python({"dataset": "spec_bench", "path": str(path), **kw})


def test_registry_knows_the_three_workloads():
    assert {"gsm8k", "spec_bench", "jsonl"} <= set(list_workloads())
    with pytest.raises(WorkloadError, match="unknown workload 'nope'"):
        get_workload("nope")


def test_params_pick_the_schema_by_dataset_and_default_to_gsm8k():
    assert isinstance(ADAPTER.validate_python({"subset": 3}), Gsm8kWorkloadParams)
    assert isinstance(ADAPTER.validate_python({"dataset": "jsonl", "path": "x.jsonl"}), JsonlWorkloadParams)
    sb = ADAPTER.validate_python({"dataset": "spec_bench"})
    assert isinstance(sb, SpecBenchWorkloadParams) and sb.categories == list(SPEC_BENCH_GROUPS)
    with pytest.raises(ValidationError, match=r"categories\.1[\s\S]*'mt_bench'"):  # unknown category named
        ADAPTER.validate_python({"dataset": "spec_bench", "categories": ["qa", "poetry"]})
    with pytest.raises(ValidationError, match="test_path"):  # a gsm8k field is no Spec-Bench field
        ADAPTER.validate_python({"dataset": "spec_bench", "test_path": "t.jsonl"})
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        ADAPTER.validate_python({"dataset": "mmlu"})


def test_spec_bench_loader_reads_the_shared_file(spec_bench_path):
    draw = draw_workload(spec_bench(spec_bench_path, per_category=None), 0)
    assert draw.selection["sha256"] == SPEC_BENCH_SHA256
    assert len(draw.requests) == 480 and draw.categories == list(SPEC_BENCH_GROUPS)
    by_cat = {c: [r for r in draw.requests if r.category == c] for c in draw.categories}
    assert {c: len(v) for c, v in by_cat.items()} == dict.fromkeys(SPEC_BENCH_GROUPS, 80)
    # MT-Bench goes as two turns, every other group as one; question ids as the README says
    assert all(len(r.follow_up) == 1 for r in by_cat["mt_bench"])
    assert not any(r.follow_up for c, v in by_cat.items() if c != "mt_bench" for r in v)
    assert [r.prompt_id for r in by_cat["mt_bench"]][:2] == ["spec_bench-81", "spec_bench-82"]
    assert by_cat["rag"][-1].prompt_id == "spec_bench-560"
    first = json.loads(spec_bench_path.read_text().splitlines()[0])
    assert by_cat["mt_bench"][0].messages == [{"role": "user", "content": first["turns"][0]}]
    assert by_cat["mt_bench"][0].follow_up == [first["turns"][1]]
    one_turn = draw_workload(spec_bench(spec_bench_path, per_category=2, turns=1, categories=["mt_bench"]), 0)
    assert [r.follow_up for r in one_turn.requests] == [[], []]


def test_spec_bench_draw_is_stratified_seeded_and_in_the_order_asked(spec_bench_path):
    p = spec_bench(spec_bench_path, per_category=3, categories=["rag", "mt_bench", "qa"], max_tokens=17)
    a, b, c = draw_workload(p, 1), draw_workload(p, 1), draw_workload(p, 2)
    assert [r.category for r in a.requests] == ["rag"] * 3 + ["mt_bench"] * 3 + ["qa"] * 3
    assert [r.prompt_id for r in a.requests] == [r.prompt_id for r in b.requests]
    assert [r.prompt_id for r in a.requests] != [r.prompt_id for r in c.requests]
    assert all(r.max_tokens == 17 and r.temperature == 0.0 for r in a.requests)
    assert a.selection["question_ids"] == [int(r.prompt_id.split("-")[1]) for r in a.requests]
    assert [group_of(c) for c in a.selection["source_categories"]] == [r.category for r in a.requests]
    # one group's draw does not move when another group is added
    rag_only = draw_workload(spec_bench(spec_bench_path, per_category=3, categories=["rag"]), 1)
    assert [r.prompt_id for r in rag_only.requests] == [r.prompt_id for r in a.requests[:3]]


def test_stratified_sample_errors_name_the_category():
    rows = [{"c": "a", "i": i} for i in range(3)] + [{"c": "b", "i": 9}]
    picked = stratified_sample(rows, lambda r: r["c"], ["b", "a"], 1, 0, "w")
    assert [r["c"] for r in picked] == ["b", "a"]
    assert len(stratified_sample(rows, lambda r: r["c"], ["a"], None, 0, "w")) == 3
    with pytest.raises(WorkloadError, match="per_category=2 exceeds the 1 rows of category 'b'"):
        stratified_sample(rows, lambda r: r["c"], ["b"], 2, 0, "w")
    with pytest.raises(WorkloadError, match="category 'z' has no rows"):
        stratified_sample(rows, lambda r: r["c"], ["z"], 1, 0, "w")


def test_spec_bench_bad_input_names_file_field_and_category(tmp_path):
    with pytest.raises(ParamsError, match=r"^workload\.path: '.*missing\.jsonl' cannot be read"):
        draw_workload(spec_bench(tmp_path / "missing.jsonl"), 0)
    bad = tmp_path / "q.jsonl"
    bad.write_text(json.dumps({"question_id": 1, "category": "poetry", "turns": ["x"]}) + "\n")
    with pytest.raises(WorkloadError, match=r"q\.jsonl line 1: unknown category 'poetry'"):
        draw_workload(spec_bench(bad), 0)
    bad.write_text(json.dumps({"question_id": 1, "category": "qa"}) + "\n")
    with pytest.raises(WorkloadError, match=r"q\.jsonl line 1: field 'turns' absent"):
        draw_workload(spec_bench(bad), 0)
    with pytest.raises(WorkloadError, match="give workload.path"):
        draw_workload(ADAPTER.validate_python({"dataset": "spec_bench"}), 0)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def jsonl(path: Path, **kw) -> JsonlWorkloadParams:
    return ADAPTER.validate_python({"dataset": "jsonl", "path": str(path), **kw})


def test_jsonl_workload_fields_categories_turns_and_subset(tmp_path):
    f = write_jsonl(tmp_path / "mine.jsonl", [
        {"id": "a", "text": "one", "kind": "chat"},
        {"id": "b", "text": ["two", "and then?"], "kind": "chat"},
        {"id": "c", "text": "three", "kind": "code"},
    ])
    draw = draw_workload(jsonl(f, prompt_field="text", category_field="kind", id_field="id", max_tokens=9), 0)
    assert [(r.prompt_id, r.category, r.follow_up) for r in draw.requests] == [
        ("a", "chat", []), ("b", "chat", ["and then?"]), ("c", "code", [])]
    assert draw.requests[1].messages == [{"role": "user", "content": "two"}]
    assert draw.categories == ["chat", "code"] and draw.selection["lines"] == [1, 2, 3]
    plain = draw_workload(jsonl(f, prompt_field="text"), 0)  # no category field: one category, ids by line
    assert {r.category for r in plain.requests} == {"jsonl"} and plain.requests[0].prompt_id == "jsonl-00001"
    one_each = draw_workload(jsonl(f, prompt_field="text", category_field="kind", subset=1), 5)
    assert [r.category for r in one_each.requests] == ["chat", "code"]
    assert draw.grade is not None and draw.grader is None  # ungraded: no `correct` column is invented


def test_jsonl_errors_name_the_file_line_and_field(tmp_path):
    f = write_jsonl(tmp_path / "mine.jsonl", [{"prompt": "p1", "kind": "x"}, {"question": "p2"}])
    with pytest.raises(WorkloadError, match=r"mine\.jsonl line 2: field 'prompt' \(workload\.prompt_field\) "
                                            r"absent; fields there: \['question'\]"):
        draw_workload(jsonl(f), 0)
    g = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "p1", "kind": "x"}, {"prompt": "p2"}])
    with pytest.raises(WorkloadError, match=r"g\.jsonl line 2: field 'kind' \(workload\.category_field\) absent"):
        draw_workload(jsonl(g, category_field="kind"), 0)
    with pytest.raises(WorkloadError, match=r"g\.jsonl line 1: field 'id' \(workload\.id_field\) absent"):
        draw_workload(jsonl(g, id_field="id"), 0)
    h = write_jsonl(tmp_path / "h.jsonl", [{"prompt": "p", "id": 1}, {"prompt": "q", "id": 1}])
    with pytest.raises(WorkloadError, match=r"ids repeat in field 'id': \['1'\]"):
        draw_workload(jsonl(h, id_field="id"), 0)
    (tmp_path / "broken.jsonl").write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(WorkloadError, match=r"broken\.jsonl line 2: not JSON"):
        draw_workload(jsonl(tmp_path / "broken.jsonl"), 0)
    e = write_jsonl(tmp_path / "e.jsonl", [{"prompt": ""}])
    with pytest.raises(WorkloadError, match=r"e\.jsonl line 1: field 'prompt' must be a non-empty string"):
        draw_workload(jsonl(e), 0)
    with pytest.raises(ParamsError, match=r"^workload\.path: '.*nope\.jsonl' cannot be read"):
        draw_workload(jsonl(tmp_path / "nope.jsonl"), 0)


def test_gsm8k_through_the_registry_carries_its_category_and_grader():
    gsm8k = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k"
    if not (gsm8k / "test.jsonl").is_file():
        pytest.skip(f"GSM8K DATA ABSENT: {gsm8k}/test.jsonl is needed for this test")
    p = ADAPTER.validate_python({"test_path": str(gsm8k / "test.jsonl"), "train_path": str(gsm8k / "train.jsonl"),
                                 "subset": 2, "shots": 1})
    draw = draw_workload(p, 3)
    assert draw.categories == ["gsm8k"] and len(draw.requests) == 2 and len(draw.requests[0].messages) == 3
    import pandas as pd

    graded = draw.grade(pd.DataFrame({"prompt_id": [r.prompt_id for r in draw.requests],
                                      "output_text": ["#### 0", "no idea"], "error": [None, None]}))
    assert "correct" in graded and not graded["correct"].iloc[1]
