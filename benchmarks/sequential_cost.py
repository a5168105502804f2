"""Cost to a verdict: adaptive sweeps (specbook.experiments.knob_ab.sequential) against a fixed protocol, on recorded per-run ALs.

Prints, for each recorded knob A/B and each scenario, the probability of each verdict, the expected
sweeps, runs and server-minutes to a verdict, fixed protocol beside the sequential one. Goal: the same
error rates at one third of the fixed protocol's cost or less.

- Cost unit: one eval = one run of one arm, a fresh server serving the workload once (what gives one
  per-run AL; its cost is the recorded ready_s + wall_s). The fixed protocol is 6 evals x 5 sweeps per
  arm: 30 runs per arm, judged once on the 5 sweep means (each the mean of its sweep's 6 evals). The
  sequential protocol runs one eval per arm per sweep and looks after each sweep from --sweeps-min to
  --sweeps-max (2..10: at most a third of the fixed runs; 2..20 and 2..30 beside it).
- Both are judged by the same tests (specbook.experiments.knob_ab.sequential.judge: TOST for equivalence within +/- the
  rule's margin, % of the baseline mean, each one-sided test at alpha / 2, and the difference test; labelled
  in the book's vocabulary: shown equivalent, small real change inside the margin, shown different), the fixed
  protocol at one look, the sequential with the rule's alpha spending; each by two analyses: `paired`
  (t on the per-sweep differences, df sweeps - 1: what the knob A/B uses, every arm of a sweep serving
  the same question draw) and `welch` (Welch t on run means, its fallback for unbalanced sweeps).
- Scenarios: null knob (baseline vs baseline), knob at the margin (baseline vs baseline shifted by
  +margin: P(inside) = P(equivalent) + P(small change) is the equivalence test's type I error) and the
  positive control (baseline vs
  int4draft).
- Noise: each replication draws per-run ALs as the arm's recorded mean plus a residual resampled from
  the arm's recorded runs, smoothed (a smoothed bootstrap: the resampled residual plus normal jitter of
  half its sd, shrunk so the variance is the arm's sample variance). Unsmoothed, two recorded runs give
  residuals of +/-sd only, so half the simulated arms would repeat a value exactly and look deterministic
  (sd = 0), which real runs with a fresh question draw never do. As a check: normal noise with that sd.
  Both draw every run independently (no sweep effect). The third model, `normal + sweep effect`, splits
  each arm's recorded run-to-run variance into a sweep effect shared by every arm (and eval) of a sweep,
  its variance estimated from the recorded complete sweeps by a two-way arms x sweeps ANOVA (0 when the
  sweeps do not move the arms together), and the arm's remaining within-sweep noise.

usage: python benchmarks/sequential_cost.py [--reps N] [--sweeps-min 2] [--sweeps-max 10 20 30] [RUN ...]
       RUN: a knob A/B run folder, or a report.html with a per-run table; with none: tests/golden/knob_ab,
       the newest outputs/knob_ab/* run, and the committed H200 knob A/B run folders
       (docs/reports/knob_ab-h200-*/).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from specbook.core.acceptance import Acceptance
from specbook.experiments.knob_ab import sequential, steady

ROOT = Path(__file__).resolve().parents[1]
H200_RUNS = "docs/reports/knob_ab-h200-*/data/runs.parquet"  # the committed H200 knob A/B run folders
CONTROL = "int4draft"


@dataclass
class Recorded:
    name: str
    runs: pd.DataFrame  # arm, sweep, al, minutes (ready + wall)
    margin_pct: float
    alpha: float
    spending: str
    value: str


def _rule(params: dict) -> tuple[float, float, str]:
    d = params.get("decision") or {}
    return float(d.get("tost_margin_pct", 1.0)), float(d.get("alpha", 0.05)), d.get("spending", "obrien_fleming")


def from_run_dir(run_dir: Path) -> Recorded:
    """Per-run steady-state AL (measurement.primary when it is steady_log_al, else counter AL) of a run folder."""
    from specbook.experiments import knob_ab
    from specbook.store.runstore import RunContext

    params = yaml.safe_load((run_dir / "params.yaml").read_text())
    data = knob_ab.load(RunContext.from_run_dir(run_dir))  # frames upgraded from older layouts
    runs = data.runs[data.runs["status"] == "ok"]
    primary = (params.get("measurement") or {}).get("primary", "steady_log_al")
    if primary == "steady_log_al":
        iv = data.intervals
        wl, ss = params.get("workload") or {}, params.get("steady_state") or {}
        st = steady.steady_state_filter(iv, int(wl.get("concurrency", 4)), float(ss.get("min_running_fraction", 0.75)))
        al = runs["run_id"].map(st.counts.set_index("run_id")["al_kept"])
    else:
        al = pd.Series([Acceptance.from_row(r, "counter_").al for _, r in runs.iterrows()], index=runs.index)
    frame = pd.DataFrame({"arm": runs["declared_arm"], "sweep": runs["sweep"], "al": al,
                          "minutes": (runs["ready_s"] + runs["wall_s"]) / 60})
    return Recorded(str(run_dir.relative_to(ROOT) if run_dir.is_relative_to(ROOT) else run_dir), frame,
                    *_rule(params), primary)


class _Tables(HTMLParser):
    """Every <table> of an HTML page as rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[-1].append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def from_h200_report(path: Path) -> Recorded:
    """The per-run table of the H200 knob A/B report (AL printed to 4 decimals) and its params."""
    parser = _Tables()
    parser.feed(path.read_text())
    for table in parser.tables:
        header = table[0]
        if {"run_id", "arm", "steady_log_al", "ready_s", "wall_s"} <= set(header):
            rows = [r[-len(header):] for r in table[1:] if len(r) >= len(header)]
            df = pd.DataFrame(rows, columns=header)
            params = yaml.safe_load((path.parent / "params.yaml").read_text())
            frame = pd.DataFrame({"arm": df["arm"], "sweep": df["sweep"].astype(int),
                                  "al": df["steady_log_al"].astype(float),
                                  "minutes": (df["ready_s"].astype(float) + df["wall_s"].astype(float)) / 60})
            return Recorded(str(path.relative_to(ROOT)), frame, *_rule(params), "steady_log_al (4 decimals)")
    raise SystemExit(f"{path}: no per-run table with run_id, arm, steady_log_al, ready_s, wall_s")


SWEEP_MODEL = "normal + sweep effect"
NOISE_MODELS = ("resampled (smoothed)", "normal", SWEEP_MODEL)


def sweep_effect_sd(runs: pd.DataFrame) -> float:
    """sd of a sweep effect shared by every arm of a sweep: two-way (sweeps x arms, one run per cell) ANOVA
    on the complete sweeps, (MS_sweeps - MS_residual) / arms, floored at 0; NaN with fewer than 2 sweeps."""
    wide = runs.dropna(subset=["al"]).pivot_table(index="sweep", columns="arm", values="al", aggfunc="first").dropna()
    s, a = wide.shape
    if s < 2 or a < 2:
        return math.nan
    x = wide.to_numpy(float)
    rows, cols, grand = x.mean(1, keepdims=True), x.mean(0, keepdims=True), x.mean()
    ms_sweeps = a * float(np.sum((rows - grand) ** 2)) / (s - 1)
    ms_resid = float(np.sum((x - rows - cols + grand) ** 2)) / ((s - 1) * (a - 1))
    return math.sqrt(max(0.0, (ms_sweeps - ms_resid) / a))


def sampler(values: np.ndarray, model: str, shift: float = 0.0, sweep_sd: float = 0.0):
    """Draws (reps, n) per-run ALs around the arm's recorded mean (+ shift) with its recorded noise
    (SWEEP_MODEL: the part of it not explained by the shared sweep effect, which the caller adds)."""
    mean, n = float(values.mean()), values.size
    resid = (values - mean) * math.sqrt(n / (n - 1))
    sd = float(values.std(ddof=1))
    if model == SWEEP_MODEL:  # the arm's total run-to-run variance stays sd^2; floor: a tenth of it
        sd = math.sqrt(max(sd**2 - sweep_sd**2, 0.01 * sd**2))
    jitter = 0.5  # bandwidth of the smoothed bootstrap, in sd

    def draw(rng: np.random.Generator, reps: int, runs: int) -> np.ndarray:
        if model == "resampled (smoothed)":
            r = rng.choice(resid, size=(reps, runs), replace=True) + rng.normal(0, jitter * sd, (reps, runs))
            return mean + shift + r / math.sqrt(1 + jitter**2)
        return rng.normal(mean + shift, sd, size=(reps, runs))

    return draw


def compare(rec: Recorded, args, rng: np.random.Generator) -> list[dict]:
    arms = {a: g["al"].dropna().to_numpy(float) for a, g in rec.runs.groupby("arm")}
    tau = sweep_effect_sd(rec.runs)
    tau = 0.0 if math.isnan(tau) else tau
    base = arms["baseline"]
    margin = abs(base.mean()) * rec.margin_pct / 100
    run_min = float(rec.runs["minutes"].mean())
    scenarios = {"null knob (baseline vs baseline)": ("baseline", 0.0),
                 f"knob at the margin (+{rec.margin_pct:g}%)": ("baseline", margin)}
    if CONTROL in arms:
        scenarios[f"positive control ({CONTROL})"] = (CONTROL, 0.0)
    fixed_runs = args.fixed_evals * args.fixed_sweeps
    out = []
    for model in NOISE_MODELS:
        sd_u = tau if model == SWEEP_MODEL else 0.0
        for scen, (arm, shift) in scenarios.items():
            draw_b, draw_v = sampler(base, model, sweep_sd=sd_u), sampler(arms[arm], model, shift, sweep_sd=sd_u)
            n_runs = max(fixed_runs, *args.sweeps_max)
            b, v = draw_b(rng, args.reps, n_runs), draw_v(rng, args.reps, n_runs)
            # the sweep effect, shared by both arms: per eval-sweep of the fixed protocol, per sweep of the sequential
            u_fixed = np.repeat(rng.normal(0, sd_u, (args.reps, args.fixed_sweeps)), args.fixed_evals, axis=1)
            u_seq = rng.normal(0, sd_u, (args.reps, max(args.sweeps_max)))
            bf, vf = b[:, :fixed_runs] + u_fixed, v[:, :fixed_runs] + u_fixed
            bs, vs = b[:, :u_seq.shape[1]] + u_seq, v[:, :u_seq.shape[1]] + u_seq
            mean_of = lambda x: x.reshape(args.reps, args.fixed_sweeps, args.fixed_evals).mean(-1)  # noqa: E731
            designs = []
            for analysis in ("paired", "welch"):
                paired = analysis == "paired"
                fixed = sequential.operating_characteristics(
                    mean_of(bf), mean_of(vf), margin_pct=rec.margin_pct, alpha=rec.alpha,
                    sweeps_min=args.fixed_sweeps, sweeps_max=args.fixed_sweeps, paired=paired)
                designs.append((f"fixed {args.fixed_evals} evals x {args.fixed_sweeps} sweeps", analysis, fixed,
                                fixed_runs))
                for hi in args.sweeps_max:
                    seq = sequential.operating_characteristics(
                        bs[:, :hi], vs[:, :hi], margin_pct=rec.margin_pct, alpha=rec.alpha,
                        sweeps_min=args.sweeps_min, sweeps_max=hi, spending=rec.spending, paired=paired)
                    designs.append((f"sequential {args.sweeps_min}..{hi} sweeps", analysis, seq, oc_runs(seq)))
            for proto, analysis, oc, runs_per_arm in designs:
                out.append({"noise": model, "scenario": scen, "protocol": proto, "analysis": analysis,
                            "P(equivalent)": oc.p_equivalent, "P(small change)": oc.p_small_change,
                            "P(different)": oc.p_different,
                            "P(undecided)": oc.p_undecided, "E[sweeps]": oc.expected_sweeps,
                            "sweeps p10/p50/p90": "/".join(f"{q:g}" for q in oc.sweeps_quantiles),
                            "E[runs per arm]": runs_per_arm,
                            "E[server-min, 2 arms]": 2 * runs_per_arm * run_min,
                            "cost vs fixed": runs_per_arm / fixed_runs})
    return out


def oc_runs(oc: sequential.OperatingCharacteristics) -> float:
    return oc.expected_sweeps  # one eval per arm per sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="*", type=Path)
    ap.add_argument("--reps", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fixed-evals", type=int, default=6)
    ap.add_argument("--fixed-sweeps", type=int, default=5)
    ap.add_argument("--sweeps-min", type=int, default=2)
    ap.add_argument("--sweeps-max", type=int, nargs="+", default=[10, 20, 30],
                    help="one sequential design per value (10 = a third of the fixed protocol's runs)")
    args = ap.parse_args()
    if args.run_dirs:
        recs = [from_h200_report(d.resolve()) if d.suffix == ".html" else from_run_dir(d.resolve())
                for d in args.run_dirs]
    else:
        recs = [from_run_dir(ROOT / "tests/golden/knob_ab")]
        newest = sorted((ROOT / "outputs/knob_ab").glob("*/data/runs.parquet"))
        if newest:
            recs.append(from_run_dir(newest[-1].parents[1]))
        recs += [from_run_dir(d.parents[1]) for d in sorted(ROOT.glob(H200_RUNS))]
        if not any(r.name.startswith("docs/reports") for r in recs):
            raise SystemExit(f"no H200 knob A/B run folder with data matches {H200_RUNS}")
    rng = np.random.default_rng(args.seed)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 20)
    for rec in recs:
        arms = rec.runs.groupby("arm")["al"].agg(["count", "mean", "std"])
        print(f"\n=== {rec.name}: per-run {rec.value}; margin +/-{rec.margin_pct:g}% of the baseline mean, "
              f"alpha {rec.alpha:g}, {rec.spending} spending; mean server-minutes per run "
              f"{rec.runs['minutes'].mean():.2f}; {args.reps} replications; sweep effect sd (ANOVA over the "
              f"recorded sweeps) {sweep_effect_sd(rec.runs):.4f}")
        print(arms.rename(columns={"count": "runs", "std": "sd"}).to_string(float_format=lambda x: f"{x:.4f}"))
        table = pd.DataFrame(compare(rec, args, rng))
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    main()
