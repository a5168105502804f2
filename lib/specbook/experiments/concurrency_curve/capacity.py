"""What the server itself held back at a level: its running, waiting and KV cache figures (issue 30).

A curve that stops growing on the server's side (not the client's: bound.py) is read in the engine's log
intervals at the levels where it stopped (or at its top):
- its KV cache filled, and the engine queued or preempted what did not fit: KV CACHE FULL AT N, a capacity limit;
- the engine was not fed: it ran far fewer requests at once than the client had in flight, with none waiting in
  its own queue and room in its KV cache, so the rest waited before its scheduler, in the server's front end. This
  says where requests waited, not what bounds tok/s: a server that fed them sooner may only lengthen its steps
  (the H100 curve's probe with four API server processes did), so it is a line of the reading, not a verdict word;
- or every request ran at once, and the steps bound the throughput.
Per window: the most requests the engine reported running at once, the most waiting, and its peak KV cache usage
(the fraction of the KV pool in use). A window was fed when its engine ran at least `min_running_fraction` of the
level at once (the cut of the steady log intervals). Waiting requests alone say nothing: between two waves of a
level, new requests wait a step to be admitted. Engines whose log carries none of these (llama.cpp, or vLLM with
more than one API server process, which turns its stats logging off) give NaN, and no capacity reading.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbook.experiments.concurrency_curve.bound import read_windows

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


def _joined(values: list[float], fmt: str) -> str:
    return ", ".join(format(v, fmt) for v in values)


def kv_full(row: pd.Series | dict, kv_full_fraction: float = KV_FULL_FRACTION) -> bool:
    kv = row["peak_kv_usage"]
    return bool(np.isfinite(kv) and kv >= kv_full_fraction)


def fed(row: pd.Series | dict, min_running_fraction: float) -> bool | None:
    """Whether the engine ran at least min_running_fraction x the level at once; None without a running count."""
    run = row["peak_running"]
    return None if not np.isfinite(run) else bool(run >= min_running_fraction * row["level"])


@dataclass(frozen=True)
class Capacity:
    """One arm's windows read for what held a level back (`levels`: the windows read, as bound.read_windows)."""

    kv_full_level: int | None  # the lowest level at which a window's KV usage reached kv_full_fraction
    levels: list[int]
    running: list[float]  # per level read: the most requests the engine ran at once
    waiting: list[float]  # per level read: the most waiting in the engine's queue
    kv_usage: list[float]  # per level read: the peak KV usage (fraction of the pool)
    ttft_ms: list[float]  # per level read: the mean over sweeps of the window's median time to first token
    unfed: bool  # every window read ran below min_running_fraction of its level, none waiting, KV not full
    kv_full_fraction: float
    min_running_fraction: float

    @property
    def word(self) -> str | None:
        """KV CACHE FULL AT N where the KV cache filled, else None (the client's side names the bound)."""
        return f"KV CACHE FULL AT {self.kv_full_level}" if self.kv_full_level is not None else None

    def text(self, saturated: bool = True) -> str:
        lv = ", ".join(map(str, self.levels))
        ran = f"at {lv} the engine ran at most {_joined(self.running, '.0f')} at once"
        kv = f"KV cache at most {_joined(self.kv_usage, '.1%')} in use (full from {self.kv_full_fraction:.0%})"
        if self.kv_full_level is not None:
            return f"{ran}; {kv}: the KV cache filled at {self.kv_full_level}"
        if self.unfed:
            return (f"{ran}, none waiting in its queue; {kv}: the other requests in flight waited before its "
                    f"scheduler, in the server's front end (median TTFT {_joined(self.ttft_ms, '.0f')} "
                    "ms); whether a server that fed them sooner would turn them into more tok/s, this reading cannot "
                    "tell")
        fed_text = f"{ran} (fed: {self.min_running_fraction:.0%} of the level or more); {kv}"
        return fed_text + (": every request ran, and the steps bound the throughput" if saturated else "")


def capacity(windows: pd.DataFrame, arm: str, saturation_level: int | None,
             kv_full_fraction: float = KV_FULL_FRACTION, min_running_fraction: float = 0.75) -> Capacity | None:
    """The arm's capacity reading from its windows' PEAKS columns, at the levels bound.read_windows reads; None
    when its engine's log gave none."""
    w = windows[windows["arm"] == arm] if len(windows) else windows
    if not len(w) or not all(c in w.columns for c in PEAKS) or w[list(PEAKS)].isna().all().all():
        return None
    full = sorted({int(r["level"]) for _, r in w.iterrows() if kv_full(r, kv_full_fraction)})
    read = read_windows(windows, arm, saturation_level)
    per = read.groupby("level", sort=True)
    fed_flags = [fed(r, min_running_fraction) for _, r in read.iterrows()]
    unfed = (bool(fed_flags) and all(f is False for f in fed_flags) and not full
             and bool((read["peak_waiting"].fillna(0) == 0).all()))
    ttft = per["ttft_ms"].mean() if "ttft_ms" in read.columns else pd.Series(np.nan, index=per.size().index)
    return Capacity(full[0] if full else None, [int(x) for x in per.size().index],
                    [float(x) for x in per["peak_running"].max()], [float(x) for x in per["peak_waiting"].max()],
                    [float(x) for x in per["peak_kv_usage"].max()], [float(x) for x in ttft], unfed,
                    kv_full_fraction, min_running_fraction)


def capacity_table(windows: pd.DataFrame) -> pd.DataFrame:
    """Per arm and level, over its sweeps: the most requests running at once, the most waiting, and the peak KV
    usage in % of the pool (what the report's capacity table shows)."""
    if not len(windows) or not all(c in windows.columns for c in PEAKS):
        return pd.DataFrame()
    g = windows.groupby(["arm", "level"], sort=True)
    return pd.DataFrame({"peak running": g["peak_running"].max(), "peak waiting": g["peak_waiting"].max(),
                         "peak KV usage %": 100 * g["peak_kv_usage"].max(), "windows": g.size()}).reset_index()
