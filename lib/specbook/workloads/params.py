"""The `workload:` block of every experiment's params: one typed schema per workload, chosen by `dataset`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

SPEC_BENCH_GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
SpecBenchGroup = Literal["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]


class WorkloadBase(BaseModel):
    """What every workload has: how requests are sent, the draw's seed."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(1234, description="seed of the draw (recorded with the ids drawn)")
    max_tokens: int = Field(256, ge=1)
    concurrency: int = Field(4, ge=1, description="requests in flight; the steady-state target")
    request_seed: int | None = Field(0, description="per-request sampling seed (greedy anyway)")
    resample_per_sweep: bool = Field(
        False, description="draw afresh for each sweep (seed + sweep), the same for every arm of that "
        "sweep: run-to-run sd then includes which questions were served, the noise of a real workload; "
        "false: every sweep serves the same questions and sd is the engine's own run-to-run noise",
    )

    def subset_seed(self, sweep: int) -> int:
        return self.seed + sweep if self.resample_per_sweep else self.seed


class Gsm8kWorkloadParams(WorkloadBase):
    """GSM8K k-shot chat: local JSONL paths (tests, CI) or the hub (`openai/gsm8k`) when left null."""

    dataset: Literal["gsm8k"] = "gsm8k"
    test_path: str | None = Field(None, description="test.jsonl; null loads openai/gsm8k from the hub")
    train_path: str | None = Field(None, description="train.jsonl (few-shot source); null: the hub")
    subset: int | None = Field(32, ge=1, description="questions drawn from the test split; null: all")
    shots: int = Field(5, ge=0)


class SpecBenchWorkloadParams(WorkloadBase):
    """Spec-Bench (Xia et al. 2024): six task groups, a stratified draw of `per_category` questions each;
    MT-Bench questions go as real two-turn conversations (the second turn follows the model's own answer)."""

    dataset: Literal["spec_bench"]
    path: str | None = Field(None, description="Spec-Bench question.jsonl; null: `hub_id` from the hub")
    hub_id: str | None = Field(None, description="a hub dataset with Spec-Bench's fields, used when path is null")
    hub_split: str = "train"
    categories: list[SpecBenchGroup] = Field(
        default_factory=lambda: list(SPEC_BENCH_GROUPS), min_length=1,
        description="groups to send, in this order (each its own window where the experiment measures per category)")
    per_category: int | None = Field(4, ge=1, description="questions drawn per group; null: all 80")
    turns: Literal[1, 2] = Field(2, description="MT-Bench turns sent: 2 (the real conversation) or 1 (the "
                                 "first only, as `vllm bench serve --dataset-name spec_bench` does)")
    max_chars: int | None = Field(None, ge=1, description="only questions whose turns sent are each at most "
                                  "this many characters (the server's context must hold them); null: all")


class JsonlWorkloadParams(WorkloadBase):
    """A user's own prompts: one JSON object a line; the prompt a string, or a list of user turns."""

    dataset: Literal["jsonl"]
    path: str | None = Field(None, description="the JSONL file; null: `hub_id` from the hub")
    hub_id: str | None = None
    hub_split: str = "train"
    prompt_field: str = Field("prompt", description="field holding the prompt (string) or the user turns (list)")
    category_field: str | None = Field(None, description="field holding the category; null: all in one ('jsonl')")
    id_field: str | None = Field(None, description="field holding a stable id; null: the line number")
    subset: int | None = Field(None, ge=1, description="prompts drawn per category; null: all")


def _dataset_tag(value: Any) -> str:
    # a `workload:` block without `dataset` is GSM8K, as every params file written before this registry
    if isinstance(value, dict):
        return value.get("dataset", "gsm8k")
    return getattr(value, "dataset", "gsm8k")


WorkloadParams = Annotated[
    Annotated[Gsm8kWorkloadParams, Tag("gsm8k")]
    | Annotated[SpecBenchWorkloadParams, Tag("spec_bench")]
    | Annotated[JsonlWorkloadParams, Tag("jsonl")],
    Discriminator(_dataset_tag),
]
