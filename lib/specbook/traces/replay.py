"""The replay reference, engine-independent: what the draft model itself proposes, greedily, at each
anchor of the target's output (teacher forcing), computed offline with transformers on the same weights.

At an anchor a (tokens in the sequence, anchor included) the draft sees prompt + output[:a - prompt_len]
and proposes k tokens autoregressively: one prefill per request, then per anchor the KV cache cut back to it
and k greedy steps (greedy_proposals). Numerics differ from an engine's kernels (bf16 here, on
CPU), so a rare near-tie may flip one id; a systematic pattern is what the comparison looks for.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    return lm


def greedy_proposals(lm: Any, sequence: Sequence[int], anchors: Sequence[int], k: int) -> list[list[int]]:
    """The draft's k greedy ids after sequence[:a] for each anchor a (0 < a <= len(sequence)).

    One prefill of the sequence up to the last anchor, then per anchor, last first, the KV cache cut back to
    the anchor and k one-token greedy steps (argmax, as an engine's greedy draft): about len + anchors x k
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
    with torch.inference_mode():
        if wanted[0] > 1:  # the prefix before the last anchor's own token
            lm(input_ids=torch.tensor([seq[:wanted[0] - 1]]), past_key_values=cache, use_cache=True)
        for a in wanted:
            extra = cache.get_seq_length() - (a - 1)  # anchors are walked from the last: the cache only shrinks
            if extra > 0:
                cache.crop(-extra)  # a negative crop removes that many tokens (a positive one is deprecated)
            token, proposed = seq[a - 1], []
            for _ in range(k):
                logits = lm(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits
                token = int(logits[0, -1].argmax())
                proposed.append(token)
            found[a] = proposed
    return [found[int(a)] for a in anchors]


def replay_reference(lm: Any, steps: pd.DataFrame, requests: dict[str, tuple[Sequence[int], Sequence[int]]],
                     k: int) -> pd.DataFrame:
    """The reference for each (request, anchor) of a TraceSet's verified steps: columns request_id,
    anchor_pos, reference (k ids). `requests`: request_id -> (prompt ids, emitted ids)."""
    rows = []
    for rid, group in steps.groupby("request_id", sort=False):
        if rid not in requests:
            continue
        prompt, output = requests[rid]
        seq = list(prompt) + list(output)
        anchors = sorted({int(a) for a in group["anchor_pos"] if 0 < int(a) <= len(seq)})
        for a, props in zip(anchors, greedy_proposals(lm, seq, anchors, k), strict=True):
            rows.append({"request_id": rid, "anchor_pos": a, "reference": props})
    return pd.DataFrame(rows, columns=["request_id", "anchor_pos", "reference"])
