"""Which side saturated: the engine, or the measuring client (issue 29).

A curve that stops growing may have met the engine's limit or the client's: a client whose event loop is busy
most of the window (running or waiting for a core, serve.clientcpu.SATURATED_SHARE of it or more) delivers chunks late and sends the next
request late, and the curve's top is then the client's. Per arm, the windows at and past the saturation level
(or at the top level, where the curve still grows) are read: CLIENT-BOUND when any of them had a saturated
client, ENGINE-BOUND when none did, None when the windows carry no client figures (runs from before them).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

ENGINE_BOUND = "ENGINE-BOUND"
CLIENT_BOUND = "CLIENT-BOUND"


@dataclass(frozen=True)
class Bound:
    word: str  # ENGINE_BOUND or CLIENT_BOUND
    levels: list[int]  # the levels read
    saturated_windows: int  # of them, windows whose client was saturated
    windows: int
    max_busy_share: float

    def text(self) -> str:
        return f"{self.word}: {self.client_text()}"

    def client_text(self) -> str:
        """What the client's figures say, without the word (a capacity reading may name the server's bound)."""
        lv = ", ".join(map(str, self.levels))
        if self.word == CLIENT_BOUND:
            return (f"the client's event loop was saturated in {self.saturated_windows} of {self.windows} windows "
                    f"at level {lv} (busy up to {self.max_busy_share:.0%} of a window)")
        return (f"the client's event loop stayed below saturation at level {lv} (busy at most "
                f"{self.max_busy_share:.0%} of a window)")


def read_windows(windows: pd.DataFrame, arm: str, saturation_level: int | None) -> pd.DataFrame:
    """The arm's windows a bound is read from: at and past its saturation level, or at its top level where the curve
    still grows."""
    w = windows[windows["arm"] == arm] if len(windows) else windows
    if not len(w):
        return w
    return w[w["level"] >= saturation_level] if saturation_level is not None else w[w["level"] == w["level"].max()]


def bound(windows: pd.DataFrame, arm: str, saturation_level: int | None) -> Bound | None:
    """The bound of `arm`'s curve from its windows' client_* columns; None without them."""
    if "client_saturated" not in windows.columns or "client_loop_share" not in windows.columns:
        return None
    read = read_windows(windows, arm, saturation_level)
    read = read[read["client_loop_share"].notna()] if len(read) else read
    if not len(read):
        return None
    hit = int(read["client_saturated"].fillna(False).astype(bool).sum())
    busy = read["client_busy_share"] if "client_busy_share" in read.columns else read["client_loop_share"]
    return Bound(CLIENT_BOUND if hit else ENGINE_BOUND, sorted(int(x) for x in set(read["level"])), hit, len(read),
                 float(busy.max()))
