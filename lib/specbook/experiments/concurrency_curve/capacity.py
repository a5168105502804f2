"""What the server itself held back at a level: its running, waiting and KV cache figures (issue 30).

A curve ends for one of two reasons on the engine's side: tok/s stops growing while every request still runs
(the steps get dearer), or the engine cannot hold the level: its KV cache fills, and it queues or preempts what
does not fit. The engine's log intervals tell them apart. Per window: the most requests it reported running at
once, the most waiting, and its peak KV cache usage (the fraction of the KV pool in use). A level filled the KV
cache when a window's usage reached `kv_full_fraction`. Waiting requests alone say nothing: between two waves of a
level, new requests wait a step to be admitted. Engines whose log carries none of these (llama.cpp) give NaN, and
no capacity line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

PEAKS = ("peak_running", "peak_waiting", "peak_kv_usage")
# the usage from which the pool counts as full: vLLM's log rounds to 0.1% and keeps a little headroom unused
KV_FULL_FRACTION = 0.95


def _peak(frame: pd.DataFrame, col: str) -> float:
    if col not in frame.columns:
        return float("nan")
    vals = pd.to_numeric(frame[col], errors="coerce").dropna()
    return float(vals.max()) if len(vals) else float("nan")


def window_peaks(intervals: pd.DataFrame) -> dict[str, float]:
    """One window's log intervals -> its peak running, peak waiting and peak KV usage (fraction 0..1)."""
    return {"peak_running": _peak(intervals, "running"), "peak_waiting": _peak(intervals, "waiting"),
            "peak_kv_usage": _peak(intervals, "kv_cache_usage")}


def with_peaks(windows: pd.DataFrame, intervals: pd.DataFrame) -> pd.DataFrame:
    """`windows` with the PEAKS columns, read from each window's log intervals where a row lacks them (runs made
    before the rows carried them)."""
    out = windows.copy()
    for col in PEAKS:
        if col not in out.columns:
            out[col] = np.nan
    missing = out[list(PEAKS)].isna().all(axis=1)
    if missing.any() and len(intervals) and "window_id" in intervals.columns:
        by_window = {wid: g for wid, g in intervals.groupby("window_id")}
        for i in out.index[missing]:
            g = by_window.get(out.at[i, "window_id"])
            if g is not None:
                for col, v in window_peaks(g).items():
                    out.at[i, col] = v
    return out


def kv_full(row: pd.Series | dict, kv_full_fraction: float = KV_FULL_FRACTION) -> bool:
    kv = row["peak_kv_usage"]
    return bool(np.isfinite(kv) and kv >= kv_full_fraction)


@dataclass(frozen=True)
class Capacity:
    """One arm's windows read for what held a level back."""

    kv_full_level: int | None  # the lowest level at which a window's KV usage reached kv_full_fraction
    top_level: int
    top_kv_usage: float  # the highest KV usage of the top level's windows
    top_running: float  # the most requests running at once in the top level's windows
    kv_full_fraction: float

    @property
    def word(self) -> str | None:
        return f"KV CACHE FULL AT {self.kv_full_level}" if self.kv_full_level is not None else None

    def text(self) -> str:
        kv = (f"KV cache at most {self.top_kv_usage:.1%} in use at {self.top_level}"
              if np.isfinite(self.top_kv_usage) else f"no KV usage in the log at {self.top_level}")
        parts = [kv + (f" (full from {self.kv_full_fraction:.0%}; reached at {self.kv_full_level})"
                       if self.kv_full_level is not None else f" (full from {self.kv_full_fraction:.0%})")]
        if np.isfinite(self.top_running):
            parts.append(f"up to {self.top_running:.0f} of {self.top_level} running at once there")
        return "; ".join(parts)


def capacity(windows: pd.DataFrame, arm: str, kv_full_fraction: float = KV_FULL_FRACTION) -> Capacity | None:
    """The arm's capacity reading from its windows' PEAKS columns; None when its engine's log gave none."""
    w = windows[windows["arm"] == arm] if len(windows) else windows
    if not len(w) or not all(c in w.columns for c in PEAKS) or w[list(PEAKS)].isna().all().all():
        return None
    full = sorted({int(r["level"]) for _, r in w.iterrows() if kv_full(r, kv_full_fraction)})
    top = int(w["level"].max())
    t = w[w["level"] == top]
    return Capacity(full[0] if full else None, top, _peak(t, "peak_kv_usage"), _peak(t, "peak_running"),
                    kv_full_fraction)


def capacity_table(windows: pd.DataFrame) -> pd.DataFrame:
    """Per arm and level, over its sweeps: the most requests running at once, the most waiting, and the peak KV
    usage in % of the pool (what the report's capacity table shows)."""
    if not len(windows) or not all(c in windows.columns for c in PEAKS):
        return pd.DataFrame()
    g = windows.groupby(["arm", "level"], sort=True)
    out = pd.DataFrame({"peak running": g["peak_running"].max(), "peak waiting": g["peak_waiting"].max(),
                        "peak KV usage %": 100 * g["peak_kv_usage"].max(), "windows": g.size()}).reset_index()
    return out
