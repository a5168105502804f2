"""The one verdict vocabulary: a label summarises an interval against a margin, never a point estimate.

Every experiment that draws a label from an interval draws it here (`label`):

- **SHOWN EQUIVALENT**: the whole interval lies inside +/-margin (and includes 0);
- **SMALL REAL CHANGE, INSIDE THE MARGIN**: the interval excludes 0 and lies inside +/-margin (both hold);
- **SHOWN DIFFERENT**: the interval excludes 0 and reaches beyond the margin; the verdict carries the size
  (the estimate), the reason the bound nearest 0;
- **UNDECIDED**: otherwise (the interval includes 0 and reaches beyond the margin), or there is no interval;
  with the sweeps the observed noise would need (`Projection`, made by `sequential.project_sweeps`).

Inside means low >= -margin and high <= +margin; excludes 0 means low > 0 or high < 0. A stated rule that
judges a point estimate (`decision.DecisionRule`) is reported beside the label as its own line, "meets the
stated rule: yes/no"; whether the label is what the params expected before the run is a third, separate line.

Labels a run states without a run-to-run interval (one server per arm: the config flip's collapse and output
equality; a throughput curve's shape) end with RUN_SCOPE, "in this run": they say what was measured, not what
another run would show.

The checker (`check_headline`, `check_summary`, `check_report_folders`) reads summary headlines as text
(comparison, verdict, figure, interval), so it judges any report, old or new, of any experiment:

1. the interval is the first `[low, high]` of the headline's interval field (a `%` on a bound gives the
   unit); the margin is the first `+/-m` (or `\u00b1m`) of the interval field, else of the verdict;
2. a verdict that claims something about the interval is held to it: SHOWN EQUIVALENT / EQUIVALENT (inside,
   and for SHOWN EQUIVALENT also including 0), SMALL REAL CHANGE (inside and excluding 0), SHOWN DIFFERENT
   (excluding 0 and not inside; its stated size within the interval), DIFFERENT / MOVED (excluding 0),
   NOT SHOWN EQUIVALENT (not inside), NOT SHOWN DIFFERENT / NOT SHOWN TO MOVE (including 0), UNDECIDED
   (including 0 and not inside); a claim of equivalence needs a stated margin;
3. a headline without an interval makes no interval claim (none of the words above but UNDECIDED), and a
   label that judges a measured effect without an interval (RUN_SCOPED_WORDS) says "in this run";
4. a verdict that is a figure, one ratio `N.NNx` beside an interval, lies inside it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

SHOWN_EQUIVALENT = "shown equivalent"
SMALL_CHANGE = "small real change, inside the margin"
SHOWN_DIFFERENT = "shown different"
UNDECIDED = "undecided"
WORDS = (SHOWN_EQUIVALENT, SMALL_CHANGE, SHOWN_DIFFERENT, UNDECIDED)
# The labels that count as "inside the margin" (what a knob expected to be neutral hopes for).
INSIDE_WORDS = (SHOWN_EQUIVALENT, SMALL_CHANGE)
RUN_SCOPE = "in this run"
# Labels that judge a measured effect with no run-to-run interval: they must carry RUN_SCOPE.
RUN_SCOPED_WORDS = ("COLLAPSED", "KEPT", "EQUAL", "SATURATES", "GROWING")
MAX_DIGITS = 12  # decimals a bound is printed with at most; beyond, the float itself
ROUGH_BELOW_SWEEPS = 4  # a projection from an sd on this few sweeps says it is rough


@dataclass(frozen=True)
class Projection:
    """How many sweeps the observed noise would need for the interval to decide, the estimate held fixed.

    to_equivalence / to_difference: sweeps in all (per arm) at which the interval would fit inside the
    margin / exclude 0; None where that cannot happen (|estimate| >= margin; estimate 0) or lies past `cap`.
    """

    sweeps_now: int
    sd: float  # per-sweep sd of the contrast the interval is on (the label's unit)
    to_equivalence: int | None
    to_difference: int | None
    cap: int
    method: str  # how the half-width at n sweeps was projected, in words
    sweeps_max: int | None = None  # the sweeps_max a sequential design needs to reach that (None: not projected)

    @property
    def first(self) -> int | None:
        reached = [n for n in (self.to_equivalence, self.to_difference) if n is not None]
        return min(reached) if reached else None

    @property
    def more(self) -> int | None:
        n = self.sweeps_max or self.first
        return None if n is None else n - self.sweeps_now


@dataclass(frozen=True)
class Label:
    """A vocabulary label with the interval and margin it was drawn from."""

    word: str  # one of WORDS
    estimate: float
    low: float
    high: float
    margin: float
    level: float = 0.95
    unit: str = "%"  # "%" (of a baseline mean) or "" (the quantity's own unit)
    projection: Projection | None = None
    no_interval: str = ""  # why there is no interval (then the word is UNDECIDED)
    digits: int = 2  # decimals shown: the fewest (from 2, or 3 in the quantity's own unit) that keep the shown
    # interval on the same side of 0 and of the margin as the exact one (shown_digits)

    @property
    def inside(self) -> bool:
        return is_inside(self.low, self.high, self.margin)

    @property
    def excludes_zero(self) -> bool:
        return excludes_zero(self.low, self.high)

    @property
    def upper(self) -> str:
        return self.word.upper()

    def num(self, x: float) -> str:
        return signed(x, self.unit, self.digits)

    @property
    def margin_text(self) -> str:
        return f"\u00b1{margin_number(self.margin)}{self.unit}"

    def verdict(self) -> str:
        """The headline's verdict: the label, with the size where shown different and the sweeps where undecided."""
        if self.word == SHOWN_DIFFERENT:
            return f"{self.upper}: {self.num(self.estimate)}"
        if self.word == UNDECIDED:
            p = self.projection
            if self.no_interval:
                return f"{self.upper} (no interval)"
            if p is not None and p.more is not None:
                return f"{self.upper}: ~{p.more} more sweep{'s' if p.more != 1 else ''}"
            if p is not None:
                return f"{self.upper}: over {p.cap} sweeps"
        return self.upper

    def interval_text(self, method: str = "") -> str:
        """'95% CI [-2.38%, -0.43%] vs margin +/-1%; paired t over 3 sweeps (df 2)' (what the checker reads)."""
        if self.no_interval:
            return f"no interval: {self.no_interval.removeprefix('no interval: ')}"
        bounds = (f"{self.level:.0%} CI [{self.num(self.low)}, {self.num(self.high)}] vs margin "
                  f"{self.margin_text}")
        return f"{bounds}; {method}" if method else bounds

    def why(self) -> str:
        """One plain sentence (or two) of why: what the interval shows against the margin, and what would decide."""
        ci = f"the {self.level:.0%} interval"
        m = self.margin_text
        if self.no_interval:
            return f"No interval ({self.no_interval.removeprefix('no interval: ')}), so nothing is shown either way."
        if self.word == SHOWN_EQUIVALENT:
            return f"The whole of {ci} lies inside {m}."
        if self.word == SMALL_CHANGE:
            return (f"{ci[0].upper()}{ci[1:]} excludes 0 and lies inside {m}: a real change, too small to matter "
                    "by the margin.")
        nearest = self.low if self.low > 0 else self.high
        if self.word == SHOWN_DIFFERENT:
            beyond = ("beyond the margin" if not is_inside(nearest, nearest, self.margin)
                      else f"so the change may still be inside {m}")
            return f"{ci[0].upper()}{ci[1:]} excludes 0: the change is at least {self.num(nearest)}, {beyond}."
        head = f"{ci[0].upper()}{ci[1:]} includes 0 and reaches beyond {m}."
        p = self.projection
        return head + (f" {projection_text(p, self)}" if p is not None else "")


def signed(x: float, unit: str, digits: int | None = None) -> str:
    """'+1.23%' (a percentage) or '+0.123' (a quantity in its own unit) with `digits` decimals (default 2 for %,
    3 otherwise), rounded to the nearest; '-' for missing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return f"{'+' if x > 0 else '-'}inf{unit}"
    d = (2 if unit == "%" else 3) if digits is None else digits
    if d > MAX_DIGITS:  # no fixed number of decimals shows it: the float itself (repr reads back exactly)
        return f"{'+' if x >= 0 else ''}{float(x)!r}{unit}"
    q = Decimal(repr(float(x))).quantize(Decimal(1).scaleb(-d), rounding=ROUND_HALF_EVEN)
    if q == 0:
        q = abs(q)  # no "-0.00"
    return f"{'+' if q >= 0 else ''}{q:f}{unit}"


def margin_number(margin: float) -> str:
    """The margin as printed: short, and exactly the number it is (the checker reads it back)."""
    short = f"{margin:g}"
    return short if float(short) == margin else repr(float(margin))


def shown_digits(low: float, high: float, margin: float, unit: str) -> int:
    """The fewest decimals (from 2 for %, 3 otherwise) at which the rounded interval stays on the same side of 0
    and of +/-margin as the exact one, so the printed interval shows what the label read."""
    start = 2 if unit == "%" else 3
    exact = (is_inside(low, high, margin), excludes_zero(low, high))
    for d in range(start, MAX_DIGITS + 1):
        lo, hi = (float(signed(x, "", d)) for x in (low, high))
        if (is_inside(lo, hi, margin), excludes_zero(lo, hi)) == exact:
            return d
    return MAX_DIGITS + 1  # printed exactly (signed)


def is_inside(low: float, high: float, margin: float) -> bool:
    return bool(low >= -margin and high <= margin)


def excludes_zero(low: float, high: float) -> bool:
    return bool(low > 0 or high < 0)


def label(estimate: float, low: float, high: float, margin: float, *, level: float = 0.95, unit: str = "%",
          se: float | None = None, n: int | None = None, df_at: Callable[[Any], Any] | None = None,
          df_words: str = "n - 1", design: tuple[int, str] | None = None, no_interval: str = "") -> Label:
    """The label of an interval [low, high] (around `estimate`) against +/-margin; NaN bounds: UNDECIDED.

    Where the label is UNDECIDED and the interval's standard error `se` at `n` sweeps is given, it carries the
    sweeps its noise would need (sequential.project_sweeps with df_at / df_words; `design` = (sweeps_min,
    spending) of a paired sequential design to project for as well)."""
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    if any(v is None or math.isnan(v) for v in (low, high)):
        return Label(UNDECIDED, estimate, math.nan, math.nan, margin, level, unit, None,
                     no_interval or "too few sweeps")
    if low > high:
        raise ValueError(f"interval bounds out of order: [{low}, {high}]")
    inside, excl = is_inside(low, high, margin), excludes_zero(low, high)
    word = (SMALL_CHANGE if inside and excl else SHOWN_EQUIVALENT if inside else SHOWN_DIFFERENT if excl
            else UNDECIDED)
    projection = None
    if word == UNDECIDED and se is not None and n is not None:
        from specbook.core.sequential import project_sweeps  # sequential reads this module's words

        projection = project_sweeps(estimate, se, n, margin, ci=level, df_at=df_at, df_words=df_words,
                                    sequential=design)
    return Label(word, estimate, low, high, margin, level, unit, projection,
                 digits=shown_digits(low, high, margin, unit) if all(map(math.isfinite, (low, high))) else 2)


def projection_text(p: Projection, lab: Label) -> str:
    """How many sweeps would decide, and how that was projected."""
    m = lab.margin_text
    if p.to_equivalence is not None:
        fit = f"fit inside {m} at about {p.to_equivalence} sweeps"
    elif abs(lab.estimate) >= lab.margin:
        fit = f"never fit inside {m} (the estimate itself lies beyond it)"
    else:
        fit = f"not fit inside {m} within {p.cap} sweeps"
    if p.to_difference is not None:
        zero = f"exclude 0 at about {p.to_difference} sweeps"
    elif lab.estimate == 0:
        zero = "never exclude 0 (the estimate is 0)"
    else:
        zero = f"not exclude 0 within {p.cap} sweeps"
    seq = (f"; a sequential run (sequential.py) with sweeps_max = {p.sweeps_max} reaches its boundary there"
           if p.sweeps_max is not None else "")
    rough = (f" (rough: the sd itself rests on {p.sweeps_now} sweeps)" if p.sweeps_now <= ROUGH_BELOW_SWEEPS else "")
    return (f"At the observed noise (sd {signed(p.sd, lab.unit).lstrip('+')} per sweep, {p.sweeps_now} sweeps), the "
            f"estimate held at {lab.num(lab.estimate)}, it would {fit} and {zero}{seq}; projected by {p.method}"
            f"{rough}.")


# A stated rule's kind, as the report names it ("meets the stated rule (equivalent)").
RULE_NAMES = {"equivalence": "equivalent", "difference": "different"}


def expectation_met(expected: str, word: str) -> bool | None:
    """Is a label what the params expected before the run? 'different' needs SHOWN DIFFERENT, 'equivalent' a
    label inside the margin; None where nothing was expected ('unknown')."""
    if expected == "different":
        return word == SHOWN_DIFFERENT
    if expected == "equivalent":
        return word in INSIDE_WORDS
    return None


def expectation_text(expected: str, word: str) -> str:
    """'expected different: yes' (the separate line the colour belongs to)."""
    met = expectation_met(expected, word)
    return "" if met is None else f"expected {expected}: {'yes' if met else 'no'}"


def rule_text(meets: bool | None) -> str:
    return "" if meets is None else f"meets the stated rule: {'yes' if meets else 'no'}"


# --------------------------------------------------------------------------------------------------
# The checker


_NUM = r"[-+\u2212]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+\u2212]?inf"
_INTERVAL = re.compile(rf"\[\s*({_NUM})\s*(%?)\s*,\s*({_NUM})\s*(%?)\s*\]")
_MARGIN = re.compile(r"(?:\u00b1|\+/-)\s*(\d+(?:\.\d*)?|\.\d+)\s*(%?)")
_RATIO = re.compile(rf"(?<![\w.])({_NUM})x\b")
_SIZE = re.compile(rf"SHOWN DIFFERENT\s*:\s*({_NUM})\s*(%?)", re.IGNORECASE)


def _float(text: str) -> float:
    return float(text.replace("\u2212", "-"))


def parse_interval(text: str) -> tuple[float, float, str] | None:
    """(low, high, unit) of the first [low, high] in text; unit '%' when a bound carries one."""
    m = _INTERVAL.search(text or "")
    if not m:
        return None
    return _float(m.group(1)), _float(m.group(3)), "%" if (m.group(2) or m.group(4)) else ""


def parse_margin(*texts: str) -> tuple[float, str] | None:
    """(margin, unit) of the first +/-m found in the texts, in order."""
    for text in texts:
        m = _MARGIN.search(text or "")
        if m:
            return float(m.group(1)), m.group(2)
    return None


def _has(verdict: str, phrase: str) -> bool:
    return re.search(rf"(?<![A-Z]){re.escape(phrase)}(?![A-Z])", verdict) is not None


def claim_of(verdict: str) -> str | None:
    """What a verdict says about its interval: one of 'equivalent', 'small', 'different', 'moved',
    'not_equivalent', 'not_moved', 'undecided', 'loose_equivalent'; None: no interval claim."""
    v = verdict.upper()
    for phrase, claim in (("SMALL REAL CHANGE", "small"), ("NOT SHOWN EQUIVALENT", "not_equivalent"),
                          ("NOT SHOWN DIFFERENT", "not_moved"), ("NOT SHOWN TO MOVE", "not_moved"),
                          ("SHOWN EQUIVALENT", "equivalent"), ("SHOWN DIFFERENT", "different"),
                          ("UNDECIDED", "undecided"), ("EQUIVALENT", "loose_equivalent"),
                          ("DIFFERENT", "moved"), ("MOVED", "moved")):
        if _has(v, phrase):
            return claim
    return None


def check_headline(h: Mapping[str, Any] | Any) -> list[str]:
    """The ways one headline's label contradicts its interval (rules in the module docstring); [] when none."""
    get = (lambda k: str(h.get(k) or "")) if isinstance(h, Mapping) else (lambda k: str(getattr(h, k, "") or ""))
    verdict, interval = get("verdict"), get("interval")
    where = f"{get('comparison')!r}: {verdict!r}"
    claim = claim_of(verdict)
    iv = parse_interval(interval)
    problems: list[str] = []
    if iv is None:
        if claim not in (None, "undecided"):
            problems.append(f"{where} claims what an interval shows, but the headline has no interval")
        scoped = [w for w in RUN_SCOPED_WORDS if _has(verdict.upper(), w)]
        if scoped and RUN_SCOPE not in verdict.lower():
            problems.append(f"{where} judges without an interval ({', '.join(scoped)}) but does not say "
                            f"{RUN_SCOPE!r}")
        return problems
    low, high, unit = iv
    if low > high:
        return [f"{where}: interval [{low}, {high}] is out of order"]
    # a ratio's "no difference" is 1, not 0 (a cross-engine "0.16x undecided" reads its interval against 1)
    ratio = bool(_RATIO.search(verdict))
    excl = (low > 1 or high < 1) if ratio else excludes_zero(low, high)
    if claim is None:
        ratios = _RATIO.findall(verdict)
        if len(ratios) == 1:
            r = _float(ratios[0])
            if not low - 1e-9 * abs(low) <= r <= high + 1e-9 * abs(high) and not _rounded_inside(ratios[0], low, high):
                problems.append(f"{where}: the figure {r:g}x lies outside its interval [{low:g}, {high:g}]")
        return problems
    needs_margin = claim in ("equivalent", "small", "different", "not_equivalent", "undecided", "loose_equivalent")
    margin = parse_margin(interval, verdict)
    if needs_margin and margin is None:
        if claim in ("equivalent", "small", "loose_equivalent"):
            return [f"{where} claims equivalence but states no margin"]
        inside = None
    elif margin is not None:
        m, m_unit = margin
        if m_unit != unit:
            return [f"{where}: the interval is in {unit or 'its own unit'} and the margin in {m_unit or 'its own unit'}"]
        inside = is_inside(low, high, m)
    else:
        inside = None
    shown = f"[{low:g}{unit}, {high:g}{unit}]" + (f" vs \u00b1{margin[0]:g}{margin[1]}" if margin else "")
    if claim in ("equivalent", "loose_equivalent") and not inside:
        problems.append(f"{where}: the interval {shown} does not lie inside the margin")
    if claim == "equivalent" and inside and excl:
        problems.append(f"{where}: the interval {shown} excludes 0: a small real change, inside the margin")
    if claim == "small" and not (inside and excl):
        problems.append(f"{where}: the interval {shown} does not both exclude 0 and lie inside the margin")
    if claim in ("different", "moved") and not excl:
        problems.append(f"{where}: the interval {shown} includes 0")
    if claim == "different" and inside:
        problems.append(f"{where}: the interval {shown} lies inside the margin: a small real change, not different")
    if claim == "different":
        size = _SIZE.search(verdict)
        if size and not low <= _float(size.group(1)) <= high:
            problems.append(f"{where}: the stated size {size.group(1)}{size.group(2)} lies outside {shown}")
    if claim == "not_equivalent" and inside:
        problems.append(f"{where}: the interval {shown} lies inside the margin: shown equivalent")
    if claim == "not_moved" and excl:
        problems.append(f"{where}: the interval {shown} excludes 0: shown different")
    if claim == "undecided" and (excl or inside):
        problems.append(f"{where}: the interval {shown} decides "
                        f"({('excludes 1' if ratio else 'excludes 0') if excl else 'inside the margin'})")
    return problems


def _rounded_inside(text: str, low: float, high: float) -> bool:
    """A ratio printed with fewer digits than its bounds may round onto a bound: inside within its own rounding."""
    digits = len(text.split(".")[1]) if "." in text else 0
    half = 0.5 * 10 ** -digits
    return low - half <= _float(text) <= high + half


def check_summary(summary: Mapping[str, Any] | Any) -> list[str]:
    """Every contradiction in a summary block (a report_view.Summary or its summary.json document)."""
    heads = summary.get("headlines", []) if isinstance(summary, Mapping) else summary.headlines
    return [p for h in heads for p in check_headline(h)]


def check_report_folders(root: str | os.PathLike[str]) -> dict[str, list[str]]:
    """folder name -> contradictions, for every summary.json one or two levels under root; a folder that
    cannot be read is a problem of its own."""
    out: dict[str, list[str]] = {}
    root = Path(root)
    for path in sorted({*root.glob("*/summary.json"), *root.glob("*/*/summary.json")}):
        if path.parent.parent.name == "renders" or "renders" in path.relative_to(root).parts:
            continue  # earlier renders are kept as they were
        name = str(path.parent.relative_to(root))
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            out[name] = [f"{path}: cannot be read: {exc}"]
            continue
        out[name] = check_summary(doc)
    return out


def all_problems(found: Mapping[str, Iterable[str]]) -> list[str]:
    return [f"{name}: {p}" for name, problems in found.items() for p in problems]
