"""A test-only adapter with the Engine protocol's required methods and no optional capability (none of its
methods is meant to be called: the tests that use it check what is asked of an engine, not what it does)."""

from __future__ import annotations


class BareEngine:
    name = "bare"

    def refusals(self, cfg):
        return []

    def build_spec(self, cfg, *, name, log_path, port):
        raise NotImplementedError

    def probe_versions(self, base_url=None):
        return {"engine": self.name}

    def spec_decode_delta(self, before, after, model_name=None, cfg=None):
        raise NotImplementedError

    def startup_facts(self, log_path):
        return {}

    def setup_facts(self, cfg, startup):
        raise NotImplementedError

    def log_intervals(self, lines):
        raise NotImplementedError

    def detect_log(self, head_lines):
        return 0

    def summarise_log(self, path):
        raise NotImplementedError
