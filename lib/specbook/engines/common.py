"""Helpers every adapter so far shares: a loopback ServerSpec, a field of a server's JSON document, the
speculation aspects of a set-up, a start-up facts parser over a log file, seconds per start-up part, one pass
over a log for `specbook ingest` (its Env line, its line counts, the lines holding a marker), and the cost-split
capability of an engine that runs specbook's step timer (specbook.engines.steptimer) in its own processes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.envline import ENV_PREFIX, parse_env_line
from specbook.core.errors import EngineError, IngestError
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
                      k_detail: str, ngram_source: str = "the request's own tokens") -> dict[str, SetupFact]:
    """The speculation aspects of a speculative_config, with the engine's own wording (`ngram_lookup` follows
    "ngram ": how its n-grams are matched; `ngram_source`: which tokens they are drafted from, ending in
    base.EARLIER_REQUESTS where the drafter remembers other requests)."""
    if not spec:
        return {"speculation": SetupFact("off")}
    method = spec.get("method") or ("draft_model" if spec.get("model") else "?")
    k = str(spec.get("num_speculative_tokens", "?"))
    if method == "ngram":
        what = SetupFact(f"ngram {ngram_lookup}", f"draft from {ngram_source}")
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


def start_parts(order: Sequence[str], ends: Mapping[str, float]) -> dict[str, float]:
    """Seconds per start-up part (`order`: the parts in the order they end) from the seconds since the log's start
    at which the line ending each was written; a part whose line is missing merges into the next one."""
    parts, previous = {}, 0.0
    for name in order:
        if name in ends:
            parts[name] = round(max(ends[name] - previous, 0.0), 3)
            previous = max(previous, ends[name])
    return parts


class LogScan:
    """One pass over a server log, line by line (split on "\\n"): `marked(marker)` yields the lines holding the
    marker, decoded; meanwhile the first `Env:` line is read (`env`) and lines are counted. The reader counts a
    marked line it cannot read in `broken` itself; `unknown(records)` is what is left."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.env: dict[str, str] | None = None
        self.total = self.env_lines = self.broken = 0

    def marked(self, marker: str) -> Iterator[str]:
        wanted, env_prefix = marker.encode(), ENV_PREFIX.encode()
        try:
            with self.path.open("rb") as handle:
                for raw in handle:
                    self.total += 1
                    if raw.startswith(env_prefix):
                        try:
                            parsed = parse_env_line(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
                        except ValueError:
                            self.broken += 1
                            continue
                        self.env_lines += 1
                        if self.env is None:
                            self.env = parsed or {}
                    elif wanted in raw:
                        yield raw.decode("utf-8", errors="replace")
        except OSError as exc:
            raise IngestError(f"cannot read log file {self.path}: {exc.strerror or exc}") from exc

    def unknown(self, records: int) -> int:
        """Lines that are neither the Env line, a record, nor broken."""
        return self.total - records - self.env_lines - self.broken


class SwitchedStepTimer:
    """The cost-split capability (specbook.engines.base.StepProfiler) of an engine that runs specbook's step timer:
    installed at launch through $SPECBOOK_STEP_TIMING_DIR, measuring only while the folder's switch file exists
    (so one server serves its timed pass untimed and its profiled window timed). `split` is the engine's."""

    profiles_whole_server = False
    flush_wait_s = 0.0  # `split` waits for the engine's writer itself

    def profiled_config(self, cfg: EngineConfig, trace_dir: Path) -> EngineConfig:
        """`cfg` with the step timer installed in the engine's processes (off until its switch is made)."""
        from specbook.engines.steptimer import STEP_TIMING_DIR_ENV

        if STEP_TIMING_DIR_ENV in cfg.env:
            raise EngineError(f"profiled pass: the engine config already sets {STEP_TIMING_DIR_ENV} in env")
        return cfg.model_copy(update={"env": {**cfg.env, STEP_TIMING_DIR_ENV: str(Path(trace_dir).resolve())}})

    def recording(self, trace_dir: Path) -> Any:
        """The step timer on for the block (its switch file made, then removed whatever happens)."""
        from specbook.engines.steptimer import recording

        return recording(trace_dir)
