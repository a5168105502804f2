"""The `Env:` line specbook's launcher writes first into every server log: what the server was started with.

Attribution reads a server's real settings from it, whatever engine wrote the rest of the log.
"""

from __future__ import annotations

import shlex
from pathlib import Path

ENV_PREFIX = "Env:"


def format_env_line(env: dict[str, str]) -> str:
    """`Env: K=V K2='v w'` (sorted keys, shell-quoted values); parse_env_line reads it back exactly.

    A newline inside a value would split the line, so it is written as a literal backslash-n.
    """
    parts = []
    for key in sorted(env):
        if "=" in key or shlex.quote(key) != key:  # empty, or characters the shell would read otherwise
            raise ValueError(f"env key {key!r} cannot be written on an Env line")
        value = str(env[key]).replace("\r", "\\r").replace("\n", "\\n")
        parts.append(f"{key}={shlex.quote(value)}")
    return " ".join([ENV_PREFIX, *parts])


def parse_env_line(line: str) -> dict[str, str] | None:
    """The env of an `Env:` line, None when the line is not one; ValueError when it is malformed."""
    text = line.strip()
    if not text.startswith(ENV_PREFIX):
        return None
    env: dict[str, str] = {}
    for token in shlex.split(text[len(ENV_PREFIX) :]):
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ValueError(f"Env line token {token!r} is not KEY=VALUE")
        env[key] = value
    return env




def read_env_line(path: str | Path, max_lines: int = 50) -> dict[str, str] | None:
    """The env of the first `Env:` line among a log's first lines (the launcher writes it first); None if none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for _, line in zip(range(max_lines), fh, strict=False):
                if line.startswith(ENV_PREFIX):
                    try:
                        return parse_env_line(line)
                    except ValueError:
                        return None
    except OSError:
        return None
    return None
