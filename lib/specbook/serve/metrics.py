"""`/metrics` snapshots and label-filtered counter deltas, engine-neutral (each engine names its counters).

Counters are cumulative since the server started, so a measurement is always the difference of two
snapshots taken around it; a counter that went down means the server restarted in between.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from specbook.core.acceptance import Acceptance
from specbook.core.errors import MetricsError

# prometheus_client names a counter family without `_total` and its sample with it (plus a `_created`
# sample we never want); callers may use either spelling.
_COUNTER_SUFFIX = "_total"
_INTEGER_LABEL = re.compile(r"-?[0-9]{1,18}")  # a label value label_values sorts as a number (a position)


def _base_name(name: str) -> str:
    return name[: -len(_COUNTER_SUFFIX)] if name.endswith(_COUNTER_SUFFIX) else name


class _NotPlain(Exception):
    """The text has something the plain reader leaves to prometheus_client."""


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
# name, optional {label="value",...} without escapes, one space, a value; nothing else (no timestamp, no exemplar)
_PLAIN_SAMPLE = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*",?)*)\})? '
    r"([-+]?[0-9]{1,18}|[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+|NaN|[-+]?Inf)\Z")
_PLAIN_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
_ALLOWED = {"counter": ("",), "gauge": ("",), "summary": ("_count", "_sum", ""),
            "histogram": ("_count", "_sum", "_bucket")}


def _plain_families(text: str) -> list[Any]:
    """prometheus_client's text_fd_to_metric_families, the same families, samples and errors, for the plain layout
    a server writes (HELP / TYPE comments with plain names, samples without escapes, timestamps or exemplars); its
    per-character label reading cost more CPU than a window's client. Raises _NotPlain on anything else."""
    from prometheus_client.metrics_core import Metric
    from prometheus_client.samples import Sample as PromSample

    def build(name: str, doc: str, typ: str, samples: list[Any]) -> Any:
        if typ == "counter":
            if name.endswith("_total"):
                name = name[:-6]
            else:
                samples = [PromSample(s[0] + "_total", *s[1:]) for s in samples]
        metric = Metric(name, doc, typ)
        metric.samples = samples
        return metric

    out: list[Any] = []
    name, doc, typ = "", "", "untyped"
    samples: list[Any] = []
    allowed: tuple[str, ...] | list[str] = []
    for line in text.split("\n"):  # as prometheus_client reads lines: at "\n" only
        line = line.strip()
        if line.startswith("#"):
            parts = line.split(None, 3)
            if any('"' in p for p in parts[:3]) or "\t" in line:
                raise _NotPlain
            if len(parts) < 2:
                continue
            if parts[1] not in ("HELP", "TYPE"):
                if len(parts) > 2:
                    continue
                raise _NotPlain
            if len(parts) < 3 or not _NAME.match(parts[2]):
                raise _NotPlain
            candidate = parts[2]
            if parts[1] == "HELP":
                if candidate != name:
                    if name:
                        out.append(build(name, doc, typ, samples))
                    name, typ, samples, allowed = candidate, "untyped", [], [candidate]
                doc = parts[3] if len(parts) == 4 else ""
                if "\\" in doc:
                    raise _NotPlain  # HELP escapes: left to prometheus_client
            else:
                if len(parts) < 4:
                    raise _NotPlain
                if candidate != name:
                    if name:
                        out.append(build(name, doc, typ, samples))
                    name, doc, samples = candidate, "", []
                typ = parts[3]
                allowed = [name + n for n in _ALLOWED.get(typ, ("",))]
        elif not line:
            continue
        else:
            m = _PLAIN_SAMPLE.match(line)
            if m is None:
                raise _NotPlain
            labels = dict(_PLAIN_LABEL.findall(m[2])) if m[2] else {}
            if m[2] and (len(labels) != m[2].count("=") or "__name__" in labels):
                raise _NotPlain
            raw = m[3]
            sample = PromSample(m[1], labels, float(raw), None)
            if sample.name not in allowed:
                if name:
                    out.append(build(name, doc, typ, samples))
                name, doc, typ, samples, allowed = "", "", "untyped", [], []
                out.append(build(sample.name, doc, typ, [sample]))
            else:
                samples.append(sample)
    if name:
        out.append(build(name, doc, typ, samples))
    return out


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float

    def matches(self, labels: dict[str, str]) -> bool:
        return all(self.labels.get(k) == v for k, v in labels.items())


@dataclass
class MetricsSnapshot:
    """Every sample of one `/metrics` scrape, with the time it was taken."""

    timestamp: datetime
    samples: list[Sample]
    base_url: str | None = None
    types: dict[str, str] = field(default_factory=dict)  # family name -> counter/gauge/histogram/...

    @classmethod
    def from_text(
        cls, text: str, *, timestamp: datetime | None = None, base_url: str | None = None
    ) -> MetricsSnapshot:
        from prometheus_client.parser import text_string_to_metric_families

        samples: list[Sample] = []
        types: dict[str, str] = {}
        try:
            try:
                families = _plain_families(text)
            except _NotPlain:  # anything but the plain layout servers write: prometheus_client reads it
                families = text_string_to_metric_families(text)
            for family in families:
                types[family.name] = family.type
                for s in family.samples:
                    if s.name.endswith("_created"):
                        continue  # creation time, not a measurement
                    samples.append(Sample(s.name, dict(s.labels), float(s.value)))
        except (ValueError, OverflowError) as exc:  # OverflowError: an integer value beyond a float (1e309)
            raise MetricsError(f"/metrics text from {base_url or 'input'} does not parse: {exc}") from exc
        return cls(timestamp or datetime.now(timezone.utc), samples, base_url, types)

    def select(self, name: str, **labels: Any) -> list[Sample]:
        """Samples of `name` (with or without `_total`) whose labels match; a None label is not filtered."""
        wanted = {k: str(v) for k, v in labels.items() if v is not None}
        base = _base_name(name)
        return [s for s in self.samples if _base_name(s.name) == base and s.matches(wanted)]

    def value(self, name: str, **labels: Any) -> float | None:
        """Sum of the matching samples, None when there is none."""
        found = self.select(name, **labels)
        return math.fsum(s.value for s in found) if found else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp.isoformat(),
            "base_url": self.base_url,
            "types": self.types,
            "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in self.samples],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricsSnapshot:
        return cls(
            timestamp=datetime.fromisoformat(data["timestamp"]),
            samples=[Sample(s["name"], dict(s["labels"]), float(s["value"])) for s in data["samples"]],
            base_url=data.get("base_url"),
            types=dict(data.get("types", {})),
        )

    def frame(self):
        import pandas as pd

        return pd.DataFrame(
            [{"name": s.name, "labels": s.labels, "value": s.value} for s in self.samples],
            columns=["name", "labels", "value"],
        )


def scrape(base_url: str, timeout: float = 10) -> MetricsSnapshot:
    """GET {base_url}/metrics and parse it."""
    import httpx

    url = base_url.rstrip("/") + "/metrics"
    try:
        # the server is local: a proxy from the environment must not carry the scrape (every other call ignores it)
        # verify=False over plain http: no certificate store to load on every scrape (it cost more CPU than the
        # request); an https server keeps its verification
        response = httpx.get(url, timeout=timeout, trust_env=False, verify=not url.startswith("http://"))
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise MetricsError(f"cannot scrape {url}: {exc}") from exc
    return MetricsSnapshot.from_text(response.text, timestamp=datetime.now(timezone.utc), base_url=base_url)


def counter_delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str, **labels: Any) -> float | None:
    """after - before of a counter summed over matching samples; None when `after` has no such sample.

    A sample absent from `before` counts as 0 (vLLM creates some labelled counters lazily).
    """
    end = after.value(name, **labels)
    if end is None:
        return None
    start = before.value(name, **labels) or 0.0
    delta = end - start
    shown = ",".join(f'{k}="{v}"' for k, v in labels.items() if v is not None)
    if not math.isfinite(delta):  # NaN or inf in either snapshot (or their difference out of range)
        raise MetricsError(f"counter {name}{{{shown}}} from {start} to {end}: not a count")
    if delta < 0:
        raise MetricsError(
            f"counter {name}{{{shown}}} went down from {start} to {end} between "
            f"{before.timestamp.isoformat()} and {after.timestamp.isoformat()}: the server restarted"
        )
    return delta


@dataclass
class CounterDelta:
    """What a server's counters accrued between two snapshots: the acceptance counts and the token and
    request counters beside them (None where the engine has no such counter)."""

    acceptance: Acceptance
    generation_tokens: int | None = None
    prompt_tokens: int | None = None
    requests_succeeded: int | None = None
    requests_by_finish_reason: dict[str, int] = field(default_factory=dict)
    interval_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.acceptance.figures(),
            "generation_tokens": self.generation_tokens,
            "prompt_tokens": self.prompt_tokens,
            "requests_succeeded": self.requests_succeeded,
            "requests_by_finish_reason": dict(self.requests_by_finish_reason),
            "interval_s": self.interval_s,
        }


def int_delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str, **labels: Any) -> int | None:
    delta = counter_delta(before, after, name, **labels)
    return None if delta is None else int(round(delta))


def label_values(snapshot: MetricsSnapshot, name: str, label: str, **labels: Any) -> list[str]:
    """The values a label takes on the samples of `name` (e.g. every `position`), sorted numerically."""
    found = {s.labels[label] for s in snapshot.select(name, **labels) if label in s.labels}

    def key(value: str) -> tuple[bool, int, str]:
        number = _INTEGER_LABEL.fullmatch(value)  # not str.isdigit: int() refuses "²" and "--1"
        return number is None, int(value) if number else 0, value

    return sorted(found, key=key)
