"""Closed-form compute cycles against hand-derived cases and the cycle-walking twin."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxsim.datapath.array import ArrayConfig
from mxsim.cycles.compute import fold_schedule, spatiotemporal_extents
from mxsim.cycles.layers import ConvLayer, GemmLayer
from mxsim.cycles.reference import walk_layer


def closed_form(rows, columns, dataflow, layer, lanes=1, latency=1):
    array = ArrayConfig(
        rows=rows,
        columns=columns,
        dataflow=dataflow,
        lanes_per_unit=lanes,
        pipeline_latency=latency,
    )
    return fold_schedule(array, layer.M, layer.N, layer.reduction_steps(lanes))


# (rows, columns, dataflow, (M, N, K), lanes, latency, cycles, folds, mapping efficiency)
HAND_CASES = [
    # os, 4x3, M=5 N=7 K=3: Sr=M=5 -> row folds of 4 and 1 (partial); Sc=N=7 -> column folds
    # of 3, 3, 1 (partial); T=K=3. Each fold is T + R + C - 2 = 3 + 4 + 3 - 2 = 8 lines;
    # 6 folds = 48 lines; SCALE-Sim reports the last line's index: 47.
    # Mapping: units used per fold sum to (4 + 1) x (3 + 3 + 1) = 35 over 6 folds of 12.
    (4, 3, "os", (5, 7, 3), 1, 1, 47, 6, 35 / 72),
    # os, 4x3, M=8 N=6 K=5: exact fit, 2 x 2 folds of 5 + 4 + 3 - 2 = 10 lines; 40 - 1 = 39.
    (4, 3, "os", (8, 6, 5), 1, 1, 39, 4, 1.0),
    # ws, 4x3, M=9 N=4 K=10: Sr=K=10 -> row folds 4, 4, 2; Sc=N=4 -> column folds 3, 1;
    # T=M=9. Each fold is 2R + C + T - 2 = 8 + 3 + 9 - 2 = 18 lines; 6 x 18 - 1 = 107.
    # Mapping: (4 + 4 + 2) x (3 + 1) = 40 over 6 folds of 12.
    (4, 3, "ws", (9, 4, 10), 1, 1, 107, 6, 40 / 72),
    # is, 4x3, M=9 N=4 K=10: Sr=K=10 -> row folds 4, 4, 2; Sc=M=9 -> 3, 3, 3; T=N=4.
    # Each fold 8 + 3 + 4 - 2 = 13 lines; 9 x 13 - 1 = 116. Mapping 10 x 9 / (9 x 12).
    (4, 3, "is", (9, 4, 10), 1, 1, 116, 9, 90 / 108),
    # ws, 8x8 holding all of M=3 N=5 K=6 in one fold: 2 x 8 + 8 + 3 - 2 = 25 lines -> 24.
    (8, 8, "ws", (3, 5, 6), 1, 1, 24, 1, 30 / 64),
    # 1x1 array, 1x1x1 GEMM: one fold of 1 + 1 + 1 - 2 = 1 line -> cycle index 0.
    (1, 1, "os", (1, 1, 1), 1, 1, 0, 1, 1.0),
    # os, 2x2, 4 lanes, M=2 N=2 K=10: T = ceil(10 / 4) = 3 steps; one fold of
    # 3 + 2 + 2 - 2 = 5 lines -> 4.
    (2, 2, "os", (2, 2, 10), 4, 1, 4, 1, 1.0),
    # same with pipeline latency 3: each fold waits 3 - 1 = 2 more cycles: 7 lines -> 6.
    (2, 2, "os", (2, 2, 10), 4, 3, 6, 1, 1.0),
    # ws, 2x2, 4 lanes, M=3 N=2 K=10: Sr = 3 steps -> row folds 2 and 1; Sc = 2 -> 1 fold;
    # T = 3. Each fold 4 + 2 + 3 - 2 = 7 lines; 14 - 1 = 13. Mapping (2 + 1) x 2 / (2 x 4).
    (2, 2, "ws", (3, 2, 10), 4, 1, 13, 2, 0.75),
    # is, 3x2, latency 4, M=5 N=2 K=4: Sr=K=4 -> row folds 3, 1; Sc=M=5 -> 2, 2, 1; T=N=2.
    # Each fold 6 + 2 + 2 - 2 = 8 lines + 3 latency = 11; 6 folds -> 66 - 1 = 65.
    (3, 2, "is", (5, 2, 4), 1, 4, 65, 6, 20 / 36),
]


@pytest.mark.parametrize(
    "rows, columns, dataflow, shape, lanes, latency, cycles, folds, mapping", HAND_CASES
)
def test_hand_derived_cases(rows, columns, dataflow, shape, lanes, latency, cycles, folds, mapping):
    layer = GemmLayer("hand", *shape)
    schedule = closed_form(rows, columns, dataflow, layer, lanes, latency)
    assert schedule.compute_cycles == cycles
    assert schedule.folds == folds
    assert schedule.mapping_efficiency == pytest.approx(mapping)
    twin = walk_layer(rows, columns, dataflow, layer, lanes, latency)
    assert (twin.compute_cycles, twin.folds) == (cycles, folds)
    assert twin.mapping_efficiency == pytest.approx(mapping)


def test_conv_with_lanes_counts_steps_per_tap():
    # 4x4 ifmap, 3x3 filter, 3 channels, 2 filters, stride 1 -> 2x2 = 4 output pixels.
    # 4 lanes: each of the 9 taps is one step (3 channels < 4 lanes): T = 9.
    # os on 2x2: Sr = M = 4 -> 2 row folds; Sc = N = 2 -> 1; each 9 + 2 + 2 - 2 = 11 -> 21.
    conv = ConvLayer("c", 4, 4, 3, 3, 3, 2, 1, 1)
    assert closed_form(2, 2, "os", conv, lanes=4).compute_cycles == 21
    assert walk_layer(2, 2, "os", conv, lanes_per_unit=4).compute_cycles == 21


def test_extents_follow_scalesim_per_dataflow():
    # SCALE-Sim topology_utils.calc_spatio_temporal_params: os (M, N, K), ws (K, N, M), is (K, M, N)
    assert spatiotemporal_extents("os", 10, 20, 30) == (10, 20, 30)
    assert spatiotemporal_extents("ws", 10, 20, 30) == (30, 20, 10)
    assert spatiotemporal_extents("is", 10, 20, 30) == (30, 10, 20)


gemm_layers = st.builds(
    GemmLayer, st.just("g"), st.integers(1, 12), st.integers(1, 12), st.integers(1, 20)
)


@st.composite
def conv_layers(draw):
    height, width = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    return ConvLayer(
        "c",
        height,
        width,
        draw(st.integers(1, height)),
        draw(st.integers(1, width)),
        draw(st.integers(1, 5)),
        draw(st.integers(1, 5)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
    )


@pytest.mark.parametrize("dataflow", ["os", "ws", "is"])
@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 6),
    columns=st.integers(1, 6),
    lanes=st.integers(1, 4),
    latency=st.integers(1, 3),
    layer=st.one_of(gemm_layers, conv_layers()),
)
def test_closed_form_equals_cycle_walking_twin(dataflow, rows, columns, lanes, latency, layer):
    schedule = closed_form(rows, columns, dataflow, layer, lanes, latency)
    twin = walk_layer(rows, columns, dataflow, layer, lanes, latency)
    assert schedule.compute_cycles == twin.compute_cycles
    assert schedule.folds == twin.folds
    assert schedule.mapping_efficiency == pytest.approx(twin.mapping_efficiency)
    assert twin.products_checked == layer.M * layer.N * layer.K


@pytest.mark.parametrize("dataflow", ["os", "ws", "is"])
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 64), columns=st.integers(1, 64), lanes=st.integers(1, 32), layer=gemm_layers
)
def test_more_lanes_never_costs_cycles(dataflow, rows, columns, lanes, layer):
    one_lane = closed_form(rows, columns, dataflow, layer, 1)
    many_lanes = closed_form(rows, columns, dataflow, layer, lanes)
    assert many_lanes.compute_cycles <= one_lane.compute_cycles
