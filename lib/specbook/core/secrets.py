"""What a secret looks like, and how it is hidden in everything a run writes: the one place that knows.

A *name* is split into word parts at every non-alphanumeric character and at camelCase humps (``HF_TOKEN``,
``openai-api-key``, ``apiKey``, ``engine.env.DB_PWD``). It is secret when

- its last part ends with TOKEN, KEY, PWD or AUTH, or is PASS (``HF_TOKEN``, ``APIKEY``, ``MYSQL_PWD``,
  ``OAUTH``, ``DB_PASS``): the last part, because ``--long-prefill-token-threshold``,
  ``--return-tokens-as-token-ids`` or ``SSH_AUTH_SOCK`` name counts and paths, not secrets;
- or any part contains PASSWORD, PASSWD, PASSPHRASE, SECRET, CREDENTIAL or AUTHORIZATION (``PGPASSWORD``,
  ``AWS_SECRET_ACCESS_KEY``, ``CLIENTSECRET``).

So ``MAX_TOKENS``, ``--tokenizer``, ``VLLM_CPU_KVCACHE_SPACE``, ``--ssl-keyfile``, ``GIT_AUTHOR_NAME`` and
``BYPASS`` are not secret, and neither are the shell's ``PWD`` and ``OLDPWD`` (directories) nor the book's own
``SPECBOOK_RUN_TOKEN``.

What is hidden (replaced by ``***``):

- the value of a secret name: env vars, mapping keys (params, JSON documents; every leaf below such a key),
  ``--name VALUE`` (every value up to the next ``--option``: vLLM's ``--api-key K1 K2``) and ``--name=VALUE``
  options, ``NAME=VALUE`` words and ``a.b.NAME=VALUE`` overrides;
- the password of ``scheme://user:pass@host`` anywhere in a string (the user is kept);
- inside JSON-valued options and values (``--speculative-config '{...}'``), the same rules.

These rules are deterministic per entry, so redacting a whole env and redacting one knob's env give the same
value for that knob: attribution compares redacted launches with redacted expectations. Free text (a server's
log, the executed notebook, a command line) is scrubbed by a `Scrubber` of the secret values the structured
redaction found: each verbatim occurrence of one of at least `MIN_SCRUB_CHARS` characters becomes ``***``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

__all__ = [
    "MIN_SCRUB_CHARS",
    "REDACTED",
    "Scrubber",
    "env_secret_values",
    "is_secret_name",
    "redact_argv",
    "redact_data",
    "redact_env",
    "redact_option_value",
    "redact_override",
    "redact_text",
]

REDACTED = "***"
# A secret value shorter than this is hidden where its name or URL shows it, but not searched for in free
# text: replacing every "1234" or "vllm" of a report would wreck it.
MIN_SCRUB_CHARS = 6

_WORD_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_LAST_ENDS_WITH = ("token", "key", "pwd", "auth")
_LAST_IS = ("pass",)
_CONTAINS = ("password", "passwd", "passphrase", "secret", "credential", "authorization")
# the shell's working directories, and the book's own variables: the run token is an id that finds a run's
# processes, not a credential (taken for one, it sent every server's output through the scrubbing pipe)
RUN_TOKEN_ENV = "SPECBOOK_RUN_TOKEN"
_NOT_SECRET = frozenset({"PWD", "OLDPWD", RUN_TOKEN_ENV})
# scheme://user:password@ ; the password runs to the last '@' before the end of the authority
_URL_CREDS = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:\"'<>\\]*:)(?P<pw>[^\s/?#\"'<>\\]+)@")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*=")


def _word_parts(name: str) -> list[str]:
    return [p.lower() for chunk in re.split(r"[^A-Za-z0-9]+", name) for p in _WORD_PARTS.findall(chunk)]


def is_secret_name(name: str) -> bool:
    """True when a variable, option, field or override name says its value is a secret (rules above)."""
    if not isinstance(name, str) or name.strip().lstrip("-") in _NOT_SECRET:
        return False
    parts = _word_parts(name)
    if not parts:
        return False
    if parts[-1].endswith(_LAST_ENDS_WITH) or parts[-1] in _LAST_IS:
        return True
    return any(word in part for part in parts for word in _CONTAINS)


def _note(found: set[str] | None, value: Any) -> None:
    if found is not None and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        text = str(value)
        if text and text != REDACTED:
            found.add(text)
            if "%" in text:
                found.add(unquote(text))


def redact_text(text: str, found: set[str] | None = None) -> str:
    """`text` with the password of every ``scheme://user:pass@`` replaced by ***."""
    if "://" not in text:
        return text

    def hide(m: re.Match[str]) -> str:
        _note(found, m.group("pw"))
        return f"{m.group('head')}{REDACTED}@"

    return _URL_CREDS.sub(hide, text)


def _hide_all(value: Any, found: set[str] | None) -> Any:
    """Every leaf below a secret name: strings and numbers become ***; None and booleans say nothing."""
    if isinstance(value, Mapping):
        return {k: _hide_all(v, found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_hide_all(v, found) for v in value]
    if value is None or isinstance(value, bool):
        return value
    _note(found, value)
    return REDACTED


def redact_data(obj: Any, found: set[str] | None = None) -> Any:
    """A copy of a JSON-like structure (params, documents) with every secret hidden (rules above).

    A list of strings, or of scalars with an option among them, is read as an argv (``extra_args: [--api-key,
    K]``)."""
    if isinstance(obj, Mapping):
        return {
            k: (_hide_all(v, found) if isinstance(k, str) and is_secret_name(k) else redact_data(v, found))
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        if _argv_like(obj):  # scalars with an option among them: an argv (numbers keep their type)
            shown = redact_argv(obj, found)
            return [x if str(x) == y else y for x, y in zip(obj, shown, strict=True)]
        return [redact_data(x, found) for x in obj]
    if isinstance(obj, str):
        return redact_option_value(obj, found)
    return obj


def _argv_like(items: Sequence[Any]) -> bool:
    scalars = all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in items)
    return bool(items) and scalars and (all(isinstance(x, str) for x in items)
                                        or any(isinstance(x, str) and x.startswith("-") for x in items))


def redact_option_value(value: str, found: set[str] | None = None) -> str:
    """One value that is not under a secret name: URL passwords hidden, JSON objects/arrays redacted inside
    (re-serialized, keys sorted, only when something was hidden)."""
    text = redact_text(str(value), found)
    if text.strip()[:1] in ("{", "["):
        try:
            parsed = json.loads(text)
        except ValueError:
            return text
        hidden = redact_data(parsed, found)
        if hidden != parsed:
            return json.dumps(hidden, sort_keys=True)
    return text


def redact_env(env: Mapping[str, Any], found: set[str] | None = None) -> dict[str, str]:
    """Copy of `env` (values as strings) with secret names' values replaced by *** and URL passwords hidden."""
    out: dict[str, str] = {}
    for key, value in env.items():
        key = str(key)
        if is_secret_name(key):
            _note(found, str(value))
            out[key] = REDACTED
        else:
            out[key] = redact_option_value(str(value), found)
    return out


def _is_long_option(token: str) -> bool:
    # the rule of specbook.experiments.attribution.parse_argv_options: what ends an option's values
    return token.startswith("--") and len(token) > 2


def redact_argv(argv: Sequence[Any], found: set[str] | None = None) -> list[str]:
    """Copy of an argv with secret options' values, ``NAME=VALUE`` secrets and URL passwords hidden.

    ``--api-key K`` hides every value up to the next long option (``--api-key K1 K2``), ``--api-key=K`` its
    value; a secret option with no value (``--hf-token`` followed by an option, or last) stays as it is.
    """
    out: list[str] = []
    hiding = False
    for raw in argv:
        token = str(raw)
        if hiding and not _is_long_option(token):
            _note(found, token)
            out.append(REDACTED)
            continue
        hiding = False
        if token.startswith("-") and len(token) > 1:
            name, eq, value = token.partition("=")
            if is_secret_name(name.lstrip("-")):
                if eq:
                    _note(found, value)
                    out.append(f"{name}={REDACTED}")
                else:
                    out.append(token)
                    hiding = True
            else:
                out.append(f"{name}={redact_option_value(value, found)}" if eq else redact_text(token, found))
        elif _ASSIGNMENT.match(token):
            out.append(redact_override(token, found))
        else:
            out.append(redact_option_value(token, found))
    return out


def redact_override(override: str, found: set[str] | None = None) -> str:
    """A ``-p dotted.key=value`` override (or an ``ENV=value`` word) with its secret hidden: the whole value
    when a part of the key is secret, else the secrets inside the value (a YAML list or mapping is redacted as
    data and written back in YAML flow style)."""
    key, eq, raw = str(override).partition("=")
    if not eq:
        return redact_text(key, found)
    if is_secret_name(key):
        _note(found, raw)
        return f"{key}={REDACTED}"
    import yaml

    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = None
    if isinstance(value, (list, dict)):
        hidden = redact_data(value, found)
        if hidden != value:
            flow = yaml.safe_dump(hidden, default_flow_style=True, width=1 << 30, allow_unicode=True)
            return f"{key}={flow.strip().removesuffix('...').strip()}"
    return f"{key}={redact_option_value(raw, found)}"


def env_secret_values(environ: Mapping[str, str]) -> set[str]:
    """The values of an environment's secret-named variables (what a run must never write verbatim)."""
    found: set[str] = set()
    redact_env(environ, found)
    return found


class Scrubber:
    """Hides known secret values wherever they appear verbatim in free text, and URL passwords.

    Values shorter than `MIN_SCRUB_CHARS` are not searched for (they are hidden only where their name or URL
    shows them). A scrubber without values still hides URL passwords.
    """

    def __init__(self, values: Iterable[str] = ()):
        keep = {str(v) for v in values if v is not None and len(str(v).strip()) >= MIN_SCRUB_CHARS}
        self.values: tuple[str, ...] = tuple(sorted(keep - {REDACTED}, key=len, reverse=True))

    def __bool__(self) -> bool:
        return bool(self.values)

    def __call__(self, text: str) -> str:
        text = redact_text(text)
        for value in self.values:
            if value in text:
                text = text.replace(value, REDACTED)
        return text

    def data(self, obj: Any) -> Any:
        """Every string of a JSON-like structure scrubbed (keys included)."""
        if isinstance(obj, str):
            return self(obj)
        if isinstance(obj, Mapping):
            return {(self(k) if isinstance(k, str) else k): self.data(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.data(v) for v in obj]
        return obj
