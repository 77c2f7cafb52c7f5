"""Stage dumps: per-vector intermediate values, so a failing RTL run can be debugged stage by stage.

A stage function takes the vectors of one unit and returns one JSON-serialisable dict per
vector. Two sources:

* :func:`exact_stages` (``"source": "exact"``): the stages of exact arithmetic, which every
  exact-product datapath must reproduce up to its final rounding. All fixed-point numbers of a
  vector are signed integers in units of ``2^lsb_exponent`` (written as hex strings,
  ``"-0x1a"``) on one grid, so they line up with an RTL's wide fixed-point adder:

  ``products``     per block, each lane's exact product a_i·b_i in units of 2^product_lsb_exponent
                   (unscaled; ``"nan"``, ``"inf"``, ``"-inf"`` for specials, ``"-0"`` for −0);
  ``aligned``      per block, each product times the block's scale, on the vector's grid;
  ``accumulator``  the running exact sum after each lane, block after block (no rounding);
  ``c``            the accumulator input on the grid; ``exact_sum`` = accumulator + c;
  ``scale_exponents``  per block, (Xa − 127) + (Xb − 127), null for a NaN scale.

  The exact sum is order-free, so ``accumulator`` follows lane order whatever tree the unit
  uses; for K > k a unit that rounds per block differs from these exact partial sums after
  block 0.
* :func:`datapath_stage_fn` (``"source": "mxsim.explain"``): the datapath's own stage
  records from its explain API (the reference twin of ``mxsim.dot``): products, alignment,
  tree sums and accumulator after each step, as that unit computes them. ``generate`` uses
  it for stage dumps when the vectors come from a hardware config.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..errors import MxsimError
from ..formats import E8M0_BIAS, E8M0_NAN, get_format
from .layout import GoldenUnit
from .vectors import VectorSet


def _signed_hex(value: int) -> str:
    return f"-0x{-value:x}" if value < 0 else f"0x{value:x}"


def _f32_value(bits: int):
    """(kind, Fraction, negative) of FP32 bits: kind 'nan', 'inf' or 'finite'."""
    negative = bool(bits >> 31)
    exponent, fraction = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exponent == 0xFF:
        return ("nan" if fraction else "inf"), None, negative
    significand = fraction if exponent == 0 else fraction | (1 << 23)
    value = Fraction(significand) * Fraction(2) ** (max(exponent, 1) - 150)
    return "finite", -value if negative else value, negative


def _combine(state: str | None, special: str) -> str:
    """IEEE sum of specials so far: NaN absorbs all, +Inf and −Inf make NaN."""
    if state is None or state == special:
        return special
    return "nan"


def _product(x: float, y: float, quantum: Fraction):
    """One lane's product: an int in units of ``quantum``, "-0", or "nan"/"inf"/"-inf"."""
    if math.isnan(x) or math.isnan(y) or math.isinf(x) or math.isinf(y):
        p = x * y  # inf × 0 is nan
        return "nan" if math.isnan(p) else ("inf" if p > 0 else "-inf")
    if x * y == 0 and math.copysign(1.0, x) * math.copysign(1.0, y) < 0:
        return "-0"
    return int(Fraction(x) * Fraction(y) / quantum)


def exact_stages(unit: GoldenUnit, vectors: VectorSet) -> list[dict]:
    """The exact-arithmetic stage record of every vector (see the module docstring)."""
    if unit.scaled and not unit.power_of_two_scales:
        raise MxsimError(
            f"golden: exact stage records need power-of-two (E8M0) scales; {unit.config_name} "
            f"takes {unit.scale_format} scales (use the datapath stages of mxsim dot --explain)"
        )
    if unit.c_format != "fp32":
        raise MxsimError(
            f"golden: exact stage records place an FP32 c on their grid; {unit.config_name} takes "
            f"{unit.c_format} c (use the datapath stages of mxsim dot --explain)"
        )
    fa, fb = get_format(unit.a_format), get_format(unit.b_format)
    values_a, values_b = fa.decode(vectors.a), fb.decode(vectors.b)
    quantum = Fraction(fa.min_subnormal) * Fraction(fb.min_subnormal)
    product_lsb = (
        quantum.numerator.bit_length() - quantum.denominator.bit_length()
    )  # a power of two
    k, n_blocks = unit.block_size, unit.dot_length // unit.block_size
    records = []
    for row in range(len(vectors)):
        scales, products = [], []
        for block in range(n_blocks):
            if unit.scaled:
                sa, sb = int(vectors.scale_a[row, block]), int(vectors.scale_b[row, block])
                scales.append(None if E8M0_NAN in (sa, sb) else sa + sb - 2 * E8M0_BIAS)
            else:
                scales.append(0)
            lanes = range(block * k, (block + 1) * k)
            products.append(
                [_product(float(values_a[row, i]), float(values_b[row, i]), quantum) for i in lanes]
            )
        lsb = min(
            [product_lsb + s for s in scales if s is not None] + [-149]
        )  # -149: FP32 c's grid
        aligned, accumulator = [], []
        running, special = 0, None
        for scale, block_products in zip(scales, products):
            row_aligned = []
            for p in block_products:
                if scale is None:
                    p = "nan"
                if p in ("nan", "inf", "-inf"):
                    special = _combine(special, p)
                    row_aligned.append(p)
                else:
                    units = 0 if p == "-0" else p << (product_lsb + scale - lsb)
                    running += units
                    row_aligned.append(_signed_hex(units))
                accumulator.append(special or _signed_hex(running))
            aligned.append(row_aligned)
        c_kind, c_value, c_negative = _f32_value(int(vectors.c[row]))
        if c_kind == "finite":
            c_text = _signed_hex(int(c_value / Fraction(2) ** lsb))
            total = special or _signed_hex(running + int(c_value / Fraction(2) ** lsb))
        else:
            c_text = "nan" if c_kind == "nan" else ("-inf" if c_negative else "inf")
            total = _combine(special, c_text)
        record = {
            "index": row,
            "label": vectors.labels[row] if vectors.labels else "",
            "source": "exact",
            "product_lsb_exponent": product_lsb,
            "lsb_exponent": lsb,
            "scale_exponents": scales,
            "products": products,
            "aligned": aligned,
            "accumulator": accumulator,
            "c": c_text,
            "exact_sum": total,
        }
        if vectors.d is not None:
            record["expected"] = f"0x{int(vectors.d[row]):08x}"
        records.append(record)
    return records


def json_safe(value):
    """``value`` with non-finite floats replaced by "nan", "inf", "-inf" (strict JSON has none)."""
    if type(value) in (str, int, bool) or value is None:  # most of a stage record: nothing to do
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return value


def datapath_stage_fn(hw, unit: GoldenUnit):
    """A stage function from the datapath's explain API, or None when there is none (or no hw).

    Calls ``explain(hw, a_row, b_row, a_format=, b_format=, scale_a=, scale_b=, c=, out_format=)``
    (``mxsim.explain``, else ``mxsim.datapath.explain``) once per vector and keeps its
    ``stages``, ``value`` and ``bits``.
    """
    import mxsim

    explain = getattr(mxsim, "explain", None)
    if explain is None:
        try:
            from mxsim.datapath import explain
        except ImportError:
            return None
    if hw is None:
        return None

    def stages(vectors: VectorSet) -> list[dict]:
        c_values = unit.c_values(vectors.c)
        records = []
        for i in range(len(vectors)):
            result = explain(
                hw,
                vectors.a[i],
                vectors.b[i],
                a_format=unit.a_format,
                b_format=unit.b_format,
                scale_a=None if vectors.scale_a is None else vectors.scale_a[i],
                scale_b=None if vectors.scale_b is None else vectors.scale_b[i],
                c=c_values[i],
                out_format=unit.out_format,
            )
            record = {
                "index": i,
                "label": vectors.labels[i] if vectors.labels else "",
                "source": "mxsim.explain",
                "stages": result.get("stages"),
                "value": result.get("value"),
                "bits": result.get("bits"),
            }
            if vectors.d is not None:
                record["expected"] = f"0x{int(vectors.d[i]):0{vectors.d.dtype.itemsize * 2}x}"
            records.append(json_safe(record))
        return records

    return stages
