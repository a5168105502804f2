"""Cross-engine comparison: our engine against a pinned oracle engine, with guards before any ratio.

Matched work, enforced by the params schema: the same target (an embedded name or the same path:
llama.cpp gets a GGUF bit-identical to the safetensors vLLM loads, see specbook.models.weights), the same
lane (speculation off / a speculative_config with the same draft and k) on both sides, the same
max concurrent sequences, greedy decoding, the same prompts and max_tokens; chat prompts are
templated by each server from the same template (the prompt-length guard checks they agree).

Per lane x side: one fresh server. Per prompt on it: one cold request (not timed; its raw response,
with llama.cpp's `timings`, is kept), a /metrics snapshot, N warm repeats streamed one at a time,
a second snapshot. Warm tok/s = completion_tokens / whole-request wall time. AL per cell comes
from the counter delta under specbook.acceptance's one definition; raw figures are kept beside it.

Token ids for the guards come from tokenizing each output text with the target's own tokenizer
(both engines use the same vocabulary): one token space for every engine, and nothing added to the
timed requests (logprobs / token-id options change what the server does per token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from specbook.acceptance import DEFINITION, counts_from_llamacpp_timings, counts_from_spec_decode_delta
from specbook.engines import EngineConfig
from specbook.errors import ExperimentError
from specbook.experiments.registry import ExperimentSpec, register_experiment
from specbook.guards import GuardThresholds, GuardVerdict, SideOutputs, guard_cell
from specbook.params import ExperimentParams

SIDES = ("ours", "oracle")
OFF_LANE = "off"
# Frames / JSON documents in run_dir/data (the notebook's reuse_data path reads these back).
REQUESTS_FRAME = "requests"
CELLS_FRAME = "cell_counters"
SERVERS_FRAME = "servers"
PINS_JSON = "pins"
COLD_JSON = "cold_responses"
WEIGHTS_JSON = "weights"
PROPOSALS_NOTE = (
    "Draft proposals side by side: not shown. Neither engine exposes the drafted token ids of each step "
    "through its API or metrics (vLLM 0.32 not at all; llama.cpp 11434 only prints draft candidates "
    "at debug log verbosity, which would change the timed run), so no matched-position comparison of "
    "proposals is possible; per-position acceptance above is the closest comparable figure."
)


class SideSpec(BaseModel):
    """One side of the comparison: its engine config (without speculation: lanes add it) and its pins."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1, description="shown in tables, e.g. llamacpp")
    engine: EngineConfig
    pins: dict[str, str | None] = Field(
        default_factory=dict,
        description="expected probe_versions() values; null = must be absent; glob patterns allowed",
    )


class LaneSpec(BaseModel):
    """One speculation setting applied to both sides."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    speculative_config: dict[str, Any] | None = None


class PromptSpec(BaseModel):
    """One prompt: a chat user message (templated by each server) or a plain completion prompt."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    text: str = Field(min_length=1)
    chat: bool = True
    system: str | None = None


class CrossEngineParams(ExperimentParams):
    ours: SideSpec
    oracle: SideSpec
    lanes: list[LaneSpec] = Field(min_length=1)
    prompts: list[PromptSpec] = Field(min_length=1)
    num_prompts: int | None = Field(None, ge=1, description="use only the first N prompts")
    max_tokens: int = Field(128, ge=2)
    warm_repeats: int = Field(3, ge=1, description="timed repeats per prompt after one discarded cold run")
    matched_work: bool = Field(
        False, description="force equal lengths: ignore_eos with max_tokens on both sides (equal work)"
    )
    guards: GuardThresholds = Field(default_factory=GuardThresholds)
    ci_level: float = Field(0.95, gt=0, lt=1)
    n_boot: int = Field(2000, ge=100)

    @model_validator(mode="after")
    def _matched_work(self) -> CrossEngineParams:
        o, r = self.ours.engine, self.oracle.engine
        if o.model != r.model:
            raise ValueError(
                f"ours.engine.model {o.model!r} and oracle.engine.model {r.model!r} differ: both sides must "
                "serve the same target weights (an embedded name, or the same path)"
            )
        if (o.max_num_seqs or 1) != (r.max_num_seqs or 1):
            raise ValueError(
                f"ours.engine.max_num_seqs ({o.max_num_seqs}) and oracle.engine.max_num_seqs ({r.max_num_seqs}) "
                "differ: matched work needs the same max concurrent sequences"
            )
        for side in (self.ours, self.oracle):
            if side.engine.speculative_config is not None:
                raise ValueError(
                    f"{side.label}: engine.speculative_config must be empty; speculation is set per lane (lanes)"
                )
        names = [lane.name for lane in self.lanes]
        if len(set(names)) != len(names):
            raise ValueError(f"lanes: names must be distinct, got {names}")
        ids = [p.id for p in self.prompts]
        if len(set(ids)) != len(ids):
            raise ValueError(f"prompts: ids must be distinct, got {ids}")
        if self.ours.label == self.oracle.label:
            raise ValueError("ours.label and oracle.label must differ")
        return self

    def selected_prompts(self) -> list[PromptSpec]:
        return self.prompts[: self.num_prompts] if self.num_prompts else list(self.prompts)

    def side(self, which: str) -> SideSpec:
        return self.ours if which == "ours" else self.oracle


register_experiment(ExperimentSpec("cross_engine", CrossEngineParams, "cross_engine.ipynb"))


# ---------------------------------------------------------------------------------------------
# building requests and configs
# ---------------------------------------------------------------------------------------------


def lane_config(side: SideSpec, lane: LaneSpec) -> EngineConfig:
    """The side's engine config with the lane's speculation."""
    return side.engine.model_copy(update={"speculative_config": lane.speculative_config})


def build_request(params: CrossEngineParams, prompt: PromptSpec, *, repeat: int | None = None) -> Any:
    from specbook.client import ChatRequest

    pid = prompt.id if repeat is None else f"{prompt.id}#{repeat}"
    common = {"prompt_id": pid, "max_tokens": params.max_tokens, "temperature": 0.0, "ignore_eos": params.matched_work}
    if prompt.chat:
        messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
        messages.append({"role": "user", "content": prompt.text})
        return ChatRequest(messages=messages, **common)
    return ChatRequest(prompt=prompt.text, **common)


def check_all_pins(params: CrossEngineParams) -> dict[str, Any]:
    """Pins of both sides against the installed engines, before any server starts (PinMismatchError)."""
    from specbook.engines import get_engine
    from specbook.pins import check_pins

    out: dict[str, Any] = {}
    for which in SIDES:
        side = params.side(which)
        found = get_engine(side.engine.engine).probe_versions()
        checks = check_pins(side.pins, found, what=f"{which} {side.label} ({side.engine.engine}; params {which}.pins)")
        out[which] = {"declared": side.pins, "found": found, "checks": [c.model_dump() for c in checks]}
    return out


def load_tokenizer(params: CrossEngineParams) -> Any:
    """The target's own tokenizer (the model folder both engines' weights come from)."""
    from transformers import AutoTokenizer

    from specbook.engines import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(params.oracle.engine.model))


def token_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text or "", add_special_tokens=False))


# ---------------------------------------------------------------------------------------------
# collect / load
# ---------------------------------------------------------------------------------------------


@dataclass
class CrossData:
    """Everything a cross-engine run measured (raw); analysis functions derive the rest."""

    requests: pd.DataFrame  # one row per request: side, lane, prompt_id, phase, repeat, record fields, token_ids
    cells: pd.DataFrame  # one row per side x lane x prompt: counter deltas, raw engine figures
    servers: pd.DataFrame  # one row per server: side, lane, ready_s, versions
    pins: dict[str, Any] = field(default_factory=dict)
    cold: list[dict[str, Any]] = field(default_factory=list)
    weights: dict[str, Any] = field(default_factory=dict)


def _post_raw(base_url: str, model: str, request: Any, timeout_s: float = 600) -> dict[str, Any]:
    """One non-streamed request keeping the server's whole JSON (llama.cpp adds `timings`)."""
    import httpx

    body = request.payload(model, stream=False)
    resp = httpx.post(base_url.rstrip("/") + request.endpoint, json=body, timeout=timeout_s, trust_env=False)
    if resp.status_code != 200:
        raise ExperimentError(f"cold request {request.prompt_id} to {base_url}: HTTP {resp.status_code}: {resp.text[:300]}")
    return resp.json()


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _log_slice(path: Path, start: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _weights_proof(params: CrossEngineParams) -> dict[str, Any]:
    """For every llama.cpp side: the derived GGUFs' proof of identical weights (target and draft)."""
    from specbook.models.weights import derive_gguf, weights_proof

    proofs: dict[str, Any] = {}
    models = {params.ours.engine.model, params.oracle.engine.model}
    for lane in params.lanes:
        draft = (lane.speculative_config or {}).get("model")
        if isinstance(draft, str):
            models.add(draft)
    if "llamacpp" not in {params.ours.engine.engine, params.oracle.engine.engine}:
        return proofs
    for name in sorted(models):
        if Path(name).suffix == ".gguf":
            proofs[name] = {"identical": None, "note": "a GGUF given directly: identity with vLLM's weights not proven"}
            continue
        proofs[name] = weights_proof(derive_gguf(name))
    return proofs


def collect(params: CrossEngineParams, ctx: Any) -> CrossData:
    """Check pins (abort before measuring), derive weights, then serve each lane on each side in turn."""
    from specbook.client import records_frame, run_requests_sync
    from specbook.engines import get_engine
    from specbook.metrics import scrape
    from specbook.server import ManagedServer, free_port

    pins = check_all_pins(params)
    ctx.save_json(PINS_JSON, pins)
    weights = _weights_proof(params)
    ctx.save_json(WEIGHTS_JSON, weights)
    tokenizer = load_tokenizer(params)
    prompts = params.selected_prompts()

    request_frames: list[pd.DataFrame] = []
    cell_rows: list[dict[str, Any]] = []
    server_rows: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []
    for lane in params.lanes:
        for which in ("oracle", "ours"):
            side = params.side(which)
            cfg = lane_config(side, lane)
            engine = get_engine(cfg.engine)
            label = f"{side.label}-{lane.name}"
            spec = engine.build_spec(cfg, name=label, log_path=ctx.log_path(label), port=free_port())
            model_name = spec.model_name or cfg.client_model_name()
            with ManagedServer(spec) as srv:
                versions = engine.probe_versions(srv.base_url)
                for prompt in prompts:
                    cold_resp = _post_raw(srv.base_url, model_name, build_request(params, prompt))
                    cold.append({"side": which, "lane": lane.name, "prompt_id": prompt.id, "response": cold_resp})
                    log_start = _log_size(spec.log_path)
                    before = scrape(srv.base_url)
                    warm = [build_request(params, prompt, repeat=i) for i in range(params.warm_repeats)]
                    records = run_requests_sync(srv.base_url, model_name, warm, concurrency=1, progress=False)
                    after = scrape(srv.base_url)
                    delta = engine.spec_decode_delta(before, after, model_name)
                    frame = records_frame(records)
                    frame.insert(0, "side", which)
                    frame.insert(1, "engine", cfg.engine)
                    frame.insert(2, "lane", lane.name)
                    frame.insert(3, "prompt", prompt.id)
                    frame.insert(4, "repeat", range(len(records)))
                    frame["token_ids"] = [token_ids(tokenizer, r.output_text) for r in records]
                    request_frames.append(frame)
                    cell_rows.append(_cell_row(which, cfg.engine, lane.name, prompt.id, delta, cold_resp,
                                               _log_slice(spec.log_path, log_start)))
                started_at, ready_s, launched_env, argv = srv.started_at, srv.ready_s, srv.launched_env, srv.argv
            ctx.record_server(label, argv, launched_env, versions, started_at,
                              stopped_at=datetime.now(timezone.utc), ready_s=ready_s,
                              extra={"experiment": "cross_engine", "side": which, "lane": lane.name})
            server_rows.append({"server": label, "side": which, "label": side.label, "engine": cfg.engine,
                                "lane": lane.name, "ready_s": ready_s, "versions": str(versions)})
            # Saved after every server: a later failure keeps what the earlier ones measured.
            ctx.save_frame(REQUESTS_FRAME, pd.concat(request_frames, ignore_index=True))
            ctx.save_frame(CELLS_FRAME, pd.DataFrame(cell_rows))
            ctx.save_frame(SERVERS_FRAME, pd.DataFrame(server_rows))
            ctx.save_json(COLD_JSON, cold)
    return load(ctx)


def _cell_row(side: str, engine: str, lane: str, prompt: str, delta: Any, cold_resp: dict, log_text: str) -> dict:
    counts = counts_from_spec_decode_delta(delta, engine)
    row: dict[str, Any] = {
        "side": side, "engine": engine, "lane": lane, "prompt": prompt,
        "drafts": counts.drafts, "draft_tokens": counts.draft_tokens, "accepted": counts.accepted,
    }
    for i, n in enumerate(counts.accepted_per_position):
        row[f"accepted_pos_{i}"] = n
    timings = cold_resp.get("timings") or {}
    row["cold_timings_draft_n"] = timings.get("draft_n")
    row["cold_timings_draft_n_accepted"] = timings.get("draft_n_accepted")
    if engine == "llamacpp":
        from specbook.engines.llamacpp import parse_draft_lines

        lines = parse_draft_lines(log_text)
        row["log_requests"] = len(lines)
        row["log_mean_len"] = float(np.mean([x["mean_len"] for x in lines if "mean_len" in x])) if lines else None
        row["log_accepted"] = float(sum(x["accepted"] for x in lines)) if lines else None
        row["log_generated"] = float(sum(x["generated"] for x in lines)) if lines else None
    return row


def load(ctx: Any) -> CrossData:
    """Read back what collect saved (reuse_data / `specbook render`)."""
    data_dir = Path(ctx.data_dir)

    def maybe_json(name: str, default: Any) -> Any:
        return ctx.load_json(name) if (data_dir / f"{name}.json").exists() else default

    return CrossData(
        requests=ctx.load_frame(REQUESTS_FRAME),
        cells=ctx.load_frame(CELLS_FRAME),
        servers=ctx.load_frame(SERVERS_FRAME),
        pins=maybe_json(PINS_JSON, {}),
        cold=maybe_json(COLD_JSON, []),
        weights=maybe_json(WEIGHTS_JSON, {}),
    )


# ---------------------------------------------------------------------------------------------
# analysis (pure functions of the saved frames)
# ---------------------------------------------------------------------------------------------


def with_rates(requests: pd.DataFrame) -> pd.DataFrame:
    """Requests plus warm tok/s = completion_tokens / whole-request wall time."""
    df = requests.copy()
    df["tok_s"] = df["completion_tokens"] / df["wall_s"]
    return df


def ratio_of_means_ci(
    ours: np.ndarray, oracle: np.ndarray, *, ci: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """mean(ours) / mean(oracle) with a percentile bootstrap CI resampling each side's repeats.

    Repeats on one server share its state: the CI covers request-to-request noise, not server-to-server.
    """
    ours, oracle = np.asarray(ours, float), np.asarray(oracle, float)
    if ours.size == 0 or oracle.size == 0:
        return math.nan, math.nan, math.nan
    point = float(ours.mean() / oracle.mean())
    rng = np.random.default_rng(seed)
    a = ours[rng.integers(0, ours.size, (n_boot, ours.size))].mean(axis=1)
    b = oracle[rng.integers(0, oracle.size, (n_boot, oracle.size))].mean(axis=1)
    lo, hi = np.percentile(a / b, [100 * (1 - ci) / 2, 100 * (1 + ci) / 2])
    return point, float(lo), float(hi)


def _tokens(df: pd.DataFrame) -> list[list[int]]:
    return [list(map(int, t)) for t in df.sort_values("repeat")["token_ids"]]


def cell_guards(data: CrossData, thresholds: GuardThresholds | None = None) -> dict[tuple[str, str], GuardVerdict]:
    """Guards for every lane x prompt cell."""
    req = data.requests
    labels = _labels(data)
    out: dict[tuple[str, str], GuardVerdict] = {}
    lanes = list(dict.fromkeys(req["lane"]))
    for lane in lanes:
        for prompt in dict.fromkeys(req.loc[req["lane"] == lane, "prompt"]):
            sides = {}
            prompt_tokens: list[int | None] = []
            for which in SIDES:
                rows = req[(req["lane"] == lane) & (req["prompt"] == prompt) & (req["side"] == which)]
                ok = rows[rows["error"].isna()] if "error" in rows else rows
                off_rows = req[(req["lane"] == OFF_LANE) & (req["prompt"] == prompt) & (req["side"] == which)]
                spec_off = _tokens(off_rows)[0] if lane != OFF_LANE and len(off_rows) else None
                counted = ok["completion_tokens"].dropna() if "completion_tokens" in ok else pd.Series(dtype=float)
                sides[which] = SideOutputs(labels[which], _tokens(ok), spec_off=spec_off,
                                           completion_tokens=int(counted.iloc[0]) if len(counted) else None)
                pt = ok["prompt_tokens"].dropna()
                prompt_tokens.append(int(pt.iloc[0]) if len(pt) else None)
            out[(lane, prompt)] = guard_cell(
                sides["ours"], sides["oracle"], thresholds, prompt_tokens=(prompt_tokens[0], prompt_tokens[1])
            )
    return out


def _labels(data: CrossData) -> dict[str, str]:
    labels = {"ours": "ours", "oracle": "oracle"}
    if not data.servers.empty:
        for which in SIDES:
            found = data.servers.loc[data.servers["side"] == which, "label"]
            if len(found):
                labels[which] = str(found.iloc[0])
    return labels


def cell_table(
    data: CrossData, thresholds: GuardThresholds | None = None, *, ci: float = 0.95, n_boot: int = 2000
) -> pd.DataFrame:
    """lane / prompt / ours / oracle / ratio [CI] / flags, plus lengths, divergence, TTFT, ITL, AL."""
    req = with_rates(data.requests)
    req = req[req["error"].isna()] if "error" in req else req
    guards = cell_guards(data, thresholds)
    acc = acceptance_table(data) if not data.cells.empty else pd.DataFrame()
    al = acc.set_index(["lane", "prompt", "side"])["al"] if not acc.empty else None
    rows = []
    for (lane, prompt), verdict in guards.items():
        cell = req[(req["lane"] == lane) & (req["prompt"] == prompt)]
        ours, oracle = (cell[cell["side"] == s] for s in SIDES)
        ratio, lo, hi = ratio_of_means_ci(ours["tok_s"].to_numpy(), oracle["tok_s"].to_numpy(), ci=ci, n_boot=n_boot)
        row = {
            "lane": lane, "prompt": prompt,
            "ours_tok_s": float(ours["tok_s"].mean()), "oracle_tok_s": float(oracle["tok_s"].mean()),
            "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi,
            "comparable": verdict.comparable,
            "flags": ", ".join(verdict.flags),
            "ours_tokens": verdict.ours_tokens, "oracle_tokens": verdict.oracle_tokens,
            "first_divergence": verdict.first_divergence,
            "ours_distinct": verdict.ours_distinct_ratio, "oracle_distinct": verdict.oracle_distinct_ratio,
            "ours_ttft_ms": 1000 * float(ours["ttft_s"].mean()), "oracle_ttft_ms": 1000 * float(oracle["ttft_s"].mean()),
            "ours_itl_ms": 1000 * float(ours["itl_mean_s"].mean()),
            "oracle_itl_ms": 1000 * float(oracle["itl_mean_s"].mean()),
            "reasons": list(verdict.reasons),
        }
        if al is not None:
            for which in SIDES:
                row[f"{which}_al"] = al.get((lane, prompt, which), math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def headline(cells: pd.DataFrame, *, ci: float = 0.95, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per lane: the geometric mean of the comparable cells' ratios (flagged cells left out), with a CI.

    The CI resamples comparable cells (prompts) when there are at least two; with one it is that
    cell's own CI; with none the lane has no headline ratio.
    """
    rows = []
    for lane, group in cells.groupby("lane", sort=False):
        ok = group[group["comparable"]]
        logs = np.log(ok["ratio"].to_numpy(float))
        row = {"lane": lane, "cells": len(group), "comparable": len(ok),
               "left_out": ", ".join(group.loc[~group["comparable"], "prompt"])}
        if len(ok) == 0:
            row.update(ratio=math.nan, ratio_lo=math.nan, ratio_hi=math.nan)
        elif len(ok) == 1:
            row.update(ratio=float(ok["ratio"].iloc[0]), ratio_lo=float(ok["ratio_lo"].iloc[0]),
                       ratio_hi=float(ok["ratio_hi"].iloc[0]))
        else:
            rng = np.random.default_rng(seed)
            boots = logs[rng.integers(0, logs.size, (n_boot, logs.size))].mean(axis=1)
            lo, hi = np.percentile(boots, [100 * (1 - ci) / 2, 100 * (1 + ci) / 2])
            row.update(ratio=float(np.exp(logs.mean())), ratio_lo=float(np.exp(lo)), ratio_hi=float(np.exp(hi)))
        rows.append(row)
    return pd.DataFrame(rows)


def flagged_reasons(cells: pd.DataFrame) -> str:
    """One block per flagged cell: why it is not comparable (printed under the table)."""
    lines = []
    for _, row in cells[~cells["comparable"]].iterrows():
        lines.append(f"{row['lane']} / {row['prompt']}: NOT COMPARABLE")
        lines += [f"    - {r}" for r in row["reasons"]]
    return "\n".join(lines) if lines else "every cell passed every guard"


def acceptance_table(data: CrossData) -> pd.DataFrame:
    """Per side x lane x prompt: AL and acceptance rate under the one definition, raw figures beside."""
    rows = []
    for _, c in data.cells.iterrows():
        if not c["drafts"] and not c["draft_tokens"]:
            continue  # no speculation in this cell
        row = {"lane": c["lane"], "prompt": c["prompt"], "side": c["side"], "engine": c["engine"]}
        drafts, accepted, tokens = float(c["drafts"]), float(c["accepted"]), float(c["draft_tokens"])
        row["al"] = 1 + accepted / drafts if drafts else math.nan
        row["acceptance_rate"] = accepted / tokens if tokens else math.nan
        row.update(raw_drafts=drafts, raw_draft_tokens=tokens, raw_accepted=accepted)
        if c.get("engine") == "llamacpp":
            cold = counts_from_llamacpp_timings([{"draft_n": c.get("cold_timings_draft_n"),
                                                  "draft_n_accepted": c.get("cold_timings_draft_n_accepted")}])
            row["raw_cold_timings_accepted/draft_n"] = cold.acceptance_rate
            row["raw_log_mean_len"] = c.get("log_mean_len")
        rows.append(row)
    return pd.DataFrame(rows)


def per_position(data: CrossData) -> pd.DataFrame:
    """Side x lane x position: accepted at that position / drafts, summed over the prompts."""
    cols = sorted((c for c in data.cells.columns if c.startswith("accepted_pos_")), key=lambda c: int(c.rsplit("_", 1)[1]))
    rows = []
    for (side, lane), g in data.cells.groupby(["side", "lane"], sort=False):
        drafts = float(g["drafts"].sum())
        if not drafts:
            continue
        for col in cols:
            n = float(g[col].fillna(0).sum())
            rows.append({"side": side, "lane": lane, "position": int(col.rsplit("_", 1)[1]), "rate": n / drafts})
    return pd.DataFrame(rows)


def definition_note() -> str:
    return (
        f"Acceptance, one definition for every engine: {DEFINITION}. vLLM: from vllm:spec_decode_* counters; "
        "llama.cpp: from llamacpp:spec_decode_* counters (drafts = verification steps). Raw figures beside: "
        "the counts, llama.cpp's log 'mean len' (same definition) and the cold response's timings "
        "draft_n_accepted / draft_n (an acceptance rate, not AL)."
    )


REPORT_COLUMNS = ["lane", "prompt", "ours_tok_s", "oracle_tok_s", "ratio", "ratio_lo", "ratio_hi", "comparable", "flags"]
GUARD_COLUMNS = [
    "lane", "prompt", "ours_tokens", "oracle_tokens", "first_divergence", "ours_distinct", "oracle_distinct",
    "ours_al", "oracle_al", "ours_ttft_ms", "oracle_ttft_ms", "ours_itl_ms", "oracle_itl_ms",
]


def pins_table(data: CrossData) -> pd.DataFrame:
    """side / key / expected / found / ok for every declared pin."""
    rows = []
    for which, doc in data.pins.items():
        for c in doc.get("checks", []):
            rows.append({"side": which, **c})
    return pd.DataFrame(rows, columns=["side", "key", "expected", "found", "ok"])


def weights_table(data: CrossData) -> pd.DataFrame:
    """model / identical / tensors / weights digest / GGUF sha256 (llama.cpp sides only)."""
    rows = [
        {"model": name, "identical": p.get("identical"), "tensors": p.get("tensors"),
         "weights_digest": p.get("weights_digest"), "gguf_sha256": p.get("gguf_sha256"), "method": p.get("method")}
        for name, p in data.weights.items()
    ]
    return pd.DataFrame(rows, columns=["model", "identical", "tensors", "weights_digest", "gguf_sha256", "method"])


def plot_ratios(cells: pd.DataFrame, ax: Any) -> Any:
    """One bar per cell with its CI; flagged cells grey and hatched (drawing only, no computation)."""
    labels = [f"{r.lane}\n{r.prompt}" for r in cells.itertuples()]
    x = np.arange(len(cells))
    colors = ["tab:blue" if ok else "lightgrey" for ok in cells["comparable"]]
    err = np.vstack([cells["ratio"] - cells["ratio_lo"], cells["ratio_hi"] - cells["ratio"]]).clip(min=0)
    bars = ax.bar(x, cells["ratio"], color=colors, yerr=err, capsize=3)
    for bar, ok in zip(bars, cells["comparable"], strict=True):
        if not ok:
            bar.set_hatch("//")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("ours / oracle tok/s")
    ax.set_title("Per-cell ratio (grey, hatched: not comparable)")
    return ax
