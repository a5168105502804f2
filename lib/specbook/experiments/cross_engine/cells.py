"""Per-cell figures (pure functions of the saved frames): each lane x prompt cell's guards, tok/s ratio with its
interval and acceptance, the per-lane headlines (strict and with equal work), and the lines that summarise them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from specbook.core import request_failures, stats
from specbook.core.acceptance import Acceptance
from specbook.experiments.cross_engine import timing
from specbook.experiments.cross_engine.data import CrossData
from specbook.experiments.cross_engine.guards import GuardThresholds, GuardVerdict, SideOutputs, guard_cell
from specbook.experiments.cross_engine.params import OFF_LANE, SIDES, CrossEngineParams

if TYPE_CHECKING:
    from specbook.serve.client import ChatRequest

def with_rates(requests: pd.DataFrame) -> pd.DataFrame:
    """Requests plus warm tok/s = completion_tokens / whole-request wall time."""
    df = requests.copy()
    df["tok_s"] = df["completion_tokens"] / df["wall_s"]
    return df


def ratio_of_means_ci(
    ours: np.ndarray, oracle: np.ndarray, *, ci: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """mean(ours) / mean(oracle) with Fieller's interval (Welch df) over each side's repeats
    (stats.ratio_of_means_interval; n_boot and seed are no longer used: a bootstrap of 2-3 repeats
    covers far less than its level).

    Repeats on one server share its state: the CI covers request-to-request noise, not server-to-server.
    """
    ours, oracle = np.asarray(ours, float), np.asarray(oracle, float)
    if ours.size == 0 or oracle.size == 0:
        return math.nan, math.nan, math.nan
    return stats.ratio_of_means_interval(ours, oracle, ci, nonnegative=True)


def _tokens(df: pd.DataFrame) -> list[list[int]]:
    return [list(map(int, t)) for t in df.sort_values("repeat")["token_ids"]]


def user_text(request: ChatRequest) -> str:
    """What a request asks, in the user's words (a chat's last user message, or the plain prompt)."""
    if request.messages is None:
        return request.prompt or ""
    users = [m.get("content") for m in request.messages if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def prompt_texts(params: CrossEngineParams) -> dict[str, str]:
    """prompt id -> its user text, for the left-task guard: the fixed prompts, and the workload's draw where
    its file can be read here (a drawn prompt whose text is not known is not judged by that guard)."""
    from specbook.core.errors import SpecbookError

    try:
        templates = params.selected_prompts()
    except (SpecbookError, OSError):
        templates = [p.request() for p in params.prompts]
    return {r.prompt_id: user_text(r) for r in templates}


def cell_guards(data: CrossData, thresholds: GuardThresholds | None = None,
                texts: dict[str, str] | None = None) -> dict[tuple[str, str], GuardVerdict]:
    """Guards for every lane x prompt cell; `texts` (prompt id -> its user text) lets the left-task guard judge
    the outputs of those prompts."""
    req = data.requests
    labels = _labels(data)
    out: dict[tuple[str, str], GuardVerdict] = {}
    lanes = list(dict.fromkeys(req["lane"]))
    for lane in lanes:
        for prompt in dict.fromkeys(req.loc[req["lane"] == lane, "prompt"]):
            sides = {}
            prompt_tokens: list[int | None] = []
            for which in SIDES:
                rows = req[(req["lane"] == lane) & (req["prompt"] == prompt) & (req["side"] == which)]
                ok = rows[rows["error"].isna()] if "error" in rows else rows
                off_rows = req[(req["lane"] == OFF_LANE) & (req["prompt"] == prompt) & (req["side"] == which)]
                spec_off = _tokens(off_rows)[0] if lane != OFF_LANE and len(off_rows) else None
                counted = ok["completion_tokens"].dropna() if "completion_tokens" in ok else pd.Series(dtype=float)
                text = ok.sort_values("repeat")["output_text"].iloc[0] if len(ok) and "output_text" in ok else None
                sides[which] = SideOutputs(labels[which], _tokens(ok), spec_off=spec_off,
                                           completion_tokens=int(counted.iloc[0]) if len(counted) else None,
                                           text=text)
                pt = ok["prompt_tokens"].dropna()
                prompt_tokens.append(int(pt.iloc[0]) if len(pt) else None)
            out[(lane, prompt)] = guard_cell(
                sides["ours"], sides["oracle"], thresholds, prompt_tokens=(prompt_tokens[0], prompt_tokens[1]),
                prompt_text=(texts or {}).get(prompt),
            )
    return out


def _labels(data: CrossData) -> dict[str, str]:
    labels = {"ours": "ours", "oracle": "oracle"}
    if not data.servers.empty:
        for which in SIDES:
            found = data.servers.loc[data.servers["side"] == which, "label"]
            if len(found):
                labels[which] = str(found.iloc[0])
    return labels


def request_failure_table(data: CrossData, max_failed: int) -> pd.DataFrame:
    """Per lane x prompt cell (both sides' warm repeats): requests, failed, and whether it stays comparable."""
    return request_failures.failure_table(data.requests, ["lane", "prompt"], max_failed)


FAILED_FLAG = "failed requests"


def cell_table(
    data: CrossData, thresholds: GuardThresholds | None = None, *, ci: float = 0.95, n_boot: int = 2000,
    max_failed_requests: int = 0, texts: dict[str, str] | None = None,
) -> pd.DataFrame:
    """lane / prompt / ours / oracle / ratio [CI] / flags, plus lengths, divergence, TTFT, ITL (per streamed
    chunk and per token), AL.

    A cell with more failed requests than `max_failed_requests` is not comparable, whatever its guards say;
    `texts` (prompt id -> user text) lets the left-task guard judge those prompts' outputs."""
    req = request_failures.answered(with_rates(data.requests))
    guards = cell_guards(data, thresholds, texts)
    over = request_failures.left_out(request_failure_table(data, max_failed_requests), ["lane", "prompt"])
    acc = acceptance_table(data) if not data.cells.empty else pd.DataFrame()
    al = acc.set_index(["lane", "prompt", "side"])["al"] if not acc.empty else None
    rows = []
    for (lane, prompt), verdict in guards.items():
        cell = req[(req["lane"] == lane) & (req["prompt"] == prompt)]
        ours, oracle = (cell[cell["side"] == s] for s in SIDES)
        ratio, lo, hi = ratio_of_means_ci(ours["tok_s"].to_numpy(), oracle["tok_s"].to_numpy(), ci=ci, n_boot=n_boot)
        row = {
            "lane": lane, "prompt": prompt,
            "ours_tok_s": float(ours["tok_s"].mean()), "oracle_tok_s": float(oracle["tok_s"].mean()),
            "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi,
            "comparable": verdict.comparable and (lane, prompt) not in over,
            "flags": ", ".join([*verdict.flags, *([FAILED_FLAG] if (lane, prompt) in over else [])]),
            "ours_tokens": verdict.ours_tokens, "oracle_tokens": verdict.oracle_tokens,
            "first_divergence": verdict.first_divergence,
            "ours_distinct": verdict.ours_distinct_ratio, "oracle_distinct": verdict.oracle_distinct_ratio,
            "ours_ttft_ms": 1000 * float(ours["ttft_s"].mean()), "oracle_ttft_ms": 1000 * float(oracle["ttft_s"].mean()),
            "ours_itl_ms": 1000 * float(ours["itl_mean_s"].mean()),
            "oracle_itl_ms": 1000 * float(oracle["itl_mean_s"].mean()),
            "ours_itl_token_ms": timing.side_figures(ours)["itl_token_ms"],
            "oracle_itl_token_ms": timing.side_figures(oracle)["itl_token_ms"],
            "reasons": [*verdict.reasons, *([over[(lane, prompt)]] if (lane, prompt) in over else [])],
        }
        if al is not None:
            for which in SIDES:
                row[f"{which}_al"] = al.get((lane, prompt, which), math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def headline(cells: pd.DataFrame, *, ci: float = 0.95, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per lane: the geometric mean of the comparable cells' ratios (flagged cells left out), with a CI.

    The CI is the t interval of the mean log ratio over comparable cells (prompts; df = cells - 1) when
    there are at least two; with one it is that cell's own CI; with none the lane has no headline ratio.
    """
    rows = []
    for lane, group in cells.groupby("lane", sort=False):
        ok = group[group["comparable"]]
        logs = np.log(ok["ratio"].to_numpy(float))
        row = {"lane": lane, "cells": len(group), "comparable": len(ok),
               "left_out": ", ".join(group.loc[~group["comparable"], "prompt"])}
        if len(ok) == 0:
            row.update(ratio=math.nan, ratio_lo=math.nan, ratio_hi=math.nan)
        elif len(ok) == 1:
            row.update(ratio=float(ok["ratio"].iloc[0]), ratio_lo=float(ok["ratio_lo"].iloc[0]),
                       ratio_hi=float(ok["ratio_hi"].iloc[0]))
        else:
            mean, lo, hi = stats.mean_t_interval(logs, ci)
            row.update(ratio=float(np.exp(mean)), ratio_lo=float(np.exp(lo)), ratio_hi=float(np.exp(hi)))
        rows.append(row)
    return pd.DataFrame(rows)


def equal_work_cells(data: CrossData, thresholds: GuardThresholds | None = None, *, ci: float = 0.95,
                     max_failed_requests: int = 0) -> pd.DataFrame:
    """The equal-work re-runs (max_tokens = the common prefix, both sides) as cells, guarded like the strict
    ones (each lane on its own: a re-run has no spec-off output of the same length to compare with)."""
    ew = data.equal_work
    if ew.empty:
        return pd.DataFrame(columns=[*REPORT_COLUMNS, "max_tokens"])
    parts = []
    for lane in dict.fromkeys(ew["lane"]):
        rows = ew[ew["lane"] == lane]
        lane_data = CrossData(requests=rows, cells=pd.DataFrame(), servers=data.servers)
        cells = cell_table(lane_data, thresholds, ci=ci, max_failed_requests=max_failed_requests)
        cells["max_tokens"] = cells["prompt"].map(rows.groupby("prompt")["max_tokens"].first())
        parts.append(cells)
    return pd.concat(parts, ignore_index=True)


def equal_work_headline(strict: pd.DataFrame, equal: pd.DataFrame, *, ci: float = 0.95) -> pd.DataFrame:
    """Per lane, the second headline: the geometric-mean ratio over the strict comparable cells plus every
    diverged / length-mismatched cell whose equal-work re-run is comparable (its ratio replaces the strict
    one). Loops are never re-run, so they stay out of both."""
    eq = equal[equal["comparable"]].set_index(["lane", "prompt"]) if len(equal) else pd.DataFrame()
    rows = []
    for r in strict.itertuples(index=False):
        key = (r.lane, r.prompt)
        if not r.comparable and len(eq) and key in eq.index:
            e = eq.loc[key]
            rows.append({"lane": r.lane, "prompt": r.prompt, "ratio": float(e["ratio"]), "ratio_lo": float(e["ratio_lo"]),
                         "ratio_hi": float(e["ratio_hi"]), "comparable": True, "equal_work": True})
        else:
            rows.append({"lane": r.lane, "prompt": r.prompt, "ratio": r.ratio, "ratio_lo": r.ratio_lo,
                         "ratio_hi": r.ratio_hi, "comparable": bool(r.comparable), "equal_work": False})
    combined = pd.DataFrame(rows, columns=["lane", "prompt", "ratio", "ratio_lo", "ratio_hi", "comparable", "equal_work"])
    head = headline(combined, ci=ci)
    if len(head):
        head.insert(3, "re_run", head["lane"].map(combined.groupby("lane")["equal_work"].sum()).astype(int))
    return head


def usable_cells(strict: pd.DataFrame, equal: pd.DataFrame) -> pd.DataFrame:
    """Per lane: cells, usable under the strict guards, usable with equal work, and why the others are not."""
    ok_equal = set(map(tuple, equal.loc[equal["comparable"], ["lane", "prompt"]].to_numpy())) if len(equal) else set()
    rows = []
    for lane, g in strict.groupby("lane", sort=False):
        rescued = [p for p in g.loc[~g["comparable"], "prompt"] if (lane, p) in ok_equal]
        why = [f"{r.prompt}: {r.flags}" for r in g.itertuples(index=False)
               if not r.comparable and r.prompt not in rescued]
        rows.append({"lane": lane, "cells": len(g), "strict_usable": int(g["comparable"].sum()),
                     "equal_work_usable": int(g["comparable"].sum()) + len(rescued),
                     "re_run_usable": ", ".join(rescued), "not_usable": "; ".join(why)})
    return pd.DataFrame(rows, columns=["lane", "cells", "strict_usable", "equal_work_usable", "re_run_usable",
                                       "not_usable"])


def flagged_reasons(cells: pd.DataFrame) -> str:
    """One block per flagged cell: why it is not comparable (printed under the table)."""
    lines = []
    for _, row in cells[~cells["comparable"]].iterrows():
        lines.append(f"{row['lane']} / {row['prompt']}: NOT COMPARABLE")
        lines += [f"    - {r}" for r in row["reasons"]]
    return "\n".join(lines) if lines else "every cell passed every guard"


def acceptance_table(data: CrossData) -> pd.DataFrame:
    """Per side x lane x prompt: AL and acceptance rate from the acceptance model, the raw counts beside."""
    rows = []
    for _, c in data.cells.iterrows():
        acc = Acceptance.from_row(c, source="counter delta")
        if not acc.has_drafts:
            continue  # no speculation in this cell
        row = {"lane": c["lane"], "prompt": c["prompt"], "side": c["side"], "engine": c["engine"],
               **acc.figures()}
        row = {k: v for k, v in row.items() if not k.startswith("accepted_pos_")}
        if pd.notna(c.get("log_requests")):  # an engine whose log printed per-request draft statistics
            cold = Acceptance.from_llamacpp_timings([{"draft_n": c.get("cold_timings_draft_n"),
                                                      "draft_n_accepted": c.get("cold_timings_draft_n_accepted")}])
            row["cold_timings_acceptance_rate"] = cold.acceptance_rate
            row["log_mean_len"] = c.get("log_mean_len")
        rows.append(row)
    return pd.DataFrame(rows)


REPORT_COLUMNS = ["lane", "prompt", "ours_tok_s", "oracle_tok_s", "ratio", "ratio_lo", "ratio_hi", "comparable", "flags"]
GUARD_COLUMNS = [
    "lane", "prompt", "flags", "ours_tokens", "oracle_tokens", "first_divergence", "ours_distinct", "oracle_distinct",
    "ours_al", "oracle_al", "ours_ttft_ms", "oracle_ttft_ms", "ours_itl_token_ms", "oracle_itl_token_ms",
]


def failures_line(failures: pd.DataFrame) -> str:
    """'none of 432 requests failed (72 cells)' / 'N of M requests failed in K cells, J left out'."""
    if failures.empty:
        return "no request was sent"
    sent, failed = int(failures["n_requests"].sum()), int(failures["n_failed"].sum())
    if not failed:
        return f"none of {sent} requests failed ({len(failures)} cells)"
    hit = failures[failures["n_failed"] > 0]
    out = int((~failures["valid"].astype(bool)).sum()) if "valid" in failures else 0
    return f"{failed} of {sent} requests failed, in {len(hit)} of {len(failures)} cells; {out} cells left out"


def flagged_count(cells: pd.DataFrame) -> int:
    return int((~cells["comparable"].astype(bool)).sum()) if len(cells) else 0
