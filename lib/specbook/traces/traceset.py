"""TraceSet: what one trace pass on one server gave (records, requests, the window's counters), and what is
derived from it: the accepted count per step, the derived acceptance and its agreement with the counters.
The pass that makes one is specbook.measure.tracepass; traces.tables and traces.replay read it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from specbook.core.acceptance import Acceptance
from specbook.traces.derive import counts_agree, derive_steps, derived_acceptance
from specbook.traces.records import RequestTrace

__all__ = ["TraceSet"]


@dataclass
class TraceSet:
    """What one trace pass on one server gave: records, the requests' ids, the window's counters, and,
    where proposals could not be traced, why (`untraceable`)."""

    engine: str
    server: str
    method: str | None
    records: pd.DataFrame
    requests: list[RequestTrace]
    counters: Acceptance | None = None
    untraceable: str | None = None
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def steps(self) -> pd.DataFrame:
        """Every request's derived steps (specbook.traces.derive) with its prompt_id."""
        reqs = {r.request_id: (r.prompt_len, r.output_ids) for r in self.requests}
        steps = derive_steps(self.records, reqs, {r.request_id for r in self.requests if r.eog_stop})
        pid = {r.request_id: r.prompt_id for r in self.requests}
        steps.insert(0, "prompt_id", steps["request_id"].map(pid))
        return steps

    def derived_acceptance(self) -> Acceptance:
        return derived_acceptance(self.steps(), source=f"{self.engine} proposal traces")

    def disagreements(self) -> list[str]:
        """Where the counters of the same window fall outside the derived counts ([] when they agree; a
        step the request's stop cut counts between its derived and its full proposals)."""
        if self.counters is None:
            return ["no counters for this window"]
        steps = self.steps()
        return counts_agree(derived_acceptance(steps), self.counters, derived_acceptance(steps, upper=True))

    @property
    def output_tokens(self) -> int:
        return sum(len(r.output_ids) for r in self.requests)
