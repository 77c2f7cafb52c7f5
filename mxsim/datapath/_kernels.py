"""Numba kernels of the generic MX dot-product datapath.

One dot product at a time (``dot_one``), driven over row pairs (``dot_pairs``) or over a
GEMM (``matmul_rows``). Parameters arrive as an int64 vector indexed by the ``C_*``
constants (built by ``datapath.api._kernel_config``) plus the kernel_params vectors of the
accumulator, the n-bit tree-sum format, the output and fp32. Element values come from
per-code tables (float64 value, int64 alignment exponent), so every product of two table
values times a power-of-two scale is exact in float64. Every intermediate value is held as
a float64 that is exactly a value of its format; exact sums go through ``_limbs``.
The slow reference twin is ``datapath.reference``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .._compile import generic_calls

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
    decode_code,
    decompose,
    encode_bits,
    encode_finite,
)
from ..quantize._kernels import SCALE_NAN
from ._limbs import N_LIMBS, limbs_add_float, limbs_add_integer, limbs_clear, limbs_round

C_BLOCK_SIZE = 0
C_SCALES = 1  # 0 none, 1 products, 2 block_sum
C_FUSED_TERMS = 2
C_ORDER_LENGTH = 3  # 0: k order
C_ACC_IN_TREE = 4
C_ALIGN_LEADING_BIT = 5  # 0: exponent_sum, 1: leading_bit
C_FRACTION_BITS = 6  # -1: exact tree
C_BELOW_WINDOW = 7  # 0 truncate, 1 floor, 2 nearest_even, 3 sticky
C_SUM_BITS = 8  # -1: none
C_SUM_ROUNDING = 9
C_ACC_EXACT = 10
C_ACC_ROUNDING = 11
C_ACC_SUBNORMALS = 12
C_C_AT_END = 13
C_C_ADD_ROUNDING = 14
C_PROMOTION = 15  # 0: none
C_OUT_ROUNDING = 16
C_OUT_SUBNORMALS = 17
C_PRODUCT_BITS = 18  # -1: exact products
C_UNIFORM_TREES = 19  # 1: k order, one scale per tree, exponent-sum reference, exact products
C_SUM_FITS_ACCUMULATOR = 20  # 1: sum_significant_bits <= the accumulator's precision
C_ACC_MIN_EXPONENT = 21  # smallest normal exponent of the accumulator format
C_ACC_MAX_EXPONENT = 22  # exponent of its largest finite value
C_ADDER_WIDTH = 23  # 0: the adder never overflows; else its signed register width in bits
C_ADDER_SATURATES = 24  # 1: saturate, 0: wrap (two's complement)
N_CONFIG = 25

SCALES_NONE = 0
SCALES_PRODUCTS = 1
SCALES_BLOCK_SUM = 2
BELOW_TRUNCATE = 0
BELOW_FLOOR = 1
BELOW_NEAREST_EVEN = 2
BELOW_STICKY = 3


@njit(cache=True, inline="always")
def floor_log2(value):
    """floor(log2|value|) of a nonzero finite float64, from its bits."""
    _, _, _, _, result = decompose(np.float64(value).view(np.uint64), 11, 52)
    return result


@generic_calls
@njit(cache=True)
def flush_subnormal(value, params, subnormals):
    """``value`` or, when subnormals are off and |value| is below the smallest normal, ±0."""
    if subnormals or value == 0.0 or not math.isfinite(value):
        return value
    if abs(value) < power_of_two(1 - params[P_BIAS]):
        return math.copysign(0.0, value)
    return value


@generic_calls
@njit(cache=True)
def round_float(value, params, rounding, subnormals):
    """``value`` rounded once into the format ``params`` (IEEE overflow), as float64."""
    if value == 0.0 or not math.isfinite(value):
        return value
    value_class, sign, significand, lsb_exponent, leading = decompose(np.float64(value).view(np.uint64), 11, 52)
    code = encode_finite(sign, significand, lsb_exponent, leading, params, rounding, OVERFLOW_INF_NAN, 0)
    return flush_subnormal(decode_code(code, params), params, subnormals)


@generic_calls
@njit(cache=True)
def round_limbs(limbs, bounds, params, rounding, subnormals):
    """The exact sum held in the limbs rounded into ``params``; +0 for an exact zero."""
    code, is_zero = limbs_round(limbs, bounds, params, rounding, OVERFLOW_INF_NAN)
    if is_zero:
        return 0.0
    return flush_subnormal(decode_code(code, params), params, subnormals)


@generic_calls
@njit(cache=True)
def add_round(x, y, params, rounding, subnormals, limbs, bounds):
    """x + y (finite float64s) computed exactly, rounded once into ``params``."""
    limbs_clear(limbs, bounds)
    limbs_add_float(limbs, bounds, x)
    limbs_add_float(limbs, bounds, y)
    result = round_limbs(limbs, bounds, params, rounding, subnormals)
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
    exponent = np.int64((np.float64(value).view(np.uint64) >> np.uint64(52)) & np.uint64(0x7FF)) - 1022
    if exponent > 0 and (np.int64(1) << (exponent - 1)) > value:
        exponent -= 1
    return exponent


@generic_calls
@njit(cache=True)
def round_integer(total, lsb_exponent, params, rounding, subnormals):
    """total * 2^lsb_exponent (int64 total) rounded once into ``params``; +0 for zero."""
    if total == 0:
        return 0.0
    magnitude = abs(total)
    bits = _bit_length(magnitude)
    leading = lsb_exponent + bits - 1
    precision = params[P_MANTISSA_BITS] + 1
    if params[P_EXPONENT_BITS] > 0 and 1 - params[P_BIAS] <= leading < params[P_EMAX]:
        # Normal range, no overflow possible: round the integer directly (the common case).
        shift = bits - precision
        if shift > 0:
            quotient = magnitude >> shift
            remainder = magnitude - (quotient << shift)
            half = np.int64(1) << (shift - 1)
            if round_up(rounding, 1 if total < 0 else 0, quotient & 1, remainder < half, remainder == half,
                        remainder != 0, np.int64(0), np.int64(0)):
                quotient += 1
            magnitude = quotient
            lsb_exponent += shift
        value = scale_by_power_of_two(float(magnitude), lsb_exponent)
        return -value if total < 0 else value
    code = encode_finite(1 if total < 0 else 0, magnitude, lsb_exponent, leading, params, rounding, OVERFLOW_INF_NAN, 0)
    return flush_subnormal(decode_code(code, params), params, subnormals)


@njit(cache=True, inline="always")
def truncate_significand(value, fraction_bits):
    """``value`` with its significand truncated toward zero to 1 + fraction_bits bits."""
    mantissa, exponent = math.frexp(value)
    scale = math.ldexp(1.0, fraction_bits + 1)
    return math.ldexp(math.trunc(mantissa * scale) / scale, exponent)


@njit(cache=True)
def dot_one(
    a_codes, b_codes, a_scales, b_scales, c_value,
    a_values, a_exponents, b_values, b_exponents,
    cfg, order, acc_params, sum_params, out_params, fp32_params,
    limbs, bounds, terms, exponents,
):
    """One dot product c + sum_k a_k b_k through the configured datapath, as a float64 value
    of the output format (NaN, ±Inf, ±0 included)."""
    n_elements = a_codes.shape[0]
    block_size = cfg[C_BLOCK_SIZE]
    scales = cfg[C_SCALES]
    fused_terms = cfg[C_FUSED_TERMS]
    order_length = cfg[C_ORDER_LENGTH]
    acc_in_tree = cfg[C_ACC_IN_TREE] != 0
    fraction_bits = cfg[C_FRACTION_BITS]
    acc_exact = cfg[C_ACC_EXACT] != 0
    acc_rounding = cfg[C_ACC_ROUNDING]
    acc_subnormals = cfg[C_ACC_SUBNORMALS] != 0
    promotion = cfg[C_PROMOTION]
    product_bits = cfg[C_PRODUCT_BITS]
    align_leading_bit = cfg[C_ALIGN_LEADING_BIT] != 0

    special = 0.0  # running IEEE sum of every non-finite contribution
    if not math.isfinite(c_value):
        special = c_value
        c_value = 0.0
    negative_zeros_only = c_value == 0.0 and math.copysign(1.0, c_value) < 0
    outer = 0.0
    acc = 0.0
    limbs_clear(limbs, bounds)
    if acc_exact:
        limbs_add_float(limbs, bounds, c_value)
    elif promotion > 0:
        outer = c_value
    elif cfg[C_C_AT_END] == 0:
        acc = round_float(c_value, acc_params, acc_rounding, acc_subnormals)
        if not math.isfinite(acc):  # c overflows a narrower accumulator
            special = note_overflow(special, acc)
            acc = 0.0

    # With a term order, K is padded to a whole number of order periods: the padded
    # positions are empty (no term, not even +0), as in a unit fed zero-padded operands.
    padded_length = n_elements
    if order_length > 0:
        padded_length = (n_elements + order_length - 1) // order_length * order_length
    n_trees = (padded_length + fused_terms - 1) // fused_terms
    uniform_trees = cfg[C_UNIFORM_TREES] != 0
    for tree in range(n_trees):
        start = tree * fused_terms
        stop = min(start + fused_terms, n_elements)
        fast = False
        count = 0
        tree_scale = 0
        if uniform_trees:
            # One pass, no branches per product: most trees take this path. Zero elements
            # carry a very negative exponent so they never set the reference.
            shift = 0
            scale_ok = True
            if scales != SCALES_NONE:
                scale_a = a_scales[start // block_size]
                scale_b = b_scales[start // block_size]
                scale_ok = scale_a != SCALE_NAN and scale_b != SCALE_NAN
                shift = scale_a + scale_b
            check = 0.0
            for k in range(start, stop):
                code_a = a_codes[k]
                code_b = b_codes[k]
                product = a_values[code_a] * b_values[code_b]
                terms[count] = product
                exponents[count] = a_exponents[code_a] + b_exponents[code_b]
                check += product
                count += 1
            # Fall back for NaN/Inf, NaN scales, and all-zero or exactly cancelling trees (signs of zero).
            fast = scale_ok and math.isfinite(check) and check != 0.0
            if fast:
                negative_zeros_only = False
                if shift != 0:
                    if scales == SCALES_BLOCK_SUM and fraction_bits >= 0:
                        tree_scale = shift
                    else:
                        factor = power_of_two(shift)
                        for i in range(count):
                            terms[i] *= factor
                            exponents[i] += shift
        if not fast:  # any order, scales per element, specials, zeros: the general collection
            count = 0
            tree_scale = 0
            for j in range(fused_terms):
                position = tree * fused_terms + j
                if position >= padded_length:
                    break
                if order_length > 0:
                    k = (position // order_length) * order_length + order[position % order_length]
                    if k >= n_elements:
                        continue
                else:
                    k = position
                code_a = a_codes[k]
                code_b = b_codes[k]
                product = a_values[code_a] * b_values[code_b]
                exponent_sum = a_exponents[code_a] + b_exponents[code_b]
                if scales != SCALES_NONE:
                    block = k // block_size
                    scale_a = a_scales[block]
                    scale_b = b_scales[block]
                    if scale_a == SCALE_NAN or scale_b == SCALE_NAN:
                        product = np.nan
                    elif scales == SCALES_PRODUCTS or fraction_bits < 0:
                        product = scale_by_power_of_two(product, scale_a + scale_b)
                        exponent_sum += scale_a + scale_b
                    else:
                        tree_scale = scale_a + scale_b
                if not math.isfinite(product):
                    special += product
                    continue
                if product == 0.0:
                    if math.copysign(1.0, product) > 0:
                        negative_zeros_only = False
                    continue
                negative_zeros_only = False
                if product_bits >= 0:
                    product = truncate_significand(product, product_bits)
                terms[count] = product
                exponents[count] = floor_log2(product) if align_leading_bit else exponent_sum
                count += 1

        if acc_in_tree and acc != 0.0:
            terms[count] = acc
            exponents[count] = floor_log2(acc)
            count += 1
        # The tree sum as an int64 `total` times 2^lsb_exponent: through the window when the
        # unit has one, else exactly when all terms fit 58 bits below the largest (nearly
        # always); the rare wider exact sum goes through the limbs.
        have_total = True
        total = np.int64(0)
        lsb_exponent = np.int64(0)
        if count > 0:
            reference = exponents[0]
            for i in range(1, count):
                reference = max(reference, exponents[i])
            window_bits = fraction_bits if fraction_bits >= 0 else 58 - _bit_length(count)
            lsb_exponent = reference - window_bits
            factor = power_of_two(-lsb_exponent)  # |lsb_exponent| stays far inside float64's range
            below = cfg[C_BELOW_WINDOW] if fraction_bits >= 0 else BELOW_TRUNCATE
            if below == BELOW_TRUNCATE and fraction_bits >= 0:
                for i in range(count):  # the common case: int conversion truncates toward zero
                    total += np.int64(terms[i] * factor)  # exact: a power-of-two scaling in range
            else:
                for i in range(count):
                    scaled = terms[i] * factor
                    if below == BELOW_TRUNCATE:
                        kept = math.trunc(scaled)
                    elif below == BELOW_FLOOR:
                        kept = math.floor(scaled)
                    elif below == BELOW_NEAREST_EVEN:
                        kept = np.rint(scaled)
                    else:  # sticky: one extra bit below the window, set if anything was dropped
                        magnitude = abs(scaled)
                        whole = math.floor(magnitude)
                        kept = math.copysign(2.0 * whole + (1.0 if magnitude != whole else 0.0), scaled)
                    if fraction_bits < 0 and kept != scaled:
                        have_total = False
                        break
                    total += np.int64(kept)
            if below == BELOW_STICKY:
                lsb_exponent -= 1
            lsb_exponent += tree_scale
            if cfg[C_ADDER_WIDTH] > 0:
                total = adder_register(total, cfg[C_ADDER_WIDTH], cfg[C_ADDER_SATURATES] != 0)
        if acc_exact:  # Kulisch: the tree's exact sum goes straight into the exact accumulator
            if have_total:
                limbs_add_integer(limbs, bounds, total < 0, abs(total), lsb_exponent)
            else:
                for i in range(count):
                    limbs_add_float(limbs, bounds, terms[i])
            continue
        if have_total and cfg[C_SUM_BITS] > 0:
            tree_sum = round_integer(total, lsb_exponent, sum_params, cfg[C_SUM_ROUNDING], True)
            if (acc_in_tree or acc == 0.0) and cfg[C_SUM_FITS_ACCUMULATOR] and tree_sum != 0.0 and (
                cfg[C_ACC_MIN_EXPONENT] <= floor_log2(tree_sum) <= cfg[C_ACC_MAX_EXPONENT]
            ):
                acc = tree_sum  # already a value of the accumulator format: rounding is the identity
            elif acc_in_tree or acc == 0.0:
                acc = round_float(tree_sum, acc_params, acc_rounding, acc_subnormals)
            else:
                acc = add_round(acc, tree_sum, acc_params, acc_rounding, acc_subnormals, limbs, bounds)
        elif have_total and (acc_in_tree or acc == 0.0):
            acc = round_integer(total, lsb_exponent, acc_params, acc_rounding, acc_subnormals)
        else:
            limbs_clear(limbs, bounds)
            if have_total:
                limbs_add_integer(limbs, bounds, total < 0, abs(total), lsb_exponent)
            else:
                for i in range(count):
                    limbs_add_float(limbs, bounds, terms[i])
            if cfg[C_SUM_BITS] > 0:
                tree_sum = round_limbs(limbs, bounds, sum_params, cfg[C_SUM_ROUNDING], True)
                limbs_clear(limbs, bounds)
                limbs_add_float(limbs, bounds, tree_sum)
            if not acc_in_tree:
                limbs_add_float(limbs, bounds, acc)
            acc = round_limbs(limbs, bounds, acc_params, acc_rounding, acc_subnormals)
            limbs_clear(limbs, bounds)
        if not math.isfinite(acc):  # overflow in the accumulator
            special = note_overflow(special, acc)
            acc = 0.0
        if promotion > 0 and ((tree + 1) * fused_terms) % promotion == 0:
            outer = add_round(outer, acc, fp32_params, ROUND_NEAREST_EVEN, True, limbs, bounds)
            acc = 0.0
            if not math.isfinite(outer):
                special = note_overflow(special, outer)
                outer = 0.0

    out_rounding = cfg[C_OUT_ROUNDING]
    out_subnormals = cfg[C_OUT_SUBNORMALS] != 0
    if acc_exact:
        result = round_limbs(limbs, bounds, out_params, out_rounding, out_subnormals)
    else:
        if promotion > 0:
            acc = add_round(outer, acc, fp32_params, ROUND_NEAREST_EVEN, True, limbs, bounds)
        elif cfg[C_C_AT_END] != 0:
            c_converted = round_float(c_value, acc_params, ROUND_NEAREST_EVEN, acc_subnormals)
            if math.isfinite(c_converted):
                acc = add_round(acc, c_converted, acc_params, cfg[C_C_ADD_ROUNDING], acc_subnormals, limbs, bounds)
            else:
                special = note_overflow(special, c_converted)
        if not math.isfinite(acc):
            special = note_overflow(special, acc)
            acc = 0.0
        result = round_float(acc, out_params, out_rounding, out_subnormals)
    if special != 0.0 or math.isnan(special):
        return np.nan if math.isnan(special) else special  # the canonical (positive) quiet NaN
    if result == 0.0 and not math.copysign(1.0, result) < 0:
        # An exact zero: -0 only when c and every product are -0 (IEEE's sum of zeros); a
        # negative result that rounded to zero has kept its sign above.
        return -0.0 if negative_zeros_only else 0.0
    return result


@njit(cache=True)
def _output_code(value, out_params):
    """The output code of a value that is already exactly representable (or NaN/Inf)."""
    bits = np.float64(value).view(np.uint64)
    return encode_bits(bits, 11, 52, 0, out_params, ROUND_NEAREST_EVEN, OVERFLOW_INF_NAN, 0)


@njit(cache=True, parallel=True)
def dot_pairs(
    a_codes, b_codes, a_scales, b_scales, c_values,
    a_values, a_exponents, b_values, b_exponents,
    cfg, order, acc_params, sum_params, out_params, fp32_params, out,
):
    """out[i] = output code of the dot product of row i of A with row i of B."""
    n_rows = a_codes.shape[0]
    width = cfg[C_FUSED_TERMS] + 1
    n_chunks = min(n_rows, 256)
    for chunk in prange(n_chunks):  # scratch buffers once per chunk, not per row
        limbs, bounds = _thread_limbs()
        terms = np.empty(width, dtype=np.float64)
        exponents = np.empty(width, dtype=np.int64)
        for i in range(chunk * n_rows // n_chunks, (chunk + 1) * n_rows // n_chunks):
            value = dot_one(
                a_codes[i], b_codes[i], a_scales[i], b_scales[i], c_values[i],
                a_values, a_exponents, b_values, b_exponents,
                cfg, order, acc_params, sum_params, out_params, fp32_params,
                limbs, bounds, terms, exponents,
            )
            out[i] = _output_code(value, out_params)


@njit(cache=True, parallel=True)
def matmul_rows(
    a_codes, b_codes, a_scales, b_scales, c_values,
    a_values, a_exponents, b_values, b_exponents,
    cfg, order, acc_params, sum_params, out_params, fp32_params, out,
):
    """out[m, n] = output code of row m of A (M, K) dotted with row n of B given as (N, K).

    ``c_values`` is (M, N), or (1, 1) for one value shared by every output (no M x N copy).
    """
    n_rows = a_codes.shape[0]
    n_columns = b_codes.shape[0]
    c_rows, c_columns = c_values.shape
    width = cfg[C_FUSED_TERMS] + 1
    for m in prange(n_rows):
        limbs, bounds = _thread_limbs()
        terms = np.empty(width, dtype=np.float64)
        exponents = np.empty(width, dtype=np.int64)
        for n in range(n_columns):
            value = dot_one(
                a_codes[m], b_codes[n], a_scales[m], b_scales[n], c_values[m % c_rows, n % c_columns],
                a_values, a_exponents, b_values, b_exponents,
                cfg, order, acc_params, sum_params, out_params, fp32_params,
                limbs, bounds, terms, exponents,
            )
            out[m, n] = _output_code(value, out_params)


@njit(cache=True, inline="always")
def _thread_limbs():
    return np.zeros(N_LIMBS, dtype=np.int64), np.array([N_LIMBS, -1], dtype=np.int64)
