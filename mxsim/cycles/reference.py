"""A slow, literal twin of SCALE-Sim's compute model, to check the closed forms against.

It follows SCALE-Sim 3.0.0 step by step rather than any formula: it builds the operand
address matrices, cuts them into folds, builds each fold's ifmap/filter/ofmap demand
matrices with SCALE-Sim's null padding, prefixes, suffixes, flips and skews
(scalesim/compute/systolic_compute_{os,ws,is}.py), concatenates them, and walks the lines
one cycle each as SCALE-Sim's memory loop does when nothing stalls
(memory/double_buffered_scratchpad_mem.py: the reported "Total Cycles" is the largest
cycle at which an ofmap line is serviced).

Beyond counting, it runs each fold through the array cycle by cycle -- operands hop one
unit per cycle, stationary operands sit where the load left them -- and checks that the
two operands meeting in a unit belong to the same reduction step, that every product
(m, n, k) of the layer is computed exactly once, and that each fold's last product falls
within the fold's lines.

mxsim's generalisations are applied to the inputs of that machinery, not to its counts:
lanes group the reduction axis (a demand entry is a group of up to ``lanes_per_unit``
reduction indices, and for a conv layer a group never spans two filter taps), and a
pipeline latency p adds p - 1 null lines at the end of each fold's operand streams and
delays its output writes by the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mxsim.cycles.layers import ConvLayer, Layer

NULL = -1  # SCALE-Sim's "no request" entry


@dataclass(frozen=True)
class TwinResult:
    """What the walk found. ``mapping_efficiency`` counts units that did at least one product."""

    compute_cycles: int
    demand_lines: int
    folds: int
    mapping_efficiency: float
    products_checked: int


def reduction_groups(layer: Layer, lanes_per_unit: int) -> list[list[int]]:
    """Reduction indices k consumed together by one unit in one cycle, in order.

    k follows SCALE-Sim's window order for conv layers: (tap row, tap column, channel).
    """
    if isinstance(layer, ConvLayer):
        taps, channels = layer.filter_height * layer.filter_width, layer.channels
        return [
            [
                tap * channels + channel
                for channel in range(start, min(start + lanes_per_unit, channels))
            ]
            for tap in range(taps)
            for start in range(0, channels, lanes_per_unit)
        ]
    return [
        list(range(start, min(start + lanes_per_unit, layer.K)))
        for start in range(0, layer.K, lanes_per_unit)
    ]


def skew(matrix: np.ndarray) -> np.ndarray:
    """SCALE-Sim's ``skew_matrix``: column c moves down by c lines."""
    lines, width = matrix.shape
    out = np.full((lines + width - 1, width), NULL, dtype=np.int64)
    for column in range(width):
        out[column : column + lines, column] = matrix[:, column]
    return out


def _null(lines: int, width: int) -> np.ndarray:
    return np.full((lines, width), NULL, dtype=np.int64)


def _pad(block: np.ndarray, lines: int, width: int) -> np.ndarray:
    """Fill an under-used fold with null requests up to lines x width."""
    out = _null(lines, width)
    out[: block.shape[0], : block.shape[1]] = block
    return out


def _fold_ranges(extent: int, size: int) -> list[range]:
    return [range(start, min(start + size, extent)) for start in range(0, extent, size)]


def _fold_demands(dataflow, rows, columns, ifmap_op, filter_op, ofmap_op, fold_rows, fold_columns):
    """One fold's (ifmap, filter, ofmap) demand matrices, built as SCALE-Sim builds them."""
    R, C = rows, columns
    if dataflow == "os":
        T = ifmap_op.shape[1]
        ifmap = _pad(ifmap_op.T[:, fold_rows], T, R)
        ifmap = skew(np.concatenate([ifmap, _null(C - 1, R)]))
        filters = _pad(filter_op[:, fold_columns], T, C)
        filters = skew(np.concatenate([filters, _null(R - 1, C)]))
        ofmap = _pad(ofmap_op[np.ix_(fold_rows, fold_columns)], R, C)
        ofmap = skew(np.concatenate([_null(T - 1, C), np.flip(ofmap, 0)]))
    elif dataflow == "ws":
        T = ifmap_op.shape[0]
        ifmap = _pad(ifmap_op[:, fold_rows], T, R)
        ifmap = skew(np.concatenate([_null(R, R), ifmap, _null(C - 1, R)]))
        filters = _pad(filter_op[np.ix_(fold_rows, fold_columns)], R, C)
        filters = np.concatenate([np.flip(filters, 0), _null(R + C + T - 2, C)])
        ofmap = _pad(ofmap_op[:, fold_columns], T, C)
        ofmap = skew(np.concatenate([_null(2 * R - 1, C), ofmap]))
    else:  # "is": fold_rows index reduction groups, fold_columns index output pixels
        T = filter_op.shape[1]
        ifmap = _pad(ifmap_op.T[np.ix_(fold_rows, fold_columns)], R, C)
        ifmap = np.concatenate([np.flip(ifmap, 0), _null(R + C + T - 2, C)])
        filters = _pad(filter_op[fold_rows, :].T, T, R)
        filters = skew(np.concatenate([_null(R, R), filters, _null(C - 1, R)]))
        ofmap = _pad(ofmap_op[fold_columns, :].T, T, C)
        ofmap = skew(np.concatenate([_null(2 * R - 1, C), ofmap]))
    return ifmap, filters, ofmap


def _stream(matrix: np.ndarray, lines: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    """Entries matrix[lines, lanes] per unit, NULL where the line is outside the matrix."""
    inside = (lines >= 0) & (lines < matrix.shape[0])
    return np.where(inside, matrix[np.clip(lines, 0, matrix.shape[0] - 1), lanes], NULL)


def _walk_fold(dataflow, rows, columns, ifmap, filters, groups, N, counts, latency):
    """Run one fold through the array; count products in ``counts[m, n, group]``.

    Returns (units that did a product, cycle of the fold's last product or -1).
    """
    unit_row, unit_column = np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij")
    active = np.zeros((rows, columns), dtype=bool)
    last_product = -1
    if dataflow == "ws":  # weights enter at the top, flipped, and shift down for rows cycles
        stationary = filters[rows - 1 - unit_row, unit_column]
    elif dataflow == "is":
        stationary = ifmap[rows - 1 - unit_row, unit_column]
    for cycle in range(ifmap.shape[0]):
        if dataflow == "os":
            # ifmap enters row r at the left and hops right; filters enter column c at the
            # top and hop down; the skew makes reduction step k meet at cycle k + r + c
            a = _stream(ifmap, cycle - unit_column, unit_row)
            b = _stream(filters, cycle - unit_row, unit_column)
        elif dataflow == "ws":
            a = _stream(ifmap, cycle - unit_column, unit_row)
            b = np.where(a != NULL, stationary, NULL)
            if np.any(a != NULL) and cycle < rows:
                raise AssertionError("ifmap reached a unit before its weight was loaded")
        else:
            b = _stream(filters, cycle - unit_column, unit_row)
            a = np.where(b != NULL, stationary, NULL)
            if np.any(b != NULL) and cycle < rows:
                raise AssertionError("filter reached a unit before its input was loaded")
        meeting = (a != NULL) & (b != NULL)
        if not meeting.any():
            continue
        m, group_a = np.divmod(a[meeting], len(groups))
        group_b, n = np.divmod(b[meeting], N)
        if not np.array_equal(group_a, group_b):
            raise AssertionError(f"cycle {cycle}: operands of different reduction steps met")
        np.add.at(counts, (m, n, group_a), 1)
        active |= meeting
        last_product = cycle
    if last_product > ifmap.shape[0] - latency:
        raise AssertionError("a fold's last product falls after the fold's lines")
    return int(active.sum()), last_product


def walk_layer(
    rows: int,
    columns: int,
    dataflow: str,
    layer: Layer,
    lanes_per_unit: int = 1,
    pipeline_latency: int = 1,
) -> TwinResult:
    """Walk ``layer`` on a rows x columns array the way SCALE-Sim does; see the module doc."""
    groups = reduction_groups(layer, lanes_per_unit)
    M, N, G = layer.M, layer.N, len(groups)
    # Operand address matrices: entry value identifies (m, group), (group, n) or (m, n)
    ifmap_op = np.arange(M * G, dtype=np.int64).reshape(M, G)
    filter_op = np.arange(G * N, dtype=np.int64).reshape(G, N)
    ofmap_op = np.arange(M * N, dtype=np.int64).reshape(M, N)
    if dataflow == "os":
        spatial_rows, spatial_columns = M, N
    elif dataflow == "ws":
        spatial_rows, spatial_columns = G, N
    elif dataflow == "is":
        spatial_rows, spatial_columns = G, M
    else:
        raise ValueError(f"unknown dataflow {dataflow!r}")

    counts = np.zeros((M, N, G), dtype=np.int64)
    ifmap_lines, filter_lines, ofmap_lines = [], [], []
    efficiencies = []
    extra = pipeline_latency - 1
    # SCALE-Sim's loop order: column folds outer, row folds inner
    for fold_columns in _fold_ranges(spatial_columns, columns):
        for fold_rows in _fold_ranges(spatial_rows, rows):
            ifmap, filters, ofmap = _fold_demands(
                dataflow,
                rows,
                columns,
                ifmap_op,
                filter_op,
                ofmap_op,
                np.array(fold_rows),
                np.array(fold_columns),
            )
            # a deeper unit pipeline: operands stop extra cycles earlier than the results land
            ifmap = np.concatenate([ifmap, _null(extra, ifmap.shape[1])])
            filters = np.concatenate([filters, _null(extra, filters.shape[1])])
            ofmap = np.concatenate([_null(extra, ofmap.shape[1]), ofmap])
            if not ifmap.shape[0] == filters.shape[0] == ofmap.shape[0]:
                raise AssertionError("ifmap, filter and ofmap demands out of sync")
            used_units, _ = _walk_fold(
                dataflow, rows, columns, ifmap, filters, groups, N, counts, pipeline_latency
            )
            efficiencies.append(used_units / (rows * columns))
            ifmap_lines.append(ifmap)
            filter_lines.append(filters)
            ofmap_lines.append(ofmap)

    ofmap_demand = np.concatenate(ofmap_lines)
    # SCALE-Sim's memory loop: line i is serviced at cycle i + stalls; with ideal memory
    # there are no stalls, and the layer's cycles are the largest ofmap service cycle.
    stall_cycles = 0
    serviced = [line + stall_cycles for line in range(ofmap_demand.shape[0])]

    # every product (m, n, k) exactly once: expand the groups to reduction indices
    products = np.zeros((M, N, layer.K), dtype=np.int64)
    for group, indices in enumerate(groups):
        products[:, :, indices] += counts[:, :, group][:, :, None]
    if not np.all(products == 1):
        raise AssertionError("some products were computed zero times or more than once")

    return TwinResult(
        compute_cycles=max(serviced),
        demand_lines=ofmap_demand.shape[0],
        folds=len(efficiencies),
        mapping_efficiency=sum(efficiencies) / len(efficiencies),
        products_checked=int(products.sum()),
    )
