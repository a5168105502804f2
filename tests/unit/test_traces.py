"""Proposal traces: the llama.cpp debug-log parser on verbatim captures, the derivation of accepted counts,
the comparisons and their shift signatures, the record reader, the vLLM plugin's API check."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from specbook.engines.llamacpp.traceparse import ngram_proposals, parse_trace_lines
from specbook.engines.vllm import trace_plugin
from specbook.traces.compare import compare_with_reference, first_diff, matched_anchors, systematic_mismatches
from specbook.traces.derive import (
    EMPTY,
    ENDED,
    PREFILL,
    VERIFIED,
    counts_agree,
    derive_request_steps,
    derive_steps,
    derived_acceptance,
)
from specbook.traces.records import ProposalRecord, TraceError, read_trace_dir, records_frame

FIX = Path(__file__).parents[1] / "fixtures" / "traces"
REQUESTS = json.loads((FIX / "requests.json").read_text())


def _parsed(name: str):
    with open(FIX / name, encoding="utf-8") as fh:
        return parse_trace_lines(fh)


def test_llamacpp_draft_simple_lines_give_records_with_anchor_and_proposals():
    doc = REQUESTS["llamacpp-draft-simple-v.log"]
    parsed = _parsed("llamacpp-draft-simple-v.log")
    assert parsed.emitted == {"task-0": doc["output_ids"]}  # the log's emitted ids are the reply's
    assert parsed.candidate_lines == 24  # 2 drafts x 4 positions x top-3
    recs = parsed.records
    assert [(r.request_id, r.anchor_pos, r.anchor_id, r.proposed) for r in recs] == [
        ("task-0", 43, 39080, (28, 21285, 28, 23636)),
        ("task-0", 45, 12619, (3231, 28, 38766, 28)),
    ]
    # "add accepted tokens: ... ids.size=N" gives N - 1 for every step; "accepted a/k" is not printed for the last
    assert [r.engine_accepted for r in recs] == [1, 3]
    steps = derive_request_steps(records_frame(recs), len(doc["prompt_ids"]), doc["output_ids"])
    assert steps["accepted"].tolist() == [1, 3]
    assert steps["anchor_ok"].tolist() == [True, True]
    assert steps["next_anchor_ok"].tolist() == [True, None]
    acc = derived_acceptance(steps)
    # the reply's own timings count the same drafts
    assert (acc.draft_tokens, acc.accepted_tokens) == (doc["timings"]["draft_n"], doc["timings"]["draft_n_accepted"])
    assert acc.drafts == 2 and acc.accepted_per_position == (2.0, 1.0, 1.0, 0.0)


def test_llamacpp_ngram_proposals_come_from_the_history_and_match_the_engines_own_counts():
    parsed = _parsed("llamacpp-ngram-simple-v.log")
    out = parsed.emitted["task-0"]
    assert len(out) == 48 and len(parsed.ngram_matches) == 10
    assert all(r.proposed == () for r in parsed.records)  # the log prints no ids for ngram-simple
    prompt = REQUESTS["llamacpp-ngram-simple-v.log"]["prompt_ids"]
    recs = ngram_proposals(parsed, {"task-0": prompt + out})
    steps = derive_request_steps(records_frame(recs), len(prompt), out)
    assert (steps["status"] == VERIFIED).all()
    assert steps["accepted"].tolist() == steps["engine_accepted"].tolist() == [0] * 8 + [1, 1]
    assert steps["anchor_ok"].all()
    assert recs[0].proposed == (34, 30, 9230)  # "2. Yes" drafted again after "1. Yes\n"
    assert ngram_proposals(parsed, {})[0].proposed == ()  # no history: no proposals, never guessed


def test_llamacpp_ends_a_step_at_a_matched_eog_short_of_the_drafts_end():
    """Verbatim: the CPU cross-engine demo's llama.cpp draft_model trace pass (see the fixtures' README). The
    target stopped on <|im_end|> (id 2) where the draft had proposed it too; llama.cpp counts that EOG as the
    target's own token unless it is the draft's last (common_sampler_sample_and_accept_n)."""
    doc = REQUESTS["llamacpp-draft-simple-eos-first.log"]
    parsed = _parsed("llamacpp-draft-simple-eos-first.log")
    assert parsed.stopped_on_eog == {"task-24"} and parsed.emitted["task-24"] == doc["output_ids"]
    frame = records_frame(parsed.records)
    assert frame["proposed"].iloc[-1] == [2, 198, 1, 4093] and frame["engine_accepted"].iloc[-1] == 0
    plain = derive_request_steps(frame, len(doc["prompt_ids"]), doc["output_ids"])
    assert plain["accepted"].iloc[-1] == 1 and plain["cut"].iloc[-1]  # the plain match: 1, a lower bound...
    # ... above what the engine counted (0): with llama.cpp's rule the count is exact, step by step
    steps = derive_request_steps(frame, len(doc["prompt_ids"]), doc["output_ids"], eog_stop=True)
    assert steps["accepted"].tolist() == steps["engine_accepted"].tolist() == [4, 0, 0]
    assert not steps["cut"].any()
    acc = derived_acceptance(steps)
    # the server's own line for the request: "draft acceptance = 0.33333 (    4 accepted /    12 generated)"
    assert (acc.accepted_tokens, acc.draft_tokens) == (4, 12)

    tails = _parsed("llamacpp-draft-simple-eos-tails.log")  # the last step of two more requests
    assert tails.stopped_on_eog == {"task-176", "task-217"}
    for rid, proposed, engine in (("task-176", [340, 30, 2, 198], 2), ("task-217", [281, 2321, 30, 2], 4)):
        d = REQUESTS[f"llamacpp-draft-simple-eos-tails.log#{rid}"]
        recs = records_frame([r for r in tails.records if r.request_id == rid])
        assert recs["proposed"].tolist() == [proposed] and recs["engine_accepted"].tolist() == [engine]
        got = derive_request_steps(recs, len(d["prompt_ids"]), d["output_ids"], eog_stop=True)
        # task-176: matched 3 ids up to the EOG at draft position 3 of 4: 2 accepted; task-217: the EOG is the
        # draft's last proposal, accepted (the target's next sample past it is never emitted)
        assert got["accepted"].tolist() == [engine] and not got["cut"].any()


def test_llamacpp_ngram_draft_shortened_to_what_the_request_may_still_emit():
    """Verbatim: ngram-simple found a 4-token continuation, the server drafted 3 (`#draft=3`: 4 tokens left to
    max_tokens 96); the proposals are cut to what was drafted, as the engine's counts say."""
    doc = REQUESTS["llamacpp-ngram-simple-cut-draft.log"]
    parsed = _parsed("llamacpp-ngram-simple-cut-draft.log")
    (rec,) = ngram_proposals(parsed, {"task-107": doc["prompt_ids"] + doc["output_ids"]})
    assert len(rec.proposed) == 3 and rec.engine_accepted == 3 and not parsed.stopped_on_eog
    steps = derive_request_steps(records_frame([rec]), len(doc["prompt_ids"]), doc["output_ids"])
    assert steps["accepted"].tolist() == [3] and steps["status"].tolist() == [VERIFIED]


def _frame(rows):
    return records_frame([ProposalRecord(engine="t", request_id=r[0], anchor_pos=r[1], anchor_id=r[2],
                                         proposed=tuple(r[3])) for r in rows])


def test_derive_statuses_and_counts():
    # prompt 3 tokens [7, 8, 9]; emitted 10 11 12 13 14
    out = [10, 11, 12, 13, 14]
    recs = _frame([
        ("r", 3, 9, [1, 2]),          # before any emitted token: a partial prefill's draft, discarded
        ("r", 4, 10, [11, 12, 99]),   # 2 accepted, then bonus 13
        ("r", 7, 13, []),             # nothing proposed
        ("r", 7, 13, [14, 5]),        # 1 accepted (14), request ends there
        ("r", 8, 14, [1, 1]),         # after the last token: never verified
        ("other", 4, 1, [1]),         # not in this window
    ])
    steps = derive_steps(recs, {"r": (3, out)})
    assert steps["status"].tolist() == [PREFILL, VERIFIED, EMPTY, VERIFIED, ENDED]
    assert steps["accepted"].tolist() == [0, 2, 0, 1, 0]
    assert steps.loc[1, "next_anchor_ok"] is True or steps.loc[1, "next_anchor_ok"] == True  # noqa: E712
    # the request stopped inside the 4th step: the engine may have kept the proposal past its last token
    assert steps["cut"].tolist() == [False, False, False, True, False]
    acc, upper = derived_acceptance(steps), derived_acceptance(steps, upper=True)
    assert (acc.drafts, acc.draft_tokens, acc.accepted_tokens) == (2, 5, 3)
    assert acc.accepted_per_position == (2.0, 1.0, 0.0)
    assert (upper.accepted_tokens, upper.accepted_per_position) == (4, (2.0, 2.0, 0.0))
    assert counts_agree(acc, acc) == []
    kept_past_stop = acc.model_copy(update={"accepted_tokens": 4.0, "accepted_per_position": (2.0, 2.0, 0.0)})
    assert counts_agree(acc, kept_past_stop, upper) == []
    assert counts_agree(acc, kept_past_stop) == [
        "accepted_tokens: derived 3 vs counters 4",
        "accepted per position: derived (2.0, 1.0, 0.0) vs counters (2.0, 2.0, 0.0)"]
    too_many = acc.model_copy(update={"accepted_tokens": 5.0})
    assert counts_agree(acc, too_many, upper) == ["accepted_tokens: derived 3..4 vs counters 5"]


def test_a_wrong_anchor_layout_is_caught_by_the_chain_and_named_by_the_shift_signature():
    prompt_len, out = 2, [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    # an engine whose records are one token late: each draft continues one token past its anchor
    recs = _frame([("r", 3 + 4 * i, out[4 * i], out[4 * i + 2: 4 * i + 5]) for i in range(3)])
    steps = derive_steps(recs, {"r": (prompt_len, out)}).assign(prompt_id="p")
    reference = pd.DataFrame({"request_id": "r", "anchor_pos": steps["anchor_pos"],
                              "reference": [out[4 * i + 1: 4 * i + 4] for i in range(3)]})
    cmp = compare_with_reference(steps, reference, {"r": out})
    assert not cmp["identical"].any() and cmp["first_diff"].tolist() == [1, 1, 1]
    assert cmp["late_by_one"].all() and cmp["output_shifted"].all() and not cmp["early_by_one"].any()
    named = systematic_mismatches(cmp)
    assert [n.split(":")[0] for n in named] == ["late_by_one", "output_shifted"]
    same = compare_with_reference(steps, reference.assign(reference=steps["proposed"]), {"r": out})
    assert same["identical"].all() and systematic_mismatches(same) == []


def test_first_diff_and_matched_anchors():
    assert first_diff([1, 2, 3], [1, 2, 3]) is None
    assert first_diff([1, 2, 3], [1, 5, 3]) == 2
    assert first_diff([1, 2], [1, 2, 3]) == 3
    out_a, out_b = [10, 11, 12, 13], [10, 11, 40, 41]
    a = derive_steps(_frame([("a", 3, 10, [11, 12]), ("a", 5, 12, [13, 1])]), {"a": (2, out_a)}).assign(prompt_id="p")
    b = derive_steps(_frame([("b", 3, 10, [11, 99]), ("b", 5, 40, [41, 2])]), {"b": (2, out_b)}).assign(prompt_id="p")
    m = matched_anchors(a, {"a": [7, 8] + out_a}, b, {"b": [7, 8] + out_b})
    # anchor 5: the prefixes differ (12 vs 40), so only anchor 3 is matched
    assert m["anchor_pos"].tolist() == [3] and m["first_diff"].tolist() == [2]
    assert m[["accepted_a", "accepted_b"]].values.tolist() == [[2, 1]]


def test_read_trace_dir_reads_every_process_file_and_names_a_bad_line(tmp_path):
    rec = {"schema": 1, "engine": "vllm", "request_id": "x", "anchor_pos": 5, "anchor_id": 3, "proposed": [1, 2]}
    (tmp_path / "vllm-1.jsonl").write_text(json.dumps(rec) + "\n")
    (tmp_path / "vllm-2.jsonl").write_text(json.dumps({**rec, "anchor_pos": 7}) + "\n")
    (tmp_path / "vllm-1.status.json").write_text(json.dumps({"patched": ["x"]}))
    records, statuses = read_trace_dir(tmp_path)
    assert [r.anchor_pos for r in records] == [5, 7] and statuses == [{"patched": ["x"]}]
    (tmp_path / "vllm-3.jsonl").write_text(json.dumps({**rec, "proposed": "no"}) + "\n")
    with pytest.raises(TraceError, match=r"vllm-3.jsonl:1"):
        read_trace_dir(tmp_path)
    with pytest.raises(TraceError, match="does not exist"):
        read_trace_dir(tmp_path / "missing")


def test_vllm_plugin_knows_the_installed_runner_api_and_names_what_is_missing(monkeypatch):
    import importlib.util
    import sys

    # the installed runner's source, read as text (importing it costs seconds)
    root = Path(importlib.util.find_spec("vllm").origin).parent
    source = (root / "v1" / "worker" / "gpu_model_runner.py").read_text()
    assert trace_plugin.api_problems(source) == []
    missing = trace_plugin.api_problems("def sample_tokens(")
    assert any("propose_draft_token_ids" in m for m in missing) and not any("(the step" in m for m in missing)
    monkeypatch.delenv(trace_plugin.TRACE_DIR_ENV, raising=False)
    loaded = trace_plugin.RUNNER_MODULE in sys.modules
    trace_plugin.register()  # without the env var: a no-op that does not even import the runner
    assert (trace_plugin.RUNNER_MODULE in sys.modules) == loaded

def test_vllm026_cuda_plugin_records_self_draft_chain():
    """Records the plugin wrote on CUDA vLLM 0.26.0 (H200), draft_model with the target as its own draft:
    every proposal is accepted, so each request's anchors advance by k + 1 = 5 per step."""
    records, statuses = read_trace_dir_files(FIX / "vllm026-cuda-draft-selfdraft.jsonl",
                                             FIX / "vllm026-cuda-draft-selfdraft.status.json")
    assert statuses["vllm"] == "0.26.0" and len(statuses["patched"]) == 2
    frame = records_frame(records)
    assert len(frame) == 50 and frame["proposed"].map(len).eq(4).all()
    for _, group in frame.groupby("request_id"):
        assert group["anchor_pos"].diff().dropna().eq(5).all(), group["anchor_pos"].tolist()
        assert (group["anchor_pos"].iloc[0] - group["prompt_len"].iloc[0]) == 1  # first draft after prefill


def read_trace_dir_files(jsonl: Path, status: Path):
    from specbook.traces.records import read_trace_file

    return read_trace_file(jsonl), json.loads(status.read_text())


def test_an_earlier_requests_late_log_lines_are_not_taken_for_the_pass():
    """A real llama-server log range of a two-request pass that also held the warm-up's task, written late by the
    server's log thread: the pass's tasks are the last two; fewer tasks than requests stays an error."""
    from specbook.engines.llamacpp.tracer import pass_tasks

    lines = (FIX / "llamacpp-draft-simple-late-earlier-task.log").read_text().splitlines()
    tasks = list(parse_trace_lines(lines).emitted)
    assert tasks == ["task-0", "task-6", "task-16"]
    assert pass_tasks(tasks, 2, "s") == (["task-6", "task-16"], ["task-0"])
    assert pass_tasks(tasks[1:], 2, "s") == (["task-6", "task-16"], [])
    with pytest.raises(TraceError, match="s: the debug log shows 1 tasks emitting tokens for 2 requests"):
        pass_tasks(tasks[2:], 2, "s")
