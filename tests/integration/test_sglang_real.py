"""Real SGLang (CUDA only) with the embedded model and its int4 draft: the adapter's argv serves, its counters
agree with SGLang's own per-request counts, its log and start-up lines parse, and specbook's step timer splits
its decode step (graphs on) for a draft model and for ngram.

SGLang has no CPU wheel: on a host without a CUDA GPU and SGLang importable (installed, or a folder named by
$SPECBOOK_SGLANG_SITE, as scripts/sglang/ carries it to the lent GPU) these tests are skipped, saying so. The
CPU tiers check the same parsers on verbatim output of a real server (tests/unit/test_sglang.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import httpx
import pytest

from specbook.engines import EngineConfig, get_engine, launch
from specbook.engines.sglang import adapter
from specbook.engines.sglang.logparse import decode_lines_frame
from specbook.engines.sglang.startup import log_startup_facts
from specbook.measure import costsplit
from specbook.models import DRAFT_INT4, TARGET
from specbook.serve.client import ChatRequest
from specbook.serve.metrics import scrape
from specbook.store.runstore import RunContext

K = 4


def _why_not() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "no CUDA GPU here (no nvidia-smi): SGLang has no CPU wheel"
    where = os.environ.get(adapter.SITE_ENV)
    if not where and importlib.util.find_spec("sglang") is None:
        return f"SGLang is not importable and ${adapter.SITE_ENV} is unset (scripts/sglang/ carries it)"
    return None


pytestmark = [pytest.mark.integration, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]

PROMPTS = ["Count from 1 to 30, one number per line.", "Write a short paragraph explaining how a bicycle works.",
           "Write the word 'yes' 20 times.", "Explain what a hash table is to a new programmer."]


def test_a_draft_model_server_counts_what_its_responses_report(tmp_path):
    spec = {"method": "draft_model", "model": DRAFT_INT4, "num_speculative_tokens": K}
    cfg = EngineConfig(engine="sglang", model=TARGET, served_model_name="smollm2", max_num_seqs=4, enforce_eager=True,
                       speculative_config=spec, extra_args=["--mem-fraction-static", "0.2"])
    log = tmp_path / "sglang.log"
    with launch(cfg, name="sglang", log_path=log) as srv:
        before = scrape(srv.base_url)
        meta = []
        for text in PROMPTS:
            body = {"model": "smollm2", "messages": [{"role": "user", "content": text}], "max_tokens": 128,
                    "temperature": 0, "return_meta_info": True}
            resp = httpx.post(srv.base_url + "/v1/chat/completions", json=body, timeout=300, trust_env=False)
            resp.raise_for_status()
            meta.append(resp.json()["choices"][0]["meta_info"])
        after = scrape(srv.base_url)
    acc = get_engine("sglang").spec_decode_delta(before, after, "smollm2", cfg=cfg).acceptance
    assert acc.drafts == sum(m["spec_verify_ct"] for m in meta) > 0
    assert acc.draft_tokens == K * acc.drafts
    exact = sum(m["spec_num_correct_drafts"] for m in meta)
    assert acc.accepted_tokens <= exact <= acc.accepted_tokens + K * len(meta)
    facts = log_startup_facts(log)
    assert facts["speculative_algorithm"] == "STANDALONE" and facts["attention_backend_draft"]
    frame = decode_lines_frame(log.read_text().splitlines())
    assert frame.empty or frame["printed_al"].between(1, K + 1).all()


@pytest.mark.parametrize("spec", [{"method": "draft_model", "model": DRAFT_INT4, "num_speculative_tokens": K},
                                  {"method": "ngram", "num_speculative_tokens": K}], ids=["draft_model", "ngram"])
def test_the_step_timer_splits_a_graphed_decode_step(tmp_path, spec):
    run = RunContext(tmp_path / "run")
    cfg = EngineConfig(engine="sglang", model=TARGET, served_model_name="smollm2", max_num_seqs=1,
                       speculative_config=spec, extra_args=["--mem-fraction-static", "0.2"])
    requests = [ChatRequest(prompt_id=f"p{i}", messages=[{"role": "user", "content": text}], max_tokens=128)
                for i, text in enumerate(PROMPTS[:2])]
    split = costsplit.profiled_pass(cfg, requests, run, name="prof-sglang", lane=spec["method"])
    assert split.source == "step_timer" and split.engine == "sglang" and split.steps >= 10
    assert split.tokens_per_step == 1 + K
    for part in ("target_forward", "draft", "sampling"):
        assert split.parts_ms[part] > 0, part
    assert "CUDA events" in split.note and split.overhead > 0
    folder = run.run_dir / "profiles" / "prof-sglang"
    statuses = [json.loads(p.read_text()) for p in folder.glob("sglang-steps-*.status.json")]
    assert statuses and not any(s["refused"] for s in statuses)
    assert not (folder / "on").exists()
