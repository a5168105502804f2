"""DataFrames of a parsed vLLM log: one row per SpecDecoding interval (with the stats line logged with it),
one row per stats line."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from specbook.core.acceptance import position_column, position_columns
from specbook.engines.vllm.counts import IntervalRows
from specbook.engines.vllm.records import EngineStatsInterval, ParsedLog, SpecDecodingInterval

if TYPE_CHECKING:
    import pandas as pd

# Stats and SpecDecoding lines of one interval are logged by the same call, so at most a second apart.
_SAME_INTERVAL_S = 1.0
_HEAD_COLUMNS = ["line_no", "timestamp", "timestamp_text", "engine", "al", "accepted_tokens", "draft_tokens",
                 "drafts", "k", "accepted_throughput", "drafted_throughput", "acceptance_rate"]
_STATS_COLUMNS = ["stats_line_no", "running", "waiting", "prompt_throughput", "generation_throughput",
                  "kv_cache_usage"]


def intervals_frame(parsed: ParsedLog) -> pd.DataFrame:
    """One row per SpecDecoding interval, joined with the stats line logged with it.

    Columns: line_no, timestamp, timestamp_text, engine, al (the printed "Mean acceptance length"),
    accepted_tokens, draft_tokens, drafts (recovered, see recover_drafts), k, accepted_throughput,
    drafted_throughput, acceptance_rate (the printed "Avg Draft acceptance rate", a fraction),
    accepted_pos_1 .. accepted_pos_K (accepted tokens at each position, counts, see IntervalRows.counts;
    NaN past an interval's own k), then the joined stats line: stats_line_no, running, waiting,
    prompt_throughput, generation_throughput, kv_cache_usage.

    The stats line joined is the nearest preceding one, kept only when its timestamp is the same
    (or within a second): `running`/`waiting` then describe the batch during that interval, which the
    steady-state filter needs.
    """
    import pandas as pd

    max_k = max((i.num_speculative_tokens for i in parsed.spec_decoding), default=0)
    pos_columns = [position_column(p) for p in range(1, max_k + 1)]
    figures = IntervalRows()
    for interval in parsed.spec_decoding:
        figures.add(interval.mean_acceptance_length, interval.accepted_tokens, interval.drafted_tokens,
                    interval.per_position_acceptance)
    drafts_all, counts_all, _ = figures.counts()
    joined = _joined_stats(parsed.spec_decoding, parsed.engine_stats)
    rows = []
    for n, (interval, stats) in enumerate(zip(parsed.spec_decoding, joined, strict=True)):
        drafts = int(drafts_all[n])
        counts = counts_all[n, : interval.num_speculative_tokens].tolist()
        row = [
            interval.line_no, interval.timestamp, interval.timestamp_text, interval.engine,
            interval.mean_acceptance_length, interval.accepted_tokens, interval.drafted_tokens, drafts,
            interval.num_speculative_tokens, interval.accepted_throughput, interval.drafted_throughput,
            interval.avg_draft_acceptance_rate,
            *[float(c) for c in counts], *[math.nan] * (max_k - len(counts)),
        ]  # fmt: skip
        if stats is None:
            row += [None] * len(_STATS_COLUMNS)
        else:
            row += [stats.line_no, stats.running, stats.waiting, stats.prompt_throughput,
                    stats.generation_throughput, stats.kv_cache_usage]
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[*_HEAD_COLUMNS, *pos_columns, *_STATS_COLUMNS])
    return _intervals_dtypes(frame)


def _joined_stats(intervals: list[SpecDecodingInterval], engine_stats: list[EngineStatsInterval]
                  ) -> list[EngineStatsInterval | None]:
    """For each interval, the nearest stats line before it, where it was logged within a second of it."""
    stats_by_line = sorted(engine_stats, key=lambda s: s.line_no)
    joined: list[EngineStatsInterval | None] = []
    cursor = -1
    for interval in intervals:
        while cursor + 1 < len(stats_by_line) and stats_by_line[cursor + 1].line_no < interval.line_no:
            cursor += 1
        stats = stats_by_line[cursor] if cursor >= 0 else None
        if stats is not None and interval.timestamp is not None and stats.timestamp is not None:
            if abs((interval.timestamp - stats.timestamp).total_seconds()) > _SAME_INTERVAL_S:
                stats = None
        joined.append(stats)
    return joined


def _intervals_dtypes(frame: pd.DataFrame) -> pd.DataFrame:
    for name in ("stats_line_no", "running", "waiting"):
        frame[name] = frame[name].astype("Int64")
    for name in ("al", "accepted_throughput", "drafted_throughput", "acceptance_rate",
                 *position_columns(frame.columns), "prompt_throughput", "generation_throughput", "kv_cache_usage"):
        frame[name] = frame[name].astype("float64")
    for name in ("line_no", "accepted_tokens", "draft_tokens", "drafts", "k"):
        frame[name] = frame[name].astype("int64")
    return frame


def engine_stats_frame(parsed: ParsedLog) -> pd.DataFrame:
    """One row per stats line (extra fields as `extra_<key>` columns)."""
    import pandas as pd

    rows = []
    for s in parsed.engine_stats:
        row = {
            "line_no": s.line_no,
            "timestamp": s.timestamp,
            "timestamp_text": s.timestamp_text,
            "engine": s.engine,
            "prompt_throughput": s.prompt_throughput,
            "generation_throughput": s.generation_throughput,
            "running": s.running,
            "waiting": s.waiting,
            "swapped": s.swapped,
            "kv_cache_device": s.kv_cache_device,
            "kv_cache_usage": s.kv_cache_usage,
            "prefix_cache_hit_rate": s.prefix_cache_hit_rate,
        }
        row.update({f"extra_{k}": v for k, v in s.extra.items()})
        rows.append(row)
    return pd.DataFrame(rows)
