"""Does a drafter remember earlier requests? Each timed cell serves one prompt again and again on one server (a
cold request, then the timed repeats), and greedy decoding emits the same tokens each time. A drafter that reads
only the request's own tokens then proposes the same drafts on every repeat, so the same output streams in the
same number of chunks. One that also learns from earlier requests (SGLang's NGRAM trie is server-wide) proposes
what the prompt's earlier serves generated: the same output in fewer chunks on a later serve.

`repeat_chunks` reads that from the timed requests, per side x lane; `lane_caveat` turns it, with the sides whose
engine says its drafter remembers (`remembering_sides`: engines.base.ForgetsDrafts.remembers), into the sentence a
lane's headline must carry: its ratio is then one of prompts served before, not of speculation on unseen text.
Unless collection emptied that memory before each timed request (params.draft_memory `forget`: the requests'
`drafts_emptied`, read by `emptied`)."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from specbook.engines import EngineConfig
    from specbook.engines.base import ForgetsDrafts
    from specbook.experiments.cross_engine.params import CrossEngineParams

REPEAT_CHUNK_COLUMNS = ["side", "engine", "lane", "prompts", "fewer_chunks_later", "more_chunks_later",
                        "first_tokens_per_chunk", "later_tokens_per_chunk"]


def _same_output_repeats(group: pd.DataFrame) -> pd.DataFrame:
    """A cell side's answered repeats, in order, that emitted exactly the first repeat's tokens."""
    rows = group.sort_values("repeat")
    rows = rows[rows["token_ids"].notna() & (rows["chunks"] > 0)]
    if rows.empty:
        return rows
    first = tuple(rows["token_ids"].iloc[0])
    return rows[[tuple(t) == first for t in rows["token_ids"]]]


def repeat_chunks(requests: pd.DataFrame) -> pd.DataFrame:
    """From the answered timed requests: per side x lane, over the prompts with at least two repeats of the same output: how many streamed it in
    fewer chunks on some later repeat than on the first, how many in more, and tokens per chunk on the first
    repeat and on the later ones (over those prompts). Fewer and never more, on a lane whose other engine and
    whose own off lane stay put, is a drafter that learnt from the earlier serves."""
    need = {"side", "engine", "lane", "prompt", "repeat", "token_ids", "chunks", "completion_tokens"}
    if requests.empty or not need <= set(requests.columns):
        return pd.DataFrame(columns=REPEAT_CHUNK_COLUMNS)
    rows = []
    for (side, engine, lane), g in requests.groupby(["side", "engine", "lane"], sort=False):
        prompts = fewer = more = 0
        first_tok = first_chunks = later_tok = later_chunks = 0.0
        for _, cell in g.groupby("prompt", sort=False):
            same = _same_output_repeats(cell)
            if len(same) < 2:
                continue
            prompts += 1
            chunks = [int(c) for c in same["chunks"]]
            fewer += min(chunks[1:]) < chunks[0]
            more += max(chunks[1:]) > chunks[0]
            tokens = [int(t) for t in same["completion_tokens"]]
            first_tok, first_chunks = first_tok + tokens[0], first_chunks + chunks[0]
            later_tok, later_chunks = later_tok + sum(tokens[1:]), later_chunks + sum(chunks[1:])
        rows.append({"side": side, "engine": engine, "lane": lane, "prompts": prompts, "fewer_chunks_later": fewer,
                     "more_chunks_later": more,
                     "first_tokens_per_chunk": first_tok / first_chunks if first_chunks else math.nan,
                     "later_tokens_per_chunk": later_tok / later_chunks if later_chunks else math.nan})
    return pd.DataFrame(rows, columns=REPEAT_CHUNK_COLUMNS)


def remembering_engine(cfg: EngineConfig) -> ForgetsDrafts | None:
    """The engine serving `cfg` where its drafter also drafts from earlier requests (ForgetsDrafts.remembers);
    None for one without that capability or whose config does not remember."""
    from specbook.engines import capability
    from specbook.engines.base import ForgetsDrafts

    engine = capability(cfg.engine, ForgetsDrafts)
    return engine if engine is not None and engine.remembers(cfg) else None


def remembering_sides(params: CrossEngineParams) -> dict[str, list[str]]:
    """lane -> the sides whose drafter on that lane also drafts from earlier requests (remembering_engine of the
    side's config with the lane's speculation)."""
    from specbook.experiments.cross_engine.collection import lane_config

    return {lane.name: [side for side in ("ours", "oracle")
                        if remembering_engine(lane_config(params.side(side), lane)) is not None]
            for lane in params.lanes}


def chunk_evidence(table: pd.DataFrame, lane: str, labels: dict[str, str]) -> str:
    """'the same output in fewer chunks after the first timed serve: sglang 5 of 24 prompts, vllm 0 of 24; in more:
    chunks: 0 and 0', from repeat_chunks; '' where neither side has a prompt with two repeats of one output."""
    rows = [r for side in ("ours", "oracle")
            for r in table[(table["side"] == side) & (table["lane"] == lane) & (table["prompts"] > 0)].itertuples()]
    if not rows:
        return ""
    fewer = ", ".join(f"{labels.get(r.side, r.side)} {r.fewer_chunks_later} of {r.prompts}" for r in rows)
    more = " and ".join(str(r.more_chunks_later) for r in rows)
    return f"the same output in fewer chunks after the first timed serve: {fewer} prompts; in more chunks: {more}"


def emptied(requests: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(side, lane) -> what was emptied before each of its timed requests (the `drafts_emptied` column
    collection writes under params.draft_memory `forget`), where every request of it says so; runs made before
    that column emptied nothing."""
    if requests.empty or "drafts_emptied" not in requests:
        return {}
    out = {}
    for (side, lane), g in requests.groupby(["side", "lane"], sort=False):
        said = g["drafts_emptied"].fillna("").astype(str)
        if len(said) and (said != "").all():
            out[(side, lane)] = str(said.iloc[0])
    return out


def emptied_notes(requests: pd.DataFrame, labels: dict[str, str]) -> dict[str, str]:
    """lane -> 'sglang-cuda emptied its NGRAM trie and its prefix cache (/flush_cache) before each timed request'."""
    notes: dict[str, list[str]] = {}
    for (side, lane), what in emptied(requests).items():
        notes.setdefault(lane, []).append(f"{labels.get(side, side)} emptied {what} before each timed request")
    return {lane: "; ".join(parts) for lane, parts in notes.items()}


def lane_caveat(remembering: Collection[str], chunks: pd.DataFrame, lane: str, labels: dict[str, str],
                forgotten: Collection[str] = ()) -> str:
    """'' where no side's drafter remembers earlier requests on `lane` (`remembering`: the sides that do, from
    remembering_sides; or each was emptied before every timed request: `forgotten`, its sides); else the sentence
    its headline carries: who drafts from earlier requests, that every timed request serves its prompt again, and
    what the chunk counts across repeats showed."""
    sides = [s for s in remembering if s not in forgotten]
    if not sides:
        return ""
    who = " and ".join(labels.get(s, s) for s in sides)
    seen = chunk_evidence(chunks, lane, labels)
    return (f"{who} also drafts from earlier requests' tokens, and every timed request serves its prompt again "
            f"after a cold request ({seen or 'no repeats to compare'}): the ratio is for prompts served before, "
            "not for speculation on unseen text")


def scope_word(caveat: str) -> str:
    """What a lane's verdict label adds when its caveat is set."""
    return ", prompts served before" if caveat else ""


def caveats(remembering: Mapping[str, Collection[str]], chunks: pd.DataFrame, labels: dict[str, str],
            requests: pd.DataFrame | None = None) -> dict[str, str]:
    """lane -> its caveat, for the lanes that have one (`remembering`: lane -> its remembering sides, from
    remembering_sides; `requests`: the timed ones, for what was emptied)."""
    gone = emptied(requests) if requests is not None else {}
    out = {lane: lane_caveat(sides, chunks, lane, labels, {side for side, ln in gone if ln == lane})
           for lane, sides in remembering.items()}
    return {lane: text for lane, text in out.items() if text}
