"""Notebooks written against the flat layout keep working: every old specbook.<name> is the module it moved to."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import specbook


@pytest.mark.parametrize("old, new", sorted(specbook.OLD_MODULES.items()))
def test_an_old_name_is_the_module_it_moved_to_and_says_where(old, new):
    with pytest.warns(DeprecationWarning, match=f"specbook.{new}"):
        module = importlib.import_module(f"specbook.{old}")
    assert module is importlib.import_module(f"specbook.{new}")


def test_every_old_name_points_at_a_module_that_exists():
    for new in specbook.OLD_MODULES.values():
        assert importlib.util.find_spec(f"specbook.{new}") is not None, new


def test_the_three_old_import_forms_work_in_a_fresh_interpreter():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    from specbook import plots\nexcept DeprecationWarning as w: print('warned:', w)\n"
            "warnings.simplefilter('ignore')\n"
            "from specbook import report_view; from specbook.harness import serve; import specbook.runner as r\n"
            "from specbook.measure.harness import serve as s2; from specbook.run import runner as r2\n"
            "assert serve is s2 and r is r2 and report_view.__name__ == 'specbook.report.view'\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "warned: specbook.plots moved to specbook.report.plots" in out and out.strip().endswith("ok")


def test_a_name_that_never_existed_is_still_an_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("specbook.no_such_module")
    with pytest.raises(AttributeError):
        specbook.no_such_module  # noqa: B018
