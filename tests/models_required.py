"""One behaviour for every test that needs the embedded models: fail, saying how to prepare them."""

from __future__ import annotations

from pathlib import Path

import pytest


def embedded_target_dir() -> Path:
    from specbook.core.errors import ModelNotPreparedError
    from specbook.models import TARGET, model_path

    try:
        return model_path(TARGET)
    except ModelNotPreparedError as exc:
        pytest.fail(f"this test needs the embedded models, which are not prepared: run `make models` (or "
                    f"`.venv/bin/specbook models prepare`) first: {exc}")
