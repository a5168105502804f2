"""Acceptance per task category: per-category windows on one server, their frame, and the per-category
tables every experiment reports (AL per category and arm with its interval, the knob's delta per category).

Measuring: `measure_by_category` sends one category after another on the same server, each in its own
window (snapshot, that category's requests, flush, snapshot), so each category's counter delta is its
own; the windows' deltas add up to the whole run's, which `CategoryWindows.whole` returns as one Window
(what an experiment measured before categories). One category is exactly one `Server.measure` call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from specbook.core.acceptance import Acceptance

if TYPE_CHECKING:
    from specbook.measure.harness import Server, Window
    from specbook.serve.client import ChatRequest
    from specbook.serve.metrics import CounterDelta

CATEGORY = "category"
COUNTER = "counter_"  # prefix of a window's counter-delta counts, as the runs frames use


def by_category(requests: Sequence[ChatRequest]) -> list[tuple[str, list[ChatRequest]]]:
    """The requests grouped by category, categories in first-appearance order (a request without one: '')."""
    groups: dict[str, list[ChatRequest]] = {}
    for r in requests:
        groups.setdefault(r.category or "", []).append(r)
    return list(groups.items())


def _sum_optional(values: Sequence[int | None]) -> int | None:
    return None if any(v is None for v in values) else int(sum(v for v in values if v is not None))


def merge_counters(parts: Sequence[CounterDelta]) -> CounterDelta:
    """The counter delta of consecutive windows taken together (a counter one window lacks: None)."""
    from specbook.serve.metrics import CounterDelta

    reasons: dict[str, int] = {}
    for p in parts:
        for k, v in p.requests_by_finish_reason.items():
            reasons[k] = reasons.get(k, 0) + v
    intervals = [p.interval_s for p in parts]
    return CounterDelta(
        acceptance=Acceptance.total([p.acceptance for p in parts]),
        generation_tokens=_sum_optional([p.generation_tokens for p in parts]),
        prompt_tokens=_sum_optional([p.prompt_tokens for p in parts]),
        requests_succeeded=_sum_optional([p.requests_succeeded for p in parts]),
        requests_by_finish_reason=reasons,
        interval_s=None if any(v is None for v in intervals) else float(sum(intervals)),  # type: ignore[arg-type]
    )


@dataclass
class CategoryWindows:
    """One measured window per category, in the order sent."""

    windows: list[tuple[str, Window]]

    @property
    def whole(self) -> Window:
        """All categories as one window: records in order, request time and counter deltas summed, the log
        from the first window's start to the last one's end."""
        from specbook.measure.harness import Window

        if len(self.windows) == 1:
            return self.windows[0][1]
        ws = [w for _, w in self.windows]
        first = ws[0]
        return Window(first.server, [r for w in ws for r in w.records], sum(w.wall_s for w in ws),
                      merge_counters([w.counters for w in ws]), first.log_path, first.log_start, ws[-1].log_end,
                      first.engine)

    def frame(self) -> pd.DataFrame:
        """One row per category window: its requests, tokens, time and counter-delta counts."""
        return category_frame(self.windows)


def category_frame(windows: Sequence[tuple[str, Window]]) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for order, (category, w) in enumerate(windows):
        rows.append({
            CATEGORY: category, "window": order, "n_requests": len(w.records),
            "n_errors": sum(1 for r in w.records if r.error is not None),
            "completion_tokens": w.completion_tokens, "wall_s": w.wall_s, "tok_s": w.tok_s,
            **w.acceptance.counts(COUNTER)})
    return pd.DataFrame(rows)


def measure_by_category(server: Server, requests: Sequence[ChatRequest], *, concurrency: int = 1,
                        flush_wait_s: float = 0.0, **measure_kwargs: Any) -> CategoryWindows:
    """One `server.measure` window per category (first-appearance order) on the same server."""
    return CategoryWindows([
        (category, server.measure(part, concurrency=concurrency, flush_wait_s=flush_wait_s, **measure_kwargs))
        for category, part in by_category(requests)])


# --- analysis ------------------------------------------------------------------------------------------


def with_al(frame: pd.DataFrame) -> pd.DataFrame:
    """The per-category frame with each window's counter AL (`al`)."""
    out = frame.copy()
    out["al"] = [Acceptance.from_row(r, COUNTER).al for _, r in out.iterrows()] if len(out) else []
    return out


def al_by_category_arm(frame: pd.DataFrame, ci: float = 0.95) -> pd.DataFrame:
    """Per (category, arm): runs, mean AL over runs and its t interval (df n - 1; none with one run), the
    pooled counter AL over all that cell's windows beside it. `frame`: one row per (run, category) with
    `arm` and the counter counts."""
    from specbook.core import stats

    rows = []
    for (category, arm), part in with_al(frame).groupby([CATEGORY, "arm"], sort=False):
        mean, lo, hi = stats.mean_t_interval(part["al"].to_numpy(float), ci)
        pooled = Acceptance.total([Acceptance.from_row(r, COUNTER) for _, r in part.iterrows()]).al
        rows.append({CATEGORY: category, "arm": arm, "runs": len(part), "al_mean": mean, "ci_low": lo,
                     "ci_high": hi, "al_pooled": pooled, "requests": int(part["n_requests"].sum()),
                     "ci_method": f"t interval of the mean over runs (df {len(part) - 1})" if len(part) > 1
                     else "one run: no interval"})
    return pd.DataFrame(rows)


def delta_by_category(frame: pd.DataFrame, baseline: str, *, margin_pct: float = 1.0,
                      ci: float = 0.95) -> pd.DataFrame:
    """Per category and variant arm: the delta of per-run AL against the baseline with its interval, by the
    same method as the headline delta (`stats.delta_vs_baseline`: paired t by sweep where every sweep has
    both arms, else Welch). Categories where an arm has no run are left out."""
    from specbook.core import stats

    parts = []
    for category, part in with_al(frame).groupby(CATEGORY, sort=False):
        if baseline not in set(part["arm"]) or part["arm"].nunique() < 2:
            continue
        d = stats.delta_vs_baseline(part, "arm", "al", baseline, margin_pct=margin_pct, ci=ci,
                                    sweep_col="sweep" if "sweep" in part else None)
        d.insert(0, CATEGORY, category)
        parts.append(d)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def cross_engine_by_category(cells: pd.DataFrame, acceptance_counts: pd.DataFrame, category_of: dict[str, str],
                             headline: Any) -> pd.DataFrame:
    """Cross-engine per lane x task category: the tok/s ratio over that category's comparable cells (by the
    experiment's own `headline`: geometric mean with its t interval), and each side's AL pooled from the
    cells' counter counts. `cells`: one row per lane x prompt (cell_table); `acceptance_counts`: one row per
    side x lane x prompt with the acceptance model's counts; prompts without a category are left out."""
    if not category_of:
        return pd.DataFrame()
    parts = []
    cells = cells.assign(category=cells["prompt"].map(category_of)).dropna(subset=["category"])
    counts = acceptance_counts.assign(category=acceptance_counts["prompt"].map(category_of))
    for category, group in cells.groupby("category", sort=False):
        h = headline(group.drop(columns="category")).rename(columns={"cells": "cells_in_category"})
        h.insert(1, CATEGORY, category)
        for side, part in counts[counts["category"] == category].groupby("side", sort=False):
            for lane in h["lane"]:
                rows = part[part["lane"] == lane]
                acc = Acceptance.total([Acceptance.from_row(r) for _, r in rows.iterrows()])
                h.loc[h["lane"] == lane, f"{side}_al"] = acc.al if acc.has_drafts else float("nan")
        parts.append(h)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
