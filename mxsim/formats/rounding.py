"""Rounding modes and overflow policies, by name, with the integer codes kernels take.

Every mode rounds an exact real value to one of the two representable neighbours that
bracket it; only the choice between them differs:

``nearest_even``             nearest; ties to the neighbour whose code is even (IEEE 754 RNE).
``nearest_away``             nearest; ties away from zero (IEEE 754 roundTiesToAway).
``nearest_toward_positive``  nearest; ties toward +inf (Quark BFP ``rounding_mode=1``).
``toward_zero``              truncate the magnitude (IEEE 754 RZ).
``toward_positive``          toward +inf (IEEE 754 RU).
``toward_negative``          toward -inf (IEEE 754 RD).
``stochastic``               up with probability (x - low) / (high - low), the fraction taken
                             to 32 bits and compared with a 32-bit uniform draw that depends
                             only on (seed, flat element index): reproducible, order-free.

"Even" means the code's least significant bit, as IEEE 754 defines it. For formats with
mantissa bits this is the significand's parity; for E8M0 (no mantissa) it is the exponent's,
so 3.0 → 2.0 under ``nearest_even`` (gfloat) and → 4.0 under ``nearest_away`` (ml_dtypes,
ONNX, torch).
"""

from __future__ import annotations

from ..errors import UnknownNameError

ROUNDING_MODES = {
    "nearest_even": 0,
    "nearest_away": 1,
    "toward_zero": 2,
    "toward_positive": 3,
    "toward_negative": 4,
    "stochastic": 5,
    "nearest_toward_positive": 6,
}

# Overflow policies for a rounded magnitude above the format's largest finite value:
# ``saturate`` gives ±max finite (and maps ±Inf inputs there too); ``inf_nan`` follows
# IEEE 754: ±Inf where the format has it, else NaN, except that the directed modes that
# round toward the finite side (toward_zero; toward_positive for negatives; toward_negative
# for positives) give ±max finite; ``inf`` gives ±Inf (NaN where the format has no Inf,
# ±max finite where it has neither) whatever the rounding direction, as hardware that
# rounds through a wider format and then converts does (MMA-Sim's tensor cores).
OVERFLOW_POLICIES = {"saturate": 0, "inf_nan": 1, "inf": 2}


def rounding_code(name: str) -> int:
    """The kernel code of a rounding mode name; unknown names list the accepted ones."""
    try:
        return ROUNDING_MODES[name]
    except (KeyError, TypeError):
        raise UnknownNameError("rounding mode", name, ROUNDING_MODES) from None


def overflow_code(name: str) -> int:
    """The kernel code of an overflow policy name; unknown names list the accepted ones."""
    try:
        return OVERFLOW_POLICIES[name]
    except (KeyError, TypeError):
        raise UnknownNameError("overflow policy", name, OVERFLOW_POLICIES) from None
