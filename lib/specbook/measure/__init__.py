"""Serving through an engine and measuring: the harness's windows and the untimed passes."""
