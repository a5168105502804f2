"""The i.i.d. acceptance-length formula, the agreement count, and the agreement text sources."""

from __future__ import annotations

import json

import pytest
import torch

from specbook.core.errors import ModelPrepareError
from specbook.models import agreement as agr


@pytest.mark.parametrize("p", [0.0, 0.3, 0.75, 0.94, 0.999])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_expected_al_is_the_geometric_sum(p, k):
    assert agr.expected_acceptance_length(p, k) == pytest.approx(sum(p**i for i in range(k + 1)))


def test_expected_al_edges():
    assert agr.expected_acceptance_length(0.0, 4) == 1.0
    assert agr.expected_acceptance_length(1.0, 4) == 5.0
    assert agr.expected_acceptance_length(0.5, 4) == pytest.approx(1.9375)
    assert agr.expected_acceptance_length(0.8, 4) < agr.expected_acceptance_length(0.9, 4)


@pytest.mark.parametrize("p,k", [(-0.1, 4), (1.2, 4), (0.5, -1)])
def test_expected_al_rejects_bad_input(p, k):
    with pytest.raises(ValueError):
        agr.expected_acceptance_length(p, k)


def test_agreement_counts_answer_and_all_positions():
    # text of 6 tokens, answer starts at index 3: positions 2,3,4 predict answer tokens (5 predicts past the end)
    texts = agr.EncodedTexts(label="t", ids=[[0, 1, 2, 3, 4, 5]], answer_start=[3])
    target = [torch.tensor([7, 7, 7, 7, 7, 9])]
    draft = [torch.tensor([7, 8, 7, 8, 7, 0])]
    got = agr.agreement_from_predictions(target, draft, texts)
    assert got["all_positions"] == 5 and got["top1_agreement_all_positions"] == pytest.approx(3 / 5)
    assert got["positions"] == 3 and got["top1_agreement"] == pytest.approx(2 / 3)


def test_agreement_needs_answer_positions():
    texts = agr.EncodedTexts(label="empty", ids=[[0, 1]], answer_start=[5])
    with pytest.raises(ModelPrepareError, match="empty"):
        agr.agreement_from_predictions([torch.tensor([1, 1])], [torch.tensor([1, 1])], texts)


def test_load_qa_jsonl_takes_the_first_n(tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"a{i}"}) + "\n" for i in range(5)))
    assert agr.load_qa_jsonl(f, 3) == [("q0", "a0"), ("q1", "a1"), ("q2", "a2")]


def test_load_qa_jsonl_names_file_and_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n" + json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ModelPrepareError, match=r"bad\.jsonl:2"):
        agr.load_qa_jsonl(f, 5)
    with pytest.raises(ModelPrepareError, match="missing.jsonl"):
        agr.load_qa_jsonl(tmp_path / "missing.jsonl")


def test_agreement_pairs_default_env_and_builtin(tmp_path, monkeypatch):
    monkeypatch.delenv(agr.AGREEMENT_DATA_ENV, raising=False)
    label, pairs = agr.agreement_pairs()
    assert label == "builtin" and len(pairs) == len(agr.BUILTIN_TEXTS)
    f = tmp_path / "qa.jsonl"
    f.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    monkeypatch.setenv(agr.AGREEMENT_DATA_ENV, str(f))
    assert agr.agreement_pairs() == ("qa.jsonl[:32]", [("q", "a")])


class _CharTokenizer:
    """Stands in for a tokenizer (not an engine): one id per character, a ChatML-ish template."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<{m['role']}>{m['content']}|" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        class _Enc:
            input_ids = [ord(c) for c in text]

        return _Enc()


def test_encode_pairs_marks_where_the_answer_starts():
    enc = agr.encode_pairs(_CharTokenizer(), "t", [("hi", "yo")], max_tokens=100)
    text = "".join(chr(i) for i in enc.ids[0])
    assert text == "<user>hi|<assistant>yo|"
    assert text[enc.answer_start[0]:] == "yo|"
    assert len(enc.sha256) == 64
