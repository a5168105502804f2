"""Guards that decide whether one cross-engine cell compares equal work.

A speed ratio between two engines means something only if both produced the same kind of output:
a loop is trivially draftable, and 84 tokens of reasoning are not 128 tokens of loop. Every check
here is a pure function on token ids, but one on words: an output that turned into a count its prompt
never asked for (`left_task_reason`). `guard_cell` gathers them into flags with printed reasons.
A flagged cell is not comparable and stays out of the headline ratio.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

Tokens = Sequence[int]

# Flag names, as shown in the report's flags column.
LENGTH_MISMATCH = "length_mismatch"
DEGENERATE = "degenerate"
DIVERGED = "diverged"
SPEC_MISMATCH = "spec_on_off_mismatch"
REPEATS_DIFFER = "repeats_differ"
MISSING = "missing_output"
PROMPT_MISMATCH = "prompt_tokens_differ"
LEFT_TASK = "left_task"


class GuardThresholds(BaseModel):
    """Where each guard fires; the defaults flag the real case (8 distinct ids in 128 tokens)."""

    model_config = ConfigDict(extra="forbid")

    # A low distinct-id ratio is reported beside a repeated n-gram, never alone: a plain count ("1, 2, 3, ...",
    # tokenised digit by digit) has few distinct ids and no repeated n-gram, and is ordinary work.
    min_distinct_ratio: float = Field(
        0.3, ge=0.0, le=1.0, description="distinct ids / tokens below this is named beside a repeated n-gram"
    )
    distinct_min_tokens: int = Field(32, ge=1, description="the distinct ratio is named only from this many tokens")
    loop_max_period: int = Field(64, ge=1, description="longest repeated n-gram (in tokens) looked for")
    loop_min_repeats: float = Field(3.0, ge=2.0, description="a periodic run must repeat its n-gram this many times")
    loop_min_fraction: float = Field(
        0.25, ge=0.0, le=1.0, description="and cover at least this fraction of the output to be a loop"
    )
    loop_min_tokens: int = Field(16, ge=1, description="and span at least this many tokens")
    # A loop with a counter in it ("1. Yes\n2. Yes\n...") is not periodic token for token: one n-gram
    # (". Yes\n") recurs between changing ids. It is found by how much of the output that n-gram covers.
    ngram_min_len: int = Field(3, ge=2, description="shortest n-gram (tokens) whose recurrence can make a loop")
    ngram_max_len: int = Field(32, ge=2, description="longest n-gram (tokens) looked for")
    ngram_min_repeats: int = Field(4, ge=2, description="non-overlapping occurrences a recurring n-gram needs")
    ngram_min_coverage: float = Field(
        0.5, ge=0.0, le=1.0, description="share of the output its occurrences must cover to make it degenerate"
    )
    length_tolerance: float = Field(0.0, ge=0.0, description="relative completion-length difference tolerated")
    divergence_tolerance: float = Field(
        0.0, ge=0.0, le=1.0, description="a first difference in the last fraction of the shorter output is tolerated"
    )
    # An output that turned into a count its prompt never asked for ("Write the letter A eighty times" ->
    # "A, 8, 9, 10, ...") has no repeated n-gram and passes the loop guards: it left its prompt's task.
    count_min_share: float = Field(
        0.6, ge=0.0, le=1.0, description="a count covering more than this share of an output's words, where its "
                                         "prompt asks for no count, flags the cell left_task")
    count_min_values: int = Field(8, ge=2, description="and running through at least this many values")


@dataclass(frozen=True)
class Loop:
    """The longest periodic run found: `period` tokens repeated from `start` for `span` tokens."""

    start: int
    period: int
    span: int

    @property
    def repeats(self) -> float:
        return self.span / self.period


def distinct_token_ratio(tokens: Tokens) -> float:
    """Distinct token ids over tokens (1.0 for an empty output, which cannot be a loop)."""
    return len(set(tokens)) / len(tokens) if tokens else 1.0


def longest_loop(tokens: Tokens, max_period: int = 64) -> Loop | None:
    """The longest stretch where tokens[i] == tokens[i - p] for one period p (a repeated n-gram).

    The run of matches for period p spans p tokens more than its count of matches, since the first
    period is what repeats. Ties go to the shortest period. O(len * max_period).
    """
    best: Loop | None = None
    n = len(tokens)
    for period in range(1, min(max_period, n // 2) + 1):
        run = 0
        for i in range(period, n + 1):
            if i < n and tokens[i] == tokens[i - period]:
                run += 1
                continue
            if run >= period:  # at least two full copies of the n-gram
                span = run + period
                if best is None or span > best.span:
                    best = Loop(start=i - span, period=period, span=span)
            run = 0
    return best


@dataclass(frozen=True)
class RepeatedNgram:
    """The n-gram whose non-overlapping occurrences cover most of an output (gaps between them allowed)."""

    ngram: tuple[int, ...]
    count: int
    first: int
    total: int  # tokens in the output

    @property
    def coverage(self) -> float:
        return len(self.ngram) * self.count / self.total if self.total else 0.0


def _non_overlapping(positions: list[int], n: int) -> list[int]:
    kept: list[int] = []
    for p in positions:
        if not kept or p >= kept[-1] + n:
            kept.append(p)
    return kept


def _counts_through(gram: tuple[int, ...], kept: list[int], toks: list[int]) -> bool:
    """True when the n-gram's own ids also fill the short gaps between its occurrences.

    Then it is part of a changing sequence, not a repeat: in "100, 101, 102" (digit by digit) ", 1"
    recurs, but its "1" is also one of the digits that change between occurrences. The counter of a
    loop ("1. Yes\n2. Yes\n") fills the gaps with ids the repeated ". Yes\n" never holds.
    """
    n = len(gram)
    between: set[int] = set()
    for a, b in zip(kept, kept[1:], strict=False):
        gap = toks[a + n:b]
        if len(gap) <= n:  # a counter's slot; a long gap is other text
            between.update(gap)
    return not between.isdisjoint(gram)


def most_covering_ngram(tokens: Tokens, min_len: int = 3, max_len: int = 32, min_repeats: int = 2) -> RepeatedNgram | None:
    """The n-gram (min_len..max_len tokens, at least `min_repeats` non-overlapping occurrences) covering most tokens.

    An n-gram that counts through its gaps (`_counts_through`) is not a repeat and is passed over.

    Ties go to the longer n-gram. O(len * max_len^2) at worst; outputs here are a few hundred tokens.
    """
    toks = list(tokens)
    n_total = len(toks)
    best: RepeatedNgram | None = None
    for n in range(min_len, min(max_len, n_total // 2) + 1):
        where: dict[tuple[int, ...], list[int]] = {}
        for i in range(n_total - n + 1):
            where.setdefault(tuple(toks[i:i + n]), []).append(i)
        for gram, positions in where.items():
            if len(positions) < min_repeats or n * len(positions) < (best.coverage * n_total if best else 0):
                continue
            kept = _non_overlapping(positions, n)
            if len(kept) < min_repeats or _counts_through(gram, kept, toks):
                continue
            found = RepeatedNgram(gram, len(kept), kept[0], n_total)
            if best is None or found.coverage >= best.coverage:
                best = found
    return best


def degenerate_reasons(tokens: Tokens, th: GuardThresholds | None = None) -> list[str]:
    """Why this output is degenerate (empty list: it is not).

    Degenerate means a repeated n-gram covers it: an exact periodic run (`longest_loop`), or one n-gram
    recurring between changing ids (a loop with a counter) over `ngram_min_coverage` of it. A low
    distinct-id ratio is added to the reasons when one of those fires; on its own it decides nothing.
    """
    th = th or GuardThresholds()
    reasons: list[str] = []
    n = len(tokens)
    loop = longest_loop(tokens, th.loop_max_period)
    if (
        loop is not None
        and loop.repeats >= th.loop_min_repeats
        and loop.span >= th.loop_min_tokens
        and loop.span >= th.loop_min_fraction * n
    ):
        reasons.append(
            f"a {loop.period}-token n-gram repeats {loop.repeats:.1f}x from token {loop.start} "
            f"({loop.span} of {n} tokens)"
        )
    gram = None if reasons else most_covering_ngram(tokens, th.ngram_min_len, th.ngram_max_len, th.ngram_min_repeats)
    if gram is not None and gram.coverage >= th.ngram_min_coverage:
        reasons.append(
            f"a {len(gram.ngram)}-token n-gram recurs {gram.count}x from token {gram.first}, covering "
            f"{len(gram.ngram) * gram.count} of {n} tokens ({gram.coverage:.0%} >= {th.ngram_min_coverage:.0%})"
        )
    if reasons and n >= th.distinct_min_tokens:
        ratio = distinct_token_ratio(tokens)
        if ratio < th.min_distinct_ratio:
            reasons.append(
                f"{len(set(tokens))} distinct token ids in {n} tokens (ratio {ratio:.2f} < {th.min_distinct_ratio})"
            )
    return reasons


@dataclass(frozen=True)
class Count:
    """The longest count in a text: integers from `first` to `last`, never falling, rising by one at most
    ("1. 1 2. 2" counts too), `words` of the text's `total` words."""

    first: int
    last: int
    words: int
    total: int

    @property
    def share(self) -> float:
        return self.words / self.total if self.total else 0.0

    def describe(self) -> str:
        return f"{self.first}, {self.first + 1}, ... {self.last}: {self.words} of its {self.total} words"


_WORD = re.compile(r"[^\W\d_]+|\d+")
_ASKS_TO_COUNT = re.compile(r"\bcount", re.IGNORECASE)


def longest_count(text: str) -> Count | None:
    """The longest count among a text's words (letters or digits runs), None when it holds no integer."""
    words = _WORD.findall(text or "")
    best: Count | None = None
    start = prev = None
    n = 0
    for w in [*words, ""]:
        value = int(w) if w.isdigit() else None
        if value is not None and prev is not None and 0 <= value - prev <= 1:
            n += 1
        else:
            if start is not None and (best is None or n > best.words):
                best = Count(start, prev, n, len(words))
            start, n = (value, 1) if value is not None else (None, 0)
        prev = value if value is not None else None
    return best


def left_task_reason(output_text: str, prompt_text: str | None, th: GuardThresholds | None = None) -> str | None:
    """Why an output left its prompt's task (None: it did not, or the prompt is not known): the output turned
    into a count over more than `count_min_share` of its words, where the prompt asks for no count."""
    th = th or GuardThresholds()
    if prompt_text is None or _ASKS_TO_COUNT.search(prompt_text):
        return None
    count = longest_count(output_text)
    if count is None or count.last - count.first + 1 < th.count_min_values or count.share <= th.count_min_share:
        return None
    return (f"the output turned into a count ({count.describe()}, {count.share:.0%} > {th.count_min_share:.0%}) "
            "where its prompt asks for no count")


def first_divergence(a: Tokens, b: Tokens) -> int | None:
    """Index of the first differing token; the shorter length if one is a prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def length_mismatch(a_len: int, b_len: int, tolerance: float = 0.0) -> bool:
    """True when completion lengths differ by more than `tolerance` of the longer one."""
    return abs(a_len - b_len) > tolerance * max(a_len, b_len)


def divergence_is_material(index: int | None, a_len: int, b_len: int, tolerance: float = 0.0) -> bool:
    """A first difference counts unless it falls in the last `tolerance` fraction of the shorter output.

    When one output is a prefix of the other the index equals the shorter length: that is a length
    mismatch, not a divergence.
    """
    if index is None:
        return False
    return index < (1.0 - tolerance) * min(a_len, b_len)


@dataclass
class SideOutputs:
    """One engine's token ids for one prompt and lane: the warm repeats and its own spec-off run.

    `repeats` are the warm runs' token ids (greedy: they should all be equal); `spec_off` is the same
    engine's output for the prompt with speculation off (None for the off lane itself).
    """

    label: str
    repeats: list[list[int]] = field(default_factory=list)
    spec_off: list[int] | None = None
    # The server's own count (usage.completion_tokens). Text drops special tokens (an EOS sampled
    # under ignore_eos), so lengths are compared on this count when both sides give it.
    completion_tokens: int | None = None
    text: str | None = None  # the first repeat's output text (the left-task guard reads words, not ids)

    @property
    def tokens(self) -> list[int]:
        return self.repeats[0] if self.repeats else []

    @property
    def length(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else len(self.tokens)


class GuardVerdict(BaseModel):
    """The guards' result for one cell; `comparable` is False as soon as one flag is raised."""

    flags: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    first_divergence: int | None = None
    ours_tokens: int = 0
    oracle_tokens: int = 0
    ours_distinct_ratio: float = 1.0
    oracle_distinct_ratio: float = 1.0

    @property
    def comparable(self) -> bool:
        return not self.flags

    def add(self, flag: str, reason: str) -> None:
        if flag not in self.flags:
            self.flags.append(flag)
        self.reasons.append(reason)


def _side_checks(side: SideOutputs, verdict: GuardVerdict, th: GuardThresholds, prompt_text: str | None) -> None:
    if not side.repeats:
        verdict.add(MISSING, f"{side.label}: no output recorded")
        return
    for reason in degenerate_reasons(side.tokens, th):
        verdict.add(f"{DEGENERATE}_{side.label}", f"{side.label} output is degenerate: {reason}")
    off_task = left_task_reason(side.text, prompt_text, th) if side.text is not None else None
    if off_task:
        verdict.add(f"{LEFT_TASK}_{side.label}", f"{side.label} left its prompt's task: {off_task}")
    for i, other in enumerate(side.repeats[1:], start=1):
        idx = first_divergence(side.tokens, other)
        if idx is not None:
            verdict.add(
                f"{REPEATS_DIFFER}_{side.label}",
                f"{side.label}: repeat {i} differs from repeat 0 at token {idx} (greedy should repeat)",
            )
            break
    if side.spec_off is not None:
        idx = first_divergence(side.spec_off, side.tokens)
        if idx is not None:
            verdict.add(
                f"{SPEC_MISMATCH}_{side.label}",
                f"{side.label}: spec-on output differs from its spec-off output at token {idx} "
                f"(text tokens: on {len(side.tokens)}, off {len(side.spec_off)})",
            )


def guard_cell(
    ours: SideOutputs,
    oracle: SideOutputs,
    th: GuardThresholds | None = None,
    *,
    prompt_tokens: tuple[int | None, int | None] = (None, None),
    prompt_text: str | None = None,
) -> GuardVerdict:
    """Every guard on one cell (prompt x lane): both sides' outputs, lengths, divergence, spec on/off, and
    whether an output left its prompt's task (`prompt_text`, the user's words; None: not judged).

    `prompt_tokens` (ours, oracle) as the servers counted them: a difference means the chat template
    or tokenizer differ, so the engines were not given the same work.
    """
    th = th or GuardThresholds()
    a, b = ours.tokens, oracle.tokens
    verdict = GuardVerdict(
        ours_tokens=ours.length,
        oracle_tokens=oracle.length,
        ours_distinct_ratio=distinct_token_ratio(a),
        oracle_distinct_ratio=distinct_token_ratio(b),
    )
    _side_checks(ours, verdict, th, prompt_text)
    _side_checks(oracle, verdict, th, prompt_text)
    p_ours, p_oracle = prompt_tokens
    if p_ours is not None and p_oracle is not None and p_ours != p_oracle:
        verdict.add(
            PROMPT_MISMATCH,
            f"prompt lengths differ: {ours.label} {p_ours} vs {oracle.label} {p_oracle} tokens (template/tokenizer)",
        )
    if ours.repeats and oracle.repeats:
        if length_mismatch(ours.length, oracle.length, th.length_tolerance):
            verdict.add(
                LENGTH_MISMATCH,
                f"completion lengths differ: {ours.label} {ours.length} vs {oracle.label} {oracle.length} tokens",
            )
        verdict.first_divergence = first_divergence(a, b)
        if divergence_is_material(verdict.first_divergence, len(a), len(b), th.divergence_tolerance):
            verdict.add(
                DIVERGED,
                f"outputs diverge at token {verdict.first_divergence} "
                f"(text tokens: {ours.label} {len(a)}, {oracle.label} {len(b)})",
            )
    return verdict
