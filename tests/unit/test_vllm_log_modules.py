"""The modules of the vLLM log parser (engines/vllm: logpatterns, timestamps, counts, records, lineparser,
blockscan, frames, upgrades, logparse) import one another in one direction and only by public names.

Every `from specbook... import` is read from the source, at module level or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "lib" / "specbook" / "engines" / "vllm"
PREFIX = "specbook.engines.vllm."


def imports_of(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every `from specbook... import names` in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specbook"):
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.startswith("specbook")]
    return found


def package_graph() -> dict[str, set[str]]:
    """Module of this package -> the modules of this package it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        edges = graph.setdefault(path.stem, set())
        for _, module, names in imports_of(path):
            if module == "specbook.engines.vllm":  # from specbook.engines.vllm import blockscan
                edges.update(n for n in names if (PACKAGE / f"{n}.py").is_file())
            elif module.startswith(PREFIX):
                edges.add(module[len(PREFIX):].split(".")[0])
    return graph


def test_no_module_imports_a_private_name_of_another():
    found = [f"{path.name}:{line} imports {name} from {module}"
             for path in sorted(PACKAGE.glob("*.py"))
             for line, module, names in imports_of(path)
             for name in names if name.startswith("_")]
    assert not found, "\n".join(found)


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of imports (its modules, the first again at the end), None where there is none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return None
        for other in sorted(graph.get(module, ())):
            if (found := visit(other, [*path, module])) is not None:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        if (found := visit(module, [])) is not None:
            return found
    return None


def test_the_cycle_check_finds_one():
    assert cycle({"logparse": {"blockscan"}, "blockscan": {"records", "logparse"}, "records": set()}) == [
        "blockscan", "logparse", "blockscan"]
    assert cycle({"logparse": {"blockscan", "records"}, "blockscan": {"records"}, "records": set()}) is None


def test_the_modules_import_one_another_without_a_cycle():
    graph = package_graph()
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])
    # logparse names the parts (other code imports them from it), and no part imports it back
    assert graph["logparse"] >= {"blockscan", "lineparser", "frames", "upgrades"}
    assert not any("logparse" in graph[m] for m in ("blockscan", "lineparser", "records", "counts", "frames",
                                                     "upgrades", "logpatterns", "timestamps"))
