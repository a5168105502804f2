"""The host lock: one run's servers at a time; a second run waits saying for whom, or is refused naming the holder."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from specbook.run import hostlock

HOLDER = r"""
import sys
from pathlib import Path
from specbook.run import hostlock
with hostlock.held(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.readline()  # until the test lets go
"""


@pytest.fixture
def lock_file(tmp_path, monkeypatch):
    path = tmp_path / "host.lock"
    monkeypatch.setenv(hostlock.LOCK_ENV, str(path))
    return path


def _holder(run_dir) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"  # an event, not a sleep
    return proc


def test_a_second_run_is_refused_with_no_wait_and_waits_otherwise_saying_for_whom(lock_file, tmp_path):
    holder = _holder(tmp_path / "first-run")
    try:
        with pytest.raises(hostlock.HostBusyError) as err:
            with hostlock.held(tmp_path / "second-run", wait=False):
                pytest.fail("the lock was taken while another process held it")
        message = str(err.value)
        assert f"pid {holder.pid}" in message and str(tmp_path / "first-run") in message, message
        assert str(lock_file) in message and "--no-lock" in message

        said: list[str] = []
        got = threading.Event()
        record: dict[str, object] = {}

        def second() -> None:
            with hostlock.held(tmp_path / "second-run", say=said.append) as lock:
                record.update(lock.record())
                got.set()

        t = threading.Thread(target=second)
        t.start()
        assert not got.wait(1.0), "the second run did not wait for the first"
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert got.wait(30), "the second run never got the lock once the first let go"
        t.join(10)
    finally:
        holder.kill()
        holder.wait()
    assert said and f"pid {holder.pid}" in said[0] and "first-run" in said[0], said
    assert record["mode"] == "held" and f"pid {holder.pid}" in str(record["waited_for"]) and record["waited_s"] > 0


def test_a_killed_holder_frees_the_lock_and_no_lock_takes_none(lock_file, tmp_path):
    holder = _holder(tmp_path / "killed-run")
    holder.kill()
    holder.wait()
    with hostlock.held(tmp_path / "next", wait=False) as lock:
        assert lock.record()["mode"] == "held" and lock.waited_for is None
        with hostlock.held(tmp_path / "beside", enabled=False) as off:  # --no-lock: beside the holder
            assert off.record() == {"mode": "off", "path": str(lock_file), "waited_s": 0.0, "waited_for": None}
        assert f"pid {__import__('os').getpid()}" in hostlock.holder(lock_file)


LETTING_GO = r"""
import fcntl, json, os, sys
fh = open(sys.argv[1], "a+")
fcntl.flock(fh, fcntl.LOCK_EX)
fh.seek(0); fh.truncate(); fh.write(json.dumps({"pid": os.getpid(), "run_dir": sys.argv[2]})); fh.flush()
print("held", flush=True)
sys.stdin.readline()
fh.seek(0); fh.truncate(); fh.flush()  # what a holder letting go does just before its flock goes
print("emptied", flush=True)
sys.stdin.readline()
"""


def test_the_waiter_keeps_the_holders_name_through_the_moment_it_lets_go(lock_file, tmp_path, monkeypatch):
    proc = subprocess.Popen([sys.executable, "-c", LETTING_GO, str(lock_file), str(tmp_path / "first-run")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    saw_unknown, saw_name = threading.Event(), threading.Event()
    read_holder = hostlock.holder

    def watched(path=None):
        who = read_holder(path)
        if who == hostlock.UNKNOWN_HOLDER:
            saw_unknown.set()
        elif "first-run" in who:
            saw_name.set()
        return who

    monkeypatch.setattr(hostlock, "holder", watched)
    record: dict[str, object] = {}
    got = threading.Event()

    def second() -> None:
        with hostlock.held(tmp_path / "second-run") as lock:
            record.update(lock.record())
            got.set()

    t = threading.Thread(target=second)
    t.start()
    try:
        assert saw_name.wait(30), "the waiter never read the holder's name"
        proc.stdin.write("empty\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "emptied"
        assert saw_unknown.wait(30), "the waiter never polled the emptied file"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert got.wait(30)
        t.join(10)
    finally:
        proc.kill()
        proc.wait()
    assert f"pid {proc.pid}" in str(record["waited_for"]) and "first-run" in str(record["waited_for"]), record
