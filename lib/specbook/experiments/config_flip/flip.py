"""Config flips: copies of a model folder that share its weights and differ in one config field.

The weights are never copied: every weight file of a copy is a link (symlink by default, hard link
on request) to the original's real file, and that is verified by device + inode after the copy is
built. Every other file is copied byte for byte, then the one field is edited in one JSON file.
`assert_only_field_differs` diffs *all* files of two copies (JSON structurally, the rest by sha256)
and refuses unless the only differences lie at the declared dotted path.

Dotted paths: ``rope_theta``, ``rope_scaling.factor``, ``layer_types.3`` (an integer indexes a list).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal

from specbook.core import dotted as dotted_path
from specbook.core.digest import sha256_bytes, sha256_file
from specbook.core.diskwrite import write_text_atomic
from specbook.core.errors import ExperimentError

WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
# A non-weight file this large is almost surely weights under an unknown name: refuse to copy it.
MAX_COPIED_BYTES = 64 * 1024 * 1024
LinkMode = Literal["symlink", "hardlink"]
_MISSING = dotted_path.MISSING


def is_weight_file(path: Path) -> bool:
    return path.name.endswith(WEIGHT_SUFFIXES)


# ---------------------------------------------------------------------------------------------
# dotted paths
# ---------------------------------------------------------------------------------------------


def check_dotted_path(dotted: str) -> None:
    """ExperimentError unless `dotted` is a path like 'rope_scaling.factor'."""
    try:
        dotted_path.split(dotted)
    except dotted_path.DottedPathError as exc:
        raise ExperimentError(f"field path {exc}") from None


def get_field(doc: Any, dotted: str, *, file: str = "<json>") -> Any:
    """The value at `dotted`; ExperimentError naming the path and file if it is missing."""
    check_dotted_path(dotted)
    value = dotted_path.get(doc, dotted)
    if value is dotted_path.MISSING:
        raise ExperimentError(f"field {dotted!r} is missing from {file}")
    return value


def has_field(doc: Any, dotted: str) -> bool:
    check_dotted_path(dotted)
    return dotted_path.get(doc, dotted) is not dotted_path.MISSING


def set_field(doc: Any, dotted: str, value: Any, *, add_missing: bool = False, file: str = "<json>") -> Any:
    """Set `dotted` to `value` in place and return the old value (None when it was added).

    A missing field (or missing parent object) is refused unless `add_missing`; list indexes are
    never invented.
    """
    check_dotted_path(dotted)
    try:
        old = dotted_path.set_path(doc, dotted, value, create=add_missing)
    except dotted_path.DottedPathError as exc:
        hint = "; set flip.add_missing: true to add it" if "does not exist" in str(exc) else ""
        raise ExperimentError(f"field {dotted!r} in {file}: at {exc.where!r}: {exc}{hint}") from None
    return None if old is dotted_path.MISSING else old


# ---------------------------------------------------------------------------------------------
# the flipped file: a path inside the model folder, never outside it
# ---------------------------------------------------------------------------------------------


def check_relative_file(file: str, field: str = "flip.file") -> str:
    """`file` as a relative path below a folder, or ExperimentError naming `field` and the value.

    Refused: empty, absolute (``/x``, ``~/x``, ``C:\\x``), any ``..`` segment, a NUL byte. Whether it stays
    inside once symlinks are followed is checked against the folder itself (`resolve_inside`).
    """
    def refuse(why: str) -> ExperimentError:
        return ExperimentError(f"{field} {file!r}: {why}; give a path relative to the model folder, e.g. config.json")

    if not isinstance(file, str) or not file.strip():
        raise refuse("is empty")
    if "\0" in file:
        raise refuse("contains a NUL byte")
    posix, windows = PurePosixPath(file), PureWindowsPath(file)
    if posix.is_absolute() or windows.is_absolute() or windows.drive:
        raise refuse("is an absolute path")
    if file.startswith("~"):
        raise refuse("starts with '~' (a home folder)")
    if ".." in posix.parts or ".." in windows.parts:
        raise refuse("leaves the model folder ('..')")
    if posix.name in ("", "."):
        raise refuse("names no file")
    return file


def resolve_inside(folder: Path, file: str, field: str = "flip.file") -> Path:
    """`folder / file` with symlinks followed, which must lie inside `folder` (itself resolved); else
    ExperimentError naming `field`, the value and where it leads."""
    check_relative_file(file, field)
    root = Path(folder).resolve()
    target = (root / file).resolve()
    if not any(target.is_relative_to(inside) for inside in own_storage(root)):
        raise ExperimentError(
            f"{field} {file!r} resolves to {target}, outside the model folder {root} (through a symbolic link); "
            "only a file of the folder itself can be flipped"
        )
    return target


def own_storage(root: Path) -> list[Path]:
    """Where a model folder's files may really lie: the folder, and for a Hugging Face hub snapshot
    (CACHE/models--ORG--NAME/snapshots/REV, whose files link to ../../blobs/SHA) its own cache's blobs."""
    places = [root]
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith(("models--", "datasets--")):
        places.append(root.parent.parent / "blobs")
    return places


# ---------------------------------------------------------------------------------------------
# the folder copy with linked weights
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlippedFolder:
    """One arm's folder: where it is, what was changed, and which files are shared weights."""

    path: Path
    source: Path
    file: str
    field: str
    value: Any
    original_value: Any
    field_was_added: bool
    linked_weights: tuple[str, ...]
    copied_files: tuple[str, ...]
    link_mode: LinkMode


def _link(src_real: Path, dst: Path, mode: LinkMode) -> None:
    if mode == "symlink":
        dst.symlink_to(src_real)
        return
    try:
        os.link(src_real, dst)
    except OSError as exc:  # EXDEV across filesystems: refuse rather than fall back to a copy
        raise ExperimentError(
            f"cannot hard-link weight file {src_real} into {dst.parent} ({exc.strerror}); "
            "the weights would not be shared: use flip.link: symlink or a destination on the same filesystem"
        ) from exc


def build_flipped_folder(
    source: Path,
    dest: Path,
    *,
    file: str,
    field: str,
    value: Any,
    add_missing: bool = False,
    link_mode: LinkMode = "symlink",
    max_copied_bytes: int = MAX_COPIED_BYTES,
) -> FlippedFolder:
    """Build `dest` as a copy of `source` whose weights are links and whose `file` has `field` = `value`.

    The edited JSON file is rewritten (indent 2) even when `value` equals the original, so all arms
    of one flip serialize it the same way.
    """
    source = Path(source).resolve()
    dest = Path(dest)
    if link_mode not in ("symlink", "hardlink"):
        raise ExperimentError(f"flip.link {link_mode!r}: weights must be shared, use 'symlink' or 'hardlink'")
    if not source.is_dir():
        raise ExperimentError(f"model folder {source} does not exist or is not a folder")
    edited = resolve_inside(source, file)  # params validation refused the obvious; here symlinks count too
    if is_weight_file(source / file) or is_weight_file(edited):
        raise ExperimentError(f"flip.file {file!r} is a weight file; only a JSON file of the folder can be flipped")
    if not edited.is_file():
        raise ExperimentError(f"flip.file {file!r} does not exist in {source}")
    try:
        doc = json.loads(edited.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ExperimentError(f"flip.file {edited} is not valid JSON: {exc}") from exc
    if dest.exists() and any(dest.iterdir()):
        raise ExperimentError(f"flip destination {dest} exists and is not empty")

    plan = _plan_copy(source, max_copied_bytes)
    # Edit before touching the disk so a refused field leaves nothing half-built behind.
    added = not has_field(doc, field)
    original = set_field(doc, field, value, add_missing=add_missing, file=str(edited))

    if PurePosixPath(file).as_posix() not in {rel for rel, _ in plan}:
        raise ExperimentError(f"flip.file {file!r} is not one of the files copied from {source}")

    dest.mkdir(parents=True, exist_ok=True)
    linked, copied = [], []
    for rel, src_real in plan:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if is_weight_file(Path(rel)):
            _link(src_real, out, link_mode)
            linked.append(rel)
        else:
            shutil.copyfile(src_real, out)
            copied.append(rel)
    # the edit goes to the copy only: a regular file this function made inside dest, never through a link
    written = resolve_inside(dest, file)
    if (dest / file).is_symlink() or not written.is_file():
        raise ExperimentError(f"flip.file {file!r}: its copy in {dest} is not a regular file; nothing was edited")
    write_text_atomic(written, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")

    folder = FlippedFolder(
        path=dest, source=source, file=file, field=field, value=value,
        original_value=None if added else original, field_was_added=added,
        linked_weights=tuple(linked), copied_files=tuple(copied), link_mode=link_mode,
    )
    assert_weights_shared(folder)
    return folder


def _plan_copy(source: Path, max_copied_bytes: int) -> list[tuple[str, Path]]:
    """(relative path, real source file) for every file; refuses big non-weight files and no weights."""
    plan: list[tuple[str, Path]] = []
    for path in sorted(source.rglob("*")):
        if path.is_dir():
            continue
        rel = path.relative_to(source).as_posix()
        real = path.resolve()  # HF-cache style folders hold symlinks to blobs: link to the blob
        if not real.is_file():
            raise ExperimentError(f"{path} is a dangling link or not a regular file")
        if not is_weight_file(path) and real.stat().st_size > max_copied_bytes:
            raise ExperimentError(
                f"{path} ({real.stat().st_size / 2**20:.0f} MiB) is not named like a weight file "
                f"({', '.join(WEIGHT_SUFFIXES)}) but is too big to copy; the weights would not be shared"
            )
        plan.append((rel, real))
    if not any(is_weight_file(Path(rel)) for rel, _ in plan):
        raise ExperimentError(f"model folder {source} holds no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    return plan


def assert_weights_shared(folder: FlippedFolder) -> None:
    """Every weight file of the copy is the original's file (same device and inode), never a copy."""
    for rel in folder.linked_weights:
        copy_stat = (folder.path / rel).stat()
        orig_stat = (folder.source / rel).stat()
        if (copy_stat.st_dev, copy_stat.st_ino) != (orig_stat.st_dev, orig_stat.st_ino):
            raise ExperimentError(f"weight file {folder.path / rel} is not shared with {folder.source / rel}")
    for rel in folder.copied_files:
        if is_weight_file(Path(rel)):
            raise ExperimentError(f"weight file {rel} was copied into {folder.path}; weights must be shared")


# ---------------------------------------------------------------------------------------------
# the exactly-one-field diff
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FolderDifference:
    """One difference between two folders: a JSON leaf (field set) or a whole file (field None)."""

    file: str
    field: str | None
    left: Any
    right: Any

    def describe(self) -> str:
        where = f"{self.file}:{self.field}" if self.field is not None else self.file
        return f"{where}: {self.left!r} != {self.right!r}"


def same_json(a: Any, b: Any) -> bool:
    # type-strict: JSON's true/1 and 1/1.0 are different configs
    return type(a) is type(b) and a == b


def _json_diff(a: Any, b: Any, path: list[str | int], out: list[tuple[str, Any, Any]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            _json_diff(a.get(key, _MISSING), b.get(key, _MISSING), [*path, key], out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _json_diff(x, y, [*path, i], out)
    elif not same_json(a, b):
        label = lambda v: "<missing>" if v is _MISSING else v  # noqa: E731
        out.append((dotted_path.join(path), label(a), label(b)))


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _MISSING


def diff_folders(left: Path, right: Path) -> list[FolderDifference]:
    """All differences between two folders: JSON files leaf by leaf, other files by sha256.

    Files that resolve to the same device+inode (shared weights) are equal without hashing.
    """
    left, right = Path(left), Path(right)
    files_l = {p.relative_to(left).as_posix() for p in left.rglob("*") if not p.is_dir()}
    files_r = {p.relative_to(right).as_posix() for p in right.rglob("*") if not p.is_dir()}
    diffs: list[FolderDifference] = []
    for rel in sorted(files_l | files_r):
        if rel not in files_r or rel not in files_l:
            diffs.append(FolderDifference(rel, None, "<present>" if rel in files_l else "<missing>",
                                          "<present>" if rel in files_r else "<missing>"))
            continue
        pl, pr = left / rel, right / rel
        sl, sr = pl.stat(), pr.stat()
        if (sl.st_dev, sl.st_ino) == (sr.st_dev, sr.st_ino):
            continue
        if rel.endswith(".json"):
            jl, jr = _load_json(pl), _load_json(pr)
            if jl is not _MISSING and jr is not _MISSING:
                leaves: list[tuple[str, Any, Any]] = []
                _json_diff(jl, jr, [], leaves)
                diffs.extend(FolderDifference(rel, field, a, b) for field, a, b in leaves)
                continue
        hl, hr = sha256_file(pl), sha256_file(pr)
        if hl != hr:
            diffs.append(FolderDifference(rel, None, f"sha256:{hl[:12]}", f"sha256:{hr[:12]}"))
    return diffs


def _within(field: str | None, declared: str) -> bool:
    return field is not None and (field == declared or field.startswith(declared + "."))


def assert_only_field_differs(left: Path, right: Path, *, file: str, field: str) -> list[FolderDifference]:
    """Diff all files; return the differences, which must exist and all lie at `file`:`field`.

    A difference below the declared field (``rope_scaling.factor`` when ``rope_scaling`` was
    flipped) counts as that field; anything else raises ExperimentError listing it.
    """
    diffs = diff_folders(left, right)
    stray = [d for d in diffs if not (d.file == file and _within(d.field, field))]
    if stray:
        listing = "\n  ".join(d.describe() for d in stray)
        raise ExperimentError(
            f"{left} and {right} differ beyond {file}:{field}:\n  {listing}"
        )
    if not diffs:
        raise ExperimentError(f"{left} and {right} do not differ at all; {file}:{field} was not flipped")
    return diffs


def safe_label(value: Any) -> str:
    """A folder-name-safe label for an arm value (``10000``, ``null``, ``true``, ``{...}`` hashed)."""
    text = json.dumps(value, sort_keys=True)
    if len(text) > 40 or not re.fullmatch(r"[-\w.+\"]+", text):
        return "v" + sha256_bytes(text)[:10]
    return text.strip('"')
