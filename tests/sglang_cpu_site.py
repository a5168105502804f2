"""Where the CPU SGLang folder is (`make sglang-cpu`, scripts/sglang/cpu_site.py), or why a test cannot use it."""

from __future__ import annotations

import os
from pathlib import Path

from specbook.engines.sglang.adapter import SITE_ENV

CPU_SITE = Path(__file__).resolve().parents[1] / ".sglang-cpu" / "site"


def cpu_site() -> str | None:
    """$SPECBOOK_SGLANG_SITE where set, else the folder `make sglang-cpu` builds; None where neither is there."""
    if os.environ.get(SITE_ENV):
        return os.environ[SITE_ENV]
    return str(CPU_SITE) if (CPU_SITE.parent / ".done").exists() else None


def why_not() -> str | None:
    if cpu_site() is None:
        return f"no CPU SGLang folder at {CPU_SITE.parent} and ${SITE_ENV} unset: `make sglang-cpu` builds it"
    return None
