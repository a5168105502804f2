"""The embedded models: SmolLM2-135M-Instruct (target) and its lower-precision drafts.

`prepare_models()` backs `specbook models prepare`; `model_path(name)` finds a prepared folder.
"""

from __future__ import annotations

from .agreement import expected_acceptance_length
from .catalog import DRAFT_FP8, DRAFT_INT4, EMBEDDED_MODELS, TARGET, ModelRecipe
from .manifest import MANIFEST_NAME
from .prepare import gguf_path, model_info, model_path, prepare_models

__all__ = [
    "DRAFT_FP8",
    "DRAFT_INT4",
    "EMBEDDED_MODELS",
    "MANIFEST_NAME",
    "TARGET",
    "ModelRecipe",
    "expected_acceptance_length",
    "gguf_path",
    "model_info",
    "model_path",
    "prepare_models",
]
