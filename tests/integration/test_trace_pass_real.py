"""Trace passes on real servers with the embedded model: vLLM-CPU (specbook's vLLM plugin) and llama-server
(`-v` debug lines), draft_model and ngram. Derived accepted counts must equal each engine's counters for
the same window; records must be well formed (anchor ids equal the emitted tokens, greedy's anchor layout);
the draft_model traces are compared with the replay reference (transformers, same weights).

Run under the shared engine lock: `flock /tmp/specbook-engine.lock .venv/bin/pytest -m integration -s`.
"""

from __future__ import annotations

import pytest

from specbook.engines import EngineConfig, get_engine, launch
from specbook.measure.harness import Server
from specbook.measure.tracepass import TraceSet, trace_pass, traced_config
from specbook.models import DRAFT_INT4, TARGET
from specbook.serve.client import ChatRequest
from specbook.traces.compare import compare_with_reference, identical_share, systematic_mismatches
from specbook.traces.derive import VERIFIED
from specbook.traces.records import read_trace_dir
from specbook.traces.replay import load_draft, replay_reference

pytestmark = pytest.mark.integration

K = 4
SPECS = {
    "draft": {"method": "draft_model", "model": DRAFT_INT4, "num_speculative_tokens": K},
    "ngram": {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 3},
}
REQUESTS = [
    ChatRequest(prompt_id="yes-loop", messages=[{"role": "user", "content": "Write the word 'yes' 100 times."}],
                max_tokens=32),
    ChatRequest(prompt_id="bicycle", messages=[{"role": "user", "content":
                "Write a short paragraph explaining how a bicycle works."}], max_tokens=32),
]
WARM_UP = REQUESTS[0].model_copy(update={"prompt_id": "warm-up", "max_tokens": 8})
ENGINE_ARGS = {"vllm": {"dtype": "bfloat16"}, "llamacpp": {"extra_args": ["-t", "2"]}}


def _trace(tmp_path, engine: str, lane: str) -> TraceSet:
    cfg = EngineConfig(engine=engine, model=TARGET, served_model_name="smollm2", max_num_seqs=1,
                       speculative_config=SPECS[lane], **ENGINE_ARGS[engine])
    folder = tmp_path / f"{engine}-{lane}"
    cfg = traced_config(cfg, folder / "trace")
    with launch(cfg, name=f"trace-{engine}-{lane}", log_path=folder / "server.log") as managed:
        server = Server(managed, get_engine(engine), cfg, {})
        server.send([WARM_UP])  # outside the pass: vLLM's plugin is installed and off, so it records nothing
        if engine == "vllm":
            records, statuses = read_trace_dir(folder / "trace")
            assert statuses and all(s.get("patched") for s in statuses) and records == [], (statuses, records[:2])
        return trace_pass(server, REQUESTS, folder / "trace")


def _check_well_formed(ts: TraceSet) -> None:
    assert ts.untraceable is None, ts.untraceable
    steps = ts.steps()
    verified = steps[steps["status"] == VERIFIED]
    assert len(verified) > 0, f"{ts.server}: no verified draft step"
    assert verified["proposed"].map(len).between(1, K).all()
    # the record's anchor id is the token before the anchor position; greedy's layout chains the anchors
    assert verified["anchor_ok"].all(), verified[~verified["anchor_ok"].astype(bool)].head()
    assert not (verified["next_anchor_ok"] == False).any()  # noqa: E712
    assert ts.disagreements() == [], (ts.disagreements(), ts.derived_acceptance(), ts.counters)
    # llama.cpp says what it accepted at every step ("add accepted tokens: ... ids.size"): the same, step by step
    known = verified[verified["engine_accepted"].notna()]
    if ts.engine == "llamacpp":
        assert len(known) == len(verified), f"{len(verified) - len(known)} llama.cpp steps without the engine's count"
    assert (known["accepted"] == known["engine_accepted"]).all(), known[known["accepted"] != known["engine_accepted"]]
    acc = ts.derived_acceptance()
    print(f"\n[{ts.server}] {len(ts.requests)} requests, {ts.output_tokens} tokens, {len(verified)} draft steps: "
          f"derived drafts={acc.drafts:g} draft_tokens={acc.draft_tokens:g} accepted={acc.accepted_tokens:g} "
          f"== counters; pass {ts.wall_s:.1f} s")


def _check_against_replay(ts: TraceSet) -> float:
    lm = load_draft(DRAFT_INT4)
    steps = ts.steps()
    seqs = {r.request_id: (r.prompt_ids, r.output_ids) for r in ts.requests}
    assert all(p is not None for p, _ in seqs.values()), "prompt ids missing from the pass"
    ref = replay_reference(lm, steps[steps["status"] == VERIFIED], seqs, K)
    cmp = compare_with_reference(steps, ref, {rid: out for rid, (_, out) in seqs.items()})
    assert len(cmp) == (steps["status"] == VERIFIED).sum()
    share = identical_share(cmp)
    print(f"[{ts.server}] proposals identical to the replay reference at {share:.1%} of {len(cmp)} anchors; "
          f"systematic mismatches: {systematic_mismatches(cmp) or 'none'}")
    assert systematic_mismatches(cmp) == []
    assert share >= 0.5, cmp[~cmp["identical"]].head(10)
    return share


# vLLM's draft_model trace pass runs in the fast tier's cross-engine e2e run (draft lane)
@pytest.mark.parametrize("engine", [pytest.param("vllm", marks=pytest.mark.slow), "llamacpp"])
def test_trace_pass_draft_model(tmp_path, engine):
    ts = _trace(tmp_path, engine, "draft")
    _check_well_formed(ts)
    _check_against_replay(ts)


# vLLM's ngram trace pass: full tier (the fast tier traces vLLM's draft_model lane in the cross-engine e2e run)
@pytest.mark.parametrize("engine", [pytest.param("vllm", marks=pytest.mark.slow), "llamacpp"])
def test_trace_pass_ngram(tmp_path, engine):
    ts = _trace(tmp_path, engine, "ngram")
    _check_well_formed(ts)


def test_loading_the_replay_draft_writes_no_progress_bar(capfd):
    # the replay runs in a report cell: transformers' "Loading weights" bar would be printed into the report
    from transformers.utils import logging as hf_logging

    assert load_draft(DRAFT_INT4) is not None
    out, err = capfd.readouterr()
    assert "Loading weights" not in out + err, err[-300:]
    assert hf_logging.is_progress_bar_enabled()  # put back as it was for the rest of the process


def test_replay_cache_walk_equals_a_fresh_generate_at_each_anchor():
    # greedy_proposals cuts one KV cache back anchor by anchor; the reference here prefills each prefix anew.
    # In float32: in bf16 the two orders of summation already tie at this sequence's anchor 20 (30.375 twice)
    import torch

    from specbook.traces.replay import greedy_proposals

    lm = load_draft(DRAFT_INT4, "float32")
    seq = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3717, 314, 2, 198, 1, 4093, 198, 19161,
           260, 1932, 216, 33, 30, 2683, 24, 1302, 2, 198, 1, 520, 9531, 198, 504, 1296, 338, 253, 10589]
    anchors = [1, 2, 9, 20, 21, 30, len(seq)]
    fresh = []
    for a in anchors:
        with torch.inference_mode():
            gen = lm.generate(input_ids=torch.tensor([seq[:a]]), max_new_tokens=K, min_new_tokens=K,
                              do_sample=False, num_beams=1, eos_token_id=None, pad_token_id=0)
        fresh.append(gen[0, a:].tolist())
    walked = greedy_proposals(lm, seq, anchors, K)
    assert walked == fresh
    assert greedy_proposals(lm, seq, list(reversed(anchors)), K) == list(reversed(fresh))  # the caller's order
    with pytest.raises(ValueError, match="anchors must lie in 1..37"):
        greedy_proposals(lm, seq, [0, 5], K)


class _CountingLM:
    """The draft, counting its forward passes."""

    def __init__(self, lm):
        self.lm, self.forwards = lm, 0

    def __call__(self, *args, **kwargs):
        self.forwards += 1
        return self.lm(*args, **kwargs)


def test_replayer_remembers_a_sequence_and_each_anchor_stands_alone():
    # the other side's identical output is replayed from the memo, with what computing it again gives
    from specbook.traces.replay import DraftReplayer

    lm = load_draft(DRAFT_INT4)
    seq = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3717, 314, 2, 198, 1, 4093, 198, 19161,
           260, 1932, 216, 33, 30, 2683, 24, 1302, 2, 198, 1, 520, 9531, 198, 504, 1296, 338, 253, 10589]
    anchors = [2, 9, 20, 30, len(seq)]
    counting = _CountingLM(lm)
    replay = DraftReplayer(counting)
    first = replay.proposals(seq, anchors, K)
    computed_forwards = counting.forwards
    assert computed_forwards == 1 + len(anchors) * K  # one prefill, then k steps per anchor
    assert replay.proposals(seq, [20, 2], K) == [first[2], first[0]]
    assert counting.forwards == computed_forwards and (replay.computed, replay.reused) == (len(anchors), 2)
    # a proposal depends on the sequence and its anchor alone, not on which other anchors were asked with it
    assert DraftReplayer(lm).proposals(seq, [20], K) == [first[2]]
    other = seq[:-1] + [seq[-1] + 1]  # another sequence: computed, not taken from the memo
    replay.proposals(other, [len(other)], K)
    assert counting.forwards == computed_forwards + 1 + K and replay.computed == len(anchors) + 1
