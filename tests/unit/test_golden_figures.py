"""The second golden set's figures are what the commit in each folder's figures.json computed (tests/golden/
figures.py): every recorded field, row and column comes out again, to 1e-9 relative; new ones may join. A
redesign (issue 25) is proven by this test passing unchanged; a change meant to move a figure records the
folder again (`tests/golden/figures.py record NAME`) and says so in its commit."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
_spec = importlib.util.spec_from_file_location("golden_figures", GOLDEN / "figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)  # type: ignore[union-attr]
REL = 1e-9


def same(new: Any, old: Any, where: str, problems: list[str]) -> None:
    """Every part of `old` in `new`: numbers to REL, lists element by element, dicts key by key (new keys free)."""
    if len(problems) > 20:
        return
    if isinstance(old, dict):
        if not isinstance(new, dict):
            problems.append(f"{where}: {type(new).__name__} where a mapping was recorded")
            return
        for key, value in old.items():
            if key not in new:
                problems.append(f"{where}.{key}: missing (recorded {str(value)[:80]!r})")
            else:
                same(new[key], value, f"{where}.{key}", problems)
    elif isinstance(old, list):
        if not isinstance(new, list) or len(new) != len(old):
            problems.append(f"{where}: {len(new) if isinstance(new, list) else type(new).__name__} items, "
                            f"recorded {len(old)}")
            return
        for i, (a, b) in enumerate(zip(new, old, strict=True)):
            same(a, b, f"{where}[{i}]", problems)
    elif isinstance(old, bool) or isinstance(new, bool):
        if new != old:
            problems.append(f"{where}: {new!r}, recorded {old!r}")
    elif isinstance(old, (int, float)) and isinstance(new, (int, float)):
        if not math.isclose(new, old, rel_tol=REL, abs_tol=REL):
            problems.append(f"{where}: {new!r}, recorded {old!r}")
    elif new != old:
        problems.append(f"{where}: {str(new)[:120]!r}, recorded {str(old)[:120]!r}")


@pytest.mark.parametrize("name", sorted(figures.SECOND_SET))
def test_the_second_golden_set_gives_the_recorded_figures(name, tmp_path):
    path = GOLDEN / name / figures.FIGURES_JSON
    if not path.is_file():
        pytest.fail(f"{path} is missing: `tests/golden/figures.py record {name}` writes it")
    recorded = json.loads(path.read_text())
    folder = Path(shutil.copytree(GOLDEN / name, tmp_path / name, ignore=shutil.ignore_patterns(figures.FIGURES_JSON)))
    now = figures.figures_of(folder, figures.SECOND_SET[name])
    assert now["experiment"] == recorded["experiment"]
    assert len(recorded["figures"]) >= 10, "a canon of a handful of fields would prove little"
    problems: list[str] = []
    same(now["figures"], recorded["figures"], name, problems)
    assert not problems, f"{name} differs from what {recorded['code_commit']} recorded:\n" + "\n".join(problems)


def test_the_comparison_catches_a_moved_figure_a_lost_row_and_a_lost_column():
    recorded = {"t": [{"al": 4.25, "arm": "a"}, {"al": 1.5, "arm": "b"}], "verdict": "COLLAPSED"}
    problems: list[str] = []
    same({"t": [{"al": 4.25, "arm": "a", "new": 1}, {"al": 1.5, "arm": "b"}], "verdict": "COLLAPSED", "x": 2},
         recorded, "r", problems)
    assert problems == []  # new columns and fields join freely
    for changed, what in [({"t": [{"al": 4.2500001, "arm": "a"}, {"al": 1.5, "arm": "b"}], "verdict": "COLLAPSED"},
                           "r.t[0].al"),
                          ({"t": [{"al": 4.25, "arm": "a"}], "verdict": "COLLAPSED"}, "r.t: 1 items"),
                          ({"t": [{"arm": "a"}, {"al": 1.5, "arm": "b"}], "verdict": "COLLAPSED"}, "r.t[0].al: missing"),
                          ({"t": recorded["t"], "verdict": "EQUAL"}, "r.verdict")]:
        problems = []
        same(changed, recorded, "r", problems)
        assert len(problems) == 1 and problems[0].startswith(what), problems
