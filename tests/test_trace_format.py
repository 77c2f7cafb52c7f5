"""mxsim.trace.format: save/load round trip, atomic writes, and clear errors for bad traces."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from mxsim.errors import TraceError
from mxsim.trace import BFPQuant, Layer, MXQuant, Network, QDQQuant, Trace, load_trace, save_trace
from mxsim.trace.conv import conv2d_direct, conv_transpose2d_direct

REPO = Path(__file__).resolve().parent.parent


def sample_trace() -> Trace:
    """conv -> relu -> flatten -> linear (a network over the dataset), plus a batched matmul."""
    rng = np.random.default_rng(11)
    images = rng.standard_normal((4, 1, 5, 5)).astype(np.float32)
    conv_w = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    conv_b = rng.standard_normal(2).astype(np.float32)
    conv = Layer("conv", "conv2d", {"input": images, "weight": conv_w, "bias": conv_b, "output": np.zeros(1)},
                 {"stride": [1, 1], "padding": [[1, 1], [1, 1]], "dilation": [1, 1], "groups": 1},
                 {"input": MXQuant("fp8_e4m3", 1, 32), "weight": BFPQuant("MX6", 1)}, {"module": "conv"})
    conv.tensors["output"] = conv2d_direct(images, conv_w, conv_b, conv.conv_geometry()).astype(np.float32)
    hidden = np.maximum(conv.output, 0).reshape(4, -1)
    fc_w = rng.standard_normal((3, 50)).astype(np.float32)
    fc_in_q = QDQQuant("int8", np.array(0.05, np.float32), np.array(0, np.int8))
    fc_w_q = QDQQuant("int8", np.full(3, 0.02, np.float32), np.zeros(3, np.int8), axis=0)
    fc = Layer("fc", "linear", {"input": hidden, "weight": fc_w, "output": hidden @ fc_w.T,
                                "input_quantized": fc_in_q.fake_quantize(hidden),
                                "weight_quantized": fc_w_q.fake_quantize(fc_w)},
               {}, {"input": fc_in_q, "weight": fc_w_q, "bias": None})
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((2, 4, 5)).astype(np.float32)
    bmm = Layer("attention scores", "matmul", {"input": a, "weight": b, "output": a @ b},
                quant={"input": MXQuant("int8", 2, 4, "quark-onnx", {"element_rounding": "nearest_even"})})
    up_x = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    up_w = rng.standard_normal((4, 1, 3, 2)).astype(np.float32)
    up = Layer("up", "conv_transpose2d", {"input": up_x, "weight": up_w, "output": np.zeros(1)},
               {"stride": [2, 2], "padding": [[1, 0], [0, 1]], "dilation": [1, 1], "groups": 2,
                "output_padding": [1, 0]}, {"weight": MXQuant("fp8_e5m2", 0, 2)})
    up.tensors["output"] = conv_transpose2d_direct(up_x, up_w, None, up.conv_geometry()).astype(np.float32)
    dataset = {"inputs": images, "labels": np.array([0, 1, 2, 1], np.int64)}
    network = Network("inputs", ({"layer": "conv"}, {"op": "relu"}, {"op": "flatten", "start_dim": 1}, {"layer": "fc"}),
                      "labels")
    return Trace("sample", [conv, fc, bmm, up], {"framework": "test"}, {"note": "hand-made", "accuracy": 0.5},
                 dataset, network)


@pytest.fixture
def saved(tmp_path) -> Path:
    return save_trace(sample_trace(), tmp_path / "trace")


def edit_manifest(path: Path, change) -> None:
    manifest = yaml.safe_load((path / "manifest.yaml").read_text())
    change(manifest)
    (path / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))


def layer_file(path: Path, layer_name: str) -> Path:
    manifest = yaml.safe_load((path / "manifest.yaml").read_text())
    return path / next(e["file"] for e in manifest["layers"] if e["name"] == layer_name)


def assert_trace_error(path: Path, layer: str | None, field: str | None, message: str):
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    error = caught.value
    text = str(error)
    assert text.startswith(f"trace {path}"), text
    assert (error.layer, error.field) == (layer, field), text
    if layer is not None:
        assert f"layer {layer!r}" in text
    if field is not None:
        assert f"field {field!r}" in text
    assert message in text, text
    return text


def test_round_trip_keeps_every_array_spec_and_field(saved):
    original = sample_trace()
    loaded = load_trace(saved)
    assert loaded.name == "sample" and loaded.path == saved
    assert loaded.source == {"framework": "test"} and loaded.metadata == {"note": "hand-made", "accuracy": 0.5}
    assert [layer.name for layer in loaded.layers] == ["conv", "fc", "attention scores", "up"]
    for before, after in zip(original.layers, loaded.layers):
        assert (after.op, after.attrs, after.source) == (before.op, before.attrs, before.source)
        assert set(after.tensors) == set(before.tensors)
        for key, array in before.tensors.items():
            assert after.tensors[key].dtype == array.dtype
            assert np.array_equal(after.tensors[key], array)
        for operand, spec in before.quant.items():
            if isinstance(spec, QDQQuant):
                got = after.quant[operand]
                assert (got.dtype, got.axis, got.block_size) == (spec.dtype, spec.axis, spec.block_size)
                assert np.array_equal(got.scale, spec.scale) and np.array_equal(got.zero_point, spec.zero_point)
            else:
                assert after.quant[operand] == spec
    assert loaded.network == original.network
    assert set(loaded.dataset) == {"inputs", "labels"} and loaded.dataset["labels"].dtype == np.int64


def test_manifest_is_versioned_yaml_and_files_are_npz(saved):
    manifest = yaml.safe_load((saved / "manifest.yaml").read_text())
    assert (manifest["format"], manifest["version"]) == ("mxsim-trace", 1)
    fc = manifest["layers"][1]
    assert fc["quant"]["weight"] == {"kind": "qdq", "dtype": "int8", "axis": 0, "block_size": 0, "saturate": True,
                                     "scale": "quant.weight.scale", "zero_point": "quant.weight.zero_point"}
    assert fc["tensors"]["quant.weight.scale"] == {"shape": [3], "dtype": "float32"}
    with np.load(saved / fc["file"], allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(fc["tensors"])
    assert manifest["layers"][2]["file"] == "layers/002-attention_scores.npz"


def test_save_refuses_to_overwrite_unless_asked(saved):
    with pytest.raises(TraceError, match="already exists"):
        save_trace(sample_trace(), saved)
    replacement = sample_trace()
    replacement.metadata = {"note": "second"}
    save_trace(replacement, saved, overwrite=True)
    assert load_trace(saved).metadata == {"note": "second"}
    assert sorted(p.name for p in saved.parent.iterdir()) == ["trace"]  # no staging or retired copies left


def test_save_never_replaces_a_directory_that_is_not_a_trace(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(TraceError, match="not a trace directory"):
        save_trace(sample_trace(), tmp_path / "photos", overwrite=True)
    assert (tmp_path / "photos" / "cat.jpg").read_bytes() == b"meow"


def test_a_failed_save_leaves_the_old_trace_and_no_debris(saved, monkeypatch):
    def exploding_savez(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", exploding_savez)
    with pytest.raises(OSError, match="disk full"):
        save_trace(sample_trace(), saved, overwrite=True)
    assert load_trace(saved).name == "sample"
    assert sorted(p.name for p in saved.parent.iterdir()) == ["trace"]


def test_save_validates_before_writing(tmp_path):
    trace = sample_trace()
    trace.layers[1].tensors["weight"] = trace.layers[1].weight[:, :10]
    with pytest.raises(TraceError, match=r"layer 'fc': field 'input': shape \(4, 50\) does not end in K = 10"):
        save_trace(trace, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_missing_trace_or_manifest(tmp_path):
    assert_trace_error(tmp_path / "nowhere", None, None, "no such trace directory")
    (tmp_path / "empty").mkdir()
    assert_trace_error(tmp_path / "empty", None, "manifest.yaml", "missing manifest.yaml")


def test_invalid_yaml(saved):
    (saved / "manifest.yaml").write_text("layers: [unclosed\n")
    assert_trace_error(saved, None, "manifest.yaml", "not valid YAML")


def test_unknown_version(saved):
    edit_manifest(saved, lambda m: m.update(version=2))
    assert_trace_error(saved, None, "version", "unknown trace format version 2 (this mxsim reads 1)")


def test_missing_layer_file(saved):
    layer_file(saved, "fc").unlink()
    assert_trace_error(saved, "fc", "file", "missing file layers/001-fc.npz")


def test_truncated_npz(saved):
    path = layer_file(saved, "conv")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert_trace_error(saved, "conv", "file", "truncated or corrupt")


def test_corrupted_npz_member(saved):
    path = layer_file(saved, "conv")
    data = bytearray(path.read_bytes())
    data[60:70] = b"\x00" * 10  # inside the first member's compressed data: CRC/zlib error on read
    path.write_bytes(bytes(data))
    text = assert_trace_error(saved, "conv", "input", "truncated or corrupt")
    assert "layers/000-conv.npz" in text


def test_pickled_object_array_is_refused_not_unpickled(saved):
    path = layer_file(saved, "fc")
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["weight"] = np.array([{"payload": "never run"}] * 3, dtype=object)
    np.savez(path, **arrays)  # np.savez pickles object arrays
    assert_trace_error(saved, "fc", "weight", "pickled (object) array")


def test_npy_instead_of_npz(saved):
    path = layer_file(saved, "fc")
    with open(path, "wb") as handle:
        np.save(handle, np.zeros(3, np.float32))
    assert_trace_error(saved, "fc", "file", "single .npy array, not an NPZ archive")


def test_file_shape_differs_from_the_manifest(saved):
    edit_manifest(saved, lambda m: m["layers"][0]["tensors"]["weight"].update(shape=[2, 1, 3, 4]))
    assert_trace_error(saved, "conv", "weight", "shape (2, 1, 3, 3) in layers/000-conv.npz, manifest says (2, 1, 3, 4)")


def test_file_dtype_differs_from_the_manifest(saved):
    edit_manifest(saved, lambda m: m["layers"][0]["tensors"]["bias"].update(dtype="float64"))
    assert_trace_error(saved, "conv", "bias", "dtype float32 in layers/000-conv.npz, manifest says float64")


def test_shapes_that_disagree_between_tensors(saved):
    path = layer_file(saved, "conv")
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["output"] = arrays["output"][:, :, :4]
    np.savez(path, **arrays)
    edit_manifest(saved, lambda m: m["layers"][0]["tensors"]["output"].update(shape=[4, 2, 4, 5]))
    assert_trace_error(saved, "conv", "output", "does not match the convolution: expected (4, 2, 5, 5)")


def test_array_missing_from_or_extra_in_the_file(saved):
    edit_manifest(saved, lambda m: m["layers"][1]["tensors"].update(bias={"shape": [3], "dtype": "float32"}))
    assert_trace_error(saved, "fc", "bias", "missing from layers/001-fc.npz")
    edit_manifest(saved, lambda m: m["layers"][1]["tensors"].pop("bias") and m["layers"][1]["tensors"].pop("input"))
    assert_trace_error(saved, "fc", "input", "holds arrays the manifest does not list")


def test_invalid_quant_spec(saved):
    edit_manifest(saved, lambda m: m["layers"][0]["quant"]["input"].update(format="fp7_e9m9"))
    assert_trace_error(saved, "conv", "quant.input", "invalid quantization spec: unknown format 'fp7_e9m9'")


def test_quant_axis_out_of_range(saved):
    edit_manifest(saved, lambda m: m["layers"][2]["quant"]["input"].update(axis=3))
    assert_trace_error(saved, "attention scores", "quant.input.axis", "3 is out of range for the 3-d input")


def test_unknown_op_and_bad_attrs(saved):
    edit_manifest(saved, lambda m: m["layers"][0]["attrs"].update(groups=0))
    assert_trace_error(saved, "conv", "attrs.groups", "must be an int >= 1")
    edit_manifest(saved, lambda m: m["layers"][0].update(op="conv3d"))
    assert_trace_error(saved, "conv", "op", "unknown op 'conv3d'")


def test_conv_transpose_attrs_and_shapes_are_checked(saved):
    edit_manifest(saved, lambda m: m["layers"][3]["attrs"].pop("output_padding"))
    assert_trace_error(saved, "up", "attrs.output_padding", "missing (conv_transpose2d needs")
    edit_manifest(saved, lambda m: m["layers"][3]["attrs"].update(output_padding=[-1, 0]))
    assert_trace_error(saved, "up", "attrs.output_padding", "must be [oh, ow] with ints >= 0")
    edit_manifest(saved, lambda m: m["layers"][3]["attrs"].update(output_padding=[0, 0]))
    assert_trace_error(saved, "up", "output", "does not match the convolution")


def test_matmul_attrs_are_alpha_and_beta_only(saved):
    edit_manifest(saved, lambda m: m["layers"][2]["attrs"].update(alpha="two"))
    assert_trace_error(saved, "attention scores", "attrs.alpha", "must be a number")
    edit_manifest(saved, lambda m: m["layers"][2].update(attrs={"transA": 1}))
    assert_trace_error(saved, "attention scores", "attrs.transA", "not a matmul attribute")


def test_layer_file_must_stay_inside_the_trace(saved):
    edit_manifest(saved, lambda m: m["layers"][0].update(file="../../etc/passwd"))
    assert_trace_error(saved, "conv", "file", "must be a relative path inside the trace")


def test_network_referring_to_an_unknown_layer(saved):
    edit_manifest(saved, lambda m: m["network"]["steps"].append({"layer": "fc2"}))
    assert_trace_error(saved, None, "network.steps[4]", "unknown layer 'fc2'")


def test_missing_dataset_file(saved):
    os.remove(saved / "dataset.npz")
    assert_trace_error(saved, None, "file", "missing file dataset.npz")


@pytest.mark.parametrize("name", ["digits-cnn", "ppocr-cls"])
def test_shipped_sample_traces_load(name):
    trace = load_trace(REPO / "traces" / name)
    assert trace.name == name and trace.layers
    assert {layer.op for layer in trace.layers} <= {"conv2d", "linear", "matmul"}


def _rewrite_member(path: Path, key: str, raw: bytes) -> None:
    import zipfile

    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    np.savez(path, **{k: v for k, v in arrays.items() if k != key})
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(f"{key}.npy", raw)


def _npy_header(descr, shape) -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode("latin1")
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def test_broken_npy_header_in_a_member(saved):
    _rewrite_member(layer_file(saved, "fc"), "weight", b"\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', 'shape': (" + b" " * 16)
    assert_trace_error(saved, "fc", "weight", "truncated or corrupt in layers/001-fc.npz: not a valid .npy array header")


def test_huge_declared_shape_is_refused_before_allocating(saved):
    edit_manifest(saved, lambda m: m["layers"][1]["tensors"]["weight"].update(shape=[10**7, 10**6]))
    _rewrite_member(layer_file(saved, "fc"), "weight", _npy_header("<f4", (10**7, 10**6)))
    assert_trace_error(saved, "fc", "weight", "the header declares shape (10000000, 1000000) of float32 "
                                              "(40000000000000 bytes) but 0 data bytes are stored")


def test_member_over_the_memory_budget(saved, monkeypatch):
    monkeypatch.setenv("MXSIM_MAX_BYTES", "256")
    assert_trace_error(saved, "conv", "file", "more than the memory budget of 256 bytes; raise it with MXSIM_MAX_BYTES")


def test_deeply_nested_or_non_utf8_manifest(saved):
    (saved / "manifest.yaml").write_text("format: " + "[" * 5000 + "]" * 5000 + "\n")
    assert_trace_error(saved, None, "manifest.yaml", "YAML nested deeper than 64 levels")
    (saved / "manifest.yaml").write_bytes("format: mxsim-trace\nname: caf\u00e9\n".encode("latin-1"))
    assert_trace_error(saved, None, "manifest.yaml", "not UTF-8 text (byte 0xe9 at offset 29)")


def test_lists_where_names_are_expected(saved):
    edit_manifest(saved, lambda m: m["network"].update(labels=["labels"]))
    assert_trace_error(saved, None, "network.labels", "['labels'] is not a dataset array")
    edit_manifest(saved, lambda m: m["network"].update(labels="labels", steps=[{"layer": ["conv"]}]))
    assert_trace_error(saved, None, "network.steps[0]", "unknown layer ['conv']")
    edit_manifest(saved, lambda m: m["network"].update(steps=[{"op": {"relu": 1}}]))
    assert_trace_error(saved, None, "network.steps[0]", "unknown op {'relu': 1}")


def test_empty_batch_is_refused(tmp_path):
    trace = sample_trace()
    fc = trace.layer("fc")
    for key in ("input", "output", "input_quantized"):
        fc.tensors[key] = fc.tensors[key][:0]
    trace.network = None
    with pytest.raises(TraceError, match="field 'input': shape \\(0, 50\\) is empty"):
        save_trace(trace, tmp_path / "t")


def test_unknown_keys_of_mixed_types_are_named(saved):
    """A YAML mapping may hold integer keys beside names: the error names one, no TypeError."""
    edit_manifest(saved, lambda m: m["layers"][2].update(attrs={"transA": 1, 7: 1}))
    assert_trace_error(saved, "attention scores", "attrs.7", "not a matmul attribute")
