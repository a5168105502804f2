"""The device calls that carry the kits' parts and pack.sh's pieces to the lent GPU, in order.

A device call carries the working tree and at most 8 further paths, 64 MiB in all. Each kit part (SGLang's
s0.., vLLM's p0..) takes one call with one piece (x0..) beside it; pieces left over (a carried llama.cpp build
is 49 MB) go first, in calls of their own, as many as fit beside the tree. The last call carries the last kit
part: its command goes on to `book.sh start`, whose install needs every part in /tmp/vc.

Usage (pack.sh runs it): carry_plan.py OUT_DIR TREE_BYTES [REL_PREFIX]  -> writes OUT_DIR/CARRY_PLAN, prints it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

TRANSFER_LIMIT = 64 * 1024 * 1024
MAX_CARRY_PATHS = 8


class CarryPlanError(ValueError):
    """The parts and pieces cannot be carried within a transfer's limits."""


def _numbered(out: Path, prefix: str) -> list[Path]:
    found = [p for p in out.iterdir() if p.is_dir() and re.fullmatch(rf"{prefix}\d+", p.name)]
    return sorted(found, key=lambda p: int(p.name[1:]))


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def plan(out: Path, tree_bytes: int, limit: int = TRANSFER_LIMIT) -> list[list[str]]:
    """The calls, each a list of folder names under `out` (kit part first, then its piece)."""
    kits = _numbered(out, "s") + _numbered(out, "p")
    pieces = _numbered(out, "x")
    calls: list[list[str]] = []
    leftover = pieces[len(kits):]
    if leftover:
        per_call = min(MAX_CARRY_PATHS, (limit - tree_bytes) // max(_size(p) for p in leftover))
        if per_call < 1:
            raise CarryPlanError(f"{out}: no piece fits beside the working tree ({tree_bytes} bytes)")
        calls += [[p.name for p in leftover[i:i + per_call]] for i in range(0, len(leftover), per_call)]
    for i, kit in enumerate(kits):
        calls.append([kit.name] + ([pieces[i].name] if i < len(pieces) else []))
    for call in calls:
        total = transfer_bytes(out, call, tree_bytes)
        if total > limit:
            raise CarryPlanError(f"{out}: the call carrying {', '.join(call)} holds {total} bytes with the tree "
                                 f"(limit {limit}): smaller kit parts or pieces")
    return calls


def transfer_bytes(out: Path, call: list[str], tree_bytes: int) -> int:
    """What one call carries: the working tree and its folders."""
    return tree_bytes + sum(_size(out / name) for name in call)


def render(calls: list[list[str]], rel: str) -> str:
    lines = []
    for n, call in enumerate(calls, 1):
        carry = ", ".join(f'"{rel}/{name}"' for name in call)
        copy = " && ".join(f"cp -r {rel}/{name}/. /tmp/vc/" for name in call)  # one cp per folder: sums share names
        lines += [f"call {n}: carry [{carry}]", f"  mkdir -p /tmp/vc && {copy}"]
    lines.append("  ... and the last call's command goes on: && bash scripts/h200/book.sh start WAIT_S "
                 "(BOOK_RUNS etc. before it)")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    out, tree = Path(argv[0]), int(argv[1])
    try:
        calls = plan(out, tree)
    except CarryPlanError as e:
        print(f"carry_plan.py: {e}", file=sys.stderr)
        return 1
    if not _numbered(out, "s") + _numbered(out, "p"):
        print(f"note: no kit part in {out} yet: the plan holds the pieces only (prepare the kits, then pack again)",
              file=sys.stderr)
    text = render(calls, argv[2] if len(argv) == 3 else str(out))
    (out / "CARRY_PLAN").write_text(text)
    print(text, end="")
    largest = max((transfer_bytes(out, c, tree) for c in calls), default=tree)
    print(f"{len(calls)} carrying calls ({out / 'CARRY_PLAN'}); the largest transfer {largest} bytes with the "
          f"working tree's {tree} (limit {TRANSFER_LIMIT})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
