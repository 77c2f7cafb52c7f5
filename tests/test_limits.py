"""Argument checks and the memory budget (mxsim.limits)."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim.errors import ArgumentError, BudgetError
from mxsim.limits import (
    DEFAULT_BUDGET_BYTES,
    check_array_budget,
    check_axis,
    check_block_size,
    check_choice,
    check_int,
    check_path,
    memory_budget,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", DEFAULT_BUDGET_BYTES),
        ("123", 123),
        ("16K", 16384),
        ("2G", 2 << 30),
        ("3 MiB", 3 << 20),
        ("1t", 1 << 40),
    ],
)
def test_memory_budget_reads_the_environment(monkeypatch, text, expected):
    monkeypatch.setenv("MXSIM_MAX_BYTES", text)
    assert memory_budget() == expected


@pytest.mark.parametrize("text", ["0", "-5", "lots", "1.5G"])
def test_memory_budget_refuses_nonsense(monkeypatch, text):
    monkeypatch.setenv("MXSIM_MAX_BYTES", text)
    with pytest.raises(ArgumentError, match="MXSIM_MAX_BYTES"):
        memory_budget()


def test_check_array_budget_uses_exact_integers(monkeypatch):
    monkeypatch.setenv("MXSIM_MAX_BYTES", "1M")
    assert check_array_budget((1024, 128), 8, "x") == 131072
    with pytest.raises(
        BudgetError, match=r"x needs 1\.68e\+07 TiB, more than the memory budget of 1 MiB"
    ):
        check_array_budget((2**31, 2**31, 4), 1, "x")  # would overflow int64 arithmetic


@pytest.mark.parametrize("value", [True, 1.0, "3", None, [3], np.float64(3)])
def test_check_int_refuses_non_integers(value):
    with pytest.raises(ArgumentError, match="seed: expected an integer >= 0"):
        check_int(value, "seed", 0)


def test_check_int_ranges_and_numpy_integers():
    assert check_int(np.int8(5), "n", 0, 9) == 5 and type(check_int(np.int8(5), "n")) is int
    with pytest.raises(ArgumentError, match=r"block_size: expected an integer 1\.\.4096, got 0"):
        check_block_size(0)
    with pytest.raises(ArgumentError, match="got 1000000000000"):
        check_block_size(10**12)
    assert check_axis(-1, 3) == 2
    with pytest.raises(ArgumentError, match=r"axis: expected an integer -2\.\.1, got 2"):
        check_axis(2, 2)
    with pytest.raises(ArgumentError, match="0-d array has no axis"):
        check_axis(0, 0)


def test_check_choice_handles_unhashable_values():
    assert check_choice("auto", "method", ("auto", "kernel")) == "auto"
    with pytest.raises(
        ArgumentError, match=r"method: expected one of auto, kernel, got \['auto'\]"
    ):
        check_choice(["auto"], "method", ("auto", "kernel"))


@pytest.mark.parametrize("value", ["", "a\x00b", "x/" + "a" * 256, "a/" * 2100, 3, None])
def test_check_path_refuses_what_the_os_would(value):
    with pytest.raises(ArgumentError, match="where: "):
        check_path(value, "where")


def test_check_path_accepts_ordinary_names(tmp_path):
    assert check_path(tmp_path / ("a" * 255), "where") == tmp_path / ("a" * 255)


def test_memory_budget_follows_the_environment_from_call_to_call(monkeypatch):
    # the parse is kept per text: a changed (or removed) variable is read on the next call
    monkeypatch.setenv("MXSIM_MAX_BYTES", "1M")
    assert memory_budget() == 1 << 20
    monkeypatch.setenv("MXSIM_MAX_BYTES", "2K")
    assert memory_budget() == 2 << 10
    with pytest.raises(BudgetError, match="more than the memory budget of 2 KiB"):
        check_array_budget((1024,), 8, "x")
    monkeypatch.delenv("MXSIM_MAX_BYTES")
    assert memory_budget() == 4 << 30
    monkeypatch.setenv("MXSIM_MAX_BYTES", "lots")
    for _ in range(2):  # refused every time, not once
        with pytest.raises(ArgumentError, match="MXSIM_MAX_BYTES"):
            memory_budget()


def test_check_int_fast_path_keeps_the_bounds_and_refuses_bools():
    assert check_int(5, "n", 5, 5) == 5
    for value, low, high in ((4, 5, None), (6, None, 5), (True, 0, None), (False, None, None)):
        with pytest.raises(ArgumentError, match="n: expected an integer"):
            check_int(value, "n", low, high)
