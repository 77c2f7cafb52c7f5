"""Slow reference twin of the datapath: one dot product in Python Fractions, stage by stage.

Written from the parameter definitions in ``datapath.schema.SCHEMA`` and the seven steps of
docs/hwconfig.md (not from the kernel), one function per step as the kernel has them:
:func:`_decode` and :func:`_multiply` (steps 1-2), :func:`tree_positions` (3, with
:func:`_group_terms` for ``scales: group_sum``),
:func:`_align_and_add` (4-5) and :func:`_normalise` (5), :func:`_accumulate`,
:func:`_promote` and :func:`_add_c_at_end` (6), :func:`_output_value` (7), named after the
kernel's stages; the matrix-core adders
:func:`_parity_sum`, :func:`_second_alignment` and :func:`_pairwise_dot`. Every intermediate value
is an exact Fraction; every rounding goes through
:func:`mxsim.formats.reference.encode_reference`. It also records each stage, which is what
``mxsim dot --explain`` prints.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import TypeGuard

from ..errors import ArgumentError, ConfigError
from ..formats import FormatInfo, custom_format, get_format
from ..formats.bits import floor_log2
from ..formats.reference import decode_reference, encode_reference
from .schema import ACCUMULATOR_OVERFLOW, DatapathParams

INF = math.inf
#: A stage value: exact, or a float for a signed zero, an infinity or NaN.
Value = Fraction | float


def alignment_emin(fmt: FormatInfo) -> int:
    """The smallest alignment exponent of an element format (docs/hwconfig.md step 1): that
    of its smallest normal value, so subnormals share it; for a fixed-point format (no
    exponent field, MX INT8) the leading-bit exponent of its largest value."""
    anchor = fmt.min_normal if fmt.exponent_bits else fmt.max_finite
    return floor_log2(Fraction(anchor))


def sum_format(bits: int) -> FormatInfo:
    """The 'n significant bits, wide exponent' format of ``adder.sum_significant_bits``."""
    return custom_format(10, bits - 1, name=f"sum{bits}")


def adder_register_bits(params: DatapathParams) -> int:
    """The adder register's width as docs/hwconfig.md defines ``carry_bits``: a sign bit, the
    window's F fraction bits and two integer bits, the carry bits, and the sticky bit."""
    sticky = 1 if params.below_window == "sticky" else 0
    return 1 + (params.align_fraction_bits + 2) + params.carry_bits + sticky


def _round(
    value, fmt: FormatInfo, rounding: str, subnormals: bool = True, overflow: str = "inf_nan"
):
    """Round an exact value into ``fmt`` (``overflow``: a formats overflow policy, IEEE's by default).

    Returns a Fraction, ±inf, or -0.0 for a negative value that rounds to zero (IEEE keeps
    its sign); an exact zero returns Fraction(0).
    """
    value = Fraction(value)
    if value == 0:
        return Fraction(0)
    code = encode_reference(fmt, value, rounding, overflow)
    result = decode_reference(fmt, code)
    if isinstance(result, float):
        return -0.0 if result == 0 else result
    if result == 0:
        return -0.0 if value < 0 else Fraction(0)
    if not subnormals and abs(result) < Fraction(fmt.min_normal):
        return -0.0 if result < 0 else Fraction(0)
    return result


def _is_infinite(value) -> TypeGuard[float]:
    return isinstance(value, float) and math.isinf(value)


def _to_float(value) -> float | str:
    """A stage value for the record: the float of an exact value, or where that would
    overflow or underflow (fp64 products reach 2^2048 and 2^-2148) the text "m*2^e" with m
    in [1, 2) rounded to a float."""
    if not isinstance(value, Fraction):
        return value
    if value == 0 or Fraction(2) ** -1074 <= abs(value) < Fraction(2) ** 1024:
        return float(value)
    exponent = floor_log2(abs(value))
    return f"{float(value / Fraction(2) ** exponent)!r}*2^{exponent}"


class _Specials:
    """What IEEE rules decide at the end: the non-finite contributions (summed then) and
    whether every zero seen so far (c and products) was -0."""

    def __init__(self, c: float):
        self.values: list[float] = []
        # NaN/Inf of registers outside the accumulator (an outer accumulator under promotion,
        # c added at the end): they meet the accumulator's by an IEEE add at the end
        self.outside: list[float] = []
        self.negative_zeros_only = c == 0 and math.copysign(1.0, c) < 0

    def promote(self) -> None:
        """The accumulator's NaN/Inf moves into the outer accumulator with its value."""
        self.outside.extend(self.values)
        self.values = []

    def note_overflow(self, value: float) -> None:
        # An earlier NaN/Inf (an input, or a first overflow) absorbs any later overflow,
        # as an infinite accumulator absorbs every finite sum.
        if not self.values:
            self.values.append(value)


# --- steps 1-2: decode, multiply ----------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 16)
def _decode(fmt: FormatInfo, code: int, input_subnormals: bool, zeros_positive: bool = False):
    """Step 1: (exact value, alignment exponent or None for zero and specials); with
    ``zeros_positive`` (``inputs.zero_sign: positive``) a zero is +0. Memoised: a pure function
    of its arguments, and decoding every element with Fractions was most of the twin's time
    (stage dumps of golden vectors call it per vector)."""
    value = decode_reference(fmt, code)
    if (
        isinstance(value, Fraction)
        and not input_subnormals
        and value != 0
        and abs(value) < Fraction(fmt.min_normal)
    ):
        value = -0.0 if value < 0 else Fraction(0)
    if zeros_positive and value == 0:
        value = Fraction(0)
    exponent = None
    if isinstance(value, Fraction) and value != 0:
        exponent = max(floor_log2(abs(value)), alignment_emin(fmt))
    return value, exponent


def _multiply(params: DatapathParams, value_a, exponent_a, value_b, exponent_b, scale_codes):
    """Step 2: (product, alignment exponent, scale exponent still to apply to the tree sum).

    The product is a Fraction, or a float for ±0 (its sign), ±Inf and NaN (a NaN scale
    included, and a product of at least 2^product_overflow_exponent). ``scale_codes`` are the
    block's E8M0 codes (None: the unit takes no scales)."""
    scale_exponent = 0
    scale_is_nan = False
    product: Value
    if scale_codes is not None:
        scale_is_nan = 255 in scale_codes
        scale_exponent = scale_codes[0] + scale_codes[1] - 254
    if scale_is_nan or any(isinstance(v, float) and math.isnan(v) for v in (value_a, value_b)):
        product = math.nan
    elif any(isinstance(v, float) and math.isinf(v) for v in (value_a, value_b)):
        other = value_b if isinstance(value_a, float) and math.isinf(value_a) else value_a
        product = math.nan if other == 0 else math.copysign(INF, float(value_a) * float(value_b))
    else:
        product = Fraction(value_a) * Fraction(value_b)
        if product == 0:
            sign_negative = (math.copysign(1.0, float(value_a)) < 0) != (
                math.copysign(1.0, float(value_b)) < 0
            )
            product = -0.0 if sign_negative else 0.0
    exponent = None if exponent_a is None or exponent_b is None else exponent_a + exponent_b
    if isinstance(product, Fraction) and params.scales in ("products", "block_sum"):
        # 'products' scales every product; so does 'block_sum' when no window follows.
        # ('group_sum' scales each group's sum: _group_terms.)
        if params.scales == "products" or params.align_fraction_bits is None:
            product *= Fraction(2) ** scale_exponent
            assert exponent is not None  # a finite nonzero product: both elements have exponents
            exponent += scale_exponent
            scale_exponent = 0
    if (
        isinstance(product, Fraction)
        and params.product_overflow_exponent is not None
        and abs(product) >= Fraction(2) ** params.product_overflow_exponent
    ):
        product = math.copysign(INF, product)  # the multiplier overflows
    if isinstance(product, Fraction) and params.product_fraction_bits is not None:
        lead = floor_log2(abs(product))
        step = Fraction(2) ** (lead - params.product_fraction_bits)
        product = math.trunc(product / step) * step
    if isinstance(product, Fraction) and params.align_reference == "leading_bit":
        exponent = floor_log2(abs(product))
    return product, exponent, scale_exponent


# --- step 3: order and trees --------------------------------------------------------------------


def tree_positions(length: int, params: DatapathParams) -> list[list[int | None]]:
    """The k of every tree position, in tree order; None for a padded position (no term)."""
    if params.term_order is not None:
        # K padded to whole periods of the order; padded positions hold no term.
        period = len(params.term_order)
        padded = -(-length // period) * period
        sequence = [(p // period) * period + params.term_order[p % period] for p in range(padded)]
        sequence = [k if k < length else None for k in sequence]
    else:
        sequence = list(range(length))
    if (
        params.trees_in_blocks
    ):  # each block cut into trees on its own: a block's last tree may be short
        blocks = [
            sequence[start : start + params.block_size]
            for start in range(0, len(sequence), params.block_size)
        ]
    else:
        blocks = [sequence]
    return [
        block[start : start + params.fused_terms]
        for block in blocks
        for start in range(0, len(block), params.fused_terms)
    ]


def _finite_terms(positions, products, specials: _Specials) -> list[tuple]:
    """A tree's nonzero finite (product, exponent, scale exponent); specials and zero signs noted."""
    kept = []
    for k in positions:
        if k is None:  # a padded position
            continue
        product, exponent, scale_exponent = products[k]
        if isinstance(product, float):
            if math.isnan(product) or math.isinf(product):
                specials.values.append(product)
            elif math.copysign(1.0, product) > 0:
                specials.negative_zeros_only = False
            continue
        specials.negative_zeros_only = False
        kept.append((product, exponent, scale_exponent))
    return kept


def _scale_value(fmt: FormatInfo, code: int):
    """A block scale's (exact value or NaN, alignment exponent or None for zero and NaN)."""
    value = decode_reference(fmt, code)
    if isinstance(value, float) or value == 0:
        return value, None
    exponent = floor_log2(value)
    if fmt.subnormals:
        exponent = max(exponent, 1 - fmt.bias)
    return value, exponent


def _group_terms(
    positions, products, scale_codes, params: DatapathParams, specials: _Specials, log
):
    """``scales: group_sum``, steps 1-3 of a tree: per group of ``group_terms`` positions the
    exact sum g of its products and its block's scales sa, sb give one term g*sa*sb aligned at
    ea + eb. All-zero groups and zero scales are zero terms (they count only with
    ``zero_term_exponent``); NaN/Inf products and NaN scales become specials. Returns (the
    nonzero terms, whether the tree has a zero term)."""
    scale_fmt = get_format(params.scale_format)
    terms = []
    has_zero = False
    for start in range(0, len(positions), params.group_terms):
        group = [k for k in positions[start : start + params.group_terms] if k is not None]
        if not group:
            continue
        kept = _finite_terms(group, products, specials)
        all_zero = not kept and not any(
            isinstance(products[k][0], float) and not products[k][0] == 0 for k in group
        )
        group_sum = sum((p for p, _, _ in kept), Fraction(0))
        block = group[0] // params.block_size
        (value_a, exponent_a), (value_b, exponent_b) = (
            _scale_value(scale_fmt, codes[block]) for codes in scale_codes
        )
        log(
            {
                "stage": "group",
                "start": group[0],
                "sum": _to_float(group_sum),
                "scale_a": _to_float(value_a),
                "scale_b": _to_float(value_b),
            }
        )
        if any(isinstance(v, float) for v in (value_a, value_b)):  # a NaN scale
            specials.values.append(math.nan)
        elif all_zero or value_a == 0 or value_b == 0:
            has_zero = True
        else:
            terms.append((group_sum * value_a * value_b, exponent_a + exponent_b, 0))
    return terms, has_zero


# --- steps 4-5: align, add, normalise -----------------------------------------------------------


def _reference(terms: list[tuple], has_zero: bool, params: DatapathParams) -> int:
    """A tree's reference R: the largest term exponent, at least ``zero_term_exponent`` when
    the tree has a zero term."""
    reference = max(e for _, e in terms)
    if has_zero and params.zero_term_exponent is not None:
        reference = max(reference, params.zero_term_exponent)
    return reference


def _align_and_add(terms: list[tuple], has_zero: bool, params: DatapathParams, log):
    """Steps 4-5 with a window: (reference R, each term as the adder keeps it, their sum
    through the adder register). R is the largest exponent, and at least
    ``zero_term_exponent`` when the tree has a zero term; the terms keep multiples of the
    LSB 2^(R-F) (the rest as ``below_window`` says)."""
    reference = _reference(terms, has_zero, params)
    lsb = Fraction(2) ** (reference - params.align_fraction_bits)
    kept_terms = []
    for term, _ in terms:
        ratio = term / lsb
        if params.below_window == "truncate":
            kept = Fraction(math.trunc(ratio)) * lsb
        elif params.below_window == "floor":
            kept = Fraction(math.floor(ratio)) * lsb
        elif params.below_window == "nearest_even":
            kept = Fraction(round(ratio)) * lsb  # Python rounds Fraction ties to even
        else:
            whole = math.floor(abs(ratio))
            jammed = 2 * whole + (1 if abs(ratio) != whole else 0)
            kept = Fraction(jammed if ratio >= 0 else -jammed) * lsb / 2
        kept_terms.append(kept)
    return reference, kept_terms, _adder_register(sum(kept_terms, Fraction(0)), lsb, params, log)


def _adder_register(tree_sum: Fraction, lsb: Fraction, params: DatapathParams, log) -> Fraction:
    """Step 5's add: the kept terms' exact sum ``tree_sum`` through the adder register when
    ``carry_bits`` gives it a width (wrapped or saturated beyond it)."""
    if params.carry_bits is None:
        return tree_sum
    step = lsb / 2 if params.below_window == "sticky" else lsb
    register = tree_sum / step  # an integer
    limit = 2 ** (adder_register_bits(params) - 1)
    if not -limit <= register < limit:
        if params.adder_overflow == "saturate":
            register = limit - 1 if register > 0 else -limit
        else:
            register = (register + limit) % (2 * limit) - limit
        log({"stage": "adder_overflow", "register": int(register)})
    return register * step


def _accumulator_exponent(acc, holds_c: bool, params: DatapathParams) -> int:
    """The alignment exponent of a nonzero accumulator (``accumulator_exponent``); with
    ``format_emin``, while it still holds c (the first tree) c_format's emin bounds it too."""
    exponent = floor_log2(abs(Fraction(acc)))
    if params.accumulator_exponent == "format_emin":
        exponent = max(exponent, alignment_emin(get_format(params.accumulator_format)))
        if holds_c:
            exponent = max(exponent, alignment_emin(get_format(params.c_format)))
    return exponent


def _tree_sum(
    kept: list[tuple], has_zero: bool, acc, tree_start: int, params: DatapathParams, log
) -> Fraction:
    """Steps 4-5 of one tree: its sum (with the accumulator when it joins the tree), the
    block scale applied (``block_sum``). ``has_zero``: the tree has a zero product."""
    terms = [(p, e) for p, e, _ in kept]
    tree_scale = kept[0][2] if kept and params.scales == "block_sum" else 0
    if params.accumulator_in_tree and acc != 0:
        terms.append((Fraction(acc), _accumulator_exponent(acc, tree_start == 0, params)))
    elif params.accumulator_in_tree:
        has_zero = True  # a zero accumulator is a zero term
    if params.align_fraction_bits is None or not terms:
        tree_sum = sum((t for t, _ in terms), Fraction(0))
        log({"stage": "tree", "start": tree_start, "exact_sum": _to_float(tree_sum)})
        return tree_sum
    reference, kept_terms, tree_sum = _align_and_add(terms, has_zero, params, log)
    tree_sum = tree_sum * Fraction(2) ** tree_scale
    log(
        {
            "stage": "tree",
            "start": tree_start,
            "reference_exponent": reference,
            "lsb_exponent": reference - params.align_fraction_bits,
            "terms": [_to_float(t) for t, _ in terms],
            "aligned": [_to_float(t) for t in kept_terms],
            "dropped": [_to_float(t - k) for (t, _), k in zip(terms, kept_terms)],
            "sum": _to_float(tree_sum),
        }
    )
    return tree_sum


def _normalise(tree_sum: Fraction, params: DatapathParams, log):
    """Step 5: the tree sum rounded to ``sum_significant_bits`` (when set)."""
    if params.sum_significant_bits is None:
        return tree_sum
    tree_sum = _round(tree_sum, sum_format(params.sum_significant_bits), params.sum_rounding)
    log({"stage": "normalise", "bits": params.sum_significant_bits, "value": _to_float(tree_sum)})
    return tree_sum


# --- steps 4-6 of adder.parity_windows and adder.second_alignment_bits ---------------------------


def _parity_sum(halves: list[tuple], tree_start: int, params: DatapathParams, log):
    """``parity_windows``: the (nonzero finite terms, has a zero) of a tree's even and odd
    positions, each aligned and added in its own window; each window sum kept, toward -inf,
    to multiples of 2^(R - align_fraction_bits) for the larger reference R. Returns (the sum,
    R), R None when no window has a term."""
    sums = []
    for kept, has_zero in halves:
        if not kept:
            continue
        tree_scale = kept[0][2] if params.scales == "block_sum" else 0
        reference, _, window_sum = _align_and_add(
            [(p, e) for p, e, _ in kept], has_zero, params, log
        )
        sums.append((window_sum * Fraction(2) ** tree_scale, reference + tree_scale))
    if not sums:
        return Fraction(0), None
    reference = max(r for _, r in sums)
    step = Fraction(2) ** (reference - params.align_fraction_bits)
    total = sum((math.floor(window_sum / step) * step for window_sum, _ in sums), Fraction(0))
    log(
        {
            "stage": "parity_windows",
            "start": tree_start,
            "window_sums": [_to_float(w) for w, _ in sums],
            "references": [r for _, r in sums],
            "reference_exponent": reference,
            "sum": _to_float(total),
        }
    )
    return total, reference


def _second_alignment(
    acc,
    tree_sum: Fraction,
    reference: int | None,
    acc_fmt: FormatInfo,
    params: DatapathParams,
    specials: _Specials,
    log,
):
    """``second_alignment_bits`` n: at E = max(R, e) (e: the accumulator's exponent, at least
    its format's emin, that emin for zero) the tree sum is kept to multiples of 2^(E-n-1) and
    the accumulator to multiples of 2^(E-F) (F = align_fraction_bits), both toward -inf (the
    accumulator dropped below E-F-1 with ``far_accumulator: zero``); their sum is cut to n+1
    significant bits toward -inf, no finer than 2^(emin-n), and rounded into the accumulator."""
    emin = 1 - acc_fmt.bias
    exponent = emin if acc == 0 else max(floor_log2(abs(Fraction(acc))), emin)
    top = exponent if reference is None else max(reference, exponent)
    bits, window = params.second_alignment_bits, params.align_fraction_bits
    sum_step, acc_step = Fraction(2) ** (top - bits - 1), Fraction(2) ** (top - window)
    kept_sum = math.floor(tree_sum / sum_step) * sum_step
    dropped = params.far_accumulator == "zero" and exponent < top - window - 1
    kept_acc = Fraction(0) if dropped else math.floor(Fraction(acc) / acc_step) * acc_step
    total = kept_sum + kept_acc
    if total != 0:
        cut = Fraction(2) ** (max(floor_log2(abs(total)), emin) - bits)
        total = math.floor(total / cut) * cut
    result = _round(
        total,
        acc_fmt,
        params.accumulator_rounding,
        params.accumulator_subnormals,
        ACCUMULATOR_OVERFLOW[params.accumulator_overflow],
    )
    log(
        {
            "stage": "second_alignment",
            "exponent": top,
            "tree_sum": _to_float(kept_sum),
            "accumulator": _to_float(kept_acc),
            "accumulator_dropped": dropped,
            "cut_sum": _to_float(total),
            "result": _to_float(result),
        }
    )
    if _is_infinite(result):
        specials.note_overflow(result)
        result = Fraction(0)
    return result


def _special_accumulator(
    acc, carried: list, reference: int | None, params: DatapathParams, specials: _Specials, log
):
    """``special_accumulator_exponent`` e: an accumulator that is NaN or ±Inf (``carried``)
    meets the tree at E = max(R, e). It is dropped, with the finite part kept beside it,
    when the tree has no NaN/Inf of its own and e < E - align_fraction_bits - 1; otherwise it
    stays. Returns the accumulator's finite part (0 once dropped)."""
    exponent = params.special_accumulator_exponent
    top = exponent if reference is None else max(reference, exponent)
    if not specials.values and exponent < top - params.align_fraction_bits - 1:
        log(
            {
                "stage": "special_accumulator",
                "dropped": [float(v) for v in carried],
                "exponent": top,
            }
        )
        return Fraction(0)
    specials.values = carried + specials.values
    return acc


# --- steps 5-6 with a fixed-point grid ----------------------------------------------------------


def _grid_accumulate(
    acc,
    kept: list[tuple],
    scale_exponent: int,
    acc_fmt: FormatInfo,
    params: DatapathParams,
    specials: _Specials,
    log,
):
    """``grid.fraction_bits``: the tree's exact product sum S on the grid of LSB 2^(X - n); the
    accumulator's LSB 2^(e - m) (e: its exponent, emin when subnormal, emin - 1 when zero)
    lies d places above the grid's. The result is the accumulator itself (a float -0.0
    included) when d > accumulator_max_left_shift, or when d < -accumulator_max_right_shift
    and S == 0; else acc + S rounded once (an exact zero is +0)."""
    emin = 1 - acc_fmt.bias
    exponent = emin - 1 if acc == 0 else max(floor_log2(abs(Fraction(acc))), emin)
    offset = (exponent - acc_fmt.mantissa_bits) - (scale_exponent - params.grid_fraction_bits)
    products = sum((p for p, _, _ in kept), Fraction(0))
    passes = offset > params.grid_max_left_shift or (
        offset < -params.grid_max_right_shift and products == 0
    )
    if not passes:
        acc = _round(
            Fraction(acc) + products,
            acc_fmt,
            params.accumulator_rounding,
            params.accumulator_subnormals,
            ACCUMULATOR_OVERFLOW[params.accumulator_overflow],
        )
        if _is_infinite(acc):
            specials.note_overflow(acc)
            acc = Fraction(0)
    log(
        {
            "stage": "grid",
            "scale_exponent": scale_exponent,
            "accumulator_lsb_above_grid": offset,
            "product_sum": _to_float(products),
            "pass_through": passes,
            "accumulator": _to_float(acc),
        }
    )
    return acc


def _block_scale_exponent(k: int, scale_a, scale_b, params: DatapathParams) -> int:
    """(Xa-127)+(Xb-127) of the block holding element k (0 without scales)."""
    if params.scales == "none":
        return 0
    block = k // params.block_size
    return (
        (127 if scale_a is None else scale_a[block])
        + (127 if scale_b is None else scale_b[block])
        - 254
    )


# --- step 6: accumulate -------------------------------------------------------------------------


def _accumulate(acc, tree_sum, acc_fmt: FormatInfo, params: DatapathParams, specials: _Specials):
    """Step 6: the tree sum (plus the accumulator when it is outside the tree) rounded once
    into the accumulator format; an overflow becomes the running special."""
    if not params.accumulator_in_tree:
        tree_sum += Fraction(acc)
    acc = _round(
        tree_sum,
        acc_fmt,
        params.accumulator_rounding,
        params.accumulator_subnormals,
        ACCUMULATOR_OVERFLOW[params.accumulator_overflow],
    )
    if _is_infinite(acc):  # overflow to infinity
        specials.note_overflow(acc)
        acc = Fraction(0)
    return acc


def _promote(outer, acc, specials: _Specials):
    """``promotion_interval``: the accumulator added into the outer fp32 accumulator (RNE),
    its NaN/Inf with it; an overflow leaves the outer accumulator ±Inf."""
    specials.promote()
    outer = _round(Fraction(outer) + Fraction(acc), get_format("fp32"), "nearest_even")
    if _is_infinite(outer):
        if not specials.outside:
            specials.outside.append(outer)
        outer = Fraction(0)
    return outer


def _add_c_at_end(
    acc, c_exact: Fraction, acc_fmt: FormatInfo, params: DatapathParams, specials: _Specials, log
):
    """``c_entry: end``: c rounded into the accumulator format (nearest even), then added with
    ``c_add_rounding``."""
    overflow = ACCUMULATOR_OVERFLOW[params.accumulator_overflow]
    c_converted = _round(c_exact, acc_fmt, "nearest_even", params.accumulator_subnormals, overflow)
    if _is_infinite(c_converted):
        specials.outside.append(c_converted)
    else:
        acc = _round(
            Fraction(acc) + Fraction(c_converted),
            acc_fmt,
            params.c_add_rounding,
            params.accumulator_subnormals,
            overflow,
        )
    log({"stage": "add_c", "c": _to_float(c_converted), "accumulator": _to_float(acc)})
    return acc


# --- adder.structure: pairwise_rounded ----------------------------------------------------------


def _is_negative_zero(value) -> bool:
    return isinstance(value, float) and value == 0 and math.copysign(1.0, value) < 0


def _ieee_round(value, fmt: FormatInfo, params: DatapathParams):
    """A product or c (Fraction, or float for ±0, ±Inf, NaN) rounded into the accumulator format
    as an IEEE operation would (flushed, keeping its sign, without accumulator.subnormals)."""
    if isinstance(value, float):
        return value
    return _round(
        value,
        fmt,
        params.accumulator_rounding,
        params.accumulator_subnormals,
        ACCUMULATOR_OVERFLOW[params.accumulator_overflow],
    )


def _ieee_add(x, y, fmt: FormatInfo, params: DatapathParams):
    """x + y as an IEEE 754 add rounded into ``fmt`` with the accumulator's rounding,
    subnormals and overflow: NaN and Inf rules, the signs of zero sums, one rounding."""
    if any(isinstance(v, float) and math.isnan(v) for v in (x, y)):
        return math.nan
    infinities = [v for v in (x, y) if _is_infinite(v)]
    if infinities:
        return (
            math.nan if len(infinities) == 2 and infinities[0] != infinities[1] else infinities[0]
        )
    toward_negative = params.accumulator_rounding == "toward_negative"
    if x == 0 and y == 0:
        return (
            -0.0
            if (_is_negative_zero(x) and _is_negative_zero(y)) or toward_negative
            else Fraction(0)
        )
    if x == 0 or y == 0:
        return y if x == 0 else x
    total = Fraction(x) + Fraction(y)
    if total == 0:
        return -0.0 if toward_negative else Fraction(0)
    return _ieee_round(total, fmt, params)


def _pairwise_dot(
    params: DatapathParams,
    products: list[tuple],
    trees,
    c: float,
    acc_fmt: FormatInfo,
    out_fmt: FormatInfo,
    log,
) -> float:
    """``adder.structure: pairwise_rounded``: c rounded into the accumulator format; per tree
    each product rounded into it, the products added pair by pair ((p0+p1)+(p2+p3); an odd
    last one carried up), the tree's result added to the accumulator; every add an IEEE add
    rounded into the accumulator format; then the output rounding."""
    acc = c if c == 0 or not math.isfinite(c) else _ieee_round(Fraction(c), acc_fmt, params)
    if params.input_zero_sign == "positive" and acc == 0:
        acc = Fraction(0)  # c flushed by the rounding is read as +0 too
    log({"stage": "accumulator_start", "value": _to_float(acc)})
    for positions in trees:
        level = []
        for k in positions:
            if k is None:  # a padded position
                continue
            product, _, scale_exponent = products[k]
            if isinstance(product, Fraction):
                product *= Fraction(2) ** scale_exponent
            level.append(_ieee_round(product, acc_fmt, params))
        if not level:
            continue
        levels = [level]
        while len(level) > 1:
            pairs = [
                _ieee_add(level[i], level[i + 1], acc_fmt, params)
                for i in range(0, len(level) - 1, 2)
            ]
            level = pairs + level[len(pairs) * 2 :]
            levels.append(level)
        acc = _ieee_add(acc, level[0], acc_fmt, params)
        log(
            {
                "stage": "pairwise",
                "start": positions[0],
                "levels": [[_to_float(v) for v in lv] for lv in levels],
                "accumulator": _to_float(acc),
            }
        )
    if isinstance(acc, float):
        value = math.nan if math.isnan(acc) else acc
    else:
        value = float(
            _round(acc, out_fmt, params.output_rounding, params.output_subnormals)
        )  # a value of out_fmt
    if value == 0 and params.output_zero_sign == "positive":
        value = 0.0
    log({"stage": "output", "value": value})
    return value


# --- the dot product ----------------------------------------------------------------------------


def dot_reference(
    params: DatapathParams,
    a_codes: list[int],
    b_codes: list[int],
    scale_a: list[int] | None = None,
    scale_b: list[int] | None = None,
    c: float = 0.0,
    record: list | None = None,
) -> float:
    """The output value (a float, exact for the output format) of c + sum a_k b_k.

    ``scale_a``/``scale_b`` are codes of ``scale_format`` per block (None: every scale 1).
    ``record``, when given, receives one dict per stage.
    """
    if params.same_format and params.a_format != params.b_format:
        raise ConfigError(
            "<params>",
            "inputs.same_format",
            f"one element format for A and B, got {params.a_format!r} and {params.b_format!r}",
        )
    a_fmt, b_fmt = get_format(params.a_format), get_format(params.b_format)
    acc_fmt = (
        None if params.accumulator_format == "exact" else get_format(params.accumulator_format)
    )
    out_fmt = get_format(params.output_format)
    log = record.append if record is not None else (lambda item: None)

    if params.input_zero_sign == "positive" and (
        c == 0
        or (
            acc_fmt is not None
            and not params.accumulator_subnormals
            and abs(c) < acc_fmt.min_normal
        )
    ):
        c = 0.0  # c read as +0
    c_given = c  # (a pairwise_rounded adder takes c's specials into its IEEE adds)
    specials = _Specials(c)
    if not math.isfinite(c):
        c_outside = acc_fmt is not None and (params.promotion_interval or params.c_entry == "end")
        (specials.outside if c_outside else specials.values).append(c)
        c = 0.0
    c_exact = Fraction(c)
    if c_exact != 0 and _round(c_exact, get_format(params.c_format), "nearest_even") != c_exact:
        raise ArgumentError(f"c = {c!r} is not a {params.c_format} value (inputs.c_format)")

    products = []  # per k: (value Fraction or float special, alignment exponent, scale exponent)
    for k, (code_a, code_b) in enumerate(zip(a_codes, b_codes)):
        zeros_positive = params.input_zero_sign == "positive"
        value_a, exponent_a = _decode(a_fmt, int(code_a), params.input_subnormals, zeros_positive)
        value_b, exponent_b = _decode(b_fmt, int(code_b), params.input_subnormals, zeros_positive)
        scale_codes = None
        if params.scales in ("products", "block_sum"):
            block = k // params.block_size
            scale_codes = (
                127 if scale_a is None else scale_a[block],
                127 if scale_b is None else scale_b[block],
            )
        product, exponent, scale_exponent = _multiply(
            params, value_a, exponent_a, value_b, exponent_b, scale_codes
        )
        products.append((product, exponent, scale_exponent))
        log(
            {
                "stage": "product",
                "k": k,
                "a_code": code_a,
                "b_code": code_b,
                "a": _to_float(value_a),
                "b": _to_float(value_b),
                "product": _to_float(product),
                "exponent": exponent,
                "block_scale_exponent": scale_exponent,
            }
        )
    trees = tree_positions(len(products), params)
    if params.structure == "pairwise_rounded":
        if acc_fmt is None:
            raise ConfigError(
                "<params>",
                "accumulator.format",
                "adder.structure: pairwise_rounded needs a floating format",
            )
        return _pairwise_dot(params, products, trees, c_given, acc_fmt, out_fmt, log)
    if params.scales == "group_sum":  # None: every scale 1
        one = encode_reference(get_format(params.scale_format), Fraction(1))
        blocks = -(-len(products) // params.block_size)
        group_scales = tuple(
            [one] * blocks if codes is None else list(codes) for codes in (scale_a, scale_b)
        )

    def tree_terms(positions):
        """A tree's (nonzero finite terms, whether it has a zero term)."""
        if params.scales == "group_sum":
            return _group_terms(positions, products, group_scales, params, specials, log)
        has_zero = any(
            k is not None and isinstance(products[k][0], float) and products[k][0] == 0
            for k in positions
        )
        return _finite_terms(positions, products, specials), has_zero

    if acc_fmt is None:  # exact (Kulisch) accumulator: one rounding, at the output
        total = c_exact + sum(
            (p * Fraction(2) ** s for positions in trees for p, _, s in tree_terms(positions)[0]),
            Fraction(0),
        )
        log({"stage": "exact_accumulator", "value": _to_float(total)})
        result = _round(total, out_fmt, params.output_rounding, params.output_subnormals)
        return _output_value(result, specials, params, log)

    outer: Value = Fraction(0)
    acc: Value = Fraction(0)
    if params.promotion_interval:
        outer = c_exact
    elif params.c_entry == "initial":
        acc = _round(
            c_exact,
            acc_fmt,
            params.accumulator_rounding,
            params.accumulator_subnormals,
            ACCUMULATOR_OVERFLOW[params.accumulator_overflow],
        )
        if _is_infinite(acc):  # c overflows a narrower accumulator
            specials.note_overflow(acc)
            acc = Fraction(0)
    steps = (
        params.output_zero_sign == "ieee_steps"
    )  # (an exact accumulator returned above: one step)
    if steps and _is_negative_zero(c):
        acc = -0.0  # the first step's addends include c's sign
    if params.grid_fraction_bits is not None:
        # A grid returns the accumulator itself in its pass-through rules: c = -0 stays -0.
        acc = -0.0 if c == 0 and math.copysign(1.0, c) < 0 else acc
        specials.negative_zeros_only = False  # the grid's rules set the sign of a zero
    log({"stage": "accumulator_start", "value": _to_float(acc), "outer": _to_float(outer)})

    for index, positions in enumerate(trees):
        tree_start = index * params.fused_terms
        # ieee_steps: this step's exact zero is -0 when the accumulator and every product are -0
        negative_step = (
            steps
            and _is_negative_zero(acc)
            and all(_is_negative_zero(products[k][0]) for k in positions if k is not None)
        )
        carried = specials.values  # the accumulator's NaN/Inf, told apart from the tree's own
        if params.special_accumulator_exponent is not None:
            specials.values = []
        if params.parity_windows:
            tree_sum, reference = _parity_sum(
                [tree_terms(positions[0::2]), tree_terms(positions[1::2])], tree_start, params, log
            )
        else:
            kept, has_zero = tree_terms(positions)
            if params.grid_fraction_bits is not None:
                first = next((k for k in positions if k is not None), None)
                scale_exponent = (
                    0 if first is None else _block_scale_exponent(first, scale_a, scale_b, params)
                )
                acc = _grid_accumulate(acc, kept, scale_exponent, acc_fmt, params, specials, log)
                continue
            reference = None  # (read by the second alignment only)
            if kept and params.align_fraction_bits is not None:
                tree_scale = kept[0][2] if params.scales == "block_sum" else 0
                reference = _reference([(p, e) for p, e, _ in kept], has_zero, params) + tree_scale
            tree_sum = _tree_sum(kept, has_zero, acc, tree_start, params, log)
        if params.second_alignment_bits is not None:
            if params.special_accumulator_exponent is not None and carried:
                acc = _special_accumulator(acc, carried, reference, params, specials, log)
            acc = _second_alignment(acc, tree_sum, reference, acc_fmt, params, specials, log)
            acc = -0.0 if negative_step and acc == 0 else acc
            continue
        acc = _accumulate(acc, _normalise(tree_sum, params, log), acc_fmt, params, specials)
        acc = -0.0 if negative_step and acc == 0 else acc
        log({"stage": "accumulate", "start": tree_start, "accumulator": _to_float(acc)})
        done = tree_start + params.fused_terms
        if params.promotion_interval and done % params.promotion_interval == 0:
            outer = _promote(outer, acc, specials)
            acc = Fraction(0)
            log({"stage": "promote", "after": done, "outer": _to_float(outer)})
    if params.promotion_interval:
        acc = _promote(outer, acc, specials)
        log({"stage": "promote", "after": len(products), "outer": _to_float(acc)})
    if params.c_entry == "end" and not params.promotion_interval:
        acc = _add_c_at_end(acc, c_exact, acc_fmt, params, specials, log)
    if _is_infinite(acc):
        specials.note_overflow(acc)
        acc = Fraction(0)
    result = _round(acc, out_fmt, params.output_rounding, params.output_subnormals)
    if (
        isinstance(acc, float) and result == 0
    ):  # acc underflowed to -0: rounding keeps the zero's sign
        result = -0.0
    return _output_value(result, specials, params, log)


# --- step 7: output -----------------------------------------------------------------------------


def _output_value(result, specials: _Specials, params: DatapathParams, log) -> float:
    """Step 7's value: the specials' IEEE sum when there are any, else the rounded result with
    the sign IEEE gives a zero (+0 for every zero with ``zero_sign: positive``)."""
    specials.promote()  # every register's NaN/Inf meets at the output
    if _is_infinite(result) and not specials.outside:
        specials.outside.append(result)
    specials.values = specials.outside
    if specials.values:
        values = specials.values
        if any(math.isnan(s) for s in values) or (INF in values and -INF in values):
            value = math.nan
        else:
            value = values[0]
    elif result == 0 and params.output_zero_sign == "positive":
        value = 0.0
    elif isinstance(result, float) and result == 0:
        value = -0.0  # a negative result that rounded to zero
    elif result == 0:
        value = (
            -0.0
            if specials.negative_zeros_only and params.output_zero_sign in ("ieee", "ieee_steps")
            else 0.0
        )
    else:
        value = float(result)
    log({"stage": "output", "value": value})
    return value
