"""A run folder's units of work (specbook.store.units): which are done, and setting aside what unfinished ones
left, on made-up folders and on real run folders (tests/golden: frames saved by real runs)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pandas as pd
import pytest

from specbook.core.errors import DiskFullError, RunError
from specbook.store import units as store_units
from specbook.store.runstore import RunContext
from specbook.store.units import Units, done_units, set_aside_unfinished, units_of

UNITS = Units(done_frame="units", key=("unit",), frames=("units", "items"), server="unit")


def _folder(tmp_path: Path) -> RunContext:
    ctx = RunContext(tmp_path / "run")
    ctx.save_frame("units", pd.DataFrame({"unit": ["u0", "u1", "u2"], "status": ["ok", "ok", "failed"]}))
    ctx.save_frame("items", pd.DataFrame({"unit": ["u0", "u1", "u2", "u3"], "value": [0, 1, 2, 3]}))
    for unit in ("u0", "u1", "u2", "u3"):
        ctx.log_path(unit).write_text(f"Env: UNIT={unit}\nserver output\n")  # a server log starts so
    ctx.log_path("u3.1").write_text("Env: UNIT=u3\nan earlier launch of u3\n")
    ctx.log_path("progress").write_text("not a server's log: the runner's own\n")
    records = [json.dumps({"name": u, "argv": ["x"]}) for u in ("u0", "u1", "u2")]
    (ctx.run_dir / "servers.jsonl").write_text("\n".join(records) + '\n{"name": "u3", "ar')  # torn last line
    (ctx.data_dir / "items.parquet.tmp").write_text("half a frame")
    return ctx


STATUS_UNITS = Units(done_frame="units", key=("unit",), frames=("units", "items"), server="unit",
                     done_when={"status": "ok"})


def test_done_units_are_the_done_frame_rows_meeting_the_condition(tmp_path):
    ctx = _folder(tmp_path)
    assert done_units(ctx, STATUS_UNITS) == {("u0",), ("u1",)}
    assert done_units(ctx, UNITS) == {("u0",), ("u1",), ("u2",)}  # no condition: every row
    assert done_units(RunContext(tmp_path / "fresh"), STATUS_UNITS) == set()


def test_set_aside_moves_what_unfinished_units_left_and_keeps_the_rest(tmp_path):
    ctx = _folder(tmp_path)
    moved = set_aside_unfinished(ctx, STATUS_UNITS)
    aside = ctx.run_dir / "unfinished" / "1"
    assert moved["folder"] == "unfinished/1" and moved["rows"] == {"units": 1, "items": 2}
    assert list(ctx.load_frame("units")["unit"]) == ["u0", "u1"]
    assert list(ctx.load_frame("items")["unit"]) == ["u0", "u1"]
    assert list(pd.read_parquet(aside / "data" / "items.parquet")["unit"]) == ["u2", "u3"]
    assert list(pd.read_parquet(aside / "data" / "units.parquet")["status"]) == ["failed"]
    assert sorted(p.name for p in ctx.logs_dir.iterdir()) == ["progress.log", "u0.log", "u1.log"]
    assert sorted(moved["logs"]) == ["u2.log", "u3.1.log", "u3.log"] and (aside / "logs" / "u3.1.log").is_file()
    kept = [json.loads(ln)["name"] for ln in (ctx.run_dir / "servers.jsonl").read_text().splitlines()]
    assert kept == ["u0", "u1"]
    assert moved["servers"][0] == "u2" and "unreadable line" in moved["servers"][1]
    assert moved["temp_files"] == ["items.parquet.tmp"] and not list(ctx.data_dir.glob("*.tmp"))
    assert json.loads((aside / "set_aside.json").read_text())["rows"] == {"units": 1, "items": 2}
    # nothing left to move: nothing moved, no empty folder; a later set-aside gets the next number
    assert set_aside_unfinished(ctx, STATUS_UNITS) == {} and not (ctx.run_dir / "unfinished" / "2").exists()
    ctx.append_frame("items", pd.DataFrame({"unit": ["u9"], "value": [9]}))
    assert set_aside_unfinished(ctx, STATUS_UNITS)["folder"] == "unfinished/2"


def test_set_aside_gives_back_the_integer_columns_a_failed_row_made_float(tmp_path):
    # Seen in CI: the kill hit while a unit's server was dying, the kernel appended that unit's failed row (no
    # counts, NaN) and the kept ok rows' int64 counts were float64 from then on: the resumed run's frame read
    # differently from an uninterrupted run's. Columns that were float anyway stay float.
    ctx = RunContext(tmp_path / "run")
    ok = pd.DataFrame({"unit": ["u0", "u1"], "status": ["ok", "ok"], "seed": [7, 8], "tok_s": [2.0, 3.5],
                       "ready_s": [31.2, 30.4]})
    ctx.save_frame("units", ok)
    ctx.append_frame("units", pd.DataFrame([{"unit": "u2", "status": "failed", "ready_s": float("nan")}]))
    assert ctx.load_frame("units")["seed"].dtype == "float64"
    set_aside_unfinished(ctx, STATUS_UNITS)
    kept = ctx.load_frame("units")
    assert kept["seed"].dtype == "int64" and list(kept["seed"]) == [7, 8]
    assert kept["tok_s"].dtype == "float64"  # the moved row had no NaN there: it was float before it
    pd.testing.assert_frame_equal(kept, ok)


def test_set_aside_names_a_frame_without_the_unit_columns(tmp_path):
    ctx = RunContext(tmp_path / "run")
    ctx.save_frame("units", pd.DataFrame({"unit": ["u0"]}))
    ctx.save_frame("items", pd.DataFrame({"value": [1]}))
    with pytest.raises(RunError, match=r"items\.parquet: has no unit column"):
        set_aside_unfinished(ctx, UNITS)


def test_set_aside_rows_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """The set-aside frame goes through the atomic writer: a full disk names the file, leaves no part of it, and
    leaves the run's own frames as they were (nothing is lost before it is set aside)."""
    ctx = _folder(tmp_path)
    units_before = ctx.load_frame("units")
    real = pd.DataFrame.to_parquet

    def full_disk(frame, path, *args, **kwargs):
        if "unfinished" in str(path):
            Path(path).write_bytes(b"PAR1 half")  # what a cut write leaves
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(frame, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full_disk)
    with pytest.raises(DiskFullError, match=r"unfinished/1/data/units\.parquet: disk full"):
        set_aside_unfinished(ctx, STATUS_UNITS)
    aside = ctx.run_dir / "unfinished" / "1" / "data"
    assert sorted(p.name for p in aside.iterdir()) == ["items.parquet.tmp"]  # the stray temp file set aside first
    pd.testing.assert_frame_equal(ctx.load_frame("units"), units_before)


def test_units_are_registered_by_experiment_name():
    registered = Units(done_frame="d", key=("k",), frames=("d",), server="s")
    assert store_units.register_units("fixture_registered", registered) is registered
    assert units_of("fixture_registered") is registered and units_of("no_such_experiment") is None


# --------------------------------------------------------------------------------------------------
# The experiments' declared units on real run folders

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.mark.parametrize("experiment, unfinished_server, frames_with_rows", [
    ("config_flip", "arm1-100.0", ("requests", "intervals")),
    ("cross_engine", "llamacpp-draft-int4", ("requests", "cell_counters")),
])
def test_a_unit_killed_before_its_done_row_is_set_aside_on_a_real_run_folder(tmp_path, experiment,
                                                                              unfinished_server, frames_with_rows):
    import shutil

    import specbook.experiments  # noqa: F401  (registers the experiments' units)
    from specbook.experiments.registry import get_experiment

    run_dir = tmp_path / experiment
    shutil.copytree(GOLDEN / experiment, run_dir)
    units = units_of(experiment)
    ctx = RunContext(run_dir)
    done_rows = units.upgraded(ctx.load_frame(units.done_frame))  # a frame saved before a key column existed
    everything = done_units(ctx, units)
    assert len(everything) == len(done_rows)  # every unit of the finished run is done
    # the kill came after the last unit's other rows, before its done row (collect appends that last)
    last = done_rows[done_rows[units.server] == unfinished_server]
    ctx.save_frame(units.done_frame, done_rows.drop(index=last.index))
    key = tuple(last[list(units.key)].iloc[0])
    before = {name: len(ctx.load_frame(name)) for name in units.frames if ctx.has_frame(name)}
    assert done_units(ctx, units) == everything - {key}

    moved = set_aside_unfinished(ctx, units)
    assert set(moved["rows"]) == set(frames_with_rows) and moved["servers"] == [unfinished_server]
    assert moved["logs"] == [f"{unfinished_server}.log"]
    for name in frames_with_rows:
        left = ctx.load_frame(name)
        assert len(left) == before[name] - moved["rows"][name] and moved["rows"][name] > 0
        assert key not in set(left[list(units.key)].itertuples(index=False, name=None))
    get_experiment(experiment).require("load")(ctx)  # what is left still loads
