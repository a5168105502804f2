"""Everything engine-specific: one package per engine (vllm, llamacpp), each registering its adapter at import.

Importing specbook.engines imports every package under it (specbook.engines.registry.discover), so adding an
engine is adding its package. The interface every adapter implements, and the optional capabilities it may
offer, are in specbook.engines.base.
"""

from __future__ import annotations

from pathlib import Path

from specbook.engines.base import Engine, EngineConfig, resolve_model
from specbook.engines.registry import (
    _ENGINES,
    capability,
    discover,
    get_engine,
    list_engines,
    offering,
    register_engine,
    require,
    response_draft_counts,
    upgrade_log_frame,
    with_log_stats_interval,
)
from specbook.serve.server import ManagedServer, free_port


def launch(cfg: EngineConfig, *, name: str, log_path: Path, port: int | None = None) -> ManagedServer:
    """A ManagedServer for `cfg`, not yet started (`with launch(cfg, ...) as srv:`). Experiments go through
    specbook.measure.harness.serve, which wraps this with version probing, the server record and measurement."""
    engine = get_engine(cfg.engine)
    spec = engine.build_spec(cfg, name=name, log_path=Path(log_path), port=port or free_port())
    return ManagedServer(spec)


discover()

__all__ = [
    "_ENGINES",
    "Engine",
    "EngineConfig",
    "capability",
    "get_engine",
    "launch",
    "list_engines",
    "offering",
    "register_engine",
    "require",
    "resolve_model",
    "response_draft_counts",
    "upgrade_log_frame",
    "with_log_stats_interval",
]
