"""cross_engine's trace analysis on frames built from verbatim trace fixtures (tests/fixtures/traces): the
derived counts against the counters, the replay comparison, matched anchors between two engines and
acceptance on the common prefix; the frames survive a parquet round trip through a run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from specbook.core.acceptance import Acceptance
from specbook.engines.llamacpp.traceparse import parse_trace_lines
from specbook.experiments.cross_engine import traces as cet
from specbook.store.runstore import RunContext
from specbook.traces.records import RequestTrace, read_trace_file, records_frame
from specbook.traces.traceset import TraceSet

FIX = Path(__file__).parents[1] / "fixtures" / "traces"
DOC = json.loads((FIX / "requests.json").read_text())["llamacpp-draft-simple-v.log"]


def _llamacpp_set(counters: Acceptance | None = None) -> TraceSet:
    """The verbatim llama-server -v capture (two draft steps) with the reply's ids; counters from its timings."""
    with open(FIX / "llamacpp-draft-simple-v.log", encoding="utf-8") as fh:
        parsed = parse_trace_lines(fh)
    req = RequestTrace("list", "task-0", DOC["prompt_ids"], len(DOC["prompt_ids"]), DOC["output_ids"], "length")
    counters = counters or Acceptance(source="timings", drafts=2.0, draft_tokens=float(DOC["timings"]["draft_n"]),
                                      accepted_tokens=float(DOC["timings"]["draft_n_accepted"]))
    return TraceSet("llamacpp", "llamacpp-draft-trace", "draft_model", records_frame(parsed.records), [req], counters)


def _frames(sets: dict[str, TraceSet], lane: str = "draft-int4") -> dict[str, pd.DataFrame]:
    out: dict[str, list[pd.DataFrame]] = {}
    for side, ts in sets.items():
        for name, frame in cet.trace_frames(ts, side, lane).items():
            out.setdefault(name, []).append(frame)
    return {name: pd.concat(parts, ignore_index=True) for name, parts in out.items()}


def _round_trip(tmp_path: Path, frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    ctx = RunContext(tmp_path / "run")
    for name, frame in frames.items():
        ctx.append_frame(name, frame)
    return {name: ctx.load_frame(name) for name in frames}


def _oracle_variant() -> TraceSet:
    """The same request as another engine might trace it: its second draft differs at position 3 and its
    output at the last token."""
    ts = _llamacpp_set()
    records = ts.records.copy()
    second = list(records.loc[1, "proposed"])
    second[2] += 1
    records.at[1, "proposed"] = second
    out = list(DOC["output_ids"])
    out[-1] += 1
    req = RequestTrace("list", "req-vllm-0", DOC["prompt_ids"], len(DOC["prompt_ids"]), out, "length")
    records["request_id"] = "req-vllm-0"
    return TraceSet("vllm", "vllm-draft-trace", "draft_model", records, [req], ts.counters)


def test_derived_counts_agree_with_the_counters_and_a_disagreement_is_shown(tmp_path):
    good = _llamacpp_set()
    off_by_one = _llamacpp_set(Acceptance(source="counters", drafts=2.0, draft_tokens=8.0, accepted_tokens=5.0))
    frames = _round_trip(tmp_path, _frames({"ours": good, "oracle": off_by_one}))
    table = cet.trace_agreement(frames[cet.TRACE_PASSES], frames[cet.TRACE_STEPS]).set_index("side")
    ours = table.loc["ours"]
    assert ours["agree"] and ours["disagreements"] == ""
    assert (ours["derived_drafts"], ours["derived_draft_tokens"], ours["derived_accepted"]) == (2, 8, 4)
    assert (ours["counter_drafts"], ours["counter_draft_tokens"], ours["counter_accepted"]) == (2, 8, 4)
    oracle = table.loc["oracle"]
    assert not oracle["agree"] and oracle["disagreements"] == "accepted_tokens: derived 4 vs counters 5"


def test_an_untraceable_lane_says_why():
    ts = TraceSet("llamacpp", "srv", "ngram", records_frame([]), [], None, untraceable="srv: no proposal recorded")
    frames = _frames({"ours": ts}, lane="ngram")
    row = cet.trace_agreement(frames[cet.TRACE_PASSES], frames[cet.TRACE_STEPS]).iloc[0]
    assert row["agree"] is None and row["untraceable"] == "srv: no proposal recorded"


def test_matched_anchors_show_the_share_identical_and_the_first_differing_position(tmp_path):
    frames = _round_trip(tmp_path, _frames({"ours": _llamacpp_set(), "oracle": _oracle_variant()}))
    matched = cet.matched_anchor_table(frames[cet.TRACE_STEPS], frames[cet.TRACE_REQUESTS])
    assert matched["anchor_pos"].tolist() == [43, 45]
    assert matched["identical"].tolist() == [True, False] and matched["first_diff"].tolist()[1] == 3
    summary = cet.matched_anchor_summary(matched).iloc[0]
    assert (summary["matched_anchors"], summary["identical"], summary["identical_share"]) == (2, 1, 0.5)
    assert summary["median_first_diff"] == 3
    line = cet.identical_share_line(cet.matched_anchor_summary(matched))
    assert line.endswith("draft-int4 50% of 2")


def test_acceptance_on_the_common_prefix_reads_tokens_in_steps(tmp_path):
    frames = _round_trip(tmp_path, _frames({"ours": _llamacpp_set(), "oracle": _oracle_variant()}))
    table = cet.prefix_acceptance_table(frames[cet.TRACE_STEPS], frames[cet.TRACE_REQUESTS],
                                        {"ours": "llamacpp", "oracle": "vllm"})
    row = table.iloc[0]
    # 7 tokens each, the last differs: 6 shared; ours accepted 1 + 3 on them, the variant 1 + 2
    assert (row["common_prefix"], row["ours_steps"], row["oracle_steps"]) == (6, 2, 2)
    assert (row["ours_accepted"], row["oracle_accepted"]) == (4, 3)
    assert row["summary"] == "6 tokens in 2 steps (llamacpp) vs 2 (vllm)"


def _vllm_selfdraft() -> TraceSet:
    """The vLLM 0.26 plugin's verbatim records (draft = target: all accepted); the first request's output is
    the chain of its anchors and proposals, cut to the 64 tokens it asked for."""
    frame = records_frame(read_trace_file(FIX / "vllm026-cuda-draft-selfdraft.jsonl"))
    rid = frame["request_id"].iloc[0]
    recs = frame[frame["request_id"] == rid].reset_index(drop=True)
    prompt_len = int(recs["prompt_len"].iloc[0])
    out: dict[int, int] = {}
    for r in recs.itertuples(index=False):
        o = r.anchor_pos - prompt_len
        out[o - 1] = r.anchor_id
        out.update({o + j: t for j, t in enumerate(r.proposed)})
    ids = [out[i] for i in range(64)]
    return TraceSet("vllm", "vllm-draft-trace", "draft_model", recs,
                    [RequestTrace("p", rid, None, prompt_len, ids, "length")], None)


def test_replay_table_names_a_systematic_shift_and_passes_identical_proposals(tmp_path):
    ts = _vllm_selfdraft()
    frames = _frames({"oracle": ts})
    steps = ts.steps()
    verified = steps[steps["status"] == "verified"]
    same = pd.DataFrame({"request_id": verified["request_id"], "anchor_pos": verified["anchor_pos"],
                         "reference": verified["proposed"]})
    shifted = same.assign(reference=[[7] + list(p[:3]) for p in same["reference"]])  # one token early
    for ref, share, named in ((same, 1.0, "none"), (shifted, 0.0, "late_by_one")):
        saved = _round_trip(tmp_path / named, {**frames, cet.TRACE_REFERENCE: cet.reference_frame(ref, "oracle",
                                                                                                  "draft-int4")})
        table = cet.replay_table(saved[cet.TRACE_STEPS], saved[cet.TRACE_REFERENCE], saved[cet.TRACE_REQUESTS],
                                 {"oracle": "vllm"})
        row = table.iloc[0]
        assert (row["engine"], row["anchors"]) == ("vllm", len(verified)) and len(verified) >= 3
        assert row["identical_share"] == pytest.approx(share)
        assert row["systematic_mismatches"].split(":")[0] == named


# ------------------------------------------------------------------ matched anchors, for reading


def _matched() -> pd.DataFrame:
    """Matched anchors as matched_anchor_table gives them: the ngram lane mostly from a loop cell."""
    rows = [("ngram", "yes-loop", 84 + 5 * i, [15, 30, 1], [15, 30, 1] if i == 0 else [16, 30, 1], i == 0,
             None if i == 0 else 1) for i in range(16)]
    rows += [("ngram", "count-up", 40, [28, 30, 2], [28, 30, 2], True, None),
             ("draft-int4", "count-up", 41, [7, 8], [7, 8], True, None)]
    return pd.DataFrame(rows, columns=["lane", "prompt_id", "anchor_pos", "proposed_a", "proposed_b", "identical",
                                       "first_diff"]).assign(accepted_a=1, accepted_b=1)


def test_the_anchor_listing_shows_text_names_the_engines_and_says_how_many_of_how_many():
    decode = {15: "1", 16: "2", 30: ".", 1: " Yes", 28: "\n", 2: "9", 7: "A", 8: "B"}
    listing, note = cet.anchor_listing(_matched(), {"ours": "llamacpp", "oracle": "vllm"},
                                       lambda ids: "".join(decode[i] for i in ids), limit=10)
    assert note.startswith("a = llamacpp (ours), b = vllm (oracle); proposals decoded with the target's tokenizer")
    assert "listed per lane: ngram 10 of 17, draft-int4 1 of 1" in note
    assert list(listing.columns[3:5]) == ["llamacpp proposed (a)", "vllm proposed (b)"]
    assert listing.loc[1, "llamacpp proposed (a)"] == "'1. Yes'" and listing.loc[1, "vllm proposed (b)"] == "'2. Yes'"
    ids, note = cet.anchor_listing(_matched(), {"ours": "llamacpp", "oracle": "vllm"}, None)
    assert ids.loc[0, "llamacpp proposed (a)"] == "15 30 1" and "as token ids (no tokenizer here)" in note


def test_a_low_identical_share_names_where_its_anchors_come_from_and_the_set_up_difference():
    matched = _matched()
    summary = cet.matched_anchor_summary(matched)
    by_prompt = cet.anchors_by_prompt(matched, timed={("ngram", "count-up"), ("draft-int4", "count-up")})
    assert list(by_prompt[by_prompt["lane"] == "ngram"]["prompt"]) == ["yes-loop", "count-up"]
    diffs = ["server processes: 1 vs 3", "speculation (ngram): ngram match length 4 vs ngram match length 2..4"]
    ngram, draft = cet.identical_share_notes(summary, by_prompt, diffs)
    assert ngram == ("ngram: 12% of 17 matched anchors identical; 16 of the 17 come from cells the headline leaves "
                     "out (16 from yes-loop); the set-ups differ in speculation (ngram): ngram match length 4 vs "
                     "ngram match length 2..4, so the same prefix can give different proposals")
    assert draft == "draft-int4: 100% of 1 matched anchors identical"  # high share, every anchor in the headline
