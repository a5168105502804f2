"""The experiment protocol and its registry: each experiment module registers itself at import.

An experiment is four things and a notebook:
  params_model   the pydantic schema of its params YAML
  collect        collect(params, run) -> data: drives servers through specbook.measure.harness, saves raw frames
                 in the run folder after every unit of work, returns what load() would return
  load           load(run) -> data: the saved raw data of a run folder (no server; `specbook render`)
  analyze        analyze(data, params) -> a typed result: every number, table and verdict the report shows
  notebook       a thin report: specbook.notebook.open_book() then display calls on the result
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from specbook.core.errors import ExperimentError
from specbook.core.paths import notebooks_dir, project_root

if TYPE_CHECKING:
    from specbook.report.view import Summary
    from specbook.store.runstore import RunContext

__all__ = ["AnalysisResult", "ExperimentSpec", "get_experiment", "list_experiments", "register_experiment"]


class AnalysisResult(Protocol):
    """What analyze returns: a typed result whose answer(params) is the report's summary block."""

    def answer(self, params: Any) -> Summary: ...


P = TypeVar("P", bound=BaseModel)  # the experiment's params model
D = TypeVar("D")  # its raw data (collect and load return it)
R = TypeVar("R", bound=AnalysisResult)  # its analysis result


@dataclass(frozen=True)
class ExperimentSpec(Generic[P, D, R]):
    """An experiment the book can run.

    `notebook` is a file name under notebooks/ ("knob_ab.ipynb"), a path relative to the project
    root ("notebooks/knob_ab.ipynb") or an absolute path.
    """

    name: str
    params_model: type[P]
    notebook: str
    collect: Callable[[P, RunContext], D] | None = None
    load: Callable[[RunContext], D] | None = None
    analyze: Callable[[D, P], R] | None = None

    def require(self, step: str) -> Callable[..., Any]:
        """The protocol function `step` (collect/load/analyze), or an error naming what is missing."""
        fn = getattr(self, step)
        if fn is None:
            raise ExperimentError(f"experiment {self.name!r} does not provide {step}()")
        return fn

    def notebook_path(self) -> Path:
        """Where the notebook lies (the first candidate that exists, else the notebooks/ one)."""
        given = Path(self.notebook)
        if given.is_absolute():
            return given
        candidates = [project_root() / given, notebooks_dir() / given]
        for cand in candidates:
            if cand.is_file():
                return cand
        return candidates[-1]


_EXPERIMENTS: dict[str, ExperimentSpec[Any, Any, Any]] = {}


def _same_origin(a: ExperimentSpec, b: ExperimentSpec) -> bool:
    # a module re-imported (autoreload, importlib.reload) re-registers a fresh class of the same name
    qual = lambda m: (m.__module__, m.__qualname__)  # noqa: E731
    return qual(a.params_model) == qual(b.params_model) and a.notebook == b.notebook


def register_experiment(spec: ExperimentSpec[P, D, R]) -> ExperimentSpec[P, D, R]:
    """Register `spec` under its name; a different experiment under a taken name is an error."""
    old = _EXPERIMENTS.get(spec.name)
    if old is not None and not _same_origin(old, spec):
        raise ExperimentError(
            f"experiment {spec.name!r} is already registered by {old.params_model.__module__} "
            f"(notebook {old.notebook}); pick another name"
        )
    _EXPERIMENTS[spec.name] = spec
    return spec


def get_experiment(name: str) -> ExperimentSpec:
    try:
        return _EXPERIMENTS[name]
    except KeyError:
        known = ", ".join(sorted(_EXPERIMENTS)) or "none"
        raise ExperimentError(f"unknown experiment {name!r}; known experiments: {known}") from None


def list_experiments() -> list[str]:
    return sorted(_EXPERIMENTS)
