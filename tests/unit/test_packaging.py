"""environment.yml (GPU hosts) and pyproject.toml (CPU hosts) must name the same packages."""

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def conda_pip_names():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return {_name(r) for r in pip if not r.startswith("-")}


def test_environment_yml_names_the_pyproject_packages():
    proj = pyproject()
    extras = proj["optional-dependencies"]
    expected = {_name(r) for r in proj["dependencies"] + extras["cuda"] + extras["test"]}
    assert conda_pip_names() == expected


def test_engine_pins_agree_with_the_cpu_constraints():
    extras = pyproject()["optional-dependencies"]
    cpu_pin = extras["cpu"][0]
    constraints = (ROOT / "constraints" / "cpu.txt").read_text().splitlines()
    assert cpu_pin in constraints, f"{cpu_pin} from pyproject is not what constraints/cpu.txt pins"


def test_python_version_of_conda_env_is_allowed_by_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    py = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    minor = int(py.split("=")[1].split(".")[1])
    floor = int(re.search(r">=3\.(\d+)", pyproject()["requires-python"]).group(1))
    assert minor >= floor
