"""The host's load over a window, from processes not the run's own, and the report's contention line."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from specbook.serve import hostload

BUSY = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass\n"


def test_a_busy_process_that_is_not_the_runs_own_makes_a_window_contended(tmp_path):
    quiet_before = hostload.snapshot()
    # a busy process started by someone else: here a child of a child, in its own session, so it is not ours
    outer = subprocess.Popen([sys.executable, "-c",
                              "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
                              "start_new_session=True, stdout=subprocess.DEVNULL); print(p.pid, flush=True)", BUSY],
                             stdout=subprocess.PIPE, text=True)
    busy_pid = int(outer.stdout.readline())
    outer.wait()
    try:
        before = hostload.snapshot()
        deadline = time.monotonic() + 20
        load = hostload.between(before)
        while load.other_cpu_s < 1.0 and time.monotonic() < deadline:  # until it has used a second of CPU
            time.sleep(0.2)
            load = hostload.between(before)
        assert load.contended and load.other_cores >= hostload.CONTENDED_CORES, load
        assert any(f"pid {busy_pid}" in t for t in load.top), load.top
        # its own descendants are the run's: the same busy process counted as ours is no contention
        assert not any(f"pid {busy_pid}" in t for t in hostload.between(before, own=[busy_pid]).top)
    finally:
        subprocess.run(["kill", str(busy_pid)], check=False)
    assert quiet_before.load_1m >= 0

    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    (run / "data" / hostload.HOST_LOAD_NAME).write_text(
        json.dumps(load.record("00-sweep0-baseline")) + "\n" + "{torn\n", encoding="utf-8")
    line = hostload.contention_line(run)
    assert line and line.startswith("1 of 1 measured windows ran under contention") and "00-sweep0-baseline" in line
    assert hostload.contention_line(tmp_path / "no-such-run") is None
