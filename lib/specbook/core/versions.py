"""Installed versions read without importing what they describe (an engine's import can take seconds)."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import sys
from pathlib import Path


def dist_version(*dists: str, first_in: str | None = None) -> tuple[str, str] | None:
    """(distribution name, version) of the first installed of `dists`, without importing it; `first_in`: a folder
    searched before sys.path (packages installed apart, put first on a server's PYTHONPATH)."""
    for dist in dists:
        if first_in is not None:
            for found in importlib.metadata.distributions(name=dist, path=[first_in, *sys.path]):
                return dist, found.version
            continue
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def torch_cuda_version() -> str | None:
    """torch.version.cuda read from torch/version.py, so probing does not import torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_py = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        tree = ast.parse(version_py.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        )
        if isinstance(target, ast.Name) and target.id == "cuda" and node.value is not None:
            value = ast.literal_eval(node.value)
            return str(value) if value is not None else None
    return None
