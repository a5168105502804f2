"""Declared version pins of a reference engine (the oracle) against what is really installed.

A comparison against an oracle means something only against the oracle that was declared: a
different vLLM, torch, FlashInfer or llama.cpp binary is a different oracle. `check_pins` runs
before any server starts and raises PinMismatchError listing every mismatch, expected and found.

Pin values: a string is matched exactly (or as a glob when it holds `*`, `?` or `[`); `null` means
"must be absent" (e.g. no FlashInfer on CPU). A key not declared is not checked.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

from pydantic import BaseModel

from specbook.core.errors import PinMismatchError

ABSENT = "(absent)"


class PinCheck(BaseModel):
    """One pin's outcome."""

    key: str
    expected: str | None
    found: str | None
    ok: bool


def _matches(expected: str | None, found: str | None) -> bool:
    if expected is None or found is None:
        return expected is None and found is None
    if any(ch in expected for ch in "*?["):
        return fnmatch.fnmatchcase(found, expected)
    return found == expected


def compare_pins(declared: Mapping[str, str | None], found: Mapping[str, str]) -> list[PinCheck]:
    """Every declared pin against `found` (as engines' probe_versions() return it)."""
    return [
        PinCheck(key=k, expected=v, found=found.get(k), ok=_matches(v, found.get(k)))
        for k, v in declared.items()
    ]


def check_pins(declared: Mapping[str, str | None], found: Mapping[str, str], *, what: str) -> list[PinCheck]:
    """Raise PinMismatchError naming `what` (e.g. 'oracle vllm (params oracle.pins)') and every mismatch."""
    checks = compare_pins(declared, found)
    bad = [c for c in checks if not c.ok]
    if bad:
        lines = [f"{what}: {len(bad)} pin(s) do not match; the run stops before measuring"]
        for c in bad:
            lines.append(f"  {c.key}: expected {c.expected or ABSENT}, found {c.found or ABSENT}")
        known = ", ".join(f"{k}={v}" for k, v in sorted(found.items()))
        lines.append(f"  everything found: {known or '(nothing)'}")
        raise PinMismatchError("\n".join(lines))
    return checks

