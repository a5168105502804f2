"""Every test session (each pytest-xdist worker) has its own host lock (specbook.run.hostlock): parallel workers, and
other checkouts' tests on this host, must not wait for each other's fixture runs. Engine tests are serialized
by their own lock around the session; a test of the lock itself sets its own file."""

from __future__ import annotations

import os
import tempfile

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
