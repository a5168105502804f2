"""Timestamps of vLLM log lines, which vLLM logs as `MM-DD HH:MM:SS` with no year.

Each gets the reference year (the file's modification year by default, `reference_year`), stepping one
year each time a month is lower than the previous one (a log running past New Year). The months followed
are those of the timestamps the parser reads: the first timestamped line's, then those of the
SpecDecoding and stats lines; the last timestamped line takes the year they reached. A stray line with
another month in between changes no record's year.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path


class Timestamps:
    """Turns 'MM-DD HH:MM:SS' into datetimes from a reference year, stepping the year when the month wraps.

    Calling it commits the month (the parser read that timestamp); `peek` gives the datetime the same
    text would get now without committing. An impossible date (02-30) gives None and commits nothing.
    """

    def __init__(self, year: int):
        self.year = year
        self.last_month = 0
        self._cache: tuple[str, datetime | None] | None = None
        self.months: list[int] = []  # the months committed, in order (a run of one month once)
        # a 02-29 was read: valid or not depending on the year (see blockscan.summarise_parallel)
        self.leap_day = False

    def _resolve(self, text: str) -> tuple[datetime | None, int]:
        try:
            month, day = int(text[0:2]), int(text[3:5])
            hour, minute, second = int(text[6:8]), int(text[9:11]), int(text[12:14])
            year = self.year + 1 if month < self.last_month else self.year  # Dec 31 -> Jan 1 inside one log
            return datetime(year, month, day, hour, minute, second), year
        except ValueError:
            return None, self.year

    def __call__(self, text: str) -> datetime | None:
        cache = self._cache
        if cache is not None and cache[0] == text:  # the same text again: the same month, nothing to step
            return cache[1]
        stamp, year = self._resolve(text)
        if stamp is not None:
            self.year, self.last_month = year, stamp.month
            if not self.months or self.months[-1] != stamp.month:
                self.months.append(stamp.month)
        self.leap_day = self.leap_day or text.startswith("02-29")
        self._cache = (text, stamp)
        return stamp

    def peek(self, text: str) -> datetime | None:
        self.leap_day = self.leap_day or text.startswith("02-29")
        return self._resolve(text)[0]

    def replay(self, month: int) -> None:
        """Commit a month another reader committed (a valid date of that month), as __call__ would."""
        if month < self.last_month:
            self.year += 1
        self.last_month = month
        self._cache = None


def reference_year(path: Path) -> int:
    """The year a log file's timestamps start from: its modification year."""
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).year


def this_year() -> int:
    """The year lines given without a file start from."""
    return datetime.now(timezone.utc).year
