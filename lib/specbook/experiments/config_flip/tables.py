"""The config-flip report's descriptive tables: what was flipped, and the optional passes' tables per arm.

All are pure functions of the saved frames (FlipData). The passes (params traces / cost_split) are keyed by arm:
    trace_agreement_by_arm         derived accepted counts against the engine's counters, per arm
    replay_by_arm                  each draft_model arm's proposals against its replay reference
    proposals_table                the first steps of each arm's first traced prompt: proposed beside emitted
    matched_anchors_between_arms   anchors each arm and the first reached with the same prefix, side by side
    prefix_acceptance_between_arms steps and accepted tokens of each pair on their common prefix
    cost_split_table               the profiled passes' splits per arm
"""

from __future__ import annotations

import json
import math

import pandas as pd

from specbook.experiments.config_flip.data import FlipData, keyed
from specbook.traces import tables as trace_tables

TRACE_NOTE = ("Proposal traces come from a separate, untimed trace pass per arm (its own server, run after the "
              "measured arms: vLLM with specbook's trace plugin, llama.cpp at debug verbosity -v), on the measured "
              "prompts (the first `trace_num_prompts`); no timed figure comes from it.")


def describe_flip(data: FlipData) -> str:
    """What was flipped, in plain lines: source, field, arms with their values and shared weights."""
    f = data.flip
    where = "the target (engine.model)" if f["role"] == "target" else "the draft (speculative_config.model)"
    original = "absent (added)" if f["field_was_added"] else json.dumps(f["original_value"])
    lines = [
        f"source folder: {f['source']}  ->  serves as {where}",
        f"flipped field: {f['file']}:{f['field']}  (original value {original})",
    ]
    for arm in f["arms"]:
        lines.append(
            f"  {arm['label']}: {f['field']} = {json.dumps(arm['value'])}; "
            f"{len(arm['linked_weights'])} weight file(s) {f['link']}ed to the originals, "
            f"{len(arm['copied_files'])} other file(s) copied"
        )
    n = len(f["arms"]) - 1
    lines.append(
        f"checked: each of the {n} other arm(s) differs from {f['arms'][0]['label']} only in "
        f"{f['file']}:{f['field']} (all files diffed), and launches with the same argv and env but for the folder"
    )
    return "\n".join(lines)


def diff_table(data: FlipData) -> pd.DataFrame:
    """The proven differences between each arm and the first arm (file:field: left != right)."""
    rows = [
        {"arm": arm, "difference": d}
        for arm, diffs in data.flip.get("diffs_vs_first_arm", {}).items()
        for d in diffs
    ]
    return pd.DataFrame(rows)


# -- the optional passes (params traces / cost_split): pure functions of their frames, keyed by arm ------------


def arm_part(frame: pd.DataFrame, arm: str) -> pd.DataFrame:
    return frame[frame["arm"] == arm] if len(frame) else frame


def traced_arms(data: FlipData) -> list[str]:
    """The arms with a trace pass, in arm order."""
    if data.trace_passes.empty:
        return []
    traced = set(data.trace_passes["arm"])
    return [a for a in data.arms.sort_values("index")["arm"] if a in traced]


def trace_agreement_by_arm(data: FlipData) -> pd.DataFrame:
    """Per arm: the accepted counts derived from its traced proposals against the output, beside the engine's
    counters for the same (untimed) window; `agree` says whether the counters lie within the derived counts."""
    rows = [{"arm": p["arm"], **trace_tables.pass_agreement(p, arm_part(data.trace_steps, p["arm"]))}
            for _, p in data.trace_passes.iterrows()]
    return pd.DataFrame(rows, columns=["arm", *trace_tables.AGREEMENT_COLUMNS])


def replay_by_arm(data: FlipData) -> pd.DataFrame:
    """Per draft_model arm: its traced proposals against the replay reference (its own draft folder, flipped
    config included, run greedily in transformers): anchors, share identical, systematic mismatches named."""
    cols = ["arm", "anchors", "identical_share", "systematic_mismatches"]
    if data.trace_reference.empty:
        return pd.DataFrame(columns=cols)
    rows = [{"arm": arm, **trace_tables.replay_comparison(arm_part(data.trace_steps, arm), ref,
                                                          arm_part(data.trace_requests, arm))}
            for arm, ref in data.trace_reference.groupby("arm", sort=False)]
    return pd.DataFrame(rows, columns=cols)


def proposals_table(data: FlipData, steps_per_arm: int = 12) -> pd.DataFrame:
    """Per arm, the first `steps_per_arm` verified steps of its first traced prompt: proposed ids beside the ids
    the target emitted there and the accepted count derived from them (the whole of it: data/trace_steps)."""
    parts = []
    for arm in traced_arms(data):
        steps = arm_part(data.trace_steps, arm)
        table = trace_tables.proposals_vs_output(steps, arm_part(data.trace_requests, arm))
        if len(table):
            table = table[table["prompt_id"] == table["prompt_id"].iloc[0]].head(steps_per_arm)
            parts.append(keyed(table, arm, "trace").drop(columns=["kind"]))
    cols = ["arm", "prompt_id", "anchor_pos", "proposed", "emitted", "accepted", "cut"]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


def arm_pairs(data: FlipData) -> list[tuple[str, str]]:
    """Each traced arm against the first traced arm (as the outputs table compares them)."""
    arms = traced_arms(data)
    return [(arms[0], b) for b in arms[1:]]


def pair_label(a: str, b: str) -> str:
    return f"{a} vs {b}"


def matched_anchors_between_arms(data: FlipData) -> pd.DataFrame:
    """Per pair of arms (each against the first): every anchor both reached with the same prefix (same prompt
    and emitted ids), their proposals side by side (`proposed_a` = the first arm), identical or where they first
    differ (1-based)."""
    parts = []
    for a, b in arm_pairs(data):
        m = trace_tables.matched_pair(arm_part(data.trace_steps, a), arm_part(data.trace_requests, a),
                                      arm_part(data.trace_steps, b), arm_part(data.trace_requests, b))
        m.insert(0, "pair", pair_label(a, b))
        parts.append(m)
    cols = ["pair", *trace_tables.MATCHED_COLUMNS]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


def matched_anchor_summary(matched: pd.DataFrame) -> pd.DataFrame:
    """Per pair of arms: matched anchors, the share with identical proposals, where the others first differ."""
    return trace_tables.matched_summary(matched, "pair")


PREFIX_COLUMNS = ["pair", "prompt_id", "common_prefix", "tokens_a", "tokens_b", "steps_a", "steps_b", "accepted_a",
                  "accepted_b", "summary"]


def prefix_acceptance_between_arms(data: FlipData) -> pd.DataFrame:
    """Per pair of arms x prompt traced in both: the common prefix of their emitted ids and each arm's
    speculative steps and accepted draft tokens on it ("96 tokens in 25 steps (arm0) vs 80 (arm1)")."""
    rows = []
    for a, b in arm_pairs(data):
        ra, rb = arm_part(data.trace_requests, a), arm_part(data.trace_requests, b)
        sa, sb = arm_part(data.trace_steps, a), arm_part(data.trace_steps, b)
        for pa in ra.itertuples(index=False):
            match = rb[rb["prompt_id"] == pa.prompt_id]
            if match.empty or sa.empty or sb.empty:
                continue
            pb = next(match.itertuples(index=False))
            out_a, out_b = trace_tables.as_ids(pa.output_ids), trace_tables.as_ids(pb.output_ids)
            n, acc_a, acc_b = trace_tables.prefix_pair(sa[sa["request_id"] == str(pa.request_id)], out_a,
                                                       sb[sb["request_id"] == str(pb.request_id)], out_b)
            rows.append({"pair": pair_label(a, b), "prompt_id": pa.prompt_id, "common_prefix": n,
                         "tokens_a": len(out_a), "tokens_b": len(out_b), "steps_a": acc_a.steps,
                         "steps_b": acc_b.steps, "accepted_a": acc_a.accepted_tokens, "accepted_b": acc_b.accepted_tokens,
                         "summary": f"{n} tokens in {acc_a.steps} steps ({a}) vs {acc_b.steps} ({b})"})
    return pd.DataFrame(rows, columns=PREFIX_COLUMNS)


def identical_share_line(summary: pd.DataFrame) -> str:
    """The summary block's evidence line (traces.tables.identical_share_line), per pair."""
    return trace_tables.identical_share_line(summary, by="pair")


def cost_split_table(data: FlipData) -> pd.DataFrame:
    """The profiled passes' splits per arm (costsplit.splits_frame rows; `lane` is the arm, `source` says where
    each figure comes from, `overhead` the profiled wall over the unprofiled one)."""
    frame = data.cost_split
    return frame.drop(columns=["arm", "kind"]) if len(frame) else frame


def timed_step_ms(splits: pd.DataFrame, summary: pd.DataFrame) -> dict[tuple[str, str], float]:
    """(engine, arm) -> ms per decode step of the arm's measured, uninstrumented window (arm_summary's
    per_step_ms: all its prompts, the profiled pass sends the first cost_split_num_prompts of them)."""
    per_arm = dict(zip(summary["arm"], summary["per_step_ms"], strict=True)) if len(summary) else {}
    return {(r.engine, r.lane): float(per_arm.get(r.lane, math.nan)) for r in splits.itertuples(index=False)}
