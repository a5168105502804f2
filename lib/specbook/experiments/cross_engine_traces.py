"""The cross-engine experiment's proposal traces: one separate, untimed trace pass per side x lane, saved
as frames, and what the report computes from them.

Frames (data/*.parquet; every row carries side, lane and kind = "trace", the resume unit's key):
    trace_steps      the derived steps (specbook.traces.derive) of every traced request
    trace_requests   per traced request: prompt_id, request_id, prompt / emitted ids
    trace_passes     per pass: engine, method, why untraceable, the window's own counters, wall time
    trace_reference  draft_model lanes: the draft's own greedy proposals at each anchor (the replay reference)

Analysis (pure functions of those frames):
    trace_agreement       derived accepted counts against the engine's counters, per side x lane
    replay_table          each side's proposals against the replay reference; systematic mismatches named
    matched_anchor_table  anchors both engines reached with the same prefix: proposals side by side
    matched_anchor_summary per lane: share of identical proposals, first differing position
    prefix_acceptance_table per lane x prompt: "N tokens in a steps vs b steps" on the common prefix
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from specbook.acceptance import Acceptance
from specbook.equalwork import common_prefix_len, prefix_acceptance_of_steps
from specbook.traces.compare import (
    compare_with_reference,
    identical_share,
    matched_anchors,
    systematic_mismatches,
)
from specbook.traces.derive import VERIFIED, counts_agree, derived_acceptance

TRACE_STEPS = "trace_steps"
TRACE_REQUESTS = "trace_requests"
TRACE_PASSES = "trace_passes"
TRACE_REFERENCE = "trace_reference"
FRAMES = (TRACE_STEPS, TRACE_REQUESTS, TRACE_PASSES, TRACE_REFERENCE)
KIND = "trace"
UNTIMED_NOTE = ("Proposal traces come from a separate, untimed trace pass per side x lane (its own server: vLLM "
                "with specbook's trace plugin, llama.cpp at debug verbosity -v), with the timed cells' requests; "
                "no timed figure comes from it.")


def _keyed(frame: pd.DataFrame, side: str, lane: str) -> pd.DataFrame:
    out = frame.copy()
    out.insert(0, "side", side)
    out.insert(1, "lane", lane)
    out.insert(2, "kind", KIND)
    return out


def trace_frames(ts: Any, side: str, lane: str) -> dict[str, pd.DataFrame]:
    """A TraceSet (specbook.traces.tracepass) as the frames above (request ids as strings: one type for
    both engines)."""
    steps = ts.steps()
    steps["request_id"] = steps["request_id"].astype(str)
    requests = pd.DataFrame(
        [{"prompt_id": r.prompt_id, "request_id": str(r.request_id), "prompt_len": int(r.prompt_len),
          "prompt_ids": None if r.prompt_ids is None else [int(t) for t in r.prompt_ids],
          "output_ids": [int(t) for t in r.output_ids], "finish_reason": r.finish_reason} for r in ts.requests],
        columns=["prompt_id", "request_id", "prompt_len", "prompt_ids", "output_ids", "finish_reason"])
    counters = ts.counters.counts() if ts.counters is not None else {}
    passes = pd.DataFrame([{"engine": ts.engine, "server": ts.server, "method": ts.method,
                            "untraceable": ts.untraceable, "notes": "; ".join(ts.notes), "wall_s": float(ts.wall_s),
                            "output_tokens": int(ts.output_tokens), "has_counters": ts.counters is not None,
                            **counters}])
    return {TRACE_STEPS: _keyed(steps, side, lane), TRACE_REQUESTS: _keyed(requests, side, lane),
            TRACE_PASSES: _keyed(passes, side, lane)}


def reference_frame(reference: pd.DataFrame, side: str, lane: str) -> pd.DataFrame:
    ref = reference.copy()
    ref["request_id"] = ref["request_id"].astype(str)
    return _keyed(ref, side, lane)


def replay_for(ts: Any, draft_model: str, k: int, lm: Any | None = None) -> pd.DataFrame:
    """The replay reference (specbook.traces.replay) for a TraceSet's verified steps."""
    from specbook.traces.replay import load_draft, replay_reference

    steps = ts.steps()
    steps["request_id"] = steps["request_id"].astype(str)
    seqs = {str(r.request_id): (r.prompt_ids, r.output_ids) for r in ts.requests if r.prompt_ids is not None}
    verified = steps[steps["status"] == VERIFIED]
    if verified.empty or not seqs:
        return pd.DataFrame(columns=["request_id", "anchor_pos", "reference"])
    return replay_reference(lm if lm is not None else load_draft(draft_model), verified, seqs, k)


# --------------------------------------------------------------------------------------------------
# analysis


def _part(frame: pd.DataFrame, side: str, lane: str) -> pd.DataFrame:
    if frame.empty:
        return frame
    return frame[(frame["side"] == side) & (frame["lane"] == lane)]


def _as_list(v: Any) -> list[int]:
    return [] if v is None or (isinstance(v, float) and math.isnan(v)) else [int(t) for t in v]


def _lists(steps: pd.DataFrame) -> pd.DataFrame:
    """Parquet gives list columns back as arrays: lists again, so comparisons and joins behave."""
    out = steps.copy()
    if "proposed" in out:
        out["proposed"] = out["proposed"].map(_as_list)
    return out


def trace_agreement(passes: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per side x lane: the accepted counts derived from the traces beside the engine's counters for the same
    window (and the untimed pass's wall time); `agree` is False (and `disagreements` says where) when the counters fall outside the derived
    counts (a step the request's stop cut counts between its derived and its full proposals)."""
    rows = []
    for _, p in passes.iterrows():
        part = _lists(_part(steps, p["side"], p["lane"]))
        row: dict[str, Any] = {"side": p["side"], "lane": p["lane"], "engine": p["engine"], "method": p["method"],
                               "pass_wall_s": float(p["wall_s"]), "output_tokens": int(p["output_tokens"])}
        if isinstance(p.get("untraceable"), str) and p["untraceable"]:
            rows.append({**row, "agree": None, "disagreements": "", "untraceable": p["untraceable"]})
            continue
        derived = derived_acceptance(part)
        upper = derived_acceptance(part, upper=True)
        counters = Acceptance.from_row(p, source="counters") if p.get("has_counters", True) else None
        diffs = counts_agree(derived, counters, upper) if counters is not None else ["no counters for this window"]
        rows.append({**row, "requests": int(part["request_id"].nunique()) if len(part) else 0,
                     "derived_drafts": derived.drafts, "counter_drafts": counters.drafts if counters else math.nan,
                     "derived_draft_tokens": derived.draft_tokens,
                     "counter_draft_tokens": counters.draft_tokens if counters else math.nan,
                     "derived_accepted": derived.accepted_tokens,
                     "derived_accepted_max": upper.accepted_tokens,
                     "counter_accepted": counters.accepted_tokens if counters else math.nan,
                     "agree": not diffs, "disagreements": "; ".join(diffs), "untraceable": None})
    return pd.DataFrame(rows, columns=[
        "side", "lane", "engine", "method", "pass_wall_s", "output_tokens", "requests", "derived_drafts", "counter_drafts", "derived_draft_tokens",
        "counter_draft_tokens", "derived_accepted", "derived_accepted_max", "counter_accepted", "agree",
        "disagreements", "untraceable"])


def _outputs(requests: pd.DataFrame) -> dict[str, list[int]]:
    return {str(r.request_id): _as_list(r.output_ids) for r in requests.itertuples(index=False)}


def _sequences(requests: pd.DataFrame) -> dict[str, list[int]]:
    """request_id -> prompt ids + emitted ids (requests whose prompt ids the pass could not tell left out)."""
    return {str(r.request_id): _as_list(r.prompt_ids) + _as_list(r.output_ids)
            for r in requests.itertuples(index=False) if r.prompt_ids is not None and len(r.prompt_ids)}


def replay_table(steps: pd.DataFrame, reference: pd.DataFrame, requests: pd.DataFrame,
                 labels: dict[str, str] | None = None) -> pd.DataFrame:
    """Per side x lane with a replay reference: anchors compared, share identical to the draft's own greedy
    proposals, and the systematic mismatches named (none: empty)."""
    rows = []
    if reference.empty:
        return pd.DataFrame(columns=["side", "engine", "lane", "anchors", "identical_share", "systematic_mismatches"])
    for (side, lane), ref in reference.groupby(["side", "lane"], sort=False):
        ref = ref.assign(reference=ref["reference"].map(_as_list))[["request_id", "anchor_pos", "reference"]]
        cmp = compare_with_reference(_lists(_part(steps, side, lane)), ref, _outputs(_part(requests, side, lane)))
        rows.append({"side": side, "engine": (labels or {}).get(side, side), "lane": lane, "anchors": len(cmp),
                     "identical_share": identical_share(cmp),
                     "systematic_mismatches": "; ".join(systematic_mismatches(cmp)) or "none"})
    return pd.DataFrame(rows, columns=["side", "engine", "lane", "anchors", "identical_share", "systematic_mismatches"])


def matched_anchor_table(steps: pd.DataFrame, requests: pd.DataFrame, a: str = "ours", b: str = "oracle") -> pd.DataFrame:
    """Per lane: every anchor both sides reached with the same prefix (prompt and emitted ids), proposals side
    by side (`proposed_a` = side a), identical or the first differing position."""
    parts = []
    if steps.empty:
        return pd.DataFrame(columns=["lane", "prompt_id", "anchor_pos", "proposed_a", "proposed_b", "identical",
                                     "first_diff", "accepted_a", "accepted_b"])
    for lane in dict.fromkeys(steps["lane"]):
        sa, sb = _lists(_part(steps, a, lane)), _lists(_part(steps, b, lane))
        if sa.empty or sb.empty:
            continue
        m = matched_anchors(sa, _sequences(_part(requests, a, lane)), sb, _sequences(_part(requests, b, lane)))
        m.insert(0, "lane", lane)
        parts.append(m)
    if not parts:
        return pd.DataFrame(columns=["lane", "prompt_id", "anchor_pos", "proposed_a", "proposed_b", "identical",
                                     "first_diff", "accepted_a", "accepted_b"])
    return pd.concat(parts, ignore_index=True)


def matched_anchor_summary(matched: pd.DataFrame) -> pd.DataFrame:
    """Per lane: matched anchors, the share with identical proposals, and where the others first differ."""
    rows = []
    for lane, g in matched.groupby("lane", sort=False):
        diff = g.loc[~g["identical"].astype(bool), "first_diff"].dropna().astype(int)
        rows.append({"lane": lane, "matched_anchors": len(g), "identical": int(g["identical"].sum()),
                     "identical_share": float(g["identical"].mean()) if len(g) else math.nan,
                     "median_first_diff": float(np.median(diff)) if len(diff) else math.nan,
                     "first_diff_at_1": int((diff == 1).sum())})
    return pd.DataFrame(rows, columns=["lane", "matched_anchors", "identical", "identical_share",
                                       "median_first_diff", "first_diff_at_1"])


def prefix_acceptance_table(steps: pd.DataFrame, requests: pd.DataFrame, labels: dict[str, str] | None = None,
                            a: str = "ours", b: str = "oracle") -> pd.DataFrame:
    """Per lane x prompt traced on both sides: the common prefix of their emitted ids and each side's
    speculative steps and accepted draft tokens on it ("32 tokens in 11 steps vs 12")."""
    labels = labels or {a: a, b: b}
    cols = ["lane", "prompt", "common_prefix", f"{a}_tokens", f"{b}_tokens", f"{a}_steps", f"{b}_steps",
            f"{a}_accepted", f"{b}_accepted", "summary"]
    rows = []
    if requests.empty:
        return pd.DataFrame(columns=cols)
    for lane in dict.fromkeys(requests["lane"]):
        ra, rb = _part(requests, a, lane), _part(requests, b, lane)
        sa, sb = _part(steps, a, lane), _part(steps, b, lane)
        for pa in ra.itertuples(index=False):
            match = rb[rb["prompt_id"] == pa.prompt_id]
            if match.empty:
                continue
            pb = next(match.itertuples(index=False))
            out_a, out_b = _as_list(pa.output_ids), _as_list(pb.output_ids)
            n = common_prefix_len(out_a, out_b)
            acc_a = prefix_acceptance_of_steps(sa[sa["request_id"] == str(pa.request_id)], n) if len(sa) else None
            acc_b = prefix_acceptance_of_steps(sb[sb["request_id"] == str(pb.request_id)], n) if len(sb) else None
            if acc_a is None or acc_b is None:
                continue
            rows.append({"lane": lane, "prompt": pa.prompt_id, "common_prefix": n, f"{a}_tokens": len(out_a),
                         f"{b}_tokens": len(out_b), f"{a}_steps": acc_a.steps, f"{b}_steps": acc_b.steps,
                         f"{a}_accepted": acc_a.accepted_tokens, f"{b}_accepted": acc_b.accepted_tokens,
                         "summary": f"{n} tokens in {acc_a.steps} steps ({labels[a]}) vs {acc_b.steps} ({labels[b]})"})
    return pd.DataFrame(rows, columns=cols)


def identical_share_line(summary: pd.DataFrame) -> str:
    """The summary block's evidence line: identical-proposal share per lane at matched anchors."""
    if summary.empty:
        return ""
    parts = [f"{r.lane} {r.identical_share:.0%} of {r.matched_anchors}" for r in summary.itertuples(index=False)]
    return "identical proposals at matched anchors (untimed trace pass): " + ", ".join(parts)

