"""Two engines' server set-ups side by side, on the aspects every engine can be lined up on
(specbook.engines.base.SETUP_ASPECTS): a differing value is an asymmetry of the comparison, and a report lists
it beside its headline. Each engine adapter says what its own set-up was (`Engine.setup_facts`), from the
declared config and what its log said at start."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specbook.engines.base import SETUP_ASPECTS, SetupFact

if TYPE_CHECKING:
    import pandas as pd

SETUP_COLUMNS = ["lane", "aspect", "ours", "oracle", "differs", "ours_detail", "oracle_detail"]
UNKNOWN = "not told"


def setup_rows(lane: str, ours: dict[str, SetupFact], oracle: dict[str, SetupFact]) -> list[dict[str, Any]]:
    """One row per aspect either side tells (SETUP_ASPECTS order); `differs` is None where one side does not
    tell it (no asymmetry claimed either way)."""
    rows = []
    for aspect in SETUP_ASPECTS:
        a, b = ours.get(aspect), oracle.get(aspect)
        if a is None and b is None:
            continue
        rows.append({"lane": lane, "aspect": aspect, "ours": a.value if a else UNKNOWN,
                     "oracle": b.value if b else UNKNOWN, "differs": None if a is None or b is None else a.value != b.value,
                     "ours_detail": a.detail if a else "", "oracle_detail": b.detail if b else ""})
    return rows


def asymmetries(table: pd.DataFrame) -> list[str]:
    """The differing aspects as short phrases, one per aspect and pair of values (lanes named unless all)."""
    if table.empty:
        return []
    lanes = list(dict.fromkeys(table["lane"]))
    diff = table[table["differs"] == True]  # noqa: E712 (None: not told by one side)
    out = []
    for (aspect, ours, oracle), group in diff.groupby(["aspect", "ours", "oracle"], sort=False):
        where = "" if list(group["lane"]) == lanes else f" ({', '.join(group['lane'])})"
        out.append(f"{aspect}{where}: {ours} vs {oracle}")
    return out
