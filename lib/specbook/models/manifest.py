"""`specbook-model.json`: what a model folder holds and how it was made; written last, it marks completion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from specbook.core.digest import sha256_file

from ..core.errors import ModelPrepareError

MANIFEST_NAME = "specbook-model.json"
MANIFEST_SCHEMA_VERSION = 1


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: str
    bytes: int


class SourceInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gguf_path: str
    gguf_sha256: str
    base_model: str | None = None
    base_weights_sha256: str | None = None


class AgreementRecord(BaseModel):
    """Teacher-forced top-1 agreement of a draft with its target, and the AL it implies.

    top1_agreement (which sets expected_acceptance_length) counts the assistant-answer positions;
    the all-positions figure also counts the system prompt and question.
    """

    model_config = ConfigDict(extra="forbid")

    top1_agreement: float
    positions: int
    top1_agreement_all_positions: float
    all_positions: int
    texts: int
    text_set: str
    text_set_sha256: str
    k: int
    expected_acceptance_length: float
    measured_with: str
    seconds: float


class ModelManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = MANIFEST_SCHEMA_VERSION
    name: str
    role: Literal["target", "draft"]
    description: str
    source: SourceInfo
    method: str
    quantization: dict | None = None
    files: dict[str, FileEntry]
    agreement: AgreementRecord | None = None
    versions: dict[str, str]
    prepare_s: float
    created_at: str


def file_entries(folder: Path) -> dict[str, FileEntry]:
    """Every file in `folder` (recursively, manifest excluded) with its sha256 and size."""
    return {
        p.relative_to(folder).as_posix(): FileEntry(sha256=sha256_file(p), bytes=p.stat().st_size)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


def write_manifest(folder: Path, manifest: ModelManifest) -> Path:
    path = folder / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n")
    tmp.replace(path)
    return path


def read_manifest(folder: Path) -> ModelManifest:
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise ModelPrepareError(f"{path} does not exist: the folder is not a complete specbook model")
    try:
        return ModelManifest.model_validate(json.loads(path.read_text()))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise ModelPrepareError(f"{path} is not a valid specbook model manifest: {exc}") from exc


def verify_folder(folder: Path, *, checksums: bool = True) -> list[str]:
    """Problems with `folder` against its manifest (empty list: intact).

    With checksums=False only presence and sizes are checked (cheap enough for every model_path call).
    """
    try:
        manifest = read_manifest(folder)
    except ModelPrepareError as exc:
        return [str(exc)]
    problems = []
    for rel, entry in manifest.files.items():
        path = folder / rel
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != entry.bytes:
            problems.append(f"{path}: {path.stat().st_size} bytes, manifest says {entry.bytes}")
        elif checksums and sha256_file(path) != entry.sha256:
            problems.append(f"{path}: sha256 differs from the manifest")
    return problems
