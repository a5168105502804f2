"""`python /path/to/specbook/engines/sglang/launch.py ARGS`: SGLang's `sglang.launch_server` with specbook's
step timer (specbook.engines.sglang.step_hooks) installed in every process it starts.

Run by path, not with -m, and standard library only here: SGLang's site comes first on the server's
PYTHONPATH, so its processes must not import specbook's packages (their dependencies are the venv's). The two
files it needs, engines/steptimer.py and sglang/step_hooks.py, are loaded by path.

SGLang starts its scheduler with multiprocessing's spawn; a spawned process runs this file again as
`__mp_main__`, so the import hook below is installed there too before SGLang's modules are imported. The hook
wraps each module of step_hooks.REQUIRED_SOURCE right after it executes. Without $SPECBOOK_STEP_TIMING_DIR
nothing is installed and this is `python -m sglang.launch_server ARGS`.
"""

from __future__ import annotations

import os
import sys

# Run by path, Python puts this file's folder first on sys.path, where its neighbours would shadow top-level
# modules (profile.py: the standard library's `profile`, which cProfile and torch._dynamo import). Taken off
# before anything else is imported; a process SGLang spawns inherits the path without it.
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import importlib.abc  # noqa: E402
import importlib.util  # noqa: E402
import runpy  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

STEP_TIMING_DIR_ENV = "SPECBOOK_STEP_TIMING_DIR"  # specbook.engines.steptimer's (checked by a test)
SGLANG_MAIN = "sglang.launch_server"
HERE = Path(__file__).resolve().parent


def load_by_path(name: str, path: Path) -> ModuleType:
    """The module in `path`, under `name` in sys.modules (a dataclass needs its module there)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"specbook SGLang launcher: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then `after(module)`."""

    def __init__(self, inner: Any, after: Any):
        self.inner, self.after = inner, after

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.after(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... (inspect.getsource reads them)
        return getattr(self.inner, name)


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Calls `after(module)` once each module named in `names` has been imported (found by the other finders)."""

    def __init__(self, names: set[str], after: Any):
        self.names, self.after = set(names), after

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, self.after)
                return spec
        return None


def install(folder: str) -> PatchOnImport:
    """The import hook that wraps SGLang's step (first in sys.meta_path); modules already imported are wrapped
    now."""
    timer = load_by_path("specbook_steptimer", HERE.parent / "steptimer.py")
    hooks = load_by_path("specbook_sglang_step_hooks", HERE / "step_hooks.py")
    installer = hooks.Installer(Path(folder), timer)
    finder = PatchOnImport(set(hooks.REQUIRED_SOURCE), installer)
    sys.meta_path.insert(0, finder)
    for name in hooks.REQUIRED_SOURCE:
        if name in sys.modules:
            installer(sys.modules[name])
    return finder


if os.environ.get(STEP_TIMING_DIR_ENV) and not any(isinstance(f, PatchOnImport) for f in sys.meta_path):
    install(os.environ[STEP_TIMING_DIR_ENV])

if __name__ == "__main__":
    runpy.run_module(SGLANG_MAIN, run_name="__main__", alter_sys=False)
