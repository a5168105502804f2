"""Where things live: the project root, the model cache, the outputs folder."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def project_root() -> Path:
    """The checkout holding notebooks/ and params/ (SPECBOOK_ROOT overrides; else walk up from cwd, then the package)."""
    env = os.environ.get("SPECBOOK_ROOT")
    if env:
        return Path(env).resolve()
    for start in (Path.cwd(), PACKAGE_DIR):
        for cand in (start, *start.parents):
            if (cand / "notebooks").is_dir() and (cand / "params").is_dir():
                return cand
    return Path.cwd()


def cache_dir() -> Path:
    """Model cache (SPECBOOK_CACHE, else ~/.cache/specbook)."""
    env = os.environ.get("SPECBOOK_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specbook"


def models_dir() -> Path:
    return cache_dir() / "models"


def outputs_dir() -> Path:
    env = os.environ.get("SPECBOOK_OUTPUTS")
    return Path(env).expanduser() if env else project_root() / "outputs"


def notebooks_dir() -> Path:
    return project_root() / "notebooks"


def params_dir() -> Path:
    return project_root() / "params"
