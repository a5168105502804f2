"""The acceptance fields every `specbook ingest` record carries, filled the same way whichever engine's reader
read the file (specbook.ingest for server logs, an engine's bench reader for its benchmark client's outputs)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field

from specbook.core.acceptance import FIRST_POSITION, Acceptance


class PositionCount(BaseModel):
    """Accepted draft tokens at one draft position."""

    position: int = Field(description=f"draft position, numbered from {FIRST_POSITION} (the first drafted token)")
    accepted: float = Field(description="draft tokens accepted at this position (a count)")
    rate: float | None = Field(description="accepted / drafts; null where the log gives no draft count")


def finite(value: float | None) -> float | None:
    """NaN and infinities as None (JSON null)."""
    return None if value is None or not math.isfinite(value) else value


def acceptance_fields(acc: Acceptance) -> dict[str, Any]:
    """An ingest record's acceptance fields from the acceptance model (its figures, never recomputed here)."""
    rates = acc.position_rates()
    return {
        "source": acc.source,
        "drafts": None if acc.drafts is None else int(round(acc.drafts)),
        "draft_tokens": int(round(acc.draft_tokens)),
        "accepted_tokens": int(round(acc.accepted_tokens)),
        "al": finite(acc.al),
        "acceptance_rate": finite(acc.acceptance_rate),
        "accepted_per_position": [
            PositionCount(position=pos, accepted=acc.accepted_per_position[pos - FIRST_POSITION],
                          rate=finite(rate))
            for pos, rate in rates.items()
        ],
    }
