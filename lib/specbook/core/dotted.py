"""Dotted paths into nested dicts and lists (`rope_scaling.factor`, `knobs.0.env.X`): the one implementation.

Callers choose how strict a write is (create missing mappings? append to a list?) and wrap the
DottedPathError into their own error type, which names the params field or the file.
"""

from __future__ import annotations

import re
from typing import Any

MISSING = object()


class DottedPathError(ValueError):
    """A path that does not parse or cannot be followed; `where` is the prefix at which it failed."""

    def __init__(self, message: str, where: str = ""):
        super().__init__(message)
        self.where = where


def split(dotted: str) -> list[str]:
    """`"a.b.0"` -> `["a", "b", "0"]`; refuses empty segments."""
    if not dotted or any(seg == "" for seg in dotted.split(".")):
        raise DottedPathError(f"{dotted!r} is not a dotted path like 'rope_scaling.factor'")
    return dotted.split(".")


def join(parts: list[Any]) -> str:
    return ".".join(str(p) for p in parts)


def _parts(dotted: str | list[Any]) -> list[str]:
    parts = split(dotted) if isinstance(dotted, str) else [str(p) for p in dotted]
    if not parts or any(p == "" for p in parts):
        raise DottedPathError(f"{join(parts)!r} is not a dotted path like 'rope_scaling.factor'")
    return parts


def _index(node: list[Any], part: str, *, allow_append: bool, negative: bool) -> int:
    # ASCII digits only: str.isdigit() accepts '²', which int() refuses
    if not re.fullmatch(r"-?[0-9]+" if negative else r"[0-9]+", part):
        raise DottedPathError(f"{part!r} is not an index of a list")
    i = int(part)
    top = len(node) if allow_append else len(node) - 1
    if not -len(node) <= i <= top:
        raise DottedPathError(f"index {i} is out of range (the list has {len(node)} items)")
    return i


def get(doc: Any, dotted: str | list[str]) -> Any:
    """The value at the path, or MISSING. List indexes are counted from 0 (no negative ones)."""
    cur = doc
    for part in _parts(dotted):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and re.fullmatch(r"[0-9]+", part) and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return MISSING
    return cur


def set_path(doc: Any, dotted: str | list[str], value: Any, *, create: bool = True,
             append: bool = False, negative: bool = False) -> Any:
    """Set the path to `value` in place; returns the old value (MISSING when there was none).

    create: missing (or null) mappings and a missing last key are made; else DottedPathError.
    append: a list index equal to its length appends (a list extended from the command line);
    list items are never invented otherwise.
    negative: a negative list index counts from the end (`arms.-1`); else it is refused, as `get`
    refuses it, so a path that `get` calls missing is never set.
    """
    parts = _parts(dotted)
    node = doc
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = join(parts[: depth + 1])
        try:
            if isinstance(node, list):
                i = _index(node, part, allow_append=append, negative=negative)
                appended = i == len(node)
                if appended:
                    node.append(None if last else {})
                if last:
                    old, node[i] = node[i], value
                    return MISSING if appended else old
                if node[i] is None:
                    if not create:
                        raise DottedPathError(f"{where!r} does not exist (it is null)")
                    node[i] = {}
                node = node[i]
            elif isinstance(node, dict):
                if part not in node and not create:
                    raise DottedPathError(f"{where!r} does not exist")
                if last:
                    old = node.get(part, MISSING)
                    node[part] = value
                    return old
                if node.get(part) is None:  # missing or null: a mapping is made (only if create)
                    if not create:
                        raise DottedPathError(f"{where!r} does not exist (it is null)")
                    node[part] = {}
                node = node[part]
            else:
                raise DottedPathError(f"{join(parts[:depth]) or '<root>'} is a {type(node).__name__}, "
                                      f"cannot hold {part!r}")
        except DottedPathError as exc:
            exc.where = exc.where or where
            raise
    raise AssertionError("unreachable")
