"""Guards on crafted outputs (each guard alone) and on real outputs captured from the engines."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from specbook.experiments.cross_engine.guards import (
    DEGENERATE,
    DIVERGED,
    LEFT_TASK,
    LENGTH_MISMATCH,
    MISSING,
    PROMPT_MISMATCH,
    REPEATS_DIFFER,
    SPEC_MISMATCH,
    GuardThresholds,
    SideOutputs,
    degenerate_reasons,
    distinct_token_ratio,
    divergence_is_material,
    first_divergence,
    guard_cell,
    left_task_reason,
    length_mismatch,
    longest_count,
    longest_loop,
    most_covering_ngram,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp"


def prose(n: int, seed: int = 0) -> list[int]:
    """Ordinary text stand-in: ids drawn from a large vocabulary (no loop, high distinct ratio)."""
    rng = random.Random(seed)
    return [rng.randrange(2, 49152) for _ in range(n)]


def test_the_real_case_eight_ids_in_128_tokens_is_degenerate():
    loop = [11, 22, 33, 44, 55, 66, 77, 88] * 16
    reasons = degenerate_reasons(loop)
    assert len(reasons) == 2
    assert "8-token n-gram repeats 16.0x" in reasons[0]
    assert "8 distinct token ids in 128 tokens" in reasons[1]  # named beside the loop, not deciding


def test_a_low_distinct_ratio_alone_is_not_degenerate():
    """Few distinct ids but no repeated n-gram: an ordinary (if dull) output, not a loop."""
    rng = random.Random(3)
    few_ids = [rng.choice([5, 6, 7, 8, 9, 10]) for _ in range(128)]
    assert distinct_token_ratio(few_ids) < 0.3
    assert most_covering_ngram(few_ids, 3, 32, 4) is None or most_covering_ngram(few_ids, 3, 32, 4).coverage < 0.5
    assert degenerate_reasons(few_ids) == []


COUNTS = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "guards" / "count_tokenisations.json").read_text())


@pytest.mark.parametrize("name", sorted(COUNTS["ids"]))
def test_plain_increasing_counts_are_not_degenerate(name):
    """Counts tokenised by the embedded model's tokenizer (digit by digit): few distinct ids, no repeat.

    In "100, 101, ..." the 3-gram ", 1" recurs before every number, but its "1" is one of the digits that
    change between occurrences: part of a count, not a repeat."""
    ids = COUNTS["ids"][name]
    assert distinct_token_ratio(ids) < 0.3  # the old guard called every one of these degenerate
    assert degenerate_reasons(ids) == []
    v = guard_cell(SideOutputs("ours", [ids]), SideOutputs("oracle", [list(ids)]))
    assert v.comparable, v.reasons


def test_a_numbered_loop_is_degenerate_through_its_recurring_ngram():
    """"1. Yes\n2. Yes\n...": never periodic token for token (the counter changes), so the periodic-run
    check misses it; ". Yes\n" recurs between the counter's ids and covers most of the output."""
    loop = _real_outputs()["loop_prompt"]["vllm"]
    assert longest_loop(loop) is None or longest_loop(loop).span < 16
    gram = most_covering_ngram(loop, 3, 32, 4)
    assert gram is not None and len(gram.ngram) == 3 and gram.count == 21 and gram.coverage > 0.6
    reasons = degenerate_reasons(loop)
    assert reasons[0].startswith("a 3-token n-gram recurs 21x from token 1, covering 63 of 96 tokens")


def test_recurring_ngram_thresholds_are_respected():
    loop = _real_outputs()["loop_prompt"]["vllm"]
    assert degenerate_reasons(loop, GuardThresholds(ngram_min_coverage=0.7)) == []
    assert degenerate_reasons(loop, GuardThresholds(ngram_min_repeats=22)) == []
    assert degenerate_reasons(loop, GuardThresholds(ngram_min_len=4)) == []


def test_prose_is_not_degenerate():
    assert degenerate_reasons(prose(128)) == []
    assert distinct_token_ratio(prose(128)) > 0.9


def test_loop_after_a_normal_start_is_found_where_it_starts():
    tokens = prose(40) + [7, 8, 9] * 20
    loop = longest_loop(tokens)
    assert loop is not None and loop.period == 3 and loop.start == 40 and loop.span == 60
    assert any("3-token n-gram" in r for r in degenerate_reasons(tokens))


def test_short_repeat_inside_prose_is_not_a_loop():
    tokens = prose(100) + [5, 6, 5, 6] + prose(30, seed=1)
    assert degenerate_reasons(tokens) == []


def test_loop_fraction_threshold_is_respected():
    tokens = prose(200) + [1, 2, 3, 4] * 5  # 20 of 220 tokens loop: under 25 %
    assert degenerate_reasons(tokens) == []
    assert degenerate_reasons(tokens, GuardThresholds(loop_min_fraction=0.05))


def test_single_token_run_is_period_one():
    loop = longest_loop([3] * 50)
    assert loop is not None and loop.period == 1 and loop.span == 50


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # prefix: the shorter length
    assert first_divergence([], [1]) == 0


def test_length_mismatch_and_tolerance():
    assert length_mismatch(84, 128)
    assert not length_mismatch(128, 128)
    assert not length_mismatch(126, 128, tolerance=0.05)


def test_divergence_tolerance_forgives_only_the_tail():
    assert divergence_is_material(10, 100, 100)
    assert not divergence_is_material(95, 100, 100, tolerance=0.1)
    assert divergence_is_material(85, 100, 100, tolerance=0.1)
    assert not divergence_is_material(None, 5, 5)
    assert not divergence_is_material(50, 50, 80)  # a prefix is a length mismatch, not a divergence


def test_clean_cell_is_comparable():
    text = prose(128)
    v = guard_cell(SideOutputs("ours", [text, list(text)], spec_off=list(text)), SideOutputs("oracle", [list(text)]))
    assert v.comparable and v.flags == [] and v.reasons == []
    assert v.first_divergence is None


def test_the_real_case_is_flagged_with_reasons():
    reasoning = prose(84)
    loop = [11, 22, 33, 44, 55, 66, 77, 88] * 16
    v = guard_cell(SideOutputs("ours", [reasoning]), SideOutputs("oracle", [loop]))
    assert not v.comparable
    assert LENGTH_MISMATCH in v.flags and f"{DEGENERATE}_oracle" in v.flags and DIVERGED in v.flags
    assert any("84" in r and "128" in r for r in v.reasons)
    assert v.oracle_distinct_ratio == pytest.approx(8 / 128)


def test_spec_on_off_mismatch_is_flagged_per_side():
    off = prose(64)
    on = off[:30] + prose(34, seed=5)
    v = guard_cell(SideOutputs("ours", [on], spec_off=off), SideOutputs("oracle", [on]))
    assert f"{SPEC_MISMATCH}_ours" in v.flags
    assert f"{SPEC_MISMATCH}_oracle" not in v.flags
    assert any("at token 30" in r for r in v.reasons)


def test_repeats_that_differ_are_flagged():
    a = prose(50)
    b = a[:20] + prose(30, seed=9)
    v = guard_cell(SideOutputs("ours", [a, b]), SideOutputs("oracle", [a]))
    assert f"{REPEATS_DIFFER}_ours" in v.flags


def test_missing_output_is_flagged():
    v = guard_cell(SideOutputs("ours", []), SideOutputs("oracle", [prose(10)]))
    assert MISSING in v.flags and not v.comparable


def _real_outputs() -> dict:
    return json.loads((FIXTURES / "real_outputs.json").read_text())


def test_guards_on_real_outputs_loop():
    """Token ids captured from real llama.cpp and vLLM servers (greedy, identical weights)."""
    loop = _real_outputs()["loop_prompt"]
    assert degenerate_reasons(loop["llamacpp"]), "the loop prompt's real output must trip the degenerate guard"
    assert degenerate_reasons(loop["vllm"])
    v = guard_cell(SideOutputs("llamacpp", [loop["llamacpp"]]), SideOutputs("vllm", [loop["vllm"]]))
    assert not v.comparable and f"{DEGENERATE}_llamacpp" in v.flags and f"{DEGENERATE}_vllm" in v.flags


def test_guards_on_real_outputs_that_diverge_across_engines():
    """The real bicycle answers: ordinary text on both engines, but they part early and differ in length."""
    normal = _real_outputs()["normal_prompt"]
    assert degenerate_reasons(normal["llamacpp"]) == [] and degenerate_reasons(normal["vllm"]) == []
    v = guard_cell(SideOutputs("llamacpp", [normal["llamacpp"]]), SideOutputs("vllm", [normal["vllm"]]))
    idx = first_divergence(normal["llamacpp"], normal["vllm"])
    assert idx is not None and idx < min(len(normal["llamacpp"]), len(normal["vllm"]))
    assert DIVERGED in v.flags and (LENGTH_MISMATCH in v.flags) == (len(normal["llamacpp"]) != len(normal["vllm"]))
    assert f"outputs diverge at token {idx}" in " ".join(v.reasons)


def test_prompt_token_mismatch_is_flagged():
    text = prose(20)
    v = guard_cell(SideOutputs("ours", [text]), SideOutputs("oracle", [text]), prompt_tokens=(31, 30))
    assert v.flags == [PROMPT_MISMATCH]
    assert guard_cell(SideOutputs("ours", [text]), SideOutputs("oracle", [text]), prompt_tokens=(30, 30)).comparable


def test_lengths_use_the_servers_count_when_given():
    """Under ignore_eos one engine samples EOS (dropped from the text), so text tokens undercount."""
    text = prose(89)
    same = guard_cell(SideOutputs("ours", [text], completion_tokens=96), SideOutputs("oracle", [text], completion_tokens=96))
    assert LENGTH_MISMATCH not in same.flags and same.ours_tokens == 96
    differ = guard_cell(SideOutputs("ours", [text], completion_tokens=96), SideOutputs("oracle", [text], completion_tokens=89))
    assert LENGTH_MISMATCH in differ.flags


# ------------------------------------------------------------------ left its prompt's task (words, not ids)

H200 = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "guards" / "h200_off_outputs.json").read_text())


def test_the_letter_loop_that_turned_into_a_count_left_its_task_on_both_engines():
    """'Write the letter A eighty times' answered 'A, 8, 9, 10, ...' by both engines on the H200: no repeated
    n-gram (it passed the loop guards), but a count the prompt never asked for."""
    prompt = H200["prompts"]["letter-loop"]
    for side in ("ours", "oracle"):
        text = H200["outputs"]["letter-loop"][side]
        assert text.startswith("A, 8, 9, 10, ")
        count = longest_count(text)
        assert (count.first, count.words) == (8, count.last - 8 + 1) and count.share > 0.9
        reason = left_task_reason(text, prompt)
        assert reason.startswith(f"the output turned into a count (8, 9, ... {count.last}: ")
        assert reason.endswith("where its prompt asks for no count")


@pytest.mark.parametrize("prompt", ["count-up", "yes-loop", "hello-loop", "capital", "bicycle"])
def test_outputs_on_their_task_are_not_flagged(prompt):
    """A count asked for ('Count from 1 to 40'), a loop with a counter (the loop guards' case), plain text."""
    for side in ("ours", "oracle"):
        assert left_task_reason(H200["outputs"][prompt][side], H200["prompts"][prompt]) is None


def test_the_left_task_guard_takes_the_thresholds_and_needs_the_prompt():
    text = "Here: 3, 4, 5, 6, 7, 8, 9, 10, 11 and so on"
    assert longest_count(text).share == pytest.approx(9 / 13)  # 13 words: Here, 3 ... 11, and, so, on
    assert left_task_reason(text, "Say something.") is not None
    assert left_task_reason(text, "Say something.", GuardThresholds(count_min_share=0.7)) is None
    assert left_task_reason(text, "Say something.", GuardThresholds(count_min_values=10)) is None
    assert left_task_reason(text, None) is None  # a prompt whose words are not known is not judged
    assert longest_count("no numbers at all") is None


def test_guard_cell_flags_a_side_that_left_its_task():
    prompt = H200["prompts"]["letter-loop"]
    ours = SideOutputs("llamacpp", [prose(128)], text=H200["outputs"]["letter-loop"]["ours"])
    oracle = SideOutputs("vllm", [prose(128)], text="A A A A A A A A")
    v = guard_cell(ours, oracle, prompt_text=prompt)
    assert v.flags == [f"{LEFT_TASK}_llamacpp"] and not v.comparable
    assert v.reasons[0].startswith("llamacpp left its prompt's task: the output turned into a count")
    assert guard_cell(ours, oracle).comparable  # without the prompt's words the guard does not judge
