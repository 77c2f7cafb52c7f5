"""Replay's model operands and exact ideal, against AMD Quark's own ONNX runtime and exact sums.

A tiny conv + linear model is quantized here by amd-quark's ONNX quantizer with each of its
MX/BFP configs and run with Quark's onnxruntime custom-op library; the replay ideal of every
layer must equal the model's own quantized computation bit for bit.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np
import pytest

from conftest import REPO, require_module
from mxsim.errors import MxsimError
from mxsim.trace import BFPQuant, Layer, MXQuant
from mxsim.replay.lowering import lift_output
from mxsim.replay.operands import CONV_ORDERS, exact_block, ideal_gemm, layer_operands

QUARK_CONFIGS = [
    "MXINT8",
    "MXFP8E4M3",
    "MXFP8E5M2",
    "MXFP6E3M2",
    "MXFP6E2M3",
    "MXFP4E2M1",
    "MX9",
    "MX6",
    "MX4",
    "BFP16",
]
CHANNELS, FILTERS, SIZE, CLASSES = 20, 12, 6, 10


def _float_model(onnx, path, rng):
    h = onnx.helper
    tensor = onnx.TensorProto.FLOAT
    w1 = (rng.standard_normal((FILTERS, CHANNELS, 3, 3)) * 0.2).astype(np.float32)
    b1 = (rng.standard_normal(FILTERS) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((FILTERS * SIZE * SIZE, CLASSES)) * 0.05).astype(np.float32)
    b2 = (rng.standard_normal(CLASSES) * 0.1).astype(np.float32)
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("Flatten", ["r1"], ["f"]),
        h.make_node("Gemm", ["f", "w2", "b2"], ["y"], name="fc"),
    ]
    graph = h.make_graph(
        nodes,
        "tiny",
        [h.make_tensor_value_info("x", tensor, [2, CHANNELS, SIZE, SIZE])],
        [h.make_tensor_value_info("y", tensor, [2, CLASSES])],
        [
            onnx.numpy_helper.from_array(a, n)
            for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.fixture(scope="module")
def quark_models(tmp_path_factory):
    """config name -> (trace captured by mxsim, {value name: Quark runtime value}, model)."""
    onnx = require_module("onnx", "onnx")
    ort = require_module("onnxruntime", "onnx")
    require_module("quark.onnx", "oracles")
    from onnxruntime.quantization.calibrate import CalibrationDataReader
    from quark.onnx import ModelQuantizer, get_library_path
    from quark.onnx.quantization.config.config import Config
    from quark.onnx.quantization.config.custom_config import get_default_config

    from mxsim.capture.onnx import capture_onnx

    directory = tmp_path_factory.mktemp("quark")
    rng = np.random.default_rng(2026)
    _float_model(onnx, directory / "float.onnx", rng)
    x = rng.standard_normal((2, CHANNELS, SIZE, SIZE)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": x}])

        def get_next(self):
            return next(self.batches, None)

    cache = {}

    def build(name):
        if name in cache:
            return cache[name]
        path = directory / f"{name}.onnx"
        here = os.getcwd()
        os.chdir(directory)  # Quark writes a quantized_info.csv into the working directory
        try:
            ModelQuantizer(Config(global_quant_config=get_default_config(name))).quantize_model(
                str(directory / "float.onnx"), str(path), Reader()
            )
        finally:
            os.chdir(here)
        model = onnx.load(path)
        known = {o.name for o in model.graph.output}
        for node in model.graph.node:  # every intermediate value becomes an output
            model.graph.output.extend(
                onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o not in known
            )
        options = ort.SessionOptions()
        options.register_custom_ops_library(get_library_path("CPU"))
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        values = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))
        values.update({i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer})
        values["x"] = x
        cache[name] = (capture_onnx(path, {"x": x}), values, model)
        return cache[name]

    return build


def _node(model, name):
    return next(n for n in model.graph.node if n.name == name)


def _runtime_operands(model, values, layer_name):
    """The values Quark's runtime fed the node (its quantized inputs) and the node's output."""
    node = _node(model, layer_name)
    return [values[i] for i in node.input], values[node.output[0]]


def _exact(values: np.ndarray) -> list[tuple[int, int]]:
    """Each float as (integer m, exponent e) with value m * 2**e exactly."""
    mantissas, exponents = np.frexp(values.astype(np.float64))
    return [(int(m * 2**53), int(e) - 53) for m, e in zip(mantissas.ravel(), exponents.ravel())]


def _round_float32(terms: list[tuple[int, int]]) -> np.float32:
    """The exact sum of m * 2**e terms, rounded once to float32 (nearest even): integers only."""
    terms = [(m, e) for m, e in terms if m]
    if not terms:
        return np.float32(0.0)
    low = min(e for _, e in terms)
    total = sum(m << (e - low) for m, e in terms)
    if total == 0:
        return np.float32(0.0)
    negative, magnitude = total < 0, abs(total)
    top = magnitude.bit_length() - 1 + low  # exponent of the leading bit
    lsb = max(top - 23, -149)
    shift = lsb - low
    if shift > 0:
        quotient, remainder = divmod(magnitude, 1 << shift)
        half = 1 << (shift - 1)
        if remainder > half or (remainder == half and quotient & 1):
            quotient += 1
        magnitude, low = quotient, lsb
    value = np.float32(math.ldexp(magnitude, low))  # at most 24 significant bits: exact
    return -value if negative else value


def _exact_conv(x, w, b):
    """Conv (stride 1, padding 1) of float32 arrays: exact sums, one rounding to float32."""
    n, c, height, width = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.empty((n, w.shape[0], height, width), dtype=np.float32)
    w_terms = [_exact(w[o]) for o in range(w.shape[0])]
    b_terms = _exact(b)
    for i in range(n):
        for y in range(height):
            for z in range(width):
                patch = _exact(padded[i, :, y : y + 3, z : z + 3])
                for o in range(w.shape[0]):
                    products = [(ma * mb, ea + eb) for (ma, ea), (mb, eb) in zip(patch, w_terms[o])]
                    out[i, o, y, z] = _round_float32(products + [b_terms[o]])
    return out


def _exact_gemm(a, b, bias):
    """a @ b + bias of float32 arrays: exact sums, one rounding to float32."""
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.float32)
    columns = [_exact(b[:, j]) for j in range(b.shape[1])]
    bias_terms = _exact(bias)
    for i in range(a.shape[0]):
        row = _exact(a[i])
        for j in range(b.shape[1]):
            products = [(ma * mb, ea + eb) for (ma, ea), (mb, eb) in zip(row, columns[j])]
            out[i, j] = _round_float32(products + [bias_terms[j]])
    return out


def _ideal(layer):
    gemm, exact = ideal_gemm(layer_operands(layer))
    assert exact
    return lift_output(layer, gemm, None)


def _gemm_values(operand):
    """The lowered operand's exact values (G, R, K)."""
    fmt = operand.element_format
    values = sum(fmt.decode(piece).astype(np.float64) for piece in operand.pieces)
    return np.ldexp(values, operand.scales.astype(np.int32) - 127)


@pytest.mark.parametrize("name", QUARK_CONFIGS)
def test_replay_operands_are_quarks_runtime_operands(quark_models, name):
    # The GEMM operands replay builds, read back at the centre filter tap (conv) or in K order
    # (linear), are the tensors Quark's runtime fed each node, bit for bit; the per-tap padding
    # is zeros; the bias is the runtime's quantized bias.
    trace, values, model = quark_models(name)
    conv, fc = trace.layer("conv"), trace.layer("fc")
    (xq, wq, bq), _ = _runtime_operands(model, values, "conv")
    ops = layer_operands(conv)
    a, b = _gemm_values(ops.a), _gemm_values(ops.b)
    padded = 24 if name == "BFP16" else 32  # 20 channels padded to whole blocks of 8, 16 or 32
    assert a.shape == (1, 2 * SIZE * SIZE, 9 * padded) and b.shape == (1, FILTERS, 9 * padded)
    taps_a = a[0].reshape(2, SIZE, SIZE, 9, padded)
    np.testing.assert_array_equal(taps_a[..., 4, :CHANNELS], xq.transpose(0, 2, 3, 1))
    assert not taps_a[..., CHANNELS:].any()
    taps_b = b[0].reshape(FILTERS, 9, padded)
    np.testing.assert_array_equal(
        taps_b[..., :CHANNELS], wq.reshape(FILTERS, CHANNELS, 9).transpose(0, 2, 1)
    )
    np.testing.assert_array_equal(ops.bias, bq)
    (fq, w2q, b2q), _ = _runtime_operands(model, values, "fc")
    ops = layer_operands(fc)
    k = FILTERS * SIZE * SIZE
    np.testing.assert_array_equal(_gemm_values(ops.a)[0][:, :k], fq)
    np.testing.assert_array_equal(_gemm_values(ops.b)[0][:, :k], w2q.T)
    np.testing.assert_array_equal(ops.bias, b2q)


@pytest.mark.parametrize("name", QUARK_CONFIGS)
def test_replay_ideal_is_quarks_own_quantized_computation(quark_models, name, record_property):
    # Every layer's ideal equals the exact sum of the runtime's own quantized operands and bias,
    # rounded once to float32 (computed here with Python integers), bit for bit. The runtime's
    # float32 Conv/Gemm output itself equals it wherever its float32 accumulation did not round;
    # the rest must lie within that accumulation's error bound (K * 2^-24 * sum |terms|).
    trace, values, model = quark_models(name)
    for layer_name, exact_fn in (("conv", _exact_conv), ("fc", _exact_gemm)):
        (aq, wq, bq), runtime_out = _runtime_operands(model, values, layer_name)
        ideal = _ideal(trace.layer(layer_name)).astype(np.float32)
        exact = exact_fn(aq, wq, bq)
        np.testing.assert_array_equal(ideal.view(np.uint32), exact.view(np.uint32))
        differ = ideal != runtime_out
        record_property(f"{layer_name}_outputs", int(ideal.size))
        record_property(f"{layer_name}_runtime_float32_rounded", int(differ.sum()))
        if differ.any():
            if layer_name == "conv":
                magnitude = _exact_conv_abs(aq, wq, bq)
            else:
                magnitude = np.abs(aq.astype(np.float64)) @ np.abs(wq.astype(np.float64)) + np.abs(
                    bq
                )
            k = aq[0].size if layer_name == "fc" else 9 * CHANNELS
            bound = (k + 2) * 2.0**-24 * magnitude
            assert (np.abs(runtime_out.astype(np.float64) - ideal)[differ] <= bound[differ]).all()
            assert differ.mean() < 0.01


def _exact_conv_abs(x, w, b):
    from mxsim.trace.conv import Conv2dGeometry, conv2d_direct

    geometry = Conv2dGeometry.from_shapes(x.shape, w.shape, 1, 1)
    return conv2d_direct(
        np.abs(x.astype(np.float64)),
        np.abs(w.astype(np.float64)),
        np.abs(b.astype(np.float64)),
        geometry,
    )


@pytest.mark.parametrize("name", QUARK_CONFIGS)
def test_replay_ideal_is_exact_on_the_recorded_quantized_operands(quark_models, name):
    # Independent of how mxsim's quantizers compare with Quark's: the ideal of the captured
    # layers equals the exact, once-rounded sum over the quantized operands the capture recorded.
    trace, _, _ = quark_models(name)
    conv, fc = trace.layer("conv"), trace.layer("fc")
    expected = _exact_conv(
        conv.quantized("input"), conv.quantized("weight"), conv.quantized("bias")
    )
    np.testing.assert_array_equal(_ideal(conv).astype(np.float32), expected)
    expected = _exact_gemm(fc.quantized("input"), fc.quantized("weight").T, fc.quantized("bias"))
    np.testing.assert_array_equal(_ideal(fc).astype(np.float32), expected)


# ----------------------------------------------------------------------------- layouts


def _conv_layer(rng, channels, groups=1, quant=None, kernel=3):
    x = rng.standard_normal((1, channels, 4, 4)).astype(np.float32)
    w = rng.standard_normal((6, channels // groups, kernel, kernel)).astype(np.float32)
    attrs = {"stride": [1, 1], "padding": [[1, 1], [1, 1]], "dilation": [1, 1], "groups": groups}
    probe = Layer(
        "conv",
        "conv2d",
        {"input": x, "weight": w, "output": np.zeros(1, np.float32)},
        attrs,
        {},
        {},
    )
    out = np.zeros(probe.conv_geometry().output_shape, np.float32)
    return Layer("conv", "conv2d", {"input": x, "weight": w, "output": out}, attrs, quant or {}, {})


def test_conv_blocks_are_channel_groups_per_tap():
    rng = np.random.default_rng(5)
    spec = MXQuant("fp8_e4m3", axis=1, block_size=8)
    layer = _conv_layer(rng, 12, quant={"input": spec, "weight": spec})
    ops = layer_operands(layer)
    assert ops.a.k == 9 * 16 and ops.a.granule == 8 and "per tap" in ops.a.layout
    # a GEMM operand block (8 consecutive K columns) holds one pixel's channels 0-7 or 8-11
    # of one tap, with the scale the model's quantizer gave that channel group
    fake = spec.fake_quantize(layer.input)
    a = _gemm_values(ops.a)[0].reshape(4, 4, 9, 16)
    np.testing.assert_array_equal(a[..., 4, :12], fake[0].transpose(1, 2, 0))
    assert not a[..., 12:].any()
    # (C, kh, kw) order: blocks strided over K, one scale per element
    strided = layer_operands(layer, "c_kh_kw")
    assert strided.a.granule == 1 and "strided" in strided.a.layout
    with pytest.raises(MxsimError, match="conv order"):
        layer_operands(layer, "nchw")
    assert CONV_ORDERS == ("kh_kw_c", "c_kh_kw")


def test_grouped_conv_blocks_straddling_groups_keep_one_scale_per_element():
    rng = np.random.default_rng(6)
    spec = BFPQuant("MX6", axis=1)
    layer = _conv_layer(rng, 12, groups=3, quant={"input": spec, "weight": None})
    ops = layer_operands(layer)
    assert ops.a.granule == 1 and "straddle" in ops.a.layout and ops.a.k == 9 * 4
    assert exact_block(ops.a, ops.b) == 1


def test_float_operands_are_split_exactly_into_bf16_pieces():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 40)) * 2.0 ** rng.integers(-20, 20, (3, 40))).astype(np.float32)
    w = rng.standard_normal((5, 40)).astype(np.float32)
    layer = Layer(
        "fc",
        "linear",
        {"input": x, "weight": w, "output": np.zeros((3, 5), np.float32)},
        {},
        {"input": None, "weight": MXQuant("int8", axis=1, block_size=32)},
        {},
    )
    ops = layer_operands(layer)
    assert len(ops.a.pieces) == 3 and ops.a.element_format.name == "bf16" and ops.a.exact
    np.testing.assert_array_equal(_gemm_values(ops.a)[0][:, :40], x)
    wq = MXQuant("int8", axis=1, block_size=32).fake_quantize(w)
    gemm, exact = ideal_gemm(ops)
    assert exact
    np.testing.assert_array_equal(
        gemm[0].astype(np.float32), _exact_gemm(x, wq.T.astype(np.float32), np.zeros(5))
    )


def test_float64_operands_that_are_not_float32_make_the_ideal_inexact():
    x = np.full((2, 4), 1 + 2.0**-40)
    layer = Layer(
        "fc",
        "linear",
        {"input": x, "weight": np.ones((3, 4)), "output": np.zeros((2, 3))},
        {},
        {},
        {},
    )
    _, exact = ideal_gemm(layer_operands(layer))
    assert not exact


def _fp32_nearest_even(q: Fraction) -> float:
    """The twin of one round-to-nearest-even into fp32 (subnormals, overflow to Inf) of an
    exact value, from Fraction arithmetic alone."""
    if q == 0:
        return 0.0
    magnitude = abs(q)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    while Fraction(2) ** exponent > magnitude:
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= magnitude:
        exponent += 1
    ulp = Fraction(2) ** (max(exponent, -126) - 23)
    rounded = round(magnitude / ulp) * ulp  # Fraction's round: half to even
    value = math.inf if rounded >= Fraction(2) ** 128 else float(rounded)
    return value if q > 0 else -value


def _wide_values(rng, shape, fmt: str, spread: int, corners: bool) -> np.ndarray:
    """Values of ``fmt`` (fp16, bf16) times powers of two within ``spread`` binades; with
    ``corners`` a few zeros, -0s and fp16 subnormals among them."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
    if fmt == "fp16":
        values = np.clip(x, -6e4, 6e4).astype(np.float16).astype(np.float64)
    else:  # bf16: float32 with the low 16 bits cleared
        values = (x.astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
        values = values.astype(np.float64)
    if corners:
        values[rng.random(shape) < 0.05] = 2.0**-24 * rng.integers(1, 1024)
        values[rng.random(shape) < 0.05] = 0.0
        values[rng.random(shape) < 0.05] = -0.0
    return values


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("spread", [0, 6, 30])
@pytest.mark.parametrize("corners", [False, True])
@pytest.mark.parametrize("with_c", [False, True])
def test_exact_sums_to_fp32_equal_the_fraction_twin(fmt, spread, corners, with_c):
    """Where it answers, float64 BLAS's sums rounded to fp32 are the exact sums rounded once
    (the Fraction twin), bit for bit (declining, None, is always allowed: the exact unit
    computes those); on operands of a few binades without corners it answers."""
    from mxsim.replay.operands import exact_sums_to_fp32

    answered = 0
    for seed in range(8):
        rng = np.random.default_rng([seed, spread, corners, with_c])
        m, k, n = rng.integers(1, 9), rng.integers(1, 70), rng.integers(1, 9)
        row_scales = np.exp2(rng.integers(-20, 21, (m, 1)))  # rows of different block scales
        a = _wide_values(rng, (m, k), fmt, spread, corners) * row_scales
        b = _wide_values(rng, (k, n), fmt, spread, corners)
        c = None
        if with_c:
            size = 2.0 ** rng.integers(-30, 30) if corners else row_scales  # (as the sums)
            c = (rng.standard_normal((m, n)) * size).astype(np.float32)
            c[rng.random((m, n)) < (0.2 if corners else 0.0)] = -0.0
        got = exact_sums_to_fp32(a, b, c)
        if got is None:
            continue
        answered += 1
        exact = [
            [
                sum((Fraction(a[i, j]) * Fraction(b[j, p]) for j in range(k)), Fraction(0))
                + (Fraction(float(c[i, p])) if c is not None else 0)
                for p in range(n)
            ]
            for i in range(m)
        ]
        want = np.array([[_fp32_nearest_even(q) for q in row] for row in exact])
        assert got.dtype == np.float64 and got.shape == (m, n)
        np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))
    if spread == 0 and not corners:
        assert answered == 8


def test_exact_sums_to_fp32_decline_what_they_cannot_show():
    from mxsim.replay.operands import exact_sums_to_fp32

    a, b = np.array([[1.5, 2.0**-20]]), np.array([[3.0], [1.0]])
    np.testing.assert_array_equal(exact_sums_to_fp32(a, b, None), [[4.5 + 2.0**-20]])
    assert exact_sums_to_fp32(np.array([[1.0, 2.0**-60]]), b, None) is None  # 61 bits apart
    assert exact_sums_to_fp32(np.array([[1.0, -1.0 / 3]]), b, None) is None  # 1/3: 54 bits
    assert exact_sums_to_fp32(np.array([[1.0, -3.0]]), b, None) is None  # 0: the unit's sign
    assert exact_sums_to_fp32(np.array([[2.0**127, 2.0**127]]), b, None) is None  # overflow
    assert exact_sums_to_fp32(np.array([[np.nan, 1.0]]), b, None) is None
    # 54 bits: float64 drops 2^-53 to a tie, which fp32 then rounds to even, 1.0; the exact
    # sum lies above the tie and rounds to 1 + 2^-23
    tie = exact_sums_to_fp32(np.array([[1.0, 2.0**-24, 2.0**-53]]), np.ones((3, 1)), None)
    assert tie is None or tie[0, 0] == 1 + 2.0**-23
    c = np.array([[2.0**-30]], dtype=np.float32)  # c finer than the products: still exact
    np.testing.assert_array_equal(exact_sums_to_fp32(a, b, c), [[np.float32(4.5 + 2.0**-20)]])


@pytest.mark.parametrize("unit", ["a100", "h100-fp8", "kulisch"])
def test_the_ideal_through_float64_equals_the_exact_unit(monkeypatch, unit):
    """Every digits-cnn layer's ideal of the operands a unit got: the float64 route where it
    answers, the exact unit's kernel where it declines, equal bit for bit to the exact
    unit's kernel alone."""
    from mxsim.datapath import load_hwconfig
    from mxsim.replay import operands
    from mxsim.replay.layer import run_layer
    from mxsim.trace import load_trace

    hw = load_hwconfig(REPO / "hwconfigs" / f"{unit}.yaml")
    trace = load_trace(REPO / "traces" / "digits-cnn")
    real, answers = operands.exact_sums_to_fp32, []
    monkeypatch.setattr(
        operands,
        "exact_sums_to_fp32",
        lambda *args: answers.append(real(*args)) or answers[-1],
    )
    fast = [run_layer(layer, hw).gemm_ideal for layer in trace.layers]
    assert any(answer is not None for answer in answers)
    monkeypatch.setattr(operands, "exact_sums_to_fp32", lambda *args: None)
    for got, layer in zip(fast, trace.layers, strict=True):
        want = run_layer(layer, hw).gemm_ideal
        np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))
    # past the memory bound for float64 copies, the exact unit alone
    monkeypatch.setattr(operands, "FLOAT64_IDEAL_BYTES", 0)
    monkeypatch.setattr(operands, "exact_sums_to_fp32", lambda *args: pytest.fail("called"))
    np.testing.assert_array_equal(run_layer(trace.layers[-1], hw).gemm_ideal, fast[-1])
