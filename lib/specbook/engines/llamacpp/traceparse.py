"""llama-server's debug log (`-v`) -> proposal records (specbook.traces.records' schema).

What llama-server prints at debug verbosity, per draft step of a slot (verbatim in tests/fixtures/traces/):

    D spec        draft:  - seq_id 0, draft candidate   0, pos   0:     28 (   0.958) ','
    ... (top-3 candidates per draft position; draft-simple only)
    D common_ngram_simple_draft: #tokens = 49: found matching pattern at pos 43, length 3, draft length 3
    D slot handle_last_: id  0 | task 0 | generate_draft: id=39080, #tokens=42, #draft=4, pos_next=42
    D slot   operator(): id  0 | task 0 | add accepted tokens: sampled=28, ids.size=2, n_draft=4
    D slot process_toke: id  0 | task 0 | n_gen = 2, n_remaining = 22, next token:    28 ','
    D slot   operator(): id  0 | task 0 | accepted 1/4 draft tokens, new n_tokens = 44
    D slot process_toke: id  0 | task 1 | stopped by EOS

The draft follows `id` (the anchor: sampled, not yet in the cache) after `#tokens` cached tokens, so the
anchor position (tokens in the sequence, anchor included) is #tokens + 1. draft-simple's proposals are
candidate 0 of each position, cut to `#draft`. ngram-simple prints no ids, only where its match lies in
the token history: its proposals are history[pos + length : pos + length + draft length], also cut to
`#draft` (the server shortens a draft to what the request may still emit), which needs the prompt's ids
(`ngram_proposals` fills them in; without them the records carry no proposals and the trace says why).
The request id is `task-N`.

What the server accepted of a draft is `ids.size - 1` of its "add accepted tokens" line, printed for every
step; "accepted a/k draft tokens" follows only when the request goes on (not for its last step).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from specbook.traces.records import ProposalRecord

_CANDIDATE = re.compile(r"draft candidate\s+(?P<cand>\d+), pos\s+(?P<pos>\d+):\s+(?P<tok>\d+) \(\s*(?P<p>[\d.]+)\)")
_NGRAM = re.compile(r"common_ngram_simple_draft: #tokens = (?P<hist>\d+): found matching pattern at pos "
                    r"(?P<pos>\d+), length (?P<len>\d+), draft length (?P<n>\d+)")
_GENERATE = re.compile(r"id\s+(?P<slot>\d+) \| task (?P<task>\d+) \| generate_draft: id=(?P<anchor>\d+), "
                       r"#tokens=(?P<ntok>\d+), #draft=(?P<ndraft>\d+)")
_ACCEPTED = re.compile(r"id\s+(?P<slot>\d+) \| task (?P<task>\d+) \| accepted (?P<acc>\d+)/(?P<n>\d+) draft tokens")
_ADD_ACCEPTED = re.compile(r"id\s+(?P<slot>\d+) \| task (?P<task>\d+) \| add accepted tokens: sampled=-?\d+, "
                           r"ids\.size=(?P<ids>\d+), n_draft=(?P<n>\d+)")
_EOS_STOP = re.compile(r"id\s+(?P<slot>\d+) \| task (?P<task>\d+) \| stopped by EOS")
_NEXT = re.compile(r"id\s+(?P<slot>\d+) \| task (?P<task>\d+) \| n_gen = (?P<ngen>\d+), .*next token:\s+(?P<tok>\d+)")


@dataclass
class ParsedTrace:
    """Records per draft step, the emitted ids of each task (in order of first token), ngram matches
    (record index -> (history position, match length, draft length)) still to be filled with ids, and the
    tasks that stopped on an end-of-generation token ("stopped by EOS")."""

    records: list[ProposalRecord] = field(default_factory=list)
    emitted: dict[str, list[int]] = field(default_factory=dict)
    ngram_matches: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    stopped_on_eog: set[str] = field(default_factory=set)
    candidate_lines: int = 0


def parse_trace_lines(lines: Iterable[str]) -> ParsedTrace:
    out = ParsedTrace()
    candidates: dict[int, int] = {}  # draft position -> candidate 0's id, since the last generate_draft
    match: tuple[int, int, int] | None = None
    last_record: dict[str, int] = {}
    for line in lines:
        if "draft candidate" in line:
            m = _CANDIDATE.search(line)
            if m:
                out.candidate_lines += 1
                if m["cand"] == "0":
                    candidates[int(m["pos"])] = int(m["tok"])
            continue
        if "common_ngram_simple_draft" in line:
            m = _NGRAM.search(line)
            if m:
                match = (int(m["pos"]), int(m["len"]), int(m["n"]))
            continue
        if "generate_draft:" in line:
            m = _GENERATE.search(line)
            if not m:
                continue
            rid, n = f"task-{m['task']}", int(m["ndraft"])
            proposed = tuple(candidates[p] for p in sorted(candidates))[:n] if candidates else ()
            out.records.append(ProposalRecord(engine="llamacpp", request_id=rid, anchor_pos=int(m["ntok"]) + 1,
                                              anchor_id=int(m["anchor"]), proposed=proposed))
            if match is not None and not candidates:
                out.ngram_matches[len(out.records) - 1] = (match[0], match[1], min(match[2], n))
            last_record[rid] = len(out.records) - 1
            candidates, match = {}, None
            continue
        if "add accepted tokens" in line:
            m = _ADD_ACCEPTED.search(line)
            rid = f"task-{m['task']}" if m else None
            if m and rid in last_record:
                i = last_record[rid]
                out.records[i] = out.records[i].model_copy(update={"engine_accepted": int(m["ids"]) - 1})
            continue
        if "draft tokens" in line:
            m = _ACCEPTED.search(line)
            rid = f"task-{m['task']}" if m else None
            if m and rid in last_record:
                i = last_record[rid]
                out.records[i] = out.records[i].model_copy(update={"engine_accepted": int(m["acc"])})
            continue
        if "stopped by EOS" in line:
            m = _EOS_STOP.search(line)
            if m:
                out.stopped_on_eog.add(f"task-{m['task']}")
            continue
        if "next token:" in line:
            m = _NEXT.search(line)
            if m:
                out.emitted.setdefault(f"task-{m['task']}", []).append(int(m["tok"]))
    return out


def ngram_proposals(parsed: ParsedTrace, histories: dict[str, Sequence[int]]) -> list[ProposalRecord]:
    """The records with ngram-simple's proposals read from each task's token history (prompt + emitted
    ids); records of a task without a history keep no proposals."""
    records = list(parsed.records)
    for i, (pos, length, n) in parsed.ngram_matches.items():
        hist = histories.get(records[i].request_id)
        if hist is not None:
            start = pos + length
            records[i] = records[i].model_copy(update={"proposed": tuple(hist[start:start + n])})
    return records
