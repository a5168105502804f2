"""Trace passes as saved frames, and the per-pass and per-pair tables a report computes from them, whatever an
experiment keys its passes by (cross_engine: side x lane; config_flip: arm).

Frames (data/*.parquet; the experiment adds its key columns):
    trace_steps      the derived steps (specbook.traces.derive) of every traced request
    trace_requests   per traced request: prompt_id, request_id, prompt / emitted ids
    trace_passes     per pass: engine, method, why untraceable, the window's own counters, wall time
    trace_reference  draft_model passes: the draft's own greedy proposals at each anchor (the replay reference)

Tables (pure functions of one pass's or one pair of passes' rows):
    pass_agreement       derived accepted counts against the engine's counters for the same window
    replay_comparison    proposals against the replay reference; systematic mismatches named
    proposals_vs_output  each verified step's proposals beside the tokens the target emitted there
    matched_pair         anchors two passes reached with the same prefix: proposals side by side
    matched_summary      per pair: share of identical proposals, first differing position
    prefix_pair          one prompt traced in two passes: "N tokens in a steps vs b" on the common prefix
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from specbook.core.acceptance import Acceptance
from specbook.traces.compare import (
    compare_with_reference,
    identical_share,
    matched_anchors,
    systematic_mismatches,
)
from specbook.traces.derive import VERIFIED, counts_agree, derived_acceptance
from specbook.traces.equalwork import PrefixAcceptance, common_prefix_len, prefix_acceptance_of_steps

TRACE_STEPS = "trace_steps"
TRACE_REQUESTS = "trace_requests"
TRACE_PASSES = "trace_passes"
TRACE_REFERENCE = "trace_reference"
FRAMES = (TRACE_STEPS, TRACE_REQUESTS, TRACE_PASSES, TRACE_REFERENCE)
AGREEMENT_COLUMNS = ["engine", "method", "pass_wall_s", "output_tokens", "requests_with_drafts", "derived_drafts",
                     "counter_drafts", "derived_draft_tokens", "counter_draft_tokens", "derived_accepted",
                     "derived_accepted_max", "counter_accepted", "agree", "disagreements", "untraceable"]
MATCHED_COLUMNS = ["prompt_id", "anchor_pos", "proposed_a", "proposed_b", "identical", "first_diff", "accepted_a",
                   "accepted_b"]
SUMMARY_COLUMNS = ["matched_anchors", "identical", "identical_share", "median_first_diff", "first_diff_at_1"]


def as_ids(v: Any) -> list[int]:
    return [] if v is None or (isinstance(v, float) and math.isnan(v)) else [int(t) for t in v]


def with_id_lists(steps: pd.DataFrame) -> pd.DataFrame:
    """Parquet gives list columns back as arrays: lists again, so comparisons and joins behave."""
    out = steps.copy()
    if "proposed" in out:
        out["proposed"] = out["proposed"].map(as_ids)
    return out


def trace_set_frames(ts: Any) -> dict[str, pd.DataFrame]:
    """A TraceSet (specbook.traces.traceset) as the steps, requests and passes frames (request ids as
    strings: one type for every engine), without the experiment's key columns."""
    steps = ts.steps()
    steps["request_id"] = steps["request_id"].astype(str)
    requests = pd.DataFrame(
        [{"prompt_id": r.prompt_id, "request_id": str(r.request_id), "prompt_len": int(r.prompt_len),
          "prompt_ids": None if r.prompt_ids is None else [int(t) for t in r.prompt_ids],
          "output_ids": [int(t) for t in r.output_ids], "finish_reason": r.finish_reason,
          "eog_stop": bool(r.eog_stop)} for r in ts.requests],
        columns=["prompt_id", "request_id", "prompt_len", "prompt_ids", "output_ids", "finish_reason", "eog_stop"])
    counters = ts.counters.counts() if ts.counters is not None else {}
    passes = pd.DataFrame([{"engine": ts.engine, "server": ts.server, "method": ts.method,
                            "untraceable": ts.untraceable, "notes": "; ".join(ts.notes), "wall_s": float(ts.wall_s),
                            "output_tokens": int(ts.output_tokens), "has_counters": ts.counters is not None,
                            **counters}])
    return {TRACE_STEPS: steps, TRACE_REQUESTS: requests, TRACE_PASSES: passes}


def replay_for(ts: Any, draft_model: str, k: int, lm: Any | None = None) -> pd.DataFrame:
    """The replay reference (specbook.traces.replay) for a TraceSet's verified steps; the draft loaded once per
    process (`replayer`), so a sequence another pass already replayed is not computed again."""
    from specbook.traces.replay import replay_reference, replayer

    steps = ts.steps()
    steps["request_id"] = steps["request_id"].astype(str)
    seqs = {str(r.request_id): (r.prompt_ids, r.output_ids) for r in ts.requests if r.prompt_ids is not None}
    verified = steps[steps["status"] == VERIFIED]
    if verified.empty or not seqs:
        return pd.DataFrame(columns=["request_id", "anchor_pos", "reference"])
    if lm is not None:
        return replay_reference(lm, verified, seqs, k)
    from specbook.core import progress

    replay = replayer(str(draft_model))
    before = replay.computed, replay.reused
    frame = replay_reference(replay, verified, seqs, k)
    progress.note(f"replay of {draft_model}: {replay.computed - before[0]} anchors computed, "
                  f"{replay.reused - before[1]} reused from an identical sequence")
    return frame


def pass_agreement(p: Mapping[str, Any], steps: pd.DataFrame) -> dict[str, Any]:
    """One pass (a trace_passes row) and its steps: the accepted counts derived from the traces beside the
    engine's counters for the same window (and the untimed pass's wall time); `agree` is False (and
    `disagreements` says where) when the counters fall outside the derived counts (a step the request's stop
    cut counts between its derived and its full proposals). Keys: AGREEMENT_COLUMNS."""
    row: dict[str, Any] = {"engine": p["engine"], "method": p["method"], "pass_wall_s": float(p["wall_s"]),
                           "output_tokens": int(p["output_tokens"])}
    if isinstance(p.get("untraceable"), str) and p["untraceable"]:
        return {**row, "agree": None, "disagreements": "", "untraceable": p["untraceable"]}
    part = with_id_lists(steps)
    derived = derived_acceptance(part)
    upper = derived_acceptance(part, upper=True)
    counters = Acceptance.from_row(p, source="counters") if p.get("has_counters", True) else None
    diffs = counts_agree(derived, counters, upper) if counters is not None else ["no counters for this window"]
    drafted = part[part["status"] == VERIFIED] if len(part) else part  # llama.cpp logs no step without a draft
    return {**row, "requests_with_drafts": int(drafted["request_id"].nunique()) if len(drafted) else 0,
            "derived_drafts": derived.drafts, "counter_drafts": counters.drafts if counters else math.nan,
            "derived_draft_tokens": derived.draft_tokens,
            "counter_draft_tokens": counters.draft_tokens if counters else math.nan,
            "derived_accepted": derived.accepted_tokens, "derived_accepted_max": upper.accepted_tokens,
            "counter_accepted": counters.accepted_tokens if counters else math.nan,
            "agree": not diffs, "disagreements": "; ".join(diffs), "untraceable": None}


def outputs_of(requests: pd.DataFrame) -> dict[str, list[int]]:
    """request_id -> emitted ids."""
    return {str(r.request_id): as_ids(r.output_ids) for r in requests.itertuples(index=False)}


def sequences_of(requests: pd.DataFrame) -> dict[str, list[int]]:
    """request_id -> prompt ids + emitted ids (requests whose prompt ids the pass could not tell left out)."""
    return {str(r.request_id): as_ids(r.prompt_ids) + as_ids(r.output_ids)
            for r in requests.itertuples(index=False) if r.prompt_ids is not None and len(r.prompt_ids)}


def replay_comparison(steps: pd.DataFrame, reference: pd.DataFrame, requests: pd.DataFrame) -> dict[str, Any]:
    """One pass's proposals against its replay reference: anchors compared, the share identical to the draft's
    own greedy proposals, and the systematic mismatches named ("none" when there are none)."""
    ref = reference.assign(reference=reference["reference"].map(as_ids))[["request_id", "anchor_pos", "reference"]]
    cmp = compare_with_reference(with_id_lists(steps), ref, outputs_of(requests))
    return {"anchors": len(cmp), "identical_share": identical_share(cmp),
            "systematic_mismatches": "; ".join(systematic_mismatches(cmp)) or "none"}


def proposals_vs_output(steps: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Each verified step of one pass: its proposed ids beside the ids the target emitted from that position
    on (as many as were proposed), the accepted count derived from them, and whether the request's end cut
    the step."""
    cols = ["prompt_id", "anchor_pos", "proposed", "emitted", "accepted", "cut"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    outputs = outputs_of(requests)
    verified = with_id_lists(steps[steps["status"] == VERIFIED])
    rows = [{"prompt_id": s.prompt_id, "anchor_pos": int(s.anchor_pos), "proposed": s.proposed,
             "emitted": outputs.get(str(s.request_id), [])[int(s.emitted_before):int(s.emitted_before) + len(s.proposed)],
             "accepted": int(s.accepted), "cut": bool(s.cut)} for s in verified.itertuples(index=False)]
    return pd.DataFrame(rows, columns=cols)


def matched_pair(steps_a: pd.DataFrame, requests_a: pd.DataFrame, steps_b: pd.DataFrame,
                 requests_b: pd.DataFrame) -> pd.DataFrame:
    """Every anchor two passes reached with the same prefix (prompt and emitted ids): proposals side by side
    (`proposed_a` = pass a), identical or the first differing position. Columns: MATCHED_COLUMNS."""
    if steps_a.empty or steps_b.empty:
        return pd.DataFrame(columns=MATCHED_COLUMNS)
    return matched_anchors(with_id_lists(steps_a), sequences_of(requests_a), with_id_lists(steps_b),
                           sequences_of(requests_b))


def matched_summary(matched: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per `by` (a lane, a pair of arms): matched anchors, the share with identical proposals, and where the
    others first differ."""
    rows = []
    for key, g in matched.groupby(by, sort=False):
        diff = g.loc[~g["identical"].astype(bool), "first_diff"].dropna().astype(int)
        rows.append({by: key, "matched_anchors": len(g), "identical": int(g["identical"].sum()),
                     "identical_share": float(g["identical"].mean()) if len(g) else math.nan,
                     "median_first_diff": float(np.median(diff)) if len(diff) else math.nan,
                     "first_diff_at_1": int((diff == 1).sum())})
    return pd.DataFrame(rows, columns=[by, *SUMMARY_COLUMNS])


def prefix_pair(steps_a: pd.DataFrame, output_a: list[int], steps_b: pd.DataFrame,
                output_b: list[int]) -> tuple[int, PrefixAcceptance, PrefixAcceptance]:
    """One prompt traced in two passes (each request's derived steps and emitted ids): the common prefix of
    the outputs and each pass's speculative steps and accepted draft tokens on it."""
    n = common_prefix_len(output_a, output_b)
    return n, prefix_acceptance_of_steps(steps_a, n), prefix_acceptance_of_steps(steps_b, n)


def identical_share_line(summary: pd.DataFrame, by: str = "lane") -> str:
    """The summary block's evidence line: the share of matched anchors with identical proposals per `by` (a
    cross-engine lane, a config-flip pair of arms)."""
    if summary.empty:
        return ""
    parts = [f"{getattr(r, by)} {r.identical_share:.0%} of {r.matched_anchors}" for r in summary.itertuples(index=False)]
    return "identical proposals at matched anchors (untimed trace pass): " + ", ".join(parts)
