"""The route for units each of whose steps is binary32 or binary64 arithmetic of the machine
rounded into an fp32 accumulator (``_fp32_steps_kernels``): which units may take it, and its
driver.

A unit takes the route when every key's value is one the kernel computes exactly (each key
of ``datapath.schema.SCHEMA`` declares them, ``fp32_steps=``: an fp32 accumulator rounding
to nearest even, an fp32 output, c entering first, no block scales; and either
``adder.structure: pairwise_rounded`` or exact trees whose accumulator keeps subnormals and
whose exact zero sums are +0) and its element formats, each with a table of every code,
hold binary32 values; pairwise units also need their products exact in binary32 (at most
24 significant bits: fp16, bf16, tf32, the FP8 and smaller formats; not fp32).

Pairwise: each add is one binary32 addition of the machine. The unit's rounding of each
product into fp32 is the identity where the product is a normal binary32 value: a unit that
flushes subnormals checks, per output, that the least nonzero magnitudes of its row of A
and its column of B multiply to at least 2^-126, and leaves the outputs where they do not to
the generic kernel; products that overflow give ±Inf either way. Exact trees: the products'
binary64 sums checked exact, the accumulator joined rounded to odd, then one conversion to
binary32 (``_fp32_steps_kernels``).

The route also needs this thread to keep subnormals (checked per call), and leaves to the
generic kernel every output that is not finite, every one where a step was not exact or a
pairwise add's result was subnormal in a unit whose accumulator flushes them, and every
subnormal one where the output flushes them (the kernel flags those).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from .._threads import run_in_threads, subnormals_work
from ..formats import get_format
from . import _fp32_steps_kernels as P
from .schema import DatapathParams, route_accepts
from .tables import element_tables

SMALLEST_NORMAL = 2.0**-126


def _binary32_formats(params: DatapathParams) -> bool:
    """Whether every value of both element formats is a binary32 value and, for a pairwise
    unit, every product of an A and a B value has at most 24 significant bits (exact in
    binary32 where in range; binary64 holds every product of binary32 values)."""
    formats = get_format(params.a_format), get_format(params.b_format)
    pairwise = params.structure == "pairwise_rounded"
    if pairwise and sum(fmt.mantissa_bits + 1 for fmt in formats) > 24:
        return False
    return all(
        fmt.mantissa_bits <= 23
        and (fmt.min_subnormal >= 2.0**-149 and fmt.max_finite < 2.0**128)
        and fmt.field_bits <= 20
        for fmt in formats
    )


def fp32_steps_apply(params: DatapathParams) -> bool:
    """Whether this unit and format pair take the fp32-steps route on this thread now."""
    return route_accepts("fp32_steps", params) and _binary32_formats(params) and subnormals_work()


@functools.lru_cache(maxsize=None)
def _value_table(name: str, subnormals: bool, positive_zeros: bool) -> np.ndarray:
    """The binary32 value of every field code (the codes the routes get) of a format as the
    unit reads it: subnormals read as zeros of their sign without ``subnormals``, every zero
    +0 with ``positive_zeros``."""
    values = element_tables(get_format(name), subnormals)[0].astype(np.float32)
    if positive_zeros:
        values = np.where(values == 0, np.float32(0.0), values)
    values.setflags(write=False)
    return values


def _least_magnitudes(values: np.ndarray, axis: int) -> np.ndarray:
    """float64: the least nonzero magnitude of (G, ., .) binary32 values along ``axis`` (K's:
    2 for A's rows, 1 for B's columns), +Inf where all are zero."""
    magnitudes = np.abs(values)
    magnitudes[magnitudes == 0] = np.inf
    return magnitudes.min(axis=axis, initial=np.inf).astype(np.float64)


def _products_may_be_subnormal(params: DatapathParams) -> bool:
    """Whether a product of two nonzero elements, as the unit reads them, may lie below
    2^-126 (only then does a flushing unit's product rounding differ from the identity)."""
    least = [
        get_format(name).min_normal
        if not params.input_subnormals
        else get_format(name).min_subnormal
        for name in (params.a_format, params.b_format)
    ]
    return least[0] * least[1] < SMALLEST_NORMAL


def _accumulator_starts(params: DatapathParams, c_values) -> np.ndarray:
    """c rounded into the fp32 accumulator as the unit enters it: exact (c's format is a
    binary32 format), a subnormal c flushed to a zero of its sign without
    ``accumulator.subnormals``, then +0 for every zero with ``inputs.zero_sign: positive``."""
    starts = np.array(c_values, dtype=np.float32)
    if not params.accumulator_subnormals:
        tiny = (starts != 0) & (np.abs(starts) < np.float32(SMALLEST_NORMAL))
        starts[tiny] = np.copysign(np.float32(0.0), starts[tiny])
    if params.input_zero_sign == "positive":
        starts[starts == 0] = np.float32(0.0)
    return starts


def fp32_steps_matmul(
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
    B[g] given as (N, K) codes, from ``c_values`` (G, M, N) or (1, 1, 1) (values of c's
    format); returns the (groups, rows, columns) index arrays of the outputs the generic
    kernel must write (module docstring). The unit takes no scales: ``scales_a`` and
    ``scales_b`` are not read (the arguments are ``window_matmul``'s).

    ``memo``: None, or a dict kept with this B (its codes unchanged from call to call, as
    ``matmul_batched``'s ``b_memo``): B's values transposed to (G, K, N) are kept there
    under "fp32 steps" (and, where a flushing unit's products are checked, its columns'
    least magnitudes under "fp32 steps least") and read by later calls."""
    zeros_positive = params.input_zero_sign == "positive"
    table_a = _value_table(params.a_format, params.input_subnormals, zeros_positive)
    values_a = table_a[codes_a]
    columns_b = None if memo is None else memo.get("fp32 steps")
    if columns_b is None:
        table_b = _value_table(params.b_format, params.input_subnormals, zeros_positive)
        columns_b = np.ascontiguousarray(np.swapaxes(table_b[codes_b], 1, 2))
        if memo is not None:
            columns_b.setflags(write=False)
            memo["fp32 steps"] = columns_b
    starts = _accumulator_starts(params, c_values)
    results = out.view(np.float32)  # (the kernel writes the codes in place)
    bad = np.empty(results.shape, dtype=np.uint8)
    n_groups, n_rows = values_a.shape[:2]
    n_tiles = -(-columns_b.shape[2] // P.LANES)
    blocks = -(-n_rows // P.ROW_BLOCK)
    chunks = min(blocks, max(1, -(-2 * numba.get_num_threads() // max(1, n_groups * n_tiles))))
    rows_per_chunk = P.ROW_BLOCK * -(-blocks // chunks) if blocks else P.ROW_BLOCK
    n_chunks = -(-n_rows // rows_per_chunk) if n_rows else 0
    exact = params.structure != "pairwise_rounded"
    flush = not params.accumulator_subnormals
    flush_output = not params.output_subnormals
    arguments = (values_a, columns_b, starts, params.fused_terms, exact, flush, flush_output)
    run_in_threads(
        lambda start, stop: P.steps_items(*arguments, results, bad, rows_per_chunk, start, stop),
        n_groups * n_chunks * n_tiles,
    )
    if flush and not exact and _products_may_be_subnormal(params):
        least_a = _least_magnitudes(values_a, 2)
        least_b = None if memo is None else memo.get("fp32 steps least")
        if least_b is None:
            least_b = _least_magnitudes(columns_b, 1)
            if memo is not None:
                memo["fp32 steps least"] = least_b
        bad |= least_a[:, :, None] * least_b[:, None, :] < SMALLEST_NORMAL
    if params.output_zero_sign == "positive":
        results[results == 0] = np.float32(0.0)
    if not bad.any():
        return tuple(np.empty(0, dtype=np.intp) for _ in range(3))
    return np.nonzero(bad)


def fp32_steps_dot(params: DatapathParams, codes_a, codes_b, scales_a, scales_b, c_values, out):
    """Fill ``out`` (n,) with the output codes of row-wise dot products of (n, K) codes from
    ``c_values`` (n,); returns the indices of the outputs the generic kernel must write
    (arguments as ``window_dot``'s; the scales are not read): a batch of n GEMMs of one
    output each."""
    n_rows, length = codes_a.shape
    rows, _, _ = fp32_steps_matmul(
        params,
        codes_a.reshape(n_rows, 1, length),
        codes_b.reshape(n_rows, 1, length),
        scales_a,
        scales_b,
        np.asarray(c_values).reshape(n_rows, 1, 1),
        out.reshape(n_rows, 1, 1),
    )
    return rows
