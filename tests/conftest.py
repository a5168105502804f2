"""Every test session (each pytest-xdist worker) has its own host lock (specbook.run.hostlock): parallel workers, and
other checkouts' tests on this host, must not wait for each other's fixture runs. Engine tests are serialized
by their own lock around the session; a test of the lock itself sets its own file.

Every test starts with Python's own Ctrl-C handler: a session started in the background by a non-interactive
shell (`cmd &`, as CI scripts and benchmarks/test_tiers.py's callers may) inherits SIGINT ignored, and Python
then keeps it ignored, so a test that delivers Ctrl-C would wait on its bound instead of seeing the interrupt
(and the subprocesses it starts would inherit the ignore); a test that left another handler must not decide
the next one's outcome either."""

from __future__ import annotations

import os
import signal
import tempfile
import threading

import pytest


@pytest.fixture(scope="session", autouse=True)
def _own_host_lock():
    from specbook.run.hostlock import LOCK_ENV

    previous = os.environ.get(LOCK_ENV)
    folder = tempfile.mkdtemp(prefix="specbook-test-lock-")
    os.environ[LOCK_ENV] = os.path.join(folder, "host.lock")  # the kernels and CLI subprocesses inherit it
    yield
    if previous is None:
        os.environ.pop(LOCK_ENV, None)
    else:
        os.environ[LOCK_ENV] = previous


@pytest.fixture(autouse=True)
def _pythons_own_ctrl_c_handler():
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
