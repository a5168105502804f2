"""Shared by the parser tests: a comparable form of parsed records (dataclasses as tuples, NaN equal to NaN)."""

from __future__ import annotations

import dataclasses
import math


def _norm(x):
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, *(_norm(getattr(x, f.name)) for f in dataclasses.fields(x)))
    if isinstance(x, (list, tuple)):
        return tuple(_norm(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _norm(v)) for k, v in x.items()))
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return x
