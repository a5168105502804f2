"""The cross-engine path with an SGLang side, end to end on the CPU: `specbook run cross_engine -f
params/cross_engine/cpu-sglang.yaml` (SGLang's Python with --device cpu from `make sglang-cpu`, speculation off,
against llama.cpp): its timed pass, its cost split from SGLang's step timer beside llama.cpp's perf lines, and the
report. What SGLang does on a GPU is checked there (tests/integration/test_sglang_real.py). Slow tier: about 4 min.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.sglang_cpu_site import cpu_site, why_not

from specbook.core.params import load_params
from specbook.engines.sglang.adapter import SITE_ENV
from specbook.experiments import cross_engine as ce
from specbook.store.runstore import RunContext

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.skipif(why_not() is not None, reason=str(why_not()))]


@pytest.fixture(scope="module")
def sglang_run(tmp_path_factory, run_book) -> Path:
    before = os.environ.get(SITE_ENV)
    os.environ[SITE_ENV] = cpu_site()
    try:
        return run_book("cross_engine", "params/cross_engine/cpu-sglang.yaml", [], tmp_path_factory.mktemp("outputs"),
                        timeout=1500)
    finally:
        if before is None:
            os.environ.pop(SITE_ENV, None)
        else:
            os.environ[SITE_ENV] = before


def test_sglang_side_is_timed_and_split_by_its_step_timer_beside_llamacpp(sglang_run):
    params = load_params(ce.CrossEngineParams, sglang_run / "params.yaml")
    result = ce.analyze(ce.load(RunContext.from_run_dir(sglang_run)), params)
    assert json.loads((sglang_run / "manifest.json").read_text())["status"] == "ok"
    split = result.cost_split.set_index("engine")
    assert set(split.index) == {"sglang-cpu", "llamacpp"}
    sglang = split.loc["sglang-cpu"]
    assert sglang["source"] == "step_timer" and sglang["steps"] > 10 and sglang["overhead"] > 0
    assert sglang["target_forward_ms"] > 0 and sglang["sampling_ms"] > 0 and sglang["draft_ms"] == 0
    assert "SGLang's scheduler" in sglang["note"]
    assert split.loc["llamacpp", "source"] == "engine_log"
    records = [json.loads(line) for line in (sglang_run / "servers.jsonl").read_text().splitlines()]
    sglang_servers = [r for r in records if r["versions"].get("engine") == "sglang"]
    assert sglang_servers and all(r["argv"][1].endswith("engines/sglang/launch.py") for r in sglang_servers)
    assert list(result.headline["lane"]) == ["off"]
    html = (sglang_run / "report.html").read_text()
    assert "Per-step cost split" in html and "SGLang's scheduler" in html
