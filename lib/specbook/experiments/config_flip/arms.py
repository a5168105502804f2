"""The arms of a flip: one folder copy per value (specbook.experiments.config_flip.flip) and the engine config
that serves it, proven one field apart before any server starts.

The proof has two halves: the folders differ file by file only in the declared field, and the launch specs
(argv and env) the engine builds from the arms' configs differ only in the arm's folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from specbook.core import secrets
from specbook.core.errors import ExperimentError
from specbook.engines import EngineConfig, get_engine
from specbook.experiments.config_flip import flip
from specbook.experiments.config_flip.params import (
    FLIP_PLACEHOLDER,
    ConfigFlipParams,
    flip_role,
    resolve_folder,
)
from specbook.serve.server import ServerSpec

# The served model name of a flipped target: one name for every arm, else vLLM names it by its (per-arm) path.
SERVED_MODEL_NAME = "flip-target"


@dataclass(frozen=True)
class FlipArm:
    """One arm: its place in the flip, its folder and the engine config that serves it."""

    index: int
    folder: flip.FlippedFolder
    cfg: EngineConfig

    @property
    def label(self) -> str:
        """The arm's name in every frame and the name of its measured server ("arm1-100.0")."""
        return self.folder.path.name

    @property
    def value(self) -> str:
        """The arm's value of the flipped field as JSON text (the frames' `value` column)."""
        return json.dumps(self.folder.value)


class LaunchView(TypedDict):
    """The parts of a launch spec that must be equal across arms, with the arm folder masked."""

    argv: list[str]
    env: dict[str, str]
    unset_env: list[str]
    cwd: str | None


def arm_label(index: int, value: Any) -> str:
    return f"arm{index}-{flip.safe_label(value)}"


def arm_engine_config(engine: EngineConfig, folder: Path, *, served_model_name: str) -> EngineConfig:
    """The shared config with the placeholder replaced by this arm's folder.

    A flipped target gets a fixed served model name, else vLLM would name it by its (per-arm) path.
    """
    data = engine.model_dump()
    if flip_role(engine) == "target":
        data["model"] = str(folder)
        data["served_model_name"] = data.get("served_model_name") or served_model_name
    else:
        data["speculative_config"] = {**data["speculative_config"], "model": str(folder)}
    return EngineConfig.model_validate(data)


def launch_view(spec: ServerSpec, folder: Path) -> LaunchView:
    """The parts of a launch spec that must be equal across arms, with the arm folder masked."""
    mask = lambda s: s.replace(str(folder), FLIP_PLACEHOLDER)  # noqa: E731
    return {
        "argv": [mask(a) for a in spec.argv],
        "env": {k: mask(v) for k, v in sorted(spec.env.items())},
        "unset_env": sorted(spec.unset_env),
        "cwd": str(spec.cwd) if spec.cwd else None,
    }


def redacted_view(view: LaunchView) -> LaunchView:
    """A launch view as flip.json records it: argv and env with their secrets hidden (specbook.core.secrets)."""
    return {**view, "argv": secrets.redact_argv(view["argv"]), "env": secrets.redact_env(view["env"])}


def assert_launches_differ_only_in_folder(views: list[LaunchView], labels: list[str]) -> None:
    """Refuse arms whose launch argv/env differ once the arm's folder is masked out."""
    base = views[0]
    for label, view in zip(labels[1:], views[1:], strict=True):
        for key in base:
            if view[key] != base[key]:
                raise ExperimentError(
                    f"arm {label} would launch differently from arm {labels[0]} in {key} besides the "
                    f"flipped folder:\n  {base[key]}\n  {view[key]}"
                )


def build_arms(params: ConfigFlipParams, root: Path) -> tuple[list[flip.FlippedFolder], dict[str, Any]]:
    """Build every arm's folder under `root` and prove they differ in the declared field only; the folders and
    flip.json's record of them (source, field, values, the proven differences)."""
    spec = params.flip
    source = resolve_folder(spec.folder)
    folders = [
        flip.build_flipped_folder(
            source, root / arm_label(i, value), file=spec.file, field=spec.field, value=value,
            add_missing=spec.add_missing, link_mode=spec.link,
        )
        for i, value in enumerate(spec.values)
    ]
    diffs = {
        folders[i].path.name: [d.describe() for d in flip.assert_only_field_differs(
            folders[0].path, folders[i].path, file=spec.file, field=spec.field)]
        for i in range(1, len(folders))
    }
    summary = {
        "source": str(source),
        "file": spec.file,
        "field": spec.field,
        "role": flip_role(params.engine),
        "original_value": folders[0].original_value,
        "field_was_added": folders[0].field_was_added,
        "link": spec.link,
        "arms": [
            {"label": f.path.name, "value": f.value, "folder": str(f.path),
             "linked_weights": list(f.linked_weights), "copied_files": list(f.copied_files)}
            for f in folders
        ],
        "diffs_vs_first_arm": diffs,
    }
    return folders, summary


def flip_arms(params: ConfigFlipParams, root: Path) -> tuple[list[FlipArm], dict[str, Any]]:
    """Every arm built under `root` with its engine config, proven one field apart (folders and launches); the
    arms and flip.json's record (build_arms' plus `launch`: the first arm's launch view, secrets hidden)."""
    folders, summary = build_arms(params, root)
    arms = [FlipArm(i, f, arm_engine_config(params.engine, f.path, served_model_name=SERVED_MODEL_NAME))
            for i, f in enumerate(folders)]
    engine = get_engine(params.engine.engine)
    # Same name/log/port for the comparison so only what the arm changes can differ.
    views = [launch_view(engine.build_spec(arm.cfg, name="arm", log_path=Path("arm.log"), port=1), arm.folder.path)
             for arm in arms]
    assert_launches_differ_only_in_folder(views, [arm.label for arm in arms])
    summary["launch"] = redacted_view(views[0])
    return arms, summary
