"""Figures for the reports, drawn from frames the analysis computed: no arithmetic here (no means, no
quartiles, no error bars computed by the plotting library).

One arm, one colour: every per-arm figure of a report takes the same `palette` (`arm_palette` of the report's
arms, the baseline first), so an arm is never green in one plot and red in the next.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# No backend is forced: Jupyter kernels use their inline backend (figures land in the report), and
# matplotlib falls back to Agg by itself where there is no display.
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter

sns.set_theme(style="whitegrid", context="notebook")

BASELINE_COLOR = "#3b3b3b"
# tab10 without its grey (the baseline's) in its own order: the arms after the baseline take them in turn
ARM_COLORS = ("tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan",
              "tab:blue")
SWEEP_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def arm_palette(arms: Iterable[str], baseline: str = "baseline") -> dict[str, str]:
    """arm -> colour: the baseline dark grey, the other arms ARM_COLORS in the order given (cycled)."""
    out: dict[str, str] = {}
    others = [a for a in dict.fromkeys(str(a) for a in arms) if a != baseline]
    if baseline in {str(a) for a in arms}:
        out[baseline] = BASELINE_COLOR
    out.update({a: ARM_COLORS[i % len(ARM_COLORS)] for i, a in enumerate(others)})
    return out


def _palette(palette: Mapping[str, str] | None, arms: Iterable[str]) -> dict[str, str]:
    """The report's palette extended to any arm it lacks (a figure drawn on its own: its arms in order)."""
    arms = [str(a) for a in arms]
    base = dict(palette) if palette else {}
    missing = [a for a in dict.fromkeys(arms) if a not in base]
    if missing:
        extra = arm_palette(list(base) + missing)
        base.update({a: extra[a] for a in missing})
    return base


def al_over_time(intervals: pd.DataFrame, kept: pd.DataFrame, *, col_wrap: int = 4,
                 palette: Mapping[str, str] | None = None):
    """Interval AL against seconds since the run's first interval, one panel per run in its arm's colour; the
    steady window (first to last kept interval) shaded, dropped intervals drawn hollow grey."""
    runs = list(dict.fromkeys(intervals["run_id"]))
    colors = _palette(palette, intervals["arm"].dropna() if "arm" in intervals else [])
    ncols = min(col_wrap, len(runs)) or 1
    nrows = -(-len(runs) // ncols) or 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 2.8 * nrows), sharey=True, squeeze=False)
    kept_lines = set(zip(kept["run_id"], kept["line_no"], strict=False))
    for ax, run_id in zip(axes.flat, runs, strict=False):
        part = intervals[intervals["run_id"] == run_id]
        is_kept = [(run_id, ln) in kept_lines for ln in part["line_no"]]
        steady = part[is_kept]
        arm = part["arm"].iloc[0] if "arm" in part and len(part) else ""
        color = colors.get(str(arm), BASELINE_COLOR)
        if len(steady):
            ax.axvspan(steady["t_s"].min(), steady["t_s"].max(), color=color, alpha=0.10, lw=0)
        ax.plot(part["t_s"], part["al"], color="0.6", lw=0.8)
        ax.scatter(steady["t_s"], steady["al"], s=14, color=color, label="steady")
        dropped = part[[not k for k in is_kept]]
        ax.scatter(dropped["t_s"], dropped["al"], s=14, facecolors="none",
                   edgecolors="0.45", label="dropped")
        ax.set_title(f"{run_id}\n({arm})", fontsize=9)
        ax.set_xlabel("s since first interval")
    for ax in axes.flat[len(runs):]:
        ax.set_visible(False)
    axes.flat[0].set_ylabel("interval AL")
    axes.flat[0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def arm_distribution(run_al: pd.DataFrame, value_col: str, arm_summary: pd.DataFrame, *,
                     palette: Mapping[str, str] | None = None):
    """One point per run per arm in the arm's colour (its marker the sweep's), and each arm's mean from the
    analysis as a pale bar of the same colour."""
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * run_al["arm"].nunique()), 3.6))
    order = list(dict.fromkeys(run_al.sort_values("order")["arm"])) if "order" in run_al else list(arm_summary["arm"])
    colors = _palette(palette, order)
    x = {arm: i for i, arm in enumerate(order)}
    means = arm_summary.set_index("arm")["mean"]
    ax.bar(range(len(order)), [means.get(a, np.nan) for a in order], color=[colors[a] for a in order], alpha=0.25,
           width=0.5, label="arm mean")
    for i, (sweep, part) in enumerate(run_al.groupby("sweep" if "sweep" in run_al else lambda _: 0)):
        marker = SWEEP_MARKERS[i % len(SWEEP_MARKERS)]
        ax.scatter([x[a] for a in part["arm"]], part[value_col], s=40, zorder=3, c=[colors[a] for a in part["arm"]],
                   marker=marker, edgecolors="black", linewidths=0.4)
        # the legend tells the sweeps by marker only: its handle carries no arm's colour
        ax.scatter([], [], s=40, marker=marker, c="white", edgecolors="black", linewidths=0.6, label=f"sweep {sweep}")
    ax.set_xticks(range(len(order)), order)
    lo = float(run_al[value_col].min())
    ax.set_ylim(max(0.0, lo - 0.25 * (float(run_al[value_col].max()) - lo + 0.1)), None)
    ax.set_ylabel(value_col.replace("_", " ") + " (tokens per step)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def cut_sensitivity(sensitivity: pd.DataFrame, *, palette: Mapping[str, str] | None = None):
    """Arm AL as the load cut moves (fraction of the target concurrency that must be running)."""
    arms = sensitivity[sensitivity["scope"] == "arm"]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    colors = _palette(palette, arms["arm"])
    sns.lineplot(data=arms, x="fraction", y="al", hue="arm", hue_order=[a for a in colors if a in set(arms["arm"])],
                 palette=colors, marker="o", ax=ax)
    ax.set_xlabel("min running fraction of target concurrency")
    ax.set_ylabel("AL (mean over runs)")
    fig.tight_layout()
    return fig


def per_position(per_pos: pd.DataFrame, table: pd.DataFrame, *, palette: Mapping[str, str] | None = None):
    """Acceptance rate at each draft position (from 1): each run's points, each arm's mean (the table) as a line."""
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    colors = _palette(palette, table.columns)
    for arm in table.columns:
        ax.plot(table.index, table[arm], marker="o", label=str(arm), color=colors[str(arm)])
        runs = per_pos[per_pos["arm"] == arm]
        ax.scatter(runs["position"], runs["rate"], s=10, color=colors[str(arm)], alpha=0.5)
    ax.set_ylim(0, 1.02)
    ax.set_xticks(list(table.index))
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafts")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def accuracy(acc: pd.DataFrame, *, palette: Mapping[str, str] | None = None):
    """Pooled accuracy per arm with its Wilson interval."""
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(acc)), 3.2))
    colors = _palette(palette, acc["arm"])
    ax.bar(acc["arm"], acc["pooled_accuracy"], color=[colors[str(a)] for a in acc["arm"]], alpha=0.7)
    # Wilson bounds can sit a rounding error past the point estimate at 0 or 1 correct: clip to >= 0.
    low = (acc["pooled_accuracy"] - acc["wilson_low"]).clip(lower=0)
    high = (acc["wilson_high"] - acc["pooled_accuracy"]).clip(lower=0)
    ax.errorbar(acc["arm"], acc["pooled_accuracy"], yerr=[low, high], fmt="none", ecolor="k", capsize=4)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy (pooled over sweeps)")
    fig.tight_layout()
    return fig


def ratio_bars(cells: pd.DataFrame):
    """Cross-engine: one row per lane, one bar per prompt with its CI on a log scale (ratios above and below 1
    alike); cells the guards flagged grey and hatched. Rows keep a readable width however many prompts."""
    lanes = list(dict.fromkeys(cells["lane"])) or [""]
    per_lane = max((int((cells["lane"] == lane).sum()) for lane in lanes), default=1)
    fig, axes = plt.subplots(len(lanes), 1, figsize=(min(16, max(6, 0.45 * per_lane)), 2.8 * len(lanes)),
                             sharey=True, squeeze=False)
    for ax, lane in zip(axes[:, 0], lanes, strict=True):
        part = cells[cells["lane"] == lane]
        x = np.arange(len(part))
        ok = part["comparable"].astype(bool).to_numpy()
        ratio = part["ratio"].to_numpy(dtype=float)
        err = np.vstack([ratio - part["ratio_lo"].to_numpy(dtype=float),
                         part["ratio_hi"].to_numpy(dtype=float) - ratio]).clip(min=0)
        bars = ax.bar(x, ratio, color=["tab:blue" if c else "lightgrey" for c in ok], yerr=np.nan_to_num(err),
                      capsize=2)
        for bar, c in zip(bars, ok, strict=True):
            if not c:
                bar.set_hatch("//")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.set_xticks(x, list(part["prompt"]), fontsize=7, rotation=90)
        ax.set_ylabel("ours / oracle tok/s")
        ax.set_title(f"lane {lane}: {int(ok.sum())} of {len(part)} cells comparable (blue); grey, hatched: flagged",
                     fontsize=9)
    fig.tight_layout()
    return fig


def concurrency_curve(curve: pd.DataFrame, deltas: pd.DataFrame, ci_label: str, *,
                      palette: Mapping[str, str] | None = None):
    """AL and tok/s against concurrency per arm (mean across sweeps, error bars = the analysis' interval),
    and each knob's AL delta vs the baseline against concurrency (estimates per level); log2 x axis."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    colors = _palette(palette, sorted(set(curve["arm"]), key=lambda a: (a != "baseline", a)))
    for ax, metric, ylabel in ((axes[0], "AL", "AL (tokens per draft step)"), (axes[1], "tok/s", "output tok/s")):
        part = curve[curve["metric"] == metric]
        for arm, g in part.groupby("arm", sort=True):
            g = g.sort_values("level")
            ax.errorbar(g["level"], g["mean"], yerr=[g["mean"] - g["ci_low"], g["ci_high"] - g["mean"]],
                        marker="o", capsize=3, label=arm, color=colors[str(arm)])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{metric} vs concurrency ({ci_label})")
        ax.legend()
    d = deltas[deltas["metric"] == "AL"]
    for arm, g in d.groupby("arm", sort=True):
        g = g.sort_values("level")
        axes[2].errorbar(g["level"], g["delta"], yerr=[g["delta"] - g["ci_low"], g["ci_high"] - g["delta"]],
                         marker="o", capsize=3, label=arm, color=colors[str(arm)])
    axes[2].axhline(0, color="0.4", lw=0.8)
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("concurrency (requests in flight)")
    axes[2].set_ylabel("AL minus baseline AL")
    axes[2].set_title("knob effect on AL per level (estimates)" if len(d) else "knob effect on AL: no knob arm")
    if len(d):
        axes[2].legend()
    fig.tight_layout()
    return fig


def per_position_bars(table: pd.DataFrame, *, title: str = "Per-position acceptance"):
    """Position x arm (or x (lane, side)) table of acceptance rates as grouped bars, rate axis 0..1."""
    fig, ax = plt.subplots(figsize=(max(5.5, 0.9 * len(table) * max(1, len(table.columns)) / 2), 3.4))
    table.plot.bar(ax=ax, ylim=(0, 1), rot=0)
    ax.set_xlabel("draft position (from 1)")
    ax.set_ylabel("acceptance rate (accepted / drafts)")
    ax.set_title(title)
    ax.legend(fontsize=8, title=None)
    fig.tight_layout()
    return fig


def al_per_interval(intervals_by_arm: pd.DataFrame):
    """AL of each server-log interval (rows: interval in order, columns: arm), one line per arm."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    intervals_by_arm.plot(marker="o", ax=ax)
    ax.set_xlabel("log interval (in order)")
    ax.set_ylabel("AL (tokens per draft step)")
    ax.set_title("AL per server-log interval")
    fig.tight_layout()
    return fig


def al_by_category(table: pd.DataFrame, *, group: str = "arm", title: str = "AL per task category",
                   palette: Mapping[str, str] | None = None):
    """AL per task category x arm (or x engine side): grouped bars of `al_mean` with the analysis' interval
    (`ci_low`..`ci_high`; none drawn where the cell has one run), categories in the table's order; with a
    palette, each group in its colour."""
    cats = list(dict.fromkeys(table["category"]))
    groups = list(dict.fromkeys(table[group]))
    colors = _palette(palette, groups) if palette is not None else {}
    width = 0.8 / max(1, len(groups))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(cats) * max(1, len(groups)) / 2 + 2), 3.6))
    x = np.arange(len(cats))
    for i, g in enumerate(groups):
        part = table[table[group] == g].set_index("category").reindex(cats)
        lo = (part["al_mean"] - part["ci_low"]).clip(lower=0).fillna(0)
        hi = (part["ci_high"] - part["al_mean"]).clip(lower=0).fillna(0)
        ax.bar(x + (i - (len(groups) - 1) / 2) * width, part["al_mean"], width, yerr=[lo, hi], capsize=3,
               label=str(g), color=colors.get(str(g)))
    ax.set_xticks(x, cats, rotation=20, ha="right")
    ax.set_ylabel("AL (tokens per draft step)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def cost_split_bars(splits: pd.DataFrame):
    """Per-step cost split: one stacked bar per engine x lane (ms per decode step, parts as costsplit
    computed them; a part the engine does not tell apart is absent from its bar). Each bar's label names
    its source: profiler, engine_log or derived."""
    from specbook.measure.costsplit import PART_LABELS, PARTS

    cols = [f"{p}_ms" for p in PARTS if splits[f"{p}_ms"].notna().any()]
    table = splits[cols].rename(columns={c: PART_LABELS[c.removesuffix("_ms")] for c in cols})
    table.index = pd.Index([f"{r.engine} / {r.lane}\n({r.source})" for r in splits.itertuples()])
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(splits) + 3), 4))
    table.plot.bar(stacked=True, ax=ax, rot=0, width=0.7)
    ax.set_ylabel("ms per decode step")
    ax.set_title("Per-step cost split (separate profiled pass)")
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return fig


def decode_ratio_bars(cells: pd.DataFrame, *, ours: str = "ours", oracle: str = "oracle"):
    """Cross-engine decode rate on equal decode work: one panel per lane, one horizontal bar per timed cell
    (ours / oracle decode-rate ratio with the interval the analysis gave it), on a log scale; a lane without a
    timed cell says so."""
    lanes = list(dict.fromkeys(cells["lane"])) or [""]
    timed = cells[cells["timed"].astype(bool)]
    rows = max((int((timed["lane"] == lane).sum()) for lane in lanes), default=1) or 1
    fig, axes = plt.subplots(1, len(lanes), figsize=(4.2 * len(lanes), 0.9 + 0.32 * rows), sharex=True, squeeze=False)
    for ax, lane in zip(axes[0], lanes, strict=True):
        part = timed[timed["lane"] == lane]
        y = np.arange(len(part))
        ratio = part["decode_ratio"].to_numpy(dtype=float)
        err = np.vstack([ratio - part["decode_ratio_lo"].to_numpy(dtype=float),
                         part["decode_ratio_hi"].to_numpy(dtype=float) - ratio]).clip(min=0)
        ax.barh(y, ratio, xerr=np.nan_to_num(err), color="tab:blue", capsize=2, height=0.6)
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.set_yticks(y, list(part["prompt"]), fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"lane {lane}: {len(part)} of {int((cells['lane'] == lane).sum())} cells timed", fontsize=9)
        ax.set_xlabel(f"{ours} / {oracle} decode rate", fontsize=8)
        if part.empty:
            ax.text(0.5, 0.5, "no cell timed", transform=ax.transAxes, ha="center", va="center", fontsize=9)
    fig.tight_layout()
    return fig
