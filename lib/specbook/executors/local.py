"""The local executor: every unit in the notebook's kernel, one after another, in schedule order, writing into
the run folder itself. A failing unit fails the run at once (its rows before the failure are saved)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from specbook.core import progress
from specbook.executors.placement import detect, placed

if TYPE_CHECKING:
    from specbook.executors import Execution, Unit
    from specbook.store.runstore import RunContext


def run_local(units: Sequence[Unit], ctx: RunContext, *, look_after: Callable[[int], bool] | None,
              looks_from: int | None, what: str, starts_together: int = 1) -> Execution:
    """starts_together=2: units go in pairs within a sweep, the second one's server launched beside the first's
    (harness.start_ahead), so a look never meets a server started for a sweep it may cancel."""
    from specbook.executors import Execution
    from specbook.measure import harness

    done = Execution(cluster={"executor": "local"})
    placement = detect("local")
    bar = progress.Units(what, len(units))
    started_ahead = False  # this unit's server was launched beside the previous one's: it pairs with none
    try:
        for i, unit in enumerate(units):
            bar.start(unit.label)
            nxt = units[i + 1] if i + 1 < len(units) else None
            pairs = (starts_together > 1 and not started_ahead and nxt is not None and nxt.sweep == unit.sweep
                     and nxt.start_ahead is not None)
            if pairs:
                nxt.start_ahead(ctx)
            started_ahead = pairs
            with placed(placement):
                unit.call(ctx)
            bar.done()
            done.ran.append(unit.key)
            sweep_ends = nxt is None or nxt.sweep != unit.sweep
            if (sweep_ends and look_after is not None and looks_from is not None and unit.sweep + 1 >= looks_from
                    and look_after(unit.sweep)):
                done.stopped_after_sweep = unit.sweep
                break
    finally:
        discarded = harness.discard_ahead()  # a unit failed or Ctrl-C: the next one's server is not needed
        if discarded:
            progress.note(f"stopped the server started ahead for {', '.join(discarded)}: its run did not start")
    return done
