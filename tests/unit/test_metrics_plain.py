"""serve.metrics' plain reader of /metrics text gives exactly what prometheus_client's parser gives (samples, names,
labels, values, family types, and errors), on every captured /metrics text of vLLM-CPU and llama-server and on
damaged and arbitrary texts; the captures are all read by the plain reader, none left to prometheus_client."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_parsers import METRICS_TEXTS

from specbook.core.errors import MetricsError
from specbook.serve import metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEXTS = sorted((FIXTURES / "metrics").glob("*.txt")) + sorted((FIXTURES / "llamacpp").glob("metrics-*.txt"))


def slow(text: str):
    """The reading through prometheus_client alone."""
    real = metrics._plain_families

    def refuse(_text):
        raise metrics._NotPlain

    metrics._plain_families = refuse
    try:
        return outcome(text)
    finally:
        metrics._plain_families = real


def outcome(text: str):
    try:
        snap = metrics.MetricsSnapshot.from_text(text)
    except MetricsError as exc:
        return ("error", str(exc).split(":")[0])
    return ([(s.name, s.labels, "nan" if math.isnan(s.value) else s.value) for s in snap.samples], snap.types)


def test_every_capture_is_read_plainly():
    assert len(TEXTS) >= 12
    for path in TEXTS:
        families = metrics._plain_families(path.read_text())
        assert sum(len(f.samples) for f in families) > 10, path


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.name)
def test_a_capture_reads_as_prometheus_client_reads_it(path):
    text = path.read_text()
    fast = outcome(text)
    assert fast == slow(text)
    assert fast[0] and fast[1]


@pytest.mark.parametrize("text", [
    "a 1\n", "a_total 1\n# TYPE a counter\na_total 2\n", "# TYPE a counter\na 5\n", "# TYPE a counter\na_total 5\n",
    '# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3.5\nh_count 2\nh_created 1.7e9\n',
    '# HELP a b c\n# TYPE a gauge\na{x="1",y="2"} NaN\na{x="3",} -Inf\n', "# TYPE a wrong\na 1\n",
    "a 99999999999999999999999999\n", "a " + "9" * 400 + "\n", "a +5\n", "a 1e400\n", "a 1_0\n", "a 1 1700000000\n",
    'a{x="q\\"uote"} 1\n', 'a{x="1",x="2"} 1\n', "a{} 1\n", "#\n# other comment here\na 1\n", "# HELP\n",
    "a\t1\n", "  a 1  \r\n", 'a{__name__="b"} 1\n', "a{x=1} 1\n", "1a 1\n", "a 0x10\n", "a .5\n", "a 5.\n",
])
def test_edge_texts_read_alike(text):
    assert outcome(text) == slow(text)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(texts=st.one_of(METRICS_TEXTS.map(lambda t: t[0].decode("utf-8", errors="replace")),
                       st.text(alphabet=st.sampled_from(list('ab_:{}="\\ ,#\n\t0123456789.eE+-NaInf')), max_size=200)))
def test_damaged_and_arbitrary_texts_read_alike(texts):
    assert outcome(texts) == slow(texts)
