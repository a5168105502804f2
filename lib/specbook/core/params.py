"""Experiment params: YAML files validated by pydantic, with `-p key=value` overrides.

Every error names the file and the field (dotted path), so a typo in a 40-line YAML is found at
once and before any server starts.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from specbook.core import dotted as dotted_path
from specbook.core.digest import sha256_bytes
from specbook.core.errors import ParamsError

__all__ = [
    "ExperimentParams",
    "apply_overrides",
    "display_path",
    "dump_params",
    "load_params",
    "params_display_name",
    "params_hash",
    "parse_override",
    "validate_params",
]

P = TypeVar("P", bound=BaseModel)


class ExperimentParams(BaseModel):
    """Base of every experiment's params schema; unknown fields are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    description: str = ""

    def check_inputs(self) -> None:
        """Every input file the params name can be read (ParamsError naming the field and value): `specbook
        check` and the runner call this before any run folder exists. Here: each local input file of a
        workload (`path`, `test_path`, `train_path` anywhere below); an experiment adds its own."""
        for dotted, value in _input_paths(self, ""):
            readable_input(dotted, value)


INPUT_PATH_FIELDS = ("path", "test_path", "train_path")


def _input_paths(model: BaseModel, prefix: str) -> list[tuple[str, str]]:
    out = []
    for name in type(model).model_fields:
        value = getattr(model, name, None)
        dotted = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            out += _input_paths(value, dotted + ".")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    out += _input_paths(item, f"{dotted}.{i}.")
        elif name in INPUT_PATH_FIELDS and isinstance(value, str) and value:
            out.append((dotted, value))
    return out


def readable_input(field_name: str, value: str) -> Path:
    """An input path of the params (relative to the project root), checked readable; ParamsError naming the
    field, the value and the path looked at otherwise."""
    from specbook.core.paths import project_root

    path = Path(value).expanduser()
    path = path if path.is_absolute() else (project_root() / path).resolve()
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ParamsError(f"{field_name}: {value!r} cannot be read (looked at {path}): "
                          f"{exc.strerror or exc}") from None
    return path


def display_path(path: str | os.PathLike[str]) -> str:
    """The path as the user should read it: relative to cwd when it lies below it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _loc_to_dotted(loc: Iterable[Any]) -> str:
    return ".".join(str(part) for part in loc) or "<root>"


def _validation_message(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors(include_url=False):
        lines.append(f"{source}: {_loc_to_dotted(err['loc'])}: {err['msg']}")
    return "\n".join(lines)


def _read_yaml(path: Path) -> dict[str, Any]:
    shown = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ParamsError(f"{shown}: params file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"{shown}: cannot read params file: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = exc.problem or exc.context or "invalid YAML"
        raise ParamsError(f"{shown}: YAML syntax error at {where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{shown}: YAML syntax error: {exc}") from None
    except Exception as exc:  # a value PyYAML's constructors refuse (2001-02-30, !!int x) or nesting too deep
        raise ParamsError(f"{shown}: YAML value cannot be read: {type(exc).__name__}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParamsError(
            f"{shown}: the top level must be a mapping of field: value, got {type(data).__name__}"
        )
    return data


def parse_override(override: str) -> tuple[list[str], Any]:
    """Split "a.b.0.c=value" into (["a","b","0","c"], yaml.safe_load(value))."""
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ParamsError(f"override {override!r}: expected KEY=VALUE (e.g. arms.0.env.X=1)")
    parts = key.split(".")
    if any(not part for part in parts):
        raise ParamsError(f"override {override!r}: empty segment in key {key!r}")
    try:
        value = yaml.safe_load(raw)
    except Exception as exc:  # YAMLError, or a value PyYAML's constructors refuse (2001-02-30, !!int x)
        raise ParamsError(f"override {override!r}: value is not valid YAML: {exc}") from None
    return parts, value


def _set_path(data: dict[str, Any], parts: list[str], value: Any, override: str) -> None:
    # index == len appends, so a list can be extended from the command line
    try:
        dotted_path.set_path(data, parts, value, append=True, negative=True)
    except dotted_path.DottedPathError as exc:
        raise ParamsError(f"override {override!r}: {exc.where}: {exc}") from None


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of `data` with every "dotted.key=value" override applied in order."""
    out = copy.deepcopy(dict(data))
    for override in overrides:
        parts, value = parse_override(override)
        _set_path(out, parts, value, override)
    return out


def validate_params(model_cls: type[P], data: Mapping[str, Any], source: str = "<params>") -> P:
    """Validate a plain mapping; errors name `source` and each failing field."""
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        raise ParamsError(_validation_message(exc, source)) from None
    except Exception as exc:  # a schema's validator failed on a value it did not expect (a date, bytes, a set)
        raise ParamsError(f"{source}: a value the schema cannot check: {type(exc).__name__}: {exc}") from exc


def load_params(model_cls: type[P], path: str | os.PathLike[str], overrides: Iterable[str] = ()) -> P:
    """Read a params YAML, apply overrides, validate against `model_cls`."""
    path = Path(path)
    data = apply_overrides(_read_yaml(path), list(overrides))
    return validate_params(model_cls, data, display_path(path))


def canonical_json(params: BaseModel) -> str:
    return json.dumps(
        params.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def params_hash(params: BaseModel) -> str:
    """sha256 of the canonical JSON of the validated params (key order and YAML spelling do not matter)."""
    return sha256_bytes(canonical_json(params))


def dump_params(params: BaseModel, path: str | os.PathLike[str], *, redact: bool = True) -> Path:
    """Write the validated, resolved params as YAML, secrets hidden (specbook.core.secrets) unless `redact` is False.

    A run folder's params.yaml is always redacted; the runner hands a kernel that launches servers an
    unredacted copy outside the run folder when hiding changed anything.
    """
    from specbook.core.secrets import redact_data

    path = Path(path)
    data = params.model_dump(mode="json")
    text = yaml.safe_dump(redact_data(data) if redact else data, sort_keys=False, allow_unicode=True)
    from specbook.core.diskwrite import write_text_atomic

    return write_text_atomic(path, text)


def params_display_name(params: BaseModel, path: str | os.PathLike[str] | None = None) -> str:
    """The params' `name`, else the file stem: what run folders and run lists call them."""
    name = getattr(params, "name", None)
    if name:
        return str(name)
    return Path(path).stem if path else "params"
