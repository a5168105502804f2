"""Traced proposals compared: with the replay reference, and between two engines at matched anchors.

A step's proposals against a reference (another engine's, or the draft's own replay):
    identical      all k ids equal
    first_diff     the first differing position, 1-based (None when identical)
and the shift signatures a wrong anchor layout leaves:
    late_by_one    proposed[j] == reference[j + 1]: drafted from one token further than the anchor
    early_by_one   proposed[j + 1] == reference[j]: drafted from one token before the anchor
    output_shifted proposed[j] == emitted[o + 1 + j]: the proposals match the output one position on
`systematic_mismatches` names a signature when it explains most of the mismatching steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from specbook.traces.derive import VERIFIED

SIGNATURES = {
    "late_by_one": "proposals equal the reference shifted by one (proposed[j] == reference[j+1]): drafted from "
                   "one token past the anchor",
    "early_by_one": "proposals equal the reference shifted back by one (proposed[j+1] == reference[j]): drafted "
                    "from one token before the anchor",
    "output_shifted": "proposals match the emitted output shifted by one position: the signature of a wrong "
                      "anchor layout",
}
MIN_SHARE = 0.5  # a signature is systematic when it explains at least this share of the mismatching steps
MIN_STEPS = 3


def first_diff(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first 1-based position where a and b differ over their common length, None if none does."""
    for i, (x, y) in enumerate(zip(a, b, strict=False), 1):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b)) + 1


def _shifted(a: Sequence[int], b: Sequence[int]) -> bool:
    """a[j] == b[j + 1] over at least 2 positions."""
    n = min(len(a), len(b) - 1)
    return n >= 2 and all(a[j] == b[j + 1] for j in range(n))


def compare_with_reference(steps: pd.DataFrame, reference: pd.DataFrame,
                           outputs: dict[str, Sequence[int]]) -> pd.DataFrame:
    """The verified steps joined with the reference on (request_id, anchor_pos), with the columns above.
    `outputs`: request_id -> emitted ids."""
    verified = steps[steps["status"] == VERIFIED]
    joined = verified.merge(reference, on=["request_id", "anchor_pos"], how="inner")
    rows = []
    for r in joined.itertuples(index=False):
        prop, ref = list(r.proposed), list(r.reference)[:len(r.proposed)]
        emitted = list(outputs.get(r.request_id, []))[int(r.emitted_before):]
        fd = first_diff(prop, ref)
        rows.append({
            "prompt_id": getattr(r, "prompt_id", None), "request_id": r.request_id, "anchor_pos": r.anchor_pos,
            "proposed": prop, "reference": ref, "accepted": r.accepted,
            "identical": fd is None, "first_diff": fd,
            "late_by_one": fd is not None and _shifted(prop, list(r.reference)),
            "early_by_one": fd is not None and _shifted(list(r.reference), prop),
            "output_shifted": fd is not None and _shifted(prop, emitted),
        })
    return pd.DataFrame(rows, columns=["prompt_id", "request_id", "anchor_pos", "proposed", "reference", "accepted",
                                       "identical", "first_diff", "late_by_one", "early_by_one", "output_shifted"])


def systematic_mismatches(compared: pd.DataFrame) -> list[str]:
    """Named signatures that explain most mismatching steps (>= MIN_SHARE of them, >= MIN_STEPS steps)."""
    bad = compared[~compared["identical"]]
    found = []
    for col, text in SIGNATURES.items():
        n = int(bad[col].sum()) if len(bad) else 0
        if n >= MIN_STEPS and n >= MIN_SHARE * len(bad):
            found.append(f"{col}: {n} of {len(bad)} mismatching steps; {text}")
    return found


def identical_share(compared: pd.DataFrame) -> float:
    return float(compared["identical"].mean()) if len(compared) else float("nan")


def matched_anchors(steps_a: pd.DataFrame, seqs_a: dict[str, Sequence[int]],
                    steps_b: pd.DataFrame, seqs_b: dict[str, Sequence[int]]) -> pd.DataFrame:
    """Anchors where both engines reached the same prefix (same prompt_id, anchor position and token ids up
    to it): their proposals side by side. `seqs_*`: request_id -> prompt ids + emitted ids."""
    a = steps_a[steps_a["status"] == VERIFIED]
    b = steps_b[steps_b["status"] == VERIFIED]
    joined = a.merge(b, on=["prompt_id", "anchor_pos"], suffixes=("_a", "_b"))
    rows = []
    for r in joined.itertuples(index=False):
        sa, sb = seqs_a.get(r.request_id_a), seqs_b.get(r.request_id_b)
        pos = int(r.anchor_pos)
        if sa is None or sb is None or list(sa[:pos]) != list(sb[:pos]):
            continue
        pa, pb = list(r.proposed_a), list(r.proposed_b)
        fd = first_diff(pa, pb)
        rows.append({"prompt_id": r.prompt_id, "anchor_pos": pos, "proposed_a": pa, "proposed_b": pb,
                     "identical": fd is None, "first_diff": fd, "accepted_a": r.accepted_a, "accepted_b": r.accepted_b})
    return pd.DataFrame(rows, columns=["prompt_id", "anchor_pos", "proposed_a", "proposed_b", "identical",
                                       "first_diff", "accepted_a", "accepted_b"])
