"""What a run tarball that book.sh handed back holds: its one run folder and that run's experiment.

pack.sh (here, RESUME=...) refuses a tarball that is not one run folder with its manifest, so that a lease never
finds it unusable; book.sh (on the GPU host, `resume:FILE`) unpacks it into outputs/EXPERIMENT/. Both ask this,
in one pass over the compressed stream (a run's traces make it tens of MB).

Usage: run_tarball.py TARBALL  -> prints "RUN_FOLDER EXPERIMENT"; exit 1 with the reason on stderr otherwise.
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path


class RunTarballError(ValueError):
    """The file is not a tarball of one run folder with a readable manifest.json."""


def describe(path: Path) -> tuple[str, str]:
    """(run folder, experiment) of a run tarball, reading the stream once, to its end (one folder only)."""
    top = experiment = None
    try:
        with tarfile.open(path, "r|gz") as stream:
            for member in stream:
                name = member.name.removeprefix("./")
                first = name.split("/", 1)[0]
                if top is None:
                    top = first
                elif first != top:
                    raise RunTarballError(f"{path}: holds {top}/ and {first}/, not one run folder")
                if member.isfile() and name == f"{top}/manifest.json":
                    manifest = json.load(stream.extractfile(member))
                    experiment = manifest.get("experiment") if isinstance(manifest, dict) else None
                    if not isinstance(experiment, str) or not experiment:
                        raise RunTarballError(f"{path}: {top}/manifest.json names no experiment")
    except (tarfile.TarError, OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunTarballError(f"{path}: not a readable run tarball ({exc})") from exc
    if top is None:
        raise RunTarballError(f"{path}: empty tarball")
    if experiment is not None:
        return top, experiment
    raise RunTarballError(f"{path}: no {top}/manifest.json (a run folder as book.sh hands back has one)")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: run_tarball.py TARBALL", file=sys.stderr)
        return 2
    try:
        top, experiment = describe(Path(argv[0]))
    except RunTarballError as exc:
        print(f"run_tarball.py: {exc}", file=sys.stderr)
        return 1
    print(top, experiment)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
