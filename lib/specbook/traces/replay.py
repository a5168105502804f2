"""The replay reference, engine-independent: what the draft model itself proposes, greedily, at each
anchor of the target's output (teacher forcing), computed offline with transformers on the same weights.

At an anchor a (tokens in the sequence, anchor included) the draft sees prompt + output[:a - prompt_len]
and proposes k tokens autoregressively: one prefill per request, then per anchor the KV cache cut back to it
and k greedy steps (greedy_proposals). Numerics differ from an engine's kernels (bf16 here, on the GPU
where torch sees one, else on the CPU), so a rare near-tie may flip one id; a systematic pattern is what the
comparison looks for. On a GPU host the replay runs there: its one-token steps on the CPU cost minutes of a
lease between two servers.

The prefill always covers the whole sequence, whichever anchors are asked, so a proposal depends on the
sequence, the anchor and k alone. That lets a DraftReplayer remember proposals: both sides of a cross-engine
lane (and both arms of a config flip with the same draft) often emit the same greedy output, and the second
replay of a sequence then costs no forward pass, with results equal to computing it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd


def load_draft(model: str | Path, dtype: str = "bfloat16") -> Any:
    """The draft as a transformers causal LM (an embedded name -> its prepared folder)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from specbook.models import resolve_model

    # the report is the replay's reader: no "Loading weights" bar written into its cell's output
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        lm = AutoModelForCausalLM.from_pretrained(resolve_model(str(model)), dtype=getattr(torch, dtype))
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
    lm.eval()
    if torch.cuda.is_available():  # beside the engine's server: a draft this size needs little of its memory
        lm.to("cuda")
    return lm


def greedy_proposals(lm: Any, sequence: Sequence[int], anchors: Sequence[int], k: int) -> list[list[int]]:
    """The draft's k greedy ids after sequence[:a] for each anchor a (0 < a <= len(sequence)).

    One prefill of the whole sequence but its last token, then per anchor, last first, the KV cache cut back
    to the anchor and k one-token greedy steps (argmax, as an engine's greedy draft): about len + anchors x k
    forwards of one request, where a batched prefill per anchor cost anchors x len: too slow for a traced
    draft_model lane of the CPU cross-engine demo, whose long outputs give many anchors.
    """
    import torch
    from transformers import DynamicCache

    seq = [int(t) for t in sequence]
    wanted = sorted({int(a) for a in anchors}, reverse=True)
    if not wanted:
        return []
    if wanted[-1] < 1 or wanted[0] > len(seq):
        raise ValueError(f"replay: anchors must lie in 1..{len(seq)} (got {wanted[-1]}..{wanted[0]})")
    cache = DynamicCache()
    found: dict[int, list[int]] = {}
    device = getattr(lm, "device", "cpu")
    with torch.inference_mode():
        if len(seq) > 1:  # the whole sequence before its last token, whatever the anchors (module docstring)
            lm(input_ids=torch.tensor([seq[:-1]], device=device), past_key_values=cache, use_cache=True)
        for a in wanted:
            extra = cache.get_seq_length() - (a - 1)  # anchors are walked from the last: the cache only shrinks
            if extra > 0:
                cache.crop(-extra)  # a negative crop removes that many tokens (a positive one is deprecated)
            token, proposed = seq[a - 1], []
            for _ in range(k):
                logits = lm(input_ids=torch.tensor([[token]], device=device), past_key_values=cache,
                            use_cache=True).logits
                token = int(logits[0, -1].argmax())
                proposed.append(token)
            found[a] = proposed
    return [found[int(a)] for a in anchors]


def _digest(sequence: Sequence[int]) -> bytes:
    return hashlib.blake2b(",".join(map(str, sequence)).encode(), digest_size=16).digest()


@dataclass
class DraftReplayer:
    """A draft loaded for replay and the proposals it already made, by (sequence, anchor, k): a sequence
    replayed again (the other side's identical output) costs no forward pass. `computed` / `reused` count
    anchors, for the run's log."""

    lm: Any
    memo: dict[tuple[bytes, int, int], list[int]] = field(default_factory=dict)
    computed: int = 0
    reused: int = 0

    def proposals(self, sequence: Sequence[int], anchors: Sequence[int], k: int) -> list[list[int]]:
        key = _digest(sequence)
        missing = sorted({int(a) for a in anchors if (key, int(a), k) not in self.memo})
        if missing:
            for a, props in zip(missing, greedy_proposals(self.lm, sequence, missing, k), strict=True):
                self.memo[(key, a, k)] = props
        self.computed += len(missing)
        self.reused += len({int(a) for a in anchors}) - len(missing)
        return [list(self.memo[(key, int(a), k)]) for a in anchors]


@lru_cache(maxsize=2)
def replayer(model: str, dtype: str = "bfloat16") -> DraftReplayer:
    """The process's DraftReplayer of a draft (an embedded name or a folder): loaded once, shared by every
    trace pass of a run that replays it."""
    return DraftReplayer(load_draft(model, dtype))


def replay_reference(lm: Any, steps: pd.DataFrame, requests: dict[str, tuple[Sequence[int], Sequence[int]]],
                     k: int) -> pd.DataFrame:
    """The reference for each (request, anchor) of a TraceSet's verified steps: columns request_id,
    anchor_pos, reference (k ids). `requests`: request_id -> (prompt ids, emitted ids). `lm`: a DraftReplayer
    (its memo reused) or a bare transformers model."""
    replay = lm if isinstance(lm, DraftReplayer) else DraftReplayer(lm)
    rows = []
    for rid, group in steps.groupby("request_id", sort=False):
        if rid not in requests:
            continue
        prompt, output = requests[rid]
        seq = list(prompt) + list(output)
        anchors = sorted({int(a) for a in group["anchor_pos"] if 0 < int(a) <= len(seq)})
        for a, props in zip(anchors, replay.proposals(seq, anchors, k), strict=True):
            rows.append({"request_id": rid, "anchor_pos": a, "reference": props})
    return pd.DataFrame(rows, columns=["request_id", "anchor_pos", "reference"])
