"""specbook.core.digest: the one sha256 helper (files streamed in chunks, bytes and text)."""

from __future__ import annotations

import hashlib
import os

import pytest

from specbook.core import digest
from specbook.core.digest import sha256_bytes, sha256_file, sha256_file_or_none

EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_sha256_bytes_of_known_values():
    assert sha256_bytes(b"") == EMPTY
    assert sha256_bytes(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert sha256_bytes("abc") == sha256_bytes(b"abc")  # text is hashed as UTF-8
    assert sha256_bytes("é") == hashlib.sha256("é".encode()).hexdigest()


def test_sha256_file_matches_hashlib_across_chunk_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(digest, "_CHUNK", 1000)  # several chunks and a partial last one
    data = os.urandom(3500)
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest() == sha256_bytes(data)
    assert sha256_file(str(path)) == sha256_file(path)
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == EMPTY


def test_sha256_file_of_an_unreadable_path(tmp_path):
    with pytest.raises(OSError):
        sha256_file(tmp_path / "missing")
    assert sha256_file_or_none(tmp_path / "missing") is None
    assert sha256_file_or_none(tmp_path) is None  # a folder
    (tmp_path / "f").write_bytes(b"abc")
    assert sha256_file_or_none(tmp_path / "f") == sha256_bytes(b"abc")
