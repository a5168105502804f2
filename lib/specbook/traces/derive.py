"""Accepted count per draft step, derived by matching the traced proposals against the emitted tokens.

Greedy verification keeps the longest prefix of a draft that equals what the target emits, then emits
one more token (bonus or correction). So, given a request's emitted ids and a draft proposed after
`o = anchor_pos - prompt_len` of them, the accepted count is the common prefix of the draft and
emitted[o:]. Summed over steps this gives the same counts as the engine's counters (drafts, draft
tokens, accepted tokens, accepted per position), which the trace pass checks for the same window.

A request that stops inside a step (max_tokens, EOS, a stop string) shows only part of what the target
checked: the engine may have accepted proposals past the last emitted token (vLLM counts what its
rejection sampler kept, before the stop cuts the output). Such a step is `cut`: its derived count is a
lower bound and `accepted_max` (all its proposals) the upper one; counts_agree checks the counters lie
between.

llama.cpp's verifier (common_sampler_sample_and_accept_n) ends a step at an end-of-generation token the
target samples short of the draft's end, even where the draft proposed that very token: the EOG is the
target's own token of the step, not an accepted one (only a trailing EOG, at the draft's last position, is
accepted). So for a request that stopped on an EOG (`eog_stop`), the step whose match reaches that last
token accepted one fewer than it matched, and nothing past it was checked: its count is exact, not cut.

A step's status says whether it counts:
    verified    a draft the target checked (counted)
    empty       no draft proposed (ngram found no match): not a draft step for either engine
    prefill     proposed before the request emitted a token (vLLM drafts for a partial prefill and
                discards them)
    ended       proposed after the request's last token: never verified
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from specbook.core.acceptance import Acceptance

VERIFIED, EMPTY, PREFILL, ENDED = "verified", "empty", "prefill", "ended"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def derive_request_steps(records: pd.DataFrame, prompt_len: int, output_ids: Sequence[int], *,
                         eog_stop: bool = False) -> pd.DataFrame:
    """One request's records (records_frame rows, in step order) with `emitted_before`, `status`,
    `accepted` (derived), `anchor_ok` (the record's anchor id equals the token at anchor_pos - 1) and
    `next_anchor_ok` (the next record's anchor equals this anchor + accepted + 1, greedy's layout; None
    where the next record lies further on). `eog_stop`: the request stopped on an end-of-generation token
    (its last output id) and the engine ends a step there (llama.cpp; see the module's docstring)."""
    out = records.copy()
    seq = list(output_ids)
    emitted_before, status, accepted, anchor_ok = [], [], [], []
    for pos, anchor_id, proposed in zip(out["anchor_pos"], out["anchor_id"], out["proposed"], strict=True):
        o = int(pos) - prompt_len
        emitted_before.append(o)
        if len(proposed) == 0:
            st = EMPTY
        elif o <= 0:
            st = PREFILL
        elif o >= len(seq):
            st = ENDED
        else:
            st = VERIFIED
        status.append(st)
        accepted.append(common_prefix(proposed, seq[o:]) if st == VERIFIED else 0)
        known = anchor_id is not None and not pd.isna(anchor_id) and 0 < o <= len(seq)
        anchor_ok.append(bool(known and int(anchor_id) == seq[o - 1]) if known else None)
    out["emitted_before"] = emitted_before
    cut = [st == VERIFIED and o + a >= len(seq) for st, o, a in zip(status, emitted_before, accepted, strict=True)]
    if eog_stop:
        # the match reaches the stopping EOG: one fewer accepted where proposals went on past it; exact
        accepted = [a - 1 if c and a < len(p) else a for c, a, p in zip(cut, accepted, out["proposed"], strict=True)]
        cut = [False] * len(cut)
    out["cut"] = cut
    out["accepted_max"] = [len(p) if c else a for c, p, a in zip(cut, out["proposed"], accepted, strict=True)]
    out["status"] = status
    out["accepted"] = accepted
    out["anchor_ok"] = anchor_ok
    nxt = pd.Series(out["anchor_pos"].tolist()[1:] + [None], index=out.index)
    expected = out["anchor_pos"] + out["accepted"] + 1
    # greedy's layout: the next draft follows this one's accepted tokens and the bonus one. A later next
    # anchor is left open (llama.cpp logs no record for a step without a draft); an earlier one is wrong.
    out["next_anchor_ok"] = [None if (st != VERIFIED or pd.isna(n) or int(n) > int(e)) else bool(int(n) == int(e))
                             for st, n, e in zip(status, nxt, expected, strict=True)]
    return out


def derive_steps(records: pd.DataFrame, requests: Mapping[str, tuple[int, Sequence[int]]],
                 eog_stops: frozenset[str] | set[str] = frozenset()) -> pd.DataFrame:
    """Every request's derived steps; `requests`: request_id -> (prompt_len, emitted ids); `eog_stops`: the
    requests derived with `eog_stop`. Records of a request not in `requests` (warm-up, another window) are
    left out."""
    parts = [derive_request_steps(group, *requests[rid], eog_stop=rid in eog_stops)
             for rid, group in records.groupby("request_id", sort=False) if rid in requests]
    if not parts:
        return records.assign(emitted_before=[], cut=[], accepted_max=[], status=[], accepted=[], anchor_ok=[],
                              next_anchor_ok=[]).iloc[0:0]
    return pd.concat(parts, ignore_index=True)


def derived_acceptance(steps: pd.DataFrame, source: str = "derived from proposal traces", *,
                       upper: bool = False) -> Acceptance:
    """The acceptance model's counts from the verified steps (what the engine's counters count); with
    `upper`, cut steps count all their proposals (the most the engine may have counted)."""
    verified = steps[steps["status"] == VERIFIED]
    k = int(verified["proposed"].map(len).max()) if len(verified) else 0
    acc = verified["accepted_max" if upper else "accepted"].astype(int)
    return Acceptance(
        source=source, drafts=float(len(verified)),
        draft_tokens=float(verified["proposed"].map(len).sum()) if len(verified) else 0.0,
        accepted_tokens=float(acc.sum()),
        accepted_per_position=tuple(float((acc >= p).sum()) for p in range(1, k + 1)),
    )


def counts_agree(derived: Acceptance, counters: Acceptance, upper: Acceptance | None = None) -> list[str]:
    """Where the counters fall outside the derived counts ([] when they agree): equal to `derived`, or,
    given `upper` (cut steps counted in full), between the two."""
    upper = upper or derived
    diffs = []
    for name in ("drafts", "draft_tokens", "accepted_tokens"):
        lo, hi, got = getattr(derived, name), getattr(upper, name), getattr(counters, name)
        if got is not None and not lo <= got <= hi:
            span = f"{lo:g}" if lo == hi else f"{lo:g}..{hi:g}"
            diffs.append(f"{name}: derived {span} vs counters {got:g}")
    n = max(derived.k, upper.k, counters.k)
    pad = lambda t: tuple(t) + (0.0,) * (n - len(t))  # noqa: E731
    lo, hi, got = pad(derived.accepted_per_position), pad(upper.accepted_per_position), pad(counters.accepted_per_position)
    if counters.k and not all(a <= g <= b for a, g, b in zip(lo, got, hi, strict=True)):
        span = f"{lo}" if lo == hi else f"{lo}..{hi}"
        diffs.append(f"accepted per position: derived {span} vs counters {got}")
    return diffs
