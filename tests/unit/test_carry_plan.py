"""scripts/h200/carry_plan.py: the device calls that carry kit parts and pieces, within a transfer's limits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("carry_plan", ROOT / "scripts" / "h200" / "carry_plan.py")
carry_plan = importlib.util.module_from_spec(spec)
spec.loader.exec_module(carry_plan)

MB = 1_000_000


def _folders(out: Path, prefix: str, sizes: list[int]) -> None:
    for i, size in enumerate(sizes):
        (out / f"{prefix}{i}").mkdir()
        (out / f"{prefix}{i}" / "part").write_bytes(b"\0" * size)
        (out / f"{prefix}{i}" / "SUMS").write_bytes(b"\0" * 10)


def test_each_kit_part_takes_one_piece_and_the_leftover_pieces_ride_first(tmp_path):
    _folders(tmp_path, "s", [50] * 11)   # 11 kit parts, s10 sorts after s9
    _folders(tmp_path, "p", [50, 50, 1])
    _folders(tmp_path, "x", [3] * 26)
    calls = carry_plan.plan(tmp_path, tree_bytes=9, limit=100)
    # 26 - 14 = 12 leftover pieces of 13 bytes (3 + 10 of sums) beside a tree of 9: (100 - 9) // 13 = 7 a call
    assert calls[:2] == [[f"x{i}" for i in range(14, 21)], [f"x{i}" for i in range(21, 26)]]
    assert calls[2] == ["s0", "x0"] and calls[11] == ["s9", "x9"] and calls[12] == ["s10", "x10"]
    assert calls[-1] == ["p2", "x13"]                      # the last kit part last: the start goes there
    carried = sorted(name for call in calls for name in call)
    assert carried == sorted([f"s{i}" for i in range(11)] + ["p0", "p1", "p2"] + [f"x{i}" for i in range(26)])


def test_fewer_pieces_than_kit_parts_leave_the_last_parts_alone(tmp_path):
    _folders(tmp_path, "p", [50] * 4)
    _folders(tmp_path, "x", [3] * 2)
    assert carry_plan.plan(tmp_path, tree_bytes=9, limit=100) == [["p0", "x0"], ["p1", "x1"], ["p2"], ["p3"]]


def test_at_most_eight_paths_a_call(tmp_path):
    _folders(tmp_path, "x", [1] * 20)
    calls = carry_plan.plan(tmp_path, tree_bytes=0, limit=10_000)
    assert [len(c) for c in calls] == [8, 8, 4]


def test_a_call_over_the_limit_is_refused_naming_its_folders(tmp_path):
    _folders(tmp_path, "s", [60])
    _folders(tmp_path, "x", [5])
    with pytest.raises(carry_plan.CarryPlanError, match=r"s0, x0 holds 94 bytes"):
        carry_plan.plan(tmp_path, tree_bytes=9, limit=80)


def test_the_rendered_plan_copies_each_folder_on_its_own(tmp_path):
    text = carry_plan.render([["x3", "x4"], ["p0", "x0"]], ".gpu-carry")
    assert 'call 1: carry [".gpu-carry/x3", ".gpu-carry/x4"]' in text
    # one cp per folder: two pieces' EXTRA.SHA256SUMS in one cp would collide
    assert "mkdir -p /tmp/vc && cp -r .gpu-carry/x3/. /tmp/vc/ && cp -r .gpu-carry/x4/. /tmp/vc/" in text
    assert text.splitlines()[-1].strip().startswith("... and the last call's command goes on")
