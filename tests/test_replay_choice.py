"""What a unit gets for each operand: the model's, replaced, added (paired with the other
operand's format), the caller's, or a cast for wide formats."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO, mx_linear_layer
from mxsim import matmul
from mxsim.datapath import load_hwconfig
from mxsim.errors import MxsimError
from mxsim.quantize import quantize, quantize_nvfp4
from mxsim.quantize.nvfp4 import tensor_scale_from_amax
from mxsim.replay.choice import choose_operand
from mxsim.replay.layer import replay_layer, run_layer
from mxsim.replay.operands import layer_operands
from mxsim.replay.report import format_report
from mxsim.replay.run import replay
from mxsim.trace import Layer, MXQuant, Trace, load_trace

HW = {
    name: load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
    for name in ("ocp-exact", "h100-fp8", "kulisch")
}


def test_a_spec_the_unit_cannot_take_is_replaced_and_marked():
    layer = mx_linear_layer(np.random.default_rng(2), "fp4_e2m1")
    result = replay_layer(layer, HW["h100-fp8"])
    assert result.input.format == "fp8_e4m3" and result.input.per_tensor_scale
    assert result.status == "replaced" and "cannot take fp4_e2m1 block 32" in result.input.note
    assert "no block scales" in result.input.note
    # the unit's operands are the public per-tensor quantization of the model's float operands
    qa = quantize(layer.input, "fp8_e4m3", axis=1, per_tensor_scale=True)
    qb = quantize(layer.weight.T, "fp8_e4m3", axis=0, per_tensor_scale=True)
    expected = matmul(HW["h100-fp8"], qa, qb)
    np.testing.assert_array_equal(result.bits[0], expected.bits)
    trace = Trace("t", [layer])
    report = replay(trace, [HW["ocp-exact"], HW["h100-fp8"]])
    text = format_report(report)
    row = next(line for line in text.splitlines() if "h100-fp8" in line and "fp8_e4m3/pt" in line)
    assert row.startswith("* fc") and "legend: * the unit cannot take" in text
    assert report["totals"]["h100-fp8"]["rows"]["replaced"] == 1
    assert report["layers"][0]["results"][1]["status"] == "replaced"
    with pytest.raises(MxsimError, match="cannot take fp4_e2m1.*strict"):
        replay(trace, [HW["ocp-exact"], HW["h100-fp8"]], strict=True)
    assert (
        replay(trace, [HW["ocp-exact"]], strict=True)["totals"]["ocp-exact"]["rows"]["model"] == 1
    )


def test_an_added_operand_takes_a_format_that_pairs_with_the_other():
    """h100 mixes only its FP8 formats (inputs.format_groups): an E5M2 input with float weights
    gets E4M3 weights, the first of its B formats pairing with E5M2, not its first B format
    (fp16, a pair no instruction takes)."""
    h100 = load_hwconfig(REPO / "hwconfigs" / "h100.yaml")
    layer = mx_linear_layer(np.random.default_rng(3), "fp8_e5m2")
    layer.quant["weight"] = None
    result = run_layer(layer, h100)
    assert (result.input.format, result.weight.format) == ("fp8_e5m2", "fp8_e4m3")
    assert (
        result.weight.status == "added"
        and "fp8_e4m3, the first format pairing with the input's fp8_e5m2" in result.weight.note
    )
    qa = quantize(layer.input, "fp8_e5m2", axis=1, per_tensor_scale=True)
    qb = quantize(layer.weight.T, "fp8_e4m3", axis=0, per_tensor_scale=True)
    np.testing.assert_array_equal(result.bits[0], matmul(h100, qa, qb).bits)
    with pytest.raises(
        MxsimError,
        match=r"^layer 'fc' on h100: takes no fp8_e4m3 x fp16 pair \(input x weight\) and "
        r"neither format is replay's to change; it takes fp16 x fp16, ",
    ):
        run_layer(layer, h100, element_format="fp8_e4m3", weight_format="fp16")


def test_a_finer_model_block_than_the_unit_block_is_replaced():
    layer = mx_linear_layer(np.random.default_rng(10), "fp4_e2m1")
    spec = MXQuant("fp4_e2m1", axis=1, block_size=16)
    layer = Layer(
        layer.name, layer.op, layer.tensors, layer.attrs, {"input": spec, "weight": spec}, {}
    )
    result = replay_layer(layer, HW["ocp-exact"])
    assert result.status == "replaced" and "blocks of 32 do not fit" in result.input.note
    assert result.input.format == "fp4_e2m1" and not result.input.per_tensor_scale
    coarse = MXQuant("fp4_e2m1", axis=1, block_size=64)  # whole unit blocks inside each model block
    layer = Layer(
        layer.name, layer.op, layer.tensors, layer.attrs, {"input": coarse, "weight": coarse}, {}
    )
    result = replay_layer(layer, HW["ocp-exact"])
    assert result.status == "model"
    assert result.input.saturated + result.input.underflowed > 0
    assert replay_layer(layer, HW["kulisch"]).identical_to_ideal_fraction == 1.0


@pytest.mark.parametrize("fmt, least_db", [("bf16", 45.0), ("fp16", 60.0), ("tf32", 60.0)])
def test_wide_formats_on_a_unit_without_block_scales_are_cast_not_scaled(fmt, least_db):
    """fp16/bf16/tf32 operands of an H100 take the values rounded straight in (label ``cast``):
    scaled up to bf16's or tf32's largest values, the products would overflow the fp32 sums.
    A cast of a few-bit-mantissa format keeps about 6 dB per bit of the float result."""
    trace = load_trace(REPO / "traces" / "digits-cnn")
    report = replay(trace, [load_hwconfig(REPO / "hwconfigs" / "h100.yaml")], element_format=fmt)
    rows = [r for entry in report["layers"] for r in entry["results"]]
    assert {
        (r["input"]["tensor_scale_exponent"], r["weight"]["tensor_scale_exponent"]) for r in rows
    } == {(0, 0)}
    assert min(r["sqnr_vs_float_db"] for r in rows) > least_db


def test_element_format_override():
    trace = load_trace(REPO / "traces" / "digits-cnn")
    report = replay(trace, [HW["ocp-exact"]], element_format="fp4_e2m1")
    assert {r["input"]["format"] for entry in report["layers"] for r in entry["results"]} == {
        "fp4_e2m1"
    }
    with pytest.raises(MxsimError, match="does not take fp4_e2m1"):
        replay(trace, [HW["h100-fp8"]], element_format="fp4_e2m1")


def test_an_nvfp4_unit_takes_the_two_level_recipe_unless_told_otherwise():
    """On a unit with UE4M3 block scales a float operand gets the NVFP4 recipe (torchao's
    profile, the unit's block), two-level by default (torchao's and NVIDIA's default);
    per_tensor_scale=False asks for single-level, which on a unit without block scales would
    be an error; the caller's format is taken with the same recipe."""
    nvfp4 = load_hwconfig(REPO / "hwconfigs" / "b200-nvfp4.yaml")
    layer = Layer(
        "fc",
        "linear",
        {
            "input": np.ones((2, 32), np.float32),
            "weight": np.ones((3, 32), np.float32),
            "output": np.full((2, 3), 32.0, np.float32),
        },
        {},
        {"input": None, "weight": None, "bias": None},
        {},
    )
    operand = layer_operands(layer).a
    default, _ = choose_operand(operand, "input", None, nvfp4, None)
    assert (default.format, default.profile, default.block_size) == ("fp4_e2m1", "torchao", 16)
    assert default.per_tensor_scale and default.float_scales and default.status == "added"
    single, _ = choose_operand(operand, "input", None, nvfp4, None, per_tensor_scale=False)
    assert not single.per_tensor_scale
    caller, _ = choose_operand(operand, "input", None, nvfp4, "fp4_e2m1")
    assert (caller.status, caller.profile, caller.per_tensor_scale) == ("caller", "torchao", True)
    mx, _ = choose_operand(operand, "input", None, HW["ocp-exact"], None)
    assert not mx.float_scales and mx.scale_format == "e8m0" and not mx.per_tensor_scale
    with pytest.raises(MxsimError, match="has no block scales"):
        choose_operand(operand, "input", None, HW["h100-fp8"], None, per_tensor_scale=False)


def test_a_models_nvfp4_weight_is_taken_where_its_blocks_and_scaling_fit():
    """A recorded NVFP4 weight (UE4M3 per 16 along K, a tensor scale) is the model's on an
    NVFP4 unit; asked for single-level scaling the unit gets replay's quantization instead
    (``replaced``, saying why); units with E8M0 scales read it as floats (``added``)."""
    from mxsim.trace import NVFP4Quant

    rng = np.random.default_rng(5)
    weight = rng.standard_normal((3, 32)).astype(np.float32)
    t = 2.0**-6
    spec = NVFP4Quant(axis=1, tensor_scale=t)
    layer = Layer(
        "fc",
        "linear",
        {
            "input": rng.standard_normal((2, 32)).astype(np.float32),
            "weight": weight,
            "weight_quantized": spec.fake_quantize(weight),
            "output": np.zeros((2, 3), np.float32),
        },
        {},
        {"input": None, "weight": spec, "bias": None},
        {},
    )
    nvfp4 = load_hwconfig(REPO / "hwconfigs" / "b200-nvfp4.yaml")
    operand = layer_operands(layer).b
    assert operand.granule == 16 and operand.layout == "K blocked"
    taken, _ = choose_operand(operand, "weight", spec, nvfp4, None)
    assert (taken.status, taken.format, taken.per_tensor_scale) == ("model", "fp4_e2m1", True)
    asked, _ = choose_operand(operand, "weight", spec, nvfp4, None, per_tensor_scale=False)
    assert asked.status == "replaced" and "was asked for single-level scaling" in asked.note
    mx, _ = choose_operand(operand, "weight", spec, HW["ocp-exact"], None)
    assert mx.status == "added"
    run = run_layer(layer, nvfp4)
    x = layer.input
    qa = quantize_nvfp4(x, tensor_scale_from_amax(np.abs(x).max()))
    np.testing.assert_array_equal(run.bits[0], matmul(nvfp4, qa, spec.quantize(weight)).bits)
