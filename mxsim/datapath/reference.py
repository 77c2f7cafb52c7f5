"""Slow reference twin of the datapath: one dot product in Python Fractions, stage by stage.

Written from the parameter definitions in ``datapath.config.SCHEMA`` (not from the kernel).
Every intermediate value is an exact Fraction; every rounding goes through
:func:`mxsim.formats.reference.encode_reference`. It also records each stage, which is
what ``mxsim dot --explain`` prints.
"""

from __future__ import annotations

import math
from fractions import Fraction

from ..formats import FormatInfo, custom_format, get_format
from ..formats.reference import decode_reference, encode_reference
from ..quantize.reference import floor_log2
from .config import DatapathParams

INF = math.inf


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


def _round(value, fmt: FormatInfo, rounding: str, subnormals: bool = True):
    """Round an exact value into ``fmt`` (IEEE overflow).

    Returns a Fraction, ±inf, or -0.0 for a negative value that rounds to zero (IEEE keeps
    its sign); an exact zero returns Fraction(0).
    """
    value = Fraction(value)
    if value == 0:
        return Fraction(0)
    code = encode_reference(fmt, value, rounding, "inf_nan")
    result = decode_reference(fmt, code)
    if isinstance(result, float):
        return -0.0 if result == 0 else result
    if result == 0:
        return -0.0 if value < 0 else Fraction(0)
    if not subnormals and abs(result) < Fraction(fmt.min_normal):
        return -0.0 if result < 0 else Fraction(0)
    return result


def _is_infinite(value) -> bool:
    return isinstance(value, float) and math.isinf(value)


def _to_float(value) -> float:
    return float(value) if isinstance(value, Fraction) else value


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

    ``scale_a``/``scale_b`` are E8M0 codes per block (None: every scale 1). ``record``,
    when given, receives one dict per stage.
    """
    a_fmt, b_fmt = get_format(params.a_format), get_format(params.b_format)
    acc_fmt = None if params.accumulator_format == "exact" else get_format(params.accumulator_format)
    out_fmt = get_format(params.output_format)
    fp32 = get_format("fp32")
    log = record.append if record is not None else (lambda item: None)

    def decode(fmt, code):
        value = decode_reference(fmt, code)
        if isinstance(value, Fraction) and not params.input_subnormals and value != 0 and abs(value) < Fraction(fmt.min_normal):
            value = -0.0 if value < 0 else Fraction(0)
        exponent = None
        if isinstance(value, Fraction) and value != 0:
            exponent = max(floor_log2(abs(value)), alignment_emin(fmt))
        return value, exponent

    # Non-finite contributions, summed by IEEE rules at the end; zero signs for -0 results.
    specials: list[float] = []

    def note_overflow(value: float) -> None:
        # An earlier NaN/Inf (an input, or a first overflow) absorbs any later overflow,
        # as an infinite accumulator absorbs every finite sum.
        if not specials:
            specials.append(value)

    negative_zeros_only = c == 0 and math.copysign(1.0, c) < 0
    if not math.isfinite(c):
        specials.append(c)
        c = 0.0
    c_exact = Fraction(c)

    products = []  # per k: (value Fraction or float special, alignment exponent, scale exponent)
    for k, (code_a, code_b) in enumerate(zip(a_codes, b_codes)):
        value_a, exponent_a = decode(a_fmt, code_a)
        value_b, exponent_b = decode(b_fmt, code_b)
        block = k // params.block_size
        scale_exponent = 0
        scale_is_nan = False
        if params.scales != "none":
            codes = (127 if scale_a is None else scale_a[block], 127 if scale_b is None else scale_b[block])
            scale_is_nan = 255 in codes
            scale_exponent = codes[0] + codes[1] - 254
        if scale_is_nan or any(isinstance(v, float) and math.isnan(v) for v in (value_a, value_b)):
            product = math.nan
        elif any(isinstance(v, float) and math.isinf(v) for v in (value_a, value_b)):
            other = value_b if isinstance(value_a, float) and math.isinf(value_a) else value_a
            product = math.nan if other == 0 else math.copysign(INF, float(value_a) * float(value_b))
        else:
            product = Fraction(value_a) * Fraction(value_b)
            if product == 0:
                sign_negative = (math.copysign(1.0, float(value_a)) < 0) != (math.copysign(1.0, float(value_b)) < 0)
                product = -0.0 if sign_negative else 0.0
        exponent = None if exponent_a is None or exponent_b is None else exponent_a + exponent_b
        if isinstance(product, Fraction) and params.scales != "none":
            if params.scales == "products" or params.align_fraction_bits is None:
                product *= Fraction(2) ** scale_exponent
                exponent += scale_exponent
                scale_exponent = 0
        if isinstance(product, Fraction) and params.product_fraction_bits is not None:
            lead = floor_log2(abs(product))
            step = Fraction(2) ** (lead - params.product_fraction_bits)
            product = math.trunc(product / step) * step
        if isinstance(product, Fraction) and params.align_reference == "leading_bit":
            exponent = floor_log2(abs(product))
        products.append((product, exponent, scale_exponent))
        log({"stage": "product", "k": k, "a_code": code_a, "b_code": code_b, "a": _to_float(value_a),
             "b": _to_float(value_b), "product": _to_float(product), "exponent": exponent, "block_scale_exponent": scale_exponent})

    length = len(products)
    if params.term_order is not None:
        # K padded to whole periods of the order; padded positions hold no term.
        period = len(params.term_order)
        padded = -(-length // period) * period
        sequence = [(p // period) * period + params.term_order[p % period] for p in range(padded)]
        sequence = [k if k < length else None for k in sequence]
    else:
        sequence = list(range(length))

    def finite_terms(indices):
        nonlocal negative_zeros_only
        kept = []
        for k in indices:
            if k is None:  # a padded position
                continue
            product, exponent, scale_exponent = products[k]
            if isinstance(product, float):
                if math.isnan(product) or math.isinf(product):
                    specials.append(product)
                elif math.copysign(1.0, product) > 0:
                    negative_zeros_only = False
                continue
            negative_zeros_only = False
            kept.append((product, exponent, scale_exponent))
        return kept

    if acc_fmt is None:  # exact (Kulisch) accumulator: one rounding, at the output
        total = c_exact + sum((p * Fraction(2) ** s for p, _, s in finite_terms(sequence)), Fraction(0))
        log({"stage": "exact_accumulator", "value": float(total)})
        result = _round(total, out_fmt, params.output_rounding, params.output_subnormals)
        return _finish(result, specials, negative_zeros_only, log)

    outer = Fraction(0)
    acc = Fraction(0)
    if params.promotion_interval:
        outer = c_exact
    elif params.c_entry == "initial":
        acc = _round(c_exact, acc_fmt, params.accumulator_rounding, params.accumulator_subnormals)
        if _is_infinite(acc):  # c overflows a narrower accumulator
            note_overflow(acc)
            acc = Fraction(0)
    log({"stage": "accumulator_start", "value": _to_float(acc), "outer": float(outer)})

    for tree_start in range(0, len(sequence), params.fused_terms):
        kept = finite_terms(sequence[tree_start : tree_start + params.fused_terms])
        terms = [(p, e) for p, e, _ in kept]
        tree_scale = kept[0][2] if kept and params.scales == "block_sum" else 0
        if params.accumulator_in_tree and acc != 0:
            terms.append((Fraction(acc), floor_log2(abs(Fraction(acc)))))
        if params.align_fraction_bits is None or not terms:
            tree_sum = sum((t for t, _ in terms), Fraction(0))
            log({"stage": "tree", "start": tree_start, "exact_sum": float(tree_sum)})
        else:
            reference = max(e for _, e in terms)
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
            tree_sum = sum(kept_terms, Fraction(0))
            if params.carry_bits is not None:  # the adder register: wrap or saturate
                step = lsb / 2 if params.below_window == "sticky" else lsb
                register = tree_sum / step  # an integer
                limit = 2 ** (adder_register_bits(params) - 1)
                if not -limit <= register < limit:
                    if params.adder_overflow == "saturate":
                        register = limit - 1 if register > 0 else -limit
                    else:
                        register = (register + limit) % (2 * limit) - limit
                    log({"stage": "adder_overflow", "register": int(register)})
                tree_sum = register * step
            tree_sum *= Fraction(2) ** tree_scale
            log({"stage": "tree", "start": tree_start, "reference_exponent": reference,
                 "lsb_exponent": reference - params.align_fraction_bits,
                 "terms": [float(t) for t, _ in terms], "aligned": [float(t) for t in kept_terms],
                 "dropped": [float(t - k) for (t, _), k in zip(terms, kept_terms)], "sum": float(tree_sum)})
        if params.sum_significant_bits is not None:
            tree_sum = _round(tree_sum, sum_format(params.sum_significant_bits), params.sum_rounding)
            log({"stage": "normalise", "bits": params.sum_significant_bits, "value": float(tree_sum)})
        if not params.accumulator_in_tree:
            tree_sum += Fraction(acc)
        acc = _round(tree_sum, acc_fmt, params.accumulator_rounding, params.accumulator_subnormals)
        if _is_infinite(acc):  # overflow to infinity
            note_overflow(acc)
            acc = Fraction(0)
        log({"stage": "accumulate", "start": tree_start, "accumulator": _to_float(acc)})
        done = tree_start + params.fused_terms
        if params.promotion_interval and done % params.promotion_interval == 0:
            outer = _round(Fraction(outer) + Fraction(acc), fp32, "nearest_even")
            acc = Fraction(0)
            log({"stage": "promote", "after": done, "outer": _to_float(outer)})
            if _is_infinite(outer):
                note_overflow(outer)
                outer = Fraction(0)
    if params.promotion_interval:
        acc = _round(Fraction(outer) + Fraction(acc), fp32, "nearest_even")
        log({"stage": "promote", "after": length, "outer": _to_float(acc)})
    if params.c_entry == "end" and not params.promotion_interval:
        c_converted = _round(c_exact, acc_fmt, "nearest_even", params.accumulator_subnormals)
        if _is_infinite(c_converted):
            note_overflow(c_converted)
        else:
            acc = _round(Fraction(acc) + Fraction(c_converted), acc_fmt, params.c_add_rounding,
                         params.accumulator_subnormals)
        log({"stage": "add_c", "c": _to_float(c_converted), "accumulator": _to_float(acc)})
    if _is_infinite(acc):
        note_overflow(acc)
        acc = Fraction(0)
    result = _round(acc, out_fmt, params.output_rounding, params.output_subnormals)
    if isinstance(acc, float) and result == 0:  # acc underflowed to -0: rounding keeps the zero's sign
        result = -0.0
    return _finish(result, specials, negative_zeros_only, log)


def _finish(result, specials, negative_zeros_only, log) -> float:
    if _is_infinite(result) and not specials:
        specials.append(result)
    if specials:
        if any(math.isnan(s) for s in specials) or (INF in specials and -INF in specials):
            value = math.nan
        else:
            value = specials[0]
    elif isinstance(result, float) and result == 0:
        value = -0.0  # a negative result that rounded to zero
    elif result == 0:
        value = -0.0 if negative_zeros_only else 0.0
    else:
        value = float(result)
    log({"stage": "output", "value": value})
    return value
