"""Argument checks and the work budget shared by every public entry point.

One place for the checks that every public function and CLI subcommand makes before it
works: integer arguments in range, names from a fixed set, and sizes against the memory
budget. The budget bounds what one call may allocate for one array (its bytes), and so the
work a hostile or mistaken file or argument can ask for. It is ``MXSIM_MAX_BYTES`` bytes
(default 4 GiB, read at each call; suffixes K, M, G, T accepted, e.g. ``MXSIM_MAX_BYTES=32G``).
See ``docs/limits.md``.
"""

from __future__ import annotations

import functools
import os
import re
import reprlib
from collections.abc import Iterable
from pathlib import Path
from typing import TypeGuard

import numpy as np

from .errors import ArgumentError, BudgetError

BUDGET_VARIABLE = "MXSIM_MAX_BYTES"
DEFAULT_BUDGET_BYTES = 4 << 30
#: Largest block size any quantizer or unit accepts (also the hwconfig schema's maximum).
MAX_BLOCK_SIZE = 4096
#: Deepest nesting of mappings and lists accepted in a YAML file.
MAX_YAML_DEPTH = 64
#: Most YAML nodes a file may expand to (aliases counted at their full size).
MAX_YAML_NODES = 1_000_000
#: Largest text file (hwconfig, manifest, topology CSV) read, in bytes.
MAX_TEXT_BYTES = 64 << 20
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def memory_budget() -> int:
    """The budget in bytes: ``MXSIM_MAX_BYTES`` if set, else 4 GiB."""
    return _budget_of(os.environ.get(BUDGET_VARIABLE, ""))


@functools.lru_cache(maxsize=64)
def _budget_of(value: str) -> int:
    """:func:`memory_budget` for the variable's text ``value`` (read once per text: every
    array checked asks; a text refused is refused again, as errors are not cached)."""
    text = value.strip()
    if not text:
        return DEFAULT_BUDGET_BYTES
    match = re.fullmatch(r"(\d+)\s*([KMGT]?)i?B?", text, flags=re.IGNORECASE)
    if match is None or int(match.group(1)) == 0:
        raise ArgumentError(
            f"{BUDGET_VARIABLE}={text!r}: expected a positive number of bytes, optionally with K, M, G or T"
        )
    return int(match.group(1)) * _SUFFIX[match.group(2).upper()]


def check_budget(nbytes: int, what: str) -> None:
    """Raise BudgetError if ``what`` would take more than the budget (``nbytes``: exact Python int)."""
    budget = memory_budget()
    if nbytes > budget:
        raise BudgetError(
            f"{what} needs {_human(nbytes)}, more than the memory budget of {_human(budget)}; "
            f"raise it with {BUDGET_VARIABLE} (see docs/limits.md)"
        )


def check_array_budget(shape: Iterable[int], itemsize: int, what: str) -> int:
    """Check an array of ``shape`` and ``itemsize`` against the budget; return its element count."""
    count = 1
    for v in shape:
        count *= int(v)
    check_budget(count * int(itemsize), what)
    return count


def _human(nbytes: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes} bytes"


def is_integer(value) -> TypeGuard[int | np.integer]:
    """A Python or numpy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(value, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int if it is an integer in [low, high]; else ArgumentError naming ``name``."""
    if type(value) is int and (low is None or value >= low) and (high is None or value <= high):
        return value  # (the common case, checked first: this runs on every kernel call)
    if low is not None and high is not None:
        accepted = f"an integer {low}..{high}"
    elif low is not None:
        accepted = f"an integer >= {low}"
    else:
        accepted = "an integer"
    if (
        not is_integer(value)
        or (low is not None and value < low)
        or (high is not None and value > high)
    ):
        raise ArgumentError(f"{name}: expected {accepted}, got {_show(value)}")
    return int(value)


def check_block_size(value, name: str = "block_size") -> int:
    """A block size: an integer 1..MAX_BLOCK_SIZE."""
    return check_int(value, name, 1, MAX_BLOCK_SIZE)


def check_axis(value, ndim: int, name: str = "axis") -> int:
    """``value`` as a non-negative axis of an ``ndim``-d array (negative counts from the end)."""
    if ndim < 1:
        raise ArgumentError(f"{name}: a 0-d array has no axis; expected at least one dimension")
    return check_int(value, name, -ndim, ndim - 1) % ndim


def check_choice(value, name: str, accepted: Iterable[str]) -> str:
    """``value`` if it is one of ``accepted`` (strings); else ArgumentError listing them."""
    accepted = tuple(accepted)
    if not isinstance(value, str) or value not in accepted:
        raise ArgumentError(f"{name}: expected one of {', '.join(accepted)}, got {_show(value)}")
    return value


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxlist, _SHORT_REPR.maxtuple, _SHORT_REPR.maxdict = 3, 6, 6, 6
_SHORT_REPR.maxstring, _SHORT_REPR.maxother, _SHORT_REPR.maxlong = 70, 70, 40


def shown(value, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for error messages. Containers are
    abbreviated as they are walked (a value built from a YAML alias bomb is never expanded
    into one huge string), and long text keeps only its start."""
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_show = shown


#: The common POSIX limits on a whole path and on one name in it (Linux: PATH_MAX, NAME_MAX).
PATH_MAX_BYTES = 4095
NAME_MAX_BYTES = 255


def check_path(value, name: str) -> Path:
    """``value`` as a Path if it is a str or os.PathLike without NUL characters."""
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentError(
            f"{name}: expected a file or directory path, got {type(value).__name__}"
        )
    path = Path(value)
    if "\x00" in str(path) or not str(value):
        raise ArgumentError(f"{name}: expected a file or directory path, got {_show(str(value))}")
    # Checked here because Path.is_file() raises (not False) on names the OS refuses.
    if len(os.fsencode(path)) > PATH_MAX_BYTES or any(
        len(os.fsencode(part)) > NAME_MAX_BYTES for part in path.parts
    ):
        raise ArgumentError(
            f"{name}: a path of at most {PATH_MAX_BYTES} bytes with names of at most "
            f"{NAME_MAX_BYTES} bytes each, got {_show(str(value))}"
        )
    return path
