"""Frames saved by older specbook versions, read in today's columns.

Run folders keep the intervals frame as it was written (tests/golden, docs/reports); an old one is upgraded
where it is read, so old runs keep loading and rendering."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from specbook.core.acceptance import position_column
from specbook.core.errors import IngestError
from specbook.engines.vllm.counts import position_table

if TYPE_CHECKING:
    import pandas as pd

# Frames saved by the code before the acceptance model: old name -> new name.
_OLD_COLUMNS = {"mean_acceptance_length": "al", "drafted_tokens": "draft_tokens", "num_speculative_tokens": "k",
                "avg_draft_acceptance_rate": "acceptance_rate"}
_OLD_RATE_RE = re.compile(r"^acceptance_pos_(\d+)$")


def upgrade_intervals_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame saved by intervals_frame before the acceptance model (columns mean_acceptance_length,
    drafted_tokens, num_speculative_tokens, avg_draft_acceptance_rate and per-position RATES
    acceptance_pos_0..) in the columns intervals_frame gives now; a frame in the new columns as it is.

    Per-position counts come from the saved rates and drafts by position_table, the rule the parser
    itself applies to the rates it reads (round(rate x drafts) below 1000 drafts, else rate x drafts);
    columns other than those renamed keep their place and values.
    """
    old_rates = sorted((int(m.group(1)), c) for c in frame.columns if (m := _OLD_RATE_RE.match(str(c))))
    if not old_rates and not any(c in frame.columns for c in _OLD_COLUMNS):
        return frame
    if old_rates and "drafts" not in frame.columns:
        raise IngestError(f"an old intervals frame with per-position rates needs its drafts column; it has "
                          f"{list(frame.columns)}")
    import pandas as pd

    rate_columns = [c for _, c in old_rates]
    new_pos = {c: position_column(p + 1) for p, c in old_rates}
    if rate_columns:  # the rule the parser applies to the rates it reads (NaN where no rate was saved)
        counts = position_table(frame[rate_columns].to_numpy(dtype=float, na_value=math.nan),
                                frame["drafts"].to_numpy(dtype=float, na_value=math.nan))
    columns: dict[str, pd.Series] = {}
    for c in frame.columns:
        if c in new_pos:
            columns[new_pos[c]] = pd.Series(counts[:, rate_columns.index(c)], index=frame.index, dtype="float64")
        else:
            columns[_OLD_COLUMNS.get(c, c)] = frame[c]
    return pd.DataFrame(columns, index=frame.index)
