"""Real SGLang 0.5.15.post1 on this CPU machine, speculation off, with the embedded model: specbook's step timer in its
scheduler, started through specbook's adapter and launcher, splits its decode step.

SGLang has no CPU build; `make sglang-cpu` (scripts/sglang/cpu_site.py) makes a folder in which its Python serves
with `--device cpu`, two packages it imports but does not call there stood in for (sgl_kernel: its CUDA kernels;
torchvision). Its speculative workers need CUDA (NGRAM is refused without it, STANDALONE runs a Triton GPU
kernel), so their wrappers are checked on their source here (tests/unit/test_sglang_step_timer.py) and on the GPU
(tests/integration/test_sglang_real.py, scripts/sglang/check_hooks.py, capture.py --step-timer).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.sglang_cpu_site import cpu_site, why_not

from specbook.engines import EngineConfig
from specbook.engines.sglang import adapter, step_hooks
from specbook.engines.sglang.startup import log_startup_facts
from specbook.measure import costsplit
from specbook.models import TARGET
from specbook.serve.client import ChatRequest
from specbook.store.runstore import RunContext

pytestmark = [pytest.mark.integration, pytest.mark.skipif(why_not() is not None, reason=str(why_not()))]

PROMPTS = ["Count from 1 to 30, one number per line.", "Write the word 'yes' 20 times."]


def test_sglang_cpu_step_timer_splits_the_decode_step_in_its_scheduler(tmp_path, monkeypatch):
    monkeypatch.setenv(adapter.SITE_ENV, cpu_site())
    run = RunContext(tmp_path / "run")
    cfg = EngineConfig(engine="sglang", model=TARGET, served_model_name="smollm2", max_num_seqs=1, enforce_eager=True,
                       ready_timeout_s=600, extra_args=["--device", "cpu", "--mem-fraction-static", "0.05"])
    requests = [ChatRequest(prompt_id=f"p{i}", messages=[{"role": "user", "content": text}], max_tokens=32)
                for i, text in enumerate(PROMPTS)]
    split = costsplit.profiled_pass(cfg, requests, run, name="prof-sglang-off", lane="off")
    assert split.source == "step_timer" and split.engine == "sglang" and split.lane == "off"
    assert split.steps >= 10 and split.tokens_per_step == 1.0
    assert split.parts_ms["target_forward"] > 0 and split.parts_ms["sampling"] > 0 and split.parts_ms["draft"] == 0
    assert split.parts_ms["target_forward"] < split.step_ms  # a part of the period, timed inside it
    assert "wall-clock timers" in split.note and split.overhead > 0
    record = json.loads((run.run_dir / "servers.jsonl").read_text().splitlines()[-1])
    assert record["status"] == "ok" and record["argv"][1].endswith("engines/sglang/launch.py")
    folder = run.run_dir / "profiles" / "prof-sglang-off"
    statuses = [json.loads(p.read_text()) for p in folder.glob(f"{step_hooks.STEP_PREFIX}-steps-*.status.json")]
    scheduler = [s for s in statuses if s["patched"]]
    assert scheduler and not any(s["refused"] for s in statuses)
    assert {"sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
            "sglang.srt.model_executor.model_runner.ModelRunner.forward"} <= set(scheduler[0]["patched"])
    lines = step_hooks_lines(folder)
    assert lines and {line["pid"] for line in lines} == {scheduler[0]["pid"]}  # the spawned scheduler stepped
    assert not (folder / "on").exists()
    assert log_startup_facts(run.run_dir / record["log_path"])  # its start-up lines parse on a CPU log too


def step_hooks_lines(folder: Path) -> list[dict]:
    from specbook.engines import steptimer

    return steptimer.load_steps(folder, step_hooks.STEP_PREFIX)
