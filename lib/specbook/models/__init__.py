"""The embedded models: SmolLM2-135M-Instruct (target) and its lower-precision drafts, and the GGUF
llama.cpp serves with weights identical to them (`weights`).

`prepare_models()` backs `specbook models prepare`; `model_path(name)` finds a prepared folder. The
preparation code imports torch (seconds), so it loads on first use: `import specbook.engines` (which
resolves embedded names) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from .catalog import DRAFT_FP8, DRAFT_INT4, EMBEDDED_MODELS, TARGET, ModelRecipe
from .manifest import MANIFEST_NAME
from .resolve import is_embedded_name, resolve_model

_LAZY = {
    "expected_acceptance_length": ".agreement",
    "gguf_path": ".prepare",
    "model_info": ".prepare",
    "model_path": ".prepare",
    "prepare_models": ".prepare",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DRAFT_FP8",
    "DRAFT_INT4",
    "EMBEDDED_MODELS",
    "MANIFEST_NAME",
    "TARGET",
    "ModelRecipe",
    "expected_acceptance_length",
    "gguf_path",
    "is_embedded_name",
    "model_info",
    "model_path",
    "prepare_models",
    "resolve_model",
]
