"""The cross-engine experiment's timing on equal decode work: what each engine takes to decode the same tokens.

Per request: decode tokens = completion tokens - 1 (the first comes with the prompt's forward), decode wall =
wall - TTFT. Per side of a cell, pooled over its repeats: decode rate = decode tokens / decode wall (tok/s),
ITL per token = decode wall / decode tokens (ms: per token on every engine, however many tokens a streamed
chunk carries), end-to-end tok/s = completion tokens / wall, TTFT = the mean over the repeats.

A cell is timed only on equal work, and enough of it (`TimingSpec`):
- both sides emitted the same tokens: the timed requests themselves where the outputs are equal, else the
  equal-work re-run (max_tokens = their common prefix, ignore_eos) where one was made and came back equal;
- at least `min_common_tokens` of them;
- each side's decode wall over its repeats at least `min_timed_wall_s` (collection adds repeats to get there,
  up to `max_warm_repeats`, to a cell whose timed requests can still time it: `worth_topping_up`);
- no loop, no output that left its prompt's task, no failed request, the same prompt tokens, repeats that agree.
Every other cell is listed with its reason. TTFT is not decode work: its own row, over every cell whose two
sides got the same prompt tokens and answered.

The why-sentences (`speculation_effect`, `lane_why`, `ttft_why`) are derived from these figures only.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from specbook.core import stats
from specbook.experiments.cross_engine.guards import (
    DEGENERATE,
    DIVERGED,
    LEFT_TASK,
    LENGTH_MISMATCH,
    MISSING,
    PROMPT_MISMATCH,
    REPEATS_DIFFER,
    GuardThresholds,
    degenerate_reasons,
)

SIDES = ("ours", "oracle")
OFF_LANE = "off"
FAILED_FLAG = "failed requests"  # cross_engine's flag for a cell over measurement.max_failed_requests
TIMED_REQUESTS, RE_RUN = "timed requests", "equal-work re-run"
FIRST_WORDS = 8


class TimingSpec(BaseModel):
    """When a cell is timed: enough common tokens, and a decode wall long enough to time on each side."""

    model_config = ConfigDict(extra="forbid")

    min_common_tokens: int = Field(64, ge=2, description="a cell is timed only when both sides emit at least "
                                                         "this many common tokens (its outputs, or its equal-work "
                                                         "re-run's common prefix)")
    min_timed_wall_s: float = Field(0.25, ge=0.0, description="and each side's decode wall summed over its "
                                                              "repeats is at least this long (s); collection adds "
                                                              "repeats to get there")
    max_warm_repeats: int = Field(20, ge=1, description="the most timed repeats collection sends to one cell "
                                                        "side to reach min_timed_wall_s")


# --------------------------------------------------------------------------------------------------
# per request and per side


def answered(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["error"].isna()] if "error" in rows else rows


def decode_seconds(rows: pd.DataFrame) -> pd.Series:
    """Each request's decode wall: wall - TTFT (NaN without a TTFT)."""
    return rows["wall_s"] - rows["ttft_s"]


def per_token_ms(rows: pd.DataFrame) -> np.ndarray:
    """Each answered request's decode wall per decode token (ms); requests of one token left out."""
    ok = answered(rows)
    n = ok["completion_tokens"].astype(float) - 1
    keep = (n > 0) & decode_seconds(ok).notna()
    return (1000 * decode_seconds(ok)[keep] / n[keep]).to_numpy(float)


def side_figures(rows: pd.DataFrame) -> dict[str, float]:
    """One side of one cell, pooled over its answered repeats (see the module docstring)."""
    ok = answered(rows)
    ok = ok[ok["ttft_s"].notna()] if "ttft_s" in ok else ok.iloc[0:0]
    if ok.empty:
        return {"repeats": 0, "decode_wall_s": math.nan, "decode_tok_s": math.nan, "e2e_tok_s": math.nan,
                "ttft_ms": math.nan, "itl_token_ms": math.nan, "itl_chunk_ms": math.nan, "tokens_per_chunk": math.nan}
    tokens = float(ok["completion_tokens"].sum())
    decode_tokens = float((ok["completion_tokens"] - 1).clip(lower=0).sum())
    decode_s = float(decode_seconds(ok).sum())
    chunks = float(ok["chunks"].sum()) if "chunks" in ok else math.nan
    return {
        "repeats": len(ok), "decode_wall_s": decode_s,
        "decode_tok_s": decode_tokens / decode_s if decode_s > 0 and decode_tokens else math.nan,
        "e2e_tok_s": tokens / float(ok["wall_s"].sum()) if float(ok["wall_s"].sum()) > 0 else math.nan,
        "ttft_ms": 1000 * float(ok["ttft_s"].mean()),
        "itl_token_ms": 1000 * decode_s / decode_tokens if decode_tokens else math.nan,
        "itl_chunk_ms": 1000 * float(ok["itl_mean_s"].mean()) if "itl_mean_s" in ok else math.nan,
        "tokens_per_chunk": tokens / chunks if chunks else math.nan,
    }


def first_words(text: Any, n: int = FIRST_WORDS) -> str:
    """The first `n` words of an output, on one line ("..." when there is more)."""
    words = str(text or "").split()
    return " ".join(words[:n]) + (" ..." if len(words) > n else "")


def repeats_to_add(decode_walls_s: list[float], *, min_wall_s: float, max_repeats: int) -> int:
    """How many more repeats a cell side needs for its summed decode wall to reach `min_wall_s`, at the mean
    wall of those sent (one more for margin), within `max_repeats` in all; 0 when it is there."""
    done = [w for w in decode_walls_s if w == w]  # NaN: a failed request
    total = sum(done)
    if total >= min_wall_s or len(decode_walls_s) >= max_repeats or not done or total <= 0:
        return 0
    mean = total / len(done)
    return int(min(max_repeats - len(decode_walls_s), math.ceil((min_wall_s - total) / mean) + 1))


def worth_topping_up(own: list[int], other: list[int] | None, *, min_common_tokens: int,
                     guards: GuardThresholds | None = None, length: int | None = None) -> bool:
    """Whether a cell side's timed requests can still time the cell, so that repeats added to reach
    `min_timed_wall_s` are not spent for nothing. `own`: this side's first output (target token ids; `length`:
    the server's count of it where known, which the guards count too: the text drops a sampled EOS);
    `other`: the other side's ids, where it already ran (None: not yet). No where the output is shorter than
    `min_common_tokens` (the common prefix cannot be longer) or a loop; no where the other side's output differs
    (the cell is then timed, if at all, on its equal-work re-run, which adds its own repeats); else yes."""
    if (length if length is not None else len(own)) < min_common_tokens or degenerate_reasons(own, guards):
        return False
    return other is None or list(other) == list(own)


# --------------------------------------------------------------------------------------------------
# cells


def _flags(value: Any) -> list[str]:
    return [f.strip() for f in str(value or "").split(",") if f.strip()]


def exclusion(flags: list[str]) -> str | None:
    """Why a cell's outputs cannot be timed as equal work whatever its length (None: they can)."""
    if FAILED_FLAG in flags:
        return "failed requests"
    if any(f.startswith(DEGENERATE) for f in flags):
        return "a loop (degenerate output)"
    if any(f.startswith(LEFT_TASK) for f in flags):
        return "left its prompt's task (a loop trap that turned into a count)"
    if MISSING in flags:
        return "no output on one side"
    if PROMPT_MISMATCH in flags:
        return "the two sides got different prompt tokens"
    if any(f.startswith(REPEATS_DIFFER) for f in flags):
        return "a side's repeats differ (not one output to time)"
    return None


def _diverged(flags: list[str]) -> bool:
    return DIVERGED in flags or LENGTH_MISMATCH in flags


def decode_cells(strict: pd.DataFrame, requests: pd.DataFrame, equal_requests: pd.DataFrame,
                 equal_cells: pd.DataFrame, timing: TimingSpec, *, ci: float = 0.95) -> pd.DataFrame:
    """Per lane x prompt: whether the cell is timed on equal decode work (or why not), where its timed requests
    come from, the common tokens, and each side's repeats, decode wall, decode rate, ITL per token and per
    streamed chunk, end-to-end tok/s, TTFT and first words; the decode-rate ratio (ours / oracle) with its
    Fieller interval over the repeats' per-token times, and the end-to-end and TTFT ratios.

    `strict`: cross_engine.cell_table (flags, tokens, first divergence); `requests`: the timed requests;
    `equal_requests` / `equal_cells`: the equal-work re-runs and their guarded cells (empty without)."""
    eq_flags = ({(r.lane, r.prompt): _flags(r.flags) for r in equal_cells.itertuples(index=False)}
                if len(equal_cells) else {})
    rows = []
    for c in strict.itertuples(index=False):
        flags = _flags(c.flags)
        key = (c.lane, c.prompt)
        cell_rows = requests[(requests["lane"] == c.lane) & (requests["prompt"] == c.prompt)]
        why = exclusion(flags)
        source, common, used = TIMED_REQUESTS, int(min(c.ours_tokens, c.oracle_tokens)), cell_rows
        if why is None and _diverged(flags):
            if key in eq_flags:
                source = RE_RUN
                used = equal_requests[(equal_requests["lane"] == c.lane) & (equal_requests["prompt"] == c.prompt)]
                common = int(used["max_tokens"].iloc[0])
                still = [f for f in eq_flags[key] if _diverged([f]) or exclusion([f])]
                if still:
                    why = f"its equal-work re-run ({common} tokens) came back unequal: {', '.join(still)}"
            else:
                common = int(c.first_divergence) if pd.notna(c.first_divergence) else 0
                why = (f"outputs part at token {common} and no equal-work re-run was made"
                       if common >= timing.min_common_tokens else
                       f"outputs part at token {common}: {_common(common)} < {timing.min_common_tokens}")
        if why is None and common < timing.min_common_tokens:
            why = f"{_common(common)} < {timing.min_common_tokens}"
        figures = {s: side_figures(used[used["side"] == s]) for s in SIDES}
        if why is None:
            short = [(s, figures[s]["decode_wall_s"]) for s in SIDES
                     if not figures[s]["decode_wall_s"] >= timing.min_timed_wall_s]
            if short:
                why = "; ".join(f"{s}'s decode wall {w:.3g} s < {timing.min_timed_wall_s:g} s" for s, w in short)
        ours_t, oracle_t = (per_token_ms(used[used["side"] == s]) for s in SIDES)
        ratio, lo, hi = (stats.ratio_of_means_interval(oracle_t, ours_t, ci, nonnegative=True)
                         if len(ours_t) and len(oracle_t) else (math.nan,) * 3)
        strict_figures = {s: side_figures(cell_rows[cell_rows["side"] == s]) for s in SIDES}
        texts = {s: _first_output_words(used[used["side"] == s]) for s in SIDES}
        row = {"lane": c.lane, "prompt": c.prompt, "timed": why is None, "why_not_timed": why or "",
               "source": source, "common_tokens": common,
               "decode_ratio": ratio, "decode_ratio_lo": lo, "decode_ratio_hi": hi,
               "e2e_ratio": _ratio(figures, "e2e_tok_s"),
               "ttft_ratio": _ratio(strict_figures, "ttft_ms"),
               "ttft_usable": FAILED_FLAG not in flags and PROMPT_MISMATCH not in flags and MISSING not in flags}
        for s in SIDES:
            f = figures[s]
            row.update({f"{s}_repeats": f["repeats"], f"{s}_decode_wall_s": f["decode_wall_s"],
                        f"{s}_decode_tok_s": f["decode_tok_s"], f"{s}_e2e_tok_s": f["e2e_tok_s"],
                        f"{s}_itl_token_ms": f["itl_token_ms"], f"{s}_itl_chunk_ms": f["itl_chunk_ms"],
                        f"{s}_tokens_per_chunk": f["tokens_per_chunk"], f"{s}_ttft_ms": strict_figures[s]["ttft_ms"],
                        f"{s}_words": texts[s]})
        rows.append(row)
    return pd.DataFrame(rows, columns=DECODE_COLUMNS)


def _common(n: int) -> str:
    return f"{n} common token{'s' if n != 1 else ''}"


def _first_output_words(rows: pd.DataFrame) -> str:
    ok = answered(rows)
    if ok.empty or "output_text" not in ok:
        return ""
    return first_words(ok.sort_values("repeat")["output_text"].iloc[0] if "repeat" in ok else ok["output_text"].iloc[0])


def _ratio(figures: dict[str, dict[str, float]], key: str) -> float:
    a, b = figures["ours"][key], figures["oracle"][key]
    return a / b if b and a == a and b == b else math.nan


DECODE_COLUMNS = [
    "lane", "prompt", "timed", "why_not_timed", "source", "common_tokens", "decode_ratio", "decode_ratio_lo",
    "decode_ratio_hi", "e2e_ratio", "ttft_ratio", "ttft_usable",
    *(f"{s}_{k}" for s in SIDES for k in ("repeats", "decode_wall_s", "decode_tok_s", "e2e_tok_s", "itl_token_ms",
                                          "itl_chunk_ms", "tokens_per_chunk", "ttft_ms", "words")),
]


def timed_view(cells: pd.DataFrame) -> pd.DataFrame:
    """The timed cells as the report lists them: lane, prompt, where the timed requests come from, common tokens,
    the ratio and its interval, each side's decode rate, decode wall and repeats."""
    cols = ["lane", "prompt", "timed on", "tokens", "ratio", "interval", "ours tok/s", "oracle tok/s",
            "ours wall (s)", "oracle wall (s)", "repeats"]
    t = cells[cells["timed"].astype(bool)] if len(cells) else cells
    rows = [{"lane": r.lane, "prompt": r.prompt, "timed on": "re-run" if r.source == RE_RUN else "own requests",
             "tokens": int(r.common_tokens), "ratio": r.decode_ratio,
             "interval": f"[{r.decode_ratio_lo:.3g}, {r.decode_ratio_hi:.3g}]" if r.decode_ratio_lo == r.decode_ratio_lo
             else "-", "ours tok/s": r.ours_decode_tok_s, "oracle tok/s": r.oracle_decode_tok_s,
             "ours wall (s)": r.ours_decode_wall_s, "oracle wall (s)": r.oracle_decode_wall_s,
             "repeats": f"{int(r.ours_repeats)} / {int(r.oracle_repeats)}"} for r in t.itertuples(index=False)]
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------------------------------
# per lane


def geo_interval(values: Any, ci: float) -> tuple[float, float, float]:
    """Geometric mean with the t interval of the mean log (df n - 1; NaN bounds with one value)."""
    logs = np.log(np.asarray(list(values), float))
    logs = logs[np.isfinite(logs)]
    if len(logs) == 0:
        return math.nan, math.nan, math.nan
    mean, lo, hi = stats.mean_t_interval(logs, ci)
    return float(np.exp(mean)), float(np.exp(lo)), float(np.exp(hi))


def _geo(values: Any) -> float:
    return geo_interval(values, 0.95)[0]


REASON_KINDS = (  # (words in a why_not_timed text, how the count names them: one, more)
    ("common token", "under the common-token minimum", "under the common-token minimum"),
    ("decode wall", "with a decode wall too short to time", "with a decode wall too short to time"),
    ("loop", "loop or off-task output", "loops or off-task outputs"),
    ("task", "loop or off-task output", "loops or off-task outputs"),
    ("re-run", "without an equal re-run", "without an equal re-run"),
)


def reason_counts(not_timed: pd.Series) -> str:
    """'7 loops or off-task outputs, 9 under the common-token minimum' from the why_not_timed texts."""
    kinds: dict[tuple[str, str], int] = {}
    for why in not_timed:
        kind = next(((one, more) for words, one, more in REASON_KINDS if words in why),
                    ("with another reason", "with other reasons"))
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{n} {one if n == 1 else more}" for (one, more), n in kinds.items())


HEADLINE_COLUMNS = [
    "lane", "cells", "timed", "decode_ratio", "decode_ratio_lo", "decode_ratio_hi", "e2e_ratio", "e2e_ratio_lo",
    "e2e_ratio_hi", "ours_decode_tok_s", "oracle_decode_tok_s", "ours_itl_token_ms", "oracle_itl_token_ms",
    "min_decode_wall_s", "ttft_cells", "ttft_ratio", "ttft_ratio_lo", "ttft_ratio_hi", "ours_ttft_ms",
    "oracle_ttft_ms", "not_timed",
]


def decode_headline(cells: pd.DataFrame, *, ci: float = 0.95) -> pd.DataFrame:
    """Per lane over its timed cells: the geometric-mean decode-rate ratio (ours / oracle) with its interval
    (t on the log ratios over cells; one cell: that cell's own interval), the end-to-end ratio on the same
    requests, each side's geometric-mean decode rate and ITL per token, the shortest decode wall; TTFT over
    every usable cell; what the other cells were left out for."""
    rows = []
    for lane, g in cells.groupby("lane", sort=False):
        t = g[g["timed"]]
        row: dict[str, Any] = {"lane": lane, "cells": len(g), "timed": len(t)}
        if len(t) == 1:
            row.update(decode_ratio=float(t["decode_ratio"].iloc[0]), decode_ratio_lo=float(t["decode_ratio_lo"].iloc[0]),
                       decode_ratio_hi=float(t["decode_ratio_hi"].iloc[0]))
        else:
            r = geo_interval(t["decode_ratio"], ci)
            row.update(decode_ratio=r[0], decode_ratio_lo=r[1], decode_ratio_hi=r[2])
        e = geo_interval(t["e2e_ratio"], ci)
        row.update(e2e_ratio=e[0], e2e_ratio_lo=e[1], e2e_ratio_hi=e[2])
        for s in SIDES:
            row[f"{s}_decode_tok_s"] = _geo(t[f"{s}_decode_tok_s"])
            row[f"{s}_itl_token_ms"] = _geo(t[f"{s}_itl_token_ms"])
        walls = t[[f"{s}_decode_wall_s" for s in SIDES]].to_numpy(float)
        row["min_decode_wall_s"] = float(np.nanmin(walls)) if walls.size else math.nan
        u = g[g["ttft_usable"].astype(bool)]
        tt = geo_interval(u["ttft_ratio"], ci)
        row.update(ttft_cells=len(u), ttft_ratio=tt[0], ttft_ratio_lo=tt[1], ttft_ratio_hi=tt[2],
                   ours_ttft_ms=_geo(u["ours_ttft_ms"]), oracle_ttft_ms=_geo(u["oracle_ttft_ms"]),
                   not_timed=reason_counts(g.loc[~g["timed"], "why_not_timed"]))
        rows.append(row)
    return pd.DataFrame(rows, columns=HEADLINE_COLUMNS)


def headline_texts(cells: pd.DataFrame) -> pd.DataFrame:
    """The timed cells' prompts with the first words of both outputs (one row per prompt; the lanes it is timed
    in, and its common tokens per lane)."""
    t = cells[cells["timed"]]
    rows = []
    for prompt, g in t.groupby("prompt", sort=False):
        first = g.iloc[0]
        rows.append({"prompt": prompt, "timed in": ", ".join(f"{r.lane} ({r.common_tokens})" for r in g.itertuples()),
                     "ours, first words": first["ours_words"], "oracle, first words": first["oracle_words"]})
    return pd.DataFrame(rows, columns=["prompt", "timed in", "ours, first words", "oracle, first words"])


# --------------------------------------------------------------------------------------------------
# why


def verdict_word(lo: float, hi: float, faster: str, slower: str, undecided: str) -> str:
    """The word an interval of a ratio allows: above 1 all through, below 1 all through, or neither."""
    if lo == lo and lo > 1:
        return faster
    if hi == hi and hi < 1:
        return slower
    return undecided


def target_size(model: str) -> str:
    """'a 135M target' from a model name that says its size ('smollm2-135m-instruct'); 'this target' else."""
    m = re.search(r"(?<![a-z0-9])(\d+(?:\.\d+)?)([mb])(?![a-z0-9])", str(model).lower())
    return f"a {m.group(1)}{m.group(2).upper()} target" if m else "this target"


def speculation_effect(requests: pd.DataFrame, strict: pd.DataFrame, *, ci: float = 0.95) -> pd.DataFrame:
    """Per side x speculative lane: that engine's decode rate with speculation over its own rate with it off,
    on the same prompts (geometric mean over prompts timed in both, t interval); loops, off-task outputs and
    cells with failed requests left out (a loop is trivially draftable)."""
    out_of = {(r.lane, r.prompt) for r in strict.itertuples(index=False) if exclusion(_flags(r.flags))}
    rates: dict[tuple[str, str, str], float] = {}
    for (side, lane, prompt), g in requests.groupby(["side", "lane", "prompt"], sort=False):
        if (lane, prompt) in out_of or (OFF_LANE, prompt) in out_of:
            continue
        rates[(side, lane, prompt)] = side_figures(g)["decode_tok_s"]
    rows = []
    for side in SIDES:
        lanes = list(dict.fromkeys(lane for s, lane, _ in rates if s == side and lane != OFF_LANE))
        for lane in lanes:
            pairs = [rates[(side, lane, p)] / rates[(side, OFF_LANE, p)] for s, ln, p in rates
                     if s == side and ln == lane and (side, OFF_LANE, p) in rates]
            if not pairs:  # no off lane in the run (or none of its prompts kept): nothing to compare against
                continue
            r = geo_interval(pairs, ci)
            rows.append({"side": side, "lane": lane, "prompts": len(pairs), "vs_off": r[0], "vs_off_lo": r[1],
                         "vs_off_hi": r[2]})
    return pd.DataFrame(rows, columns=["side", "lane", "prompts", "vs_off", "vs_off_lo", "vs_off_hi"])


NO_SPECULATION_EFFECT = ("no prompt was timed both in a speculative lane and in the off lane of the same engine (the "
                         "run has no off lane, or the guards kept none): nothing to set speculation against")


def speculation_verdict(effect: pd.DataFrame) -> str:
    """'SLOWER THAN OFF ON BOTH ENGINES' only where every engine x lane interval lies below 1 (and the like)."""
    if effect.empty:
        return "NOT MEASURED"
    if (effect["vs_off_hi"] < 1).all():
        return "SLOWER THAN OFF ON BOTH ENGINES"
    if (effect["vs_off_lo"] > 1).all():
        return "FASTER THAN OFF ON BOTH ENGINES"
    return "MIXED OR UNDECIDED"


def speculation_why(effect: pd.DataFrame, labels: dict[str, str], model: str) -> str:
    """One sentence: what speculation does to each engine's decode rate here, and what follows for the lanes."""
    if effect.empty:
        return ""
    verdict = speculation_verdict(effect)
    size = target_size(model)
    if verdict.startswith("SLOWER"):
        return (f"speculation is slower than no speculation on both engines here: drafting does not pay for {size}, "
                "so the speculative lanes' ratios compare whose speculation hurts less")
    if verdict.startswith("FASTER"):
        return f"speculation is faster than no speculation on both engines here: drafting pays for {size}"
    helped = [f"{labels.get(r.side, r.side)} {r.lane}" for r in effect.itertuples() if r.vs_off_lo > 1]
    hurt = [f"{labels.get(r.side, r.side)} {r.lane}" for r in effect.itertuples() if r.vs_off_hi < 1]
    if not helped and not hurt:
        return ("whether speculation pays here is not decided: no engine x lane interval lies wholly above or "
                "below 1")
    parts = ([f"faster than off: {', '.join(helped)}"] if helped else []) + (
        [f"slower than off: {', '.join(hurt)}"] if hurt else [])
    return "speculation does not act alike on every engine and lane here (" + "; ".join(parts) + ")"


def lane_why(h: Any, per_step: dict[str, float], labels: dict[str, str], lane: str) -> str:
    """Why one lane's decode ratio is what it is: decode rate = tokens per step / time per step, with each
    side's tokens per step (`tokens_per_step`; 1 with speculation off) and ITL per token from the timed cells."""
    a, b = labels["ours"], labels["oracle"]
    ta, tb = h.ours_itl_token_ms, h.oracle_itl_token_ms
    if not (ta == ta and tb == tb) or ta <= 0 or tb <= 0:
        return ""
    faster = a if ta < tb else b
    if lane == OFF_LANE:
        return f"one token per step with speculation off, so it is the step-time ratio: {ta:.3g} vs {tb:.3g} ms per token"
    na, nb = per_step.get("ours", math.nan), per_step.get("oracle", math.nan)
    if not (na == na and nb == nb):
        return f"{faster} spends less time per decoded token: {ta:.3g} vs {tb:.3g} ms"
    step_a, step_b = ta * na, tb * nb
    steps = f"{na:.2f} vs {nb:.2f} tokens per step, {step_a:.3g} vs {step_b:.3g} ms per step"
    other = b if faster == a else a
    more_tokens = (na > nb) == (faster == a)  # the faster side emits more tokens per step
    shorter = (step_a < step_b) == (faster == a)  # the faster side's steps are shorter
    if more_tokens and shorter:
        return f"{faster} emits more tokens per step and its steps are shorter: {steps}"
    if more_tokens:
        return f"{faster}'s steps are longer, but it emits enough more tokens per step to decode faster: {steps}"
    return f"{other} emits more tokens per step, but {faster}'s steps are shorter: {steps}"


def ttft_why(h: Any, labels: dict[str, str], setup_diffs: list[str], prompt_tokens: float) -> str:
    """TTFT: prefill plus each server's request path, not decode work; a differing process count named."""
    procs = [d.removeprefix("server processes: ") for d in setup_diffs if d.startswith("server processes")]
    size = f" of ~{prompt_tokens:.0f} tokens" if prompt_tokens == prompt_tokens else ""
    path = f" ({procs[0]} processes)" if procs else ""
    return f"the prompt's prefill{size} and the request path{path}; not decode work"


def speculation_figure(effect: pd.DataFrame, labels: dict[str, str]) -> str:
    """'decode rate vs its own off lane: llamacpp ngram 0.87x, draft-int4 0.25x; vllm ngram 0.46x, ...'"""
    parts = []
    for side, g in effect.groupby("side", sort=False):
        parts.append(f"{labels.get(side, side)} " + ", ".join(f"{r.lane} {r.vs_off:.2f}x" for r in g.itertuples()))
    return "decode rate against the engine's own off lane: " + "; ".join(parts)


def tokens_per_step(requests: pd.DataFrame, cell_counts: pd.DataFrame, cells: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per lane, each side's decode tokens per step over its timed prompts' timed requests: each step emits its
    accepted drafts and one token of the target's, so steps = decode tokens - accepted drafts (counters); a step
    that drafted nothing counts too (an ngram lookup that found no match), which AL, over drafting steps only,
    leaves out. An equal-work re-run keeps no counters: its prompt's full-length cell stands in."""
    out: dict[str, dict[str, float]] = {}
    if cell_counts.empty or cells.empty or "accepted_tokens" not in cell_counts:
        return out
    ok = answered(requests)
    for lane, g in cells[cells["timed"]].groupby("lane", sort=False):
        prompts = set(g["prompt"])
        for side in SIDES:
            rows = ok[(ok["lane"] == lane) & (ok["side"] == side) & ok["prompt"].isin(prompts)]
            counts = cell_counts[(cell_counts["lane"] == lane) & (cell_counts["side"] == side)
                                 & cell_counts["prompt"].isin(prompts)]
            decode = float((rows["completion_tokens"] - 1).clip(lower=0).sum())
            steps = decode - float(counts["accepted_tokens"].fillna(0).sum())
            if decode > 0 and steps > 0:
                out.setdefault(lane, {})[side] = decode / steps
    return out


def timing_note(cells: pd.DataFrame, spec: TimingSpec) -> str:
    """What the timed figures rest on, from the data: repeats a side and decode walls of the timed cells."""
    t = cells[cells["timed"]]
    if t.empty:
        return ""
    reps = pd.concat([t["ours_repeats"], t["oracle_repeats"]]).astype(int)
    walls = pd.concat([t["ours_decode_wall_s"], t["oracle_decode_wall_s"]]).astype(float)
    rep = f"{reps.min()}" if reps.min() == reps.max() else f"{reps.min()} to {reps.max()}"
    return (f"{rep} timed repeat{'s' if reps.max() != 1 else ''} a side per timed cell; decode walls {walls.min():.2f} to {walls.max():.2f} s a "
            f"side (minimum {spec.min_timed_wall_s:g} s)")
