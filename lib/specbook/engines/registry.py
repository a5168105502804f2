"""The registered engine adapters, found by importing every package under specbook.engines, and what each offers.

An adapter package registers its class at import (`@register_engine("name")`); `discover()` imports every
subpackage of specbook.engines, so adding an engine is adding its package. `capability(engine, Kind)` is how
code outside the engines asks for an optional capability (specbook.engines.base) without naming an engine.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from specbook.core.errors import SpecbookError, UnknownEngineError
from specbook.engines.base import (
    CAPABILITIES,
    DraftCounts,
    Engine,
    EngineConfig,
    ReportsResponseDrafts,
    SetsLogStatsInterval,
    UpgradesLogFrames,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    import pandas as pd

_ENGINES: dict[str, Engine] = {}
_T = TypeVar("_T")
_C = TypeVar("_C")


def register_engine(name: str) -> Callable[[type[_T]], type[_T]]:
    """Class decorator: `@register_engine("vllm") class VllmEngine: ...` registers one instance."""

    def deco(cls: type[_T]) -> type[_T]:
        instance = cls()
        if not isinstance(instance, Engine):
            raise TypeError(f"{cls.__name__} does not implement the Engine protocol")
        _ENGINES[name] = instance
        return cls

    return deco


def discover() -> list[str]:
    """Import every package under specbook.engines (each registers its adapter); the names registered."""
    import specbook.engines as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg:
            importlib.import_module(f"{package.__name__}.{info.name}")
    return list_engines()


def get_engine(name: str | Engine) -> Engine:
    """The registered adapter of that name (an adapter given is returned as is)."""
    if not isinstance(name, str):
        return name
    try:
        return _ENGINES[name]
    except KeyError:
        raise UnknownEngineError(
            f"engine {name!r} is not registered; known engines: {', '.join(list_engines()) or 'none'}"
        ) from None


def list_engines() -> list[str]:
    return sorted(_ENGINES)


def capability(engine: str | Engine, kind: type[_C]) -> _C | None:
    """The adapter if it offers the optional capability `kind` (a Protocol of specbook.engines.base), else None."""
    adapter = get_engine(engine)
    return adapter if isinstance(adapter, kind) else None  # type: ignore[return-value]


def offering(kind: type) -> list[str]:
    """The registered engines that offer capability `kind`."""
    return [name for name in list_engines() if isinstance(_ENGINES[name], kind)]


def require(engine: str | Engine, kind: type[_C], what: str, error: type[SpecbookError] = SpecbookError) -> _C:
    """The adapter as `kind`; `error` naming the engine, what it lacks and the engines that have it, where not."""
    found = capability(engine, kind)
    if found is None:
        name = get_engine(engine).name
        raise error(f"engine {name!r} has no {what}; engines with one: {', '.join(offering(kind)) or 'none'}")
    return found


def capabilities_of(engine: str | Engine) -> list[str]:
    """The names of the optional capabilities an adapter offers (for listings and tests)."""
    adapter = get_engine(engine)
    return [kind.__name__ for kind in CAPABILITIES if isinstance(adapter, kind)]


# -- capabilities with a neutral default: what the caller does where the engine has none ------------------------

def with_log_stats_interval(cfg: EngineConfig, seconds: float) -> EngineConfig:
    """`cfg` logging its statistics every `seconds` where its engine logs at intervals; `cfg` as it is where
    the engine's log reports per request (nothing to set)."""
    adapter = capability(cfg.engine, SetsLogStatsInterval)
    return adapter.with_log_stats_interval(cfg, seconds) if adapter is not None else cfg


def upgrade_log_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A saved frame of log records in today's columns: each engine that upgrades its own older frames gets it
    in turn (one that did not write it returns it as it is)."""
    for name in list_engines():
        adapter = capability(name, UpgradesLogFrames)
        if adapter is not None:
            frame = adapter.upgrade_log_frame(frame)
    return frame


def response_draft_counts(engine: str | Engine, body: Mapping[str, Any]) -> DraftCounts:
    """The draft counts a non-streamed response carries where its engine reports them; (None, None) elsewhere."""
    adapter = capability(engine, ReportsResponseDrafts)
    return adapter.response_draft_counts(body) if adapter is not None else DraftCounts()
