"""How a report reads: the summary block it opens with, and tables formatted for reading.

The numbers come from the experiments' analysis (each result's `answer(params)` builds a `Summary`);
this module only words and lays them out: verdict rows with their headline figure and interval, the
evidence line, the criteria as a pass/fail list, tables without index column or truncation (wide ones
transposed), raw frames folded into <details>. Everything returns HTML text, so tests read it directly
and the notebook only displays it.
"""

from __future__ import annotations

import html
import math
import numbers
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specbook.core import verdicts

# A table wider than this many columns is transposed (one column per row) when it has few rows, or split
# into column groups that each repeat the key columns (the first group shown, the others folded).
MAX_COLUMNS = 9
LONG_TABLE_ROWS = 25  # long_table_html folds a table with more rows behind a one-line count
PASS_MARK, FAIL_MARK, NA_MARK = "\u2714", "\u2718", "\u2013"  # check, cross, en dash


@dataclass(frozen=True)
class Headline:
    """One comparison's answer: its verdict, the number behind it and that number's interval.

    A verdict drawn from an interval is a label of specbook.core.verdicts (the interval field states the margin it
    was read against); `expected` and `rule` are separate lines beside it: whether the label is what the params
    expected before the run (the green/red colour goes there, never on the label) and the stated rule's
    outcome. `why`: one plain sentence of why, from the data.
    """

    comparison: str  # "fp32 vs baseline"
    verdict: str  # "SHOWN DIFFERENT: -1.40%"
    good: bool | None  # True: the answer the params expected / a clean result; False: not; None: neutral
    figure: str  # "AL 1.513 vs 1.509 (+0.26%)"
    interval: str = ""  # "95% CI [-2.38%, -0.43%] vs margin ±1%; paired t over 3 sweeps (df 2)"
    expected: str = ""  # "expected equivalent: no" (coloured by `good`; the verdict then stays uncoloured)
    rule: str = ""  # "meets the stated rule: yes"
    why: str = ""  # "The 95% interval excludes 0: the change is at least -0.43%, ..."


@dataclass(frozen=True)
class Summary:
    """The block a report opens with; `short`: the answer in one short clause (what `specbook index` lists)."""

    question: str
    headlines: list[Headline]
    evidence: list[str] = field(default_factory=list)  # "3 sweeps per arm", "12 of 12 runs usable", ...
    short: str = ""  # "triton_attn vs baseline: UNDECIDED (-0.33%)"


def short_clause(headlines: list[Headline] | list[Mapping[str, Any]]) -> str:
    """The answer in one short clause (what `specbook index` lists): the first headline's comparison and verdict,
    and how many more headlines the report has. Headlines as objects or as summary.json's dicts."""
    if not headlines:
        return ""
    first, rest = headlines[0], len(headlines) - 1
    get = first.get if isinstance(first, Mapping) else (lambda k: getattr(first, k, ""))
    return f"{get('comparison')}: {get('verdict')}" + (f" (+{rest} more)" if rest else "")


# --------------------------------------------------------------------------------------------------
# Numbers


def fmt(value: Any, digits: int = 4) -> str:
    """A number with `digits` significant digits (no exponent for everyday magnitudes); '-' for missing."""
    if value is None or value is pd.NA or value is pd.NaT:
        return "-"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(x):
        return "-"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if abs(x) < 1e-12:  # floating-point residue of a zero (a Wilson bound at 0 correct): not a figure to read
        return "0"
    if abs(x) >= 10 ** (digits - 1):  # 12345.6 -> "12346", not "1.235e+04"
        return f"{x:.0f}"
    return f"{x:.{digits}g}" if abs(x) >= 1e-4 or x == 0 else f"{x:.2e}"


def signed_pct(value: float, digits: int = 2) -> str:
    """'+0.26%' / '-1.10%'; '-' for missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.{digits}f}%"


def interval(low: float, high: float, level: float | None = None, digits: int = 4, what: str = "") -> str:
    """'95% CI of delta [-0.011, 0.019]'; '' when both bounds are missing."""
    if all(v is None or (isinstance(v, float) and math.isnan(v)) for v in (low, high)):
        return ""
    head = f"{level:.0%} CI" if level is not None else "CI"
    return f"{head}{' of ' + what if what else ''} [{fmt(low, digits)}, {fmt(high, digits)}]"


# --------------------------------------------------------------------------------------------------
# Evidence from the run folder


def _manifest(run_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The run's manifest as plain JSON (so one written by an older or newer specbook still reads); {} without one."""
    import json

    if not run_dir:
        return {}
    try:
        doc = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def machine_text(hardware: Mapping[str, Any], details: bool = True) -> str:
    """A manifest's hardware in a few words, from its flat row (tables.host_summary): the GPUs with their count (and,
    with details, driver and CUDA), or the CPU where it had none: '1 x NVIDIA H100 80GB HBM3 (driver 580.159.04,
    CUDA 13.0)', 'no GPU: AMD EPYC, 2 threads'."""
    from specbook.report.tables import host_summary
    from specbook.store.fingerprint import machine_kind

    row = host_summary(dict(hardware))
    if not row["gpus"]:
        text = "no GPU: " + (str(row["cpu"]) if row.get("cpu") else "a CPU")
        return text + (f", {row['cpu_threads']} threads" if details and row.get("cpu_threads") else "")
    text = str(machine_kind(hardware))  # the GPUs with their count: what a resume compares (store.fingerprint)
    if not details:
        return text
    extra = ([f"driver {row['gpu_driver']}"] if row.get("gpu_driver") not in (None, "?") else []) + (
        [f"CUDA {row['cuda_driver']}"] if row.get("cuda_driver") else [])
    return text + (f" ({', '.join(extra)})" if extra else "")


def ran_on_line(run_dir: str | os.PathLike[str] | None) -> str:
    """Where the run ran, from its manifest: its machine (machine_text) and the commit with its tree's state. The
    question above it is the params' text, which may name another card (a params file written for an H200 run on
    a lent H100): this line is what the run recorded. '' without a manifest."""
    doc = _manifest(run_dir)
    if not doc:
        return ""
    where = machine_text(doc.get("hardware") or {})
    machines = list(dict.fromkeys(p.get("machine") for p in doc.get("parts") or []
                                  if isinstance(p, dict) and p.get("machine")))
    if len(machines) > 1:  # a resume with --allow-hardware-change: the line must not name only the first machine
        where += f"; its parts ran on {len(machines)} kinds of machine ({' / '.join(machines)})"
    git = doc.get("git") or {}
    sha = git.get("short_sha") or (str(git["sha"])[:7] if git.get("sha") else "")
    if sha:
        dirty = git.get("dirty")  # true, false, or a word where git could not tell
        state = "clean tree" if dirty is False else "uncommitted changes" if dirty is True else "tree state unknown"
        where += f"; commit {sha} ({state})"
    return where


def run_parts(run_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """What the manifest says of how the run was collected: status, parts, resumed or not.

    Read generically (plain JSON), so a manifest written by an older or newer specbook still reads; a folder
    without a manifest (a notebook run by hand) gives {}.
    """
    doc = _manifest(run_dir)
    if not doc:
        return {}
    parts = doc.get("parts") or []
    resumed = sum(1 for p in parts if isinstance(p, dict) and p.get("resumed_from"))
    out = {"status": doc.get("status"), "parts": len(parts), "resumed": resumed,
           "renders": len(doc.get("renders") or [])}
    return {**out, "error": doc.get("error")} if doc.get("status") == "failed" else out


STOPPED_STATUSES = ("interrupted", "failed", "abandoned")  # a manifest's status of a run that did not finish


def collection_line(parts: Mapping[str, Any]) -> str:
    """'collected in one go' / 'resumed 2 times (3 parts)', and where the run was stopped before its end (a
    report rendered later from what it measured) that it was; '' when the manifest is missing."""
    if not parts:
        return ""
    n = int(parts.get("resumed") or 0)
    line = (f"resumed {n} time{'s' if n != 1 else ''} ({parts.get('parts')} parts)" if n
            else "collected in one go (not resumed)")
    status = parts.get("status")
    if status == "failed":  # its collection may have ended (a notebook cell failed after it) or not: say what it was
        error = str(parts.get("error") or "no error recorded")
        line += (f"; the run ended with status failed ({error[:200]}{'...' if len(error) > 200 else ''}): the "
                 "figures are what its saved data holds")
    elif status in STOPPED_STATUSES:
        line += (f"; the run was stopped before its end (status {status}): the figures are what it measured "
                 "until then")
    return line


# --------------------------------------------------------------------------------------------------
# HTML


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


_STYLE = (
    "<style>"
    ".sb-summary{border:1px solid #bbb;border-radius:6px;padding:10px 16px;margin:8px 0 18px;background:#fafafa}"
    ".sb-summary h2{margin-top:4px}.sb-q{font-size:1.1em;margin:4px 0 10px}"
    ".sb-table{border-collapse:collapse;margin:6px 0;font-size:0.92em}"
    ".sb-table th,.sb-table td{border-bottom:1px solid #ddd;padding:3px 9px;text-align:right;vertical-align:top}"
    ".sb-table th{background:#f0f0f0}.sb-table td.sb-text,.sb-table th.sb-text{text-align:left}"
    ".sb-good{color:#146c2e;font-weight:bold}.sb-bad{color:#a4161a;font-weight:bold}.sb-neutral{font-weight:bold}"
    ".sb-evidence{color:#444;margin:8px 0 2px}ul.sb-criteria{margin:2px 0 8px;padding-left:20px}"
    ".sb-table td.sb-why{color:#555;font-size:0.92em;border-bottom:1px solid #ddd;padding-top:0}"
    ".sb-table tr.sb-head td{border-bottom:none}"
    "details.sb-raw{margin:6px 0}details.sb-raw summary{cursor:pointer;color:#1a5fb4}"
    ".sb-why{color:#444;font-size:0.92em;margin-top:2px}"
    "</style>"
)


def _verdict_class(good: bool | None) -> str:
    return "sb-neutral" if good is None else ("sb-good" if good else "sb-bad")


def _headline_rows(h: Headline, expected: bool, rule: bool) -> str:
    """One headline as a table row (and its why-sentence as a row under it). With an `expected` column the
    colour is that column's, so a label is never coloured against what it says."""
    verdict_class = "sb-neutral" if expected else _verdict_class(h.good)
    cells = [f"<td class='sb-text'>{_e(h.comparison)}</td>", f"<td class='sb-text {verdict_class}'>{_e(h.verdict)}</td>",
             f"<td class='sb-text'>{_e(h.figure)}</td>", f"<td class='sb-text'>{_e(h.interval)}</td>"]
    if expected:
        cells.append(f"<td class='sb-text {_verdict_class(h.good) if h.expected else ''}'>{_e(h.expected)}</td>")
    if rule:
        cells.append(f"<td class='sb-text'>{_e(h.rule)}</td>")
    if not h.why:
        return f"<tr>{''.join(cells)}</tr>"
    return (f"<tr class='sb-head'>{''.join(cells)}</tr>"
            f"<tr><td></td><td class='sb-text sb-why' colspan='{len(cells) - 1}'>Why: {_e(h.why)}</td></tr>")


def summary_html(summary: Summary, run_dir: str | os.PathLike[str] | None = None) -> str:
    """The block a report opens with: the question, one row per comparison (its why beneath), the evidence."""
    expected = any(h.expected for h in summary.headlines)
    rule = any(h.rule for h in summary.headlines)
    rows = "".join(_headline_rows(h, expected, rule) for h in summary.headlines)
    heads = ["comparison", "verdict", "headline", "interval"] + (["stated before the run"] if expected else []) + (
        ["stated rule"] if rule else [])
    evidence = [e for e in summary.evidence if e]
    collected = collection_line(run_parts(run_dir))
    if collected:
        evidence.append(collected)
    from specbook.serve.hostload import contention_line

    contention = contention_line(run_dir)
    from specbook.serve.clientcpu import client_line

    client = client_line(run_dir)
    ran_on = ran_on_line(run_dir)
    return (
        _STYLE + "<div class='sb-summary'><h2>Summary</h2>"
        f"<p class='sb-q'><b>Question.</b> {_e(summary.question)}</p>"
        "<table class='sb-table'><thead><tr>" + "".join(f"<th class='sb-text'>{_e(x)}</th>" for x in heads) +
        f"</tr></thead><tbody>{rows}</tbody></table>"
        f"<p class='sb-evidence'><b>Evidence.</b> {_e('; '.join(evidence))}</p>"
        + (f"<p class='sb-evidence'><b>Ran on.</b> {_e(ran_on)}</p>" if ran_on else "")
        + (f"<p class='sb-evidence'><b>Contention.</b> {_e(contention)}</p>" if contention else "")
        + (f"<p class='sb-evidence'><b>Client.</b> {_e(client)}</p>" if client else "") + "</div>"
    )


def criteria_html(title: str, criteria: Iterable[tuple[str, bool | None, str]]) -> str:
    """A short list with pass/fail marks: (name, passed or None for n/a, what was measured against what)."""
    items = "".join(
        f"<li><span class='{_verdict_class(p)}'>{PASS_MARK if p else (NA_MARK if p is None else FAIL_MARK)}</span> "
        f"<b>{_e(name)}</b>: {_e(body)}</li>"
        for name, p, body in criteria
    )
    return f"{_STYLE}<p><b>{_e(title)}</b></p><ul class='sb-criteria'>{items}</ul>"


def _cell(value: Any, digits: int) -> tuple[str, bool]:
    """(text, is_text) of one table cell."""
    if isinstance(value, (list, tuple)):
        return "; ".join(str(v) for v in value), True
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()), True
    if isinstance(value, str):
        return value, True
    return fmt(value, digits), isinstance(value, bool) or value is None


def _header(col: Any, units: Mapping[str, str]) -> str:
    name = " / ".join(str(c) for c in col) if isinstance(col, tuple) else str(col)
    unit = units.get(name)
    return f"{name} ({unit})" if unit else name


def _row_names(frame: pd.DataFrame, digits: int) -> tuple[list[str], int]:
    """Column names for a transposed table: the first column's values, joined with the next columns' values
    while two rows would share a name (two arms of one engine); returns the names and how many leading
    columns they consumed. Rows still alike after that get their row number (a dict would drop one)."""
    for width in range(1, min(len(frame.columns), 3) + 1):
        names = [" / ".join(_cell(v, digits)[0] for v in frame.iloc[i, :width]) for i in range(len(frame))]
        if len(set(names)) == len(names):
            return [n or f"row {i}" for i, n in enumerate(names)], width
    return [f"{_cell(frame.iloc[i, 0], digits)[0]} (row {i})" for i in range(len(frame))], 1


def key_columns(frame: pd.DataFrame, digits: int = 4) -> list[Any]:
    """The leading columns that tell the rows apart (at most 3: the fewest whose values together are unique;
    the first alone where none are)."""
    return list(frame.columns[:_row_names(frame, digits)[1]]) if len(frame) else list(frame.columns[:1])


def table_html(df: pd.DataFrame, *, units: Mapping[str, str] | None = None, digits: int = 4,
               index: bool = False, max_columns: int = MAX_COLUMNS, title: str | None = None,
               raw_html: tuple[str, ...] = (), keys: list[str] | None = None, empty: str | None = None) -> str:
    """A frame as a reading table: no index column (unless `index` names the rows), every row and column,
    units in headers, `digits` significant digits. A frame wider than `max_columns` with at most 3 rows is
    transposed (one row per column); a wider one with more rows is split into column groups that each
    repeat the key columns (`keys`, default `key_columns`: the leading columns that tell its rows apart), the
    first group shown and the others folded beneath it. Columns named in `raw_html` hold markup made by the
    caller (links) and are not escaped. `empty`: the sentence shown instead of a frame without rows (why it has
    none), not a bare header."""
    units = units or {}
    if df is None or len(df.columns) == 0:
        return "<p><i>(nothing to show)</i></p>"
    if empty is not None and len(df) == 0:
        return f"<p><i>{_e(empty)}</i></p>"
    frame = df.reset_index() if index else df
    if len(frame.columns) > max_columns and len(frame) <= 3:
        names, shown = _row_names(frame, digits)
        body = pd.DataFrame({"": [_header(c, units) for c in frame.columns[shown:]],
                             **{n: list(frame.iloc[i, shown:]) for i, n in enumerate(names)}})
        return table_html(body, digits=digits, max_columns=10**6, title=title)
    if len(frame.columns) > max_columns:
        key = list(keys) if keys is not None else key_columns(frame, digits)
        rest = [c for c in frame.columns if c not in key]
        step = max(max_columns - len(key), 2)
        groups = [rest[i:i + step] for i in range(0, len(rest), step)]

        def part(cols: list[Any], head: str | None) -> str:
            return table_html(frame[[*key, *cols]], units=units, digits=digits, max_columns=10**6, title=head,
                              raw_html=raw_html)

        shown = part(groups[0], title)
        more = "".join(part(g, None) for g in groups[1:])
        if not more:
            return shown
        names = ", ".join(_header(c, units) for g in groups[1:] for c in g)
        return shown + details_html(f"{sum(map(len, groups[1:]))} more columns, by {', '.join(map(str, key))}: "
                                    f"{names}", more)
    head = "".join(f"<th class='sb-text'>{_e(_header(c, units))}</th>" for c in frame.columns)
    lines = []
    for _, row in frame.iterrows():
        cells = [_cell(v, digits) for v in row]
        lines.append("<tr>" + "".join(f"<td{' class=sb-text' if is_text else ''}>{t if c in raw_html else _e(t)}</td>"
                                      for c, (t, is_text) in zip(frame.columns, cells, strict=True)) + "</tr>")
    caption = f"<caption style='text-align:left'><b>{_e(title)}</b></caption>" if title else ""
    return (f"{_STYLE}<table class='sb-table'>{caption}<thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(lines)}</tbody></table>")


def details_html(summary: str, inner_html: str) -> str:
    """Fold a block (a raw table) into a collapsible <details>: there for the sceptic, out of the reader's way."""
    return f"<details class='sb-raw'><summary>{_e(summary)}</summary>{inner_html}</details>"


def long_table_html(df: pd.DataFrame, what: str, *, limit: int = LONG_TABLE_ROWS, **kw: Any) -> str:
    """A table that may run long: shown as it is up to `limit` rows, else folded behind '<what>: N rows'."""
    if df is None or len(df) <= limit:
        return table_html(df, **kw)
    return details_html(f"{what}: {len(df)} rows", table_html(df, **kw))


def folded_outline_html(text: str, what: str, count: int) -> str:
    """An outline (outline_html) folded behind '<what> (count)': a long per-cell list out of the reader's way."""
    return details_html(f"{what} ({count})", outline_html(text))


def raw_table_html(df: pd.DataFrame, what: str, **kw: Any) -> str:
    """A raw frame, folded: '<what> (N rows x M columns)'."""
    return details_html(f"{what} ({len(df)} rows x {len(df.columns)} columns)", table_html(df, **kw))


# --------------------------------------------------------------------------------------------------
# In a notebook


def show(html_text: str) -> None:
    """Display HTML in the notebook (print it outside a kernel)."""
    try:
        from IPython.display import HTML, display

        display(HTML(html_text))
    except ImportError:
        print(html_text)


def show_summary(summary: Summary, run_dir: str | os.PathLike[str] | None = None,
                 save_to: str | os.PathLike[str] | None = None) -> None:
    """Display the summary block; with `save_to`, also write it as JSON (what `specbook index` lists)."""
    if save_to is not None:
        save_summary(summary, save_to)
    show(summary_html(summary, run_dir))


def save_summary(summary: Summary, path: str | os.PathLike[str]) -> Path:
    """The summary block as JSON (question, headlines, evidence), written atomically."""
    import dataclasses
    import json

    from specbook.core.diskwrite import write_text_atomic

    return write_text_atomic(path, json.dumps(dataclasses.asdict(summary), indent=1, ensure_ascii=False) + "\n")


def show_table(df: pd.DataFrame, **kw: Any) -> None:
    show(table_html(df, **kw))


def show_raw(df: pd.DataFrame, what: str, **kw: Any) -> None:
    show(raw_table_html(df, what, **kw))


def show_long(df: pd.DataFrame, what: str, **kw: Any) -> None:
    show(long_table_html(df, what, **kw))


def show_lines(lines: Iterable[str]) -> None:
    """Sentences the analysis wrote (notes, why-lines) as a list; nothing for none."""
    lines = [ln for ln in lines if ln]
    if lines:
        show("<ul>" + "".join(f"<li>{_e(ln)}</li>" for ln in lines) + "</ul>")


# --------------------------------------------------------------------------------------------------
# The rendered page


_HEADING = re.compile(r'<h([23]) id="([^"]+)"[^>]*>(.*?)</h\1>', re.DOTALL)
_TAG = re.compile(r"<[^>]+>")


def toc_html(body: str) -> str:
    """A table of contents of a rendered report's sections (its h2 and h3 headings with ids), folded in one line."""
    items = []
    for level, anchor, inner in _HEADING.findall(body):
        text = html.unescape(_TAG.sub("", inner)).replace("\u00b6", "").strip()
        if text:
            items.append(f"<li style='margin-left:{(int(level) - 2) * 1.2}em'><a href='#{anchor}'>{_e(text)}</a></li>")
    if not items:
        return ""
    return (f"<nav class='sb-toc'><details><summary>Contents: {len(items)} sections</summary>"
            f"<ol>{''.join(items)}</ol></details></nav>")


# A cell with neither input shown nor output (the parameters, the set-up) takes no room on the page.
_PAGE_STYLE = ("<style>nav.sb-toc{margin:4px 0 10px}nav.sb-toc ol{columns:2;margin:4px 0}"
               ".jp-Cell.jp-mod-noInput.jp-mod-noOutputs{display:none}</style>")


def with_toc(body: str) -> str:
    """The rendered report with its table of contents after its title (the first h1), or at its top; cells that
    show nothing take no room."""
    toc = _PAGE_STYLE + toc_html(body)
    end = body.find("</h1>")
    if end < 0:
        start = body.find("<body")
        at = body.find(">", start) + 1 if start >= 0 else 0
        return body[:at] + toc + body[at:]
    at = end + len("</h1>")
    return body[:at] + toc + body[at:]


def verdict_html(verdict: Any) -> str:
    """One comparison (a knob A/B decision's Verdict / DifferenceVerdict): its label and why, then the stated rule's
    outcome as its own line over a pass/fail list of the rule's criteria (each criterion's own text without the
    PASS/FAIL word the mark already shows)."""
    def body(c: Any) -> str:
        text = str(c.text)
        prefix = f"{c.status} {c.name}: "
        return text[len(prefix):] if text.startswith(prefix) else text

    lab = getattr(verdict, "label", None)
    head = f"{verdict.arm} vs {verdict.baseline}: {lab.verdict() if lab is not None else verdict.conclusion.upper()}"
    out = f"{_STYLE}<p><b>{_e(head)}</b>" + (f" ({_e(lab.interval_text())}). {_e(lab.why())}" if lab else "") + "</p>"
    meets = getattr(verdict, "meets_rule", None)
    rule = "the stated rule" if meets is None else (
        f"meets the stated rule ({verdicts.RULE_NAMES.get(verdict.kind, verdict.kind)}): {'yes' if meets else 'no'}")
    return out + criteria_html(rule, [(c.name, c.passed, body(c) + ("" if c.required else " (reported, not required)"))
                                      for c in verdict.criteria])


def outline_html(text: str) -> str:
    """Plain text lines as a list: unindented lines are items, indented ones (with or without '- ') their sub-items."""
    items: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line[:1].isspace() and items:
            items[-1][1].append(line.strip().removeprefix("- "))
        else:
            items.append((line.strip(), []))
    body = "".join(f"<li>{_e(head)}" + (f"<ul>{''.join(f'<li>{_e(s)}</li>' for s in subs)}</ul>" if subs else "")
                   + "</li>" for head, subs in items)
    return f"<ul>{body}</ul>"
