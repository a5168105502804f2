"""Which arm did a run really belong to? Decided from what its server ACTUALLY ran with.

The params file says what a run was meant to be; the `Env:` line in the server log and the argv
recorded at launch say what it was. Only knob-relevant env keys and args are compared (other env
such as ports or paths differs between every run), and JSON-valued args (--speculative-config) are
compared as parsed JSON, so key order and spacing do not matter.

Recorded launches have their secrets hidden (specbook.core.secrets), so both sides are compared redacted: a knob
whose value is a secret matches as ***, whatever the secret was.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator

from specbook.core import secrets
from specbook.core.errors import AttributionError

_SHORT_OPTION = re.compile(r"-[A-Za-z][A-Za-z0-9-]*")
FLAG_SET = True  # value recorded for a flag given without a value (e.g. --enforce-eager)


def normalize_flag(flag: str) -> str:
    """--max_num_seqs and --max-num-seqs are the same flag to vLLM's argument parser; a short option (`-b`,
    llama-server's) stays as it is."""
    if _SHORT_OPTION.fullmatch(flag):
        return flag
    if not flag.startswith("--"):
        raise AttributionError(f"knob arg {flag!r} must be an option starting with '--' (or a short '-x')")
    return "--" + flag[2:].replace("_", "-")



def _is_option(tok: str) -> bool:
    return bool(_SHORT_OPTION.fullmatch(tok)) or (tok.startswith("--") and len(tok) > 2)


def parse_argv_options(argv: Sequence[str]) -> dict[str, Any]:
    """Options of an argv as {flag: value}; `--k v`, `--k=v` and short `-k v` (llama-server's `-md`, `-b`, `-t`)
    all work, a flag without a value maps to True, and the last occurrence wins (as with argparse).
    """
    out: dict[str, Any] = {}
    i = 0
    argv = list(argv)
    while i < len(argv):
        tok = argv[i]
        if _SHORT_OPTION.fullmatch(tok):
            if i + 1 < len(argv) and not _is_option(argv[i + 1]):
                out[tok] = argv[i + 1]
                i += 1
            else:
                out[tok] = FLAG_SET
        elif tok.startswith("--") and len(tok) > 2:
            if "=" in tok:
                k, v = tok.split("=", 1)
                out[normalize_flag(k)] = v
            elif i + 1 < len(argv) and not (argv[i + 1].startswith("--") and len(argv[i + 1]) > 2):
                out[normalize_flag(tok)] = argv[i + 1]
                i += 1
            else:
                out[normalize_flag(tok)] = FLAG_SET
        i += 1
    return out


def _model_ref(value: Any) -> Any:
    """A prepared embedded model's folder stands for the model's name, whichever cache it was prepared in:
    a run recorded on another host (or with another SPECBOOK_CACHE) still attributes to its arm."""
    from specbook.models.catalog import EMBEDDED_MODELS

    if isinstance(value, dict):
        return {k: _model_ref(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_model_ref(v) for v in value]
    if isinstance(value, str) and "/" in value and PurePath(value).name in EMBEDDED_MODELS:
        return PurePath(value).name
    return value


def _canonical(value: Any) -> Any:
    """A comparable form: JSON objects/arrays parsed (key order irrelevant), embedded models' folders as
    their names, everything else a string."""
    if value is None or value is FLAG_SET:
        return value
    if isinstance(value, (dict, list)):
        return _model_ref(json.loads(json.dumps(value, sort_keys=True)))
    s = str(value).strip()
    if s[:1] in "{[":
        try:
            return _model_ref(json.loads(s))
        except json.JSONDecodeError:
            return s
    return _model_ref(s)


def _show(value: Any) -> str:
    if value is None:
        return "<unset>"
    if value is FLAG_SET:
        return "<flag>"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


class ArmSignature(BaseModel):
    """The knob settings that identify an arm: env vars and server args (absent = unset)."""

    model_config = ConfigDict(extra="forbid")

    env: dict[str, str] = Field(default_factory=dict)
    args: dict[str, Any] = Field(
        default_factory=dict, description="{--flag: value}; also accepts an argv list"
    )

    @field_validator("args", mode="before")
    @classmethod
    def _args_from_list(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return parse_argv_options(list(v))
        if isinstance(v, dict):
            return {normalize_flag(k): val for k, val in v.items()}
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: (str(x).lower() if isinstance(x, bool) else str(x)) for k, x in v.items()}
        return v

    @classmethod
    def from_launch(
        cls,
        env: Mapping[str, str],
        argv: Sequence[str],
        knob_env_keys: Iterable[str],
        knob_arg_keys: Iterable[str],
    ) -> ArmSignature:
        """The knob-relevant part of a launch (e.g. a ServerSpec built for an arm): what to expect."""
        opts = parse_argv_options(argv)
        return cls(
            env={k: env[k] for k in knob_env_keys if k in env},
            args={
                normalize_flag(k): opts[normalize_flag(k)] for k in knob_arg_keys if normalize_flag(k) in opts
            },
        )


def knob_keys(knobs: Iterable[Any]) -> tuple[list[str], list[str]]:
    """(env keys, arg flags) that some knob touches, from specbook.experiments.arms.KnobSpec-like objects.

    A knob's `set` path's first part names an engine-config field; its flag is `--` + the field with
    dashes (dtype -> --dtype, speculative_config.model -> --speculative-config), as vLLM names them.
    """
    env_keys: set[str] = set()
    arg_keys: set[str] = set()
    for knob in knobs:
        env_keys.update(getattr(knob, "env", {}) or {})
        arg_keys.update(parse_argv_options(list(getattr(knob, "args", []) or [])))
        for dotted in getattr(knob, "set", {}) or {}:
            arg_keys.add("--" + dotted.split(".", 1)[0].replace("_", "-"))
    return sorted(env_keys), sorted(arg_keys)


@dataclass(frozen=True)
class Attribution:
    arm: str | None  # None: unattributable (no arm, or several, match what really ran)
    declared: str | None
    matches_declared: bool
    reason: str
    observed: dict[str, str]  # knob -> value as really launched, for the table

    @property
    def attributable(self) -> bool:
        return self.arm is not None

    def require(self) -> str:
        """The arm, or AttributionError with the reason (for callers that cannot go on without one)."""
        if self.arm is None:
            raise AttributionError(self.reason)
        return self.arm


def _redacted_env(env: Mapping[str, str], keys: list[str]) -> dict[str, str]:
    return secrets.redact_env({k: env[k] for k in keys if k in env})


def _redacted_option(flag: str, value: Any) -> Any:
    """An option's value as a recorded (redacted) argv shows it: the same rules as secrets.redact_argv."""
    if value is None or value is FLAG_SET:
        return value
    if secrets.is_secret_name(flag.lstrip("-")):
        return secrets.REDACTED
    if isinstance(value, (dict, list)):
        return secrets.redact_data(value)
    return secrets.redact_option_value(str(value))


def _observed(
    env: Mapping[str, str], argv: Sequence[str], env_keys: list[str], arg_keys: list[str]
) -> dict[str, Any]:
    opts = parse_argv_options(argv)
    env = _redacted_env(env, env_keys)
    out: dict[str, Any] = {f"env:{k}": env.get(k) for k in env_keys}
    out.update({f"arg:{k}": _redacted_option(k, opts.get(k)) for k in arg_keys})
    return out


def _expected(sig: ArmSignature, env_keys: list[str], arg_keys: list[str]) -> dict[str, Any]:
    env = _redacted_env(sig.env, env_keys)
    out: dict[str, Any] = {f"env:{k}": env.get(k) for k in env_keys}
    out.update({f"arg:{k}": _redacted_option(k, sig.args.get(k)) for k in arg_keys})
    return out


def _mismatches(observed: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    return [
        f"{k[4:]}={_show(observed[k])} (arm wants {_show(expected[k])})"
        for k in expected
        if _canonical(observed[k]) != _canonical(expected[k])
    ]


def attribute(
    launched_env: Mapping[str, str],
    launched_argv: Sequence[str],
    arms: Mapping[str, ArmSignature],
    knob_env_keys: Iterable[str] | None = None,
    knob_arg_keys: Iterable[str] | None = None,
    *,
    declared: str | None = None,
) -> Attribution:
    """The arm whose knob settings equal what the server really ran with (env from its `Env:` line,
    argv as launched). Knob keys default to every key any arm mentions. A run that matches no arm,
    or several, is unattributable (arm None) and the reason names the values that decided it.
    """
    if not arms:
        raise AttributionError("no arms to attribute to")
    if declared is not None and declared not in arms:
        raise AttributionError(f"declared arm {declared!r} is not one of the arms {list(arms)}")
    env_keys = sorted(
        set(knob_env_keys) if knob_env_keys is not None else {k for s in arms.values() for k in s.env}
    )
    arg_keys = sorted(
        {normalize_flag(k) for k in knob_arg_keys}
        if knob_arg_keys is not None
        else {k for s in arms.values() for k in s.args}
    )
    obs = _observed(launched_env, launched_argv, env_keys, arg_keys)
    observed_txt = {k: _show(v) for k, v in obs.items()}
    seen = ", ".join(f"{k[4:]}={_show(v)}" for k, v in obs.items()) or "no knob keys"
    misses = {name: _mismatches(obs, _expected(sig, env_keys, arg_keys)) for name, sig in arms.items()}
    matched = [name for name, m in misses.items() if not m]

    if len(matched) == 1:
        arm = matched[0]
        if declared is None or declared == arm:
            reason = f"ran with {seen}: arm {arm!r}"
        else:
            reason = (
                f"declared {declared!r} but ran with {seen}, which is arm {arm!r}; "
                f"differs from {declared!r} in " + "; ".join(misses[declared])
            )
        return Attribution(arm, declared, declared == arm, reason, observed_txt)
    if len(matched) > 1:
        reason = f"unattributable: ran with {seen}, which matches several arms {matched} (their knobs are identical)"
        return Attribution(None, declared, False, reason, observed_txt)
    nearest = min(misses, key=lambda n: len(misses[n]))
    reason = (
        f"unattributable: ran with {seen}, which matches no arm; nearest {nearest!r} differs in "
        + "; ".join(misses[nearest])
    )
    if declared is not None and declared != nearest:
        reason += f"; declared {declared!r} differs in " + "; ".join(misses[declared])
    return Attribution(None, declared, False, reason, observed_txt)


def _parse_env(env: Mapping[str, str] | str) -> dict[str, str]:
    if isinstance(env, str):
        from specbook.core.envline import parse_env_line

        try:
            parsed = parse_env_line(env)
        except ValueError as exc:
            raise AttributionError(f"malformed `Env:` line: {exc}") from exc
        if parsed is None:
            raise AttributionError(f"not an `Env:` line: {env[:120]!r}")
        return dict(parsed)
    return dict(env)


def _term_holds(term: str, env: Mapping[str, str]) -> bool:
    if term.startswith("!"):
        return term[1:] not in env
    if "=" in term:
        key, pattern = term.split("=", 1)
        return key in env and fnmatch.fnmatchcase(env[key], pattern)
    return term in env


def arm_from_env_line(env: Mapping[str, str] | str, mapping: Mapping[str, str]) -> Attribution:
    """Ingest mode: the arm of a log from its `Env:` line (a string or its parsed dict) and a params
    mapping {condition: arm}. A condition is space-separated terms that must all hold: `KEY=GLOB`
    (value matches the glob), `KEY` (set), `!KEY` (unset); `*` alone matches any run. The most
    specific matching condition (most terms) wins, so {"A=1": "A", "B=1": "B", "A=1 B=1": "A+B",
    "*": "baseline"} reads a crossed design. A tie between different arms is unattributable.
    """
    env_d = _parse_env(env)
    hits: list[tuple[int, str, str]] = []
    for cond, arm in mapping.items():
        terms = [t for t in shlex.split(cond) if t != "*"]
        if all(_term_holds(t, env_d) for t in terms):
            hits.append((len(terms), cond, arm))
    if not hits:
        return Attribution(
            None,
            None,
            False,
            f"unattributable: no mapping condition holds for env "
            f"{sorted(env_d)}; conditions: {list(mapping)}",
            {},
        )
    best = max(h[0] for h in hits)
    top = {(cond, arm) for n, cond, arm in hits if n == best}
    arms_top = {arm for _, arm in top}
    if len(arms_top) > 1:
        return Attribution(
            None,
            None,
            False,
            f"unattributable: conditions {sorted(c for c, _ in top)} all hold "
            f"and name different arms {sorted(arms_top)}",
            {},
        )
    arm = arms_top.pop()
    cond = sorted(c for c, _ in top)[0]
    return Attribution(arm, None, False, f"condition {cond!r} holds: arm {arm!r}", {})


def attribution_table(runs: Mapping[str, Attribution]) -> pd.DataFrame:
    """One row per run: declared arm, attributed arm, whether they match, the reason, observed knobs."""
    rows = []
    for run_id, a in runs.items():
        rows.append(
            {
                "run_id": run_id,
                "declared": a.declared,
                "arm": a.arm,
                "matches_declared": a.matches_declared,
                "reason": a.reason,
                **a.observed,
            }
        )
    return pd.DataFrame(rows)
