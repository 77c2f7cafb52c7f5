"""Layer and trace estimates: agreement with SCALE-Sim 3.0.0 and the MX-specific figures."""

import csv
import json
from pathlib import Path

import pytest

from mxsim.datapath.array import ArrayConfig
from mxsim.cycles.estimate import estimate_layer, estimate_layers
from mxsim.cycles.layers import GemmLayer
from mxsim.cycles.storage import OperandStorage, storage_for_format
from mxsim.cycles.topology import read_scalesim_topology
from mxsim.errors import MxsimError

DATA = Path(__file__).parent / "data" / "scalesim"
PLAIN = OperandStorage.plain(1)


def scalesim_rows():
    topologies = {}
    with open(DATA / "scalesim_3_0_0_compute_report.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["topology"] not in topologies:
                topologies[row["topology"]] = read_scalesim_topology(DATA / row["topology"])
            layer = topologies[row["topology"]][int(row["layer_id"])]
            yield pytest.param(
                row,
                layer,
                id=f"{row['topology']}-{row['dataflow']}-"
                f"{row['array_rows']}x{row['array_columns']}-{layer.name}",
            )


@pytest.mark.parametrize("row, layer", list(scalesim_rows()))
def test_plain_array_agrees_with_scalesim(row, layer):
    # a plain systolic array: one lane, 1-byte words, no scales; bandwidth high enough that
    # memory never binds, as in SCALE-Sim's runs (0 stall cycles recorded)
    array = ArrayConfig(
        rows=int(row["array_rows"]),
        columns=int(row["array_columns"]),
        dataflow=row["dataflow"],
        offchip_bytes_per_cycle=1e9,
    )
    estimate = estimate_layer(array, layer, PLAIN, PLAIN, PLAIN)
    assert estimate.compute_cycles == int(row["total_cycles"]) - int(row["stall_cycles"])
    assert estimate.total_cycles == estimate.compute_cycles
    assert 100 * estimate.schedule.mapping_efficiency == pytest.approx(
        float(row["mapping_efficiency_percent"])
    )
    assert 100 * estimate.utilisation == pytest.approx(float(row["overall_util_percent"]))


def test_memory_bound_layer():
    # 64^3 GEMM on 8x8 os: 64 folds of 64 + 8 + 8 - 2 = 78 cycles -> 4991 compute cycles.
    # MXFP8 A and B are 4224 B each, bf16 outputs 8192 B: 16640 B at 1 B/cycle = 16640 cycles.
    array = ArrayConfig(rows=8, columns=8, offchip_bytes_per_cycle=1, clock_mhz=500)
    fp8 = storage_for_format("fp8_e4m3")
    estimate = estimate_layer(
        array, GemmLayer("g", 64, 64, 64), fp8, fp8, storage_for_format("bf16")
    )
    assert estimate.compute_cycles == 4991
    assert estimate.memory_cycles == 16640
    assert (estimate.total_cycles, estimate.bound) == (16640, "memory")
    assert estimate.utilisation == pytest.approx(64**3 / (16640 * 64))
    assert estimate.compute_utilisation == pytest.approx(64**3 / (4991 * 64))
    assert estimate.seconds == pytest.approx(16640 / 500e6)


def test_fractional_bandwidth_rounds_memory_cycles_up():
    # 16640 B at 2.5 B/cycle = 6656 cycles exactly; at 3 B/cycle 5546.67 -> 5547
    fp8, bf16 = storage_for_format("fp8_e4m3"), storage_for_format("bf16")
    layer = GemmLayer("g", 64, 64, 64)
    assert (
        estimate_layer(
            ArrayConfig(rows=8, columns=8, offchip_bytes_per_cycle=2.5), layer, fp8, fp8, bf16
        ).memory_cycles
        == 6656
    )
    assert (
        estimate_layer(
            ArrayConfig(rows=8, columns=8, offchip_bytes_per_cycle=3), layer, fp8, fp8, bf16
        ).memory_cycles
        == 5547
    )


def test_mx_formats_change_bytes_and_memory_cycles_not_compute():
    array = ArrayConfig(rows=8, columns=8, lanes_per_unit=16, offchip_bytes_per_cycle=4)
    layer = GemmLayer("g", 64, 64, 64)
    estimates = {
        name: estimate_layer(
            array,
            layer,
            storage_for_format(name),
            storage_for_format(name),
            storage_for_format("bf16"),
        )
        for name in ("fp4_e2m1", "fp8_e4m3", "mx9")
    }
    # 16 lanes: T = 64 / 16 = 4 steps; 64 folds x (4 + 8 + 8 - 2) - 1 = 1151 in every format
    assert {estimate.compute_cycles for estimate in estimates.values()} == {1151}
    bytes_by_format = {name: estimate.to_dict()["bytes"] for name, estimate in estimates.items()}
    # per operand (see test_cycles_traffic): FP4 2048 + 128, FP8 4096 + 128, MX9 4096 + 512
    assert bytes_by_format["fp4_e2m1"]["ifmap"] == {"elements": 2048, "scales": 128, "passes": 1}
    assert bytes_by_format["mx9"]["filter"] == {"elements": 4096, "scales": 512, "passes": 1}
    assert [bytes_by_format[name]["total"] for name in ("fp4_e2m1", "fp8_e4m3", "mx9")] == [
        2176 * 2 + 8192,
        4224 * 2 + 8192,
        4608 * 2 + 8192,
    ]
    # at 4 B/cycle: 12544 / 4 = 3136, 16640 / 4 = 4160, 17408 / 4 = 4352
    assert [estimates[name].memory_cycles for name in ("fp4_e2m1", "fp8_e4m3", "mx9")] == [
        3136,
        4160,
        4352,
    ]


def test_lanes_must_divide_the_block_size():
    mx9, fp8, plain = storage_for_format("mx9"), storage_for_format("fp8_e4m3"), PLAIN
    layer = GemmLayer("g", 4, 4, 64)
    with pytest.raises(MxsimError, match="lanes_per_unit 32 does not divide the block size 16"):
        estimate_layer(ArrayConfig(rows=2, columns=2, lanes_per_unit=32), layer, mx9, fp8, plain)
    with pytest.raises(MxsimError, match="operand B"):
        estimate_layer(ArrayConfig(rows=2, columns=2, lanes_per_unit=3), layer, plain, fp8, plain)
    # divisors are fine, and plain operands take any lane count
    estimate_layer(ArrayConfig(rows=2, columns=2, lanes_per_unit=16), layer, mx9, fp8, plain)
    estimate_layer(ArrayConfig(rows=2, columns=2, lanes_per_unit=3), layer, plain, plain, plain)


def test_trace_totals_and_json():
    array = ArrayConfig(rows=4, columns=3, offchip_bytes_per_cycle=1e9)
    layers = read_scalesim_topology(DATA / "gemm_small.csv")
    trace = estimate_layers(array, layers, PLAIN, PLAIN, PLAIN)
    # SCALE-Sim os on 4x3 (recorded): 47 + 89 + 1349 + 5 + 41309
    assert trace.compute_cycles == trace.total_cycles == 47 + 89 + 1349 + 5 + 41309
    macs = 5 * 7 * 3 + 9 * 4 * 10 + 33 * 17 * 20 + 1 + 70 * 50 * 130
    assert trace.macs == macs
    assert trace.utilisation == pytest.approx(macs / (trace.total_cycles * 12))
    # G1 in 1-byte words: A 5x3 + B 3x7 + O 5x7 = 15 + 21 + 35 bytes
    assert trace.layers[0].traffic.total_bytes == 71
    document = json.loads(json.dumps(trace.to_dict()))
    assert document["totals"]["cycles"]["total"] == trace.total_cycles
    assert document["totals"]["layers"] == 5
    assert document["array"]["rows"] == 4
    first = document["layers"][0]
    assert first["folds"] == {"row": 2, "column": 3, "total": 6, "cycles_each": 8}
    assert first["cycles"] == {"compute": 47, "memory": 1, "total": 47, "bound": "compute"}
