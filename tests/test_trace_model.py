"""mxsim.trace.model: the in-memory trace (layer lookup, accessors, conv geometry, network manifest)."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim.errors import MxsimError
from mxsim.trace import Network

from conftest import sample_trace


def test_layer_lookup_by_name_and_a_clear_error_listing_the_layers():
    trace = sample_trace()
    assert trace.layer("fc") is trace.layers[1]
    with pytest.raises(
        MxsimError,
        match=r"trace 'sample' has no layer 'fc2'; layers: conv, fc, attention scores, up",
    ):
        trace.layer("fc2")


def test_accessors_read_the_tensors_and_the_recorded_quantized_operands():
    fc = sample_trace().layer("fc")
    assert (
        fc.input is fc.tensors["input"]
        and fc.weight is fc.tensors["weight"]
        and fc.output is fc.tensors["output"]
    )
    assert fc.bias is None
    assert fc.quantized("input") is fc.tensors["input_quantized"]
    assert fc.quantized("bias") is None


def test_conv_geometry_follows_the_attrs_and_another_batch_size():
    conv = sample_trace().layer("conv")  # 1 -> 2 channels, 3x3, stride 1, padding 1 on a 5x5 image
    assert conv.conv_geometry().output_shape == (4, 2, 5, 5)
    assert conv.conv_geometry((7, 1, 5, 5)).output_shape == (7, 2, 5, 5)
    up = sample_trace().layer(
        "up"
    )  # (3 - 1) * 2 - pads + (k - 1) + output_padding + 1: 7 rows, 5 columns
    assert up.conv_geometry().output_shape == (1, 2, 7, 5)
    with pytest.raises(MxsimError, match="layer 'fc' is linear, not a convolution"):
        sample_trace().layer("fc").conv_geometry()


def test_network_manifest_lists_targets_and_model_only_when_set():
    steps = ({"layer": "fc"}, {"op": "relu"})
    assert Network("inputs", steps, "labels").to_manifest() == {
        "input": "inputs",
        "steps": [{"layer": "fc"}, {"op": "relu"}],
        "labels": "labels",
    }
    model = {"architecture": "charlm", "config": {"layers": np.int64(2)}, "state": "w."}
    rebuilt = Network("tokens", (), targets="next", model=model).to_manifest()
    assert rebuilt == {
        "input": "tokens",
        "steps": [],
        "labels": None,
        "targets": "next",
        "model": {"architecture": "charlm", "config": {"layers": 2}, "state": "w."},
    }
    assert rebuilt["model"]["config"] is not model["config"]  # a copy, not the caller's mapping
