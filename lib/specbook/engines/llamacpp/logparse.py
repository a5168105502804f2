"""llama-server's log lines: the per-request draft statistics (what its log says of acceptance).

    slot print_timing: id  0 | task 0 | draft acceptance = 0.58621 (   17 accepted /    29 generated), mean len =  2.21

One line per finished request with speculation. "draft acceptance" is the acceptance rate (accepted /
drafted tokens); "mean len" is AL as the acceptance model defines it, printed to two decimals, so the
draft count is recovered from it only approximately, and not at all for a request with 0 accepted
tokens (mean len 1.00 then fits any count): drafts come from the counters, not from here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

_DRAFT_LINE = re.compile(
    r"draft acceptance = (?P<rate>[0-9.]+) \(\s*(?P<accepted>\d+) accepted /\s*(?P<generated>\d+) generated\)"
    r"(?:, mean len =\s*(?P<mean_len>[0-9.]+))?"
)


def parse_draft_lines(text: str) -> list[dict[str, float]]:
    """llama-server's per-request draft statistics lines, raw figures as printed."""
    out = []
    for m in _DRAFT_LINE.finditer(text):
        row = {"rate": float(m["rate"]), "accepted": float(m["accepted"]), "generated": float(m["generated"])}
        if m["mean_len"] is not None:
            row["mean_len"] = float(m["mean_len"])
        out.append(row)
    return out


def draft_lines_frame(lines: Iterable[str]) -> pd.DataFrame:
    """One row per draft statistics line: accepted and drafted tokens (acceptance-model names), the printed
    rate and mean len, and the line number."""
    import pandas as pd

    rows = []
    for line_no, line in enumerate(lines, start=1):
        if "draft acceptance" not in line:
            continue
        for m in _DRAFT_LINE.finditer(line):
            rows.append({"line_no": line_no, "accepted_tokens": int(m["accepted"]), "draft_tokens": int(m["generated"]),
                         "printed_rate": float(m["rate"]),
                         "printed_al": float(m["mean_len"]) if m["mean_len"] is not None else None})
    return pd.DataFrame(rows, columns=["line_no", "accepted_tokens", "draft_tokens", "printed_rate", "printed_al"])
