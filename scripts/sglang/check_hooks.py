"""Check, without starting a server, that specbook's step timer wraps the SGLang this Python imports.

    python3 scripts/sglang/check_hooks.py [FOLDER]

Installs the launcher's import hook (specbook/engines/sglang/launch.py, as in each process SGLang spawns), imports
the four SGLang modules the step timer wraps (specbook.engines.sglang.step_hooks.REQUIRED_SOURCE) and the worker
classes SGLang picks for STANDALONE and NGRAM, and prints the status the hook wrote: what it wrapped, what it
refused and why. Exit status 1 where a module was refused or a method is not wrapped. SGLang comes from
PYTHONPATH ($SPECBOOK_SGLANG_SITE's folders first on a GPU host: `PYTHONPATH=/tmp/sglsite python3 ...`). Seconds,
no GPU needed where SGLang imports (on the CPU machine only with its CUDA kernels stubbed: the closing note of
2026-12-07 says how it was run there).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import tempfile
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[2] / "lib" / "specbook" / "engines" / "sglang" / "launch.py"
WRAPPED = {  # class (module:qualname) -> methods that must carry the wrapper (inherited ones included)
    "sglang.srt.managers.tp_worker:TpModelWorker": ["forward_batch_generation"],
    "sglang.srt.model_executor.model_runner:ModelRunner": ["forward", "sample"],
    "sglang.srt.speculative.standalone_worker_v2:StandaloneWorkerV2": ["forward_batch_generation"],
    "sglang.srt.speculative.standalone_worker_v2:StandaloneDraftWorker": ["draft", "_draft_extend_for_decode"],
    "sglang.srt.speculative.ngram_worker:NGRAMWorker": ["forward_batch_generation",
                                                         "_prepare_for_speculative_decoding"],
}


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="sglang-hooks-"))
    os.environ["SPECBOOK_STEP_TIMING_DIR"] = str(folder)
    runpy.run_path(str(LAUNCHER), run_name="__mp_main__")  # installs the hook, as in a spawned process
    problems = []
    for where, methods in WRAPPED.items():
        module, _, name = where.partition(":")
        cls = getattr(importlib.import_module(module), name)
        problems += [f"{where}.{m} not wrapped" for m in methods if not hasattr(getattr(cls, m, None), "__wrapped__")]
    for module in ("sglang.srt.speculative.eagle_worker_v2", "sglang.srt.speculative.ngram_worker"):
        if not hasattr(importlib.import_module(module).eagle_sample, "__wrapped__"):
            problems.append(f"{module}.eagle_sample not wrapped")
    for path in sorted(folder.glob("sglang-steps-*.status.json")):
        status = json.loads(path.read_text())
        print(json.dumps(status, indent=1, sort_keys=True))
        problems += [f"{m} refused: {why}" for m, why in status["refused"].items()]
    import sglang

    print(f"sglang {getattr(sglang, '__version__', '?')}: " + ("; ".join(problems) if problems else "every wrapper in place"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
