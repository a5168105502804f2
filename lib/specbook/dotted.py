"""Dotted paths into nested dicts and lists (`rope_scaling.factor`, `knobs.0.env.X`): the one implementation.

Callers choose how strict a write is (create missing mappings? append to a list?) and wrap the
DottedPathError into their own error type, which names the params field or the file.
"""

from __future__ import annotations

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


def _index(node: list[Any], part: str, *, allow_append: bool) -> int:
    if not part.lstrip("-").isdigit():
        raise DottedPathError(f"{part!r} is not an index of a list")
    i = int(part)
    top = len(node) if allow_append else len(node) - 1
    if not -len(node) <= i <= top:
        raise DottedPathError(f"index {i} is out of range (the list has {len(node)} items)")
    return i


def get(doc: Any, dotted: str | list[str]) -> Any:
    """The value at the path, or MISSING."""
    cur = doc
    for part in split(dotted) if isinstance(dotted, str) else dotted:
        if isinstance(cur, dict) and str(part) in cur:
            cur = cur[str(part)]
        elif isinstance(cur, list) and str(part).isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return MISSING
    return cur


def set_path(doc: Any, dotted: str | list[str], value: Any, *, create: bool = True,
             append: bool = False) -> Any:
    """Set the path to `value` in place; returns the old value (MISSING when there was none).

    create: missing mappings (and a missing last key) are made; else DottedPathError.
    append: a list index equal to its length appends (a list extended from the command line);
    list items are never invented otherwise.
    """
    parts = split(dotted) if isinstance(dotted, str) else [str(p) for p in dotted]
    node = doc
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = join(parts[: depth + 1])
        try:
            if isinstance(node, list):
                i = _index(node, part, allow_append=append)
                if i == len(node):
                    node.append(None if last else {})
                if last:
                    old, node[i] = node[i], value
                    return old
                if node[i] is None and create:
                    node[i] = {}
                node = node[i]
            elif isinstance(node, dict):
                if part not in node and not create:
                    raise DottedPathError(f"{where!r} does not exist")
                if last:
                    old = node.get(part, MISSING)
                    node[part] = value
                    return old
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
            else:
                raise DottedPathError(f"{join(parts[:depth]) or '<root>'} is a {type(node).__name__}, "
                                      f"cannot hold {part!r}")
        except DottedPathError as exc:
            exc.where = exc.where or where
            raise
    raise AssertionError("unreachable")
