"""The counts vLLM's log does not print, recovered from what it does print, and a log's counts summed.

vLLM prints per interval the accepted and drafted tokens, the AL and the per-position acceptance rates,
not the drafts nor the accepted tokens per position: `recover_drafts` finds the drafts, `position_table`
the per-position counts, and `CountSums` adds a log's intervals up exactly. The AL, acceptance rate and
per-position figures then come from the acceptance model (specbook.core.acceptance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from specbook.core.acceptance import Acceptance

if TYPE_CHECKING:
    import numpy as np

SOURCE = "vllm log"  # Acceptance.source of every figure read from a vLLM log

# The printed per-position rate (%.3f) pins the integer count behind it while drafts < 1000.
_EXACT_DRAFTS = 1000


def recover_drafts(al: float, accepted: int, drafted: int, rates: Sequence[float]) -> int:
    """Drafts in one interval, which vLLM's log does not print, from what it does print.

    A draft holds at most k tokens, so drafts lie in [ceil(drafted / k), drafted]; they equal drafted / k
    only when every draft is full (draft models). ngram drafts can be shorter, so the count is the
    integer in that range that best reproduces what vLLM printed from it: the AL (1 + accepted / drafts,
    %.2f) and every per-position rate (accepted_i / drafts, %.3f, whose numerators are integers). A value
    vLLM printed as nan/inf (it divides by zero drafts) is left out of the fit; with neither AL nor rates
    to fit, the count is ceil(drafted / k), the fewest drafts that hold the drafted tokens.
    """
    k = len(rates)
    al_known = math.isfinite(al)
    if not k:  # pre-per-position format: recover it from AL = 1 + accepted / drafts
        if al_known and al > 1 and accepted:
            return min(drafted, int(round(accepted / (al - 1))))  # a draft holds a drafted token at least
        return 0
    lo = -(-drafted // k)
    if drafted == lo * k or accepted == 0 or (al_known and al <= 1):
        return lo
    rates_known = all(math.isfinite(r) for r in rates)
    if al_known:
        guess = accepted / (al - 1)
    elif rates_known and sum(rates) > 0:
        guess = accepted / sum(rates)
    else:
        return lo
    if not math.isfinite(guess):  # rates that add up to almost 0 for accepted tokens: as any guess past drafted
        return lo
    hi = drafted

    def misfit(n: int) -> tuple[float, float]:
        al_err = abs(1 + accepted / n - al) if al_known else 0.0
        rate_err = max(abs(r * n - round(r * n)) for r in rates) if rates_known else 0.0
        # printed values are rounded: within half a unit of the last digit counts as a fit
        return (max(0.0, al_err - 0.005), max(0.0, rate_err - 0.0005 * n))

    window = range(max(lo, int(guess) - 3), min(hi, int(guess) + 4) + 1) or range(lo, lo + 1)
    return min(window, key=lambda n: (misfit(n), abs(n - guess)))


def position_table(rates: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """The per-position rule, row by row: rates (n, k) x drafts (n,), rounded to the integer count vLLM
    divided where the printed rate (%.3f) pins it down (drafts < 1000), else the unrounded product; NaN
    where a rate or a draft count is not a number. np.rint rounds half to even, as round() does."""
    import numpy as np

    product = rates * np.asarray(drafts, dtype=np.float64)[:, None]
    counts = np.where((drafts < _EXACT_DRAFTS)[:, None], np.rint(product), product)
    counts[~np.isfinite(counts)] = np.nan
    return counts


def position_counts(rates: Sequence[float], drafts: float) -> list[float]:
    """Accepted tokens at positions 1..k from one interval's printed rates and its drafts (see position_table)."""
    import numpy as np

    table = position_table(np.asarray(rates, dtype=np.float64).reshape(1, -1), np.asarray([drafts], dtype=np.float64))
    return table[0].tolist()


class IntervalRows:
    """SpecDecoding figures of intervals in file order, as the counts are recovered and summed from them."""

    __slots__ = ("accepted", "al", "drafted", "ks", "rates")

    def __init__(self) -> None:
        self.al: list[float] = []
        self.accepted: list[int] = []
        self.drafted: list[int] = []
        self.rates: list[float] = []  # every row's rates, one after the other
        self.ks: list[int] = []

    def add(self, al: float, accepted: int, drafted: int, rates: Sequence[float]) -> None:
        self.al.append(al)
        self.accepted.append(accepted)
        self.drafted.append(drafted)
        self.rates.extend(rates)
        self.ks.append(len(rates))

    def __len__(self) -> int:
        return len(self.accepted)

    def counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(drafts (n,), accepted per position (n, K) with NaN past a row's own k, valid (n, K)): drafts by
        recover_drafts (drafted / k where every draft is full), positions by position_table, and 0 at
        every position of an interval that accepted nothing, whatever rate it printed (0.000 or nan)."""
        import numpy as np

        n = len(self.accepted)
        ks = np.asarray(self.ks, dtype=np.int64)
        width = int(ks.max()) if n else 0
        flat = np.asarray(self.rates, dtype=np.float64)
        uniform = bool(n) and bool((ks == width).all())
        offsets = np.cumsum(ks) - ks
        if uniform:
            rates = flat.reshape(n, width)
            valid = np.ones((n, width), dtype=bool)
        else:
            rates = np.full((n, width), np.nan)
            rows = np.repeat(np.arange(n), ks)
            columns = np.arange(len(flat)) - np.repeat(offsets, ks)
            rates[rows, columns] = flat
            valid = np.arange(width)[None, :] < ks[:, None]
        drafted = np.asarray(self.drafted, dtype=np.int64)
        per_draft = np.maximum(ks, 1)
        full = (ks > 0) & (drafted % per_draft == 0)
        drafts = np.where(full, drafted // per_draft, 0)
        for i in np.flatnonzero(~full).tolist():  # short drafts (ngram) or no per-position rates
            start = int(offsets[i])
            drafts[i] = recover_drafts(self.al[i], self.accepted[i], self.drafted[i],
                                       self.rates[start : start + self.ks[i]])
        counts = position_table(rates, drafts)
        counts[np.asarray(self.accepted, dtype=np.int64) == 0] = 0.0
        if not uniform:
            counts[~valid] = np.nan
        return drafts, counts, valid


class CountSums:
    """A log's interval counts added up; the one place its totals are. Sums are exact, so they do not depend on
    the order or the batches they are added in: integer counts as integers, an unrounded per-position count
    (intervals of 1000 drafts or more) as the exact fraction its float is, rounded to a float once at the end.
    Rows wait in `pending` and are counted a batch at a time."""

    __slots__ = ("accepted", "drafted", "drafts", "fractions", "integers", "ks", "nan", "pending")

    def __init__(self) -> None:
        self.drafts = 0
        self.drafted = 0
        self.accepted = 0
        self.integers: list[int] = []  # per position
        self.fractions: list[Fraction] = []  # per position
        self.nan: list[bool] = []  # per position: a count that is not a number was added
        self.ks: set[int] = set()
        self.pending = IntervalRows()

    def add(self, al: float, accepted: int, drafted: int, rates: Sequence[float]) -> None:
        self.pending.add(al, accepted, drafted, rates)

    def _widen(self, width: int) -> None:
        grow = width - len(self.integers)
        if grow > 0:
            self.integers += [0] * grow
            self.fractions += [Fraction(0)] * grow
            self.nan += [False] * grow

    def flush(self) -> None:
        rows = self.pending
        if not len(rows):
            return
        import numpy as np

        self.pending = IntervalRows()
        drafts, counts, valid = rows.counts()
        self.drafts += int(drafts.sum())
        self.drafted += sum(rows.drafted)
        self.accepted += sum(rows.accepted)
        self.ks.update(rows.ks)
        width = counts.shape[1]
        self._widen(width)
        counts = np.where(valid, counts, 0.0)  # a position past a row's k adds nothing
        nan = np.isnan(counts)
        counts[nan] = 0.0
        whole = drafts < _EXACT_DRAFTS  # rounded counts: integers (far below 2**53)
        integers = counts[whole].astype(np.int64).sum(axis=0).tolist()
        found_nan = nan.any(axis=0).tolist()
        for i in range(width):
            self.integers[i] += integers[i]
            self.nan[i] = self.nan[i] or found_nan[i]
        for row in counts[~whole].tolist():  # unrounded: rare (1000 drafts in one stats interval)
            for i, value in enumerate(row):
                self.fractions[i] += Fraction(value)

    def merge(self, other: CountSums) -> None:
        """Add another part's sums (the same log, read elsewhere)."""
        self.flush()
        other.flush()
        self.drafts += other.drafts
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.ks |= other.ks
        self._widen(len(other.integers))
        for i in range(len(other.integers)):
            self.integers[i] += other.integers[i]
            self.fractions[i] += other.fractions[i]
            self.nan[i] = self.nan[i] or other.nan[i]

    @property
    def positions(self) -> list[float]:
        self.flush()
        return [math.nan if nan else float(whole + part)
                for whole, part, nan in zip(self.integers, self.fractions, self.nan, strict=True)]

    def acceptance(self) -> Acceptance:
        positions = self.positions  # flushes first
        return Acceptance.from_counts(SOURCE, self.drafts, self.drafted, self.accepted, positions)

    @property
    def k(self) -> int | None:
        self.flush()
        return next(iter(self.ks)) if len(self.ks) == 1 else None
