"""mxsim.evaluate.onnx and ``mxsim evaluate onnx``: an ONNX classifier's top-1 / top-5 in float,
in its own runtime (onnxruntime with Quark's custom ops) and with units in the loop."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from mxsim.cli import main
from mxsim.errors import MxsimError

from conftest import (
    REPO,
    import_or_skip,
    make_onnx_model,
    onnx_reference_values,
    without_compile_notice,
)

IMAGES = REPO / "tests" / "data" / "tiny-images" / "images"
OCP = str(REPO / "hwconfigs" / "ocp-exact.yaml")
CROP = 16  # the tests' images are 20..28 pixels a side; 16 keeps the runs on the unit short


@pytest.fixture(scope="module")
def pil():
    return import_or_skip("PIL.Image", "examples")


@pytest.fixture(scope="module")
def classifier(torch, onnx, pil, tmp_path_factory):
    """(float .onnx, its Quark MXFP8 E4M3 quantization, the images (N, 3, 16, 16), their
    labels): a small CNN trained for 15 Adam steps on the tiny image set (not to convergence,
    so that some images are misclassified), exported, then quantized by Quark's ONNX quantizer."""
    import_or_skip("quark.onnx", "oracles")
    from onnxruntime.quantization import CalibrationDataReader
    from quark.onnx import ModelQuantizer
    from quark.onnx.quantization.config.config import Config
    from quark.onnx.quantization.config.custom_config import get_default_config

    from mxsim.evaluate.onnx import read_image_folder

    data = read_image_folder(IMAGES, resize=CROP, crop=CROP)
    x, labels = data.batch(0, data.count), data.labels
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 8),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # threads only contend at this size
    try:
        for _ in range(15):
            optimizer.zero_grad()
            nn.functional.cross_entropy(
                model(torch.from_numpy(x)), torch.from_numpy(labels)
            ).backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    folder = tmp_path_factory.mktemp("classifier")
    float_path, quark_path = folder / "float.onnx", folder / "mxfp8.onnx"
    torch.onnx.export(
        model.eval(),
        (torch.from_numpy(x[:2]),),
        str(float_path),
        input_names=["images"],
        output_names=["logits"],
        dynamic_axes={"images": {0: "n"}, "logits": {0: "n"}},
        dynamo=False,
        opset_version=17,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"images": x[::2]}])

        def get_next(self):
            return next(self.batches, None)

    with contextlib.chdir(folder):  # the quantizer writes a report into the working directory
        ModelQuantizer(Config(global_quant_config=get_default_config("MXFP8E4M3"))).quantize_model(
            str(float_path), str(quark_path), Reader()
        )
    return float_path, quark_path, x, labels


def hits_by_rank(logits: np.ndarray, labels: np.ndarray, k: int) -> int:
    """Images whose label ranks among the k best: fewer than k logits beat it (a larger logit,
    or an equal one of a lower class index)."""
    count = 0
    for row, label in zip(np.asarray(logits, np.float64), labels):
        beaten = np.sum(row > row[label]) + np.sum(row[:label] == row[label])
        count += int(beaten < k)
    return count


def test_top_k_hits_count_ranks_with_ties_toward_the_lower_class():
    from mxsim.evaluate.onnx import top_k_hits

    rng = np.random.default_rng(2)
    logits = rng.integers(0, 4, size=(500, 7)).astype(np.float32)  # many ties
    labels = rng.integers(0, 7, size=500)
    for k in (1, 3, 5, 7, 9):
        assert int(top_k_hits(logits, labels, k).sum()) == hits_by_rank(logits, labels, k), k


def test_preprocessing_is_resize_centre_crop_and_imagenet_normalisation(pil):
    """A 24-pixel-high image resized to 24 (Pillow leaves it as it is) then cropped to 16: the
    centre pixels, over 255, normalised; a wider image's resize keeps its aspect ratio."""
    from mxsim.evaluate.onnx import preprocess_image

    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, size=(24, 30, 3), dtype=np.uint8)
    got = preprocess_image(pil.fromarray(pixels), resize=24, crop=16)
    centre = pixels[4:20, 7:23].astype(np.float64) / 255  # top (24-16)/2 = 4, left round(14/2) = 7
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    expected = ((centre - mean) / std).transpose(2, 0, 1)
    assert got.dtype == np.float32 and got.shape == (3, 16, 16)
    assert np.abs(got - expected).max() < 1e-5
    resized = np.asarray(
        pil.fromarray(pixels).resize((15, 12), pil.BILINEAR)
    )  # width int(12 * 30 / 24)
    got = preprocess_image(pil.fromarray(pixels), resize=12, crop=12)
    expected = ((resized[:, 2:14].astype(np.float64) / 255 - mean) / std).transpose(
        2, 0, 1
    )  # left round(1.5)
    assert np.abs(got - expected).max() < 1e-5
    gray = preprocess_image(
        pil.fromarray(pixels[..., 0]), resize=24, crop=16
    )  # one channel, made RGB
    assert np.allclose(
        gray * std[:, None, None] + mean[:, None, None], centre[..., 0][None], atol=1e-6
    )


def test_the_image_folder_reads_classes_in_sorted_order(pil):
    from mxsim.evaluate.onnx import read_image_folder

    data = read_image_folder(IMAGES, resize=CROP, crop=CROP)
    assert data.classes == sorted(p.name for p in IMAGES.iterdir()) and len(data.classes) == 8
    assert data.count == 40 and list(np.bincount(data.labels)) == [5] * 8
    assert data.batch(5, 7).shape == (2, 3, CROP, CROP) and data.labels[5] == 1


@pytest.fixture(scope="module")
def evaluated(classifier, tmp_path_factory):
    """``mxsim evaluate onnx`` on the Quark model, the float model, the image folder and the
    exact OCP unit with fp8_e4m3 operands: (status, stdout, stderr, the JSON report)."""
    float_path, quark_path, _, _ = classifier
    out = tmp_path_factory.mktemp("report") / "report.json"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(
            [
                "evaluate",
                "onnx",
                str(quark_path),
                "--data",
                str(IMAGES),
                "--hw",
                OCP,
                "--format",
                "fp8_e4m3",
                "--float-model",
                str(float_path),
                "--resize",
                str(CROP),
                "--crop",
                str(CROP),
                "--batch-size",
                "16",
                "--json",
                str(out),
            ]
        )
    return status, stdout.getvalue(), stderr.getvalue(), json.loads(out.read_text())


def test_top1_top5_of_float_runtime_and_an_exact_unit(classifier, evaluated, onnx, ort):
    """The float row is onnxruntime on the float model, the runtime row onnxruntime with
    Quark's own custom-op library on the quantized one (top-k counted here by rank); the
    exact OCP unit with fp8_e4m3 operands in the loop predicts what Quark's runtime predicts."""
    float_path, quark_path, x, labels = classifier
    status, out, err, report = evaluated
    assert status == 0, err
    float_row, runtime_row, unit_row = report["rows"]
    float_logits = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"]).run(
        None, {"images": x}
    )[0]
    quark_logits = onnx_reference_values(
        onnx, ort, onnx.load(str(quark_path)), ["logits"], {"images": x}, quark_ops=True
    )["logits"]
    for row, logits in ((float_row, float_logits), (runtime_row, quark_logits)):
        for k in (1, 5):
            assert row[f"top{k}"] == hits_by_rank(logits, labels, k) / 40, (row["name"], k)
    assert 0.5 < float_row["top1"] < 1  # not trained to convergence: the figures can move
    assert unit_row["unit"] == "ocp-exact" and unit_row["format"] == "fp8_e4m3"
    assert unit_row["runtime_top1_agreement"] == 1.0
    assert unit_row["top1"] == runtime_row["top1"] and unit_row["top5"] == runtime_row["top5"]
    # the unit re-quantizes Quark's MXFP8 values in its own K blocks and accumulates in its own way
    assert unit_row["runtime_logit_max_abs_diff"] < 0.05 * np.abs(quark_logits).max()
    assert float_row["model_size"] == onnx.load(str(float_path)).ByteSize()
    table = out.splitlines()
    assert table[1].split() == [
        "DataType",
        "/",
        "Config",
        "Model",
        "Size",
        "Top1",
        "Top5",
        "Top1",
        "=",
        "runtime",
        "seconds",
    ]
    assert (
        table[2].startswith("float (float.onnx)") and f"{100 * float_row['top1']:.3f} %" in table[2]
    )
    assert table[4].startswith("ocp-exact fp8_e4m3") and "100.000 %" in table[4]
    assert (
        "mxsim evaluate onnx: batch 3/3, 40/40 images" in err
    )  # progress: stderr is not a terminal


def test_npz_data_and_a_fixed_batch_axis(classifier, onnx, ort, tmp_path):
    """12 of the images from an npz, run by a copy of the quantized model whose batch axis is
    fixed to 5 (the last batch of 2 padded to 5, also when --batch-size is 5): the runtime row is Quark's runtime on the
    12 images, and the exact unit still predicts what it predicts."""
    from mxsim.evaluate.onnx import evaluate_onnx

    _, quark_path, x, labels = classifier
    x, labels = x[::3][:12], labels[::3][:12]  # 7 of the 8 classes
    data = tmp_path / "images.npz"
    np.savez(data, inputs=x, labels=labels.astype(np.uint8))
    fixed = onnx.load(str(quark_path))
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 5
    onnx.save(fixed, str(tmp_path / "fixed.onnx"))
    report = evaluate_onnx(tmp_path / "fixed.onnx", data, OCP, "fp8_e4m3", batch_size=5)
    runtime_row, unit_row = report["rows"]
    quark_logits = onnx_reference_values(
        onnx, ort, onnx.load(str(quark_path)), ["logits"], {"images": x}, quark_ops=True
    )["logits"]
    assert report["images"] == 12 and report["classes"] is None
    for k in (1, 5):
        assert runtime_row[f"top{k}"] == hits_by_rank(quark_logits, labels, k) / 12
    assert unit_row["runtime_top1_agreement"] == 1.0 and unit_row["top1"] == runtime_row["top1"]


# --- hostile inputs: a tiny Gemm classifier on 3 x 4 x 4 "images", no Quark needed -----------------


@pytest.fixture
def tiny(onnx, tmp_path):
    """(model path, npz path, folder path) of a Flatten + Gemm classifier with 5 classes."""
    rng = np.random.default_rng(1)
    nodes = [
        onnx.helper.make_node("Flatten", ["x"], ["f"]),
        onnx.helper.make_node("Gemm", ["f", "w"], ["y"]),
    ]
    model = make_onnx_model(
        onnx,
        nodes,
        [("x", ["n", 3, 4, 4])],
        ["y"],
        [("w", rng.standard_normal((48, 5)).astype(np.float32))],
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    data = tmp_path / "data.npz"
    np.savez(
        data, inputs=rng.standard_normal((6, 3, 4, 4)).astype(np.float32), labels=np.arange(6) % 5
    )
    return path, data


def run_cli(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, without_compile_notice(captured.err)


def test_tiny_classifier_runs_from_an_npz(tiny, capsys, tmp_path):
    path, data = tiny
    status, out, _ = run_cli(
        capsys, "evaluate", "onnx", str(path), "--data", str(data), "--hw", OCP, "--quiet"
    )
    assert status == 0 and "ocp-exact fp8_e4m3" in out  # the unit's first format by default
    assert "runtime (tiny.onnx)" in out and "float" not in out


def _write_npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


HOSTILE = [
    (lambda t, d: ["{tmp}/absent.onnx", "--data", d], "no such model file"),
    (lambda t, d: ["{tmp}/junk.onnx", "--data", d], "not a readable ONNX model"),
    (lambda t, d: [t, "--data", "{tmp}/empty"], "no class folders"),
    (lambda t, d: [t, "--data", "{tmp}/hollow"], "no images in its 2 class folders"),
    (lambda t, d: [t, "--data", "{tmp}/nonimage"], "notes.txt: not an image Pillow reads"),
    (lambda t, d: [t, "--data", "{tmp}/stray"], "'README' is not a class folder"),
    (lambda t, d: [t, "--data", "{tmp}/keys.npz"], "expected exactly 'inputs'"),
    (lambda t, d: [t, "--data", "{tmp}/float64.npz"], "'inputs' must be float32"),
    (lambda t, d: [t, "--data", "{tmp}/shape.npz"], "'labels' must be integers of shape (6,)"),
    (lambda t, d: [t, "--data", "{tmp}/floatlabels.npz"], "'labels' must be integers"),
    (lambda t, d: [t, "--data", "{tmp}/negative.npz"], "'labels' holds -1"),
    (lambda t, d: [t, "--data", "{tmp}/range.npz"], "label 5 is out of range for the 5 classes"),
    (lambda t, d: [t, "--data", "{tmp}/wrongsize.npz"], "axis 2 is 4, the data's is 5"),
    (lambda t, d: [t, "--data", "{tmp}/pickle.npz"], "pickled"),
    (lambda t, d: [t, "--data", "{tmp}/garbled.npz"], "not a readable NPZ"),
    (lambda t, d: ["{tmp}/conv.onnx", "--data", d], "has shape (6, 2, 2, 2) for 6 images"),
    (lambda t, d: ["{tmp}/twoinputs.onnx", "--data", d], "2 graph inputs"),
    (
        lambda t, d: [t, "--data", d, "--float-model", "{tmp}/junk.onnx"],
        "not a readable ONNX model",
    ),
    (lambda t, d: [t, "--data", d, "--hw", "{tmp}/nohw.yaml"], "nohw.yaml"),
    (lambda t, d: [t, "--data", d, "--format", "fp8_e9m9"], "fp8_e9m9"),
    (
        lambda t, d: [
            t,
            "--data",
            d,
            "--hw",
            str(REPO / "hwconfigs/h100-fp8.yaml"),
            "--format",
            "fp4_e2m1",
        ],
        "does not take fp4_e2m1",
    ),
    (
        lambda t, d: [t, "--data", d, "--hw", "{tmp}/disjoint.yaml"],
        "takes no format for both operands; give --format",
    ),
    (
        lambda t, d: [t, "--data", d, "--json", "{tmp}/nodir/out.json"],
        "expected a file in an existing directory",
    ),
    (lambda t, d: [t, "--data", d, "--json", "{tmp}"], "expected a file in an existing directory"),
    (lambda t, d: [t, "--data", d, "--batch-size", "0"], "batch_size"),
    (lambda t, d: [t, "--data", "{tmp}/nonimage", "--crop", "300"], "crop"),
]


@pytest.mark.parametrize("argv, message", HOSTILE)
def test_bad_input_is_one_line_with_status_2(tiny, onnx, pil, capsys, tmp_path, argv, message):
    path, data = tiny
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x07garbage")
    ocp = (REPO / "hwconfigs" / "ocp-exact.yaml").read_text().splitlines()
    (tmp_path / "disjoint.yaml").write_text(
        "\n".join(
            "  a_formats: [fp8_e4m3]"
            if line.startswith("  a_formats:")
            else "  b_formats: [int8]"
            if line.startswith("  b_formats:")
            else line
            for line in ocp
        )
    )
    (tmp_path / "empty").mkdir()
    for name in ("a", "b"):
        (tmp_path / "hollow" / name).mkdir(parents=True)
    (tmp_path / "nonimage" / "cat").mkdir(parents=True)
    pil.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "nonimage" / "cat" / "a.png")
    (tmp_path / "nonimage" / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / "stray" / "cat").mkdir(parents=True)
    (tmp_path / "stray" / "README").write_text("hello")
    inputs = np.zeros((6, 3, 4, 4), np.float32)
    _write_npz(tmp_path / "keys.npz", images=inputs, labels=np.zeros(6, np.int64))
    _write_npz(
        tmp_path / "float64.npz", inputs=inputs.astype(np.float64), labels=np.zeros(6, np.int64)
    )
    _write_npz(tmp_path / "shape.npz", inputs=inputs, labels=np.zeros((6, 1), np.int64))
    _write_npz(tmp_path / "floatlabels.npz", inputs=inputs, labels=np.zeros(6, np.float32))
    _write_npz(tmp_path / "negative.npz", inputs=inputs, labels=-np.ones(6, np.int64))
    _write_npz(tmp_path / "range.npz", inputs=inputs, labels=np.full(6, 5, np.int64))
    _write_npz(
        tmp_path / "wrongsize.npz",
        inputs=np.zeros((6, 3, 5, 5), np.float32),
        labels=np.zeros(6, np.int64),
    )
    _write_npz(
        tmp_path / "pickle.npz",
        inputs=np.array([None] * 6, dtype=object),
        labels=np.zeros(6, np.int64),
    )
    (tmp_path / "garbled.npz").write_bytes(b"PK\x03\x04 truncated")
    h = onnx.helper
    conv = make_onnx_model(
        onnx,
        [h.make_node("Conv", ["x", "w"], ["y"])],
        [("x", ["n", 3, 4, 4])],
        ["y"],
        [("w", np.ones((2, 3, 3, 3), np.float32))],
    )
    onnx.save(conv, str(tmp_path / "conv.onnx"))
    two = make_onnx_model(
        onnx, [h.make_node("Add", ["x", "z"], ["y"])], [("x", [2, 5]), ("z", [2, 5])], ["y"]
    )
    onnx.save(two, str(tmp_path / "twoinputs.onnx"))
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv(str(path), str(data))]
    if "--hw" not in args:
        args += ["--hw", OCP]
    status, out, err = run_cli(capsys, "evaluate", "onnx", *args, "--quiet")
    assert status == 2, (out, err)
    assert err.startswith("mxsim evaluate: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and not out


def test_a_failing_row_keeps_its_error_and_the_others_run(tiny, capsys, tmp_path, monkeypatch):
    """A unit row that fails mid-run is reported with its error; the table and JSON are written; status 1."""
    import mxsim.evaluate.onnx as module

    def failing(*args, **kwargs):
        raise MxsimError("layer 'gemm' on unit: boom")

    path, data = tiny
    monkeypatch.setattr(module, "run_onnx_on_unit", failing)
    out = tmp_path / "r.json"
    status, printed, _ = run_cli(
        capsys,
        "evaluate",
        "onnx",
        str(path),
        "--data",
        str(data),
        "--hw",
        OCP,
        "--json",
        str(out),
        "--quiet",
    )
    report = json.loads(out.read_text())
    assert status == 1 and report["rows"][1]["error"] == "layer 'gemm' on unit: boom"
    assert report["rows"][0]["top1"] is not None and "error: layer 'gemm' on unit: boom" in printed
