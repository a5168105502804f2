"""Equal work across two engines: the common prefix of their outputs and what each did on it.

When two engines' greedy outputs for one cell part (a diverged or length-mismatched cell), the tokens
both emitted are the common prefix. Re-running the cell on both with `max_tokens` set to that length
makes them emit the same tokens by construction, so a speed ratio on the re-run compares equal work;
`equal_work_request` builds that request. `prefix_acceptance` counts each engine's speculative steps
and accepted draft tokens up to the first divergence ("32 tokens in 11 steps vs 12"), from plain
(anchor_position, accepted_count) pairs or, `prefix_acceptance_of_steps`, from the steps the proposal
traces derive (specbook.traces.derive: `emitted_before`, `accepted`, `status`).

`anchor_position` is the number of tokens already in the sequence when the step proposed (prompt
included), as in the trace records; `accepted_count` how many of its proposed tokens were accepted.
The step then emits accepted_count + 1 tokens (the accepted drafts and the target's own next token).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specbook.core.errors import SpecbookError
from specbook.traces.derive import VERIFIED
from specbook.traces.derive import common_prefix as common_prefix_len

if TYPE_CHECKING:
    import pandas as pd

    from specbook.serve.client import ChatRequest

__all__ = ["PrefixAcceptance", "common_prefix_len", "equal_work_request", "prefix_acceptance",
           "prefix_acceptance_of_steps"]


def equal_work_request(request: ChatRequest, a: Sequence[int], b: Sequence[int]) -> ChatRequest | None:
    """`request` with max_tokens = the common-prefix length of outputs `a` and `b` (None: they share nothing).

    Greedy decoding makes both engines emit exactly that prefix again, so the re-run is equal work.
    `ignore_eos` keeps an engine from stopping early where the prefix ends in what it reads as an end.
    """
    n = common_prefix_len(a, b)
    if n == 0:
        return None
    return request.model_copy(update={"max_tokens": n, "ignore_eos": True})


@dataclass(frozen=True)
class PrefixAcceptance:
    """One engine's speculative steps on the first `tokens` output tokens (the common prefix)."""

    tokens: int
    steps: int
    accepted_tokens: int

    def describe(self) -> str:
        return f"{self.tokens} tokens in {self.steps} steps ({self.accepted_tokens} accepted draft tokens)"


def prefix_acceptance(
    steps: Iterable[tuple[int, int]], prompt_tokens: int, prefix_len: int
) -> PrefixAcceptance:
    """Steps and accepted draft tokens up to the first divergence, from (anchor_position, accepted_count).

    A step counts when it starts inside the prefix (output tokens already emitted below `prefix_len`);
    its accepted tokens count as far as they stay inside the prefix. The first output token comes from
    the prompt's forward pass, not from a speculative step.
    """
    if prompt_tokens < 0:
        raise SpecbookError(f"prefix_acceptance: prompt_tokens ({prompt_tokens}) must be >= 0")
    emitted = []
    for i, (anchor, count) in enumerate(steps):
        if anchor - prompt_tokens < 0:
            raise SpecbookError(f"prefix_acceptance: step {i} anchors at {anchor}, inside the prompt "
                                f"({prompt_tokens} tokens): wrong prompt length or anchor layout")
        emitted.append((anchor - prompt_tokens, count))
    return _count(emitted, prefix_len)


def prefix_acceptance_of_steps(steps: pd.DataFrame, prefix_len: int) -> PrefixAcceptance:
    """The same from one request's derived trace steps (traces.derive.derive_request_steps): only the
    steps the target verified count (not empty, prefill-time or after-the-end proposals)."""
    verified = steps[steps["status"] == VERIFIED]
    return _count(zip(verified["emitted_before"].astype(int), verified["accepted"].astype(int), strict=True),
                  prefix_len)


def _count(emitted_accepted: Iterable[tuple[int, int]], prefix_len: int) -> PrefixAcceptance:
    if prefix_len < 0:
        raise SpecbookError(f"prefix_acceptance: prefix_len ({prefix_len}) must be >= 0")
    n_steps = accepted = 0
    for i, (position, count) in enumerate(emitted_accepted):
        if count < 0:
            raise SpecbookError(f"prefix_acceptance: step {i} has accepted count {count} < 0")
        if position >= prefix_len:
            continue
        n_steps += 1
        accepted += min(count, prefix_len - position)
    return PrefixAcceptance(tokens=prefix_len, steps=n_steps, accepted_tokens=accepted)
