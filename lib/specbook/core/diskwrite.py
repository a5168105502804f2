"""Writing a run's files so that a full disk costs nothing already written: the one place that knows how.

A whole file (frame, JSON, manifest, html) is written to `NAME.tmp` beside it and renamed over it, so the old
file stays whole until the new one is; a line (servers.jsonl) is appended with one `os.write` and cut back
when it could not be written whole. A disk that is full (ENOSPC), a file over the size limit (EFBIG) or a
quota (EDQUOT) raises `DiskFullError` naming the file, and no temporary file is left behind.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from specbook.core.errors import DiskFullError

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
# pyarrow's OSError carries no errno, only its text ("... [errno 28] No space left on device")
_DISK_FULL_TEXT = ("no space left on device", "file too large", "disk quota exceeded", "[errno 28]", "[errno 27]")


def is_disk_full(exc: BaseException) -> bool:
    if not isinstance(exc, OSError):
        return False
    return exc.errno in DISK_FULL_ERRNOS or any(t in str(exc).lower() for t in _DISK_FULL_TEXT)


def disk_full_error(path: str | os.PathLike[str], exc: BaseException) -> DiskFullError:
    reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc)
    return DiskFullError(f"{path}: disk full while writing it ({reason}); the files written before it are intact "
                         "and no partial file was left: free space (or raise the limit) and resume the run")


def tmp_path_for(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def write_atomic(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Call `write(tmp)` and rename tmp over `path`; on any failure remove tmp (a full disk: `DiskFullError`)."""
    path = Path(path)
    tmp = tmp_path_for(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full_error(path, exc) from exc
        raise
    return path


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append `line` and a newline in one `os.write` (a runner killed mid-append cannot interleave two records).

    A file that ends without a newline (a line torn by a kill) gets one first, so the torn piece stays a line
    of its own that a reader can skip and report. A write that could not be made whole is cut back off."""
    path = Path(path)
    data = line.rstrip("\n").encode("utf-8") + b"\n"
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        try:
            written = os.write(fd, data)
            if written != len(data):  # a short write to a regular file: no room for the rest
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        except OSError as exc:
            os.ftruncate(fd, size)
            if is_disk_full(exc):
                raise disk_full_error(path, exc) from exc
            raise
    finally:
        os.close(fd)
