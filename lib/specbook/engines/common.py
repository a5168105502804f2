"""Helpers every adapter so far shares: a loopback ServerSpec, a field of a server's JSON document, the
speculation aspects of a set-up, a start-up facts parser over a log file."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.engines.base import EngineConfig, SetupFact

if TYPE_CHECKING:
    from specbook.engines.base import Engine
    from specbook.serve.server import ServerSpec

LOOPBACK = "127.0.0.1"  # every server specbook launches listens on this machine only


def loopback_spec(engine: Engine, cfg: EngineConfig, *, name: str, log_path: Path, port: int, argv: list[str],
                  env: dict[str, str], unset_env: list[str] | None = None) -> ServerSpec:
    """The ServerSpec every adapter builds: its argv and env, served on loopback, ready by its paths
    (the adapter's `health_path` / `models_path`, the OpenAI-compatible ones where it names none)."""
    from specbook.serve.server import ServerSpec

    return ServerSpec(
        name=name, argv=argv, env=env, unset_env=unset_env or [], host=LOOPBACK, port=port,
        health_path=getattr(engine, "health_path", "/health"), models_path=getattr(engine, "models_path", "/v1/models"),
        ready_timeout_s=cfg.ready_timeout_s,
        log_path=log_path, model_name=cfg.client_model_name(),
    )


def server_json_field(base_url: str, path: str, field: str) -> str:
    """A field of a JSON document the server serves (GET base_url/path), or why it could not be read."""
    import httpx

    try:
        resp = httpx.get(f"{base_url.rstrip('/')}{path}", timeout=5.0, trust_env=False)
        resp.raise_for_status()
        return str(resp.json().get(field))
    except (httpx.HTTPError, ValueError) as exc:
        return f"unavailable ({type(exc).__name__})"


def speculation_facts(spec: Mapping[str, Any] | None, *, ngram_lookup: str, draft_detail: str,
                      k_detail: str) -> dict[str, SetupFact]:
    """The speculation aspects of a speculative_config, with the engine's own wording (`ngram_lookup` follows
    "ngram ": how its n-grams are matched)."""
    if not spec:
        return {"speculation": SetupFact("off")}
    method = spec.get("method") or ("draft_model" if spec.get("model") else "?")
    k = str(spec.get("num_speculative_tokens", "?"))
    if method == "ngram":
        what = SetupFact(f"ngram {ngram_lookup}", "draft from the request's own tokens")
    elif method == "draft_model":
        what = SetupFact(f"draft model {Path(str(spec.get('model'))).name}", draft_detail)
    else:
        what = SetupFact(str(method))
    return {"speculation": what, "draft tokens per step": SetupFact(k, k_detail)}


def stored_log(path: str | Path) -> Path | None:
    """The log at `path`, or its gzipped copy `path`.gz (committed report folders keep long logs gzipped so the
    tree stays small); None when neither exists."""
    path = Path(path)
    gz = path.with_name(path.name + ".gz")
    return path if path.is_file() else gz if gz.is_file() else None


def facts_of_log(path: str | Path, parse: Callable[[Iterable[str]], dict[str, Any]]) -> dict[str, Any]:
    """What a start-up facts parser reads from a log file (or its .gz copy: stored_log); {} when it does not
    exist (a server that never started)."""
    import gzip

    found = stored_log(path)
    if found is None:
        return {}
    opener = gzip.open if found.suffix == ".gz" else open
    with opener(found, "rt", encoding="utf-8", errors="replace") as fh:
        return parse(fh)
