"""mxsim.trace.io: save/load round trip, atomic writes, and clear errors for bad trace files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from mxsim.errors import TraceError
from mxsim.trace import QDQQuant, load_trace, save_trace

from conftest import REPO, assert_trace_error, edit_manifest, layer_file, sample_trace


def test_round_trip_keeps_every_array_spec_and_field(saved_trace):
    original = sample_trace()
    loaded = load_trace(saved_trace)
    assert loaded.name == "sample" and loaded.path == saved_trace
    assert loaded.source == {"framework": "test"} and loaded.metadata == {
        "note": "hand-made",
        "accuracy": 0.5,
    }
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
                assert (got.dtype, got.axis, got.block_size) == (
                    spec.dtype,
                    spec.axis,
                    spec.block_size,
                )
                assert np.array_equal(got.scale, spec.scale) and np.array_equal(
                    got.zero_point, spec.zero_point
                )
            else:
                assert after.quant[operand] == spec
    assert loaded.network == original.network
    assert (
        set(loaded.dataset) == {"inputs", "labels"} and loaded.dataset["labels"].dtype == np.int64
    )


def test_manifest_is_versioned_yaml_and_files_are_npz(saved_trace):
    manifest = yaml.safe_load((saved_trace / "manifest.yaml").read_text())
    assert (manifest["format"], manifest["version"]) == ("mxsim-trace", 1)
    fc = manifest["layers"][1]
    assert fc["quant"]["weight"] == {
        "kind": "qdq",
        "dtype": "int8",
        "axis": 0,
        "block_size": 0,
        "saturate": True,
        "scale": "quant.weight.scale",
        "zero_point": "quant.weight.zero_point",
    }
    assert fc["tensors"]["quant.weight.scale"] == {"shape": [3], "dtype": "float32"}
    with np.load(saved_trace / fc["file"], allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(fc["tensors"])
    assert manifest["layers"][2]["file"] == "layers/002-attention_scores.npz"


def test_save_refuses_to_overwrite_unless_asked(saved_trace):
    with pytest.raises(TraceError, match="already exists"):
        save_trace(sample_trace(), saved_trace)
    replacement = sample_trace()
    replacement.metadata = {"note": "second"}
    save_trace(replacement, saved_trace, overwrite=True)
    assert load_trace(saved_trace).metadata == {"note": "second"}
    assert sorted(p.name for p in saved_trace.parent.iterdir()) == [
        "trace"
    ]  # no staging or retired copies left


def test_save_never_replaces_a_directory_that_is_not_a_trace(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(TraceError, match="not a trace directory"):
        save_trace(sample_trace(), tmp_path / "photos", overwrite=True)
    assert (tmp_path / "photos" / "cat.jpg").read_bytes() == b"meow"


def test_a_failed_save_leaves_the_old_trace_and_no_debris(saved_trace, monkeypatch):
    def exploding_savez(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", exploding_savez)
    with pytest.raises(OSError, match="disk full"):
        save_trace(sample_trace(), saved_trace, overwrite=True)
    assert load_trace(saved_trace).name == "sample"
    assert sorted(p.name for p in saved_trace.parent.iterdir()) == ["trace"]


def test_missing_trace_or_manifest(tmp_path):
    assert_trace_error(tmp_path / "nowhere", None, None, "no such trace directory")
    (tmp_path / "empty").mkdir()
    assert_trace_error(tmp_path / "empty", None, "manifest.yaml", "missing manifest.yaml")


def test_invalid_yaml(saved_trace):
    (saved_trace / "manifest.yaml").write_text("layers: [unclosed\n")
    assert_trace_error(saved_trace, None, "manifest.yaml", "not valid YAML")


def test_unknown_version(saved_trace):
    edit_manifest(saved_trace, lambda m: m.update(version=3))
    assert_trace_error(
        saved_trace, None, "version", "unknown trace format version 3 (this mxsim reads 1, 2)"
    )


def test_missing_layer_file(saved_trace):
    layer_file(saved_trace, "fc").unlink()
    assert_trace_error(saved_trace, "fc", "file", "missing file layers/001-fc.npz")


def test_truncated_npz(saved_trace):
    path = layer_file(saved_trace, "conv")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert_trace_error(saved_trace, "conv", "file", "truncated or corrupt")


def test_corrupted_npz_member(saved_trace):
    path = layer_file(saved_trace, "conv")
    data = bytearray(path.read_bytes())
    data[60:70] = b"\x00" * 10  # inside the first member's compressed data: CRC/zlib error on read
    path.write_bytes(bytes(data))
    text = assert_trace_error(saved_trace, "conv", "input", "truncated or corrupt")
    assert "layers/000-conv.npz" in text


def test_pickled_object_array_is_refused_not_unpickled(saved_trace):
    path = layer_file(saved_trace, "fc")
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["weight"] = np.array([{"payload": "never run"}] * 3, dtype=object)
    np.savez(path, **arrays)  # np.savez pickles object arrays
    assert_trace_error(saved_trace, "fc", "weight", "pickled (object) array")


def test_npy_instead_of_npz(saved_trace):
    path = layer_file(saved_trace, "fc")
    with open(path, "wb") as handle:
        np.save(handle, np.zeros(3, np.float32))
    assert_trace_error(saved_trace, "fc", "file", "single .npy array, not an NPZ archive")


def test_file_shape_differs_from_the_manifest(saved_trace):
    edit_manifest(
        saved_trace, lambda m: m["layers"][0]["tensors"]["weight"].update(shape=[2, 1, 3, 4])
    )
    assert_trace_error(
        saved_trace,
        "conv",
        "weight",
        "shape (2, 1, 3, 3) in layers/000-conv.npz, manifest says (2, 1, 3, 4)",
    )


def test_file_dtype_differs_from_the_manifest(saved_trace):
    edit_manifest(saved_trace, lambda m: m["layers"][0]["tensors"]["bias"].update(dtype="float64"))
    assert_trace_error(
        saved_trace, "conv", "bias", "dtype float32 in layers/000-conv.npz, manifest says float64"
    )


def test_array_missing_from_or_extra_in_the_file(saved_trace):
    edit_manifest(
        saved_trace,
        lambda m: m["layers"][1]["tensors"].update(bias={"shape": [3], "dtype": "float32"}),
    )
    assert_trace_error(saved_trace, "fc", "bias", "missing from layers/001-fc.npz")
    edit_manifest(
        saved_trace,
        lambda m: m["layers"][1]["tensors"].pop("bias") and m["layers"][1]["tensors"].pop("input"),
    )
    assert_trace_error(saved_trace, "fc", "input", "holds arrays the manifest does not list")


def test_invalid_quant_spec(saved_trace):
    edit_manifest(saved_trace, lambda m: m["layers"][0]["quant"]["input"].update(format="fp7_e9m9"))
    assert_trace_error(
        saved_trace, "conv", "quant.input", "invalid quantization spec: unknown format 'fp7_e9m9'"
    )


def test_layer_file_must_stay_inside_the_trace(saved_trace):
    edit_manifest(saved_trace, lambda m: m["layers"][0].update(file="../../etc/passwd"))
    assert_trace_error(saved_trace, "conv", "file", "must be a relative path inside the trace")


def test_layer_file_name_longer_than_the_os_allows(saved_trace):
    """The OS refuses names over 255 bytes; the manifest's error says so (no OSError)."""
    edit_manifest(saved_trace, lambda m: m["layers"][0].update(file="a" * 300 + ".npz"))
    assert_trace_error(saved_trace, "conv", "file", "names of at most 255 bytes")


def test_missing_dataset_file(saved_trace):
    os.remove(saved_trace / "dataset.npz")
    assert_trace_error(saved_trace, None, "file", "missing file dataset.npz")


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


def test_broken_npy_header_in_a_member(saved_trace):
    _rewrite_member(
        layer_file(saved_trace, "fc"),
        "weight",
        b"\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', 'shape': (" + b" " * 16,
    )
    assert_trace_error(
        saved_trace,
        "fc",
        "weight",
        "truncated or corrupt in layers/001-fc.npz: not a valid .npy array header",
    )


def test_huge_declared_shape_is_refused_before_allocating(saved_trace):
    edit_manifest(
        saved_trace, lambda m: m["layers"][1]["tensors"]["weight"].update(shape=[10**7, 10**6])
    )
    _rewrite_member(layer_file(saved_trace, "fc"), "weight", _npy_header("<f4", (10**7, 10**6)))
    assert_trace_error(
        saved_trace,
        "fc",
        "weight",
        "the header declares shape (10000000, 1000000) of float32 "
        "(40000000000000 bytes) but 0 data bytes are stored",
    )


def test_member_over_the_memory_budget(saved_trace, monkeypatch):
    monkeypatch.setenv("MXSIM_MAX_BYTES", "256")
    assert_trace_error(
        saved_trace,
        "conv",
        "file",
        "more than the memory budget of 256 bytes; raise it with MXSIM_MAX_BYTES",
    )


def test_deeply_nested_or_non_utf8_manifest(saved_trace):
    (saved_trace / "manifest.yaml").write_text("format: " + "[" * 5000 + "]" * 5000 + "\n")
    assert_trace_error(saved_trace, None, "manifest.yaml", "YAML nested deeper than 64 levels")
    (saved_trace / "manifest.yaml").write_bytes(
        "format: mxsim-trace\nname: caf\u00e9\n".encode("latin-1")
    )
    assert_trace_error(
        saved_trace, None, "manifest.yaml", "not UTF-8 text (byte 0xe9 at offset 29)"
    )


def _move_out(path: Path, outside: Path) -> None:
    """Move ``path`` to ``outside`` and leave a symlink to it in its place."""
    target = outside / path.name
    path.rename(target)
    path.symlink_to(target)


@pytest.mark.parametrize("what", ["manifest", "layers directory", "layer file", "dataset"])
def test_symlinks_leading_out_of_the_trace_are_refused(saved_trace, tmp_path, what):
    outside = tmp_path / "outside"
    outside.mkdir()
    path = {
        "manifest": saved_trace / "manifest.yaml",
        "layers directory": saved_trace / "layers",
        "layer file": layer_file(saved_trace, "fc"),
        "dataset": saved_trace / "dataset.npz",
    }[what]
    _move_out(path, outside)
    layer, field = {
        "manifest": (None, "manifest.yaml"),
        "layers directory": ("conv", "file"),
        "layer file": ("fc", "file"),
        "dataset": (None, "file"),
    }[what]
    assert_trace_error(
        saved_trace, layer, field, "leads out of the trace directory (a symlink); refused"
    )


def test_symlinks_inside_the_trace_and_a_symlinked_trace_load(saved_trace, tmp_path):
    (saved_trace / "layers").rename(saved_trace / "layer-files")
    (saved_trace / "layers").symlink_to("layer-files")  # relative, inside the trace
    (tmp_path / "link").symlink_to(saved_trace)
    assert [layer.name for layer in load_trace(tmp_path / "link").layers] == [
        "conv",
        "fc",
        "attention scores",
        "up",
    ]


def test_a_symlink_loop_is_refused(saved_trace):
    os.remove(saved_trace / "dataset.npz")
    (saved_trace / "dataset.npz").symlink_to("dataset.npz")
    with pytest.raises(TraceError, match="dataset.npz"):
        load_trace(saved_trace)


# --- format version 2: content-addressed blobs, operands as codes and scales ------------------


def _shared_input_trace():
    """Two linear layers reading one input (as a transformer's q and k projections do)."""
    from mxsim.trace import Layer, MXQuant, Trace

    rng = np.random.default_rng(21)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    layers = []
    for name in ("q", "k"):
        w = rng.standard_normal((8, 64)).astype(np.float32)
        spec = MXQuant("fp8_e4m3", 1, 32)
        layers.append(
            Layer(
                name,
                "linear",
                {"input": x, "weight": w, "output": x @ w.T},
                {},
                {"input": spec, "weight": spec},
            )
        )
    return Trace("shared", layers)


def test_version_2_stores_each_array_once(tmp_path):
    trace = _shared_input_trace()
    path = save_trace(trace, tmp_path / "t")
    manifest = yaml.safe_load((path / "manifest.yaml").read_text())
    assert manifest["version"] == 2 and "file" not in manifest["layers"][0]
    blobs = [entry["blob"] for layer in manifest["layers"] for entry in layer["tensors"].values()]
    assert len(blobs) == 6 and len(set(blobs)) == 5  # the shared input once
    assert sorted(p.name for p in (path / "tensors").iterdir()) == sorted(
        f"{b}.npz" for b in set(blobs)
    )
    loaded = load_trace(path)
    for saved, got in zip(trace.layers, loaded.layers):
        assert got.codes_only == frozenset() and got.tensors.keys() == saved.tensors.keys()
        for key, array in saved.tensors.items():
            assert got.tensors[key].dtype == array.dtype and np.array_equal(got.tensors[key], array)


def test_round_trip_of_every_sample_array_in_version_2(tmp_path):
    trace = sample_trace()
    loaded = load_trace(save_trace(trace, tmp_path / "t"))
    for saved, got in zip(trace.layers, loaded.layers):
        assert got.tensors.keys() == saved.tensors.keys() and got.quant.keys() == saved.quant.keys()
        for operand, spec in saved.quant.items():
            if isinstance(spec, QDQQuant):  # its arrays are blobs too
                assert all(
                    np.array_equal(a, b)
                    for a, b in zip(
                        spec.arrays(operand).values(), got.quant[operand].arrays(operand).values()
                    )
                )
            else:
                assert got.quant[operand] == spec
        for key, array in saved.tensors.items():
            assert got.tensors[key].dtype == array.dtype and np.array_equal(got.tensors[key], array)
    assert all(np.array_equal(loaded.dataset[k], v) for k, v in trace.dataset.items())


def test_compact_trace_keeps_codes_and_scales_of_mx_operands(tmp_path):
    from mxsim.quantize import quantize

    trace = sample_trace()
    loaded = load_trace(save_trace(trace, tmp_path / "t", floats=False))
    kept = {layer.name: sorted(layer.codes_only) for layer in loaded.layers}
    # MX specs only: the conv weight is BFP, fc is QDQ, the up layer's input has no spec
    assert kept == {"conv": ["input"], "fc": [], "attention scores": ["input"], "up": ["weight"]}
    for saved, got in zip(trace.layers, loaded.layers):
        for key, array in saved.tensors.items():
            if key in got.codes_only:  # the model's quantized values, as the quantizer gives them
                spec = saved.quant[key]
                want = quantize(
                    array,
                    spec.format,
                    axis=spec.axis,
                    block_size=spec.block_size,
                    profile=spec.profile,
                    **dict(spec.options),
                ).dequantize(np.float64)
                assert got.tensors[key].dtype == array.dtype and np.array_equal(
                    got.tensors[key], want
                )
            else:
                assert np.array_equal(got.tensors[key], array)
    for floats in (
        False,
        True,
    ):  # a compact trace stays compact: its decoded values never pass for floats
        again = load_trace(save_trace(loaded, tmp_path / f"again-{floats}", floats=floats))
        assert [layer.codes_only for layer in again.layers] == [
            layer.codes_only for layer in loaded.layers
        ]
    with pytest.raises(TraceError, match="field 'codes_only'.*cannot be written in version 1"):
        save_trace(loaded, tmp_path / "v1", version=1)
    loaded.layers[0].tensors["input"] = trace.layers[0].input  # a float where codes are claimed
    with pytest.raises(
        TraceError, match="kept as codes only, but its values are not those of its MX spec"
    ):
        save_trace(loaded, tmp_path / "bad")


def _edit_v2(path, change):
    edit_manifest(path, change)


@pytest.fixture
def saved_v2(tmp_path):
    return save_trace(_shared_input_trace(), tmp_path / "v2", floats=False, reference="float32")


def _blob_of(path, layer=0, key="output"):
    manifest = yaml.safe_load((path / "manifest.yaml").read_text())
    return manifest["layers"][layer]["tensors"][key]


def test_version_2_hostile_blob_names_and_files(saved_v2, tmp_path):
    blob = _blob_of(saved_v2)["blob"]
    for bad in ("../../../etc/passwd", "A" * 32, blob[:-1], 12):
        _edit_v2(saved_v2, lambda m: m["layers"][0]["tensors"]["output"].update(blob=bad))
        assert_trace_error(saved_v2, "q", "tensors.output", "blob must be 32 lower-case hex digits")
    _edit_v2(saved_v2, lambda m: m["layers"][0]["tensors"]["output"].update(blob=blob))
    load_trace(saved_v2)
    # another valid blob under this name: refused by its content id
    other = _blob_of(saved_v2, 1, "output")["blob"]
    os.replace(saved_v2 / "tensors" / f"{other}.npz", saved_v2 / "tensors" / f"{blob}.npz")
    assert_trace_error(saved_v2, "q", "tensors.output", "does not hold the array its name says")
    os.remove(saved_v2 / "tensors" / f"{blob}.npz")
    assert_trace_error(saved_v2, "q", "tensors.output", f"missing file tensors/{blob}.npz")


def test_version_2_blob_symlinked_out_of_the_trace_is_refused(saved_v2, tmp_path):
    blob = _blob_of(saved_v2)["blob"]
    outside = tmp_path / "outside"
    outside.mkdir()
    _move_out(saved_v2 / "tensors" / f"{blob}.npz", outside)
    assert_trace_error(saved_v2, "q", "tensors.output", "leads out of the trace directory")


def test_version_2_hostile_entries(saved_v2):
    entry = _blob_of(saved_v2, 0, "input")
    assert set(entry) == {"shape", "dtype", "codes", "scales"}
    cases = [
        (
            lambda m: m["layers"][0]["tensors"]["input"].update(blob=entry["codes"]),
            "tensors.input",
            "manifest entry must have exactly",
        ),
        (
            lambda m: m["layers"][0].update(file="layers/000-q.npz"),
            "file",
            "unknown layer key (format version 2)",
        ),
        (
            lambda m: m["layers"][0]["tensors"]["input"].update(shape=[4, 96]),
            "tensors.input.codes",
            "shape (1, 256) in tensors/",
        ),
        (
            lambda m: m["layers"][0]["quant"].update(input=None),
            "tensors.input",
            "only a float input or weight with an MX spec is stored as codes",
        ),
        (
            lambda m: m["layers"][0]["tensors"].update(output={**entry, "shape": [4, 8]}),
            "tensors.output",
            "only a float input or weight with an MX spec is stored as codes",
        ),
    ]
    for change, field, message in cases:
        original = (saved_v2 / "manifest.yaml").read_text()
        _edit_v2(saved_v2, change)
        assert_trace_error(saved_v2, "q", field, message)
        (saved_v2 / "manifest.yaml").write_text(original)


def test_version_2_codes_outside_the_format_are_refused(saved_v2):
    """A codes blob with a valid content id but codes the element format does not have."""
    from mxsim.trace.io import _shuffled, content_id

    entry = _blob_of(saved_v2, 0, "input")
    bad = np.full(
        (4, 64), 255, np.uint8
    )  # fp8_e4m3 has 256 codes: 255 is one; use fp4's range below
    spec = {
        "kind": "mx",
        "format": "fp4_e2m1",
        "axis": 1,
        "block_size": 32,
        "profile": "ocp",
        "options": {},
    }
    blob = content_id(bad)
    np.savez(saved_v2 / "tensors" / f"{blob}.npz", data=_shuffled(bad))
    _edit_v2(
        saved_v2,
        lambda m: (
            m["layers"][0]["tensors"]["input"].update(codes=blob),
            m["layers"][0]["quant"].update(input=spec),
        ),
    )
    assert_trace_error(
        saved_v2, "q", "tensors.input.codes", "codes must lie in [0, 16) for fp4_e2m1"
    )
    assert entry["codes"] != blob


def test_version_1_is_still_written_and_read(tmp_path):
    trace = _shared_input_trace()
    path = save_trace(trace, tmp_path / "v1", version=1)
    assert (
        yaml.safe_load((path / "manifest.yaml").read_text())["version"] == 1
        and (path / "layers").is_dir()
    )
    assert np.array_equal(load_trace(path).layers[1].input, trace.layers[1].input)
    with pytest.raises(Exception, match="version must be one of"):
        save_trace(trace, tmp_path / "v3", version=3)


# --- compact traces: float reference outputs as residuals -------------------------------------


def test_compact_trace_stores_reference_outputs_as_residuals_within_their_bound(tmp_path):
    from mxsim.errors import ArgumentError
    from mxsim.quantize import quantize
    from mxsim.trace.reference import mx_prediction

    trace = _shared_input_trace()
    exact = load_trace(save_trace(trace, tmp_path / "exact", floats=False, reference="float32"))
    path = save_trace(trace, tmp_path / "residual", floats=False)  # residual8: the compact default
    entry = _blob_of(path, 0, "output")
    assert set(entry) == {"shape", "dtype", "reference", "residual", "step_exponent"}
    assert entry["reference"] == "residual8" and entry["dtype"] == "float32"
    loaded = load_trace(path)
    for saved, whole, got in zip(trace.layers, exact.layers, loaded.layers):
        assert whole.reference == "float32" and np.array_equal(whole.output, saved.output)
        assert got.reference == "residual8" and got.codes_only == {"input", "weight"}
        for key in ("input", "weight"):  # the operands are the compact trace's, bit for bit
            assert np.array_equal(got.tensors[key], whole.tensors[key])
        exponent = _blob_of(path, trace.layers.index(saved), "output")["step_exponent"]
        codes = [
            quantize(saved.tensors[key], "fp8_e4m3", axis=1) for key in ("input", "weight")
        ]  # the specs'
        residual = saved.output.astype(np.float64) - mx_prediction("linear", {}, *codes, None)
        error = np.abs(got.output.astype(np.float64) - saved.output)
        spacing = np.spacing(np.abs(got.output)).astype(np.float64)
        assert got.output.dtype == np.float32 and 0 < error.max()
        assert np.all(error <= 2.0 ** (exponent - 1) + spacing)
        assert 2.0 ** (exponent - 1) <= 2.0**-8 * np.sqrt(np.mean(np.square(residual)))
    # a reconstructed reference never passes for the exact one: it stays a residual, unchanged
    again = load_trace(save_trace(loaded, tmp_path / "again", floats=True))
    assert all(layer.reference == "residual8" for layer in again.layers)
    assert all(np.array_equal(a.output, b.output) for a, b in zip(loaded.layers, again.layers))
    with pytest.raises(TraceError, match="cannot be written in version 1"):
        save_trace(loaded, tmp_path / "v1", version=1)
    with pytest.raises(ArgumentError, match="reference residual8 needs a compact version-2 trace"):
        save_trace(trace, tmp_path / "floats", reference="residual8")
    with pytest.raises(
        ArgumentError, match="reference must be one of float32, residual8, got 'float16'"
    ):
        save_trace(trace, tmp_path / "bad", floats=False, reference="float16")


@pytest.fixture
def saved_residual(tmp_path):
    return save_trace(_shared_input_trace(), tmp_path / "residual", floats=False)


def _put_blob(path: Path, array: np.ndarray) -> str:
    """Store ``array`` as a valid blob of the trace at ``path``; its id."""
    from mxsim.trace.io import _shuffled, content_id

    blob = content_id(array)
    np.savez_compressed(path / "tensors" / f"{blob}.npz", data=_shuffled(array))
    return blob


def test_hostile_residual_entries(saved_residual):
    entry = _blob_of(saved_residual, 0, "output")
    codes = _blob_of(saved_residual, 0, "input")["codes"]
    float_blob = _put_blob(saved_residual, np.ones((4, 8), np.float32))
    wide_blob = _put_blob(saved_residual, np.ones((4, 8), np.int32))
    out = "tensors.output"
    cases = [
        ({"step_exponent": None}, out, "manifest entry must have exactly"),  # the key dropped below
        (
            {"step_exponent": "3"},
            f"{out}.step_exponent",
            "must be an integer in [-1100, 1100], got '3'",
        ),
        ({"step_exponent": 2.5}, f"{out}.step_exponent", "must be an integer in"),
        ({"step_exponent": True}, f"{out}.step_exponent", "must be an integer in"),
        ({"step_exponent": 10**6}, f"{out}.step_exponent", "must be an integer in"),
        ({"step_exponent": 1000}, out, "the reconstructed reference is not finite"),
        (
            {"reference": "float32"},
            f"{out}.reference",
            "unknown residual reference 'float32'; accepted: residual8",
        ),
        ({"reference": ["residual8"]}, f"{out}.reference", "unknown residual reference"),
        (
            {"dtype": "float64"},
            f"{out}.dtype",
            "a residual reference output is float32, not float64",
        ),
        (
            {"residual": codes},
            f"{out}.residual",
            "holds uint8 (4, 64), the manifest says int16 (4, 8)",
        ),
        ({"residual": float_blob}, f"{out}.residual", "shape (4, 32) in tensors/"),  # float32 bytes
        ({"residual": wide_blob}, f"{out}.residual", "shape (4, 32) in tensors/"),  # int32 bytes
        ({"residual": "0" * 32}, f"{out}.residual", "missing file tensors/" + "0" * 32),
        ({"residual": "../x"}, f"{out}.residual", "blob must be 32 lower-case hex digits"),
    ]
    original = (saved_residual / "manifest.yaml").read_text()
    for change, field, message in cases:

        def edit(m, change=change):
            output = m["layers"][0]["tensors"]["output"]
            output.update(change)
            for key in [k for k, v in change.items() if v is None]:
                del output[key]

        _edit_v2(saved_residual, edit)
        assert_trace_error(saved_residual, "q", field, message)
        (saved_residual / "manifest.yaml").write_text(original)
    load_trace(saved_residual)
    assert entry["residual"] not in (float_blob, wide_blob)


def test_a_residual_needs_both_operands_as_codes_along_k(saved_residual, tmp_path):
    trace = _shared_input_trace()
    whole = save_trace(trace, tmp_path / "whole")  # floats kept: no codes to predict from
    entry = _blob_of(saved_residual, 0, "output")
    os.replace(
        saved_residual / "tensors" / f"{entry['residual']}.npz",
        whole / "tensors" / f"{entry['residual']}.npz",
    )
    _edit_v2(whole, lambda m: m["layers"][0]["tensors"].update(output=entry))
    assert_trace_error(
        whole,
        "q",
        "reference",
        "a residual8 output is reconstructed from the operands' codes: both must be codes only",
    )


def test_corrupt_bomb_or_pickled_residual_blobs_are_refused(saved_residual, monkeypatch):
    import zipfile

    blob = saved_residual / "tensors" / f"{_blob_of(saved_residual, 0, 'output')['residual']}.npz"
    good = blob.read_bytes()
    blob.write_bytes(good[: len(good) // 2])
    assert_trace_error(saved_residual, "q", "tensors.output.residual", "truncated or corrupt")
    # a deflate bomb: a valid header for the residual's shape, then 64 MiB of zeros (64 kB stored)
    with (
        zipfile.ZipFile(blob, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("data.npy", "w", force_zip64=True) as member,
    ):
        member.write(_npy_header("|u1", (2, 32)))
        chunk = bytes(1 << 24)
        for _ in range(4):
            member.write(chunk)
    assert_trace_error(
        saved_residual,
        "q",
        "tensors.output.residual",
        "the header declares shape (2, 32) of uint8 (64 bytes) but 67108864 data bytes are stored",
    )
    np.savez(
        blob, data=np.array([{"payload": "never run"}], dtype=object)
    )  # np.savez pickles object arrays
    assert_trace_error(saved_residual, "q", "tensors.output.residual", "pickled (object) array")
    blob.write_bytes(good)
    load_trace(saved_residual)


def test_a_compact_trace_written_before_residual_references_still_loads(tmp_path):
    """tests/data/trace/shared-v2-compact: the two-layer trace above saved compact by the code
    before reference modes existed (float32 outputs as blobs)."""
    old = load_trace(REPO / "tests/data/trace/shared-v2-compact")
    trace = _shared_input_trace()
    for saved, got in zip(trace.layers, old.layers):
        assert got.reference == "float32" and got.codes_only == {"input", "weight"}
        # The stored output is a float32 product summed by the writing machine's BLAS, which
        # another machine's float32 matmul need not reproduce bit for bit: it is held to the
        # float32 summation bound around the exact product instead.
        x, w = saved.tensors["input"].astype(np.float64), saved.tensors["weight"].astype(np.float64)
        bound = x.shape[1] * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w).T)
        assert got.output.dtype == np.float32 and np.all(np.abs(got.output - x @ w.T) <= bound)
    again = load_trace(save_trace(old, tmp_path / "again", floats=False))
    assert [layer.reference for layer in again.layers] == ["residual8", "residual8"]


def _nvfp4_trace():
    from mxsim.quantize import quantize_nvfp4
    from mxsim.trace import NVFP4Quant
    from mxsim.trace.model import Layer, Trace

    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((3, 32)).astype(np.float32), rng.standard_normal((4, 32))
    t = float(np.float32(1e-3))
    q = quantize_nvfp4(w.astype(np.float32), t)
    tensors = {
        "input": x,
        "weight": q.dequantize(),
        "weight_quantized": q.dequantize(),
        "output": (x @ q.dequantize().T).astype(np.float32),
    }
    layer = Layer("l", "linear", tensors, quant={"weight": NVFP4Quant(1, q.scales, t)})
    return Trace("t", [layer]), q


@pytest.mark.parametrize("floats", [True, False])
def test_nvfp4_spec_round_trips_with_its_scales_and_tensor_scale(tmp_path, floats):
    trace, q = _nvfp4_trace()
    save_trace(trace, tmp_path / "t", floats=floats)
    layer = load_trace(tmp_path / "t").layers[0]
    spec = layer.quant["weight"]
    assert np.array_equal(spec.scales, q.scales) and spec.tensor_scale == q.tensor_scale
    assert np.array_equal(layer.quantized("weight"), q.dequantize())


@pytest.mark.parametrize(
    "value, message",
    [
        (-0.5, "tensor_scale must be a positive finite float32"),
        (float("nan"), "tensor_scale must be a positive finite float32"),
        ("ue8m0", "tensor_scale must be a positive finite float32"),
    ],
)
def test_nvfp4_spec_with_a_bad_tensor_scale_is_refused_naming_the_field(tmp_path, value, message):
    save_trace(_nvfp4_trace()[0], tmp_path / "t")

    def change(manifest):
        manifest["layers"][0]["quant"]["weight"]["tensor_scale"] = value

    edit_manifest(tmp_path / "t", change)
    assert_trace_error(tmp_path / "t", "l", "quant.weight", message)
