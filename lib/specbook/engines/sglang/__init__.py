"""SGLang: the adapter (argv, readiness, versions), its /metrics counters, its log lines and start-up facts."""

from specbook.engines.sglang.adapter import SITE_ENV, SPEC_METHODS, SglangEngine, speculative_args
from specbook.engines.sglang.logparse import decode_lines_frame, read_decode_line

__all__ = ["SITE_ENV", "SPEC_METHODS", "SglangEngine", "decode_lines_frame", "read_decode_line", "speculative_args"]
