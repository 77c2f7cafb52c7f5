"""What a unit gets for each operand: the model's, replaced, added (paired with the other
operand's format), the caller's, or a cast for wide formats."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO, mx_linear_layer
from mxsim import matmul
from mxsim.datapath import load_hwconfig
from mxsim.errors import MxsimError
from mxsim.quantize import quantize
from mxsim.replay.layer import replay_layer, run_layer
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
