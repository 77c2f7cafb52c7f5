"""AMD Quark run live as an oracle: its ONNX Runtime custom ops and its torch fake quantizer.

* ``BFPQuantizeDequantize`` (MX4/MX6/MX9 = ``to_bfp_prime``, BFP16 = ``to_bfp``) and
  ``MXQuantizeDequantize`` (every MX element type), domain ``com.amd.quark``, run by Quark's
  CPU custom-op library in onnxruntime, against ``mxsim.quantize_bfp(kernel="cpu")`` and
  ``mxsim.fake_quantize(profile="quark-onnx")``.
* ``fake_quantize_mx`` (scale modes even / floor / ceil) against the ``quark`` /
  ``quark-floor`` / ``quark-ceil`` profiles.

Every comparison is bit for bit on float32 outputs (NaN equals NaN), over one model run per
configuration on corner rows (ties, carries, largest mantissas, zeros, subnormals, Inf/NaN)
plus realistic rows (``oracle_inputs`` in conftest). Needs the ``oracles`` extra; skipped
without it, failed instead when the CI environment variable is set. Quark compiles its
custom-op libraries on first use (a minute or more, cached per user).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import bit_mismatches, import_or_skip, oracle_inputs

import mxsim
from mxsim.quantize.bfp import BFP_SPECS, BFPSpec

QUARK_DOMAIN = "com.amd.quark"
MX_ELEMENTS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8"]
# MXQuantizeDequantize's rounding_mode (MXINT8 only) -> mxsim options. Quark's C++ rounding
# keeps a negative zero (std::round) except its half-even py3_round (the profile's default).
INT8_ROUNDING = {
    0: dict(element_rounding="nearest_away", zero_signs=(("int8", "input"),)),
    1: dict(element_rounding="nearest_toward_positive", zero_signs=(("int8", "input"),)),
    2: {},
}


@pytest.fixture(scope="module")
def quark_runtime():
    """run(op, attributes, x) -> Quark's output for x (float32), on the CPU execution provider."""
    onnx = import_or_skip("onnx", "oracles")
    ort = import_or_skip("onnxruntime", "oracles")
    quark_onnx = import_or_skip("quark.onnx", "oracles")
    library = quark_onnx.get_library_path("CPU")
    helper = onnx.helper

    def run(op: str, attributes: dict, x: np.ndarray) -> np.ndarray:
        node = helper.make_node(op, ["x"], ["y"], domain=QUARK_DOMAIN, **attributes)
        graph = helper.make_graph(
            [node],
            "oracle",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x.shape))],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(QUARK_DOMAIN, 1)]
        )
        options = ort.SessionOptions()
        options.register_custom_ops_library(library)
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        (y,) = session.run(None, {"x": x})
        assert y.dtype == np.float32 and y.shape == x.shape
        return y

    return run


def bfp_attributes(spec: BFPSpec, axis: int) -> dict:
    return dict(
        bfp_method=spec.method,
        axis=axis,
        bit_width=spec.bit_width,
        block_size=spec.block_size,
        sub_block_size=spec.sub_block_size,
        sub_block_shift_bits=spec.sub_block_shift_bits,
        rounding_mode=spec.rounding_mode,
    )


def bfp_corner_counts(x: np.ndarray, spec: BFPSpec) -> dict[str, int]:
    """How many elements of x (2-D, blocks along axis 1, no padding) sit on each rounding
    corner of the CPU kernel's M = round(|x| / 2^(E - 127 - d + 1 - m)): coverage only."""
    bits = x.reshape(-1, spec.block_size).view(np.uint32).astype(np.int64)
    field = (bits >> 23) & 0xFF
    m = spec.mantissa_bits
    shared = field.max(axis=1, keepdims=True)
    if spec.has_microexponents:
        sub_max = field.reshape(len(field), -1, spec.sub_block_size).max(axis=2)
        micro = np.repeat(
            np.minimum(shared - sub_max, 2**spec.sub_block_shift_bits - 1),
            spec.sub_block_size,
            axis=1,
        )
        shift = shared - micro - field + 24 - m
        significand = np.where(field == 0, 0, (bits & 0x7FFFFF) | 0x800000)
    else:
        effective = np.maximum(field, 1)
        shift = shared - effective + 24 - m
        significand = np.where(field == 0, bits & 0x7FFFFF, (bits & 0x7FFFFF) | 0x800000)
    shift = np.clip(shift, 1, 40)
    kept, tail, half = significand >> shift, significand & ((1 << shift) - 1), 1 << (shift - 1)
    finite = (field != 255) & (shared != 255 if spec.has_microexponents else True)
    return {
        "ties": int((finite & (tail == half) & (significand > 0)).sum()),
        "carries out of the top": int((finite & (kept == 2**m - 1) & (tail >= half)).sum()),
        "largest mantissa kept": int((finite & (kept == 2**m - 1) & (tail < half)).sum()),
        "zeros": int((x == 0).sum()),
        "subnormals": int(((field == 0) & ((bits & 0x7FFFFF) != 0)).sum()),
        "nan/inf": int((~np.isfinite(x)).sum()),
    }


# --- BFPQuantizeDequantize ------------------------------------------------------------------

BFP_X = oracle_inputs(seed=10, rows=128, cols=96)


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("name", ["MX4", "MX6", "MX9", "BFP16"])
def test_bfp_named_specs_match_quark_runtime(quark_runtime, name, mode):
    spec = BFP_SPECS[name].replace(rounding_mode=mode)
    counts = bfp_corner_counts(BFP_X, spec)
    assert min(counts.values()) > 0, counts  # the inputs reach every corner
    got = quark_runtime("BFPQuantizeDequantize", bfp_attributes(spec, axis=1), BFP_X)
    mismatches, examples = bit_mismatches(mxsim.quantize_bfp(BFP_X, spec, axis=1).dequantize(), got)
    assert mismatches == 0, (spec, mismatches, examples)


# (method, bit_width, block_size, sub_block_size, shift bits): widths 10..32, blocks 2..64,
# sub-blocks 1..block, 0..3 shift bits.
FREE_SPECS = [
    ("to_bfp_prime", 10, 16, 2, 1),
    ("to_bfp_prime", 12, 8, 4, 2),
    ("to_bfp_prime", 14, 32, 8, 1),
    ("to_bfp_prime", 13, 16, 1, 3),
    ("to_bfp_prime", 16, 64, 16, 2),
    ("to_bfp_prime", 20, 4, 2, 0),
    ("to_bfp_prime", 11, 16, 16, 1),
    ("to_bfp_prime", 32, 8, 2, 1),
    ("to_bfp_prime", 24, 2, 1, 3),
    ("to_bfp", 10, 4, 4, 0),
    ("to_bfp", 12, 16, 16, 0),
    ("to_bfp", 20, 32, 32, 0),
    ("to_bfp", 32, 8, 8, 0),
]


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("method, bit_width, block, sub_block, shift_bits", FREE_SPECS)
def test_bfp_free_parameters_match_quark_runtime(
    quark_runtime, method, bit_width, block, sub_block, shift_bits, mode
):
    spec = BFPSpec(method, bit_width, block, sub_block, shift_bits, rounding_mode=mode)
    x = oracle_inputs(seed=bit_width * 100 + block, rows=48, cols=64)
    got = quark_runtime("BFPQuantizeDequantize", bfp_attributes(spec, axis=1), x)
    mismatches, examples = bit_mismatches(mxsim.quantize_bfp(x, spec, axis=1).dequantize(), got)
    assert mismatches == 0, (spec, mismatches, examples)


# (shape, axis): 3-D along each axis (lengths 7, 21, 5: never a multiple of 16, so padded),
# negative axes, and a 1-D tensor (Quark ignores axis there).
SHAPES_AXES = [
    ((7, 21, 5), 0),
    ((7, 21, 5), 1),
    ((7, 21, 5), 2),
    ((7, 21, 5), -1),
    ((6, 37), -2),
    ((1001,), 0),
]


@pytest.mark.parametrize("shape, axis", SHAPES_AXES)
@pytest.mark.parametrize("name", ["MX6", "BFP16"])
def test_bfp_axes_and_padding_match_quark_runtime(quark_runtime, name, shape, axis):
    spec = BFP_SPECS[name].replace(rounding_mode=2)
    x = (
        oracle_inputs(seed=len(shape) + axis, rows=32, cols=64)
        .reshape(-1)[: int(np.prod(shape))]
        .reshape(shape)
    )
    got = quark_runtime("BFPQuantizeDequantize", bfp_attributes(spec, axis=axis), x)
    mismatches, examples = bit_mismatches(mxsim.quantize_bfp(x, spec, axis=axis).dequantize(), got)
    assert mismatches == 0, (spec, shape, axis, mismatches, examples)


def test_bfp_carry_out_of_the_top_keeps_the_largest_mantissa(quark_runtime):
    # MX6 1.97 (q = 15.76) and MX4 1.97 (q = 3.94): Quark's CPU runtime gives 1.875 / 1.5,
    # not 2.0; FLT_MAX stays finite at 127 * 2^121 in MX9 (docs/bfp.md).
    x = np.zeros((3, 16), np.float32)
    x[:, 0] = [1.97, -1.97, np.finfo(np.float32).max]
    for name, expected in [
        ("MX6", [1.875, -1.875, 15 * 2.0**124]),
        ("MX4", [1.5, -1.5, 3 * 2.0**126]),
        ("MX9", [1.96875, -1.96875, 127 * 2.0**121]),
    ]:
        got = quark_runtime("BFPQuantizeDequantize", bfp_attributes(BFP_SPECS[name], axis=1), x)
        assert got[:, 0].tolist() == expected
        assert mxsim.quantize_bfp(x, name, axis=1).dequantize()[:, 0].tolist() == expected


# --- MXQuantizeDequantize ---------------------------------------------------------------------

MX_X = oracle_inputs(seed=20, rows=128, cols=96)


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("element", MX_ELEMENTS)
def test_mx_elements_match_quark_runtime(quark_runtime, element, mode):
    got = quark_runtime(
        "MXQuantizeDequantize",
        dict(element_dtype=element, axis=1, block_size=32, rounding_mode=mode),
        MX_X,
    )
    options = INT8_ROUNDING[mode] if element == "int8" else {}  # rounding_mode only acts on MXINT8
    with np.errstate(over="ignore"):  # +-FLT_MAX blocks can round to 2^128: Inf, as in Quark
        want = mxsim.fake_quantize(
            MX_X, element, axis=1, block_size=32, profile="quark-onnx", **options
        ).astype(np.float32)
    mismatches, examples = bit_mismatches(want, got)
    assert mismatches == 0, (element, mode, mismatches, examples)


@pytest.mark.parametrize("block_size", [2, 16, 64])
@pytest.mark.parametrize("shape, axis", SHAPES_AXES)
def test_mx_axes_block_sizes_and_padding_match_quark_runtime(
    quark_runtime, shape, axis, block_size
):
    x = (
        oracle_inputs(seed=30 + block_size, rows=32, cols=64)
        .reshape(-1)[: int(np.prod(shape))]
        .reshape(shape)
    )
    for element in ["fp8_e4m3", "fp4_e2m1", "int8"]:
        got = quark_runtime(
            "MXQuantizeDequantize",
            dict(element_dtype=element, axis=axis, block_size=block_size, rounding_mode=2),
            x,
        )
        with np.errstate(over="ignore"):
            want = mxsim.fake_quantize(
                x, element, axis=axis, block_size=block_size, profile="quark-onnx"
            ).astype(np.float32)
        mismatches, examples = bit_mismatches(want, got)
        assert mismatches == 0, (element, shape, axis, block_size, mismatches, examples)


# --- quark.torch fake_quantize_mx ----------------------------------------------------------------

TORCH_X = oracle_inputs(seed=40, rows=128, cols=96)
QUARK_TORCH_NAMES = {"fp4_e2m1": "fp4"}  # Quark torch's Dtype names


@pytest.fixture(scope="module")
def fake_quantize_mx(torch):
    import_or_skip("quark", "oracles")
    module = import_or_skip("quark.torch.kernel.hw_emulation.hw_emulation_interface", "oracles")
    return module.fake_quantize_mx


@pytest.mark.parametrize(
    "mode, profile", [("even", "quark"), ("floor", "quark-floor"), ("ceil", "quark-ceil")]
)
@pytest.mark.parametrize("element", MX_ELEMENTS)
def test_quark_torch_fake_quantize_mx_matches(torch, fake_quantize_mx, element, mode, profile):
    for x, axis, block_size in [
        (TORCH_X, 1, 32),
        (TORCH_X[:, :90].T.copy(), 0, 16),
    ]:  # padded along axis 0
        got = fake_quantize_mx(
            torch.from_numpy(x),
            axis,
            block_size,
            mode,
            mx_element_dtype=QUARK_TORCH_NAMES.get(element, element),
        ).numpy()
        with np.errstate(over="ignore"):
            want = mxsim.fake_quantize(
                x, element, axis=axis, block_size=block_size, profile=profile
            ).astype(np.float32)
        mismatches, examples = bit_mismatches(want, got)
        assert mismatches == 0, (element, mode, axis, mismatches, examples)
