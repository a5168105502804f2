"""Engine adapters registered by name; one module per engine (vllm now; llama.cpp and SGLang next)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from specbook.core.errors import UnknownEngineError
from specbook.engines.base import Engine, EngineConfig, resolve_model
from specbook.serve.server import ManagedServer, free_port

_ENGINES: dict[str, Engine] = {}
_T = TypeVar("_T")


def register_engine(name: str) -> Callable[[type[_T]], type[_T]]:
    """Class decorator: `@register_engine("vllm") class VllmEngine: ...` registers one instance."""

    def deco(cls: type[_T]) -> type[_T]:
        instance = cls()
        if not isinstance(instance, Engine):
            raise TypeError(f"{cls.__name__} does not implement the Engine protocol")
        _ENGINES[name] = instance
        return cls

    return deco


def get_engine(name: str) -> Engine:
    try:
        return _ENGINES[name]
    except KeyError:
        raise UnknownEngineError(
            f"engine {name!r} is not registered; known engines: {', '.join(list_engines()) or 'none'}"
        ) from None


def list_engines() -> list[str]:
    return sorted(_ENGINES)


def launch(cfg: EngineConfig, *, name: str, log_path: Path, port: int | None = None) -> ManagedServer:
    """A ManagedServer for `cfg`, not yet started (`with launch(cfg, ...) as srv:`). Experiments go through
    specbook.measure.harness.serve, which wraps this with version probing, the server record and measurement."""
    engine = get_engine(cfg.engine)
    spec = engine.build_spec(cfg, name=name, log_path=Path(log_path), port=port or free_port())
    return ManagedServer(spec)


# Adapters register themselves at import.
from specbook.engines import llamacpp as _llamacpp  # noqa: E402,F401
from specbook.engines import vllm as _vllm  # noqa: E402,F401

__all__ = [
    "Engine",
    "EngineConfig",
    "get_engine",
    "launch",
    "list_engines",
    "register_engine",
    "resolve_model",
]
