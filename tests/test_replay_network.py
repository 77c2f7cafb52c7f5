"""mxsim.replay.network: running a trace's sequential recipe end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mxsim.errors import MxsimError, TraceError
from mxsim.replay import accuracy, layer_with_input, run_network
from mxsim.replay.lowering import gemm_reference
from mxsim.trace import Network, Trace, load_trace, save_trace

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "traces" / "digits-cnn"


@pytest.fixture(scope="module")
def digits() -> Trace:
    return load_trace(DIGITS)


def test_digits_float_accuracy_is_reproduced_from_the_trace_alone(digits):
    assert digits.metadata["test_samples"] == len(digits.dataset["labels"]) == 360
    assert accuracy(digits) == digits.metadata["float_accuracy"]
    assert digits.metadata["float_accuracy"] > 0.95


def test_digits_network_chains_the_captured_layers(digits):
    steps = digits.network.steps
    assert [s.get("layer", s.get("op")) for s in steps] == [
        "conv1",
        "relu",
        "conv2",
        "relu",
        "flatten",
        "fc1",
        "relu",
        "fc2",
    ]
    # each captured input is the previous captured output after the recipe's ops, bit for bit
    conv1, conv2, fc1, fc2 = digits.layers
    assert np.array_equal(conv1.input, digits.dataset["inputs"])
    assert np.array_equal(conv2.input, np.maximum(conv1.output, 0))
    assert np.array_equal(fc1.input, np.maximum(conv2.output, 0).reshape(360, -1))
    assert np.array_equal(fc2.input, np.maximum(fc1.output, 0))
    logits = run_network(digits)
    np.testing.assert_allclose(logits, fc2.output, rtol=0, atol=1e-4)


def test_layer_fn_sees_every_layer_in_order_with_the_running_value(digits):
    seen = []

    def record(layer, x):
        seen.append((layer.name, x.shape))
        return gemm_reference(layer_with_input(layer, x))

    run_network(digits, digits.dataset["inputs"][:5], layer_fn=record)
    assert seen == [
        ("conv1", (5, 1, 8, 8)),
        ("conv2", (5, 8, 8, 8)),
        ("fc1", (5, 256)),
        ("fc2", (5, 32)),
    ]


def test_layer_with_input_keeps_weights_and_reshapes_the_output(digits):
    conv2 = digits.layer("conv2")
    smaller = layer_with_input(conv2, conv2.input[:3])
    assert smaller.output.shape == (3, 16, 4, 4) and "input_quantized" not in smaller.tensors
    assert smaller.weight is conv2.weight and smaller.attrs == conv2.attrs
    np.testing.assert_allclose(gemm_reference(smaller), conv2.output[:3], rtol=0, atol=1e-5)


def test_accuracy_uses_the_layer_fn(digits):
    def zeros(layer, x):
        return np.zeros(layer_with_input(layer, x).output.shape)

    # all-zero logits: argmax is class 0 everywhere
    assert accuracy(digits, layer_fn=zeros) == np.mean(digits.dataset["labels"] == 0)


def test_traces_without_network_say_so():
    trace = load_trace(REPO / "traces" / "ppocr-cls")
    with pytest.raises(MxsimError, match="has no network recipe"):
        run_network(trace)


def test_network_validation_on_save(tmp_path, digits):
    bad = Trace(
        digits.name,
        digits.layers,
        digits.source,
        digits.metadata,
        digits.dataset,
        Network("inputs", ({"layer": "conv1"}, {"op": "softmax"})),
    )
    with pytest.raises(TraceError, match=r"field 'network.steps\[1\]': unknown op 'softmax'"):
        save_trace(bad, tmp_path / "bad")
    bad.network = Network("images", ({"layer": "conv1"},))
    with pytest.raises(TraceError, match=r"field 'network.input': 'images' is not a dataset array"):
        save_trace(bad, tmp_path / "bad")
