"""Model names as a config declares them -> what a loader opens: a path, a prepared embedded model, a hub id."""

from __future__ import annotations

from pathlib import Path

from .catalog import EMBEDDED_MODELS


def is_embedded_name(model: str) -> bool:
    """True for a name `specbook models prepare` makes (EMBEDDED_MODELS)."""
    return model in EMBEDDED_MODELS


def resolve_model(model: str) -> str:
    """An existing path as is; an embedded name -> its prepared folder (ModelNotPreparedError if not); else a hub id."""
    if Path(model).expanduser().exists():
        return str(Path(model).expanduser())
    if is_embedded_name(model):
        from .prepare import model_path

        return str(model_path(model))
    return model
