"""Case generators: the inputs of golden vectors (element codes, scale codes, accumulator c).

Three kinds, each a function ``(unit, count, rng) -> VectorSet`` (without expected outputs):

``random``
    ``count`` vectors drawn from a mix of distributions: uniform element codes with scales
    near 1, and block-quantized Gaussian, sparse and outlier-heavy data (``mxsim.quantize_mx``,
    OCP profile, for power-of-two scales; ``mxsim.quantize_nvfp4`` with the unit's scale
    format otherwise, e.g. UE4M3); c is ±0, of the block's magnitude (within ±30 binades), any finite
    value of the unit's c format (FP32, or FP64), or the nearest one to minus the block
    (cancellation).
``corners``
    a fixed, deterministic list (``count`` is ignored) built from exact values
    (:mod:`mxsim.golden.corners`).
``exhaustive``
    every (A code, B code) pair in every lane: each pair alone in one lane (others +0) when
    pairs × K ≤ 65536, and a rotation putting every pair in every lane at once when
    pairs ≤ 65536 (fp4 × fp4: 8192 + 256 vectors). Scales 2^0, c = +0.
"""

from __future__ import annotations

import numpy as np

from ..errors import MxsimError
from ..formats import get_format
from .corners import corner_cases
from .layout import GoldenUnit
from .vectors import VectorSet

KINDS = ("random", "corners", "exhaustive")
EXHAUSTIVE_LIMIT = 1 << 16  # vectors; larger spaces are refused (use random)


# Random ----------------------------------------------------------------------------------
RANDOM_DISTRIBUTIONS = ("uniform_codes", "mx_gaussian", "mx_sparse", "mx_outliers")
C_MODES = ("zero", "near_block", "any_finite", "cancel")
C_MODE_WEIGHTS = (0.2, 0.45, 0.15, 0.2)


def _block_codes(unit: GoldenUnit, fmt_name: str, values: np.ndarray):
    """(element codes, scale codes) of ``values`` quantized in blocks for the unit's scales."""
    from ..quantize import quantize, quantize_nvfp4

    if unit.power_of_two_scales:
        tensor = quantize(values, fmt_name, axis=-1, block_size=unit.block_size, profile="ocp")
        return tensor.codes, tensor.scales
    tensor = quantize_nvfp4(
        values.astype(np.float32),
        element_format=fmt_name,
        scale_format=unit.scale_format,
        block_size=unit.block_size,
    )
    return tensor.codes, tensor.scales


def random_cases(unit: GoldenUnit, count: int, rng: np.random.Generator) -> VectorSet:
    """``count`` random vectors (see the module docstring for the distributions)."""
    K, nb = unit.dot_length, unit.dot_length // unit.block_size
    fa, fb = get_format(unit.a_format), get_format(unit.b_format)
    a = np.zeros((count, K), dtype=fa.code_dtype)
    b = np.zeros((count, K), dtype=fb.code_dtype)
    scale_a = np.full((count, nb), unit.scale_one, dtype=np.uint8)
    scale_b = np.full((count, nb), unit.scale_one, dtype=np.uint8)
    distribution = rng.integers(0, len(RANDOM_DISTRIBUTIONS), count)
    for index, name in enumerate(RANDOM_DISTRIBUTIONS):
        rows = np.flatnonzero(distribution == index)
        if not rows.size:
            continue
        n = rows.size
        if name == "uniform_codes":
            for codes, fmt in ((a, fa), (b, fb)):  # field codes above the padding bits (tf32)
                codes[rows] = (
                    rng.integers(0, 1 << fmt.field_bits, (n, K), dtype=_draw_dtype(fmt.field_bits))
                    << fmt.padding_bits
                )
            for scale in (scale_a, scale_b):
                near = np.clip(
                    unit.scale_one + rng.integers(-10, 11, (n, nb)), 0, unit.scale_nan - 1
                )
                anywhere = rng.integers(0, unit.scale_nan, (n, nb))
                scale[rows] = np.where(rng.random((n, nb)) < 0.1, anywhere, near)
            continue
        for codes, scale, fmt in ((a, scale_a, fa), (b, scale_b, fb)):
            magnitude = np.exp2(rng.integers(-40, 41, (n, 1)).astype(np.float64))
            x = rng.standard_normal((n, K)) * magnitude
            if name == "mx_sparse":
                x[rng.random((n, K)) < 0.7] = 0.0
            elif name == "mx_outliers":
                x *= np.where(rng.random((n, K)) < 0.05, 2.0 ** rng.integers(4, 30, (n, K)), 1.0)
            element_codes, scales = _block_codes(unit, fmt.name, x)
            codes[rows] = element_codes
            scale[rows] = scales
    c, c_labels = _random_c(unit, a, b, scale_a, scale_b, rng)
    labels = [f"random_{RANDOM_DISTRIBUTIONS[d]}_c_{m}" for d, m in zip(distribution, c_labels)]
    return VectorSet(
        a, b, scale_a if unit.scaled else None, scale_b if unit.scaled else None, c, labels=labels
    )


def _draw_dtype(bits: int) -> type:
    """The dtype uniform codes of ``bits`` bits are drawn in: int64 (the draws every narrower
    format always had), uint64 for 64-bit codes."""
    return np.uint64 if bits >= 63 else np.int64


def _approximate_blocks(unit, a, b, scale_a, scale_b) -> np.ndarray:
    """float64 approximation of each vector's scaled block sum (NaN/Inf where specials are)."""
    fa, fb = get_format(unit.a_format), get_format(unit.b_format)
    with np.errstate(over="ignore", invalid="ignore"):
        products = fa.decode(a) * fb.decode(b)
        sums = products.reshape(a.shape[0], a.shape[1] // unit.block_size, unit.block_size).sum(
            axis=2
        )
        if unit.scaled:
            scale_format = get_format(unit.scale_format)
            sums = (
                sums * scale_format.decode(scale_a) * scale_format.decode(scale_b)
            )  # NaN for NaN codes
        return sums.sum(axis=1)


def _random_c(unit, a, b, scale_a, scale_b, rng):
    """(c bits in the unit's c format, mode per vector). The thresholds are FP32's (c of up to
    1e38, at least 1e-44 for the block-relative modes, clipped to ±3e38) moved by the c format's
    exponent range, so FP32 c draws what it always drew."""
    count = a.shape[0]
    fmt = get_format(unit.c_format)
    bits_type = fmt.code_dtype.type
    top = float(2.0 ** (fmt.emax - 127))  # 1 for FP32
    bottom = float(2.0 ** ((1 - fmt.bias - fmt.mantissa_bits) + 149))  # 1 for FP32
    float_type = np.dtype(f"f{fmt.bits // 8}")
    approximate = _approximate_blocks(unit, a, b, scale_a, scale_b)
    modes = rng.choice(len(C_MODES), size=count, p=C_MODE_WEIGHTS)
    usable = (
        np.isfinite(approximate)
        & (approximate != 0)
        & (np.abs(approximate) < 1e38 * top)
        & (np.abs(approximate) > 1e-44 * bottom)
    )
    modes = np.where(~usable & ((modes == 1) | (modes == 3)), 2, modes)
    c = np.zeros(count, dtype=bits_type)
    zero_sign = rng.integers(0, 2, count).astype(bits_type) << bits_type(fmt.bits - 1)
    c[modes == 0] = zero_sign[modes == 0]
    near = modes == 1
    with np.errstate(over="ignore", under="ignore"):
        value = (
            np.abs(approximate)
            * np.exp2(rng.integers(-30, 31, count).astype(np.float64))
            * (1 + rng.random(count))
        )
        value *= np.where(rng.random(count) < 0.5, -1.0, 1.0)
        value = np.clip(value, -3.0e38 * top, 3.0e38 * top)
        c[near] = value[near].astype(float_type).view(bits_type)
        cancel = modes == 3
        c[cancel] = (-approximate[cancel]).astype(float_type).view(bits_type)
    anything = modes == 2
    exponent_field = rng.integers(0, (1 << fmt.exponent_bits) - 1, count).astype(bits_type)
    fraction = rng.integers(0, 1 << fmt.mantissa_bits, count).astype(bits_type)
    sign = rng.integers(0, 2, count).astype(bits_type)
    c[anything] = (
        (sign << bits_type(fmt.bits - 1))
        | (exponent_field << bits_type(fmt.mantissa_bits))
        | fraction
    )[anything]
    return c, [C_MODES[m] for m in modes]


# Exhaustive ------------------------------------------------------------------------------
def _exhaustive_plan(unit: GoldenUnit) -> tuple[int, bool]:
    """(code pairs, whether each pair also goes alone in every lane); MxsimError when the
    pairs are too many to enumerate."""
    n_pairs = (1 << get_format(unit.a_format).bits) * (1 << get_format(unit.b_format).bits)
    if n_pairs > EXHAUSTIVE_LIMIT:
        raise MxsimError(
            f"golden: exhaustive needs at most {EXHAUSTIVE_LIMIT} code pairs; {unit.pair_name} has {n_pairs}. Use random."
        )
    return n_pairs, n_pairs * unit.dot_length <= EXHAUSTIVE_LIMIT


def exhaustive_count(unit: GoldenUnit) -> int:
    """How many vectors :func:`exhaustive_cases` gives for ``unit``; MxsimError when its code
    pairs are too many to enumerate."""
    n_pairs, per_lane = _exhaustive_plan(unit)
    return n_pairs * unit.dot_length * per_lane + n_pairs


def exhaustive_cases(unit: GoldenUnit, count: int | None, rng: np.random.Generator) -> VectorSet:
    """Every (A, B) code pair in every lane (``count``, ``rng`` ignored); see the module docstring."""
    fa, fb = get_format(unit.a_format), get_format(unit.b_format)
    K, nb = unit.dot_length, unit.dot_length // unit.block_size
    n_pairs, per_lane = _exhaustive_plan(unit)
    pair_a = np.repeat(np.arange(1 << fa.bits), 1 << fb.bits)
    pair_b = np.tile(np.arange(1 << fb.bits), 1 << fa.bits)
    parts_a, parts_b, labels = [], [], []
    if per_lane:
        lane_a = np.zeros((K, n_pairs, K), dtype=fa.code_dtype)
        lane_b = np.zeros((K, n_pairs, K), dtype=fb.code_dtype)
        for lane in range(K):
            lane_a[lane, :, lane] = pair_a
            lane_b[lane, :, lane] = pair_b
        parts_a.append(lane_a.reshape(-1, K))
        parts_b.append(lane_b.reshape(-1, K))
        labels += [
            f"exhaustive_lane{lane}_{ca:x}x{cb:x}"
            for lane in range(K)
            for ca, cb in zip(pair_a, pair_b)
        ]
    index = (
        np.arange(n_pairs)[:, None] + np.arange(K)[None, :]
    ) % n_pairs  # rotation: lane i gets pair v + i
    parts_a.append(pair_a[index].astype(fa.code_dtype))
    parts_b.append(pair_b[index].astype(fb.code_dtype))
    labels += [f"exhaustive_rotation_{v}" for v in range(n_pairs)]
    a = np.concatenate(parts_a)
    b = np.concatenate(parts_b)
    n = a.shape[0]
    scales = np.full((n, nb), unit.scale_one, dtype=np.uint8) if unit.scaled else None
    c = np.zeros(n, dtype=get_format(unit.c_format).code_dtype)
    return VectorSet(a, b, scales, None if scales is None else scales.copy(), c, labels=labels)


GENERATORS = {"random": random_cases, "corners": corner_cases, "exhaustive": exhaustive_cases}
