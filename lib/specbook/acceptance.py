"""One definition of acceptance for every engine, computed from each engine's raw counts.

The definition used everywhere in specbook:

    drafts          verification steps of the target that carried at least one draft token
    draft_tokens    draft tokens proposed in those steps
    accepted        draft tokens the target kept (the bonus/corrected token is NOT counted)
    AL              = 1 + accepted / drafts      tokens emitted per verification step, bonus included
    acceptance rate = accepted / draft_tokens    fraction of proposed tokens kept
    p_i             = accepted_at_position_i / drafts

How each engine's raw figures map onto it (checked in the engines' sources, see tests/fixtures):

    vLLM       vllm:spec_decode_num_drafts_total -> drafts, ..._num_draft_tokens_total -> draft_tokens,
               ..._num_accepted_tokens_total -> accepted, ..._per_pos_total{position} -> p_i numerators.
               Its log's "Mean acceptance length" is this AL.
    llama.cpp  llamacpp:spec_decode_num_drafts_total (n_draft_verif_steps) -> drafts,
               ..._num_draft_tokens_total (sum of timings.draft_n) -> draft_tokens,
               ..._num_accepted_tokens_total (sum of timings.draft_n_accepted) -> accepted,
               ..._per_pos_total{position} -> p_i numerators. Its log's "mean len" is this AL;
               its "draft acceptance = x (a accepted / g generated)" is the acceptance rate, not AL.
               A response's `timings` carries no draft count, so one request's AL cannot come from
               timings alone: specbook takes AL from the counters and keeps timings as raw figures.
    others     "acceptance rate" (accepted / drafted tokens) and "AL - 1" (accepted / drafts) appear
               in other tools; `al_from_al_minus_one` and `al_from_acceptance_rate` convert them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, Field

DEFINITION = "AL = 1 + accepted / drafts (bonus token counted; drafts = verification steps with a draft)"


class SpecCounts(BaseModel):
    """Raw speculative-decoding counts over one window (a delta of counters, or a sum of timings)."""

    engine: str
    source: str = Field(description="where the counts came from, e.g. 'vllm /metrics delta'")
    drafts: float | None = Field(None, description="None where the source has no draft count")
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_position: list[float] = Field(default_factory=list)

    @property
    def acceptance_length(self) -> float | None:
        if not self.drafts:
            return None
        return 1.0 + self.accepted / self.drafts

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def per_position_acceptance(self) -> list[float]:
        if not self.drafts:
            return []
        return [a / self.drafts for a in self.accepted_per_position]

    @property
    def mean_draft_length(self) -> float | None:
        return self.draft_tokens / self.drafts if self.drafts else None

    def figures(self) -> dict[str, float | str | None]:
        """The stated-definition figures beside the raw counts, one flat row for a table."""
        row: dict[str, float | str | None] = {
            "engine": self.engine,
            "source": self.source,
            "al": self.acceptance_length,
            "acceptance_rate": self.acceptance_rate,
            "mean_draft_length": self.mean_draft_length,
            "raw_drafts": self.drafts,
            "raw_draft_tokens": self.draft_tokens,
            "raw_accepted": self.accepted,
        }
        for i, p in enumerate(self.per_position_acceptance):
            row[f"p{i}"] = p
        return row


def counts_from_spec_decode_delta(delta: object, engine: str) -> SpecCounts:
    """From specbook.metrics.SpecDecodeDelta (drafts, draft_tokens, accepted_tokens, accepted_per_position)."""
    per_pos = getattr(delta, "accepted_per_position", None) or []
    if isinstance(per_pos, Mapping):
        per_pos = [per_pos[k] for k in sorted(per_pos)]
    return SpecCounts(
        engine=engine,
        source=f"{engine} /metrics delta",
        drafts=float(delta.drafts),  # type: ignore[attr-defined]
        draft_tokens=float(delta.draft_tokens),  # type: ignore[attr-defined]
        accepted=float(delta.accepted_tokens),  # type: ignore[attr-defined]
        accepted_per_position=[float(x) for x in per_pos],
    )


def counts_from_llamacpp_timings(timings: Iterable[Mapping[str, object]]) -> SpecCounts:
    """Sum of llama.cpp responses' `timings.draft_n` / `draft_n_accepted` (no draft count: AL stays None)."""
    draft_tokens = accepted = 0.0
    for t in timings:
        draft_tokens += float(t.get("draft_n", 0) or 0)  # type: ignore[arg-type]
        accepted += float(t.get("draft_n_accepted", 0) or 0)  # type: ignore[arg-type]
    return SpecCounts(
        engine="llamacpp", source="llamacpp response timings", drafts=None, draft_tokens=draft_tokens, accepted=accepted
    )


def al_from_al_minus_one(value: float) -> float:
    """Tools that report accepted tokens per draft (AL - 1)."""
    return 1.0 + value


def al_from_acceptance_rate(rate: float, mean_draft_length: float) -> float:
    """Tools that report accepted / drafted tokens: AL needs the mean draft length as well."""
    return 1.0 + rate * mean_draft_length
