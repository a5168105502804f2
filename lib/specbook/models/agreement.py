"""Teacher-forced top-1 agreement of a draft with its target, and the acceptance length it implies.

Both models read the same chat-rendered texts; at each position we compare their argmax next token.
With per-token agreement p treated as i.i.d., a k-token draft gives an expected acceptance length
(accepted tokens + the target's bonus token) of sum_{i=0..k} p^i = (1 - p^(k+1)) / (1 - p).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from specbook.core.digest import sha256_bytes

from ..core.errors import ModelPrepareError

AGREEMENT_K = 4
AGREEMENT_TEXTS = 32
AGREEMENT_MAX_TOKENS = 512
# A GSM8K-style jsonl (question/answer per line) to measure on; unset -> the built-in texts below.
AGREEMENT_DATA_ENV = "SPECBOOK_AGREEMENT_DATA"

# Written for specbook (not taken from any dataset) so the default measurement needs no download.
BUILTIN_TEXTS: tuple[tuple[str, str], ...] = (
    (
        "A baker makes 48 rolls in the morning and 36 in the afternoon. He sells 70 of them. How many rolls are left?",
        "He makes 48 + 36 = 84 rolls in total. After selling 70 he has 84 - 70 = 14 rolls left.\nThe answer is 14.",
    ),
    (
        "Write a short paragraph explaining why the sky looks blue during the day.",
        "Sunlight contains all colours. When it passes through the atmosphere, the short blue wavelengths are "
        "scattered by air molecules much more strongly than the long red ones, a process called Rayleigh "
        "scattering. This scattered blue light reaches our eyes from every direction, so the whole sky looks blue.",
    ),
    (
        "A train travels at 60 miles per hour for 2.5 hours. How far does it go?",
        "Distance is speed times time, so the train covers 60 * 2.5 = 150 miles.\nThe answer is 150.",
    ),
    (
        "List three tips for writing clear Python code.",
        "1. Give variables and functions names that say what they hold or do.\n2. Keep functions short and "
        "focused on one job.\n3. Write docstrings and tests so others can see how the code is meant to be used.",
    ),
    (
        "Maria has 3 boxes with 12 pencils each. She gives 5 pencils to each of her 4 friends. How many pencils does she keep?",
        "She has 3 * 12 = 36 pencils. She gives away 4 * 5 = 20 pencils. She keeps 36 - 20 = 16 pencils.\n"
        "The answer is 16.",
    ),
    (
        "What is the difference between a list and a tuple in Python?",
        "A list is mutable: you can add, remove or change its items after it is created. A tuple is immutable: "
        "once created, its items cannot change. Tuples are often used for fixed records and as dictionary keys, "
        "while lists are used for collections that grow or shrink.",
    ),
    (
        "A shirt costs $25 and is on sale for 20% off. How much does it cost on sale?",
        "The discount is 20% of $25, which is 0.2 * 25 = $5. The sale price is 25 - 5 = $20.\nThe answer is 20.",
    ),
    (
        "Summarize the water cycle in a few sentences.",
        "Water evaporates from oceans, lakes and rivers when the sun heats it. The vapour rises, cools and "
        "condenses into clouds. When the droplets grow heavy they fall as rain or snow, and the water flows back "
        "into rivers and oceans or soaks into the ground, where the cycle starts again.",
    ),
)


def expected_acceptance_length(p: float, k: int = AGREEMENT_K) -> float:
    """Expected tokens per target step with k drafted tokens, each accepted i.i.d. with probability p."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"agreement p must be within [0, 1], got {p}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if p == 1.0:
        return float(k + 1)
    return (1.0 - p ** (k + 1)) / (1.0 - p)


def load_qa_jsonl(path: Path, n: int = AGREEMENT_TEXTS) -> list[tuple[str, str]]:
    """The first n (question, answer) pairs of a GSM8K-format jsonl file."""
    if not path.is_file():
        raise ModelPrepareError(f"agreement text file {path} does not exist")
    pairs = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if len(pairs) >= n:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                pairs.append((str(row["question"]), str(row["answer"])))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ModelPrepareError(
                    f"{path}:{lineno}: expected a JSON object with 'question' and 'answer' ({exc})"
                ) from exc
    if not pairs:
        raise ModelPrepareError(f"agreement text file {path} holds no question/answer lines")
    return pairs


def agreement_pairs(data: Path | None = None, n: int = AGREEMENT_TEXTS) -> tuple[str, list[tuple[str, str]]]:
    """(text-set label, pairs): `data`, else $SPECBOOK_AGREEMENT_DATA, else the built-in texts."""
    if data is None and os.environ.get(AGREEMENT_DATA_ENV):
        data = Path(os.environ[AGREEMENT_DATA_ENV])
    if data is None:
        return "builtin", list(BUILTIN_TEXTS[:n])
    return f"{Path(data).name}[:{n}]", load_qa_jsonl(Path(data), n)


@dataclass(frozen=True)
class EncodedTexts:
    """Chat-rendered token ids, where each assistant answer starts, and a digest of the ids."""

    label: str
    ids: list[list[int]]
    answer_start: list[int]

    @property
    def sha256(self) -> str:
        return sha256_bytes(json.dumps(self.ids))


def encode_pairs(tokenizer, label: str, pairs: list[tuple[str, str]], max_tokens: int = AGREEMENT_MAX_TOKENS) -> EncodedTexts:
    ids, starts = [], []
    for question, answer in pairs:
        user = [{"role": "user", "content": question}]
        prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(
            [*user, {"role": "assistant", "content": answer}], tokenize=False
        )
        ids.append(tokenizer(full, add_special_tokens=False).input_ids[:max_tokens])
        starts.append(len(tokenizer(prompt, add_special_tokens=False).input_ids))
    return EncodedTexts(label=label, ids=ids, answer_start=starts)


def top1_predictions(model_dir: Path, texts: EncodedTexts) -> list:
    """Argmax next-token ids at every position of every text (float32 compute on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    preds = []
    with torch.inference_mode():
        for ids in texts.ids:
            logits = model(torch.tensor([ids])).logits[0]
            preds.append(logits.argmax(dim=-1))
    return preds


def agreement_from_predictions(target: list, draft: list, texts: EncodedTexts) -> dict:
    """Agreement at the positions that predict the assistant answer (what a draft proposes when
    serving), and over all positions of the rendered chat (system prompt and question included)."""
    same = total = same_ans = total_ans = 0
    for t, d, start, ids in zip(target, draft, texts.answer_start, texts.ids, strict=True):
        n = len(ids) - 1  # the last position predicts past the text
        eq = t[:n] == d[:n]
        same += int(eq.sum())
        total += n
        ans = eq[max(start - 1, 0):]  # position start-1 predicts the answer's first token
        same_ans += int(ans.sum())
        total_ans += int(ans.numel())
    if total_ans == 0:
        raise ModelPrepareError(f"agreement text set {texts.label!r} has no answer positions to compare")
    return {
        "top1_agreement": same_ans / total_ans,
        "positions": total_ans,
        "top1_agreement_all_positions": same / total,
        "all_positions": total,
    }
