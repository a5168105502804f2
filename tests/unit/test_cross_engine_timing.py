"""Timing on equal decode work (experiments/cross_engine_timing): per-request decode figures, which cells are timed
and why the others are not, the per-lane headline, and the why-sentences, on crafted frames."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from specbook.core import stats
from specbook.experiments.cross_engine import timing as t

SPEC = t.TimingSpec()


def _rows(lane: str, prompt: str, side: str, *, tokens: int = 100, decode_ms: float = 2.0, ttft_s: float = 0.03,
          repeats: int = 3, chunk: int = 1, text: str = "The answer is short and plain", jitter: float = 0.01,
          start: int = 0) -> list[dict]:
    """`repeats` answered requests: `tokens` tokens, decode_ms per token after the first, `chunk` tokens a chunk."""
    out = []
    for r in range(repeats):
        decode_s = (tokens - 1) * decode_ms / 1000 * (1 + jitter * r)
        out.append({"side": side, "lane": lane, "prompt": prompt, "repeat": start + r, "completion_tokens": tokens,
                    "prompt_tokens": 20, "ttft_s": ttft_s, "wall_s": ttft_s + decode_s, "chunks": tokens // chunk,
                    "itl_mean_s": decode_s / max(tokens // chunk - 1, 1), "output_text": text, "error": None})
    return out


def _strict(rows: list[dict]) -> pd.DataFrame:
    """cell_table's columns decode_cells reads, one row per lane x prompt."""
    return pd.DataFrame(rows, columns=["lane", "prompt", "flags", "ours_tokens", "oracle_tokens", "first_divergence"])


def test_side_figures_pool_the_repeats_and_count_itl_per_token():
    rows = pd.DataFrame(_rows("ngram", "p", "oracle", tokens=101, decode_ms=4.0, chunk=4, jitter=0.0))
    f = t.side_figures(rows)
    assert f["repeats"] == 3 and f["decode_wall_s"] == pytest.approx(3 * 100 * 0.004)
    assert f["decode_tok_s"] == pytest.approx(250.0) and f["itl_token_ms"] == pytest.approx(4.0)
    # a chunk carries 4 tokens: the gap between chunks is four tokens' time, not one's
    assert f["tokens_per_chunk"] == pytest.approx(101 / 25) and f["itl_chunk_ms"] == pytest.approx(400 / 24)
    assert f["e2e_tok_s"] == pytest.approx(303 / (3 * (0.03 + 0.4))) and f["ttft_ms"] == pytest.approx(30.0)
    failed = rows.assign(error=["HTTP 500", None, None])
    assert t.side_figures(failed)["repeats"] == 2  # a failed request is no measurement
    assert t.side_figures(rows.iloc[0:0])["repeats"] == 0


def test_repeats_are_added_until_the_decode_wall_is_long_enough_within_the_bound():
    assert t.repeats_to_add([0.05, 0.05, 0.05], min_wall_s=0.25, max_repeats=20) == 3  # 2 more needed, one of margin
    assert t.repeats_to_add([0.1, 0.1, 0.1], min_wall_s=0.25, max_repeats=20) == 0
    assert t.repeats_to_add([0.01] * 3, min_wall_s=0.25, max_repeats=10) == 7  # capped at the bound
    assert t.repeats_to_add([math.nan, 0.02], min_wall_s=0.25, max_repeats=20) == 13  # the mean of those answered
    assert t.repeats_to_add([math.nan], min_wall_s=0.25, max_repeats=20) == 0  # nothing answered: nothing to plan


def test_params_validate_the_timing_block():
    with pytest.raises(ValueError, match="min_common_tokens"):
        t.TimingSpec(min_common_tokens=1)
    with pytest.raises(ValueError, match="extra"):
        t.TimingSpec(min_tokens=3)
    assert (SPEC.min_common_tokens, SPEC.min_timed_wall_s, SPEC.max_warm_repeats) == (64, 0.25, 20)


def _scene():
    """Five lane-off cells: equal outputs (timed), a loop, a short answer, a parted pair re-run on its common
    prefix, a parted pair never re-run; and one cell whose decode wall is too short."""
    req = []
    for side, ms in (("ours", 1.0), ("oracle", 2.0)):
        req += _rows("off", "same", side, decode_ms=ms, text="Gears turn the wheel of a bicycle when you pedal")
        req += _rows("off", "loop", side, decode_ms=ms)
        req += _rows("off", "short", side, tokens=8, decode_ms=ms)
        req += _rows("off", "parted", side, decode_ms=ms)
        req += _rows("off", "lost", side, decode_ms=ms)
        req += _rows("off", "brief", side, tokens=70, decode_ms=ms * 0.5, repeats=1)
    equal = []
    for side, ms in (("ours", 1.2), ("oracle", 3.0)):
        equal += _rows("off", "parted", side, tokens=80, decode_ms=ms, text="Both said this much")
    strict = _strict([
        ("off", "same", "", 100, 100, None), ("off", "loop", "degenerate_llamacpp", 100, 100, None),
        ("off", "short", "", 8, 8, None), ("off", "parted", "diverged", 100, 100, 80),
        ("off", "lost", "diverged", 100, 100, 70), ("off", "brief", "", 70, 70, None)])
    eq_cells = pd.DataFrame([{"lane": "off", "prompt": "parted", "flags": ""}])
    return strict, pd.DataFrame(req), pd.DataFrame(equal).assign(max_tokens=80), eq_cells


def test_a_cell_is_timed_only_on_equal_work_with_enough_tokens_and_wall_and_says_why_not():
    cells = t.decode_cells(*_scene(), SPEC).set_index("prompt")
    assert list(cells.index[cells["timed"]]) == ["same", "parted"]
    assert cells.loc["same", "source"] == t.TIMED_REQUESTS and cells.loc["same", "common_tokens"] == 100
    assert cells.loc["parted", "source"] == t.RE_RUN and cells.loc["parted", "common_tokens"] == 80
    assert cells.loc["loop", "why_not_timed"] == "a loop (degenerate output)"
    assert cells.loc["short", "why_not_timed"] == "8 common tokens < 64"
    assert cells.loc["lost", "why_not_timed"] == "outputs part at token 70 and no equal-work re-run was made"
    # one repeat of 69 decode tokens at 0.5 ms: 0.0345 s, short of 0.25 s (and the oracle's too)
    assert cells.loc["brief", "why_not_timed"] == ("ours's decode wall 0.0345 s < 0.25 s; "
                                                   "oracle's decode wall 0.069 s < 0.25 s")
    # the re-run is what is timed where the outputs part: its own words and rates, not the full-length cell's
    assert cells.loc["parted", "ours_words"] == "Both said this much"
    assert cells.loc["parted", "decode_ratio"] == pytest.approx(2.5, rel=0.01)
    assert cells.loc["same", "ours_words"] == "Gears turn the wheel of a bicycle when ..."
    # TTFT is not decode work: every cell with the same prompt on both sides counts for it
    assert cells["ttft_usable"].all() and cells.loc["short", "ttft_ratio"] == pytest.approx(1.0)


def test_the_cell_ratio_is_the_ratio_of_pooled_decode_rates_with_fieller_over_the_repeats():
    strict, req, equal, eq_cells = _scene()
    same = t.decode_cells(strict, req, equal, eq_cells, SPEC).set_index("prompt").loc["same"]
    rows = req[req["prompt"] == "same"]
    ours, oracle = (t.per_token_ms(rows[rows["side"] == s]) for s in ("ours", "oracle"))
    assert (same["decode_ratio"], same["decode_ratio_lo"], same["decode_ratio_hi"]) == pytest.approx(
        stats.ratio_of_means_interval(oracle, ours, 0.95, nonnegative=True))
    assert same["decode_ratio"] == pytest.approx(same["ours_decode_tok_s"] / same["oracle_decode_tok_s"])
    assert same["decode_ratio_lo"] < 2.0 < same["decode_ratio_hi"]


def test_an_unequal_re_run_failed_requests_and_an_off_task_output_are_not_timed():
    strict, req, equal, _ = _scene()
    unequal = pd.DataFrame([{"lane": "off", "prompt": "parted", "flags": "diverged"}])
    cells = t.decode_cells(strict, req, equal, unequal, SPEC).set_index("prompt")
    assert cells.loc["parted", "why_not_timed"] == "its equal-work re-run (80 tokens) came back unequal: diverged"
    strict.loc[strict["prompt"] == "same", "flags"] = "failed requests"
    strict.loc[strict["prompt"] == "short", "flags"] = "left_task_vllm"
    cells = t.decode_cells(strict, req, equal, unequal, SPEC).set_index("prompt")
    assert cells.loc["same", "why_not_timed"] == "failed requests" and not cells.loc["same", "ttft_usable"]
    assert cells.loc["short", "why_not_timed"].startswith("left its prompt's task")


def test_the_lane_headline_is_the_geometric_mean_over_timed_cells():
    cells = t.decode_cells(*_scene(), SPEC)
    head = t.decode_headline(cells).set_index("lane").loc["off"]
    timed = cells[cells["timed"]]
    r, lo, hi = np.exp(stats.mean_t_interval(np.log(timed["decode_ratio"].to_numpy()), 0.95))
    assert (head["timed"], head["cells"]) == (2, 6)
    assert head["decode_ratio"] == pytest.approx(r) and head["decode_ratio_lo"] == pytest.approx(lo)
    assert head["decode_ratio_hi"] == pytest.approx(hi)
    assert head["min_decode_wall_s"] == pytest.approx(timed[["ours_decode_wall_s", "oracle_decode_wall_s"]].min().min())
    assert head["ttft_cells"] == 6 and head["ttft_ratio"] == pytest.approx(1.0)
    assert head["not_timed"] == ("1 loop or off-task output, 1 under the common-token minimum, "
                                 "1 without an equal re-run, 1 with a decode wall too short to time")
    one = t.decode_headline(cells[cells["prompt"] != "parted"]).iloc[0]  # one timed cell: its own interval
    same = cells.set_index("prompt").loc["same"]
    assert (one["decode_ratio_lo"], one["decode_ratio_hi"]) == (same["decode_ratio_lo"], same["decode_ratio_hi"])


def test_the_report_views_list_walls_repeats_and_first_words():
    cells = t.decode_cells(*_scene(), SPEC)
    view = t.timed_view(cells)
    assert list(view["prompt"]) == ["same", "parted"] and list(view["timed on"]) == ["own requests", "re-run"]
    assert list(view["repeats"]) == ["3 / 3", "3 / 3"] and (view["ours wall (s)"] > SPEC.min_timed_wall_s).all()
    texts = t.headline_texts(cells)
    assert list(texts["timed in"]) == ["off (100)", "off (80)"]
    assert texts.loc[0, "oracle, first words"] == "Gears turn the wheel of a bicycle when ..."
    assert t.timing_note(cells, SPEC).startswith("3 timed repeats a side per timed cell; decode walls 0.2")
    assert t.first_words("one two   three", 2) == "one two ..." and t.first_words(None) == ""


def _effect(rows):
    return pd.DataFrame(rows, columns=["side", "lane", "prompts", "vs_off", "vs_off_lo", "vs_off_hi"])


def test_speculation_against_off_per_engine_on_the_same_prompts():
    req, strict_rows = [], []
    for p, k in (("a", 1.0), ("b", 1.1), ("c", 0.9)):
        for side in ("ours", "oracle"):
            req += _rows("off", p, side, decode_ms=1.0 * k)
            req += _rows("ngram", p, side, decode_ms=(1.25 if side == "ours" else 2.0) * k)
        strict_rows += [("off", p, "", 100, 100, None), ("ngram", p, "", 100, 100, None)]
    req += _rows("ngram", "loop", "ours", decode_ms=0.1) + _rows("off", "loop", "ours", decode_ms=1.0)
    strict_rows += [("ngram", "loop", "degenerate_llamacpp", 100, 100, None)]
    eff = t.speculation_effect(pd.DataFrame(req), _strict(strict_rows)).set_index("side")
    assert eff.loc["ours", "prompts"] == 3  # the loop, trivially draftable, left out
    assert eff.loc["ours", "vs_off"] == pytest.approx(0.8, rel=0.01)
    assert eff.loc["oracle", "vs_off"] == pytest.approx(0.5, rel=0.01)
    assert t.speculation_verdict(eff.reset_index()) == "SLOWER THAN OFF ON BOTH ENGINES"
    why = t.speculation_why(eff.reset_index(), {"ours": "llamacpp", "oracle": "vllm"}, "smollm2-135m-instruct")
    assert why == ("speculation is slower than no speculation on both engines here: drafting does not pay for "
                   "a 135M target, so the speculative lanes' ratios compare whose speculation hurts less")


def test_a_run_without_an_off_lane_has_no_speculation_effect():
    """A run of one speculative lane (an ngram-only edition) has nothing to compare with: no rows, so no headline
    (not a row of nan ratios under 'MIXED OR UNDECIDED')."""
    req, strict_rows = [], []
    for p in ("a", "b"):
        for side in ("ours", "oracle"):
            req += _rows("ngram", p, side, decode_ms=1.0)
        strict_rows += [("ngram", p, "", 100, 100, None)]
    eff = t.speculation_effect(pd.DataFrame(req), _strict(strict_rows))
    assert eff.empty and t.speculation_verdict(eff) == "NOT MEASURED"


@pytest.mark.parametrize("seed", range(5))
def test_no_speculation_label_says_more_than_its_intervals(seed):
    """A property: the label claims slower or faster on both engines only where every interval shows it."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        mid = rng.uniform(0.3, 3.0, 4)
        half = rng.uniform(0.0, 1.0, 4)
        eff = _effect([("ours", "a", 3, m, m - h, m + h) for m, h in zip(mid, half, strict=True)])
        verdict = t.speculation_verdict(eff)
        if verdict.startswith("SLOWER"):
            assert (eff["vs_off_hi"] < 1).all()
        elif verdict.startswith("FASTER"):
            assert (eff["vs_off_lo"] > 1).all()
        else:
            assert not (eff["vs_off_hi"] < 1).all() and not (eff["vs_off_lo"] > 1).all()
        word = t.verdict_word(mid[0] - half[0], mid[0] + half[0], "faster", "slower", "undecided")
        assert word == ("faster" if mid[0] - half[0] > 1 else "slower" if mid[0] + half[0] < 1 else "undecided")


def test_mixed_and_undecided_speculation_say_so():
    labels = {"ours": "llamacpp", "oracle": "vllm"}
    mixed = _effect([("ours", "ngram", 5, 1.5, 1.2, 1.9), ("oracle", "ngram", 5, 0.5, 0.4, 0.6)])
    assert t.speculation_verdict(mixed) == "MIXED OR UNDECIDED"
    assert t.speculation_why(mixed, labels, "m") == ("speculation does not act alike on every engine and lane here "
                                                     "(faster than off: llamacpp ngram; slower than off: vllm ngram)")
    open_ = _effect([("ours", "ngram", 2, 0.9, 0.1, 8.0)])
    assert t.speculation_why(open_, labels, "m").startswith("whether speculation pays here is not decided")
    assert t.speculation_figure(mixed, labels) == ("decode rate against the engine's own off lane: llamacpp ngram "
                                                   "1.50x; vllm ngram 0.50x")


def test_the_lane_why_is_tokens_per_step_over_time_per_step():
    labels = {"ours": "llamacpp", "oracle": "vllm"}
    h = pd.Series({"ours_itl_token_ms": 1.76, "oracle_itl_token_ms": 4.28})
    assert t.lane_why(h, {}, labels, "off") == ("one token per step with speculation off, so it is the step-time "
                                                "ratio: 1.76 vs 4.28 ms per token")
    assert t.lane_why(h, {"ours": 1.18, "oracle": 1.44}, labels, "ngram") == (
        "vllm emits more tokens per step, but llamacpp's steps are shorter: 1.18 vs 1.44 tokens per step, "
        "2.08 vs 6.16 ms per step")
    assert t.lane_why(h, {"ours": 2.0, "oracle": 1.5}, labels, "ngram").startswith(
        "llamacpp emits more tokens per step and its steps are shorter")
    # the faster side may take longer per step and still decode faster, on more tokens per step
    slow_steps = pd.Series({"ours_itl_token_ms": 204.0, "oracle_itl_token_ms": 94.0})
    assert t.lane_why(slow_steps, {"ours": 2.33, "oracle": 7.0}, labels, "draft") == (
        "vllm's steps are longer, but it emits enough more tokens per step to decode faster: 2.33 vs 7.00 tokens "
        "per step, 475 vs 658 ms per step")
    assert t.lane_why(h, {}, labels, "ngram") == "llamacpp spends less time per decoded token: 1.76 vs 4.28 ms"


def test_tokens_per_step_counts_every_step_from_decode_tokens_and_accepted_drafts():
    req = pd.DataFrame(_rows("ngram", "p", "ours", tokens=101) + _rows("ngram", "p", "oracle", tokens=101))
    counts = pd.DataFrame([{"side": "ours", "lane": "ngram", "prompt": "p", "accepted_tokens": 100},
                           {"side": "oracle", "lane": "ngram", "prompt": "p", "accepted_tokens": 200}])
    cells = pd.DataFrame([{"lane": "ngram", "prompt": "p", "timed": True}])
    got = t.tokens_per_step(req, counts, cells)["ngram"]
    assert got["ours"] == pytest.approx(300 / 200) and got["oracle"] == pytest.approx(300 / 100)


def test_ttft_why_and_target_size_come_from_the_data():
    h = pd.Series({"ours_ttft_ms": 11.4, "oracle_ttft_ms": 28.5})
    assert t.ttft_why(h, {}, ["server processes: 1 vs 3", "weights: a vs b"], 62.0) == (
        "the prompt's prefill of ~62 tokens and the request path (1 vs 3 processes); not decode work")
    assert t.target_size("smollm2-135m-instruct") == "a 135M target"
    assert t.target_size("Qwen2.5-7B") == "a 7B target" and t.target_size("/models/mine") == "this target"
