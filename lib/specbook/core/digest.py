"""sha256 digests: of a file (streamed, any size) and of bytes or text. The one place specbook hashes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_CHUNK = 1 << 22


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes, read in chunks (model weights are gigabytes); OSError if unreadable."""
    h = hashlib.sha256()
    with open(Path(path), "rb") as fh:
        while block := fh.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def sha256_file_or_none(path: str | os.PathLike[str]) -> str | None:
    """sha256_file, or None when the file cannot be read (a manifest records what it can)."""
    try:
        return sha256_file(path)
    except OSError:
        return None


def sha256_bytes(data: bytes | str) -> str:
    """Hex sha256 of bytes (text is encoded as UTF-8)."""
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()
