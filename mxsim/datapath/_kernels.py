"""Numba kernels of the generic MX dot-product datapath.

One dot product at a time (``dot_one``), driven over a batch of GEMMs by the kernel
:func:`matmul_rows` returns (on threads: ``datapath.api.matmul_groups``; row-wise dot products
are GEMMs of one row each). Each kernel is compiled for one set of feature bits
(:func:`kernel_features`: the stages a unit and operand pair can reach), as constants, so a
unit's first use compiles only its own stages. ``dot_one`` runs the stages of
docs/hwconfig.md, one small function each:

- steps 1-3, decode, multiply, order and trees: :func:`uniform_tree_terms` (one pass for the
  common unit) or :func:`tree_terms` (any order, per-element scales, specials), each product
  from :func:`multiply`; :func:`group_tree_terms` for ``scales: group_sum`` (one term per
  scaled group sum);
- step 4, align: :func:`align_and_add` places the window, :func:`keep_in_window` drops the
  bits below it; an exact tree's terms are summed by :func:`exact_tree_sum` (an exact
  accumulator's kernel compiles no window stage);
- step 5, add, normalise, round: :func:`adder_register`, then :func:`accumulate` (the tree
  sum rounded to ``sum_significant_bits``, added to the accumulator, rounded into it);
- step 6, accumulate: :func:`start_accumulator`, :func:`accumulate`, :func:`promote`,
  :func:`finish_accumulator` (c at the end, the last promotion);
- step 7, output: :func:`output_value`;
- the matrix-core adders: :func:`parity_tree_sum` (``parity_windows``), :func:`second_alignment`
  (``second_alignment_bits``, in place of :func:`accumulate`), and :func:`pairwise_dot` (a whole
  dot product of ``structure: pairwise_rounded``, its adds by :func:`rounded_add`).

Parameters arrive as the kernel record, a one-element structured array whose dtype
``datapath.schema.record_dtype`` derives from the schema (fields named after the keys:
``cfg.block_size``, ``cfg.align_fraction_bits``, ..., null stored as -1), plus the order array
and the kernel_params vectors of the accumulator, the n-bit tree-sum format, the output and
fp32, and those of the A and B element formats. Element values come from per-code tables
(float64 value, int64 alignment exponent), or, for formats given empty tables (fp32, fp64:
no table of every code), from the code's bit fields (:func:`element`). Where every product of
the two formats times a power-of-two scale is exact in float64 (:func:`products_fit_float64`),
products are float64 terms; otherwise (fp64 operands: 106-bit products) each product goes
exactly into the limbs (:func:`wide_tree_into_limbs`), which the config allows only for exact
trees. Every intermediate value is held as a float64 that is exactly a value of its format;
exact sums go through ``_limbs``. The slow reference twin is ``datapath.reference``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from .._compile import STAGE, generic_calls

from ..formats._kernels import (
    OVERFLOW_INF_NAN,
    P_BIAS,
    P_EMAX,
    P_EXPONENT_BITS,
    P_MANTISSA_BITS,
    round_up,
    power_of_two,
    scale_by_power_of_two,
    ROUND_NEAREST_EVEN,
    ROUND_TOWARD_NEGATIVE,
    decode_code,
    decompose,
    encode_bits,
    encode_finite,
)
from ..quantize._kernels import SCALE_NAN
from .schema import NO_PRODUCT_OVERFLOW, NO_SPECIAL_ACCUMULATOR_EXPONENT, NO_ZERO_TERM_EXPONENT
from ._limbs import (
    N_LIMBS,
    limbs_add_float,
    limbs_add_integer,
    limbs_add_product,
    limbs_clear,
    limbs_round,
)
from .tables import ZERO_EXPONENT

# Codes of the record's choice fields: a choice's position in its key's list in the schema.
SCALES_NONE, SCALES_PRODUCTS, SCALES_BLOCK_SUM, SCALES_GROUP_SUM = 0, 1, 2, 3  # inputs.scales
BELOW_TRUNCATE, BELOW_FLOOR, BELOW_NEAREST_EVEN, BELOW_STICKY = 0, 1, 2, 3  # adder.below_window
ZERO_SIGN_IEEE, ZERO_SIGN_POSITIVE, ZERO_SIGN_EXACT_POSITIVE, ZERO_SIGN_IEEE_STEPS = (
    0,
    1,
    2,
    3,
)  # output.zero_sign
EXACT_TREE_BITS = (
    58  # an exact tree's terms are summed as int64 when they fit this many bits below the largest
)


@njit(cache=True, inline="always")
def floor_log2(value):
    """floor(log2|value|) of a nonzero finite float64, from its bits."""
    _, _, _, _, result = decompose(np.float64(value).view(np.uint64), 11, 52)
    return result


@generic_calls
@njit(cache=True, **STAGE)
def flush_subnormal(value, params, subnormals):
    """``value`` or, when subnormals are off and |value| is below the smallest normal, ±0."""
    if subnormals or value == 0.0 or not math.isfinite(value):
        return value
    if abs(value) < power_of_two(1 - params[P_BIAS]):
        return math.copysign(0.0, value)
    return value


@generic_calls
@njit(cache=True, **STAGE)
def round_float(value, params, rounding, subnormals, overflow):
    """``value`` rounded once into the format ``params`` (overflow: a formats overflow policy), as float64."""
    if value == 0.0 or not math.isfinite(value):
        return value
    value_class, sign, significand, lsb_exponent, leading = decompose(
        np.float64(value).view(np.uint64), 11, 52
    )
    code = encode_finite(sign, significand, lsb_exponent, leading, params, rounding, overflow, 0)
    return flush_subnormal(decode_code(code, params), params, subnormals)


@generic_calls
@njit(cache=True, **STAGE)
def round_limbs(limbs, bounds, params, rounding, subnormals, overflow):
    """The exact sum held in the limbs rounded into ``params``; +0 for an exact zero."""
    code, is_zero = limbs_round(limbs, bounds, params, rounding, overflow)
    if is_zero:
        return 0.0
    return flush_subnormal(decode_code(code, params), params, subnormals)


@generic_calls
@njit(cache=True, **STAGE)
def add_round(x, y, params, rounding, subnormals, overflow, limbs, bounds):
    """x + y (finite float64s) computed exactly, rounded once into ``params``."""
    limbs_clear(limbs, bounds)
    limbs_add_float(limbs, bounds, x)
    limbs_add_float(limbs, bounds, y)
    result = round_limbs(limbs, bounds, params, rounding, subnormals, overflow)
    limbs_clear(limbs, bounds)
    return result


@njit(cache=True, inline="always")
def note_overflow(special, value):
    """The running special value after an overflow to ``value``: an earlier NaN/Inf (an input,
    or a first overflow) absorbs it, as an infinite accumulator absorbs any finite sum."""
    if special == 0.0:
        return value
    return special


@njit(cache=True, inline="always")
def adder_register(total, width, saturate):
    """``total`` as a ``width``-bit signed adder register holds it: wrapped or saturated."""
    limit = np.int64(1) << (width - 1)
    if -limit <= total < limit:
        return total
    if saturate:
        return limit - 1 if total > 0 else -limit
    return ((total + limit) & ((limit << 1) - 1)) - limit


@njit(cache=True, inline="always")
def _bit_length(value):
    """Number of bits of a positive int64 (its leading one's index + 1)."""
    # float() may round up to the next power of two: correct with an integer comparison.
    exponent = (
        np.int64((np.float64(value).view(np.uint64) >> np.uint64(52)) & np.uint64(0x7FF)) - 1022
    )
    if exponent > 0 and (np.int64(1) << (exponent - 1)) > value:
        exponent -= 1
    return exponent


@generic_calls
@njit(cache=True, **STAGE)
def round_integer(total, lsb_exponent, params, rounding, subnormals, overflow):
    """total * 2^lsb_exponent (int64 total) rounded once into ``params``; +0 for zero."""
    if total == 0:
        return 0.0
    magnitude = abs(total)
    bits = _bit_length(magnitude)
    leading = lsb_exponent + bits - 1
    precision = params[P_MANTISSA_BITS] + 1
    if (
        params[P_EXPONENT_BITS] > 0
        and precision > 1
        and 1 - params[P_BIAS] <= leading < params[P_EMAX]
    ):
        # Normal range, no overflow possible: round the integer directly (the common case).
        # (With one significant bit the code's last bit, which ties to even, is the exponent's.)
        shift = bits - precision
        if shift > 0:
            quotient = magnitude >> shift
            remainder = magnitude - (quotient << shift)
            half = np.int64(1) << (shift - 1)
            if round_up(
                rounding,
                1 if total < 0 else 0,
                quotient & 1,
                remainder < half,
                remainder == half,
                remainder != 0,
                np.int64(0),
                np.int64(0),
            ):
                quotient += 1
            magnitude = quotient
            lsb_exponent += shift
        value = scale_by_power_of_two(float(magnitude), lsb_exponent)
        return -value if total < 0 else value
    code = encode_finite(
        1 if total < 0 else 0, magnitude, lsb_exponent, leading, params, rounding, overflow, 0
    )
    return flush_subnormal(decode_code(code, params), params, subnormals)


@njit(cache=True, inline="always")
def truncate_significand(value, fraction_bits):
    """``value`` with its significand truncated toward zero to 1 + fraction_bits bits."""
    mantissa, exponent = math.frexp(value)
    scale = math.ldexp(1.0, fraction_bits + 1)
    return math.ldexp(math.trunc(mantissa * scale) / scale, exponent)


# --- steps 5-6 with a fixed-point grid ----------------------------------------------------------


@njit(cache=True, inline="always")
def grid_lsb_offset(acc, scale_exponent, cfg, acc_params):
    """How many places the accumulator's LSB lies above the grid's LSB (negative: below).
    The accumulator's exponent is its format's emin when subnormal, emin - 1 when zero (the
    exponent field read as is, plus one for a subnormal, minus the bias)."""
    emin = 1 - acc_params[P_BIAS]
    exponent = emin - 1 if acc == 0.0 else max(floor_log2(acc), emin)
    return (exponent - acc_params[P_MANTISSA_BITS]) - (scale_exponent - cfg.grid_fraction_bits)


@njit(cache=True, inline="always")
def round_into_accumulator(limbs, bounds, acc_params, cfg):
    """The limbs' exact value rounded into the accumulator format (the unit's accumulator
    rounding, subnormals and overflow rule); the limbs are cleared."""
    result = round_limbs(
        limbs,
        bounds,
        acc_params,
        cfg.accumulator_rounding,
        cfg.accumulator_subnormals,
        cfg.accumulator_overflow,
    )
    limbs_clear(limbs, bounds)
    return result


@njit(cache=True, **STAGE)
def grid_accumulate(acc, terms, count, scale_exponent, cfg, acc_params, limbs, bounds):
    """Steps 5-6 with ``grid.fraction_bits``: the tree's exact products and the accumulator
    aligned to the grid, added and rounded once into the accumulator format (an exact zero is
    +0), or the accumulator unchanged (its sign kept) by the pass-through rules: its LSB more
    than ``accumulator_max_left_shift`` places above the grid's, or more than
    ``accumulator_max_right_shift`` below it with products that sum to exactly zero."""
    offset = grid_lsb_offset(acc, scale_exponent, cfg, acc_params)
    if offset > cfg.grid_max_left_shift:
        return acc
    limbs_clear(limbs, bounds)
    for i in range(count):
        limbs_add_float(limbs, bounds, terms[i])
    if offset < -cfg.grid_max_right_shift:
        _, products_zero = limbs_round(
            limbs, bounds, acc_params, ROUND_NEAREST_EVEN, OVERFLOW_INF_NAN
        )
        if products_zero:
            limbs_clear(limbs, bounds)
            return acc
    limbs_add_float(limbs, bounds, acc)
    return round_into_accumulator(limbs, bounds, acc_params, cfg)


@njit(cache=True, inline="always")
def tree_scale_exponent(start, a_scales, b_scales, cfg):
    """The scale exponent (Xa-127)+(Xb-127) of the block holding tree position ``start``
    (0 without scales; a NaN scale has made the tree's products NaN already)."""
    if cfg.scales == SCALES_NONE:
        return 0
    block = start // cfg.block_size
    return a_scales[block] + b_scales[block]


# --- step 6 (start): c enters -------------------------------------------------------------------


@njit(cache=True, **STAGE)
def start_accumulator(c_value, special, cfg, acc_params, limbs, bounds):
    """(accumulator, outer accumulator, running special) of a floating accumulator once c
    has entered: as the outer fp32 accumulator's first value (promotion; NaN or ±Inf too),
    rounded into the accumulator (``c_entry: initial``; finite), or not yet
    (``c_entry: end``). (An exact accumulator's c enters its limbs: ``dot_one``.)"""
    acc = 0.0
    outer = 0.0
    limbs_clear(limbs, bounds)
    if cfg.promotion_interval > 0:
        outer = c_value
    elif not cfg.c_at_end:
        acc = round_float(
            c_value,
            acc_params,
            cfg.accumulator_rounding,
            cfg.accumulator_subnormals,
            cfg.accumulator_overflow,
        )
        if not math.isfinite(acc):  # c overflows a narrower accumulator
            special = note_overflow(special, acc)
            acc = 0.0
    return acc, outer, special


# --- steps 1-3: decode, multiply, order and trees -----------------------------------------------


@njit(cache=True, **STAGE)
def element(code, values, exponents, params, subnormals):
    """Step 1 for one field code: (value, alignment exponent) from the per-code tables, or
    for a format given empty tables, decoded from the code's bit fields (``params``); with
    input subnormals off a subnormal value reads as zero of its sign. The exponent is
    max(floor(log2|v|), emin) (emin = 1 - bias, or emax for fixed point), ZERO_EXPONENT for
    zeros and specials, as the tables hold it."""
    if values.shape[0] != 0:
        return values[code], exponents[code]
    value = decode_code(np.int64(code), params)  # (the int64 decode every format compiles)
    if not subnormals:
        value = flush_subnormal(value, params, False)
    if value == 0.0 or not math.isfinite(value):
        return value, np.int64(ZERO_EXPONENT)
    emin = 1 - params[P_BIAS] if params[P_EXPONENT_BITS] > 0 else params[P_EMAX]
    return value, max(floor_log2(value), emin)


@njit(cache=True, inline="always")
def products_fit_float64(a_params, b_params):
    """Whether every product of an A and a B value times 2^s (|s| <= 254, two E8M0 scale
    exponents) is exact in float64: at most 53 significant bits, its lowest bit at or above
    2^-1074 and its magnitude below 2^1024 (fp32 x fp32 fits; a product with fp64 does not)."""
    bits = a_params[P_MANTISSA_BITS] + b_params[P_MANTISSA_BITS] + 2
    lowest = (1 - a_params[P_BIAS] - a_params[P_MANTISSA_BITS]) + (
        1 - b_params[P_BIAS] - b_params[P_MANTISSA_BITS]
    )
    highest = a_params[P_EMAX] + b_params[P_EMAX] + 1
    return bits <= 53 and lowest - 254 >= -1074 and highest + 254 < 1024


@njit(cache=True, inline="always")
def padded_length(n_elements, cfg):
    """K padded to a whole number of term-order periods: the padded positions are empty (no
    term, not even +0), as in a unit fed zero-padded operands."""
    period = cfg.term_order_length
    if period == 0:
        return n_elements
    return (n_elements + period - 1) // period * period


@njit(cache=True, inline="always")
def ordered_index(position, cfg, order):
    """The element k a tree position takes: k itself in k order, else its period's permutation."""
    period = cfg.term_order_length
    if period == 0:
        return position
    return (position // period) * period + order[position % period]


@njit(cache=True, **STAGE)
def tree_count(n_elements, cfg):
    """Number of trees: K (padded to whole term-order periods) cut into runs of fused_terms,
    or with ``trees_in_blocks`` each block cut so (the last tree of a block may be short)."""
    fused_terms = cfg.fused_terms
    if cfg.trees_in_blocks:  # no tree past K: a unit issues no operation there
        per_block = (cfg.block_size + fused_terms - 1) // fused_terms
        full_blocks, rest = divmod(n_elements, cfg.block_size)
        return full_blocks * per_block + (rest + fused_terms - 1) // fused_terms
    return (padded_length(n_elements, cfg) + fused_terms - 1) // fused_terms


@njit(cache=True, **STAGE)
def tree_bounds(tree, n_elements, cfg):
    """(start, stop) tree positions of tree number ``tree`` (see :func:`tree_count`)."""
    fused_terms = cfg.fused_terms
    if cfg.trees_in_blocks:
        per_block = (cfg.block_size + fused_terms - 1) // fused_terms
        block_start = (tree // per_block) * cfg.block_size
        start = block_start + (tree % per_block) * fused_terms
        return start, min(start + fused_terms, block_start + cfg.block_size, n_elements)
    start = tree * fused_terms
    return start, min(start + fused_terms, padded_length(n_elements, cfg))


@njit(cache=True, **STAGE)
def uniform_trees(cfg):
    """Whether every tree may take :func:`uniform_tree_terms`: k order, one scale pair per
    tree, the exponent-sum reference, exact products that never overflow, one window."""
    return (
        cfg.term_order_length == 0
        and (
            cfg.scales == SCALES_NONE
            or cfg.trees_in_blocks
            or cfg.block_size % cfg.fused_terms == 0
        )
        and cfg.scales != SCALES_GROUP_SUM  # group sums: group_tree_terms
        and not cfg.align_leading_bit
        and cfg.product_fraction_bits < 0
        and cfg.product_overflow_exponent == NO_PRODUCT_OVERFLOW
        and not cfg.parity_windows  # parity_tree_sum
    )


@njit(cache=True, **STAGE)
def uniform_tree_terms(
    start,
    stop,
    a_codes,
    b_codes,
    a_scales,
    b_scales,
    a_values,
    a_exponents,
    b_values,
    b_exponents,
    a_params,
    b_params,
    cfg,
    terms,
    exponents,
):
    """Steps 1-3 for the elements start..stop of a :func:`uniform_trees` unit in one pass, no
    branch per product: (count, tree_scale, done). Not done (the caller falls back to
    :func:`tree_terms`) for NaN/Inf, NaN scales, and all-zero or exactly cancelling trees
    (signs of zero). Zero elements carry a very negative exponent, so they never set the
    reference; they stay in as zero terms."""
    shift = 0
    scale_ok = True
    if cfg.scales != SCALES_NONE:
        scale_a = a_scales[start // cfg.block_size]
        scale_b = b_scales[start // cfg.block_size]
        scale_ok = scale_a != SCALE_NAN and scale_b != SCALE_NAN
        shift = scale_a + scale_b
    check = 0.0
    count = 0
    if a_values.shape[0] != 0 and b_values.shape[0] != 0:  # tables for both: the branch-free loop
        for k in range(start, stop):
            code_a = a_codes[k]
            code_b = b_codes[k]
            product = a_values[code_a] * b_values[code_b]
            terms[count] = product
            exponents[count] = a_exponents[code_a] + b_exponents[code_b]
            check += product
            count += 1
    else:
        for k in range(start, stop):
            value_a, exponent_a = element(
                a_codes[k], a_values, a_exponents, a_params, cfg.input_subnormals
            )
            value_b, exponent_b = element(
                b_codes[k], b_values, b_exponents, b_params, cfg.input_subnormals
            )
            product = value_a * value_b
            terms[count] = product
            exponents[count] = exponent_a + exponent_b
            check += product
            count += 1
    if not (scale_ok and math.isfinite(check) and check != 0.0):
        return count, 0, False
    tree_scale = 0
    if shift != 0:
        if cfg.scales == SCALES_BLOCK_SUM and cfg.align_fraction_bits >= 0:
            tree_scale = shift  # block_sum with a window: the scale multiplies the tree's sum
        else:
            factor = power_of_two(shift)
            for i in range(count):
                terms[i] *= factor
                exponents[i] += shift
    return count, tree_scale, True


@njit(cache=True, **STAGE)
def multiply(
    k,
    a_codes,
    b_codes,
    a_scales,
    b_scales,
    a_values,
    a_exponents,
    b_values,
    b_exponents,
    a_params,
    b_params,
    cfg,
):
    """Steps 1-2 for element k: (product, exponent sum, deferred scale). The product is exact
    (NaN for a NaN scale), ±Inf from 2^product_overflow_exponent up; zero elements are +0
    with ``inputs.zero_sign: positive``; with ``scales: products`` (or ``block_sum`` on an
    exact tree) the block's scale exponents multiply it and join its exponent sum, with
    ``block_sum`` and a window they are deferred to the tree's sum."""
    value_a, exponent_a = element(a_codes[k], a_values, a_exponents, a_params, cfg.input_subnormals)
    value_b, exponent_b = element(b_codes[k], b_values, b_exponents, b_params, cfg.input_subnormals)
    if cfg.input_zeros_positive:  # x + 0.0 is +0 for either zero and x otherwise
        value_a += 0.0
        value_b += 0.0
    product = value_a * value_b
    exponent_sum = exponent_a + exponent_b
    deferred = 0
    if cfg.scales != SCALES_NONE and cfg.scales != SCALES_GROUP_SUM:  # group_sum: scaled per group
        block = k // cfg.block_size
        scale_a = a_scales[block]
        scale_b = b_scales[block]
        if scale_a == SCALE_NAN or scale_b == SCALE_NAN:
            product = np.nan
        elif cfg.scales == SCALES_PRODUCTS or cfg.align_fraction_bits < 0:
            product = scale_by_power_of_two(product, scale_a + scale_b)
            exponent_sum += scale_a + scale_b
        else:
            deferred = scale_a + scale_b
    limit = cfg.product_overflow_exponent
    if limit != NO_PRODUCT_OVERFLOW and abs(product) >= power_of_two(limit):  # NaN stays NaN
        product = math.copysign(math.inf, product)
    return product, exponent_sum, deferred


@generic_calls
@njit(cache=True, **STAGE)
def tree_terms(
    start,
    stop,
    step,
    n_elements,
    a_codes,
    b_codes,
    a_scales,
    b_scales,
    a_values,
    a_exponents,
    b_values,
    b_exponents,
    a_params,
    b_params,
    cfg,
    order,
    terms,
    exponents,
    special,
    negative_zeros_only,
):
    """Steps 1-3 for any tree, the tree positions start..stop by ``step`` (:func:`tree_bounds`; 2 for
    one parity of ``parity_windows``): its
    nonzero finite products (truncated by the multiplier when ``product_fraction_bits`` is
    set) with their alignment exponents into ``terms`` and ``exponents``. NaN/Inf products
    join the running special (an IEEE sum), zeros only their sign's record and ``has_zero``.
    Returns (count, tree_scale, special, negative_zeros_only, has_zero)."""
    count = 0
    has_zero = False
    tree_scale = 0
    for position in range(start, stop, step):
        k = ordered_index(position, cfg, order)
        if k >= n_elements:  # a padded position: no term
            continue
        product, exponent_sum, tree_scale = multiply(
            k,
            a_codes,
            b_codes,
            a_scales,
            b_scales,
            a_values,
            a_exponents,
            b_values,
            b_exponents,
            a_params,
            b_params,
            cfg,
        )
        if not math.isfinite(product):
            special += product
            continue
        if product == 0.0:
            has_zero = True
            if math.copysign(1.0, product) > 0:
                negative_zeros_only = False
            continue
        negative_zeros_only = False
        if cfg.product_fraction_bits >= 0:
            product = truncate_significand(product, cfg.product_fraction_bits)
        terms[count] = product
        exponents[count] = floor_log2(product) if cfg.align_leading_bit else exponent_sum
        count += 1
    return count, tree_scale, special, negative_zeros_only, has_zero


@njit(cache=True, **STAGE)
def group_tree_terms(
    start,
    stop,
    a_codes,
    b_codes,
    a_scales,
    b_scales,
    a_values,
    a_exponents,
    b_values,
    b_exponents,
    a_params,
    b_params,
    scale_values,
    scale_exponents,
    cfg,
    terms,
    exponents,
    special,
    negative_zeros_only,
):
    """Steps 1-3 of a ``scales: group_sum`` tree, the positions start..stop (k order): one term
    per group of ``group_terms`` products, the group's exact sum (of products truncated by
    ``product_fraction_bits`` when set) times its block's two scales (codes indexing
    ``scale_values``), with the scales' exponent sum as its alignment exponent (whatever
    ``align_reference``). A group whose products are all zero, or whose scale is zero, is a
    zero term: no term, only ``has_zero``. NaN/Inf products or a NaN scale join the running
    special. The config guarantees every group sum and its scaled value are exact in float64.
    Returns (count, special, negative_zeros_only, has_zero)."""
    count = 0
    has_zero = False
    for group_start in range(start, stop, cfg.group_terms):
        group_sum = 0.0
        all_zero = True
        for k in range(group_start, min(group_start + cfg.group_terms, stop)):
            value_a, _ = element(a_codes[k], a_values, a_exponents, a_params, cfg.input_subnormals)
            value_b, _ = element(b_codes[k], b_values, b_exponents, b_params, cfg.input_subnormals)
            product = value_a * value_b
            if not math.isfinite(product):
                special += product
                all_zero = False
                continue
            if product != 0.0 or math.copysign(1.0, product) > 0:
                negative_zeros_only = False
            if product != 0.0:
                all_zero = False
                if cfg.product_fraction_bits >= 0:
                    product = truncate_significand(product, cfg.product_fraction_bits)
            group_sum += product  # exact: see the docstring
        block = group_start // cfg.block_size
        scale = scale_values[a_scales[block]] * scale_values[b_scales[block]]
        if math.isnan(scale):
            special += scale
            continue
        if all_zero or scale == 0.0:
            has_zero = True
            continue
        terms[count] = group_sum * scale
        exponents[count] = scale_exponents[a_scales[block]] + scale_exponents[b_scales[block]]
        count += 1
    return count, special, negative_zeros_only, has_zero


@njit(cache=True, **STAGE)
def wide_tree_into_limbs(
    start,
    stop,
    n_elements,
    a_codes,
    b_codes,
    a_scales,
    b_scales,
    a_values,
    a_exponents,
    b_values,
    b_exponents,
    a_params,
    b_params,
    cfg,
    order,
    special,
    negative_zeros_only,
    limbs,
    bounds,
):
    """Steps 1-5 of an exact tree whose products need not fit a float64 (fp64 operands):
    each nonzero finite product, times its block's scales (``scales: products``, or
    ``block_sum`` on an exact tree), is added exactly into the limbs. NaN/Inf products and
    NaN scales join the running special (Inf x 0 is NaN), zeros only their sign's record.
    Returns (special, negative_zeros_only)."""
    for position in range(start, stop):
        k = ordered_index(position, cfg, order)
        if k >= n_elements:  # a padded position: no term
            continue
        value_a, _ = element(a_codes[k], a_values, a_exponents, a_params, cfg.input_subnormals)
        value_b, _ = element(b_codes[k], b_values, b_exponents, b_params, cfg.input_subnormals)
        shift = 0
        if cfg.scales != SCALES_NONE:
            block = k // cfg.block_size
            if a_scales[block] == SCALE_NAN or b_scales[block] == SCALE_NAN:
                special += np.nan
                continue
            shift = a_scales[block] + b_scales[block]
        if not (math.isfinite(value_a) and math.isfinite(value_b)):
            special += value_a * value_b  # a NaN or Inf factor: the float64 product is the special
            continue
        if value_a == 0.0 or value_b == 0.0:
            if cfg.input_zeros_positive or (math.copysign(1.0, value_a) < 0) == (
                math.copysign(1.0, value_b) < 0
            ):
                negative_zeros_only = False
            continue
        negative_zeros_only = False
        limbs_add_product(limbs, bounds, value_a, value_b, shift)
    return special, negative_zeros_only


# --- steps 4-5: align and add -------------------------------------------------------------------


@njit(cache=True, **STAGE)
def accumulator_exponent(acc, holds_c, cfg, acc_params):
    """The alignment exponent of a nonzero accumulator in the tree: floor(log2|acc|), or at
    least the accumulator format's emin (``accumulator_exponent: format_emin``), and while it
    still holds c (``holds_c``: the first tree) at least c_format's emin too."""
    exponent = floor_log2(acc)
    if cfg.accumulator_exponent_clamped:
        exponent = max(exponent, 1 - acc_params[P_BIAS])
        if holds_c:
            exponent = max(exponent, cfg.c_format_emin)
    return exponent


@njit(cache=True, **STAGE)
def keep_in_window(scaled, below):
    """A term in units of the window's LSB (``scaled``, exact) as the adder keeps it, per
    ``below_window`` other than ``truncate`` (:func:`align_and_add`); with ``sticky`` in
    units of half an LSB."""
    if below == BELOW_FLOOR:
        return np.int64(math.floor(scaled))
    if below == BELOW_NEAREST_EVEN:
        return np.int64(np.rint(scaled))
    magnitude = abs(scaled)  # sticky: truncate, then one more bit, set if anything was dropped
    whole = math.floor(magnitude)
    jammed = np.int64(2.0 * whole) + (1 if magnitude != whole else 0)
    return -jammed if scaled < 0 else jammed


@njit(cache=True, inline="always")
def adder_width_bits(cfg):
    """The adder register (``carry_bits`` set): a sign bit, the window's fraction bits and two
    integer bits, the carry bits, and the sticky bit."""
    return (
        1
        + (cfg.align_fraction_bits + 2)
        + cfg.carry_bits
        + (1 if cfg.below_window == BELOW_STICKY else 0)
    )


@njit(cache=True, **STAGE)
def align_and_add(terms, exponents, count, tree_scale, reference_floor, cfg):
    """Steps 4-5 (align, add) of a tree's ``count`` terms: (fits, total, lsb_exponent), the
    sum being total * 2^lsb_exponent (int64 total). The reference R is the largest exponent;
    with a window each term keeps multiples of 2^(R - align_fraction_bits) (the rest follows
    ``below_window``) and the adder register may wrap or saturate. An exact tree is summed
    the same way when every term fits EXACT_TREE_BITS bits below R (nearly always); else
    ``fits`` is False and the caller sums the terms exactly in the limbs. With a window, R is
    at least ``reference_floor`` (``zero_term_exponent`` in a tree with a zero term)."""
    if count == 0:
        return True, np.int64(0), np.int64(0)
    if cfg.align_fraction_bits < 0:
        fits, total, lsb_exponent = exact_tree_sum(terms, exponents, count)
        return fits, total, (lsb_exponent + tree_scale) if fits else lsb_exponent
    reference = exponents[0]
    for i in range(1, count):
        reference = max(reference, exponents[i])
    reference = max(reference, reference_floor)
    lsb_exponent = reference - cfg.align_fraction_bits
    factor = power_of_two(-lsb_exponent)  # |lsb_exponent| stays far inside float64's range
    total = np.int64(0)
    below = cfg.below_window
    if below == BELOW_TRUNCATE:  # the common case, a loop of its own (it vectorises)
        for i in range(count):
            total += np.int64(terms[i] * factor)  # toward zero: the int conversion truncates
    else:
        for i in range(count):
            scaled = terms[i] * factor  # exact, unless below float64's least subnormal
            if scaled == 0.0 and terms[i] != 0.0:
                # a term that far below the window (a zero term's exponent near float64's
                # top) keeps what any |x| < 1/2 of its sign keeps: floor -1 or 0, sticky
                # +-1, nearest 0
                scaled = math.copysign(0.25, terms[i])
            total += keep_in_window(scaled, below)
    if below == BELOW_STICKY:
        lsb_exponent -= 1
    if cfg.carry_bits >= 0:
        total = adder_register(total, adder_width_bits(cfg), cfg.adder_saturates)
    return True, total, lsb_exponent + tree_scale


@njit(cache=True, **STAGE)
def exact_tree_sum(terms, exponents, count):
    """Step 5 of an exact tree's ``count`` (> 0) terms (:func:`align_and_add` without a
    window): (fits, total, lsb_exponent), the sum being total * 2^lsb_exponent, when every
    term fits EXACT_TREE_BITS bits below the largest exponent R (nearly always); else
    (False, 0, 0) and the caller sums the terms exactly in the limbs."""
    reference = exponents[0]
    for i in range(1, count):
        reference = max(reference, exponents[i])
    window_bits = EXACT_TREE_BITS - _bit_length(count)
    lsb_exponent = reference - window_bits
    factor = power_of_two(-lsb_exponent)  # |lsb_exponent| stays far inside float64's range
    # A product lies below 2^(R+2), so `count` of them sum below 2^60; a scaled group sum
    # (scales: group_sum) may lie far above its exponent: beyond that bound the limbs sum the tree.
    limit = power_of_two(window_bits + 2)
    total = np.int64(0)
    for i in range(count):
        scaled = terms[i] * factor
        if not abs(scaled) < limit:
            return False, np.int64(0), np.int64(0)
        kept = np.int64(scaled)
        if kept != scaled:  # bits below 2^lsb_exponent: the limbs sum this tree
            return False, np.int64(0), np.int64(0)
        total += kept
    return True, total, lsb_exponent


@njit(cache=True, **STAGE)
def add_tree_sum(limbs, bounds, fits, total, lsb_exponent, terms, count):
    """Add the tree's exact sum into the limbs: the int64 total, or each term when it did not fit."""
    if fits:
        limbs_add_integer(limbs, bounds, total < 0, abs(total), lsb_exponent)
    else:
        for i in range(count):
            limbs_add_float(limbs, bounds, terms[i])


# --- steps 5-6: normalise, round, accumulate ----------------------------------------------------


@njit(cache=True, inline="always")
def is_accumulator_value(tree_sum, cfg, acc_params):
    """Whether a nonzero tree sum of ``sum_significant_bits`` bits is a normal value of the
    accumulator format (then rounding into it is the identity)."""
    return (
        tree_sum != 0.0
        and cfg.sum_significant_bits <= acc_params[P_MANTISSA_BITS] + 1
        and 1 - acc_params[P_BIAS] <= floor_log2(tree_sum) <= acc_params[P_EMAX]
    )


@njit(cache=True, **STAGE)
def accumulate(
    acc, fits, total, lsb_exponent, terms, count, cfg, acc_params, sum_params, limbs, bounds
):
    """Steps 5-6 after the add: the tree sum rounded to ``sum_significant_bits`` (when set)
    with ``sum_rounding``, added exactly to the accumulator when that is outside the tree,
    rounded once into the accumulator format. Returns the new accumulator (±Inf on overflow)."""
    joined = cfg.accumulator_in_tree or acc == 0.0  # the sum already holds the accumulator
    if fits and cfg.sum_significant_bits > 0:
        tree_sum = round_integer(
            total, lsb_exponent, sum_params, cfg.sum_rounding, True, OVERFLOW_INF_NAN
        )
        if not joined:
            return add_round(
                acc,
                tree_sum,
                acc_params,
                cfg.accumulator_rounding,
                cfg.accumulator_subnormals,
                cfg.accumulator_overflow,
                limbs,
                bounds,
            )
        if is_accumulator_value(tree_sum, cfg, acc_params):
            return tree_sum
        return round_float(
            tree_sum,
            acc_params,
            cfg.accumulator_rounding,
            cfg.accumulator_subnormals,
            cfg.accumulator_overflow,
        )
    if fits and joined:
        return round_integer(
            total,
            lsb_exponent,
            acc_params,
            cfg.accumulator_rounding,
            cfg.accumulator_subnormals,
            cfg.accumulator_overflow,
        )
    return accumulate_in_limbs(
        acc, fits, total, lsb_exponent, terms, count, cfg, acc_params, sum_params, limbs, bounds
    )


@njit(cache=True, **STAGE)
def accumulate_in_limbs(
    acc, fits, total, lsb_exponent, terms, count, cfg, acc_params, sum_params, limbs, bounds
):
    """:func:`accumulate` with exact sums in the limbs: for a wide exact tree, or the
    accumulator outside the tree with no n-bit sum."""
    limbs_clear(limbs, bounds)
    add_tree_sum(limbs, bounds, fits, total, lsb_exponent, terms, count)
    if cfg.sum_significant_bits > 0:
        tree_sum = round_limbs(limbs, bounds, sum_params, cfg.sum_rounding, True, OVERFLOW_INF_NAN)
        limbs_clear(limbs, bounds)
        limbs_add_float(limbs, bounds, tree_sum)
    if not cfg.accumulator_in_tree:
        limbs_add_float(limbs, bounds, acc)
    return round_into_accumulator(limbs, bounds, acc_params, cfg)


@njit(cache=True, inline="always")
def promote(outer, acc, special, fp32_params, limbs, bounds):
    """``promotion_interval``: the accumulator added into the outer fp32 accumulator (RNE) and
    cleared. The outer accumulator is a register of its own: the interval's NaN/Inf (the
    running special, cleared with it) joins it by an IEEE add, so an Inf c or an earlier
    interval's overflow meeting an opposite Inf gives NaN, and an overflow leaves it ±Inf.
    Returns (outer, special)."""
    if special != 0.0 or math.isnan(special) or not math.isfinite(outer):
        return (0.0 if math.isfinite(outer) else outer) + special, 0.0
    outer = add_round(
        outer, acc, fp32_params, ROUND_NEAREST_EVEN, True, OVERFLOW_INF_NAN, limbs, bounds
    )
    return outer, special


@njit(cache=True, **STAGE)
def after_tree(acc, outer, special, tree, cfg, fp32_params, limbs, bounds):
    """Step 6 after a tree: an accumulator overflow joins the running special, and every
    ``promotion_interval`` products the accumulator is promoted. Returns (acc, outer, special)."""
    if not math.isfinite(acc):  # overflow in the accumulator
        special = note_overflow(special, acc)
        acc = 0.0
    if cfg.promotion_interval > 0 and ((tree + 1) * cfg.fused_terms) % cfg.promotion_interval == 0:
        outer, special = promote(outer, acc, special, fp32_params, limbs, bounds)
        acc = 0.0
    return acc, outer, special


@njit(cache=True, **STAGE)
def finish_accumulator(acc, outer, c_value, special, cfg, acc_params, fp32_params, limbs, bounds):
    """Step 6's end: the outer accumulator's last add (promotion), or c rounded into the
    accumulator format (nearest even) and added with ``c_add_rounding`` (``c_entry: end``).
    Returns (acc, special)."""
    if cfg.promotion_interval > 0:
        acc, special = promote(outer, acc, special, fp32_params, limbs, bounds)
    elif cfg.c_at_end:
        c_converted = round_float(
            c_value,
            acc_params,
            ROUND_NEAREST_EVEN,
            cfg.accumulator_subnormals,
            cfg.accumulator_overflow,
        )
        if math.isfinite(c_converted):
            acc = add_round(
                acc,
                c_converted,
                acc_params,
                cfg.c_add_rounding,
                cfg.accumulator_subnormals,
                cfg.accumulator_overflow,
                limbs,
                bounds,
            )
        else:  # an IEEE add: an Inf c meets the accumulator's own NaN/Inf
            special += c_converted
    if not math.isfinite(acc):
        special = note_overflow(special, acc)
        acc = 0.0
    return acc, special


# --- steps 4-6 of adder.parity_windows and adder.second_alignment_bits ---------------------------


@njit(cache=True, **STAGE)
def parity_tree_sum(
    start,
    stop,
    n_elements,
    a_codes,
    b_codes,
    a_scales,
    b_scales,
    a_values,
    a_exponents,
    b_values,
    b_exponents,
    a_params,
    b_params,
    cfg,
    order,
    terms,
    exponents,
    special,
    negative_zeros_only,
):
    """Steps 1-5 (to the exact window sum) of a ``parity_windows`` tree: the products at even and
    at odd tree positions each aligned and added in their own window; each sum then kept, toward
    -inf, to the LSB of the window with the larger reference. Returns (count, total,
    lsb_exponent, special, negative_zeros_only): the sum is total * 2^lsb_exponent, and count
    is 0 when the tree has no nonzero finite product."""
    count = 0
    total = np.int64(0)
    lsb_exponent = np.int64(0)
    for parity in range(2):
        half, tree_scale, special, negative_zeros_only, has_zero = tree_terms(
            start + parity,
            stop,
            2,
            n_elements,
            a_codes,
            b_codes,
            a_scales,
            b_scales,
            a_values,
            a_exponents,
            b_values,
            b_exponents,
            a_params,
            b_params,
            cfg,
            order,
            terms,
            exponents,
            special,
            negative_zeros_only,
        )
        if half == 0:
            continue
        floor = cfg.zero_term_exponent if has_zero else NO_ZERO_TERM_EXPONENT
        _, half_total, half_lsb = align_and_add(terms, exponents, half, tree_scale, floor, cfg)
        if count == 0:
            total, lsb_exponent = half_total, half_lsb
        elif half_lsb > lsb_exponent:  # arithmetic shifts: toward -inf
            total = (total >> min(half_lsb - lsb_exponent, 63)) + half_total
            lsb_exponent = half_lsb
        else:
            total += half_total >> min(lsb_exponent - half_lsb, 63)
        count += half
    return count, total, lsb_exponent, special, negative_zeros_only


@njit(cache=True, **STAGE)
def second_alignment(acc, count, total, lsb_exponent, cfg, acc_params):
    """``second_alignment_bits`` n: the accumulator added to the tree's window sum (total *
    2^lsb_exponent, its reference R = lsb_exponent + align_fraction_bits; none when count is
    0) at E = max(R, e), e the accumulator's exponent (its format's emin at least, and for
    zero). The sum keeps multiples of 2^(E-n-1), the accumulator multiples of
    2^(E-align_fraction_bits) (or nothing, ``far_accumulator: zero``, below E - F - 1), both
    toward -inf; their sum is cut to n+1 significant bits toward -inf (no finer than
    2^(emin-n)) and rounded into the accumulator format. Returns the new accumulator."""
    window = cfg.align_fraction_bits
    bits = cfg.second_alignment_bits
    emin = 1 - acc_params[P_BIAS]
    acc_exponent = emin if acc == 0.0 else max(floor_log2(acc), emin)
    top = acc_exponent if count == 0 else max(acc_exponent, lsb_exponent + window)
    low = top - max(bits + 1, window)  # the LSB both parts are counted in
    tree_part = np.int64(0)
    if count > 0:
        shift = lsb_exponent - (top - bits - 1)
        tree_part = total << shift if shift >= 0 else total >> min(-shift, 63)
        tree_part <<= (top - bits - 1) - low
    acc_part = np.int64(0)
    if acc != 0.0 and not (cfg.far_accumulator_dropped and acc_exponent < top - window - 1):
        acc_part = np.int64(math.floor(scale_by_power_of_two(acc, window - top))) << (
            (top - window) - low
        )
    register = tree_part + acc_part
    if register != 0:
        leading = low + _bit_length(abs(register)) - 1
        cut = max(leading, emin) - bits  # the LSB after the cut
        if cut > low:
            register >>= cut - low
            low = cut
    return round_integer(
        register,
        low,
        acc_params,
        cfg.accumulator_rounding,
        cfg.accumulator_subnormals,
        cfg.accumulator_overflow,
    )


@njit(cache=True, **STAGE)
def special_accumulator_dropped(carried, tree_special, count, lsb_exponent, cfg):
    """``special_accumulator_exponent`` e: whether the running NaN/±Inf ``carried`` into this
    tree (c, or an earlier tree's result) is dropped at the second alignment. It is when the
    tree adds no NaN/Inf of its own (``tree_special`` 0) and e < E - align_fraction_bits - 1,
    E = max(R, e), R = lsb_exponent + align_fraction_bits (none when ``count`` is 0)."""
    if carried == 0.0 or tree_special != 0.0 or math.isnan(tree_special):
        return False
    exponent = cfg.special_accumulator_exponent
    top = exponent if count == 0 else max(exponent, lsb_exponent + cfg.align_fraction_bits)
    return exponent < top - cfg.align_fraction_bits - 1


# --- adder.structure: pairwise_rounded ----------------------------------------------------------


@generic_calls
@njit(cache=True, **STAGE)
def rounded_add(x, y, params, rounding, subnormals, overflow, limbs, bounds):
    """x + y under IEEE 754 rounded into ``params`` (values of that format, NaN and ±Inf
    included): specials and zero signs as IEEE gives them (an exact zero sum of nonzero
    values is -0 only under toward_negative), the rest rounded once (flushed without
    ``subnormals``, keeping its sign)."""
    if not (math.isfinite(x) and math.isfinite(y)):
        return x + y
    if x == 0.0 and y == 0.0:
        if math.copysign(1.0, x) < 0 and math.copysign(1.0, y) < 0:
            return -0.0
        return -0.0 if rounding == ROUND_TOWARD_NEGATIVE else 0.0
    if x == 0.0:
        return y
    if y == 0.0:
        return x
    total = x + y
    y_part = total - x  # Knuth's two-sum: the float64 add was exact when the error is 0
    error = (x - (total - y_part)) + (y - y_part)
    if not (math.isfinite(total) and error == 0.0):
        return add_round(x, y, params, rounding, subnormals, overflow, limbs, bounds)
    if total == 0.0:
        return -0.0 if rounding == ROUND_TOWARD_NEGATIVE else 0.0
    return round_float(total, params, rounding, subnormals, overflow)


@njit(cache=True, **STAGE)
def pairwise_dot(
    a_codes,
    b_codes,
    a_scales,
    b_scales,
    c_value,
    a_values,
    a_exponents,
    b_values,
    b_exponents,
    a_params,
    b_params,
    cfg,
    order,
    acc_params,
    out_params,
    limbs,
    bounds,
    terms,
):
    """One dot product through a ``pairwise_rounded`` adder: c rounded into the accumulator
    format (read as +0 when zero or flushed, with ``inputs.zero_sign: positive``); per tree,
    each product rounded into it, the products summed by rounded two-operand adds, pair by
    pair ((p0+p1)+(p2+p3); an odd last one is carried up), and the result added to the
    accumulator; then the output rounding. IEEE arithmetic throughout."""
    n_elements = a_codes.shape[0]
    rounding = cfg.accumulator_rounding
    subnormals = cfg.accumulator_subnormals
    overflow = cfg.accumulator_overflow
    acc = round_float(c_value, acc_params, rounding, subnormals, overflow)
    if cfg.input_zeros_positive and acc == 0.0:
        acc = 0.0
    for tree in range(tree_count(n_elements, cfg)):
        start, stop = tree_bounds(tree, n_elements, cfg)
        count = 0
        for position in range(start, stop):
            k = ordered_index(position, cfg, order)
            if k >= n_elements:  # a padded position: no term
                continue
            product, _, deferred = multiply(
                k,
                a_codes,
                b_codes,
                a_scales,
                b_scales,
                a_values,
                a_exponents,
                b_values,
                b_exponents,
                a_params,
                b_params,
                cfg,
            )
            if deferred != 0:
                product = scale_by_power_of_two(product, deferred)
            if cfg.product_fraction_bits >= 0 and product != 0.0 and math.isfinite(product):
                product = truncate_significand(product, cfg.product_fraction_bits)
            terms[count] = round_float(product, acc_params, rounding, subnormals, overflow)
            count += 1
        while count > 1:
            for j in range(count // 2):
                terms[j] = rounded_add(
                    terms[2 * j],
                    terms[2 * j + 1],
                    acc_params,
                    rounding,
                    subnormals,
                    overflow,
                    limbs,
                    bounds,
                )
            if count % 2:
                terms[count // 2] = terms[count - 1]
            count = (count + 1) // 2
        if count == 1:
            acc = rounded_add(
                acc, terms[0], acc_params, rounding, subnormals, overflow, limbs, bounds
            )
    result = round_float(
        acc, out_params, cfg.output_rounding, cfg.output_subnormals, OVERFLOW_INF_NAN
    )
    if math.isnan(result):
        return np.nan
    if result == 0.0 and cfg.output_zero_sign == ZERO_SIGN_POSITIVE:
        return 0.0
    return result


# --- step 7: output -----------------------------------------------------------------------------


@njit(cache=True, **STAGE)
def output_value(result, special, negative_zeros_only, zero_sign):
    """The dot product's value from the output-rounded ``result``: the running special wins
    (NaN as the canonical positive quiet NaN); a zero is +0 with ``zero_sign: positive``;
    else an exact zero is -0 only when c and every product were -0 (IEEE's sum of zeros;
    never with ``exact_positive``; with ``ieee_steps`` the accumulator's steps have signed it
    already), while a negative result that rounded to zero kept its sign."""
    if special != 0.0 or math.isnan(special):
        return np.nan if math.isnan(special) else special
    if result == 0.0 and zero_sign == ZERO_SIGN_POSITIVE:
        return 0.0
    if result == 0.0 and not math.copysign(1.0, result) < 0:
        ieee = (
            zero_sign == ZERO_SIGN_IEEE or zero_sign == ZERO_SIGN_IEEE_STEPS
        )  # (exact accumulator: one step)
        return -0.0 if negative_zeros_only and ieee else 0.0
    return result


# Feature bits of the generic kernel (:func:`kernel_features`): which of dot_one's stages a
# unit and operand pair can reach. Each kernel is compiled for one set of them, as constants:
# Numba drops the branches of the stages a unit never takes before typing them, so a unit's
# first use compiles only its own stages (and the outputs are the same bits as a kernel
# compiled with every stage, since every constant equals the record's field it stands for).
# Only stages that cost a compile are features: every combination a test draws is one more
# kernel to compile.
F_PAIRWISE, F_WIDE, F_GROUP_SUM, F_PARITY, F_GRID, F_EXACT, F_SECOND_ALIGNMENT = (
    1 << bit for bit in range(7)
)


def kernel_features(config, a_params, b_params) -> int:
    """The feature bits (``F_*``) of the kernel record ``config`` with A and B elements of
    the kernel_params ``a_params`` and ``b_params``: the stages :func:`dot_one` takes."""
    cfg = config[0]  # field indexing: a recarray view costs several times more per call
    wide = not products_fit_float64.py_func(a_params, b_params)
    flags = (
        (F_PAIRWISE, cfg["pairwise_rounded"]),
        (F_WIDE, wide),
        (F_GROUP_SUM, cfg["scales"] == SCALES_GROUP_SUM),
        (F_PARITY, cfg["parity_windows"]),
        (F_GRID, cfg["grid_fraction_bits"] >= 0),
        (F_EXACT, cfg["accumulator_exact"]),
        (F_SECOND_ALIGNMENT, cfg["second_alignment_bits"] >= 0),
    )
    return sum(bit for bit, on in flags if on)


def dot_one(
    features,
    a_codes,
    b_codes,
    a_scales,
    b_scales,
    c_value,
    a_values,
    a_exponents,
    b_values,
    b_exponents,
    config,
    order,
    acc_params,
    sum_params,
    out_params,
    fp32_params,
    scale_values,
    scale_exponents,
    a_params,
    b_params,
    limbs,
    bounds,
    terms,
    exponents,
):
    """One dot product through the generic datapath, compiled inside the kernels only: see
    :func:`_dot_one` (``features``: a constant of :func:`kernel_features`)."""
    raise NotImplementedError("dot_one runs inside compiled kernels only")


@overload(dot_one, jit_options=STAGE)
def _dot_one(
    features,
    a_codes,
    b_codes,
    a_scales,
    b_scales,
    c_value,
    a_values,
    a_exponents,
    b_values,
    b_exponents,
    config,
    order,
    acc_params,
    sum_params,
    out_params,
    fp32_params,
    scale_values,
    scale_exponents,
    a_params,
    b_params,
    limbs,
    bounds,
    terms,
    exponents,
):
    """dot_one for the constant ``features``: its stages' conditions are constants."""
    if not isinstance(features, types.IntegerLiteral):
        return None  # (Numba tries the plain type first, then the literal)
    bits = features.literal_value
    PAIRWISE = bool(bits & F_PAIRWISE)
    WIDE = bool(bits & F_WIDE)
    GROUP_SUM = bool(bits & F_GROUP_SUM)
    PARITY = bool(bits & F_PARITY)
    GRID = bool(bits & F_GRID)
    EXACT = bool(bits & F_EXACT)
    SECOND_ALIGNMENT = bool(bits & F_SECOND_ALIGNMENT)
    # An exact tree's sum needs no alignment (exact_tree_sum): the window's stages are not
    # compiled into an exact accumulator's kernel.
    EXACT_SUM = EXACT and not PARITY

    def dot_one_impl(
        features,
        a_codes,
        b_codes,
        a_scales,
        b_scales,
        c_value,
        a_values,
        a_exponents,
        b_values,
        b_exponents,
        config,
        order,
        acc_params,
        sum_params,
        out_params,
        fp32_params,
        scale_values,
        scale_exponents,
        a_params,
        b_params,
        limbs,
        bounds,
        terms,
        exponents,
    ):
        """One dot product c + sum_k a_k b_k through the unit of the kernel record ``config``, as
        a float64 value of the output format (NaN, ±Inf, ±0 included)."""
        cfg = config[0]
        n_elements = a_codes.shape[0]
        if cfg.input_zeros_positive and (
            c_value == 0.0
            or (
                not cfg.accumulator_subnormals
                and abs(c_value) < power_of_two(1 - acc_params[P_BIAS])
            )
        ):
            c_value = 0.0  # c read as +0
        if PAIRWISE:
            return pairwise_dot(
                a_codes,
                b_codes,
                a_scales,
                b_scales,
                c_value,
                a_values,
                a_exponents,
                b_values,
                b_exponents,
                a_params,
                b_params,
                cfg,
                order,
                acc_params,
                out_params,
                limbs,
                bounds,
                terms,
            )
        special = 0.0  # running IEEE sum of every non-finite contribution
        # c's NaN/Inf starts the running special where c starts the accumulator; an outer
        # accumulator (promotion) or a last add (c_entry: end) takes it at the end instead
        c_outside = not EXACT and (cfg.promotion_interval > 0 or cfg.c_at_end)
        if not math.isfinite(c_value) and not c_outside:
            special = c_value
            c_value = 0.0
        negative_zeros_only = c_value == 0.0 and math.copysign(1.0, c_value) < 0
        if EXACT:  # Kulisch: c enters the exact limbs
            acc = outer = 0.0
            limbs_clear(limbs, bounds)
            limbs_add_float(limbs, bounds, c_value)
        else:
            acc, outer, special = start_accumulator(
                c_value, special, cfg, acc_params, limbs, bounds
            )

        uniform = uniform_trees(cfg) and not WIDE
        drops_specials = cfg.special_accumulator_exponent != NO_SPECIAL_ACCUMULATOR_EXPONENT
        # ieee_steps: each rounding into the accumulator signs its own exact zero, so the record of
        # -0 addends restarts at every step with the accumulator (an exact accumulator has one step).
        steps = cfg.output_zero_sign == ZERO_SIGN_IEEE_STEPS and not cfg.accumulator_exact
        for tree in range(tree_count(n_elements, cfg)):
            start, stop = tree_bounds(tree, n_elements, cfg)
            if steps:
                negative_zeros_only = acc == 0.0 and math.copysign(1.0, acc) < 0
            # special_accumulator_exponent: the tree's own NaN/Inf are told apart from the carried ones
            carried = special
            if drops_specials:
                special = 0.0
            if (
                WIDE
            ):  # exact trees of exact products, in the limbs (Kulisch: they keep the whole sum)
                special, negative_zeros_only = wide_tree_into_limbs(
                    start,
                    stop,
                    n_elements,
                    a_codes,
                    b_codes,
                    a_scales,
                    b_scales,
                    a_values,
                    a_exponents,
                    b_values,
                    b_exponents,
                    a_params,
                    b_params,
                    cfg,
                    order,
                    special,
                    negative_zeros_only,
                    limbs,
                    bounds,
                )
                if EXACT:
                    continue
                limbs_add_float(limbs, bounds, acc)
                acc = round_into_accumulator(limbs, bounds, acc_params, cfg)
                if steps and negative_zeros_only and acc == 0.0:
                    acc = -0.0  # every addend was -0: IEEE's sum of zeros
                acc, outer, special = after_tree(
                    acc, outer, special, tree, cfg, fp32_params, limbs, bounds
                )
                continue
            count = 0
            tree_scale = 0
            done = False
            total = np.int64(0)
            lsb_exponent = np.int64(0)
            if uniform:
                count, tree_scale, done = uniform_tree_terms(
                    start,
                    min(stop, n_elements),
                    a_codes,
                    b_codes,
                    a_scales,
                    b_scales,
                    a_values,
                    a_exponents,
                    b_values,
                    b_exponents,
                    a_params,
                    b_params,
                    cfg,
                    terms,
                    exponents,
                )
            has_zero = False
            if GROUP_SUM:
                count, special, negative_zeros_only, has_zero = group_tree_terms(
                    start,
                    min(stop, n_elements),
                    a_codes,
                    b_codes,
                    a_scales,
                    b_scales,
                    a_values,
                    a_exponents,
                    b_values,
                    b_exponents,
                    a_params,
                    b_params,
                    scale_values,
                    scale_exponents,
                    cfg,
                    terms,
                    exponents,
                    special,
                    negative_zeros_only,
                )
            elif PARITY:
                count, total, lsb_exponent, special, negative_zeros_only = parity_tree_sum(
                    start,
                    stop,
                    n_elements,
                    a_codes,
                    b_codes,
                    a_scales,
                    b_scales,
                    a_values,
                    a_exponents,
                    b_values,
                    b_exponents,
                    a_params,
                    b_params,
                    cfg,
                    order,
                    terms,
                    exponents,
                    special,
                    negative_zeros_only,
                )
            elif done:
                negative_zeros_only = False
                if cfg.zero_term_exponent != NO_ZERO_TERM_EXPONENT:
                    for i in range(count):
                        has_zero = has_zero or terms[i] == 0.0
            else:
                count, tree_scale, special, negative_zeros_only, has_zero = tree_terms(
                    start,
                    stop,
                    1,
                    n_elements,
                    a_codes,
                    b_codes,
                    a_scales,
                    b_scales,
                    a_values,
                    a_exponents,
                    b_values,
                    b_exponents,
                    a_params,
                    b_params,
                    cfg,
                    order,
                    terms,
                    exponents,
                    special,
                    negative_zeros_only,
                )
            if GRID:
                acc = grid_accumulate(
                    acc,
                    terms,
                    count,
                    tree_scale_exponent(start, a_scales, b_scales, cfg),
                    cfg,
                    acc_params,
                    limbs,
                    bounds,
                )
                negative_zeros_only = False  # the grid's rules set the sign of a zero
                if not math.isfinite(acc):  # overflow in the accumulator
                    special = note_overflow(special, acc)
                    acc = 0.0
                continue
            if EXACT_SUM:  # Kulisch: the tree's exact sum goes straight into the limbs
                fits, total, lsb_exponent = True, np.int64(0), np.int64(0)
                if count > 0:
                    fits, total, lsb_exponent = exact_tree_sum(terms, exponents, count)
                    lsb_exponent += tree_scale
                add_tree_sum(limbs, bounds, fits, total, lsb_exponent, terms, count)
                continue
            if cfg.accumulator_in_tree:  # step 4: the accumulator joins the alignment
                if acc != 0.0:
                    terms[count] = acc
                    exponents[count] = accumulator_exponent(acc, tree == 0, cfg, acc_params)
                    count += 1
                else:
                    has_zero = True
            fits = True
            if not PARITY:  # (parity_tree_sum has aligned and added)
                floor = cfg.zero_term_exponent if has_zero else NO_ZERO_TERM_EXPONENT
                fits, total, lsb_exponent = align_and_add(
                    terms, exponents, count, tree_scale, floor, cfg
                )
            if EXACT:  # Kulisch: the tree's exact sum goes straight into the limbs
                add_tree_sum(limbs, bounds, fits, total, lsb_exponent, terms, count)
                continue
            if SECOND_ALIGNMENT:
                if drops_specials:
                    if special_accumulator_dropped(carried, special, count, lsb_exponent, cfg):
                        acc = 0.0  # a NaN/Inf accumulator carries no finite part
                    else:
                        special += carried
                acc = second_alignment(acc, count, total, lsb_exponent, cfg, acc_params)
            else:
                acc = accumulate(
                    acc,
                    fits,
                    total,
                    lsb_exponent,
                    terms,
                    count,
                    cfg,
                    acc_params,
                    sum_params,
                    limbs,
                    bounds,
                )
            if steps and negative_zeros_only and acc == 0.0:
                acc = -0.0  # every addend was -0: IEEE's sum of zeros
            acc, outer, special = after_tree(
                acc, outer, special, tree, cfg, fp32_params, limbs, bounds
            )

        if EXACT:
            result = round_limbs(
                limbs,
                bounds,
                out_params,
                cfg.output_rounding,
                cfg.output_subnormals,
                OVERFLOW_INF_NAN,
            )
        else:
            acc, special = finish_accumulator(
                acc, outer, c_value, special, cfg, acc_params, fp32_params, limbs, bounds
            )
            result = round_float(
                acc, out_params, cfg.output_rounding, cfg.output_subnormals, OVERFLOW_INF_NAN
            )
        return output_value(result, special, negative_zeros_only, cfg.output_zero_sign)

    return dot_one_impl


@njit(cache=True, **STAGE)
def _output_code(value, out_params):
    """The output code of a value that is already exactly representable (or NaN/Inf)."""
    bits = np.float64(value).view(np.uint64)
    return encode_bits(bits, 11, 52, 0, out_params, ROUND_NEAREST_EVEN, OVERFLOW_INF_NAN, 0)


#: The generic kernels compiled so far in this process, by feature bits.
KERNELS: dict = {}


def matmul_rows(features: int):
    """The generic kernel (below) for the feature bits ``features`` (:func:`kernel_features`
    of the record and operand formats it is called with), made once per process; Numba caches
    each one's compiled code on disk (its key includes ``features``)."""
    if features not in KERNELS:

        @njit(cache=True, nogil=True)
        def rows(
            a_codes,
            b_codes,
            a_scales,
            b_scales,
            c_values,
            a_values,
            a_exponents,
            b_values,
            b_exponents,
            cfg,
            order,
            acc_params,
            sum_params,
            out_params,
            fp32_params,
            scale_values,
            scale_exponents,
            a_params,
            b_params,
            out,
            start,
            stop,
        ):
            """The generic kernel's outputs of the (group, row) pairs ``start`` to ``stop`` (in the
            order g * M + m) of a batch of GEMMs (``datapath.api.matmul_groups``). ``c_values`` is
            (G, M, N), or (1, 1, 1) for one value shared by every output (no copy)."""
            n_rows = a_codes.shape[1]
            n_columns = b_codes.shape[1]
            c_groups, c_rows, c_columns = c_values.shape
            width = cfg[0].fused_terms + 1  # a tree's terms and the accumulator
            limbs, bounds = _thread_limbs()  # scratch buffers once per call, not per row
            terms = np.empty(width, dtype=np.float64)
            exponents = np.empty(width, dtype=np.int64)
            for row in range(start, stop):
                g, m = row // n_rows, row % n_rows
                for n in range(n_columns):
                    value = dot_one(
                        features,
                        a_codes[g, m],
                        b_codes[g, n],
                        a_scales[g, m],
                        b_scales[g, n],
                        c_values[g % c_groups, m % c_rows, n % c_columns],
                        a_values,
                        a_exponents,
                        b_values,
                        b_exponents,
                        cfg,
                        order,
                        acc_params,
                        sum_params,
                        out_params,
                        fp32_params,
                        scale_values,
                        scale_exponents,
                        a_params,
                        b_params,
                        limbs,
                        bounds,
                        terms,
                        exponents,
                    )
                    out[g, m, n] = _output_code(value, out_params)

        KERNELS[features] = rows
    return KERNELS[features]


@njit(cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _thread_limbs():
    return np.zeros(N_LIMBS, dtype=np.int64), np.array([N_LIMBS, -1], dtype=np.int64)
