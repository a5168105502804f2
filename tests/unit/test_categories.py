"""Per-category acceptance: windows merged into the whole run, the per-category frame, AL per category and
arm with its interval, the knob's delta per category, the knob A/B analysis and its plot (synthetic frames)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from specbook.core.acceptance import Acceptance
from specbook.measure import categories
from specbook.measure.harness import Window
from specbook.report import plots
from specbook.serve.client import ChatRequest, RequestRecord
from specbook.serve.metrics import CounterDelta


def acc(drafts, draft_tokens, accepted, per_pos) -> Acceptance:
    return Acceptance(source="counter delta", drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
                      accepted_per_position=tuple(per_pos))


def window(cat: str, a: Acceptance, tokens: int, wall: float, start: int, end: int, gen: int | None) -> Window:
    recs = [RequestRecord(prompt_id=f"{cat}-{i}", category=cat, completion_tokens=tokens // 2) for i in range(2)]
    return Window("srv", recs, wall, CounterDelta(a, generation_tokens=gen, prompt_tokens=10, requests_succeeded=2,
                                                   requests_by_finish_reason={"stop": 2}),
                  None, start, end, engine=None)  # type: ignore[arg-type]


def test_by_category_keeps_first_appearance_order():
    reqs = [ChatRequest(prompt_id=str(i), prompt="x", category=c) for i, c in enumerate(["qa", "rag", "qa", None])]
    assert [(c, [r.prompt_id for r in rs]) for c, rs in categories.by_category(reqs)] == [
        ("qa", ["0", "2"]), ("rag", ["1"]), ("", ["3"])]


def test_windows_add_up_to_the_whole_run():
    a, b = acc(10, 30, 12, [8, 3, 1]), acc(5, 15, 9, [5, 3, 1])
    cw = categories.CategoryWindows([("qa", window("qa", a, 40, 2.0, 100, 250, 52)),
                                     ("rag", window("rag", b, 20, 1.0, 300, 420, None))])
    whole = cw.whole
    assert whole.acceptance.counts() == (a + b).counts()
    assert whole.acceptance.al == pytest.approx(1 + 21 / 15)
    assert whole.wall_s == 3.0 and whole.completion_tokens == 60 and (whole.log_start, whole.log_end) == (100, 420)
    assert [r.prompt_id for r in whole.records] == ["qa-0", "qa-1", "rag-0", "rag-1"]
    assert whole.counters.generation_tokens is None  # one window lacked the counter: the sum is unknown
    assert whole.counters.requests_succeeded == 4 and whole.counters.requests_by_finish_reason == {"stop": 4}
    frame = cw.frame()
    assert list(frame["category"]) == ["qa", "rag"] and list(frame["window"]) == [0, 1]
    assert frame["counter_accepted_tokens"].sum() == whole.acceptance.accepted_tokens
    assert list(frame["tok_s"]) == [20.0, 20.0]
    one = categories.CategoryWindows([("gsm8k", window("gsm8k", a, 40, 2.0, 0, 9, 52))])
    assert one.whole is one.windows[0][1]  # one category: exactly the plain window


def synthetic(seed: int = 0) -> pd.DataFrame:
    """3 sweeps x 2 arms x 2 categories: the knob lowers rag's AL by about 0.5 and leaves qa alone."""
    rng = np.random.default_rng(seed)
    rows = []
    for sweep in range(3):
        for arm in ("baseline", "knob"):
            for cat, al in (("qa", 2.0), ("rag", 3.0)):
                al = al - (0.5 if (arm == "knob" and cat == "rag") else 0) + rng.normal(0, 0.02)
                drafts = 100
                rows.append({"run_id": f"{sweep}-{arm}", "sweep": sweep, "arm": arm, "category": cat,
                             "n_requests": 4, "counter_drafts": drafts, "counter_draft_tokens": 3 * drafts,
                             "counter_accepted_tokens": round((al - 1) * drafts)})
    return pd.DataFrame(rows)


def test_al_per_category_and_arm_with_t_intervals():
    frame = synthetic()
    table = categories.al_by_category_arm(frame)
    assert list(zip(table["category"], table["arm"], strict=True)) == [
        ("qa", "baseline"), ("rag", "baseline"), ("qa", "knob"), ("rag", "knob")]
    cell = frame[(frame["category"] == "rag") & (frame["arm"] == "knob")]
    als = 1 + cell["counter_accepted_tokens"] / cell["counter_drafts"]
    row = table[(table["category"] == "rag") & (table["arm"] == "knob")].iloc[0]
    half = 4.302653 * als.std(ddof=1) / math.sqrt(3)  # t(0.975, df 2)
    assert row["al_mean"] == pytest.approx(als.mean()) and row["runs"] == 3 and row["requests"] == 12
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((als.mean() - half, als.mean() + half), rel=1e-5)
    assert row["ci_method"] == "t interval of the mean over runs (df 2)"
    one = categories.al_by_category_arm(frame[frame["sweep"] == 0])
    assert one["ci_low"].isna().all() and set(one["ci_method"]) == {"one run: no interval"}


def test_delta_per_category_finds_the_category_the_knob_moves():
    d = categories.delta_by_category(synthetic(), "baseline").set_index("category")
    assert d.loc["rag", "delta_abs"] == pytest.approx(-0.5, abs=0.05)
    assert d.loc["rag", "ci_high"] < 0  # the interval excludes 0 where the knob moved AL
    assert d.loc["qa", "ci_low"] < 0 < d.loc["qa", "ci_high"]
    assert d.loc["rag", "paired"]  # every sweep has both arms: paired by sweep, as the headline
    assert categories.delta_by_category(synthetic()[lambda f: f["arm"] == "knob"], "baseline").empty


def test_plot_draws_one_bar_per_category_and_arm():
    fig = plots.al_by_category(categories.al_by_category_arm(synthetic()))
    assert len(fig.axes[0].patches) == 4
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["qa", "rag"]


def test_knob_ab_analysis_reports_al_per_category_and_arm():
    from test_knob_ab import make_data, params  # the knob A/B's synthetic runs (tests/unit/test_knob_ab.py)

    from specbook.experiments import knob_ab

    p = params()
    data = make_data(p)
    rows = []
    for _, run in data.runs.iterrows():  # two category windows per run: rag's AL 0.3 under qa's
        for cat, al in (("qa", 2.2), ("rag", 1.9)):
            rows.append({"run_id": run["run_id"], "sweep": run["sweep"], "category": cat, "n_requests": 3,
                         "counter_drafts": 100, "counter_draft_tokens": 300,
                         "counter_accepted_tokens": round((al - 1) * 100) - (20 if "int4" in run["declared_arm"] else 0)})
    data.categories = pd.DataFrame(rows)
    res = knob_ab.analyze(data, p)
    table = res.category_al.set_index(["category", "arm"])
    assert table.loc[("rag", "baseline"), "al_mean"] == pytest.approx(1.9)
    assert table.loc[("qa", "int4"), "al_mean"] == pytest.approx(2.0)
    assert set(table.index.get_level_values("arm")) == {a.name for a in p.arms()}
    delta = res.category_delta.set_index(["category", "arm"])
    assert delta.loc[("rag", "int4"), "delta_abs"] == pytest.approx(-0.2)
    assert delta.loc[("qa", "fp32"), "delta_abs"] == pytest.approx(0.0)
    data.categories = pd.DataFrame()  # saved before categories, or one category: no per-category tables
    assert knob_ab.analyze(data, p).category_al.empty


def test_cross_engine_ratio_and_al_per_category():
    from specbook.experiments.cross_engine import headline

    cells = pd.DataFrame({
        "lane": ["draft"] * 3, "prompt": ["p1", "p2", "p3"], "ratio": [2.0, 8.0, 3.0], "ratio_lo": [1.5, 6.0, 2.0],
        "ratio_hi": [2.5, 10.0, 4.0], "comparable": [True, True, True]})
    counts = pd.DataFrame([
        {"side": side, "lane": "draft", "prompt": p, "drafts": 10, "draft_tokens": 40, "accepted_tokens": acc}
        for side, per in (("ours", {"p1": 10, "p2": 30, "p3": 20}), ("oracle", {"p1": 12, "p2": 28, "p3": 20}))
        for p, acc in per.items()])
    table = categories.cross_engine_by_category(cells, counts, {"p1": "qa", "p2": "qa", "p3": "rag"}, headline)
    qa = table[table["category"] == "qa"].iloc[0]
    assert qa["ratio"] == pytest.approx(4.0) and qa["comparable"] == 2  # geometric mean of 2 and 8
    assert qa["ours_al"] == pytest.approx(1 + 40 / 20) and qa["oracle_al"] == pytest.approx(1 + 40 / 20)
    rag = table[table["category"] == "rag"].iloc[0]
    assert (rag["ratio"], rag["ratio_lo"], rag["ratio_hi"]) == (3.0, 2.0, 4.0)  # one cell: its own interval
    assert rag["ours_al"] == pytest.approx(3.0)
    assert categories.cross_engine_by_category(cells, counts, {}, headline).empty
