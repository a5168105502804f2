"""vLLM's trace plugin records proposals only while its switch file exists (TRACE_DIR/tracing), so one server
serves timed windows with it installed and off, then its trace pass with it on. The plugin wraps a runner class
written here with the method names and source lines of vLLM's V1 runner (the real one needs a model to step)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from specbook.engines.vllm import trace_plugin
from specbook.engines.vllm.tracer import recording
from specbook.traces.records import read_trace_dir

RUNNER_SOURCE = textwrap.dedent('''
    class _State:
        def __init__(self, prompt, output):
            self.prompt_token_ids, self.output_token_ids = prompt, output

    class _Batch:
        def __init__(self, ids):
            self.req_ids = ids

    class GPUModelRunner:
        """A stand-in with the V1 runner's API as the plugin reads it."""

        def __init__(self):
            self.requests = {"r1": _State([1, 2, 3], [])}
            self.input_batch = _Batch(["r1"])
            self.speculative_config = None

        def propose_draft_token_ids(self, *args):
            return [[7, 8] for _ in self.input_batch.req_ids]

        def sample_tokens(self, *args):
            req_state = self.requests["r1"]
            self._draft_token_ids = self.propose_draft_token_ids(None)
            req_state.output_token_ids.extend([5])
            return self._draft_token_ids
''')


@pytest.fixture
def runner_module(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    import vllm.v1.worker as worker

    path = tmp_path / "gpu_model_runner.py"
    path.write_text(RUNNER_SOURCE)
    spec = importlib.util.spec_from_file_location(trace_plugin.RUNNER_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, trace_plugin.RUNNER_MODULE, module)
    monkeypatch.setattr(worker, "gpu_model_runner", module, raising=False)
    return module


def test_the_plugin_installed_records_nothing_while_off_and_every_step_while_on(tmp_path, runner_module):
    folder = tmp_path / "trace"
    status = trace_plugin.install(folder)
    assert status["patched"] and "refused" not in status
    runner = runner_module.GPUModelRunner()
    assert runner.sample_tokens() == [[7, 8]]  # off: the step runs as before and nothing is written
    records, _ = read_trace_dir(folder)
    assert records == []
    with recording(folder):
        assert (folder / trace_plugin.TRACE_SWITCH).exists()
        runner.sample_tokens()
    assert not (folder / trace_plugin.TRACE_SWITCH).exists()
    runner.sample_tokens()  # off again
    records, statuses = read_trace_dir(folder)
    assert [(r.request_id, r.anchor_pos, list(r.proposed)) for r in records] == [("r1", 5, [7, 8])]
    assert statuses[0]["patched"]


def test_the_switch_is_removed_when_the_pass_fails(tmp_path):
    with pytest.raises(RuntimeError), recording(tmp_path / "t"):
        raise RuntimeError("the pass failed")
    assert not (tmp_path / "t" / trace_plugin.TRACE_SWITCH).exists()
