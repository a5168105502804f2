"""Which arm did each server really run? From its `Env:` line and recorded argv, never from the params alone."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from specbook.core.errors import ExperimentError, ModelNotPreparedError
from specbook.engines import get_engine, with_log_stats_interval
from specbook.engines.base import EngineConfig
from specbook.experiments import attribution
from specbook.experiments.arms import ARM_JOIN, Arm
from specbook.experiments.knob_ab.params import KnobABParams


def _arm_config(arm: Arm, params: KnobABParams) -> EngineConfig:
    cfg = EngineConfig.model_validate(arm.engine)
    return with_log_stats_interval(cfg, params.measurement.log_stats_interval_s)


def check_inherited_knob_env(params: KnobABParams, parent_env) -> None:
    """Refuse to launch when a knob's env var is already set in the launching environment.

    A server inherits it even in arms whose knob is off, and the `Env:` line lists only what the launcher
    set or changed, so the inherited value would be invisible to attribution: those runs would count as
    the baseline while running the variant.
    """
    arms = params.arms()
    knob_keys = {k for knob in params.knobs for k in knob.env}
    inherited = sorted(k for k in knob_keys if k in parent_env and not all(
        k in (arm.engine.get("env") or {}) for arm in arms))
    if inherited:
        shown = ", ".join(f"{k}={parent_env[k]!r}" for k in inherited)
        raise ExperimentError(
            f"knob env var(s) already set in the launching environment: {shown}; arms that leave the knob off "
            f"would inherit them unseen. Unset them before `specbook run` (or set them in engine.env for every arm)"
        )


def arm_signatures(params: KnobABParams) -> tuple[dict[str, attribution.ArmSignature], list[str], list[str]]:
    """Each arm's expected knob env and args, built by the engine adapter exactly as it would launch it.

    Knob keys are the env vars any knob sets and the server options whose value differs between arms,
    so attribution compares only what the knobs change (the port, the log path... never count).
    """
    from specbook.engines import get_engine

    arms = params.arms()
    env_keys = sorted({k for knob in params.knobs for k in knob.env})
    specs = {}
    for arm in arms:
        cfg = _arm_config(arm, params)
        try:
            spec = get_engine(cfg.engine).build_spec(cfg, name="sig", log_path=Path("sig.log"), port=1)
        except ModelNotPreparedError:
            # re-analysing a run where its embedded models are not prepared (another host): attribution
            # compares embedded models by name, so a stand-in folder named after each does as well
            spec = get_engine(cfg.engine).build_spec(_embedded_by_name(cfg), name="sig", log_path=Path("sig.log"),
                                                     port=1)
        specs[arm.name] = spec
    opts = {name: attribution.parse_argv_options(s.argv) for name, s in specs.items()}
    all_keys = sorted({k for o in opts.values() for k in o})
    arg_keys = [
        k for k in all_keys if len({json.dumps(o.get(k), sort_keys=True, default=str) for o in opts.values()}) > 1
    ]
    sigs = {
        name: attribution.ArmSignature.from_launch(s.env, s.argv, env_keys, arg_keys) for name, s in specs.items()
    }
    return sigs, env_keys, arg_keys


def _embedded_by_name(cfg: EngineConfig) -> EngineConfig:
    """The config with each embedded model name as a folder path ending in that name (never launched)."""
    from specbook.models.catalog import EMBEDDED_MODELS

    def stand_in(name: object) -> object:
        return f"unprepared-embedded-models/{name}" if name in EMBEDDED_MODELS else name

    spec = dict(cfg.speculative_config or {}) or None
    if spec and "model" in spec:
        spec["model"] = stand_in(spec["model"])
    return cfg.model_copy(update={"model": stand_in(cfg.model), "speculative_config": spec})


def attribute_runs(runs: pd.DataFrame, params: KnobABParams) -> pd.DataFrame:
    """Per run: the arm its real env and argv say, whether that is the declared arm, and why."""
    sigs, env_keys, arg_keys = arm_signatures(params)
    rows = []
    for r in runs.itertuples(index=False):
        env = json.loads(r.launched_env) if isinstance(r.launched_env, str) else {}
        argv = json.loads(r.argv) if isinstance(r.argv, str) and r.argv else None
        if argv is None and params.ingest is not None and params.ingest.arm_from == "mapping":
            rows.append({"run_id": r.run_id, "declared_arm": r.declared_arm, "arm": r.declared_arm or None,
                         "matches_declared": bool(r.declared_arm),
                         "reason": getattr(r, "ingest_reason", "") or "ingest.mapping"})
            continue
        if argv is None:  # ingest: only the Env: line is known; args cannot be checked
            a = attribution.attribute(env, [], {n: s.model_copy(update={"args": {}}) for n, s in sigs.items()},
                                      env_keys, [], declared=r.declared_arm or None)
        else:
            a = attribution.attribute(env, argv, sigs, env_keys, arg_keys, declared=r.declared_arm or None)
        rows.append({
            "run_id": r.run_id,
            "declared_arm": r.declared_arm,
            "arm": a.arm,
            "matches_declared": a.matches_declared if r.declared_arm else a.arm is not None,
            "reason": a.reason,
            **{f"observed {k}": v for k, v in a.observed.items()},
        })
    return pd.DataFrame(rows)


def _arm_from_glob(path: Path, mapping: dict[str, str]) -> attribution.Attribution:
    for key, arm in mapping.items():
        if key.startswith("glob:") and path.match(key[5:]):
            return attribution.Attribution(arm, None, True, f"file matches {key!r}", {})
    return attribution.Attribution(None, None, False, f"{path.name} matches no glob of ingest.mapping", {})


def attention_backends_from_logs(runs: pd.DataFrame, run_dir: Path, engine: str) -> pd.DataFrame:
    """Per run, the attention backend its server's log says the target and the draft used (None: not logged)."""
    out = runs.copy()
    for role in ("target", "draft"):
        out[f"attention_backend_{role}"] = None
    if "log_path" not in out:
        return out
    for i, rel in out["log_path"].items():
        if not isinstance(rel, str) or not rel:
            continue
        facts = get_engine(engine).startup_facts(rel if Path(rel).is_absolute() else run_dir / rel)
        for role in ("target", "draft"):
            out.at[i, f"attention_backend_{role}"] = facts.get(f"attention_backend_{role}")
    return out


def backend_knob_reach(runs: pd.DataFrame, params: KnobABParams) -> list[str]:
    """Notes for knobs that request an attention backend which a run's target or draft did not use."""
    notes = []
    for knob in params.knobs:
        wanted = knob.set.get("attention_backend")
        if wanted is None or "arm" not in runs:
            continue
        on = runs[runs["arm"].map(lambda a, k=knob.name: k in str(a).split(ARM_JOIN))]
        for role in ("target", "draft"):
            col = f"attention_backend_{role}"
            if col not in on:
                continue
            used = sorted({str(v) for v in on[col] if v is not None and v == v})
            if used and used != [str(wanted)]:
                notes.append(
                    f"knob {knob.name!r} asks for attention backend {wanted}, but the {role} of its runs used "
                    f"{', '.join(used)} (server logs): the knob did not reach the {role}"
                    + (" (vLLM selects the draft's backend on its own unless "
                       "speculative_config.attention_backend is set)" if role == "draft" else "")
                )
    return notes





def arm_of_run(attr: pd.DataFrame) -> dict[str, str]:
    """run_id -> the arm the run was attributed to (unattributable runs left out)."""
    return {r.run_id: r.arm for r in attr.itertuples(index=False) if r.arm is not None}
