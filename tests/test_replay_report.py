"""The replay report: names, formats, worst layers and totals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, mx_linear_layer
from mxsim.datapath import load_hwconfig
from mxsim.replay.plots import write_plots
from mxsim.replay.report import format_report
from mxsim.replay.run import replay
from mxsim.trace import Layer, Trace

HW = {
    name: load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml") for name in ("ocp-exact", "h100-fp8")
}


def test_report_names_formats_and_plot_paths(tmp_path):
    # ONNX names start with "/" and repeat their prefix: the table shows them whole, the
    # plots take sanitised names inside the directory, and worst layers are ranked.
    rng = np.random.default_rng(9)
    layers = []
    for suffix in ("q", "k"):
        layer = mx_linear_layer(rng)
        layers.append(
            Layer(
                f"/m/transformer/h.0/attn/{suffix}_proj/MatMul",
                layer.op,
                layer.tensors,
                layer.attrs,
                layer.quant,
                {},
            )
        )
    report = replay(Trace("onnx", layers), [HW["ocp-exact"]])
    text = format_report(report)
    for layer in layers:
        assert any(line.startswith(f"  {layer.name} ") for line in text.splitlines())
    assert "fp8_e4m3/32 x fp8_e4m3/32" in text and "worst layers on ocp-exact" in text
    worst = report["worst"]["ocp-exact"]
    assert [w["k"] for w in worst] == [70, 70] and worst[0]["sqnr_vs_float_db"] <= worst[1][
        "sqnr_vs_float_db"
    ]
    directory = tmp_path / "plots"
    written = write_plots(report, directory)
    assert all(Path(p).parent == directory.resolve() for p in written)
    assert sorted(p.name for p in directory.iterdir()) == [
        "000-m_transformer_h.0_attn_q_proj_MatMul.png",
        "001-m_transformer_h.0_attn_k_proj_MatMul.png",
        "overview.png",
    ]


def test_totals_give_mean_and_median_layer_sqnr_and_what_was_replaced():
    rng = np.random.default_rng(5)
    layers = []
    for index, fmt in enumerate(("fp8_e4m3", "fp6_e2m3", "fp4_e2m1")):
        layer = mx_linear_layer(rng, fmt)
        layer.name = f"fc{index}"
        layers.append(layer)
    report = replay(Trace("t", layers), [HW["ocp-exact"], HW["h100-fp8"]])
    for unit in ("ocp-exact", "h100-fp8"):
        sqnrs = [
            entry["results"][report["units"].index(unit)]["sqnr_vs_float_db"]
            for entry in report["layers"]
        ]
        total = report["totals"][unit]
        assert total["mean_layer_sqnr_vs_float_db"] == pytest.approx(sum(sqnrs) / 3)
        assert total["median_layer_sqnr_vs_float_db"] == sorted(sqnrs)[1]
        assert total["worst_layer_sqnr_vs_float_db"] == min(sqnrs)
    assert report["totals"]["ocp-exact"]["replaced"] == []
    assert report["totals"]["h100-fp8"][
        "replaced"
    ] == [  # no block scales: even fp8 blocks are re-quantized
        "fp4_e2m1 block 32 -> fp8_e4m3/pt",
        "fp6_e2m3 block 32 -> fp8_e4m3/pt",
        "fp8_e4m3 block 32 -> fp8_e4m3/pt",
    ]
    totals_line = next(
        line for line in format_report(report).splitlines() if line.startswith("total h100-fp8")
    )
    assert "/ median" in totals_line and "/ mean" in totals_line
    assert (
        "(* re-quantized by replay: fp4_e2m1 block 32 -> fp8_e4m3/pt; fp6_e2m3 block 32 -> fp8_e4m3/pt; "
        "fp8_e4m3 block 32 -> fp8_e4m3/pt)" in totals_line
    )


def test_operand_labels_name_float_block_scales():
    """An NVFP4 operand's label names its scale format and tensor scale; a report written
    before the scale format was recorded reads as E8M0."""
    from mxsim.replay.choice import OperandChoice
    from mxsim.replay.report import _operand_label

    nvfp4 = OperandChoice("fp4_e2m1", "torchao", True, block_size=16, scale_format="ue4m3")
    assert _operand_label(nvfp4) == "fp4_e2m1/16/ue4m3/pt"
    single = dataclasses.asdict(nvfp4) | {"per_tensor_scale": False}
    assert _operand_label(single) == "fp4_e2m1/16/ue4m3"
    old = {"format": "fp8_e4m3", "block_size": 32, "per_tensor_scale": False}
    assert _operand_label(old) == "fp8_e4m3/32"
