"""The folders are the layers, and imports point down only (docs/ARCHITECTURE.md, "Layers").

Every `import specbook...` in lib/specbook, at module level or inside a function, is read from the source; an
import under `if TYPE_CHECKING:` counts too (a type named from above is a dependency on above). A module may import
its own layer and the layers below it, never a layer above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[2] / "lib" / "specbook"

# Low to high. Packages on one line are one layer: they may import each other.
LAYERS: list[tuple[str, ...]] = [
    ("core",),
    ("store",),
    ("serve",),
    ("models", "workloads", "traces"),
    ("engines",),
    ("measure", "executors"),
    ("report",),
    ("experiments",),
    ("run",),
    ("cli", "notebook", "ingest", "__main__", "__init__"),
]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def top_of(dotted: str) -> str:
    """`specbook.serve.client` -> `serve`; `specbook` itself -> `__init__`."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_of(path: Path) -> str:
    rel = path.relative_to(LIB.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1] if len(parts) > 2 else parts
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every specbook import in a file, relative ones resolved."""
    tree = ast.parse(path.read_text())
    package = module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "specbook"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "specbook":
                continue
            if mod == "specbook":  # from specbook import x: x is the top package
                out += [(node.lineno, f"specbook.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, mod))
    return out


def upward_imports() -> list[str]:
    found = []
    for path in sorted(LIB.rglob("*.py")):
        own = top_of(module_of(path))
        if own not in RANK:
            found.append(f"{path.relative_to(LIB)}: package {own!r} is in no layer")
            continue
        for line, mod in imports_of(path):
            other = top_of(mod)
            if other == "__version__":
                continue
            if other not in RANK:
                found.append(f"{path.relative_to(LIB)}:{line} imports {mod}, which is in no layer")
            elif RANK[other] > RANK[own]:
                found.append(f"{path.relative_to(LIB)}:{line} ({own}) imports {mod} ({other}, a layer above)")
    return found


def test_every_import_points_down():
    found = upward_imports()
    assert not found, "imports that climb a layer:\n" + "\n".join(found)


def test_the_top_holds_packages_and_a_handful_of_modules():
    modules = sorted(p.stem for p in LIB.glob("*.py"))
    assert modules == ["__init__", "__main__", "cli", "ingest", "notebook"]
    packages = {p.name for p in LIB.iterdir() if (p / "__init__.py").is_file()}
    assert packages == {pkg for layer in LAYERS for pkg in layer} - set(modules)


@pytest.mark.parametrize("snippet, expected", [
    ("from specbook.core.errors import X", ["specbook.core.errors"]),
    ("def f():\n    from specbook import harness\n", ["specbook.harness"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import specbook.run.runner\n", ["specbook.run.runner"]),
])
def test_the_reader_sees_every_kind_of_import(tmp_path, snippet, expected, monkeypatch):
    path = LIB / "core" / "_probe_for_test.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: snippet)
    assert [m for _, m in imports_of(path)] == expected
