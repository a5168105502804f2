"""A full disk while a run writes its files: a DiskFullError naming the file, earlier files whole, no temp file.

Two real small disks, each giving the kernel's own error (nothing here fakes an errno):
- `tmpfs`: a 512 KiB tmpfs mounted on the test's folder; writes past it fail with ENOSPC (needs root and mount).
- `fsize`: RLIMIT_FSIZE of 256 KiB on the writing process (SIGXFSZ ignored, as a shell's `ulimit -f` would not);
  a write past it fails with EFBIG or comes back short. Any user can set it, so this case always runs.
The writes happen in a subprocess (the limit is per process; the mount is the test's own folder).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = r"""
import json, sys
import numpy as np, pandas as pd
from specbook.core.errors import DiskFullError
from specbook.store.manifest import Manifest, GitInfo, write_manifest
from specbook.store.runstore import RunContext

ctx = RunContext(sys.argv[1])
small = pd.DataFrame({"run_id": ["r0", "r1"], "al": [2.5, 3.0]})
ctx.append_frame("runs", small)
ctx.save_json("arms", {"arms": ["A", "B"]})
ctx.record_server("arm-0", ["vllm", "serve"], {}, {"vllm": "0.32"}, started_at=None, status="ok")
manifest = Manifest(run_id="r", experiment="x", started_at="t", params_file="p", params_name="p", params={},
                    params_hash="h", notebook="n", kernel="k", git=GitInfo(), specbook_version="0",
                    python={}, libraries={})
write_manifest(ctx.run_dir, manifest)
big = pd.DataFrame({"run_id": ["r2"] * 150_000, "al": np.random.default_rng(0).random(150_000)})
huge = "x" * 600_000
errors = {}
attempts = {
    "frame": lambda: ctx.append_frame("runs", big),
    "json": lambda: ctx.save_json("arms", {"arms": [huge]}),
    "servers": lambda: ctx.record_server("arm-1", ["vllm", huge], {}, {}, started_at=None, status="ok"),
    "manifest": lambda: write_manifest(ctx.run_dir, manifest.model_copy(update={"error": huge})),
}
for what, attempt in attempts.items():
    try:
        attempt()
        errors[what] = None
    except DiskFullError as exc:
        errors[what] = str(exc)
print(json.dumps(errors))
"""


def _mount_tmpfs(where: Path) -> str | None:
    """Mount a 512 KiB tmpfs; None when it worked, else why not."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "mounting a tmpfs needs root and mount(8)"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else f"mount -t tmpfs failed: {done.stderr.strip()}"


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))


@pytest.fixture(params=["tmpfs", "fsize"])
def small_disk(request, tmp_path):
    """(run folder, preexec_fn) on a small disk of the given kind."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if request.param == "fsize":
        yield disk / "run", _limit_file_size
        return
    why_not = _mount_tmpfs(disk)
    if why_not:
        pytest.skip(f"LOUD SKIP: no tmpfs here ({why_not}); the `fsize` case covers a full disk (EFBIG)")
    try:
        yield disk / "run", None
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_names_the_file_and_keeps_every_earlier_file(small_disk):
    run_dir, preexec = small_disk
    done = subprocess.run([sys.executable, "-c", SCENARIO, str(run_dir)], capture_output=True, text=True,
                          preexec_fn=preexec, timeout=120)
    assert done.returncode == 0, done.stderr
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    names = {"frame": "data/runs.parquet", "json": "data/arms.json", "servers": "servers.jsonl",
             "manifest": "manifest.json"}
    for what, name in names.items():
        assert errors[what] is not None, f"writing {what} past the small disk raised no DiskFullError"
        assert f"{run_dir / name}: disk full" in errors[what], errors[what]

    # reading back needs no space: every file written before the disk filled is whole
    from specbook.store.manifest import read_manifest
    from specbook.store.runstore import RunContext

    ctx = RunContext.from_run_dir(run_dir)
    assert list(ctx.load_frame("runs")["run_id"]) == ["r0", "r1"]
    assert ctx.load_json("arms") == {"arms": ["A", "B"]}
    read = ctx.read_servers()
    assert [s.name for s in read.records] == ["arm-0"] and read.skipped == []
    assert read_manifest(run_dir).error is None
    assert [p.name for p in run_dir.rglob("*") if p.name.endswith(".tmp")] == []


SERVER_LOG_SCENARIO = """
import json, sys
from pathlib import Path
from specbook.core.errors import DiskFullError
from specbook.serve.server import ManagedServer, ServerSpec

log = Path(sys.argv[1])
spec = ServerSpec(name="s", argv=["sleep", "30"], port=1, log_path=log, env={"PAD": "x" * 600})
try:
    ManagedServer(spec).start()
    print(json.dumps({"error": None}))
except DiskFullError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def test_a_server_log_on_a_full_disk_is_named_before_the_server_starts(tmp_path):
    """The launcher's `Env:` line is the log's first write: a full disk there is a DiskFullError naming the log,
    and no engine process is started (RLIMIT_FSIZE of 512 bytes < the Env line)."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))

    log = tmp_path / "logs" / "s.log"
    done = subprocess.run([sys.executable, "-c", SERVER_LOG_SCENARIO, str(log)], capture_output=True, text=True,
                          preexec_fn=limit, timeout=120)
    assert done.returncode == 0, done.stderr
    error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
    assert error is not None and f"{log}: disk full" in error


RUNNER_SCENARIO = r"""
import json, sys, time
from pathlib import Path
from papermill.iorw import papermill_io
from specbook.run import runner
from specbook.run.execute import atomic_notebook_writes
from specbook.core.errors import DiskFullError
from specbook.store.manifest import Manifest, GitInfo, RunPart, read_manifest, write_manifest

run_dir = Path(sys.argv[1])
run_dir.mkdir(parents=True)
manifest = Manifest(run_id="r", experiment="x", started_at="t", params_file="p", params_name="p", params={},
                    params_hash="h", notebook="n", kernel="k", git=GitInfo(), specbook_version="0",
                    python={}, libraries={}, parts=[RunPart(started_at="t")])
write_manifest(run_dir, manifest)
runner._reserve_space(run_dir)
report = run_dir / "report.ipynb"
report.write_text(json.dumps({"cells": [], "note": "the notebook after the last cell"}))
with open(run_dir / "filler", "wb", buffering=0) as fh:  # the disk fills up (another process, a big log)
    try:
        while True:
            fh.write(b"x" * 4096)
    except OSError:
        pass
out = {}
try:  # papermill saves the notebook after a cell: through the run's handler, the old one stays whole
    with atomic_notebook_writes(run_dir):
        papermill_io.write(json.dumps({"cells": ["y" * 200_000]}), str(report))
    out["notebook"] = None
except DiskFullError as exc:
    out["notebook"] = str(exc)
out["notebook_after"] = json.loads(report.read_text())["note"]
manifest.status, manifest.error = "failed", "a cell failed"
try:  # the run ends: its manifest must say failed although the disk is full
    runner._finalize(manifest, run_dir, time.monotonic())
    out["finalize"] = None
except DiskFullError as exc:
    out["finalize"] = str(exc)
m = read_manifest(run_dir)
out["status"], out["error"] = m.status, m.error
print(json.dumps(out))
"""


def test_a_run_ending_on_a_full_disk_keeps_its_notebook_whole_and_its_manifest_says_failed(tmp_path):
    """A real 512 KiB tmpfs filled to the last byte: papermill's save of report.ipynb goes through the atomic
    writer (the previous notebook stays whole, not truncated), and the last manifest is written from the run's
    space reserve, so the folder says `failed` and why instead of staying `running`."""
    disk = tmp_path / "disk"
    disk.mkdir()
    why_not = _mount_tmpfs(disk)
    if why_not:
        pytest.skip(f"LOUD SKIP: no tmpfs here ({why_not}); a full disk cannot be made without one")
    try:
        done = subprocess.run([sys.executable, "-c", RUNNER_SCENARIO, str(disk / "run")], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["notebook"] and "report.ipynb: disk full" in out["notebook"], out
        assert out["notebook_after"] == "the notebook after the last cell"
        assert out["finalize"] and "manifest.json: disk full" in out["finalize"], out
        assert out["status"] == "failed" and "a cell failed" in out["error"] and "disk full" in out["error"], out
        assert not (disk / "run" / ".space-reserve").exists()
    finally:
        subprocess.run(["umount", str(disk)], check=True)
