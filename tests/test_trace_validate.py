"""mxsim.trace.validate: every rule a trace obeys, each broken once with a clear error naming layer and field."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim.errors import TraceError
from mxsim.trace import save_trace

from conftest import assert_trace_error, edit_manifest, layer_file, sample_trace


def test_shapes_that_disagree_between_tensors(saved_trace):
    path = layer_file(saved_trace, "conv")
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["output"] = arrays["output"][:, :, :4]
    np.savez(path, **arrays)
    edit_manifest(
        saved_trace, lambda m: m["layers"][0]["tensors"]["output"].update(shape=[4, 2, 4, 5])
    )
    assert_trace_error(
        saved_trace, "conv", "output", "does not match the convolution: expected (4, 2, 5, 5)"
    )


def test_quant_axis_out_of_range(saved_trace):
    edit_manifest(saved_trace, lambda m: m["layers"][2]["quant"]["input"].update(axis=3))
    assert_trace_error(
        saved_trace, "attention scores", "quant.input.axis", "3 is out of range for the 3-d input"
    )


def test_unknown_op_and_bad_attrs(saved_trace):
    edit_manifest(saved_trace, lambda m: m["layers"][0]["attrs"].update(groups=0))
    assert_trace_error(saved_trace, "conv", "attrs.groups", "must be an int >= 1")
    edit_manifest(saved_trace, lambda m: m["layers"][0].update(op="conv3d"))
    assert_trace_error(saved_trace, "conv", "op", "unknown op 'conv3d'")


def test_conv_transpose_attrs_and_shapes_are_checked(saved_trace):
    edit_manifest(saved_trace, lambda m: m["layers"][3]["attrs"].pop("output_padding"))
    assert_trace_error(saved_trace, "up", "attrs.output_padding", "missing (conv_transpose2d needs")
    edit_manifest(saved_trace, lambda m: m["layers"][3]["attrs"].update(output_padding=[-1, 0]))
    assert_trace_error(saved_trace, "up", "attrs.output_padding", "must be [oh, ow] with ints >= 0")
    edit_manifest(saved_trace, lambda m: m["layers"][3]["attrs"].update(output_padding=[0, 0]))
    assert_trace_error(saved_trace, "up", "output", "does not match the convolution")


def test_matmul_attrs_are_alpha_and_beta_only(saved_trace):
    edit_manifest(saved_trace, lambda m: m["layers"][2]["attrs"].update(alpha="two"))
    assert_trace_error(saved_trace, "attention scores", "attrs.alpha", "must be a number")
    edit_manifest(saved_trace, lambda m: m["layers"][2].update(attrs={"transA": 1}))
    assert_trace_error(saved_trace, "attention scores", "attrs.transA", "not a matmul attribute")


def test_unknown_keys_of_mixed_types_are_named(saved_trace):
    """A YAML mapping may hold integer keys beside names: the error names one, no TypeError."""
    edit_manifest(saved_trace, lambda m: m["layers"][2].update(attrs={"transA": 1, 7: 1}))
    assert_trace_error(saved_trace, "attention scores", "attrs.7", "not a matmul attribute")


def test_network_referring_to_an_unknown_layer(saved_trace):
    edit_manifest(saved_trace, lambda m: m["network"]["steps"].append({"layer": "fc2"}))
    assert_trace_error(saved_trace, None, "network.steps[4]", "unknown layer 'fc2'")


def test_lists_where_names_are_expected(saved_trace):
    edit_manifest(saved_trace, lambda m: m["network"].update(labels=["labels"]))
    assert_trace_error(saved_trace, None, "network.labels", "['labels'] is not a dataset array")
    edit_manifest(
        saved_trace, lambda m: m["network"].update(labels="labels", steps=[{"layer": ["conv"]}])
    )
    assert_trace_error(saved_trace, None, "network.steps[0]", "unknown layer ['conv']")
    edit_manifest(saved_trace, lambda m: m["network"].update(steps=[{"op": {"relu": 1}}]))
    assert_trace_error(saved_trace, None, "network.steps[0]", "unknown op {'relu': 1}")


def test_empty_batch_is_refused(tmp_path):
    trace = sample_trace()
    fc = trace.layer("fc")
    for key in ("input", "output", "input_quantized"):
        fc.tensors[key] = fc.tensors[key][:0]
    trace.network = None
    with pytest.raises(TraceError, match="field 'input': shape \\(0, 50\\) is empty"):
        save_trace(trace, tmp_path / "t")


def test_save_validates_before_writing(tmp_path):
    trace = sample_trace()
    trace.layers[1].tensors["weight"] = trace.layers[1].weight[:, :10]
    with pytest.raises(
        TraceError, match=r"layer 'fc': field 'input': shape \(4, 50\) does not end in K = 10"
    ):
        save_trace(trace, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "start_dim, field, message",
    [
        (
            4,
            "network.steps[2]",
            "flatten start_dim 4 is not below the rank 4 of its input (4, 2, 5, 5)",
        ),
        (3, "network.steps[3]", "layer 'fc' takes inputs (..., 50), gets (4, 2, 5, 5)"),
    ],
)
def test_a_flatten_the_tensor_cannot_take_is_refused_on_load(
    saved_trace, start_dim, field, message
):
    edit_manifest(saved_trace, lambda m: m["network"]["steps"][2].update(start_dim=start_dim))
    assert_trace_error(saved_trace, None, field, message)


def test_labels_must_give_one_label_per_output_row():
    trace = sample_trace()
    for labels in (
        np.array([0, 1, 2], np.int64),
        np.array([0, 1, 2, 1, 0], np.int64),
        np.zeros((4, 1), np.int64),
    ):
        trace.dataset["labels"] = labels
        with pytest.raises(
            TraceError,
            match=r"network.labels.*do not give one label per row of the network's "
            r"output \(4, 3\)",
        ):
            save_trace(trace, "unused")
