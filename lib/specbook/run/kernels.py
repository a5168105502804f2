"""The kernel manager notebook kernels start with: IPC sockets, not TCP.

jupyter_client's default (TCP on loopback, unencrypted) makes every kernel warn "Kernel is running over TCP
without encryption"; a local runner needs no network transport, and Unix sockets in the Jupyter runtime
folder are reachable only through the file system. The socket path is absolute: jupyter_client's default
("kernel-ipc") is relative, and a kernel started in another folder (the run folder, notebooks/) would
create its sockets where the client does not look.
"""

from __future__ import annotations

import os
import uuid

from jupyter_client import AsyncKernelManager
from jupyter_core.paths import jupyter_runtime_dir
from traitlets import CaselessStrEnum, default


class IPCKernelManager(AsyncKernelManager):
    """AsyncKernelManager (nbclient's default) with transport 'ipc' and sockets under the Jupyter runtime folder."""

    transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

    @default("ip")
    def _ip_default(self) -> str:
        if self.transport != "ipc":
            return super()._ip_default()
        if self.connection_file:
            return os.path.abspath(os.path.splitext(self.connection_file)[0] + "-ipc")
        runtime = jupyter_runtime_dir()
        os.makedirs(runtime, exist_ok=True)
        return os.path.join(runtime, f"kernel-{uuid.uuid4().hex[:12]}-ipc")
