"""Plain-text table of a :class:`~mxsim.cycles.estimate.TraceEstimate`."""

from __future__ import annotations

from mxsim.cycles.estimate import TraceEstimate

_HEADERS = (
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
    "element B",
    "scale B",
    "psum B",
)


def _row(name, M, N, K, folds, compute, memory, total, bound, utilisation, elements, scales, psums):
    return [
        str(name),
        str(M),
        str(N),
        str(K),
        str(folds),
        str(compute),
        str(memory),
        str(total),
        bound,
        f"{100 * utilisation:.1f}",
        str(elements),
        str(scales),
        str(psums),
    ]


def format_table(trace: TraceEstimate) -> str:
    """One line per layer and a totals line: shape, folds, cycles, bound, utilisation, bytes.

    Cycles are clock cycles, bytes are off-chip bytes (elements, scale metadata, spilled
    partial sums). The first line states the array.
    """
    array = trace.array
    rows = [list(_HEADERS)]
    for layer in trace.layers:
        rows.append(
            _row(
                layer.name,
                layer.M,
                layer.N,
                layer.K,
                layer.schedule.folds,
                layer.compute_cycles,
                layer.memory_cycles,
                layer.total_cycles,
                layer.bound,
                layer.utilisation,
                layer.traffic.element_bytes,
                layer.traffic.scale_bytes,
                layer.traffic.partial_sum_bytes,
            )
        )
    rows.append(
        _row(
            "total",
            "",
            "",
            "",
            sum(layer.schedule.folds for layer in trace.layers),
            trace.compute_cycles,
            trace.memory_cycles,
            trace.total_cycles,
            "",
            trace.utilisation,
            trace.element_bytes,
            trace.scale_bytes,
            trace.partial_sum_bytes,
        )
    )
    widths = [max(len(row[column]) for row in rows) for column in range(len(_HEADERS))]

    def line(row):
        # layer names left-aligned, numbers right-aligned
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        return "  ".join(cells).rstrip()

    title = (
        f"array {array.rows}x{array.columns}, {array.lanes_per_unit} lane(s)/unit, "
        f"dataflow {array.dataflow}, {array.offchip_bytes_per_cycle:g} B/cycle off chip, "
        f"{trace.seconds * 1e3:.6g} ms at {array.clock_mhz:g} MHz"
    )
    separator = "  ".join("-" * width for width in widths)
    body = [line(row) for row in rows]
    return "\n".join([title, body[0], separator, *body[1:-1], separator, body[-1]]) + "\n"
