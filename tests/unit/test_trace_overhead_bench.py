"""benchmarks/trace_overhead.py --off-cost: decode tok/s of streamed records and the paired ratio's interval."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "trace_overhead.py"
_spec = importlib.util.spec_from_file_location("trace_overhead", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_decode_rate_counts_tokens_after_the_first_over_the_time_after_the_first_and_skips_failures():
    rec = lambda n, wall, ttft, error=None: SimpleNamespace(completion_tokens=n, wall_s=wall, ttft_s=ttft, error=error)  # noqa: E731
    records = [rec(65, 3.0, 1.0), rec(33, 2.0, 1.0), rec(65, 9.0, 1.0, error="boom"), rec(1, 5.0, 1.0)]
    assert bench.decode_tok_s(records) == pytest.approx((64 + 32) / (2.0 + 1.0))
    assert math.isnan(bench.decode_tok_s([]))


def test_the_paired_ratio_is_a_geometric_mean_with_a_t_interval_on_the_log_ratios():
    ratio, lo, hi = bench.ratio_interval([(1.1, 1.0), (0.9, 1.0), (1.0, 1.0)])
    assert ratio == pytest.approx((1.1 * 0.9) ** (1 / 3))
    logs = [math.log(1.1), math.log(0.9), 0.0]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t(0.975, 2 df)
    assert (lo, hi) == (pytest.approx(math.exp(mean - half)), pytest.approx(math.exp(mean + half)))
    assert lo < ratio < hi
    one = bench.ratio_interval([(2.0, 1.0)])
    assert one[0] == pytest.approx(2.0) and math.isnan(one[1]) and math.isnan(one[2])
