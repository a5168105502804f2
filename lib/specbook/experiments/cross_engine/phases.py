"""Cross-engine phases: which servers a side x lane starts, and which of its phases each one serves, in order.

A side x lane has up to four phases, each a unit of work (resume keys side x lane x kind): the timed pass,
the equal-work re-runs (timed too), the untimed trace pass and the profiled pass. They run against one server,
in this order, so every timed window comes before any instrument is switched on:

    timed -> equal_work -> trace -> profile

An instrument shares that server only where the engine switches it at run time (its proposal tracer's
`traces_whole_server`, its profiler's `profiles_whole_server`: capabilities of the Engine, never its name);
otherwise its phase keeps a server of its own, started after the shared one (llama.cpp's `-v` and `-lv 4`
are on from the start, and llama-server starts in about a second).

Equal-work re-runs need both sides' timed outputs of the lane. Sides run one at a time, so the side served
first cannot re-run on its timed server: `side_order` serves first the side whose engine keeps separate
servers anyway, and that side's re-runs get a server of their own after the other side's. A resumed run
starts only the phases not done, on a fresh server (NAME-2, NAME-3, ... where NAME served a done phase);
each server's record says which phases it served (`extra.phases`, seconds in `extra.phase_s`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from specbook.measure.instruments import switchable

PHASES = ("timed", "equal_work", "trace", "profile")  # the order on a shared server
SUFFIXES = {"trace": "-trace", "profile": "-prof", "equal_work": "-equal"}  # a phase's server of its own


def side_order(engines: dict[str, str]) -> list[str]:
    """Sides (side -> engine, in the params' order) in the order a lane serves them: a side whose engine
    switches both instruments at run time last (its one server can then re-run equal work at once)."""
    return sorted(engines, key=lambda side: switchable(engines[side]) == {"trace", "profile"})


@dataclass(frozen=True)
class ServerPlan:
    """One server of a side x lane: its name and the phases it serves, in order."""

    name: str
    phases: tuple[str, ...]


def plan_servers(label: str, wanted: Iterable[str], done: set[str], engine: str, *, equal_now: bool,
                 used_names: set[str]) -> list[ServerPlan]:
    """The servers a side x lane (server name `label`) starts for its `wanted` phases that are not `done`.

    The shared server serves, in PHASES order, the timed pass, the equal-work re-runs where `equal_now` (the
    other side's timed outputs exist by then), and every instrumented phase the engine switches at run time;
    each other phase gets its own server (LABEL-trace, LABEL-prof, LABEL-equal), after it. A shared server whose
    name `used_names` holds (a done phase's, a resumed run) is LABEL-2, LABEL-3, ..."""
    todo = [p for p in PHASES if p in set(wanted) and p not in done]
    on_shared = {"timed"} | ({"equal_work"} if equal_now else set()) | switchable(engine)
    shared = tuple(p for p in todo if p in on_shared)
    own = [p for p in todo if p not in on_shared]
    plans = []
    if shared:
        name, n = label, 1
        while name in used_names:
            n += 1
            name = f"{label}-{n}"
        plans.append(ServerPlan(name, shared))
    plans += [ServerPlan(f"{label}{SUFFIXES[p]}", (p,)) for p in own]
    return plans
