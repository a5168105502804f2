"""SGLang's step timer: the wrappers' API against SGLang 0.5.15.post1's source lines, the launcher's import hook in a
spawned process, the step records and their reduction to a cost split.

SGLang has no CPU wheel, so no SGLang runs here. The launcher test runs launch.py by path against a stand-in
`sglang` package written below: it checks the launcher's own mechanism (the hook installed again in a process
spawned by multiprocessing, the modules wrapped as they are imported, the lines written), not SGLang's behaviour.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specbook.core.errors import EngineError
from specbook.engines import get_engine, steptimer
from specbook.engines.base import EngineConfig
from specbook.engines.sglang import launch, profile, step_hooks

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sglang" / "step-api-0.5.15.post1.txt"


def _source_blocks(path: Path) -> dict[str, str]:
    blocks: dict[str, list[str]] = {}
    current = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("== "):
            current = line[3:]
            blocks[current] = []
        elif current is not None and not line.startswith("#"):
            blocks[current].append(line.partition(":")[2])
    return {name: "\n".join(lines) for name, lines in blocks.items()}


def test_the_wrappers_find_what_they_need_in_sglang_0_5_15_post1():
    blocks = _source_blocks(FIXTURE)
    assert set(blocks) == set(step_hooks.REQUIRED_SOURCE)
    for module, source in blocks.items():
        assert step_hooks.api_problems(module, source) == [], module


def test_a_module_without_the_api_is_named_with_what_it_lacks():
    source = _source_blocks(FIXTURE)[step_hooks.NGRAM].replace("def _prepare_for_speculative_decoding(", "def _x(")
    assert step_hooks.api_problems(step_hooks.NGRAM, source) == ["NGRAMWorker._prepare_for_speculative_decoding"]


def test_the_launcher_reads_the_same_switch_variable_as_the_timer():
    assert launch.STEP_TIMING_DIR_ENV == steptimer.STEP_TIMING_DIR_ENV


# ---- what a step records


class _Mode:
    """SGLang's ForwardMode as far as batch_fields reads it: is_extend() holds for a target verify too."""

    def __init__(self, extend: bool, verify: bool = False):
        self.extend, self.verify = extend, verify

    def is_extend(self) -> bool:
        return self.extend or self.verify

    def is_target_verify(self) -> bool:
        return self.verify


class _Batch:
    def __init__(self, n: int, extend: bool = False):
        self.reqs = [object()] * n
        self.forward_mode = _Mode(extend)


def test_a_verify_step_schedules_one_plus_k_tokens_per_request_and_a_prefill_is_never_a_decode_step():
    verify = step_hooks.batch_fields(_Batch(3), draft_tokens=5)
    assert verify | {"runner": None} == {"runner": None, "spec_k": 4, "num_reqs": 3, "new_reqs": 0, "tokens": 15,
                                         "max_tokens_per_req": 5}
    assert steptimer.is_decode(verify)
    prefill = step_hooks.batch_fields(_Batch(2, extend=True), draft_tokens=5)
    assert prefill["new_reqs"] == 2 and not steptimer.is_decode(prefill)
    verifying = _Batch(3)
    verifying.forward_mode = _Mode(extend=False, verify=True)  # NGRAM's batch once its drafts are prepared
    assert step_hooks.batch_fields(verifying, draft_tokens=5)["new_reqs"] == 0
    off = step_hooks.batch_fields(_Batch(4), draft_tokens=1)
    assert (off["spec_k"], off["tokens"], off["max_tokens_per_req"]) == (0, 4, 1) and steptimer.is_decode(off)


def _wrapped_classes(folder: Path):
    """Plain classes with SGLang's method names, wrapped the way step_hooks.patch wraps SGLang's."""
    steps = step_hooks.Steps(folder, steptimer, cuda=False)

    class Runner:
        def forward(self, batch):
            return "logits"

        def sample(self, logits, batch):
            return [1]

    class TpWorker:
        runner = Runner()

        def forward_batch_generation(self, batch=None, is_verify=False):
            out = self.runner.forward(batch)
            return out if is_verify else self.runner.sample(out, batch)

    class Draft:
        def draft(self, batch):
            Runner().forward(batch)  # the draft model's forward: inside `draft`, never target_forward
            return "verify_input"

    class SpecWorker:
        speculative_num_draft_tokens = 5
        target = TpWorker()
        drafter = Draft()

        def forward_batch_generation(self, batch, on_publish=None):
            self.drafter.draft(batch)
            self.target.forward_batch_generation(batch, is_verify=True)
            return "result"

    Runner.forward = steps.part("target_forward", Runner.forward)
    Runner.sample = steps.part("sampling", Runner.sample)
    TpWorker.forward_batch_generation = steps.step(TpWorker.forward_batch_generation, step_hooks._no_draft)
    Draft.draft = steps.part("draft", Draft.draft)
    SpecWorker.forward_batch_generation = steps.step(SpecWorker.forward_batch_generation,
                                                     step_hooks._spec_draft_tokens)
    return steps, TpWorker, SpecWorker


def _lines(folder: Path, want: int) -> list[dict]:
    assert steptimer.settled_lines(folder, step_hooks.STEP_PREFIX) == want
    return steptimer.load_steps(folder, step_hooks.STEP_PREFIX)


def test_a_speculative_step_is_one_line_with_its_draft_and_target_forward_and_nothing_while_the_switch_is_off(
        tmp_path):
    steps, _, SpecWorker = _wrapped_classes(tmp_path)
    worker = SpecWorker()
    assert worker.forward_batch_generation(_Batch(2)) == "result"  # off: runs as before
    with steptimer.recording(tmp_path):
        worker.forward_batch_generation(_Batch(2))
        worker.forward_batch_generation(_Batch(2))
    worker.forward_batch_generation(_Batch(2))
    lines = _lines(tmp_path, 2)
    assert len(lines) == 2
    for line in lines:
        assert set(line["parts_ms"]) == {"draft", "target_forward"}  # the draft's own forward is inside draft
        assert (line["num_reqs"], line["tokens"], line["spec_k"], line["timer"]) == (2, 10, 4, "wall_clock")
    assert steps.depth == 0


def test_with_speculation_off_the_tp_worker_call_is_the_step(tmp_path):
    _, TpWorker, _ = _wrapped_classes(tmp_path)
    with steptimer.recording(tmp_path):
        assert TpWorker().forward_batch_generation(_Batch(3)) == [1]
    (line,) = _lines(tmp_path, 1)
    assert set(line["parts_ms"]) == {"target_forward", "sampling"} and line["spec_k"] == 0


def test_the_launcher_wraps_sglang_in_the_process_sglang_spawns(tmp_path):
    """launch.py by path, against a stand-in `sglang` whose launch_server spawns a child that imports a module
    the hook wraps (the way SGLang's scheduler imports tp_worker) and steps it; and imports cProfile, which the
    launcher's folder on sys.path would break (its profile.py)."""
    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt" / "managers").mkdir(parents=True)
    for init in (pkg, pkg / "srt", pkg / "srt" / "managers"):
        (init / "__init__.py").write_text("")
    (pkg / "srt" / "managers" / "tp_worker.py").write_text(textwrap.dedent("""
        class Batch:
            def __init__(self):
                self.reqs = [0, 0]

        class TpModelWorker(object):
            def forward_batch_generation(self, batch=None):
                return len(batch.reqs)
        """))
    (pkg / "child.py").write_text(textwrap.dedent("""
        import glob
        import os
        import time

        def run(out):
            from sglang.srt.managers.tp_worker import Batch, TpModelWorker
            worker = TpModelWorker()
            results = [worker.forward_batch_generation(Batch()) for _ in range(3)]
            # the timer's writer is a daemon thread: wait for its lines before this process exits
            pattern = os.path.join(os.environ["SPECBOOK_STEP_TIMING_DIR"], "sglang-steps-*.jsonl")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if sum(open(p).read().count("\\n") for p in glob.glob(pattern)) >= 3:
                    break
                time.sleep(0.05)
            with open(out, "w") as fh:
                fh.write(f"{os.getpid()} {results}")
        """))
    (pkg / "launch_server.py").write_text(textwrap.dedent("""
        import cProfile  # the standard library's `profile`, not the launcher's neighbour profile.py (torch does this)
        import multiprocessing as mp
        import sys

        if __name__ == "__main__":
            from sglang import child
            mp.set_start_method("spawn", force=True)
            proc = mp.Process(target=child.run, args=(sys.argv[-1],))
            proc.start()
            proc.join()
            sys.exit(proc.exitcode)
        """))
    timing = tmp_path / "steps"
    timing.mkdir()
    steptimer.switch(timing, True)
    out = tmp_path / "child.txt"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), launch.STEP_TIMING_DIR_ENV: str(timing)}
    done = subprocess.run([sys.executable, str(profile.LAUNCHER), "--model-path", "m", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    child_pid, results = out.read_text().split(" ", 1)
    assert results == "[2, 2, 2]"
    lines = steptimer.load_steps(timing, step_hooks.STEP_PREFIX)
    assert len(lines) == 3 and {line["pid"] for line in lines} == {int(child_pid)}
    assert all(line["num_reqs"] == 2 and line["tokens"] == 2 for line in lines)
    status = json.loads((timing / f"sglang-steps-{child_pid}.status.json").read_text())
    assert status["patched"] == ["sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation"]
    assert status["refused"] == {}


def test_a_module_whose_api_changed_is_left_unwrapped_and_the_status_says_why(tmp_path):
    module = type(sys)("sglang.srt.speculative.ngram_worker")
    installer = step_hooks.Installer(tmp_path, steptimer)
    installer(module)  # no source to read: refused, named
    status = json.loads(next(tmp_path.glob("sglang-steps-*.status.json")).read_text())
    assert list(status["refused"]) == [step_hooks.NGRAM] and status["patched"] == []
    with pytest.raises(EngineError, match="refused: .*ngram_worker"):
        profile.split(tmp_path)


# ---- the reduction


def _step(t_ms: float, *, parts: dict[str, float], k: int = 4, new: int = 0, n: int = 2) -> dict:
    return {"t0_ns": int(t_ms * 1e6), "timer": "cuda_events", "spec_k": k, "num_reqs": n, "new_reqs": new,
            "tokens": n * (k + 1), "max_tokens_per_req": k + 1, "parts_ms": parts}


def test_the_split_averages_decode_steps_followed_by_a_decode_step_and_leaves_the_rest():
    parts = {"draft": 2.0, "target_forward": 4.0, "sampling": 1.0}
    steps = [_step(0, parts=parts, new=2), _step(20, parts=parts), _step(30, parts=parts), _step(40, parts=parts),
             _step(52, parts=parts)]
    split = profile.reduce_steps(steps)
    assert split.steps == 3  # the prefill and the last step open no counted period
    assert split.step_ms == pytest.approx((10 + 10 + 12) / 3)
    assert split.parts_ms["rest"] == pytest.approx(split.step_ms - 7.0)
    assert split.tokens_per_step == 5.0 and "negative" not in split.note


def test_a_lane_without_speculation_has_no_draft_and_an_overlapped_step_says_its_rest_is_negative():
    steps = [_step(t, parts={"target_forward": 6.0, "sampling": 1.0}, k=0) for t in (0, 5, 10)]
    split = profile.reduce_steps(steps)
    assert split.parts_ms["draft"] == 0.0 and split.parts_ms["rest"] == pytest.approx(-2.0)
    assert "add up to more than the period" in split.note


def test_no_decode_step_is_an_error_that_says_what_to_check():
    with pytest.raises(EngineError, match="no decode step followed by another"):
        profile.reduce_steps([_step(0, parts={}, new=1), _step(5, parts={})])
    assert math.isnan(steptimer.decode_means([], ("draft",)).step_ms)


def test_no_status_file_means_the_launcher_did_not_run(tmp_path):
    with pytest.raises(EngineError, match="no status file"):
        profile.split(tmp_path)


def test_a_profiled_config_starts_sglang_through_the_launcher_and_the_plain_one_does_not(tmp_path):
    engine = get_engine("sglang")
    cfg = EngineConfig(engine="sglang", model="org/m")
    assert engine.build_argv(cfg, host="127.0.0.1", port=30000)[1:3] == ["-m", "sglang.launch_server"]
    profiled = engine.profiler.profiled_config(cfg, tmp_path)
    argv = engine.build_argv(profiled, host="127.0.0.1", port=30000)
    assert argv[1] == str(profile.LAUNCHER) and argv[2] == "--model-path"
    assert engine.build_env(profiled)[steptimer.STEP_TIMING_DIR_ENV] == str(tmp_path.resolve())
    with pytest.raises(EngineError, match="already sets"):
        engine.profiler.profiled_config(profiled, tmp_path)


def test_the_profiled_pass_empties_a_remembering_drafter_before_each_request_of_each_send(tmp_path):
    """costsplit.profile_phase with `forget` (what cross_engine passes for SGLang's NGRAM under draft_memory
    forget): every request of the warm-up, unprofiled and profiled sends goes alone, after its own forget."""
    from specbook.measure import costsplit

    calls: list[str] = []

    class Window:
        wall_s, log = 1.0, None

    class Server:
        cfg = EngineConfig(engine="sglang", model="m")

        def send(self, requests):
            calls.append("send " + ",".join(requests))
            step = {"t0_ns": len(calls) * 10_000_000, "timer": "wall_clock", "spec_k": 4, "num_reqs": 1,
                    "new_reqs": 0, "tokens": 5, "max_tokens_per_req": 5, "parts_ms": {"draft": 1.0}}
            if steptimer.STEP_TIMING_SWITCH in {p.name for p in tmp_path.iterdir()}:
                with open(tmp_path / "sglang-steps-1.jsonl", "a") as fh:
                    fh.write(json.dumps(step) + "\n")

        def window(self, fn, flush_wait_s):
            fn()
            return Window()

    split = costsplit.profile_phase(Server(), ["a", "b"], tmp_path, lane="ngram",
                                    forget=lambda: calls.append("forget"))
    assert calls == ["forget", "send a", "forget", "send b"] * 3
    assert split.steps == 1 and split.engine == "sglang" and split.parts_ms["draft"] == 1.0
    calls.clear()
    costsplit.profile_phase(Server(), ["a", "b"], tmp_path, lane="ngram")
    assert calls == ["send a,b"] * 3


def test_what_the_launcher_loads_by_path_imports_only_the_standard_library_at_import():
    """SGLang's site comes first on its server's PYTHONPATH: launch.py, steptimer.py and step_hooks.py must not pull
    specbook's dependencies into SGLang's processes (torch is imported inside a function, where SGLang has it)."""
    import ast

    for path in (profile.LAUNCHER, Path(steptimer.__file__), Path(step_hooks.__file__)):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        names = {alias.name.split(".")[0] for node in top if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module.split(".")[0] for node in top if isinstance(node, ast.ImportFrom) and node.module}
        assert names - {"__future__"} <= set(sys.stdlib_module_names), (path.name, names)
