"""The replay reference, engine-independent: what the draft model itself proposes, greedily, at each
anchor of the target's output (teacher forcing), computed offline with transformers on the same weights.

At an anchor a (tokens in the sequence, anchor included) the draft sees prompt + output[:a - prompt_len]
and proposes k tokens autoregressively. All anchors of one request are batched: one left-padded batch
of prefixes, k greedy steps with the KV cache. Numerics differ from an engine's kernels (bf16 here, on
CPU), so a rare near-tie may flip one id; a systematic pattern is what the comparison looks for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

DEFAULT_BATCH = 16


def load_draft(model: str | Path, dtype: str = "bfloat16") -> Any:
    """The draft as a transformers causal LM (an embedded name -> its prepared folder)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from specbook.engines.base import resolve_model

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


def greedy_proposals(lm: Any, sequence: Sequence[int], anchors: Sequence[int], k: int,
                     batch: int = DEFAULT_BATCH) -> list[list[int]]:
    """The draft's k greedy ids after sequence[:a] for each anchor a (0 < a <= len(sequence))."""
    import torch

    seq = list(sequence)
    out: list[list[int]] = []
    pad = int(getattr(lm.config, "pad_token_id", None) or 0)
    for start in range(0, len(anchors), batch):
        chunk = [int(a) for a in anchors[start:start + batch]]
        width = max(chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, a in enumerate(chunk):  # left padding: every prefix ends at the last column
            ids[i, width - a:] = torch.tensor(seq[:a])
            mask[i, width - a:] = 1
        with torch.inference_mode():
            gen = lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=k, min_new_tokens=k,
                              do_sample=False, num_beams=1, pad_token_id=pad, eos_token_id=None)
        out += [row[width:].tolist() for row in gen]
    return out


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
