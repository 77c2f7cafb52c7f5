"""mxsim._optional: optional dependencies fail with the extra to install."""

from __future__ import annotations

import numpy
import pytest

from mxsim.errors import MxsimError
from mxsim._optional import require


def test_an_installed_module_is_returned():
    assert require("numpy") is numpy


@pytest.mark.parametrize(
    "module, extra",
    [
        ("mxsim_absent_module_for_test", "mxsim_absent_module_for_test"),  # unknown: named as is
        # a missing submodule, or onnx itself missing: either way the onnx extra is named
        ("onnx.mxsim_absent_submodule", "onnx"),
        ("onnxruntime.mxsim_absent_submodule", "onnx"),
    ],
)
def test_a_missing_module_names_the_extra(module, extra):
    with pytest.raises(
        MxsimError, match=rf"{module} is not installed .*pip install 'mxsim\[{extra}\]'"
    ):
        require(module)
