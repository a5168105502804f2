"""specbook.report.plots: one colour per arm in every knob A/B and concurrency-curve figure of a report."""

from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from specbook.experiments import knob_ab  # noqa: E402
from specbook.report import plots  # noqa: E402
from specbook.store.runstore import RunContext  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def test_the_palette_gives_the_baseline_grey_and_each_arm_its_own_colour_in_order():
    p = plots.arm_palette(["baseline", "fp32", "int4draft", "fp32+int4draft"])
    assert p["baseline"] == plots.BASELINE_COLOR
    assert [p[a] for a in ("fp32", "int4draft", "fp32+int4draft")] == list(plots.ARM_COLORS[:3])
    assert plots.arm_palette(["int4draft", "baseline"]) == {"baseline": plots.BASELINE_COLOR,
                                                            "int4draft": plots.ARM_COLORS[0]}


@pytest.fixture(scope="module")
def golden_result(tmp_path_factory):
    folder = tmp_path_factory.mktemp("golden") / "knob_ab"
    shutil.copytree(GOLDEN / "knob_ab", folder)
    params = knob_ab.load_params_file(str(folder / "params.yaml"))
    return knob_ab.analyze(knob_ab.load(RunContext.from_run_dir(folder)), params)


def _colors(fig) -> dict[str, str]:
    """label -> colour of every labelled line, bar or point collection in a figure."""
    out = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                out[line.get_label()] = to_hex(line.get_color())
        for coll in ax.collections:
            if not coll.get_label().startswith("_") and len(coll.get_facecolors()):
                out.setdefault(coll.get_label(), to_hex(coll.get_facecolors()[0]))
        for cont in ax.containers:
            if not cont.get_label().startswith("_") and len(cont.patches):
                out.setdefault(cont.get_label(), to_hex(cont.patches[0].get_facecolor()))
    return out


def test_every_knob_ab_figure_draws_an_arm_in_its_palette_colour(golden_result):
    r = golden_result
    palette = plots.arm_palette(r.arms)
    want = {a: to_hex(c) for a, c in palette.items()}
    figs = {
        "per position": plots.per_position(r.per_position, r.per_position_table, palette=palette),
        "cut sensitivity": plots.cut_sensitivity(r.steady.sensitivity, palette=palette),
    }
    for name, fig in figs.items():
        got = {k: v for k, v in _colors(fig).items() if k in want}
        assert set(got) == set(r.arms) and all(got[a] == want[a] for a in got), (name, got, want)
        plt.close(fig)
    fig = plots.accuracy(r.accuracy, palette=palette)
    ax = fig.axes[0]
    bars = {t.get_text(): to_hex(p.get_facecolor()) for t, p in zip(ax.get_xticklabels(), ax.patches, strict=False)}
    assert bars == {a: want[a] for a in r.accuracy["arm"]}
    plt.close(fig)
    fig = plots.arm_distribution(r.decision.run_al, r.decision.value_col, r.decision.arm_summary, palette=palette)
    points = [c for c in fig.axes[0].collections if len(c.get_offsets())]
    # each sweep's points: one per arm, coloured by arm; the legend's sweep markers carry no arm's colour
    order = list(dict.fromkeys(r.decision.run_al.sort_values("order")["arm"]))
    assert len(points) == r.decision.run_al["sweep"].nunique()
    for coll in points:
        assert {to_hex(c) for c in coll.get_facecolors()} == set(want.values())
    handles = fig.axes[0].get_legend().legend_handles
    assert {to_hex(h.get_facecolor()[0]) for h in handles if hasattr(h, "get_offsets")} == {"#ffffff"}
    assert [to_hex(p.get_facecolor()) for p in fig.axes[0].patches[: len(order)]] == [want[a] for a in order]
    plt.close(fig)
    fig = plots.al_over_time(r.steady.intervals, r.steady.result.kept, palette=palette)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        arm = ax.get_title().split("(")[-1].rstrip(")")
        steady = ax.collections[0]
        assert to_hex(steady.get_facecolors()[0]) == want[arm]
    plt.close(fig)


def test_the_curve_draws_each_arm_in_one_colour_in_all_three_panels():
    import pandas as pd

    curve = pd.DataFrame([{"arm": a, "level": lv, "metric": m, "mean": 1.0, "ci_low": 0.9, "ci_high": 1.1}
                          for a in ("baseline", "int4draft") for lv in (1, 2) for m in ("AL", "tok/s")])
    deltas = pd.DataFrame([{"arm": "int4draft", "level": lv, "metric": "AL", "delta": -1.0, "ci_low": -1.1,
                            "ci_high": -0.9} for lv in (1, 2)])
    palette = plots.arm_palette(["baseline", "int4draft"])
    fig = plots.concurrency_curve(curve, deltas, "95% t interval", palette=palette)
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_label() in palette:
                assert to_hex(line.get_color()) == to_hex(palette[line.get_label()])
    assert to_hex(fig.axes[2].get_lines()[0].get_color()) == to_hex(palette["int4draft"])
    plt.close(fig)
