"""The local executor: every unit in the notebook's kernel, one after another, in schedule order, writing into
the run folder itself. A failing unit fails the run at once (its rows before the failure are saved)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from specbook import progress
from specbook.executors.placement import detect, placed

if TYPE_CHECKING:
    from specbook.executors import Execution, Unit
    from specbook.runstore import RunContext


def run_local(units: Sequence[Unit], ctx: RunContext, *, look_after: Callable[[int], bool] | None,
              looks_from: int | None, what: str) -> Execution:
    from specbook.executors import Execution

    done = Execution(cluster={"executor": "local"})
    placement = detect("local")
    bar = progress.Units(what, len(units))
    for i, unit in enumerate(units):
        bar.start(unit.label)
        with placed(placement):
            unit.call(ctx)
        bar.done()
        done.ran.append(unit.key)
        sweep_ends = i + 1 == len(units) or units[i + 1].sweep != unit.sweep
        if (sweep_ends and look_after is not None and looks_from is not None and unit.sweep + 1 >= looks_from
                and look_after(unit.sweep)):
            done.stopped_after_sweep = unit.sweep
            break
    return done
