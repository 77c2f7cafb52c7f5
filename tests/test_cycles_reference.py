"""The cycle-walking twin against SCALE-Sim 3.0.0's recorded output, and its own checks."""

import csv
from pathlib import Path

import numpy as np
import pytest

from mxsim.cycles import reference
from mxsim.cycles.layers import ConvLayer, GemmLayer
from mxsim.cycles.reference import NULL, reduction_groups, skew, walk_layer
from mxsim.cycles.topology import read_scalesim_topology

DATA = Path(__file__).parent / "data" / "scalesim"


def recorded_rows():
    """Rows of the SCALE-Sim report (see tests/data/scalesim/README.md) small enough to walk."""
    topologies = {}
    rows = []
    with open(DATA / "scalesim_3_0_0_compute_report.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["topology"] not in topologies:
                topologies[row["topology"]] = read_scalesim_topology(DATA / row["topology"])
            layer = topologies[row["topology"]][int(row["layer_id"])]
            if layer.M * layer.N * layer.K <= 100_000:
                rows.append(
                    pytest.param(
                        row,
                        layer,
                        id=f"{row['topology']}-{row['dataflow']}-"
                        f"{row['array_rows']}x{row['array_columns']}-{layer.name}",
                    )
                )
    return rows


@pytest.mark.parametrize("row, layer", recorded_rows())
def test_twin_reproduces_scalesim(row, layer):
    assert layer.name == row["layer_name"]
    assert int(row["stall_cycles"]) == 0  # recorded without memory stalls
    twin = walk_layer(int(row["array_rows"]), int(row["array_columns"]), row["dataflow"], layer)
    assert twin.compute_cycles == int(row["total_cycles"])
    assert 100 * twin.mapping_efficiency == pytest.approx(float(row["mapping_efficiency_percent"]))


def test_skew_matches_scalesim_docstring_example():
    # SCALE-Sim's skew_matrix: column c is delayed by c lines
    skewed = skew(np.array([[1, 2, 3], [4, 5, 6]]))
    assert skewed.tolist() == [[1, NULL, NULL], [4, 2, NULL], [NULL, 5, 3], [NULL, NULL, 6]]


def test_reduction_groups():
    assert reduction_groups(GemmLayer("g", 1, 1, 5), 2) == [[0, 1], [2, 3], [4]]
    # 1x2 filter taps over 3 channels, 2 lanes: k = tap x 3 + channel, groups stay in a tap
    assert reduction_groups(ConvLayer("c", 2, 2, 1, 2, 3, 1, 1, 1), 2) == [[0, 1], [2], [3, 4], [5]]


def test_twin_rejects_a_schedule_without_skew(monkeypatch):
    # Without SCALE-Sim's skew the operands of different reduction steps meet in a unit;
    # the walk must notice rather than count lines.
    monkeypatch.setattr(reference, "skew", lambda matrix: matrix)
    with pytest.raises(AssertionError, match="different reduction steps"):
        walk_layer(3, 3, "os", GemmLayer("g", 3, 3, 4))


def test_twin_rejects_a_schedule_that_drops_a_fold(monkeypatch):
    real_ranges = reference._fold_ranges
    monkeypatch.setattr(
        reference, "_fold_ranges", lambda extent, size: real_ranges(extent, size)[:1]
    )
    with pytest.raises(AssertionError, match="zero times"):
        walk_layer(2, 2, "ws", GemmLayer("g", 3, 3, 5))


def test_twin_counts_every_product_once():
    twin = walk_layer(3, 2, "is", ConvLayer("c", 5, 4, 2, 2, 3, 4, 1, 2), lanes_per_unit=2)
    assert twin.products_checked == 4 * 2 * 12 * 4  # M (4x2 pixels) x N x K
