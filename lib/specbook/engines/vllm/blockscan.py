"""The block reader of vLLM server logs: what makes `specbook ingest` fast on CI logs of hundreds of MB.

A log is read in large binary blocks; newlines are counted per block, and only the lines that can matter
(`SpecDecoding metrics:`, `Engine NNN:` stats, the `Env:` line, the first and last timestamped lines) are
found with bytes.find and one exact-layout regex each (logpatterns.layout_regexes); any other candidate
goes through the per-line parser (lineparser.LineParser.record), so both readers give the same records,
counts and line numbers (tests/unit/test_ingest_fastpath.py). A large log's summary is read by several processes at
once and merged exactly.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from specbook.core.envline import ENV_PREFIX
from specbook.core.errors import IngestError
from specbook.engines.vllm.counts import CountSums
from specbook.engines.vllm.lineparser import LineParser, open_log
from specbook.engines.vllm.logpatterns import (
    ENV_LINE,
    SPEC_DECODING_PREFIX,
    SPEC_GROUPS,
    SPEC_LINE,
    STATS_GROUPS,
    STATS_LINE,
    STATS_MARKER,
    header_stamp,
    layout_regexes,
)
from specbook.engines.vllm.records import (
    BrokenLine,
    Collector,
    EngineStatsInterval,
    SpecDecodingInterval,
    UnknownLine,
)
from specbook.engines.vllm.timestamps import Timestamps

BLOCK_SIZE = 1 << 19  # bytes read at a time (a few passes run over each: small enough to stay in cache); a
# longer line grows the buffer to hold it

_FLUSH_ROWS = 4096  # SpecDecoding rows summed at a time (numpy's per-call cost spread over many)
_SPEC_MARKER = SPEC_DECODING_PREFIX.encode()
_STATS_MARKER = STATS_MARKER.encode()
_ENV_BYTES = ENV_PREFIX.encode()
_NEWLINE, _ENV_FIRST = 10, _ENV_BYTES[0]
# A header needs one of these (after colour codes are stripped, hence ESC).
_HEADER_WORDS = (b"INFO", b"WARNING", b"DEBUG", b"ERROR", b"CRITICAL", b"\x1b")


def _read_blocks(handle: BinaryIO, block_size: int, limit: int | None = None) -> Iterator[tuple[bytearray, int]]:
    """(buffer, end): buffer[:end] holds whole lines, each ending in b"\\n" (one is added after a last line
    that has none), read from the handle's position on, `limit` bytes at most. The buffer is reused: use it
    before asking for the next block."""
    buf = bytearray(block_size)
    filled = 0
    left = math.inf if limit is None else limit
    while True:
        if filled == len(buf):  # one line longer than the buffer: grow it to hold the line
            buf.extend(bytes(len(buf)))
        with memoryview(buf) as view:
            n = handle.readinto(view[filled : filled + int(min(len(buf) - filled, left))]) if left else 0
        left -= n
        if not n:
            if filled:
                if buf[filled - 1] != _NEWLINE:
                    if filled == len(buf):
                        buf.append(_NEWLINE)
                    else:
                        buf[filled] = _NEWLINE
                    filled += 1
                yield buf, filled
            return
        filled += n
        cut = buf.rfind(b"\n", 0, filled) + 1
        if not cut:
            continue
        yield buf, cut
        rest = filled - cut
        if rest:
            buf[:rest] = buf[cut:filled]
        filled = rest


def _marker_lines(buf: bytearray, end: int, marker: bytes, regex: re.Pattern[bytes], marker_group: int
                  ) -> list[tuple[int, re.Match[bytes] | None]]:
    """(line start, match or None) of each line of buf[:end] holding the marker: the match of the whole
    line when it is in vLLM's exact layout with the marker where the layout puts it, else None."""
    out: list[tuple[int, re.Match[bytes] | None]] = []
    find, rfind, match = buf.find, buf.rfind, regex.match
    p = find(marker, 0, end)
    while p >= 0:
        ls = rfind(b"\n", 0, p) + 1
        m = match(buf, ls, end)
        if m is not None and m.start(marker_group) == p:
            out.append((ls, m))
            p = find(marker, m.end(), end)
        else:
            out.append((ls, None))
            p = find(marker, find(b"\n", p, end) + 1, end)
    return out


class _BlockScan:
    """The block reader: feeds a Collector from a file's blocks, with the per-line reader's results."""

    def __init__(self, out: Collector, year: int, *, commit_first: bool = True):
        self.out = out
        self.parser = LineParser(year)
        self.lines_before = 0  # lines in the blocks already read
        self.offset = 0  # bytes in the blocks already read
        self.line_starts = _LineStarts()
        # Where the scan starts the file, its first timestamped line steps the year (commit_first); a part
        # read elsewhere keeps that line's timestamp text for the reader of the whole file to commit.
        self.commit_first = commit_first
        self.first_text: str | None = None
        self.parser.first_read = not commit_first

    def block(self, buf: bytearray, end: int) -> None:
        n_lines, env_starts = self.line_starts(buf, end)
        parser = self.parser
        if self.first_text is None and (not parser.first_read or not self.commit_first):
            self._first_timestamp(buf, end)
        month = parser.timestamps.last_month
        spec_re, stats_re = layout_regexes(month, buf.find(b"\x1b", 0, end) >= 0)
        spec = _marker_lines(buf, end, _SPEC_MARKER, spec_re, SPEC_GROUPS["marker"])
        stats = _marker_lines(buf, end, _STATS_MARKER, stats_re, STATS_GROUPS["marker"])
        if not self.out.keep_records and self._regular(buf, spec, stats, env_starts) and self._sum_regular(spec, stats):
            for ls in env_starts:  # checked by _regular: none is broken
                self.out.add(self.parser.env_record(0, _line_text(buf, ls)))
        elif spec or stats or env_starts:
            events = [(ls, SPEC_LINE, m) for ls, m in spec] + [(ls, STATS_LINE, m) for ls, m in stats]
            events += [(ls, ENV_LINE, None) for ls in env_starts]
            events.sort(key=_event_order)
            self._ordered(buf, events, month)
        if len(self.out.sums.pending) >= _FLUSH_ROWS:
            self.out.sums.flush()
        self.lines_before += n_lines
        self.offset += end

    # -- a block whose every candidate line is in vLLM's layout and this month (summaries only) -------------
    def _regular(self, buf: bytearray, spec: list[tuple[int, Any]], stats: list[tuple[int, Any]],
                 env_starts: list[int]) -> bool:
        if any(m is None for _, m in spec) or any(m is None for _, m in stats):
            return False
        env_record = self.parser.env_record
        # Env lines only count (the first gives the env) unless one is broken (broken lines keep their order)
        return not any(isinstance(env_record(0, _line_text(buf, ls)), BrokenLine) for ls in env_starts)

    def _sum_regular(self, spec: list[tuple[int, Any]], stats: list[tuple[int, Any]]) -> bool:
        """The block's SpecDecoding figures, in file order, to the sums; no timestamp steps the year (all are
        in the month already read). False, and nothing added, where a number does not convert."""
        if spec:
            g = SPEC_GROUPS
            al_b, accepted_b, drafted_b, rates_b = zip(*[m.group(g["al"], g["accepted"], g["drafted"], g["rates"])
                                                         for _, m in spec], strict=True)
            try:
                al = list(map(float, al_b))
                rates = list(map(float, b", ".join(rates_b).split(b", ")))
            except ValueError:  # a number float() refuses ("1.2.3"): the block goes line by line
                return False
            if max(rates) > 1.0:  # not a rate (the regex reads no sign and no nan): LineParser.record breaks the line
                return False
            rows = self.out.sums.pending
            rows.al += al
            rows.accepted += map(int, accepted_b)
            rows.drafted += map(int, drafted_b)
            rows.rates += rates
            rows.ks += [r.count(b", ") + 1 for r in rates_b]
        self.out.intervals += len(spec)
        self.out.stats_lines += len(stats)
        if stats:
            self.parser.last_engine = _stats_engine(stats[-1][1])
        return True

    # -- any block: every candidate line in file order ---------------------------------------------------
    def _ordered(self, buf: bytearray, events: list[tuple[int, int, Any]], month: int) -> None:
        out, parser = self.out, self.parser
        timestamps = parser.timestamps
        keep = out.keep_records
        count = buf.count
        pos, line_no = 0, self.lines_before + 1  # line_no of the line starting at pos
        n, j = len(events), 0
        while j < n:
            ls, kind, m = events[j]
            j += 1
            shared = j < n and events[j][0] == ls
            while j < n and events[j][0] == ls:  # markers of two kinds in one line: LineParser.record decides
                j += 1
            line_no += count(b"\n", pos, ls)
            pos = ls
            if kind == ENV_LINE or shared:
                m = None
            elif m is not None and timestamps.last_month != month:  # a line before stepped the month
                m = _rematch(buf, ls, kind, timestamps.last_month)
            if m is None:
                self._slow(buf, ls, line_no)
                continue
            try:
                if kind == SPEC_LINE:
                    _, _, al_b, atp, dtp, acc_b, drafted_b, rates_b, rate_b = m.groups()
                    values: tuple[Any, ...] = (float(al_b), int(acc_b), int(drafted_b),
                                               list(map(float, rates_b.split(b", "))))
                    if max(values[3]) > 1.0:  # not a rate: LineParser.record breaks the line
                        raise ValueError
                    if keep:
                        values += (float(atp), float(dtp), float(rate_b))
                elif keep:
                    _, _, _, _, prompt_tp, gen_tp, running, waiting, device, usage, hit = m.groups()
                    values = (float(prompt_tp), float(gen_tp), int(running), int(waiting), device.decode(),
                              float(usage) / 100.0, float(hit) / 100.0)
            except ValueError:  # a number float() refuses ("1.2.3") or no rate: LineParser.record reads it as it reads it
                self._slow(buf, ls, line_no)
                continue
            stamp_text = m.group(1).decode()
            stamp = timestamps(stamp_text)
            if stamp is not None:
                parser.first_read = True
            if kind == SPEC_LINE:
                out.intervals += 1
                out.sums.add(*values[:4])
                if keep:
                    al, accepted, drafted, rates, atp_f, dtp_f, rate = values
                    out.spec.append(SpecDecodingInterval(
                        line_no, stamp, al, accepted, drafted, rates, atp_f, dtp_f,
                        None if math.isnan(rate) else rate / 100.0, stamp_text, parser.last_engine, {},
                    ))  # fmt: skip
            else:
                engine = _stats_engine(m)
                parser.last_engine = engine
                out.stats_lines += 1
                if keep:
                    prompt, gen, running_n, waiting_n, device_s, usage_f, hit_f = values
                    out.stats.append(EngineStatsInterval(
                        line_no, stamp, engine, prompt, gen, running_n, waiting_n, usage_f, hit_f, {}, stamp_text,
                        device_s, None,
                    ))  # fmt: skip

    def _slow(self, buf: bytearray, start: int, line_no: int) -> None:
        """One line through LineParser.record, as the per-line reader reads it."""
        record = self.parser.record(line_no, _line_text(buf, start))
        if not isinstance(record, UnknownLine):
            self.out.add(record)

    # -- first and last timestamp -------------------------------------------------------------------
    def _first_timestamp(self, buf: bytearray, end: int) -> None:
        """The first timestamped line's timestamp, if this block holds it: read (it steps the year too), or
        kept as text where the scan does not start the file."""
        timestamps = self.parser.timestamps
        for start, stop in _header_lines(buf, 0, end):
            if buf.startswith(_ENV_BYTES, start):
                continue
            text = header_stamp(buf[start:stop].decode("utf-8", errors="replace").rstrip("\r"))
            if text is None or timestamps.peek(text) is None:
                continue
            self.first_text = text
            if self.commit_first:
                self.parser.first_read = True
                self.out.first = timestamps(text)
            return

    def last_text(self, handle: BinaryIO, start: int = 0) -> str | None:
        """The timestamp text of the last timestamped line (a date in the year reached), read backwards from
        the end of what was scanned down to `start` (the file offset the scan began at)."""
        chunk_size = 1 << 16
        end = start + self.offset
        carry = b""
        while end > start:
            begin = max(start, end - chunk_size)
            handle.seek(begin)
            chunk = handle.read(end - begin) + carry
            cut = chunk.find(b"\n") + 1 if begin > start else 0  # a partial first line waits for the next chunk
            if begin > start and not cut:
                carry, end = chunk, begin
                continue
            lines = bytearray(chunk[cut:])
            for ls, le in reversed(list(_header_lines(lines, 0, len(lines)))):
                if lines.startswith(_ENV_BYTES, ls):
                    continue
                text = header_stamp(lines[ls:le].decode("utf-8", errors="replace").rstrip("\r"))
                if text is not None and self.parser.timestamps.peek(text) is not None:
                    return text
            carry, end = chunk[:cut], begin
        return None


class _LineStarts:
    """Counts a block's lines and finds the lines that begin with "Env:", with numpy, in scratch arrays
    reused from block to block (fresh ones would cost the scan more than the comparisons do)."""

    def __init__(self) -> None:
        import numpy as np

        self.np = np
        self.newline = np.empty(0, dtype=bool)
        self.env_first = np.empty(0, dtype=bool)

    def __call__(self, buf: bytearray, end: int) -> tuple[int, list[int]]:
        """Lines in buf[:end] (whole lines), and the start of each line that begins with "Env:"."""
        np = self.np
        if len(self.newline) < end:
            self.newline = np.empty(end, dtype=bool)
            self.env_first = np.empty(end, dtype=bool)
        arr = np.frombuffer(buf, dtype=np.uint8, count=end)
        newline = np.equal(arr, _NEWLINE, out=self.newline[:end])
        n_lines = int(np.count_nonzero(newline))
        env_starts = [0] if buf.startswith(_ENV_BYTES, 0, end) else []
        # after_newline[i]: the byte after a newline at i is an "E" (a line starting with "E" begins at i + 1)
        after_newline = np.equal(arr[1:], _ENV_FIRST, out=self.env_first[: end - 1])
        np.logical_and(after_newline, newline[:-1], out=after_newline)
        pos, last = 0, end - 1
        while pos < last:  # argmax: the first True from pos (few: lines starting with "E" are rare)
            i = pos + int(after_newline[pos:last].argmax())
            if not after_newline[i]:
                break
            if buf.startswith(_ENV_BYTES, i + 1, end):
                env_starts.append(i + 1)
            pos = i + 1
        return n_lines, env_starts


def _rematch(buf: bytearray, start: int, kind: int, month: int) -> re.Match[bytes] | None:
    """The line at start against the regex of this month (a line before it stepped the month)."""
    m = layout_regexes(month)[kind].match(buf, start)
    marker, group = (_SPEC_MARKER, SPEC_GROUPS["marker"]) if kind == SPEC_LINE else (_STATS_MARKER, STATS_GROUPS["marker"])
    return m if m is not None and buf.find(marker, start) == m.start(group) else None


def _line_text(buf: bytearray, start: int) -> str:
    return buf[start : buf.find(b"\n", start)].decode("utf-8", errors="replace")


def _stats_engine(m: re.Match[bytes]) -> str:
    index, count = m.group(STATS_GROUPS["index"], STATS_GROUPS["count"])
    return index.decode() if index is not None else f"aggregated:{count.decode()}"


def _event_order(event: tuple[int, int, Any]) -> tuple[int, int]:
    return event[0], event[1]


def _header_lines(buf: bytearray, start: int, end: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each line in buf[start:end] (whole lines) that holds a header word, in order."""
    nxt = {w: buf.find(w, start, end) for w in _HEADER_WORDS}
    while True:
        live = [p for p in nxt.values() if p >= 0]
        if not live:
            return
        p = min(live)
        ls = max(buf.rfind(b"\n", start, p) + 1, start)
        le = buf.find(b"\n", p, end)
        le = end if le < 0 else le
        yield ls, le
        for w, q in nxt.items():
            if 0 <= q <= le:
                nxt[w] = buf.find(w, le, end)


def scan_file(source: str | Path, *, year: int | None, keep_records: bool, keep_broken: int,
               block_size: int | None = None) -> Collector:
    path, handle, default_year = open_log(source)
    out = Collector(str(path), keep_records=keep_records, keep_broken=keep_broken)
    scan = _BlockScan(out, year or default_year)
    try:
        with handle:
            for buf, end in _read_blocks(handle, block_size or BLOCK_SIZE):
                scan.block(buf, end)
            out.total_lines = scan.lines_before
            last = scan.last_text(handle) if out.first is not None else None
            out.last = scan.parser.timestamps.peek(last) if last is not None else None
    except OSError as exc:
        raise IngestError(f"cannot read log file {path}: {exc.strerror or exc}") from exc
    return out


# --- one summary read by several processes --------------------------------------------------------------

PARALLEL_MIN_BYTES = 64 << 20  # smaller logs are read in one process (starting others costs more)
MAX_PROCESSES = 4


@dataclass(slots=True)
class _Part:
    """What one process read of a byte range of a log (whole lines): its counts, and its timestamps as text and
    months, for the reader of the whole file to put in order."""

    lines: int
    intervals: int
    stats_lines: int
    env_lines: int
    broken_lines: int
    broken: list[BrokenLine]  # line numbers counted from the range's first line
    env: dict[str, str] | None
    sums: CountSums
    first_text: str | None
    last_text: str | None
    months: list[int]
    leap_day: bool


def _scan_range(path: str, start: int, stop: int, year: int, keep_broken: int, block_size: int) -> _Part:
    out = Collector(path, keep_records=False, keep_broken=keep_broken)
    scan = _BlockScan(out, year, commit_first=False)
    with open(path, "rb") as handle:
        handle.seek(start)
        for buf, end in _read_blocks(handle, block_size, limit=stop - start):
            scan.block(buf, end)
        last = scan.last_text(handle, start)
    out.sums.flush()
    timestamps = scan.parser.timestamps
    return _Part(scan.lines_before, out.intervals, out.stats_lines, out.env_lines, out.broken_lines, out.broken,
                 out.env, out.sums, scan.first_text, last, timestamps.months, timestamps.leap_day)


def _ranges(path: Path, size: int, parts: int) -> list[tuple[int, int]]:
    """Byte ranges of about equal size, each starting a line."""
    starts = [0]
    with path.open("rb") as handle:
        for i in range(1, parts):
            handle.seek(max(size * i // parts, starts[-1]))
            handle.readline()  # to the end of the line the cut falls in
            if handle.tell() >= size:
                break
            if handle.tell() > starts[-1]:
                starts.append(handle.tell())
    return list(zip(starts, [*starts[1:], size], strict=True))


def processes_for(size: int) -> int:
    """How many processes to read a log of this size with: one for small logs, where fork is missing, or where
    this process runs threads (forking them is unsafe); else one per CPU this process may use, up to 4."""
    import multiprocessing
    import os
    import threading

    if size < PARALLEL_MIN_BYTES or threading.active_count() > 1:
        return 1
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_PROCESSES))


def summarise_parallel(path: Path, year: int, keep_broken: int, processes: int, block_size: int) -> Collector | None:
    """A summary read by `processes` processes, one byte range each, put together exactly as one reader would
    have read it: counts added, line numbers shifted, sums exact (CountSums), and the year stepped by
    replaying, in order, the months each part read. None where a part read a 02-29 (valid or not depending on
    the year the part could not know): the caller then reads the file in one process."""
    import multiprocessing

    size = path.stat().st_size
    ranges = _ranges(path, size, processes)
    if len(ranges) < 2:
        return None
    args = [(str(path), start, stop, year, keep_broken, block_size) for start, stop in ranges]
    try:
        with multiprocessing.get_context("fork").Pool(len(ranges) - 1) as pool:
            pending = [pool.apply_async(_scan_range, a) for a in args[1:]]
            parts = [_scan_range(*args[0]), *(p.get() for p in pending)]
    except OSError as exc:
        raise IngestError(f"cannot read log file {path}: {exc.strerror or exc}") from exc
    if any(part.leap_day for part in parts):
        return None
    out = Collector(str(path), keep_records=False, keep_broken=keep_broken)
    timestamps = Timestamps(year)
    last_text = None
    for part in parts:
        for broken in part.broken:
            if len(out.broken) < keep_broken:
                out.broken.append(dataclasses.replace(broken, line_no=broken.line_no + out.total_lines))
        out.total_lines += part.lines
        out.intervals += part.intervals
        out.stats_lines += part.stats_lines
        out.env_lines += part.env_lines
        out.broken_lines += part.broken_lines
        if out.env is None:
            out.env = part.env
        out.sums.merge(part.sums)
        if out.first is None and part.first_text is not None:  # the file's first timestamped line
            out.first = timestamps(part.first_text)
        for month in part.months:
            timestamps.replay(month)
        last_text = part.last_text or last_text
    out.last = timestamps.peek(last_text) if last_text is not None and out.first is not None else None
    return out


