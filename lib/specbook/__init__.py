"""specbook: a reproducible experiment book for speculative-decoding serving engineers.

The package is folded into layers (core, store, serve, engines, measure, report, experiments, run). Notebooks and
scripts written against the flat layout before it (`from specbook import plots`, `import specbook.report_view`,
`from specbook.harness import serve`) keep working: each old module name is an alias of the module its code moved
to (OLD_MODULES), with a DeprecationWarning naming the new one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

__version__ = "0.1.0"

# old specbook.<name> -> its module now
OLD_MODULES = {
    "acceptance": "core.acceptance", "digest": "core.digest", "diskwrite": "core.diskwrite", "dotted": "core.dotted",
    "envline": "core.envline", "errors": "core.errors", "params": "core.params", "paths": "core.paths",
    "progress": "core.progress", "request_failures": "core.request_failures", "secrets": "core.secrets",
    "stats": "core.stats", "verdicts": "core.verdicts",
    "fingerprint": "store.fingerprint", "manifest": "store.manifest", "runstore": "store.runstore",
    "client": "serve.client", "hostload": "serve.hostload", "metrics": "serve.metrics", "server": "serve.server",
    "categories": "measure.categories", "costsplit": "measure.costsplit", "harness": "measure.harness",
    "arms": "experiments.arms", "attribution": "experiments.attribution",
    "decision": "experiments.knob_ab.decision", "sequential": "experiments.knob_ab.sequential",
    "steady": "experiments.knob_ab.steady", "flip": "experiments.config_flip.flip",
    "guards": "experiments.cross_engine.guards", "pins": "experiments.cross_engine.pins",
    "setups": "experiments.cross_engine.setups", "equalwork": "traces.equalwork",
    "plots": "report.plots", "report_tables": "report.tables", "report_view": "report.view",
    "rundiff": "report.rundiff", "runindex": "report.runindex",
    "hostlock": "run.hostlock", "kernels": "run.kernels", "resume": "run.resume", "runguard": "run.runguard",
    "runner": "run.runner",
}


def _moved(old: str) -> ModuleType:
    new = f"{__name__}.{OLD_MODULES[old]}"
    warnings.warn(f"specbook.{old} moved to {new}; import it from there", DeprecationWarning, stacklevel=3)
    return importlib.import_module(new)


def __getattr__(name: str) -> ModuleType:
    """`from specbook import plots` (the old flat name) -> the module it moved to."""
    if name in OLD_MODULES:
        return _moved(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _OldNameFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import specbook.report_view` / `from specbook.harness import serve`: the old dotted name is loaded as the
    module it moved to (the same module object, registered under both names)."""

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 - the finder protocol's signature
        prefix, _, old = fullname.partition(".")
        if prefix == __name__ and old in OLD_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):  # noqa: ANN001
        return _moved(spec.name.partition(".")[2])

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module it moved to is executed already


if not any(isinstance(f, _OldNameFinder) for f in sys.meta_path):
    sys.meta_path.append(_OldNameFinder())
