"""llama.cpp: the adapter (argv, readiness, versions), its /metrics counters and its log lines."""

from specbook.engines.llamacpp.adapter import (
    BINARY_ENV,
    DIST,
    INSTALL_HINT,
    SPEC_METHODS,
    LlamaCppEngine,
    binary_override,
    binary_path,
    binary_version,
    libraries_sha256,
    resolve_gguf,
    speculative_args,
)
from specbook.engines.llamacpp.logparse import draft_lines_frame, parse_draft_lines, requests_ended

__all__ = [
    "BINARY_ENV",
    "DIST",
    "INSTALL_HINT",
    "SPEC_METHODS",
    "LlamaCppEngine",
    "binary_override",
    "binary_path",
    "binary_version",
    "draft_lines_frame",
    "libraries_sha256",
    "parse_draft_lines",
    "requests_ended",
    "resolve_gguf",
    "speculative_args",
]
