"""scripts/h200/run_tarball.py: the run folder and experiment of a tarball book.sh hands back (pack.sh RESUME=,
book.sh resume:FILE)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("run_tarball", ROOT / "scripts" / "h200" / "run_tarball.py")
run_tarball = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_tarball)

RUN_ID = "20261207T101500Z-cross_engine-4c203bf"


def _tarball(tmp_path: Path, files: dict[str, bytes], name: str = "run.tar.gz") -> Path:
    """Packed as book.sh's pack_dir packs a run folder: `tar -czf T -C PARENT RUN_ID`."""
    parent = tmp_path / "outputs"
    for rel, data in files.items():
        (parent / rel).parent.mkdir(parents=True, exist_ok=True)
        (parent / rel).write_bytes(data)
    out = tmp_path / name
    tops = sorted({rel.split("/", 1)[0] for rel in files})
    subprocess.run(["tar", "-czf", str(out), "-C", str(parent), *tops], check=True)
    return out


def test_a_run_folder_gives_its_name_and_experiment_even_with_the_manifest_last(tmp_path):
    files = {f"{RUN_ID}/data/trace-{i}.jsonl": b"{}\n" * 100 for i in range(3)}
    files[f"{RUN_ID}/manifest.json"] = json.dumps({"experiment": "cross_engine", "status": "interrupted"}).encode()
    assert run_tarball.describe(_tarball(tmp_path, files)) == (RUN_ID, "cross_engine")


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({f"{RUN_ID}/report.html": b"<html>"}, "no 20261207T101500Z-cross_engine-4c203bf/manifest.json"),
        ({f"{RUN_ID}/manifest.json": b"{\"status\": \"ok\"}"}, "names no experiment"),
        ({f"{RUN_ID}/manifest.json": b"{not json"}, "not a readable run tarball"),
        ({"a/manifest.json": b"{\"experiment\": \"knob_ab\"}", "b/x": b""}, "holds a/ and b/, not one run folder"),
    ],
)
def test_what_is_not_one_run_folder_with_its_manifest_is_refused_with_the_reason(tmp_path, files, reason):
    with pytest.raises(run_tarball.RunTarballError, match=reason):
        run_tarball.describe(_tarball(tmp_path, files))


def test_a_file_that_is_no_tarball_is_refused_by_name(tmp_path, capsys):
    bad = tmp_path / "knob_ab-h200.partial.tar.gz"
    bad.write_bytes(b"not gzip at all")
    assert run_tarball.main([str(bad)]) == 1
    err = capsys.readouterr().err
    assert "knob_ab-h200.partial.tar.gz" in err and "not a readable run tarball" in err


def test_the_command_prints_folder_and_experiment_for_the_shell_scripts(tmp_path):
    files = {f"{RUN_ID}/manifest.json": json.dumps({"experiment": "knob_ab"}).encode()}
    done = subprocess.run(
        ["python3", str(ROOT / "scripts" / "h200" / "run_tarball.py"), str(_tarball(tmp_path, files))],
        capture_output=True, text=True, check=True,
    )
    assert done.stdout.split() == [RUN_ID, "knob_ab"]
