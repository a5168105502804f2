"""The cross-engine report's descriptive tables and notes (pure functions of the saved frames): pins, weights,
the two set-ups side by side, per-position acceptance, the cost split, and which prompts ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from specbook.core import request_failures
from specbook.core.acceptance import ACCEPTED, DEFINITION, frame_acceptance, per_position_frame
from specbook.experiments.cross_engine.collection import lane_config
from specbook.experiments.cross_engine.data import CrossData
from specbook.experiments.cross_engine.params import CrossEngineParams
from specbook.measure import costsplit


def timed_step_ms(data: CrossData, params: CrossEngineParams, labels: dict[str, str]) -> dict[tuple[str, str], float]:
    """(side label, lane) -> ms per decode step of the timed requests of the prompts the profiled pass sent (the
    first cost_split.num_prompts): decode wall over decode tokens less accepted drafts (costsplit.step_ms_of)."""
    req = request_failures.answered(data.requests)
    if req.empty or data.cells.empty:
        return {}
    prompts = list(dict.fromkeys(req["prompt"]))[: params.cost_split.num_prompts]
    out = {}
    for (side, lane), g in req[req["prompt"].isin(prompts)].groupby(["side", "lane"], sort=False):
        counts = data.cells[(data.cells["side"] == side) & (data.cells["lane"] == lane) & data.cells["prompt"].isin(prompts)]
        accepted = float(counts[ACCEPTED].fillna(0).sum()) if ACCEPTED in counts else 0.0
        out[(labels.get(side, side), lane)] = costsplit.step_ms_of(
            float((g["wall_s"] - g["ttft_s"]).sum()), float((g["completion_tokens"] - 1).clip(lower=0).sum()), accepted)
    return out


def cost_split_table(data: CrossData) -> pd.DataFrame:
    """The profiled passes' splits (costsplit.splits_frame rows with their side), the `source` column saying
    where each figure comes from."""
    frame = data.cost_split
    return frame.drop(columns=["kind"]) if "kind" in frame else frame


def per_position(data: CrossData) -> pd.DataFrame:
    """Side x lane x position (1-based): accepted at that position / drafts, summed over the prompts."""
    items = []
    for (side, lane), g in data.cells.groupby(["side", "lane"], sort=False):
        acc = frame_acceptance(g)
        if acc.drafts:
            items.append(({"side": side, "lane": lane}, acc))
    return per_position_frame(items)


def per_position_table(positions: pd.DataFrame) -> pd.DataFrame:
    """position x (lane, side): the rate (the report's table and bar plot)."""
    if positions.empty:
        return pd.DataFrame()
    return positions.pivot_table(index="position", columns=["lane", "side"], values="rate")


def prompts_note(data: CrossData, params: CrossEngineParams) -> str:
    """Which prompts the cells ran: how many fixed, how many the workload drew (from where, with which seed),
    and that every prompt went as one turn."""
    sent = list(dict.fromkeys(data.requests["prompt"])) if "prompt" in data.requests else []
    fixed = {p.id for p in params.prompts}
    n_fixed = sum(p in fixed for p in sent)
    text = f"{len(sent)} prompts: {n_fixed} from the params' `prompts` list"
    sel = data.workload
    if sel:
        how = [f"{k} {sel[k]}" for k in ("seed", "per_category", "subset", "n", "max_chars") if sel.get(k) is not None]
        source = sel.get("source") or sel.get("test_source")  # gsm8k names its test split's source
        text += (f", {len(sent) - n_fixed} drawn by the `{sel.get('workload')}` workload ({shown_source(source)}; "
                 f"{', '.join(how)})")
    mt_bench = " (MT-Bench questions: their first turn)" if sel.get("workload") == "spec_bench" else ""
    return text + (f". Every prompt is sent as one turn{mt_bench}, the same on both engines: a second turn would "
                   "carry each engine's own first answer.")


def shown_source(source: Any) -> str:
    """A workload's source as a report names it: a file by its name (no machine path), a hub id as it is."""
    text = str(source or "")
    if text.startswith(("/", "./", "../", "~")) or "\\" in text:
        return Path(text).name
    return text


def definition_note() -> str:
    return (
        f"Acceptance, one definition for every engine: {DEFINITION}. vLLM: from vllm:spec_decode_* counters; "
        "llama.cpp: from llamacpp:spec_decode_* counters (drafts = verification steps). Raw figures beside: "
        "the counts, llama.cpp's log 'mean len' (same definition) and the cold response's timings "
        "draft_n_accepted / draft_n (an acceptance rate, not AL)."
    )


def setup_table(data: CrossData, params: CrossEngineParams) -> pd.DataFrame:
    """Per lane, each set-up aspect of the two timed servers side by side (specbook.experiments.cross_engine.setups: the declared
    config and what each server's log said at start); `differs` marks an asymmetry of the comparison."""
    from specbook.engines import get_engine
    from specbook.experiments.cross_engine.setups import SETUP_COLUMNS, setup_rows

    rows: list[dict[str, Any]] = []
    timed = data.servers[data.servers["kind"] == "timed"] if "kind" in data.servers else data.servers
    named = {"side", "lane", "server"} <= set(timed.columns)
    for lane in params.lanes:
        facts = {}
        for which in ("ours", "oracle"):
            found = timed.loc[(timed["side"] == which) & (timed["lane"] == lane.name), "server"] if named else []
            startup = data.startup.get(str(found.iloc[0]), {}) if len(found) else {}
            cfg = lane_config(params.side(which), lane)
            facts[which] = get_engine(cfg.engine).setup_facts(cfg, startup)
        rows += setup_rows(lane.name, facts["ours"], facts["oracle"])
    return pd.DataFrame(rows, columns=SETUP_COLUMNS)


def pins_table(data: CrossData) -> pd.DataFrame:
    """side / key / expected / found / ok for every declared pin."""
    rows = []
    for which, doc in data.pins.items():
        for c in doc.get("checks", []):
            rows.append({"side": which, **c})
    return pd.DataFrame(rows, columns=["side", "key", "expected", "found", "ok"])


def weights_table(data: CrossData) -> pd.DataFrame:
    """model / identical / tensors / weights digest / GGUF sha256 (llama.cpp sides only)."""
    rows = [
        {"model": name, "identical": p.get("identical"), "tensors": p.get("tensors"),
         "weights_digest": p.get("weights_digest"), "gguf_sha256": p.get("gguf_sha256"), "method": p.get("method")}
        for name, p in data.weights.items()
    ]
    return pd.DataFrame(rows, columns=["model", "identical", "tensors", "weights_digest", "gguf_sha256", "method"])


SHORT_DIGEST = 12  # hex digits a report shows of a sha256 (the whole one is in data/weights.json)


def weights_view(weights: pd.DataFrame) -> pd.DataFrame:
    """The weights table as the report shows it: digests cut to their first hex digits, so it fits the page."""
    out = weights.copy()
    for col in ("weights_digest", "gguf_sha256"):
        out[col] = out[col].map(lambda v: f"{v[:SHORT_DIGEST]}..." if isinstance(v, str) and len(v) > SHORT_DIGEST else v)
    return out
