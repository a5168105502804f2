"""Multi-turn conversations (MT-Bench's second turn follows the model's own first answer): how the client
builds and sends follow-up turns, against the stub OpenAI server (client behaviour only, no engine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from specbook.serve.client import ChatRequest, records_frame, run_requests, turn_id

_STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "openai_sse.py"


@pytest.fixture
def stub():
    spec = importlib.util.spec_from_file_location("openai_sse_stub_turns", _STUB)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    server, url, state = mod.serve_in_thread()
    yield url, state
    server.shutdown()


def conversation(pid: str, first: str, *follow_up: str, **kw) -> ChatRequest:
    return ChatRequest(prompt_id=pid, messages=[{"role": "user", "content": first}], follow_up=list(follow_up),
                       category="mt_bench", **kw)


def test_next_turn_appends_the_answer_and_the_next_user_turn():
    req = conversation("q", "first?", "second?", "third?", max_tokens=7)
    two = req.next_turn("answer one", turn_id("q", 2))
    assert two.prompt_id == "q/turn2" and two.follow_up == ["third?"] and two.max_tokens == 7
    assert two.messages == [{"role": "user", "content": "first?"}, {"role": "assistant", "content": "answer one"},
                            {"role": "user", "content": "second?"}]
    three = two.next_turn("answer two", turn_id("q", 3))
    assert [m["content"] for m in three.messages] == ["first?", "answer one", "second?", "answer two", "third?"]
    assert "follow_up" not in two.payload("m", stream=True) and "category" not in two.payload("m", stream=True)
    with pytest.raises(ValueError, match="no follow-up turn left"):
        three.next_turn("x", "q/turn4")
    with pytest.raises(ValueError, match="'follow_up' turns need a chat request"):
        ChatRequest(prompt_id="p", prompt="text", follow_up=["more"])


@pytest.mark.parametrize("stream", [True, False])
async def test_follow_ups_are_sent_after_the_answer_they_continue(stub, stream):
    url, state = stub
    reqs = [conversation("c1", "hello", "go on", max_tokens=3),
            ChatRequest(prompt_id="single", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                        category="qa")]
    recs = await run_requests(url, "stub", reqs, concurrency=2, stream=stream, progress=False)
    assert [(r.prompt_id, r.turn, r.category) for r in recs] == [
        ("c1", 1, "mt_bench"), ("c1/turn2", 2, "mt_bench"), ("single", 1, "qa")]
    assert all(r.error is None for r in recs)
    second = next(b for b in state.bodies if len(b["messages"]) == 3)
    # the second turn carries the model's own first answer, as the server streamed it
    assert second["messages"][1] == {"role": "assistant", "content": recs[0].output_text}
    assert recs[0].output_text == "w0 w1 w2 " and second["messages"][2]["content"] == "go on"
    assert recs[1].started_at >= recs[0].started_at + recs[0].wall_s - 0.05  # sent after the first returned
    frame = records_frame(recs)
    assert list(frame["turn"]) == [1, 2, 1] and list(frame["category"]) == ["mt_bench", "mt_bench", "qa"]


async def test_a_failed_first_turn_leaves_the_follow_up_unsent_and_named(stub):
    url, state = stub
    recs = await run_requests(url, "stub", [conversation("bad", "FAIL please", "then?"),
                                            conversation("ok", "fine", "then?", max_tokens=2)], progress=False)
    assert [r.prompt_id for r in recs] == ["bad", "bad/turn2", "ok", "ok/turn2"]
    assert recs[0].error.startswith("ClientError: HTTP 500")
    assert recs[1].error.startswith("not sent: turn 1 failed (ClientError: HTTP 500")
    assert recs[2].error is None and recs[3].error is None
    assert sum(1 for b in state.bodies if "then?" in str(b["messages"])) == 1  # only ok's second turn went out
