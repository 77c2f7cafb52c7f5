"""Shared fixtures and helpers for the mxsim test suite."""

from __future__ import annotations

import importlib
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from mxsim.formats import FORMATS

settings.register_profile("default", max_examples=200, deadline=None)
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")

REPO = Path(__file__).resolve().parent.parent

NARROW_FORMATS = [name for name, fmt in FORMATS.items() if fmt.bits <= 8]
SIXTEEN_BIT_OR_LESS = [name for name, fmt in FORMATS.items() if fmt.bits <= 16]


def same_float(a: float, b: float) -> bool:
    """Equal as values, with NaN equal to NaN and the sign of zero compared."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@pytest.fixture(scope="session")
def torch():
    """torch, or a skip with the install hint (a failure when CI is set: CI must test capture)."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("torch is required when CI is set: pip install 'mxsim[torch]' (torch==2.13.0)", pytrace=False)
        pytest.skip("torch is not installed (pip install 'mxsim[torch]')")


@pytest.fixture(params=NARROW_FORMATS)
def narrow_format(request):
    return FORMATS[request.param]


def as_float64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)
