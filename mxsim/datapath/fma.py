"""The route for units that are a chain of IEEE fused multiply-adds (``_fma_kernels``): which
units may take it, and its driver.

A unit takes the route when every key's value is one the kernel computes exactly (each key
of ``datapath.schema.SCHEMA`` declares them, ``fma=``: one product a tree, no window, an
accumulator rounding to nearest even with subnormals and IEEE overflow, IEEE's zero signs at
every step, no block scales) and A, B, c, the accumulator and the output share one format
whose codes are a machine float's bit patterns (fp64, fp32): each step is then one
``fma(a_k, b_k, d)`` of the machine. The route also needs this thread to keep subnormals
(checked per call). NaN outputs are the caller's to recompute with the generic kernel (the
unit writes its canonical NaN, the machine a propagated payload).
"""

from __future__ import annotations

import numba
import numpy as np

from .._threads import run_in_threads, subnormals_work
from ..formats import get_format
from ..formats.table import native_float_dtype
from . import _fma_kernels as F
from .schema import DatapathParams, route_accepts


def fma_float_type(params: DatapathParams):
    """The machine float type of the unit's FMA chain, or None where the unit is not one
    the route computes (module docstring)."""
    names = {
        params.a_format,
        params.b_format,
        params.c_format,
        params.accumulator_format,
        params.output_format,
    }
    if len(names) != 1 or not route_accepts("fma", params):
        return None
    return native_float_dtype(get_format(names.pop()))


def _float_types(params: DatapathParams):
    """(the FMA chain's float type, the unsigned integer type of its bit patterns)."""
    float_type = np.dtype(fma_float_type(params))
    return float_type, np.dtype(f"uint{8 * float_type.itemsize}")


def fma_applies(params: DatapathParams) -> bool:
    """Whether this unit and format pair take the FMA route on this thread now."""
    return fma_float_type(params) is not None and subnormals_work()


def fma_matmul(
    params: DatapathParams,
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    out,
    memo: dict | None = None,
):
    """Fill ``out`` (G, M, N) with the output codes of the batch of GEMMs A[g] (M, K) times
    B[g] given as (N, K) codes (unsigned integers as wide as the float: its bit patterns),
    from ``c_values`` (G, M, N) or (1, 1, 1) (values of the format); returns the (groups,
    rows, columns) index arrays of the NaN outputs, which the generic kernel must write. The
    unit takes no scales: ``scales_a`` and ``scales_b`` are not read (the arguments are
    ``window_matmul``'s).

    ``memo``: None, or a dict kept with this B (its codes unchanged from call to call, as
    ``matmul_batched``'s ``b_memo``): B transposed to (G, K, N) floats is kept there under
    "fma" (the size of B's codes) and read by later calls."""
    float_type, bits_type = _float_types(params)
    values_a = np.ascontiguousarray(codes_a, dtype=bits_type).view(float_type)
    columns_b = None if memo is None else memo.get("fma")
    if columns_b is None:
        columns_b = np.ascontiguousarray(np.swapaxes(codes_b, 1, 2), dtype=bits_type).view(
            float_type
        )
        if memo is not None:
            columns_b.setflags(write=False)
            memo["fma"] = columns_b
    c_floats = np.ascontiguousarray(c_values, dtype=float_type)  # exact: values of the format
    results = out.view(float_type)  # (the kernel writes the codes in place)
    n_groups, n_rows = values_a.shape[:2]
    n_tiles = -(-columns_b.shape[2] // F.LANES)
    # Row chunks (of whole row blocks) only as far as it takes to give every thread work.
    blocks = -(-n_rows // F.ROW_BLOCK)
    chunks = min(blocks, max(1, -(-2 * numba.get_num_threads() // max(1, n_groups * n_tiles))))
    rows_per_chunk = F.ROW_BLOCK * -(-blocks // chunks)
    n_chunks = -(-n_rows // rows_per_chunk) if n_rows else 0
    arguments = (values_a, columns_b, c_floats, results, rows_per_chunk)
    run_in_threads(
        lambda start, stop: F.fma_items(*arguments, start, stop), n_groups * n_chunks * n_tiles
    )
    if results.size and np.isnan(results.min()):  # (a minimum propagates NaN: no mask needed)
        return np.nonzero(np.isnan(results))
    return tuple(np.empty(0, dtype=np.intp) for _ in range(3))


def fma_dot(params: DatapathParams, codes_a, codes_b, scales_a, scales_b, c_values, out):
    """Fill ``out`` (n,) with the output codes of row-wise dot products of (n, K) codes from
    ``c_values`` (n,); returns the indices of the NaN outputs, which the generic kernel must
    write (arguments as ``window_dot``'s; the scales are not read)."""
    float_type, bits_type = _float_types(params)
    values_a, values_b = (
        np.ascontiguousarray(codes.T, dtype=bits_type).view(float_type)
        for codes in (codes_a, codes_b)
    )
    results = out.view(float_type)
    c_floats = np.ascontiguousarray(c_values, dtype=float_type)
    chunk = 4096  # rows a work item
    n_rows = results.shape[0]
    run_in_threads(
        lambda start, stop: F.fma_rows(
            values_a, values_b, c_floats, results, start * chunk, min(stop * chunk, n_rows)
        ),
        -(-n_rows // chunk),
    )
    return np.flatnonzero(np.isnan(results))
