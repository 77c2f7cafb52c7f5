"""Slow reference twin of ``_bfp_kernels``, written from the definitions, for tests.

Every element is decoded to its exact rational value (``fractions.Fraction``) and the scale of
its block is an exact power of two, so each rule below reads as mathematics on real numbers
rather than as bit shifts.  Nothing here is derived from the numba kernels; where Quark's
behaviour is an artefact of its float or bit arithmetic, that artefact is restated here as a
rule on exact values (each one is cited in ``docs/bfp.md``).

Functions take one block as a sequence of float32 bit patterns (Python ints) and return the same
codes as the kernels, as Python lists; ``quantize_blocks_reference`` stacks them like the kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

HALF = Fraction(1, 2)
#: The largest value that float32 round-to-nearest-even turns into zero (the midpoint between
#: 0 and the smallest subnormal 2**-149; the tie goes to the even neighbour, 0).
FLOAT32_UNDERFLOW_LIMIT = Fraction(1, 2**150)


@dataclass(frozen=True)
class DecodedFloat32:
    """One float32: sign, biased exponent field, fraction field, and exact value if finite."""

    bits: int
    negative: bool
    exponent_field: int
    fraction_field: int

    @property
    def is_finite(self) -> bool:
        return self.exponent_field != 255

    @property
    def magnitude(self) -> Fraction:
        """Exact |x| (finite x only): subnormals are fraction * 2**-149."""
        if self.exponent_field == 0:
            return Fraction(self.fraction_field, 2**149)
        return Fraction(2**23 + self.fraction_field, 2**23) * Fraction(2) ** (
            self.exponent_field - 127
        )


def decode_float32(bits: int) -> DecodedFloat32:
    bits = int(bits) & 0xFFFFFFFF
    return DecodedFloat32(bits, bool(bits >> 31), (bits >> 23) & 0xFF, bits & 0x7FFFFF)


def round_to_nearest(q: Fraction, negative: bool, rounding_mode: int) -> int:
    """Nearest integer to q >= 0 (the magnitude of a value whose sign is ``negative``).

    Ties: 0 away from zero (magnitude up), 1 toward +inf (magnitude up unless negative),
    2 to even.
    """
    below = math.floor(q)
    rest = q - below
    if rest < HALF:
        return below
    if rest > HALF:
        return below + 1
    if rounding_mode == 0:
        return below + 1
    if rounding_mode == 1:
        return below if negative else below + 1
    return below + (below % 2)


def prime_block_reference(
    block_bits,
    mantissa_bits: int,
    sub_block_size: int,
    shift_bits: int,
    rounding_mode: int,
    cuda: bool,
    random_words=None,
    flushed_sign_kept: bool = True,
):
    """One ``to_bfp_prime`` block.  Returns (E, [d per sub-block], [+-M], [sign bit]).

    ``flushed_sign_kept`` False: zero and subnormal inputs give sign bit 0 (+0)."""
    m = mantissa_bits
    elements = [decode_float32(b) for b in block_bits]
    n = len(elements)
    # E: largest biased exponent field in the block, Inf/NaN (field 255) included.
    shared_exp = max(x.exponent_field for x in elements)
    n_sub = n // sub_block_size
    if shared_exp == 255:
        return shared_exp, [0] * n_sub, [0] * n, [0] * n
    micro, mantissas, signs = [], [], []
    for s in range(n_sub):
        members = range(s * sub_block_size, (s + 1) * sub_block_size)
        sub_max = max(elements[i].exponent_field for i in members)
        d = min(shared_exp - sub_max, 2**shift_bits - 1)
        micro.append(d)
        # Unit in the last place of this sub-block: 2**(E - 127 - d + 1 - m).
        lsb = Fraction(2) ** (shared_exp - 127 - d + 1 - m)
        for i in members:
            x = elements[i]
            # Subnormal inputs (exponent field 0) are flushed to zero before scaling.
            q = Fraction(0) if x.exponent_field == 0 else x.magnitude / lsb
            assert q < 2**m  # |x| < 2**(e - 126) and e <= E - d
            if not cuda:
                # Nearest, but never past the largest m-bit magnitude (Quark's CPU runtime).
                mag = min(round_to_nearest(q, x.negative, rounding_mode), 2**m - 1)
            elif rounding_mode == 0:
                mag = math.floor(q)
            elif rounding_mode == 1:
                mag = min(math.floor(q + HALF), 2**m - 1)
            else:
                mag = _cuda_stochastic_magnitude(x, q, shared_exp - d, m, int(random_words[i]))
            mantissas.append(-mag if x.negative else mag)
            flushed = x.exponent_field == 0
            signs.append(int(x.negative and (flushed_sign_kept or not flushed)))
    return shared_exp, micro, mantissas, signs


def _cuda_stochastic_magnitude(x: DecodedFloat32, q: Fraction, scale_exp: int, m: int, word):
    """Quark CUDA rounding_mode 2 on magnitude q (definition restated from bfp_kernel.cu).

    The kernel keeps floor(2q) (one bit more than M).  If that is not all ones, it adds one unit
    of M when ``word mod 2**k < bits mod 2**k``, with k = (bits of the 24-bit significand below
    that half bit) + 1 and ``bits`` the raw float32 encoding, i.e. with probability
    (bits mod 2**k) / 2**k; it does this only when k <= 24.
    """
    with_half_bit = math.floor(2 * q)
    if with_half_bit == 2 ** (m + 1) - 1:
        return math.floor(q)
    # Number of significand bits below the half bit (the CUDA kernel's right shift).
    dropped = scale_exp - x.exponent_field + 23 - m
    k = dropped + 1
    if k > 24:
        return math.floor(q)
    round_up = (word % 2**k) < (x.bits % 2**k)
    return math.floor(q) + int(round_up)


def plain_block_reference(block_bits, mantissa_bits: int, rounding_mode: int):
    """One ``to_bfp`` block.  Returns (E, [0], [+-M], [sign bit], [passthrough bits])."""
    m = mantissa_bits
    elements = [decode_float32(b) for b in block_bits]
    # E ignores Inf/NaN; an all-special or all-zero block has E = 0.
    shared_exp = max([x.exponent_field for x in elements if x.is_finite], default=0)
    lsb = Fraction(2) ** (shared_exp - 127 + 1 - m)
    mantissas, signs, specials = [], [], []
    for x in elements:
        if not x.is_finite:
            mantissas.append(0)
            signs.append(0)
            specials.append(x.bits)  # passed through unchanged
            continue
        q = x.magnitude / lsb  # subnormals are scaled like any other value
        mag = min(round_to_nearest(q, x.negative, rounding_mode), 2**m - 1)
        negative = x.negative
        if negative and mag == 0 and rounding_mode == 2 and q > FLOAT32_UNDERFLOW_LIMIT:
            # Quark's py3_round returns floor(q) + 1 = -1 + 1 = +0.0 for float q in [-0.5, 0);
            # q that float32 division already turned into -0.0 keeps the minus sign.
            negative = False
        mantissas.append(-mag if negative else mag)
        signs.append(int(negative))
        specials.append(0)
    return shared_exp, [0], mantissas, signs, specials


def quantize_blocks_reference(
    block_bits: np.ndarray,
    method: str,
    mantissa_bits: int,
    sub_block_size: int,
    shift_bits: int,
    rounding_mode: int,
    cuda: bool,
    random_words=None,
    flushed_sign_kept: bool = True,
):
    """Whole (blocks, block_size) uint32 array, codes shaped like the kernels' outputs."""
    shared, micro, mant, sign, special = [], [], [], [], []
    for b, row in enumerate(block_bits.tolist()):
        if method == "to_bfp_prime":
            words = None if random_words is None else random_words[b].tolist()
            e, d, mt, sg = prime_block_reference(
                row,
                mantissa_bits,
                sub_block_size,
                shift_bits,
                rounding_mode,
                cuda,
                words,
                flushed_sign_kept,
            )
            sp = [0] * len(row)
        else:
            e, d, mt, sg, sp = plain_block_reference(row, mantissa_bits, rounding_mode)
        shared.append(e)
        micro.append(d)
        mant.append(mt)
        sign.append(sg)
        special.append(sp)
    n_blocks, block_size = block_bits.shape
    n_sub = block_size // sub_block_size if method == "to_bfp_prime" else 1
    return (
        np.array(shared, np.uint8).reshape(n_blocks),
        np.array(micro, np.uint8).reshape(n_blocks, n_sub),
        np.array(mant, np.int32).reshape(n_blocks, block_size),
        np.array(sign, np.uint8).reshape(n_blocks, block_size),
        np.array(special, np.uint32).reshape(n_blocks, block_size),
    )


def exact_element_value(
    shared_exp: int, micro: int, signed_mantissa: int, mantissa_bits: int, method: str
) -> Fraction:
    """Exact value +-M * 2**(E - 127 - d + 1 - m) of one finite element."""
    d = micro if method == "to_bfp_prime" else 0
    return signed_mantissa * Fraction(2) ** (shared_exp - 127 - d + 1 - mantissa_bits)


def float32_output_bits(value: Fraction, negative: bool) -> int:
    """Bits of the float32 Quark writes for an exact element value.

    Quark computes the value in double and stores it to float32.  Every value a finite block can
    produce is exactly representable, except 2**128 (an overflow to Inf); the assertion makes
    the test suite check that claim.
    """
    if abs(value) >= Fraction(2) ** 128:
        out = np.float32(np.inf)
    else:
        out = np.float32(float(abs(value)))
        assert Fraction(float(out)) == abs(value), "value not exactly representable in float32"
    if negative:
        out = -out
    return int(np.array(out, np.float32).view(np.uint32))
