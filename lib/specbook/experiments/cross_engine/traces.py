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

from typing import Any

import pandas as pd

from specbook.traces import tables as trace_tables
from specbook.traces.tables import (  # noqa: F401  (FRAMES, TRACE_*, replay_for: what cross_engine reads here)
    AGREEMENT_COLUMNS,
    FRAMES,
    MATCHED_COLUMNS,
    TRACE_PASSES,
    TRACE_REFERENCE,
    TRACE_REQUESTS,
    TRACE_STEPS,
    as_ids,
    matched_pair,
    matched_summary,
    pass_agreement,
    prefix_pair,
    replay_comparison,
    replay_for,
    trace_set_frames,
)

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
    """A TraceSet (specbook.traces.traceset) as the frames above (traces.tables.trace_set_frames, keyed)."""
    return {name: _keyed(frame, side, lane) for name, frame in trace_set_frames(ts).items()}


def reference_frame(reference: pd.DataFrame, side: str, lane: str) -> pd.DataFrame:
    ref = reference.copy()
    ref["request_id"] = ref["request_id"].astype(str)
    return _keyed(ref, side, lane)


# --------------------------------------------------------------------------------------------------
# analysis


def _part(frame: pd.DataFrame, side: str, lane: str) -> pd.DataFrame:
    if frame.empty:
        return frame
    return frame[(frame["side"] == side) & (frame["lane"] == lane)]


def trace_agreement(passes: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per side x lane: the accepted counts derived from the traces beside the engine's counters for the same
    window (and the untimed pass's wall time); `agree` is False (and `disagreements` says where) when the counters fall outside the derived
    counts (a step the request's stop cut counts between its derived and its full proposals)."""
    rows = [{"side": p["side"], "lane": p["lane"], **pass_agreement(p, _part(steps, p["side"], p["lane"]))}
            for _, p in passes.iterrows()]
    return pd.DataFrame(rows, columns=["side", "lane", *AGREEMENT_COLUMNS])


def replay_table(steps: pd.DataFrame, reference: pd.DataFrame, requests: pd.DataFrame,
                 labels: dict[str, str] | None = None) -> pd.DataFrame:
    """Per side x lane with a replay reference: anchors compared, share identical to the draft's own greedy
    proposals, and the systematic mismatches named (none: empty)."""
    rows = []
    if reference.empty:
        return pd.DataFrame(columns=["side", "engine", "lane", "anchors", "identical_share", "systematic_mismatches"])
    for (side, lane), ref in reference.groupby(["side", "lane"], sort=False):
        rows.append({"side": side, "engine": (labels or {}).get(side, side), "lane": lane,
                     **replay_comparison(_part(steps, side, lane), ref, _part(requests, side, lane))})
    return pd.DataFrame(rows, columns=["side", "engine", "lane", "anchors", "identical_share", "systematic_mismatches"])


def matched_anchor_table(steps: pd.DataFrame, requests: pd.DataFrame, a: str = "ours", b: str = "oracle") -> pd.DataFrame:
    """Per lane: every anchor both sides reached with the same prefix (prompt and emitted ids), proposals side
    by side (`proposed_a` = side a), identical or the first differing position."""
    parts = []
    for lane in dict.fromkeys(steps["lane"]) if not steps.empty else []:
        sa, sb = _part(steps, a, lane), _part(steps, b, lane)
        if sa.empty or sb.empty:
            continue
        m = matched_pair(sa, _part(requests, a, lane), sb, _part(requests, b, lane))
        m.insert(0, "lane", lane)
        parts.append(m)
    if not parts:
        return pd.DataFrame(columns=["lane", *MATCHED_COLUMNS])
    return pd.concat(parts, ignore_index=True)


def matched_anchor_summary(matched: pd.DataFrame) -> pd.DataFrame:
    """Per lane: matched anchors, the share with identical proposals, and where the others first differ."""
    return matched_summary(matched, "lane")


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
            out_a, out_b = as_ids(pa.output_ids), as_ids(pb.output_ids)
            if sa.empty or sb.empty:
                continue
            n, acc_a, acc_b = prefix_pair(sa[sa["request_id"] == str(pa.request_id)], out_a,
                                          sb[sb["request_id"] == str(pb.request_id)], out_b)
            rows.append({"lane": lane, "prompt": pa.prompt_id, "common_prefix": n, f"{a}_tokens": len(out_a),
                         f"{b}_tokens": len(out_b), f"{a}_steps": acc_a.steps, f"{b}_steps": acc_b.steps,
                         f"{a}_accepted": acc_a.accepted_tokens, f"{b}_accepted": acc_b.accepted_tokens,
                         "summary": f"{n} tokens in {acc_a.steps} steps ({labels[a]}) vs {acc_b.steps} ({labels[b]})"})
    return pd.DataFrame(rows, columns=cols)


def identical_share_line(summary: pd.DataFrame) -> str:
    """The summary block's evidence line (traces.tables.identical_share_line), per lane."""
    return trace_tables.identical_share_line(summary, by="lane")



# --------------------------------------------------------------------------------------------------
# matched anchors, for reading

ANCHORS_LISTED = 40  # matched anchors listed in the report (the rest are in the run's trace frames)


def as_text(ids: Any, decode: Any | None) -> str:
    """Proposed token ids as the text they decode to (shown with its quotes, so spaces and newlines read), or
    the ids themselves where no tokenizer is at hand."""
    toks = as_ids(ids)
    if decode is None:
        return " ".join(map(str, toks))
    return repr(decode(toks))


def anchor_listing(matched: pd.DataFrame, labels: dict[str, str], decode: Any | None,
                   limit: int = ANCHORS_LISTED) -> tuple[pd.DataFrame, str]:
    """The first `limit` matched anchors per lane with both engines' proposals as text (a = ours, b = oracle,
    named by their labels), and the line that says which engine is which and how many are listed of how many."""
    a, b = labels.get("ours", "ours"), labels.get("oracle", "oracle")
    cols = ["lane", "prompt", "anchor_pos", f"{a} proposed (a)", f"{b} proposed (b)", "identical", "first_diff"]
    if matched.empty:
        return pd.DataFrame(columns=cols), ""
    parts, counts = [], []
    for lane, g in matched.groupby("lane", sort=False):
        shown = g.head(limit)
        counts.append(f"{lane} {len(shown)} of {len(g)}")
        parts.append(pd.DataFrame({
            "lane": shown["lane"], "prompt": shown["prompt_id"], "anchor_pos": shown["anchor_pos"],
            f"{a} proposed (a)": [as_text(x, decode) for x in shown["proposed_a"]],
            f"{b} proposed (b)": [as_text(x, decode) for x in shown["proposed_b"]],
            "identical": shown["identical"], "first_diff": shown["first_diff"]}))
    how = "decoded with the target's tokenizer" if decode is not None else "as token ids (no tokenizer here)"
    note = (f"a = {a} (ours), b = {b} (oracle); proposals {how}; listed per lane: {', '.join(counts)} "
            "(all of them are in the run's data/trace_steps.parquet)")
    return pd.concat(parts, ignore_index=True)[cols], note


def anchors_by_prompt(matched: pd.DataFrame, timed: set[tuple[str, str]]) -> pd.DataFrame:
    """Per lane x prompt: matched anchors, how many identical, and whether that cell is in the decode-rate
    headline (`timed`: its (lane, prompt) pairs): a share resting on a loop the headline leaves out says so."""
    cols = ["lane", "prompt", "matched_anchors", "identical", "in_headline"]
    if matched.empty:
        return pd.DataFrame(columns=cols)
    rows = [{"lane": lane, "prompt": prompt, "matched_anchors": len(g), "identical": int(g["identical"].sum()),
             "in_headline": (lane, prompt) in timed}
            for (lane, prompt), g in matched.groupby(["lane", "prompt_id"], sort=False)]
    return pd.DataFrame(rows, columns=cols).sort_values(["lane", "matched_anchors"], ascending=[True, False],
                                                        kind="stable", ignore_index=True)


LOW_IDENTICAL_SHARE = 0.9  # below this a lane's matched-anchor share is explained, where the set-ups explain it


def identical_share_notes(summary: pd.DataFrame, by_prompt: pd.DataFrame, setup_diffs: list[str]) -> list[str]:
    """Per lane, what stands behind its identical share: where its anchors come from when most come from
    cells the headline leaves out, and the set-up difference of its speculation that makes the proposals
    differ (setups.asymmetries phrases naming that lane, or every lane)."""
    notes = []
    for r in summary.itertuples(index=False):
        lane, n = r.lane, int(r.matched_anchors)
        g = by_prompt[by_prompt["lane"] == lane]
        outside = g[~g["in_headline"].astype(bool)]
        line = f"{lane}: {r.identical_share:.0%} of {n} matched anchors identical"
        if n and outside["matched_anchors"].sum() > n / 2:
            top = outside.iloc[0]
            line += (f"; {int(outside['matched_anchors'].sum())} of the {n} come from cells the headline leaves out "
                     f"({int(top['matched_anchors'])} from {top['prompt']})")
        diffs = [d for d in setup_diffs if (d.startswith("speculation") or d.startswith("draft tokens"))
                 and ("(" not in d.split(":")[0] or lane in d.split(":")[0])]
        if r.identical_share < LOW_IDENTICAL_SHARE and diffs:
            line += f"; the set-ups differ in {diffs[0]}, so the same prefix can give different proposals"
        notes.append(line)
    return notes
