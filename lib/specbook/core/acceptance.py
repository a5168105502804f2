"""The acceptance model: every AL, acceptance rate and per-position rate in specbook is computed here.

One definition, whatever the engine or the source of the counts (counter deltas, log sums, llama.cpp
response timings):

    drafts          verification steps of the target that carried at least one draft token
    draft_tokens    draft tokens proposed in those steps
    accepted_tokens draft tokens the target kept (the bonus/corrected token is NOT counted)
    AL              = 1 + accepted_tokens / drafts     tokens emitted per verification step, bonus included
    acceptance rate = accepted_tokens / draft_tokens    fraction of proposed tokens kept
    rate at position i = accepted at position i / drafts, positions 1..k (1-based, as vLLM's
                     `position` label and llama.cpp's per-position counters number them after +1)

How each engine's raw figures map onto it (checked in the engines' sources, see tests/fixtures):

    vLLM       vllm:spec_decode_num_drafts_total -> drafts, ..._num_draft_tokens_total -> draft_tokens,
               ..._num_accepted_tokens_total -> accepted_tokens, ..._per_pos_total{position=p} -> the
               numerator at position p+1 (the label is 0-based). Its log's "Mean acceptance length" is AL.
    llama.cpp  llamacpp:spec_decode_num_drafts_total (n_draft_verif_steps) -> drafts,
               ..._num_draft_tokens_total (sum of timings.draft_n) -> draft_tokens,
               ..._num_accepted_tokens_total (sum of timings.draft_n_accepted) -> accepted_tokens,
               ..._per_pos_total{position} -> per-position numerators. Its log's "mean len" is AL;
               its "draft acceptance = x (a accepted / g generated)" is the acceptance rate, not AL.
               A response's `timings` carries no draft count, so one request's AL cannot come from
               timings alone: AL comes from the counters and timings stay raw figures.
    others     "acceptance rate" (accepted / drafted tokens) and "AL - 1" (accepted per draft) appear in
               other tools (vLLM's bench, papers); the conversions below go both ways.

Column names, one set everywhere (frames saved by collect() and tables shown in reports):
`drafts`, `draft_tokens`, `accepted_tokens`, `accepted_pos_1` .. `accepted_pos_k`, and derived `al`,
`acceptance_rate`; a source prefix (`counter_`, `log_`) may stand before each.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

DEFINITION = "AL = 1 + accepted / drafts (bonus token counted; drafts = verification steps with a draft)"
FIRST_POSITION = 1  # per-position figures are numbered 1..k everywhere

DRAFTS, DRAFT_TOKENS, ACCEPTED = "drafts", "draft_tokens", "accepted_tokens"
AL, RATE = "al", "acceptance_rate"
_POS_PREFIX = "accepted_pos_"
_POS_RE = re.compile(r"^(?P<prefix>.*)accepted_pos_(?P<pos>\d+)$")


def position_column(position: int, prefix: str = "") -> str:
    """`accepted_pos_<position>` (1-based), with an optional source prefix."""
    if position < FIRST_POSITION:
        raise ValueError(f"positions are numbered from {FIRST_POSITION}, got {position}")
    return f"{prefix}{_POS_PREFIX}{position}"


def position_columns(columns: Iterable[str], prefix: str = "") -> list[str]:
    """The per-position count columns of a frame with this prefix, in position order."""
    found = []
    for c in columns:
        m = _POS_RE.match(str(c))
        if m and m["prefix"] == prefix:
            found.append((int(m["pos"]), str(c)))
    return [c for _, c in sorted(found)]


class Acceptance(BaseModel):
    """Speculative-decoding counts over one window, and every figure derived from them."""

    model_config = ConfigDict(frozen=True)

    source: str = Field("", description="where the counts came from, e.g. 'vllm /metrics delta'")
    drafts: float | None = Field(None, description="None where the source has no draft count (llama.cpp timings)")
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: tuple[float, ...] = Field(
        default=(), description="accepted tokens at positions 1..k (index 0 is position 1)"
    )

    # -- derived figures ----------------------------------------------------------------------------
    @property
    def al(self) -> float:
        """1 + accepted / drafts; NaN without drafts (no speculation in the window, or no draft count)."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else math.nan

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else math.nan

    @property
    def accepted_per_draft(self) -> float:
        """AL - 1: what tools that do not count the bonus token call acceptance length."""
        return self.accepted_tokens / self.drafts if self.drafts else math.nan

    @property
    def mean_draft_length(self) -> float:
        return self.draft_tokens / self.drafts if self.drafts else math.nan

    @property
    def k(self) -> int:
        return len(self.accepted_per_position)

    def position_rates(self) -> dict[int, float]:
        """{position (1-based): accepted at that position / drafts}."""
        return {i + FIRST_POSITION: (a / self.drafts if self.drafts else math.nan)
                for i, a in enumerate(self.accepted_per_position)}

    @property
    def has_drafts(self) -> bool:
        return bool(self.drafts) or bool(self.draft_tokens)

    # -- combining ----------------------------------------------------------------------------------
    def __add__(self, other: Acceptance) -> Acceptance:
        n = max(self.k, other.k)
        pad = lambda t: tuple(t) + (0.0,) * (n - len(t))  # noqa: E731
        # a part without a draft count (llama.cpp timings) makes the total's draft count unknown, not smaller
        drafts = None if self.drafts is None or other.drafts is None else self.drafts + other.drafts
        return Acceptance(
            source=self.source if self.source == other.source else f"{self.source} + {other.source}",
            drafts=drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted_tokens=self.accepted_tokens + other.accepted_tokens,
            accepted_per_position=tuple(a + b for a, b in zip(pad(self.accepted_per_position),
                                                              pad(other.accepted_per_position), strict=True)),
        )

    @classmethod
    def total(cls, parts: Iterable[Acceptance], source: str = "") -> Acceptance:
        """The sum of windows (no part: zero counts)."""
        parts = list(parts)
        if not parts:
            return cls(source=source, drafts=0.0)
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        return out.model_copy(update={"source": source or out.source})

    # -- rows -------------------------------------------------------------------------------------
    def counts(self, prefix: str = "") -> dict[str, float | None]:
        """The raw counts as one flat row (what collect() saves)."""
        row: dict[str, float | None] = {
            f"{prefix}{DRAFTS}": self.drafts,
            f"{prefix}{DRAFT_TOKENS}": self.draft_tokens,
            f"{prefix}{ACCEPTED}": self.accepted_tokens,
        }
        for i, a in enumerate(self.accepted_per_position):
            row[position_column(i + FIRST_POSITION, prefix)] = a
        return row

    def figures(self, prefix: str = "") -> dict[str, float | None]:
        """Counts plus AL and acceptance rate (what reports show)."""
        return {**self.counts(prefix), f"{prefix}{AL}": self.al, f"{prefix}{RATE}": self.acceptance_rate}

    @classmethod
    def from_row(cls, row: Mapping[str, Any], prefix: str = "", source: str = "") -> Acceptance:
        """Read back what counts(prefix) wrote (a dict or a pandas row); missing counts are 0."""
        def num(key: str, default: float | None = 0.0) -> float | None:
            v = row.get(key, default) if hasattr(row, "get") else default
            if v is None or (isinstance(v, float) and math.isnan(v)):
                return default
            return float(v)

        keys = list(row.keys()) if hasattr(row, "keys") else []
        positions = [num(c) or 0.0 for c in position_columns(keys, prefix)]
        return cls(source=source, drafts=num(f"{prefix}{DRAFTS}", None), draft_tokens=num(f"{prefix}{DRAFT_TOKENS}") or 0.0,
                   accepted_tokens=num(f"{prefix}{ACCEPTED}") or 0.0, accepted_per_position=tuple(positions))

    # -- sources ----------------------------------------------------------------------------------
    @classmethod
    def from_counts(cls, source: str, drafts: float | None, draft_tokens: float, accepted_tokens: float,
                    accepted_per_position: Sequence[float] | Mapping[int, float] = ()) -> Acceptance:
        """From raw counts; a {0-based label: n} mapping of per-position counts is placed by its labels
        (label p is position p + 1; a missing label counts 0)."""
        if isinstance(accepted_per_position, Mapping):
            by_label = {int(k): v for k, v in accepted_per_position.items()}
            accepted_per_position = [by_label.get(i, 0) for i in range(max(by_label, default=-1) + 1)]
        return cls(source=source, drafts=None if drafts is None else float(drafts), draft_tokens=float(draft_tokens),
                   accepted_tokens=float(accepted_tokens),
                   accepted_per_position=tuple(float(x) for x in accepted_per_position))

    @classmethod
    def from_llamacpp_timings(cls, timings: Iterable[Mapping[str, object]]) -> Acceptance:
        """Sum of llama.cpp responses' `timings.draft_n` / `draft_n_accepted` (no draft count: AL is NaN)."""
        draft_tokens = accepted = 0.0
        for t in timings:
            draft_tokens += float(t.get("draft_n", 0) or 0)  # type: ignore[arg-type]
            accepted += float(t.get("draft_n_accepted", 0) or 0)  # type: ignore[arg-type]
        return cls(source="llamacpp response timings", drafts=None, draft_tokens=draft_tokens,
                   accepted_tokens=accepted)


# --- frames ---------------------------------------------------------------------------------------


def frame_acceptance(frame: Any, prefix: str = "", source: str = "") -> Acceptance:
    """The summed counts of a frame's rows (e.g. log intervals of one window): AL is token-weighted,
    1 + sum(accepted) / sum(drafts), never a mean of per-row ALs."""
    def total(col: str) -> float:
        return float(frame[col].fillna(0).sum()) if col in frame else 0.0

    drafts = total(f"{prefix}{DRAFTS}") if f"{prefix}{DRAFTS}" in frame else None  # e.g. llama.cpp log lines
    return Acceptance(
        source=source, drafts=drafts, draft_tokens=total(f"{prefix}{DRAFT_TOKENS}"),
        accepted_tokens=total(f"{prefix}{ACCEPTED}"),
        accepted_per_position=tuple(total(c) for c in position_columns(frame.columns, prefix)),
    )


def frame_al(frame: Any, prefix: str = "") -> float:
    """Token-weighted AL of a frame's rows (NaN without drafts)."""
    for col in (f"{prefix}{DRAFTS}", f"{prefix}{ACCEPTED}"):
        if col not in frame:
            raise KeyError(f"frame_al needs column {col!r}; the frame has {list(frame.columns)}")
    return frame_acceptance(frame, prefix).al


def per_position_frame(items: Iterable[tuple[Mapping[str, Any], Acceptance]]) -> Any:
    """One row per (keys..., position): accepted at that position, drafts and their rate (1-based)."""
    import pandas as pd

    rows = []
    key_names: list[str] = []
    for keys, acc in items:
        key_names = key_names or list(keys)
        for pos, rate in acc.position_rates().items():
            rows.append({**keys, "position": pos, "accepted": acc.accepted_per_position[pos - FIRST_POSITION],
                         DRAFTS: acc.drafts, "rate": rate})
    return pd.DataFrame(rows, columns=[*key_names, "position", "accepted", DRAFTS, "rate"])


def upgrade_position_columns(frame: Any, prefix: str = "") -> Any:
    """Frames saved before positions were 1-based (`accepted_pos_0` ..): renumbered from 1; else as is."""
    zero = f"{prefix}{_POS_PREFIX}0"
    if zero not in frame.columns:
        return frame
    old = position_columns(frame.columns, prefix)
    return frame.rename(columns={c: position_column(i + FIRST_POSITION, prefix) for i, c in enumerate(old)})


# --- other tools' definitions ----------------------------------------------------------------------


def al_from_accepted_per_draft(value: float) -> float:
    """Tools that report accepted tokens per draft (AL - 1)."""
    return 1.0 + value


def accepted_per_draft_from_al(al: float) -> float:
    return al - 1.0


def al_from_acceptance_rate(rate: float, mean_draft_length: float) -> float:
    """Tools that report accepted / drafted tokens: AL needs the mean draft length as well."""
    return 1.0 + rate * mean_draft_length
