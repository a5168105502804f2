"""Sweeps until the rule decides: a group-sequential equivalence test (TOST) and difference test.

After each complete sweep from `sweeps_min` on, every variant is compared with the baseline on its
per-run ALs (one value per fresh server, as everywhere in `specbook.core.stats`). A look only counts complete
sweeps (every arm has a run), so the runs always pair by sweep, and the knob A/B's looks use the paired
t on the per-sweep differences d_s = variant_s - baseline_s (df n - 1; the between-sweep variance, which
question draw a sweep served, cancels); `paired=False` gives the Welch t on run means instead:

- the difference test: the two-sided t test of delta = 0 against its boundary (alpha two-sided);
- the equivalence test: both one-sided t tests of the TOST (delta > -margin and delta < +margin) against
  their boundary, each at alpha / 2: the one-sided pair of a (1 - alpha) interval, the level of the interval
  the book's labels read (specbook.core.verdicts), so a look never calls equivalent what that interval would not.

A look is labelled in the book's vocabulary (specbook.core.verdicts) from the two tests, as an interval would be:
**shown equivalent** (the equivalence test crosses), **small real change, inside the margin** (both cross),
**shown different** (the difference test crosses, the equivalence test does not); otherwise **continue**, and
at `sweeps_max` **undecided**. Any of the first three stops the comparison.

The margin is the rule's TOST margin, +/- `tost_margin_pct` % of the baseline mean: a margin in units of
the baseline's sd (the rule's other criterion) moves with the sd's own estimate and is no fixed
hypothesis, so it stays a criterion of the final verdict, not of when to stop.

Error control: each test spends its alpha over the looks with a Lan-DeMets spending function
(O'Brien-Fleming-type by default, or Pocock-type), looks at information fractions n / sweeps_max.

- Paired design (the knob A/B's): the boundaries are set on the t scale for the joint null distribution of
  the paired t statistics of nested samples (the t after sweep n reuses sweeps 1..n-1). Under normal
  per-sweep differences that distribution is free of the unknown sd, for the difference test (delta = 0)
  and for each TOST test at its margin (stats.paired_tost_t: a paired t on contrasts of mean 0), so one
  seeded simulation of it (`paired_t_boundaries`, CALIBRATION_DRAWS draws) gives boundaries whose
  crossing probabilities are the spent alpha up to Monte-Carlo error (+/- 0.0007 at alpha 0.05).
- Welch (unpaired) design: its t has no such sd-free joint law (it depends on the two arms' variance
  ratio), so the boundaries come from normal statistics (Armitage-McPherson-Rowe recursion) and are used
  on the t scale at the same tail area at each look's Welch df: approximate.

Converting the normal boundaries instead for the paired t too (the book did until 2026-12) keeps each
look's marginal level but not the looks' joint law: a two-sided 5% difference test then rejected a true
null 5.6-5.8% of the time (simulated, 40000 replications; O'Brien-Fleming 2..4, 2..8, 2..10, Pocock 3..8).
So: P(an interval excluding 0 | no true effect) <= alpha (two-sided) and P(inside the margin | |true delta| >=
margin) <= alpha / 2; tests/unit/test_sequential.py measures both by simulation, on draws independent of the
calibration's.

`project_sweeps` turns an undecided comparison's observed noise into the sweeps that would decide it (the
estimate held fixed): the fixed-sample t half-width at n sweeps, and for the paired design the sweeps_max
whose last look's boundaries the projected t statistics reach.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal, Protocol

import numpy as np
import pandas as pd
from scipy import stats as sps
from scipy.optimize import brentq

from specbook.core import verdicts
from specbook.core.errors import ExperimentError
from specbook.core.stats import (
    PAIRED_METHOD,
    WELCH_METHOD,
    paired_contrast,
    paired_tost_t,
    summarize,
    welch_delta,
)
from specbook.core.stats.labels import pct


class DecisionRule(Protocol):
    """What a look needs of an experiment's decision rule (the knob A/B's `decision` block is one)."""

    tost_margin_pct: float
    alpha: float
    spending: str

Spending = Literal["obrien_fleming", "pocock"]
SPENDING_FUNCTIONS: tuple[str, ...] = ("obrien_fleming", "pocock")
EQUIVALENT, SMALL_CHANGE, DIFFERENT = verdicts.SHOWN_EQUIVALENT, verdicts.SMALL_CHANGE, verdicts.SHOWN_DIFFERENT
CONTINUE, UNDECIDED = "continue", verdicts.UNDECIDED
DECIDED = (EQUIVALENT, SMALL_CHANGE, DIFFERENT)
# judge()'s codes, in order: no verdict yet, then DECIDED
CODES = (CONTINUE, *DECIDED)
# What runs recorded in data/sequential_looks.json before the book's vocabulary (still read).
OLD_WORDS = {"equivalent": EQUIVALENT, "different": DIFFERENT, "undecided-at-max": UNDECIDED}


def look_word(recorded: str) -> str:
    """A recorded look decision in the book's vocabulary (older runs wrote 'equivalent', 'undecided-at-max')."""
    return OLD_WORDS.get(recorded, recorded)

_GRID = 1601  # points of the recursion's grid on the score scale
_SPAN = 8.0  # the grid reaches +/- this many sd of the score at the last look


def spent_alpha(fraction: float, alpha: float, spending: Spending) -> float:
    """Cumulative alpha a Lan-DeMets spending function has used at this information fraction (0..1]."""
    t = min(max(fraction, 0.0), 1.0)
    if t == 0:
        return 0.0
    if spending == "obrien_fleming":
        return float(2 * (1 - sps.norm.cdf(sps.norm.ppf(1 - alpha / 2) / math.sqrt(t))))
    if spending == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * t))
    raise ExperimentError(f"spending must be one of {', '.join(SPENDING_FUNCTIONS)}, got {spending!r}")


@lru_cache(maxsize=256)
def z_boundaries(fractions: tuple[float, ...], alpha: float, spending: Spending, two_sided: bool) -> tuple[float, ...]:
    """Normal-scale boundaries c_k of a group-sequential test with looks at these information fractions.

    Under H0 the z statistics are those of a Brownian motion observed at `fractions`; c_k is set so that
    P(no crossing before look k, crossing at look k) = spent(t_k) - spent(t_{k-1}), crossing meaning
    Z_k >= c_k (one-sided, spending alpha) or |Z_k| >= c_k (two-sided: each tail spends alpha / 2).
    """
    ts = np.asarray(fractions, float)
    if ts.size == 0 or np.any(np.diff(ts) <= 0) or ts[0] <= 0 or ts[-1] > 1 + 1e-12:
        raise ExperimentError(f"information fractions must increase within (0, 1], got {list(fractions)}")
    grid = np.linspace(-_SPAN, _SPAN, _GRID)  # score S_t = sqrt(t) Z_t, var t <= 1
    h = grid[1] - grid[0]
    density: np.ndarray | None = None  # sub-density of S at the last look on the continuation region
    prev_t, prev_spent, out = 0.0, 0.0, []
    tail_alpha, tails = (alpha / 2, 2) if two_sided else (alpha, 1)
    for t in ts:
        target = tails * spent_alpha(float(t), tail_alpha, spending) - prev_spent
        dt = t - prev_t
        sd = math.sqrt(dt)

        def crossing(c: float, density=density, sd=sd, t=t) -> float:
            edge = c * math.sqrt(t)
            if density is None:  # first look: S ~ N(0, t)
                up = sps.norm.sf(edge / sd)
                return float(2 * up if two_sided else up)
            up = sps.norm.sf((edge - grid) / sd)
            lo = sps.norm.cdf((-edge - grid) / sd) if two_sided else 0.0
            return float(np.sum(density * (up + lo)) * h)

        if target <= 0:
            c = math.inf
        else:
            c = brentq(lambda x, goal=target: crossing(x) - goal, 0.0, 40.0, xtol=1e-10)
        out.append(c)
        # carry the sub-density of S_t over the continuation region to the next look
        edge = c * math.sqrt(t)
        keep = (np.abs(grid) < edge) if two_sided else (grid < edge)
        if density is None:
            new = sps.norm.pdf(grid / sd) / sd
        else:
            kernel = np.exp(-0.5 * ((grid[:, None] - grid[None, :]) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
            new = kernel @ density * h
        density = np.where(keep, new, 0.0)
        prev_t, prev_spent = float(t), prev_spent + target
    return tuple(out)


CALIBRATION_DRAWS = 400_000  # simulated sequences of per-sweep differences per design
CALIBRATION_SEED = 20261201


@lru_cache(maxsize=256)
def paired_t_boundaries(sweeps_min: int, sweeps_max: int, alpha: float, spending: Spending,
                        two_sided: bool) -> tuple[float, ...]:
    """t-scale boundaries c_n of the paired t after sweep n = sweeps_min..sweeps_max (inf where n < 2).

    Simulates CALIBRATION_DRAWS sequences of standard-normal per-sweep differences (seeded: the same
    boundaries on every machine), with the paired t of the first n at each look; c_n is the value that the
    sequences still running at look n exceed with probability spent(n / sweeps_max) - spent(previous look),
    crossing meaning T_n >= c_n (one-sided, spending alpha) or |T_n| >= c_n (two-sided, alpha in all).
    """
    fractions = look_fractions(sweeps_min, sweeps_max)
    tail_alpha, tails = (alpha / 2, 2) if two_sided else (alpha, 1)
    rng = np.random.default_rng(CALIBRATION_SEED)
    total = np.zeros(CALIBRATION_DRAWS)
    squares = np.zeros(CALIBRATION_DRAWS)
    running = np.ones(CALIBRATION_DRAWS, bool)
    prev_spent, out = 0.0, []
    for n in range(1, sweeps_max + 1):
        x = rng.standard_normal(CALIBRATION_DRAWS)
        total += x
        squares += x * x
        if n < sweeps_min:
            continue
        target = tails * spent_alpha(fractions[n - sweeps_min], tail_alpha, spending) - prev_spent
        prev_spent += target
        crossings = int(round(target * CALIBRATION_DRAWS))
        if n < 2 or crossings <= 0:  # no t with one sweep; nothing to spend here
            out.append(math.inf)
            continue
        mean = total / n
        t = mean / np.sqrt((squares - n * mean * mean) / (n - 1) / n)
        stat = np.abs(t) if two_sided else t
        live = stat[running]
        c = float(np.partition(live, live.size - crossings)[live.size - crossings])  # the crossings-th largest
        out.append(c)
        running &= ~(stat >= c)
    return tuple(out)


def look_fractions(sweeps_min: int, sweeps_max: int) -> tuple[float, ...]:
    """Information fractions of the planned looks: after sweep n for n = sweeps_min..sweeps_max."""
    if not 1 <= sweeps_min <= sweeps_max:
        raise ExperimentError(f"need 1 <= sweeps_min <= sweeps_max, got {sweeps_min}, {sweeps_max}")
    return tuple(n / sweeps_max for n in range(sweeps_min, sweeps_max + 1))


PAIRED_CALIBRATION = "paired t, joint null simulated"
WELCH_CONVERSION = "normal boundary at the same tail area (Welch df)"


@dataclass(frozen=True)
class LookBoundaries:
    """The boundaries one look uses: on the normal scale, and the t-scale ones the tests compare with."""

    look: int  # 1-based among the planned looks
    fraction: float
    z_difference: float  # two-sided: |T| >= this (normal scale)
    z_equivalence: float  # one-sided, each TOST test (at alpha / 2)
    t_difference: float
    t_equivalence: float
    df: float
    alpha_spent_difference: float  # cumulative, up to and including this look
    alpha_spent_equivalence: float  # of each one-sided TOST test (alpha / 2 in all)
    t_from: str = WELCH_CONVERSION  # how the t-scale boundaries were set


def boundaries_at(n: int, sweeps_min: int, sweeps_max: int, alpha: float, spending: Spending,
                  df: float, paired: bool = False) -> LookBoundaries:
    """The boundaries of the look after sweep n (sweeps_min <= n <= sweeps_max).

    paired: the paired t's own boundaries (`paired_t_boundaries`); else the normal ones at the same tail area
    on the t scale at this df (df NaN, no spread: the normal value)."""
    fr = look_fractions(sweeps_min, sweeps_max)
    k = n - sweeps_min
    if not 0 <= k < len(fr):
        raise ExperimentError(f"no planned look after sweep {n}: looks are after sweeps {sweeps_min}..{sweeps_max}")
    zd = z_boundaries(fr, alpha, spending, True)[k]
    ze = z_boundaries(fr, alpha / 2, spending, False)[k]
    td, te = t_scale_bounds(k, sweeps_min, sweeps_max, alpha, spending, df, paired)
    return LookBoundaries(k + 1, fr[k], zd, ze, td, te, df, 2 * spent_alpha(fr[k], alpha / 2, spending),
                          spent_alpha(fr[k], alpha / 2, spending), PAIRED_CALIBRATION if paired else WELCH_CONVERSION)


@dataclass(frozen=True)
class Look:
    """One comparison at one look: its numbers, the boundaries it met, and what they decide."""

    arm: str
    baseline: str
    decision: str  # one of sequential.DECIDED, continue, undecided
    n_baseline: int
    n_variant: int
    delta: float
    se: float
    margin_abs: float
    t_difference: float  # delta / se
    t_lower: float  # TOST, delta > -margin: (delta + margin) / se (Welch) or stats.paired_tost_t's
    t_upper: float  # TOST, delta < +margin: (margin - delta) / se (Welch) or stats.paired_tost_t's
    boundaries: LookBoundaries | None  # None before sweeps_min
    reason: str

    def as_dict(self) -> dict[str, object]:
        b = self.boundaries
        return {
            "arm": self.arm, "baseline": self.baseline, "decision": self.decision,
            "n_baseline": self.n_baseline, "n_variant": self.n_variant, "delta": self.delta, "se": self.se,
            "margin_abs": self.margin_abs, "t_difference": self.t_difference, "t_lower": self.t_lower,
            "t_upper": self.t_upper, "look": b.look if b else None, "df": b.df if b else math.nan,
            "bound_difference": b.t_difference if b else math.nan,
            "bound_equivalence": b.t_equivalence if b else math.nan,
            "alpha_spent_difference": b.alpha_spent_difference if b else 0.0,
            "alpha_spent_equivalence": b.alpha_spent_equivalence if b else 0.0,
            "bounds_from": b.t_from if b else None, "reason": self.reason,
        }


def t_bound(z: float, df: np.ndarray | float) -> np.ndarray | float:
    """The t-scale boundary with the same tail area as normal boundary z (df NaN: no spread, z itself)."""
    if not math.isfinite(z):
        return np.full_like(np.asarray(df, float), z) if np.ndim(df) else z
    out = sps.t.isf(sps.norm.sf(z), np.where(np.isfinite(df), df, np.inf))
    return out if np.ndim(df) else float(out)


def t_scale_bounds(k: int, sweeps_min: int, sweeps_max: int, alpha: float, spending: Spending,
                   df: np.ndarray | float, paired: bool) -> tuple[np.ndarray | float, np.ndarray | float]:
    """(difference, equivalence) bounds on the t scale at look k (0-based), the difference test two-sided at
    alpha, each TOST test one-sided at alpha / 2: the paired t's own (`paired_t_boundaries`), else the normal
    ones at the same tail area at df (Welch; elementwise for arrays)."""
    if paired:
        return (paired_t_boundaries(sweeps_min, sweeps_max, alpha, spending, True)[k],
                paired_t_boundaries(sweeps_min, sweeps_max, alpha / 2, spending, False)[k])
    fr = look_fractions(sweeps_min, sweeps_max)
    return (t_bound(z_boundaries(fr, alpha, spending, True)[k], df),
            t_bound(z_boundaries(fr, alpha / 2, spending, False)[k], df))


def judge(delta: np.ndarray, se: np.ndarray, margin: np.ndarray, bound_difference: np.ndarray | float,
          bound_equivalence: np.ndarray | float, t_tost: np.ndarray | None = None) -> np.ndarray:
    """The verdict codes at one look, elementwise, indices into CODES: 0 no verdict yet, 1 shown equivalent,
    2 small real change inside the margin, 3 shown different.

    Bounds on the t scale (LookBoundaries.t_difference / t_equivalence). Inside the margin: both TOST t >= the
    equivalence bound (t_tost, the smaller of the two, defaults to (margin - |delta|) / se (Welch; the paired
    design passes stats.paired_tost_t's)); excluding 0: |delta / se| >= the difference bound. Inside and not
    excluding 0: shown equivalent; both: a small real change; excluding 0 only: shown different. With se = 0
    (both arms repeat exactly) the interval is the point: inside iff |delta| <= margin, excluding 0 iff delta != 0.
    """
    delta, se, margin = (np.asarray(x, float) for x in (delta, se, margin))
    with np.errstate(divide="ignore", invalid="ignore"):
        t0 = np.abs(delta) / se
        if t_tost is None:
            t_tost = (margin - np.abs(delta)) / se
    exact = se == 0
    inside = np.where(exact, np.abs(delta) <= margin, t_tost >= bound_equivalence)
    excludes = np.where(exact, delta != 0, t0 >= bound_difference)
    return np.where(inside & excludes, 2, np.where(inside, 1, np.where(excludes, 3, 0)))


def decide(baseline: Sequence[float], variant: Sequence[float], *, margin_pct: float, alpha: float,
           sweeps_min: int, sweeps_max: int, spending: Spending = "obrien_fleming",
           arm: str = "variant", baseline_name: str = "baseline", paired: bool = False) -> Look:
    """The group-sequential verdict of one variant against the baseline at the look their sweeps make.

    The look is after n = min(len(baseline), len(variant)) sweeps; before sweeps_min it is `continue`.
    paired: baseline[i] and variant[i] ran in the same sweep i; the tests are on the differences (paired t,
    df n - 1; Welch where the paired t does not exist, see stats.paired_contrast).
    """
    b, v = np.asarray(baseline, float), np.asarray(variant, float)
    n = int(min(b.size, v.size))
    if n > sweeps_max:
        raise ExperimentError(f"{arm} vs {baseline_name}: {n} sweeps, more than sweeps_max={sweeps_max}")
    if n < max(sweeps_min, 2):
        return Look(arm, baseline_name, UNDECIDED if n >= sweeps_max else CONTINUE, int(b.size), int(v.size),
                    math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, None,
                    f"{n} sweep(s): the first look is after {max(sweeps_min, 2)}")
    b, v = b[:n], v[:n]
    margin = abs(summarize(b).mean) * margin_pct / 100.0
    w = paired_contrast(np.column_stack([b, v]), [-1.0, 1.0], 1 - alpha) if paired else welch_delta(b, v, 1 - alpha)
    bounds = boundaries_at(n, sweeps_min, sweeps_max, alpha, spending, w.df, paired=w.paired)
    if w.paired:
        t_lo, t_hi = (float(t) for t in paired_tost_t(b, v, margin_pct / 100.0)[:2])
    elif w.se:
        t_lo, t_hi = (w.estimate + margin) / w.se, (margin - w.estimate) / w.se
    else:
        t_lo = t_hi = math.nan
    code = int(judge(w.estimate, w.se, margin, bounds.t_difference, bounds.t_equivalence,
                     min(t_lo, t_hi) if w.paired else None))
    if w.se == 0:
        return Look(arm, baseline_name, CODES[code], n, n, w.estimate, 0.0, margin, math.nan, math.nan, math.nan,
                    bounds, "both arms repeat exactly (sd = 0): the interval is the point, the margin decides")
    t0 = w.estimate / w.se
    inside = (f"both TOST t ({t_lo:.3g}, {t_hi:.3g}) >= {bounds.t_equivalence:.3g} for +/-{margin_pct:g}% "
              f"(+/-{margin:.4g})")
    excludes = f"|t| = {abs(t0):.3g} >= {bounds.t_difference:.3g}"
    verdict = CODES[code] if code else (UNDECIDED if n == sweeps_max else CONTINUE)
    if code == 1:
        reason = inside
    elif code == 2:
        reason = f"{inside}, and {excludes}"
    elif code == 3:
        reason = f"{excludes}; TOST min t = {min(t_lo, t_hi):.3g} < {bounds.t_equivalence:.3g}"
    else:
        reason = (f"|t| = {abs(t0):.3g} vs {bounds.t_difference:.3g} (difference), TOST min t = "
                  f"{min(t_lo, t_hi):.3g} vs {bounds.t_equivalence:.3g} (equivalence)")
    return Look(arm, baseline_name, verdict, n, n, w.estimate, w.se, margin, t0, t_lo, t_hi, bounds, reason)


PROJECTION_CAP = 1000  # sweeps per arm a projection looks up to
SEQUENTIAL_PROJECTION_CAP = 30  # the largest sweeps_max whose own boundaries a projection computes (cost ~ n)


def project_sweeps(estimate: float, se: float, n: int, margin: float, *, ci: float = 0.95,
                   df_at: Callable[[np.ndarray], np.ndarray] | None = None, df_words: str = "n - 1",
                   sequential: tuple[int, Spending] | None = None,
                   cap: int = PROJECTION_CAP) -> verdicts.Projection | None:
    """The sweeps at which an interval of this noise would fit inside +/-margin / exclude 0, the estimate held.

    se: the standard error of `estimate` at n sweeps; it shrinks as sqrt(n / N) at N sweeps, the interval's
    half-width being t(ci, df_at(N)) x se_N (df_at: N - 1 unless given, e.g. the curve's (N - 1)(L - 1)).
    sequential = (sweeps_min, spending): the paired design's too, the smallest sweeps_max (from the fixed
    projection on, up to SEQUENTIAL_PROJECTION_CAP) whose last look's boundaries (alpha = 1 - ci) the projected
    t statistics reach. None when the noise is unknown or zero.
    """
    if not (math.isfinite(se) and se > 0 and math.isfinite(estimate) and n >= 1):
        return None
    sd = se * math.sqrt(n)
    ns = np.arange(n + 1, cap + 1)
    df = ns - 1.0 if df_at is None else np.asarray(df_at(ns), float)
    half = sps.t.ppf(0.5 + ci / 2, df) * sd / np.sqrt(ns)
    size = abs(estimate)
    fits, excludes = ns[size + half <= margin], ns[half < size]
    to_eq = int(fits[0]) if size < margin and fits.size else None
    to_diff = int(excludes[0]) if size > 0 and excludes.size else None
    method = (f"the {ci:.0%} t half-width at N sweeps, t(df) x sd / sqrt(N) with df {df_words}, the sd as observed")
    sweeps_max = None
    first = min((x for x in (to_eq, to_diff) if x is not None), default=None)
    if sequential is not None and first is not None and first <= SEQUENTIAL_PROJECTION_CAP:
        lo, spending = sequential
        alpha = 1 - ci
        for big_n in range(max(first, lo, 2), SEQUENTIAL_PROJECTION_CAP + 1):
            se_n = sd / math.sqrt(big_n)
            c_d = paired_t_boundaries(lo, big_n, alpha, spending, True)[-1]
            c_e = paired_t_boundaries(lo, big_n, alpha / 2, spending, False)[-1]
            if size / se_n >= c_d or (margin - size) / se_n >= c_e:
                sweeps_max = big_n
                break
    return verdicts.Projection(n, sd, to_eq, to_diff, cap, method, sweeps_max)


@dataclass(frozen=True)
class OperatingCharacteristics:
    """Simulated verdict probabilities and sweeps of one design on one scenario (the four outcomes sum to 1)."""

    p_equivalent: float  # shown equivalent
    p_different: float  # shown different
    p_undecided: float
    expected_sweeps: float  # per arm, to a verdict or sweeps_max
    sweeps_quantiles: tuple[float, float, float]  # 10%, 50%, 90%
    replications: int
    p_small_change: float = 0.0  # a small real change, inside the margin

    @property
    def p_inside(self) -> float:
        """P(the design ends inside the margin): shown equivalent or a small real change."""
        return self.p_equivalent + self.p_small_change

    @property
    def p_excludes_zero(self) -> float:
        """P(the design ends with 0 excluded): shown different or a small real change."""
        return self.p_different + self.p_small_change


def operating_characteristics(baseline_runs: np.ndarray, variant_runs: np.ndarray, *, margin_pct: float,
                              alpha: float, sweeps_min: int, sweeps_max: int,
                              spending: Spending = "obrien_fleming", paired: bool = False) -> OperatingCharacteristics:
    """Run the sequential design on replications of per-run ALs: arrays (replications, >= sweeps_max).

    Row r column j is the AL of arm's run in sweep j of replication r. The same `judge` as `decide`,
    vectorised over replications; paired: the paired t on the per-sweep differences (as `decide(...,
    paired=True)`; its Welch fallback for exactly equal differences has probability 0 with continuous
    noise and is not simulated).
    """
    from specbook.core.stats import paired_t_interval, welch_t_interval

    b, v = np.asarray(baseline_runs, float), np.asarray(variant_runs, float)
    if b.shape != v.shape or b.ndim != 2 or b.shape[1] < sweeps_max:
        raise ExperimentError(f"need two (replications, >= {sweeps_max}) arrays, got {b.shape} and {v.shape}")
    reps = b.shape[0]
    verdict = np.zeros(reps, int)
    stopped_at = np.full(reps, sweeps_max)
    for k, n in enumerate(range(sweeps_min, sweeps_max + 1)):
        if n < 2:
            continue
        live = verdict == 0
        bb, vv = b[live, :n], v[live, :n]
        t_tost = None
        if paired:
            est, se, df, _, _ = paired_t_interval(vv - bb, 1 - alpha)
            t_tost = np.minimum(*paired_tost_t(bb, vv, margin_pct / 100.0)[:2])
        else:
            means = np.stack([bb.mean(1), vv.mean(1)], -1)
            var = np.stack([bb.var(1, ddof=1), vv.var(1, ddof=1)], -1)
            est, se, df, _, _ = welch_t_interval(means, var, np.array([n, n]), [-1.0, 1.0], 1 - alpha)
        bound_d, bound_e = t_scale_bounds(k, sweeps_min, sweeps_max, alpha, spending, df, paired)
        code = judge(est, se, np.abs(bb.mean(1)) * margin_pct / 100.0, bound_d, bound_e, t_tost)
        idx = np.flatnonzero(live)
        verdict[idx] = code
        stopped_at[idx[code > 0]] = n
    q = np.quantile(stopped_at, [0.1, 0.5, 0.9])
    return OperatingCharacteristics(float(np.mean(verdict == 1)), float(np.mean(verdict == 3)),
                                    float(np.mean(verdict == 0)), float(stopped_at.mean()),
                                    (float(q[0]), float(q[1]), float(q[2])), reps, float(np.mean(verdict == 2)))


@dataclass(frozen=True)
class SequentialState:
    """Where an adaptive knob A/B stands after its latest complete sweep."""

    decision: str  # a DECIDED word (every comparison decided, all alike), decided, continue, undecided
    sweeps: int  # complete sweeps (every arm has a valued run)
    sweeps_min: int
    sweeps_max: int
    alpha: float
    spending: str
    margin_pct: float
    value_col: str
    looks: list[Look] = field(default_factory=list)
    method: str = PAIRED_METHOD
    notes: list[str] = field(default_factory=list)

    @property
    def stop(self) -> bool:
        return self.decision != CONTINUE

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([lk.as_dict() for lk in self.looks])

    def describe(self) -> str:
        head = (f"after {self.sweeps} complete sweep(s) of {self.sweeps_min}..{self.sweeps_max}: {self.decision}; "
                f"group-sequential TOST (+/-{self.margin_pct:g}% of the baseline mean) and difference test, "
                f"alpha {self.alpha:g} each, {self.spending.replace('_', '-')} alpha spending, {self.method}")
        return "\n".join([head, *(f"  {lk.arm} vs {lk.baseline}: {lk.decision} ({lk.reason})" for lk in self.looks),
                          *(f"  note: {n}" for n in self.notes)])


def overall(decisions: Sequence[str], at_max: bool) -> str:
    """All comparisons decided: the common verdict (or 'decided' when they differ); else continue / undecided."""
    if not decisions:
        return UNDECIDED if at_max else CONTINUE
    if all(d in DECIDED for d in decisions):
        return decisions[0] if len(set(decisions)) == 1 else "decided"
    return UNDECIDED if at_max else CONTINUE


def decide_frame(per_run: pd.DataFrame, rule: DecisionRule, sweeps_min: int, sweeps_max: int, *,
                 baseline: str = "baseline", arm_col: str = "arm", sweep_col: str = "sweep",
                 value_col: str = "al", paired: bool = True) -> SequentialState:
    """Every variant vs the baseline on the complete sweeps of `per_run` (one row per run: arm, sweep, value).

    Complete sweeps pair every arm by sweep, so the tests are paired (paired=False: Welch on run means)."""
    for col in (arm_col, sweep_col, value_col):
        if col not in per_run:
            raise ExperimentError(f"runs frame lacks column {col!r}; it has {list(per_run.columns)}")
    valued = per_run[per_run[value_col].notna()]
    arms = list(dict.fromkeys(per_run[arm_col]))
    if baseline not in arms:
        raise ExperimentError(f"baseline arm {baseline!r} not in column {arm_col!r}; arms: {arms}")
    have = valued.groupby(sweep_col)[arm_col].agg(set)
    complete = sorted(s for s, got in have.items() if set(arms) <= got)
    notes = []
    if len(complete) < len(have):
        notes.append(f"sweeps {sorted(set(have.index) - set(complete))} lack a valued run of some arm: not counted")
    part = valued[valued[sweep_col].isin(complete)]
    # one value per (arm, sweep): a sweep with a repeated arm (a retried run) keeps its last
    part = part.drop_duplicates([arm_col, sweep_col], keep="last")
    base = part.loc[part[arm_col] == baseline].sort_values(sweep_col)[value_col].to_numpy()
    looks = [decide(base, part.loc[part[arm_col] == a].sort_values(sweep_col)[value_col].to_numpy(),
                    margin_pct=rule.tost_margin_pct, alpha=rule.alpha, sweeps_min=sweeps_min,
                    sweeps_max=sweeps_max, spending=rule.spending, arm=str(a), baseline_name=baseline,
                    paired=paired)
             for a in arms if a != baseline]
    n = len(complete)
    decision = CONTINUE if n < sweeps_min else overall([lk.decision for lk in looks], n >= sweeps_max)
    return SequentialState(decision, n, sweeps_min, sweeps_max, rule.alpha, rule.spending, rule.tost_margin_pct,
                           value_col, looks, notes, PAIRED_METHOD if paired else WELCH_METHOD)


@dataclass(frozen=True)
class Design:
    """A group-sequential design as it ran: looks after sweeps sweeps_min..sweeps_max, alpha spent by `spending`."""

    sweeps_min: int
    sweeps_max: int
    alpha: float
    spending: Spending

    @classmethod
    def of_look(cls, look: dict) -> Design:
        """The design a recorded look (data/sequential_looks.json) ran under."""
        return cls(int(look["sweeps_min"]), int(look["sweeps_max"]), float(look["alpha"]), look["spending"])

    def look_at(self, n: int) -> int:
        """The planned look whose boundary an analysis on n sweeps uses: fewer sweeps than the first look take
        the first look's (the strictest under either spending), more than sweeps_max the last look's."""
        return min(max(n, self.sweeps_min, 2), self.sweeps_max)


def repeated_intervals(rows: pd.DataFrame, design: Design) -> pd.DataFrame:
    """Comparison rows (stats.delta_vs_baseline) with each interval replaced by the design's repeated confidence
    interval at its look: the delta +/- the look's difference boundary (t scale) x its se.

    A run whose sweeps were chosen by looking at the data has no fixed-sample interval: the t interval at the
    sweeps it stopped at ignores the alpha the earlier looks spent, and can lie inside the margin where the
    design, at that same look, said continue. The repeated interval (Jennison & Turnbull) covers the delta at
    every look at once with probability 1 - alpha, and its label agrees with the looks' stopping decisions.
    `ci_design` says which look and boundary each row's interval took."""
    out = rows.copy()
    if out.empty:
        return out.assign(ci_design=pd.Series(dtype=str))
    planned = len(look_fractions(design.sweeps_min, design.sweeps_max))
    designs = []
    for i, row in out.iterrows():
        n = int(min(row["n_baseline"], row["n_variant"]))
        se, delta, df = float(row["delta_se"]), float(row["delta_abs"]), float(row["ci_df"])
        if not (math.isfinite(se) and math.isfinite(delta)):
            designs.append("")
            continue
        at = design.look_at(n)
        b = boundaries_at(at, design.sweeps_min, design.sweeps_max, design.alpha, design.spending, df,
                          paired=bool(row.get("paired", False)))
        low, high = delta - b.t_difference * se, delta + b.t_difference * se
        base = float(row["baseline_mean"])
        out.loc[i, ["ci_low", "ci_high"]] = low, high
        out.loc[i, ["ci_low_pct", "ci_high_pct"]] = pct(low, base), pct(high, base)
        out.loc[i, "ci"] = 1 - design.alpha
        where = f"look {b.look} of {planned}" + (f", the nearest to {n} sweeps" if at != n else "")
        designs.append(f"the sequential design's repeated interval ({where}: boundary {b.t_difference:.3g} x se, "
                       f"{design.spending.replace('_', '-')} spending over sweeps {design.sweeps_min}.."
                       f"{design.sweeps_max}), not the fixed-sample t's")
    out["ci_design"] = designs
    return out
