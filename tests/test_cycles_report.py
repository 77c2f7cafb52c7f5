"""The plain-text table."""

from mxsim.datapath.array import ArrayConfig
from mxsim.cycles.estimate import estimate_layers
from mxsim.cycles.layers import GemmLayer
from mxsim.cycles.report import format_table
from mxsim.cycles.storage import storage_for_format


def test_table_lists_each_layer_and_the_totals():
    array = ArrayConfig(rows=8, columns=8, offchip_bytes_per_cycle=1, dataflow="os")
    fp8, bf16 = storage_for_format("fp8_e4m3"), storage_for_format("bf16")
    layers = [GemmLayer("first_layer", 64, 64, 64), GemmLayer("tiny", 1, 1, 1)]
    table = format_table(estimate_layers(array, layers, fp8, fp8, bf16))
    lines = table.splitlines()
    assert lines[0].startswith("array 8x8, 1 lane(s)/unit, dataflow os, 1 B/cycle off chip")
    assert lines[1].split() == [
        "layer",
        "M",
        "N",
        "K",
        "folds",
        "compute",
        "memory",
        "total",
        "bound",
        "util%",
        "element",
        "B",
        "scale",
        "B",
        "psum",
        "B",
    ]
    # 64^3: 64 folds, 4991 compute cycles, 16640 bytes at 1 B/cycle (see test_cycles_estimate),
    # utilisation 262144 / (16640 x 64) = 24.6 %, elements 4096 + 4096 + 8192, scales 128 + 128
    assert lines[3].split() == [
        "first_layer",
        "64",
        "64",
        "64",
        "64",
        "4991",
        "16640",
        "16640",
        "memory",
        "24.6",
        "16384",
        "256",
        "0",
    ]
    # 1x1x1 on 8x8 os: one fold of 1 + 8 + 8 - 2 = 15 lines -> 14 cycles. Bytes: A is one
    # FP8 element + 1 scale, B the same, the bf16 output 2: 6 bytes at 1 B/cycle.
    # Utilisation 1 / (14 x 64) = 0.11 %
    assert lines[4].split() == [
        "tiny",
        "1",
        "1",
        "1",
        "1",
        "14",
        "6",
        "14",
        "compute",
        "0.1",
        "4",
        "2",
        "0",
    ]
    assert lines[-1].split() == [
        "total",
        "65",
        "5005",
        "16646",
        "16654",
        "24.6",
        "16388",
        "258",
        "0",
    ]
    assert len(lines) == 7  # title, header, rule, two layers, rule, totals
    assert table.endswith("\n")
