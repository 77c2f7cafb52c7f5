"""A hardware-cost proxy for a dot-product unit: bits of adder and accumulator state.

Not an area model: a monotone count that lets sweeps rank configurations. For the unit's
first accepted format pair (A, B) and its default output (``params(*format_pairs[0])``),
with ``top(f) = floor(log2(max_finite))`` and ``lsb(f) = log2(min_subnormal)`` (the smallest
positive value; both exact for every element format):

* ``product_range_bits = (top(A) + top(B) + 2) - (lsb(A) + lsb(B))``: the fixed-point span of
  every exact product (36 for fp8_e4m3 x fp8_e4m3, 14 for int8 x int8).
* ``window_bits``: ``align_fraction_bits + 2`` (+1 with ``below_window: sticky``) with a
  window; ``product_range_bits`` for an exact tree.
* ``adder_width_bits``: with ``carry_bits``, the config's register width
  ``1 + (align_fraction_bits + 2) + carry_bits`` (+1 sticky); else a sign bit, the window, and
  ``ceil(log2(T))`` carry bits for the ``T = fused_terms`` terms (+1 term when the
  accumulator joins the tree), which never overflows.
* ``tree_bits = fused_terms * adder_width_bits``: adder bits times terms per tree.
* ``accumulator_bits``: the accumulator format's width (fp32 32, fp16/bf16 16); ``exact``
  (Kulisch) is ``product_range_bits`` plus 508 for the span of two E8M0 scale exponents
  (0 when ``inputs.scales: none``) plus 32 guard bits; ``promotion_interval`` adds the outer
  fp32 accumulator's 32.
* ``cost_bits = tree_bits + accumulator_bits``.

Multipliers (fixed by the formats) and the tree-sum normaliser (``sum_significant_bits``) are
not counted.
"""

from __future__ import annotations

import math

from ..datapath import HardwareConfig
from ..datapath.config import adder_width_bits
from ..formats import get_format

SCALE_SPAN_BITS = 2 * 254  # E8M0 exponents -127..127 for each operand
KULISCH_GUARD_BITS = 32


def _top(fmt) -> int:
    return math.frexp(fmt.max_finite)[1] - 1


def _lsb(fmt) -> int:
    return math.frexp(fmt.min_subnormal)[1] - 1


def hardware_cost(config: HardwareConfig) -> dict[str, int]:
    """The proxy's terms for ``config`` (module docstring), all in bits."""
    params = config.params(*config.format_pairs[0])
    a, b = get_format(params.a_format), get_format(params.b_format)
    product_range = (_top(a) + _top(b) + 2) - (_lsb(a) + _lsb(b))
    sticky = params.below_window == "sticky"
    window = (
        product_range
        if params.align_fraction_bits is None
        else params.align_fraction_bits + 2 + sticky
    )
    if params.carry_bits is not None:
        adder = adder_width_bits(params)
    else:
        terms = params.fused_terms + params.accumulator_in_tree
        adder = 1 + window + math.ceil(math.log2(terms))
    if params.accumulator_format == "exact":
        accumulator = (
            product_range + (0 if params.scales == "none" else SCALE_SPAN_BITS) + KULISCH_GUARD_BITS
        )
    else:
        accumulator = get_format(params.accumulator_format).bits
    if params.promotion_interval is not None:
        accumulator += 32
    tree = params.fused_terms * adder
    return {
        "product_range_bits": product_range,
        "window_bits": window,
        "adder_width_bits": adder,
        "tree_bits": tree,
        "accumulator_bits": accumulator,
        "cost_bits": tree + accumulator,
    }
