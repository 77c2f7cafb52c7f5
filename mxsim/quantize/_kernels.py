"""Numba kernels for MX block quantization: shared exponents, element codes, dequantize."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .._compile import NO_REFCOUNTS

from ..formats._kernels import ROUND_STOCHASTIC, decompose, encode_bits, encode_finite, random32

RULE_FLOOR = 0
RULE_CEIL = 1
RULE_EVEN = 2
RULE_RCEIL = 3

NONFINITE_NAN_BLOCK = 0
NONFINITE_PROPAGATE = 1
NONFINITE_INF_SCALE_MAX = 2
NONFINITE_INF_FIELD = 3

SOURCE_EXACT = 0
SOURCE_FIELD = 1
SOURCE_LOG2 = 2

UNDERFLOW_CLAMP = 0
UNDERFLOW_UNCLAMPED = 1
UNDERFLOW_UNCLAMPED_EPS = 2

# Shared-exponent value standing for a NaN scale (E8M0 code 0xFF).
SCALE_NAN = np.int32(1 << 20)
# "No such exponent" for the optional exponent parameters of quantize_blocks.
NO_EXPONENT = np.int64(-(1 << 30))
E8M0_MIN_EXPONENT = -127
E8M0_MAX_EXPONENT = 127
# Elements whose table indexes quantize_blocks computes at a time (its ``entries`` scratch):
# a block of 32 at once, a per-tensor block of millions in runs.
ENTRY_RUN = 256


@njit(cache=True, **NO_REFCOUNTS)
def shared_exponent(
    amax_bits,
    in_exponent_bits,
    in_mantissa_bits,
    rule,
    source,
    emax,
    top_fraction_bits,
    max_ratio_q52,
):
    """X = E - emax for a nonzero finite amax, E chosen by ``rule`` from amax's exact bits.

    With amax = m * 2^e, m in [1, 2) held as the 53-bit integer m * 2^52:
    floor: E = e; ceil: +1 iff m > 1; even: +1 iff m >= 2 - 2^-(p+1);
    rceil: +1 iff m > max_finite / 2^emax (given as ``max_ratio_q52`` = that ratio * 2^52).
    ``source`` SOURCE_FIELD reads a subnormal amax as the input's smallest exponent field
    (e = -bias, e.g. -127 for float32); SOURCE_LOG2 computes floor/ceil from log2(amax)
    rounded to the input's precision (float32 inputs: float32), as float-log2 libraries do,
    and rceil as ceil(log2(amax / max_finite)) with the quotient and the log2 each rounded
    to that precision.
    """
    _, _, significand, lsb_exponent, floor_log2 = decompose(
        amax_bits, in_exponent_bits, in_mantissa_bits
    )
    if source == SOURCE_LOG2:
        value = math.ldexp(float(significand), lsb_exponent)
        if rule == RULE_RCEIL:
            # max_finite = max_ratio_q52 * 2^(emax - 52), exact in float64.
            value = value / math.ldexp(float(max_ratio_q52), emax - 52)
            if in_mantissa_bits <= 23:
                value = float(np.float32(value))
        if value == 0.0:
            return np.int64(-150)  # log2(0) = -inf: one below any float32's exponent
        log2_value = math.log2(value)
        if in_mantissa_bits <= 23:
            log2_value = float(np.float32(log2_value))
        if rule == RULE_RCEIL:
            return np.int64(math.ceil(log2_value))
        if rule == RULE_FLOOR or rule == RULE_CEIL:
            rounded = math.floor(log2_value) if rule == RULE_FLOOR else math.ceil(log2_value)
            return np.int64(rounded) - emax
    input_bias = (1 << (in_exponent_bits - 1)) - 1
    if source == SOURCE_FIELD and floor_log2 < 1 - input_bias:
        return np.int64(-input_bias) - emax
    m_q52 = significand << (52 - (floor_log2 - lsb_exponent))
    bump = False
    if rule == RULE_CEIL:
        bump = m_q52 != (np.int64(1) << 52)
    elif rule == RULE_EVEN:
        bump = m_q52 >= (np.int64(1) << 53) - (np.int64(1) << (51 - top_fraction_bits))
    elif rule == RULE_RCEIL:
        bump = m_q52 > max_ratio_q52
    return floor_log2 + (1 if bump else 0) - emax


@njit(cache=True)
def encode_table(params, rounding, overflow, low, top_bits, table):
    """Fill ``table`` with the code of every class of nonzero value the table path of
    :func:`quantize_blocks` tells apart: entry ((sign * n + e - low) << (top_bits + 1)) |
    (top << 1) | sticky, for e in [low, low + n), is the code of (-1)^sign * (2^top_bits + top
    + sticky / 2) * 2^(e - top_bits) (``encode_finite``, deterministic roundings), n =
    table.size / 2^(top_bits + 2). Every value whose leading bit is at e, whose next top_bits
    bits are ``top`` and whose lower bits are nonzero iff ``sticky`` has the same code when
    the rounding point of the format lies at most top_bits - 1 bits below the leading bit
    (``_table_shape`` in ``quantize.mx``), as its quotient, round bit and sticky bit are the
    same."""
    n_exponents = table.size >> (top_bits + 2)
    for sign in range(2):
        for index in range(n_exponents):
            e = np.int64(low + index)
            for top in range(1 << top_bits):
                for sticky in range(2):
                    significand = (((np.int64(1) << top_bits) | top) << 1) | sticky
                    entry = ((sign * n_exponents + index) << (top_bits + 1)) | (top << 1) | sticky
                    table[entry] = encode_finite(
                        np.int64(sign),
                        significand,
                        e - top_bits - 1,
                        e,
                        params,
                        rounding,
                        overflow,
                        np.int64(0),
                    )


@njit(cache=True, nogil=True, **NO_REFCOUNTS)
def quantize_blocks(
    bits,
    in_exponent_bits,
    in_mantissa_bits,
    element_params,
    rule,
    source,
    emax,
    top_fraction_bits,
    max_ratio_q52,
    rounding,
    overflow,
    nonfinite,
    underflow,
    clamp_high,
    min_exponent,
    min_scale_element_exponent,
    fixed_exponent,
    seed,
    table,
    table_low,
    table_high,
    table_top_bits,
    codes_out,
    scale_exponents_out,
    entries,
    start,
    stop,
):
    """Quantize blocks ``start`` to ``stop`` of a (blocks, block_size) array of IEEE-binary
    bit patterns (callers cut the blocks into chunks for threads: ``_threads.run_in_threads``;
    the results do not depend on the cut).

    Writes element codes and each block's shared exponent X (SCALE_NAN for a NaN scale;
    below -127 only for the unclamped underflow policies). X is raised to ``min_exponent``
    (NO_EXPONENT: no floor). Element j of block b is encoded from x * 2^-X exactly, with
    stochastic draw index b * block_size + j, except that blocks with X == -127 encode
    x * 2^-``min_scale_element_exponent`` when that is not NO_EXPONENT.
    For the even rule, an amax that rounds past the input format's largest binade (to its
    Inf pattern) counts as an Inf in the block, unless ``nonfinite`` is propagate.

    A nonempty ``table`` (from :func:`encode_table`, for exponents ``table_low`` to
    ``table_high`` and ``table_top_bits`` bits below the leading one) encodes the normal
    inputs: the scaled value's exponent, clamped to that range (below it every value rounds
    as at ``table_low``, above it every value overflows), its top bits and whether any bit
    below them is set index the code; ±0 takes the code ``encode_bits`` gives it (at any
    scale), worked out once. Subnormal and non-finite inputs, and every input when the table
    is empty, go through ``encode_bits``. ``entries``: int64 scratch of up to
    :data:`ENTRY_RUN` elements (the table indexes of a run of a block's elements).

    ``fixed_exponent`` (NO_EXPONENT: none): every block's X is that, given rather than
    chosen: a cast at a given scale, each element x * 2^-X rounded once as above (non-finite
    elements each through ``encode_bits``: no NaN blocks, no scale rule or floor).
    """
    block_size = bits.shape[1]
    total_bits = 1 + in_exponent_bits + in_mantissa_bits
    magnitude_mask = (np.uint64(1) << np.uint64(total_bits - 1)) - np.uint64(1)
    inf_bits = np.uint64((1 << in_exponent_bits) - 1) << np.uint64(in_mantissa_bits)
    # The even rule adds half a unit of the element precision to amax's bits (then drops the
    # fraction): reaching inf_bits means the rounded amax is Inf.
    input_bias = np.int64((1 << (in_exponent_bits - 1)) - 1)
    field_mask = np.uint64((1 << in_exponent_bits) - 1)
    top_shift = np.uint64(max(in_mantissa_bits - table_top_bits, 0))
    top_mask = np.uint64((1 << table_top_bits) - 1)
    sticky_mask = (np.uint64(1) << top_shift) - np.uint64(1)
    sign_shift = np.uint64(total_bits - 1)
    n_table_exponents = np.int64(table_high - table_low + 1)
    last_table_exponent = n_table_exponents - 1
    entry_shift = np.int64(table_top_bits + 1)
    mantissa_shift = np.uint64(in_mantissa_bits)
    field_top = np.int64(field_mask)
    use_table = table.size > 0 and rounding != ROUND_STOCHASTIC
    # The codes of +0 and -0 (a zero's code does not depend on the scale).
    zero_codes = (
        encode_bits(
            np.uint64(0),
            in_exponent_bits,
            in_mantissa_bits,
            np.int64(0),
            element_params,
            rounding,
            overflow,
            np.int64(0),
        ),
        encode_bits(
            np.uint64(1) << sign_shift,
            in_exponent_bits,
            in_mantissa_bits,
            np.int64(0),
            element_params,
            rounding,
            overflow,
            np.int64(0),
        ),
    )
    even_half_step = np.uint64(0)
    if rule == RULE_EVEN and in_mantissa_bits > top_fraction_bits:
        even_half_step = np.uint64(1) << np.uint64(in_mantissa_bits - top_fraction_bits - 1)
    for b in range(start, stop):
        if fixed_exponent != NO_EXPONENT:  # a cast at a given scale: every element as it is
            exponent = fixed_exponent
        else:
            # The largest magnitude pattern, branch-free (vectorized); only a block holding a
            # NaN or Inf pattern needs the finite amax and the flags, looked for again.
            amax = np.uint64(0)
            for j in range(block_size):
                amax = max(amax, np.uint64(bits[b, j]) & magnitude_mask)
            nan_seen = False
            inf_seen = False
            if amax >= inf_bits:
                amax = np.uint64(0)
                for j in range(block_size):
                    magnitude = np.uint64(bits[b, j]) & magnitude_mask
                    if magnitude > inf_bits:
                        nan_seen = True
                    elif magnitude == inf_bits:
                        inf_seen = True
                    elif magnitude > amax:
                        amax = magnitude
            if (
                even_half_step != 0
                and nonfinite != NONFINITE_PROPAGATE
                and amax + even_half_step >= inf_bits
            ):
                inf_seen = True
            if (nan_seen and nonfinite != NONFINITE_PROPAGATE) or (
                inf_seen and nonfinite == NONFINITE_NAN_BLOCK
            ):
                scale_exponents_out[b] = SCALE_NAN
                for j in range(block_size):
                    codes_out[b, j] = 0
                continue
            if inf_seen and nonfinite == NONFINITE_INF_SCALE_MAX:
                exponent = np.int64(E8M0_MAX_EXPONENT)  # log2(Inf) clamped to the top scale
            elif inf_seen and nonfinite == NONFINITE_INF_FIELD:
                exponent = (
                    np.int64(1 << (in_exponent_bits - 1)) - emax
                )  # Inf's exponent field read as a binade
            elif amax == 0:
                exponent = np.int64(E8M0_MIN_EXPONENT)
            else:
                exponent = shared_exponent(
                    amax,
                    in_exponent_bits,
                    in_mantissa_bits,
                    rule,
                    source,
                    emax,
                    top_fraction_bits,
                    max_ratio_q52,
                )
            if underflow == UNDERFLOW_CLAMP and exponent < E8M0_MIN_EXPONENT:
                exponent = np.int64(E8M0_MIN_EXPONENT)
            elif underflow == UNDERFLOW_UNCLAMPED_EPS and exponent < -149:
                exponent = np.int64(-23)  # 2^X underflows float32 to 0: float32's eps
            if exponent < min_exponent:
                exponent = min_exponent
            if exponent > E8M0_MAX_EXPONENT:
                if not clamp_high:
                    scale_exponents_out[b] = SCALE_NAN
                    for j in range(block_size):
                        codes_out[b, j] = 0
                    continue
                exponent = E8M0_MAX_EXPONENT
        scale_exponents_out[b] = exponent
        element_exponent = exponent
        if (
            exponent == E8M0_MIN_EXPONENT
            and min_scale_element_exponent != NO_EXPONENT
            and fixed_exponent == NO_EXPONENT
        ):
            element_exponent = min_scale_element_exponent
        if use_table:
            # The table's exponent index of a normal input is its field plus this, clamped.
            offset = -input_bias - element_exponent - table_low
            # Every element through the table, branch-free (its index is in range for any
            # field); zero, subnormal and non-finite inputs are counted and recoded below.
            # The indexes of a run of elements first (a loop that vectorises), then their
            # lookups (one load each).
            specials = np.int64(0)
            for first in range(0, block_size, entries.size):
                run = min(entries.size, block_size - first)
                values, codes = bits[b, first : first + run], codes_out[b, first : first + run]
                for i in range(run):
                    value = np.uint64(values[i])
                    field = np.int64((value >> mantissa_shift) & field_mask)
                    e = min(max(field + offset, np.int64(0)), last_table_exponent)
                    entries[i] = (
                        ((np.int64(value >> sign_shift) * n_table_exponents + e) << entry_shift)
                        | np.int64(((value >> top_shift) & top_mask) << np.uint64(1))
                        | np.int64((value & sticky_mask) != np.uint64(0))
                    )
                    specials += np.int64(field == 0) | np.int64(field == field_top)
                for i in range(run):
                    codes[i] = table[entries[i]]
            if specials == 0:
                continue
            for j in range(block_size):
                value = np.uint64(bits[b, j])
                field = np.int64((value >> mantissa_shift) & field_mask)
                if field != 0 and field != field_top:
                    continue
                if (value & magnitude_mask) == np.uint64(0):  # ±0 codes alike at any scale
                    codes_out[b, j] = zero_codes[1] if value >> sign_shift else zero_codes[0]
                else:  # subnormal and non-finite inputs (deterministic rounding: no draw)
                    codes_out[b, j] = encode_bits(
                        value,
                        in_exponent_bits,
                        in_mantissa_bits,
                        -element_exponent,
                        element_params,
                        rounding,
                        overflow,
                        np.int64(0),
                    )
            continue
        for j in range(block_size):
            value = np.uint64(bits[b, j])
            draw32 = (
                random32(seed, b * block_size + j) if rounding == ROUND_STOCHASTIC else np.int64(0)
            )
            codes_out[b, j] = encode_bits(
                value,
                in_exponent_bits,
                in_mantissa_bits,
                -element_exponent,
                element_params,
                rounding,
                overflow,
                draw32,
            )


@njit(cache=True, nogil=True, **NO_REFCOUNTS)
def e8m0_exponents(codes, bias, nan_code, out):
    """out[i] = codes[i] - ``bias`` (int32), or ``SCALE_NAN`` where codes[i] is
    ``nan_code``: the unbiased exponents of E8M0 scale codes (flat arrays)."""
    for i in range(codes.size):
        code = np.int32(codes[i])
        out[i] = SCALE_NAN if code == nan_code else code - np.int32(bias)


@njit(cache=True, nogil=True, **NO_REFCOUNTS)
def dequantize_blocks(codes, scale_exponents, decode_table, out, start, stop):
    """out[b, j] = decode_table[codes[b, j]] * 2^X_b for blocks b in [start, stop) (exact in
    float64, then rounded to nearest even once when ``out`` is float32); NaN for NaN scales."""
    block_size = codes.shape[1]
    for b in range(start, stop):
        exponent = scale_exponents[b]
        if exponent == SCALE_NAN:
            for j in range(block_size):
                out[b, j] = np.nan
            continue
        scale = math.ldexp(1.0, exponent)
        for j in range(block_size):
            out[b, j] = decode_table[codes[b, j]] * scale
