"""Nothing a run folder holds shows a secret (specbook.core.secrets); the kernel still gets the real values.

The params, overrides and command line are shown with their secrets hidden by name; the values found there, and
the launching environment's secrets, become a scrubber that hides them by value in every file the run writes:
the manifest, params.yaml, the executed notebook (before the html is rendered from it), the summary blocks,
and at the end every other text file of the folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core import secrets
from specbook.core.digest import sha256_bytes
from specbook.core.diskwrite import write_atomic, write_text_atomic
from specbook.core.params import dump_params
from specbook.run.execute import REPORT_IPYNB
from specbook.store.manifest import FailedCell, Manifest, write_manifest

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "Shown",
    "dump_params_shown",
    "scrub_manifest",
    "scrub_report",
    "scrub_run_files",
    "shown_of",
    "write_manifest_shown",
]


@dataclass
class Shown:
    """What the run folder shows of the params, overrides and command line, and the scrubber for free text."""

    params: dict[str, Any]
    overrides: list[str]
    command: list[str]
    params_hash: str
    hidden_in_params: bool
    scrub: secrets.Scrubber


def shown_of(params: BaseModel, overrides: list[str], command: list[str]) -> Shown:
    """Params, overrides and command with their secrets hidden; the values found (and the launching
    environment's secrets) become a scrubber for everything else the run writes."""
    plain = params.model_dump(mode="json")
    found: set[str] = set()
    params_shown = secrets.redact_data(plain, found)
    overrides_shown = [secrets.redact_override(o, found) for o in overrides]
    command_shown = secrets.redact_argv(command, found)
    scrub = secrets.Scrubber(found | secrets.env_secret_values(os.environ))
    params_shown = scrub.data(params_shown)  # a secret's value in a free-text field (a description) too
    # the hash of what is shown: a hash of the secret itself would let a reader test guesses of it offline
    canonical = json.dumps(params_shown, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return Shown(params=params_shown, overrides=[scrub(o) for o in overrides_shown],
                 command=[scrub(c) for c in command_shown], params_hash=sha256_bytes(canonical),
                 hidden_in_params=params_shown != plain, scrub=scrub)


def _scrub_tree(obj: Any, scrub: secrets.Scrubber) -> Any:
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, dict):  # embedded images are base64: a match there would be chance and break the image
        return {k: (v if k.startswith("image/") and k != "image/svg+xml" else _scrub_tree(v, scrub))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub_tree(v, scrub) for v in obj]
    return obj


def scrub_report(run_dir: Path, scrub: secrets.Scrubber) -> None:
    """Hide known secrets and URL passwords in the executed notebook (before the html is rendered from it):
    a cell may print what the kernel's real params hold; the summary blocks too."""
    _scrub_summaries(run_dir, scrub)
    report = run_dir / REPORT_IPYNB
    try:
        nb = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    clean = _scrub_tree(nb, scrub)
    if clean != nb:
        write_text_atomic(report, json.dumps(clean, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def _scrub_summaries(run_dir: Path, scrub: secrets.Scrubber) -> None:
    """Hide known secrets and URL passwords in the summary blocks the kernel saved: their question is built
    from the kernel's real params (a description may name a mirror with its password)."""
    for path in [run_dir / "summary.json", *sorted((run_dir / "reanalyses").glob("*.summary.json"))]:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        clean = scrub.data(doc)
        if clean != doc:
            write_text_atomic(path, json.dumps(clean, indent=1, ensure_ascii=False) + "\n")


def scrub_manifest(manifest: Manifest, scrub: secrets.Scrubber) -> None:
    """The manifest's error and failed cell with known secrets hidden (a cell's error may print one)."""
    manifest.error = scrub(manifest.error) if manifest.error else manifest.error
    if manifest.failed_cell is not None:
        manifest.failed_cell = FailedCell.model_validate(_scrub_tree(manifest.failed_cell.model_dump(), scrub))


def write_manifest_shown(run_dir: Path, manifest: Manifest, scrub: secrets.Scrubber) -> None:
    """The manifest with every known secret value hidden wherever it appears (params.description, errors, the
    servers' records), not only under a secret name."""
    write_manifest(run_dir, Manifest.model_validate(scrub.data(manifest.model_dump(mode="json"))))


def dump_params_shown(params: BaseModel, path: Path, scrub: secrets.Scrubber) -> None:
    """params.yaml with secrets hidden by name (dump_params) and by value (a description that repeats one)."""
    dump_params(params, path)
    if scrub:
        text = path.read_text(encoding="utf-8")
        if scrub(text) != text:
            write_text_atomic(path, scrub(text))


# Files the by-value scrub leaves alone: binary frames and images (the report notebook has its own pass, which
# spares embedded images)
_NOT_SCRUBBED = frozenset({".parquet", ".png", ".jpg", ".jpeg", ".gif", ".pdf", ".ipynb"})


def scrub_run_files(run_dir: Path, scrub: secrets.Scrubber) -> list[str]:
    """Every text file of the run folder (JSON, JSONL, YAML, logs, html) with the known secret values hidden;
    the files it changed. A file no value occurs in is not rewritten."""
    if not scrub:
        return []
    needles = [v.encode("utf-8") for v in scrub.values]
    changed = []
    for path in sorted(run_dir.rglob("*")):
        if not path.is_file() or path.suffix in _NOT_SCRUBBED or path.is_symlink():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if not any(n in data for n in needles):
            continue
        text = scrub(data.decode("utf-8", "surrogateescape"))
        write_atomic(path, lambda tmp, text=text: tmp.write_bytes(text.encode("utf-8", "surrogateescape")))
        changed.append(str(path.relative_to(run_dir)))
    return changed
