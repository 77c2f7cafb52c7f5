"""The probe's input families: the zero chains tell a chain that signs each step's zero
(``output.zero_sign: ieee_steps``) from the whole sum's rule, and match an IEEE fp64 FMA chain;
the zero rows take B's -0 where A has none; the window ties show a window no product reaches,
and the spread ties the trees it does not show;
the alignment ties are ties of c and tell a second alignment's width to the bit, and the
cancelled ties show it under a narrow output; the scaled zeros show a grid's last place as the
sign of zero; the partial overflows tell exact block sums from rounded partial sums under
scales at the extremes; the output ties lie a hair off a tie of the output and tell an exact
accumulator from a rounded one."""

from __future__ import annotations

import dataclasses
import math
import os
from fractions import Fraction

import numpy as np
import pytest

from mxsim.datapath import load_hwconfig
from mxsim.datapath.api import dot_with_params
from mxsim.formats import get_format
from mxsim.probe.inputs import Batch, Context

from conftest import REPO, any_pair

HW = REPO / "hwconfigs"


def _chains(name: str, a_format: str, b_format: str, k: int, n: int = 64):
    params = load_hwconfig(HW / f"{name}.yaml").params(a_format, b_format)
    ctx = Context(
        a_format,
        b_format,
        k,
        params.block_size,
        params.output_format,
        seed=3,
        scale_format=params.scale_format,
        c_format=params.c_format,
    )
    return params, ctx, ctx.fit_c(ctx.zero_chains(n))


def _outputs(params, ctx, batch, zero_sign: str) -> np.ndarray:
    params = dataclasses.replace(params, output_zero_sign=zero_sign)
    scaled = params.scales != "none"
    return dot_with_params(
        params,
        batch.a,
        batch.b,
        scale_a=batch.scale_a if scaled else None,
        scale_b=batch.scale_b if scaled else None,
        c=batch.c.view(ctx.c_dtype),
    ).astype(np.uint64)


@pytest.mark.parametrize(
    "name, a_format, b_format, k",
    [
        ("a100-dmma", "fp64", "fp64", 4),  # fp64 FMA chain
        ("mi100", "fp32", "fp32", 4),  # fp32 FMA chain (its fp32 override)
        (
            "b200-tcgen05-mxf8f6f4",
            "fp8_e4m3",
            "fp6_e2m3",
            64,
        ),  # narrow elements, E8M0 scales, trees of 32
    ],
)
def test_zero_chains_tell_ieee_steps_from_ieee(name, a_format, b_format, k):
    params, ctx, batch = _chains(name, a_format, b_format, k)
    steps, whole = _outputs(params, ctx, batch, "ieee_steps"), _outputs(params, ctx, batch, "ieee")
    out = get_format(params.output_format)
    differ = steps != whole
    assert np.count_nonzero(differ) >= len(batch) // 2
    # where they differ: the steps keep an early underflow's -0, the whole sum's rule gives +0
    assert np.all(np.signbit(out.decode(steps[differ]))) and not np.any(
        np.signbit(out.decode(whole[differ]))
    )
    assert np.all(out.decode(steps[differ]) == 0)


@pytest.mark.parametrize(
    "name, a_format, b_format", [("mi300", "fp8_e4m3fnuz", "tf32"), ("kulisch", "int8", "fp8_e4m3")]
)
def test_zero_rows_take_negative_zero_from_b_where_a_has_none(name, a_format, b_format):
    """An fnuz or integer A has no -0 (an fnuz zero with the sign bit set is NaN): the zero
    families and the corners' zero rows take B's -0 instead, so the sign of an exact zero still
    tells IEEE's rule (all products and c -0 give -0) from a +0 for every exact zero."""
    params = any_pair(name).params(a_format, b_format, "fp16")  # mi300 takes no FP8 x tf32 pair
    ctx = Context(
        a_format, b_format, 64, params.block_size, "fp16", seed=3, c_format=params.c_format
    )
    batch = ctx.fit_c(Batch.join([ctx.zero_results(32), ctx.zero_chains(32), ctx.corners(128)]))
    products = get_format(a_format).decode(batch.a) * get_format(b_format).decode(batch.b)
    assert (
        not np.isnan(products[0:32:4]).any() and not np.isnan(products[32:64]).any()
    )  # signed-zero rows, chains
    assert np.count_nonzero((products == 0) & np.signbit(products)) >= 1024
    ieee, positive = (
        _outputs(params, ctx, batch, "ieee"),
        _outputs(params, ctx, batch, "exact_positive"),
    )
    assert np.count_nonzero(ieee != positive) >= 1


def test_window_ties_show_a_window_products_alone_never_pass():
    """E2M3 products span 2^-6 to 2^6, too few binades for a 25-bit window to cut any; the
    window ties (products on an fp16 tie, a tiny c) show b200-tcgen05's window against none and
    a bit either way; every row's products sum exactly to a tie of the output. An fp32 output
    gets none."""
    params = load_hwconfig(HW / "b200-tcgen05.yaml").params("fp6_e2m3", "fp6_e2m3", "fp16")
    ctx = Context("fp6_e2m3", "fp6_e2m3", 64, params.block_size, "fp16", seed=5)
    batch = ctx.fit_c(ctx.window_ties(64))
    c = batch.c.view(np.float32)

    def differing(**change):
        return np.count_nonzero(
            dot_with_params(dataclasses.replace(params, **change), batch.a, batch.b, c=c)
            != dot_with_params(params, batch.a, batch.b, c=c)
        )

    assert differing(align_fraction_bits=None) >= 4
    assert differing(align_fraction_bits=24) >= 1 and differing(align_fraction_bits=26) >= 1
    element = get_format("fp6_e2m3")
    fp16 = get_format("fp16")
    for a, b in zip(batch.a, batch.b):
        total = sum(
            Fraction(float(x)) * Fraction(float(y))
            for x, y in zip(element.decode(a), element.decode(b))
        )
        ulp = Fraction(2) ** (math.floor(math.log2(total)) - fp16.mantissa_bits)
        assert (total / ulp).denominator == 2  # half an ulp past a value of the output
    assert (
        len(Context("fp6_e2m3", "fp6_e2m3", 64, params.block_size, "fp32", seed=5).window_ties(64))
        == 0
    )


def test_spread_ties_show_which_positions_share_a_tree_where_windows_cut_no_product():
    """E3M2 x E2M1 products span 2^-5 to 2^8: b200-tcgen05's 25-bit window cuts none, and under
    a bf16 output only c shows its 32-term trees. The spread ties tell them from trees of 15
    and 16 (16 and 32 both divide K): every row's products sum exactly to ±2^e, or on every
    other row to half a bf16 ulp past it, with a product and its negation among them; c is a
    power of two 11 or 12 binades below that product (fp16's precision) or 24 or 25 (fp32's,
    where an fp32 accumulator between two trees drops it and the window keeps it)."""
    params = load_hwconfig(HW / "b200-tcgen05.yaml").params("fp6_e3m2", "fp4_e2m1", "bf16")
    ctx = Context(
        "fp6_e3m2", "fp4_e2m1", 64, params.block_size, "bf16", seed=5, c_format=params.c_format
    )
    batch = ctx.fit_c(ctx.spread_ties(128))
    c = batch.c.view(np.float32)

    def differing(**change):
        return np.count_nonzero(
            dot_with_params(dataclasses.replace(params, **change), batch.a, batch.b, c=c)
            != dot_with_params(params, batch.a, batch.b, c=c)
        )

    assert differing(fused_terms=15) >= 1 and differing(fused_terms=16) >= 1
    a, b = get_format("fp6_e3m2").decode(batch.a), get_format("fp4_e2m1").decode(batch.b)
    for row in range(len(batch)):
        products = [
            Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a[row], b[row]) if x * y
        ]
        total = sum(products)
        ulp = Fraction(2) ** (math.floor(math.log2(abs(total))) - 7)
        assert (total / ulp).denominator == (2 if row % 2 else 1)
        largest = max(products)
        assert -largest in products
        assert abs(Fraction(float(c[row]))) in [largest / 2**gap for gap in (11, 12, 24, 25)]
    assert (
        len(Context("fp6_e3m2", "fp4_e2m1", 64, params.block_size, "fp32", seed=5).spread_ties(64))
        == 0
    )


def _fp64_fma_chain(a, b, c) -> np.ndarray:
    """d = fma(a_k, b_k, d), k = 0.., each step rounded once to nearest even (Python's float of
    a Fraction), an exact zero -0 only when d and the product are both -0."""
    out = []
    for row_a, row_b, d in zip(a.view(np.float64), b.view(np.float64), c.view(np.float64)):
        d = float(d)
        for x, y in zip(row_a, row_b):
            product = Fraction(float(x)) * Fraction(float(y))
            exact = Fraction(d) + product
            negative_product = product == 0 and (math.copysign(1, x) < 0) != (
                math.copysign(1, y) < 0
            )
            if exact == 0:
                d = -0.0 if math.copysign(1, d) < 0 and negative_product else 0.0
            else:
                d = (
                    exact.numerator / exact.denominator
                )  # correctly rounded; a negative underflow is -0.0
        out.append(d)
    return np.array(out, dtype=np.float64).view(np.uint64)


def test_zero_chains_match_an_fp64_fma_chain():
    """a100-dmma (ieee_steps) reproduces an independent IEEE fp64 FMA chain on the zero chains,
    -0 results included; the whole sum's rule does not."""
    params, ctx, batch = _chains("a100-dmma", "fp64", "fp64", 4)
    want = _fp64_fma_chain(batch.a, batch.b, batch.c)
    assert np.count_nonzero(want == np.float64(-0.0).view(np.uint64)) >= len(batch) // 2
    assert np.array_equal(_outputs(params, ctx, batch, params.output_zero_sign), want)
    assert not np.array_equal(_outputs(params, ctx, batch, "ieee"), want)


@pytest.mark.parametrize("a_format, k", [("fp16", 16), ("bf16", 16), ("fp8_e4m3fnuz", 32)])
def test_alignment_ties_are_ties_of_c(a_format, k):
    """Each row: c of 24 significant bits, its last one even, a positive product of exactly
    half c's ulp and a positive power of two 1..16 binades below it, at positions 2i and 2i + 1
    (exact rationals); c of both signs."""
    ctx = Context(a_format, a_format, k, 32, "fp32", seed=5)
    batch = ctx.alignment_ties(64)
    fmt = get_format(a_format)
    rows, signs = 0, set()
    for a, b, c in zip(batch.a, batch.b, batch.c.view(np.float32)):
        products = {
            i: Fraction(float(x)) * Fraction(float(y))
            for i, (x, y) in enumerate(zip(fmt.decode(a), fmt.decode(b)))
            if x * y != 0
        }
        if not products:  # a row the formats could not build
            continue
        rows += 1
        signs.add(bool(c > 0))
        (first, tie), (second, power) = sorted(products.items(), key=lambda item: -item[1])
        assert first // 2 == second // 2 and first != second
        ulp = Fraction(2) ** (math.frexp(float(c))[1] - 24)
        assert (Fraction(float(c)) / ulp).denominator == 1 and (Fraction(float(c)) / ulp) % 2 == 0
        assert tie == ulp / 2
        assert (tie / power).denominator == 1 and 2 <= tie / power <= 2**16
    assert rows >= len(batch) // 2 and signs == {True, False}


@pytest.mark.parametrize("a_format, k", [("fp16", 16), ("tf32", 8), ("fp8_e4m3fnuz", 32)])
def test_alignment_ties_tell_the_second_alignment_to_the_bit(a_format, k):
    """mi300's path (second alignment 31) and the same with 30 or 32 differ on several of the
    probe's 96 rows each (with the tie's power in another tree, or negative under the floor,
    a row tells nothing: there were 0 to 2 on some paths, and the probe held 30 for xf32)."""
    params = load_hwconfig(HW / "mi300.yaml").params(a_format, a_format)
    ctx = Context(a_format, a_format, k, params.block_size, params.output_format, seed=5)
    batch = ctx.alignment_ties(96)
    out = {
        n: dot_with_params(
            dataclasses.replace(params, second_alignment_bits=n),
            batch.a,
            batch.b,
            c=batch.c.view(np.float32),
        )
        for n in (30, 31, 32)
    }
    assert np.count_nonzero(out[30] != out[31]) >= 3 and np.count_nonzero(out[32] != out[31]) >= 3


def test_partial_overflow_rows_show_rounded_partial_sums():
    """Each row's emptied block holds two terms of opposite signs, the later the larger, the
    earlier alone past the range of fp32 (odd rows) or of the output (even rows): exact trees
    of 32 (ocp-exact) give the sign of the block's exact sum, trees of 16 promoted at 32 (what
    the probe emitted for this path without these rows) the earlier term's ±Inf wherever its
    tree comes first and the sum overflows fp32 with the other sign."""
    params = load_hwconfig(HW / "ocp-exact.yaml").params("fp6_e3m2", "int8", "fp16")
    ctx = Context("fp6_e3m2", "int8", 64, 32, "fp16", seed=5)
    batch = ctx.fit_c(ctx.partial_overflow(64))
    split = dataclasses.replace(params, fused_terms=16, promotion_interval=32)
    exact, rounded = (
        get_format("fp16").decode(
            dot_with_params(
                p,
                batch.a,
                batch.b,
                scale_a=batch.scale_a,
                scale_b=batch.scale_b,
                c=batch.c.view(np.float32),
            ).astype(np.uint64)
        )
        for p in (params, split)
    )

    def value(fmt: str, codes) -> list[Fraction]:
        return [Fraction(float(v)) for v in get_format(fmt).decode(np.asarray(codes, np.uint64))]

    told = 0
    for row in range(len(batch)):
        products = [
            x * y for x, y in zip(value("fp6_e3m2", batch.a[row]), value("int8", batch.b[row]))
        ]
        blocks = [
            block
            for block in range(2)
            if sum(1 for v in products[32 * block : 32 * block + 32] if v) == 2
        ]
        assert len(blocks) == 1
        block = blocks[0]
        scale = (
            value("e8m0", batch.scale_a[row, [block]])[0]
            * value("e8m0", batch.scale_b[row, [block]])[0]
        )
        (first, early), (second, late) = [
            (j % 32, v * scale) for j, v in enumerate(products) if v and j // 32 == block
        ]
        top = get_format("fp32" if row % 2 else "fp16").emax
        assert abs(early) >= 2 ** (top + 1) and (early > 0) != (late > 0) and abs(late) > abs(early)
        if row % 2 and first < 16 <= second and abs(early + late) >= 2**128:
            told += 1
            assert exact[row] == (math.inf if early + late > 0 else -math.inf)
            assert rounded[row] == (math.inf if early > 0 else -math.inf)
    assert told >= 4


def test_output_ties_lie_just_off_a_tie_of_the_output():
    """kulisch INT8 x E2M1 -> fp16: each row's c is a tie of fp16 (12 significant bits, the
    last one set), and the exact result (exact rationals, scales applied) lies off it by less
    than half an fp32 ulp of c, on both sides; an fp32 accumulator rounding toward -inf (which the
    probe once held there) gives other fp16 outputs than kulisch's exact one on several rows."""
    params = load_hwconfig(HW / "kulisch.yaml").params("int8", "fp4_e2m1", "fp16")
    ctx = Context("int8", "fp4_e2m1", 64, params.block_size, "fp16", seed=5)
    batch = ctx.fit_c(ctx.output_ties(64))
    a_fmt, b_fmt, scale_fmt = get_format("int8"), get_format("fp4_e2m1"), get_format("e8m0")
    sides = set()
    for row in range(len(batch)):
        c = Fraction(float(batch.c.view(np.float32)[row]))
        exponent = math.frexp(float(abs(c)))[1] - 1  # |c| in [2^e, 2^(e+1))
        steps = abs(c) / Fraction(2) ** (exponent - 11)
        assert steps.denominator == 1 and steps % 2 == 1 and 2**11 < steps < 2**12
        scale = [
            Fraction(float(x)) * Fraction(float(y))
            for x, y in zip(
                scale_fmt.decode(batch.scale_a[row].astype(np.uint64)),
                scale_fmt.decode(batch.scale_b[row].astype(np.uint64)),
            )
        ]
        off = sum(
            Fraction(float(x)) * Fraction(float(y)) * scale[i // params.block_size]
            for i, (x, y) in enumerate(zip(a_fmt.decode(batch.a[row]), b_fmt.decode(batch.b[row])))
        )
        assert 0 < abs(off) < Fraction(2) ** (exponent - 24)
        sides.add(off > 0)
    assert sides == {True, False}
    out = {
        fmt: dot_with_params(
            dataclasses.replace(params, accumulator_format=fmt, accumulator_rounding=rounding),
            batch.a,
            batch.b,
            scale_a=batch.scale_a,
            scale_b=batch.scale_b,
            c=batch.c.view(np.float32),
        )
        for fmt, rounding in (("exact", "nearest_even"), ("fp32", "toward_negative"))
    }
    assert np.count_nonzero(out["exact"] != out["fp32"]) >= 8


def test_cancelled_c_shows_c_rounded_with_a_large_first_tree():
    """b200-tcgen05 E2M3 x E2M1 -> bf16: c enters the first 32-term tree beside a product near
    the largest and is cut to the fp32 accumulator's last place there; the product's negation
    in the second tree leaves what was kept. The config the probe emitted without these rows
    (c added at the end, exact products, one-product steps) reproduced every other row and
    validation vector, but misses these; an fp32 output gets none."""
    params = load_hwconfig(HW / "b200-tcgen05.yaml").params("fp6_e2m3", "fp4_e2m1", "bf16")
    ctx = Context("fp6_e2m3", "fp4_e2m1", 64, params.block_size, "bf16", seed=5)
    batch = ctx.fit_c(ctx.cancelled_c(64))
    products = get_format("fp6_e2m3").decode(batch.a) * get_format("fp4_e2m1").decode(batch.b)
    assert (
        len(batch) == 64
        and np.all(products.sum(axis=1) == 0)
        and np.all(np.count_nonzero(products, axis=1) == 2)
    )
    c = batch.c.view(np.float32)
    emitted_before = dataclasses.replace(
        params,
        fused_terms=1,
        align_fraction_bits=None,
        below_window="floor",
        sum_rounding="toward_positive",
        accumulator_exponent="leading_bit",
        zero_term_exponent=None,
        c_entry="end",
        c_add_rounding="nearest_toward_positive",
        accumulator_overflow="ieee",
        grid_max_left_shift=67,
    )
    shipped = dot_with_params(params, batch.a, batch.b, c=c)
    assert np.count_nonzero(dot_with_params(emitted_before, batch.a, batch.b, c=c) != shipped) >= 16
    assert (
        np.count_nonzero(
            dot_with_params(dataclasses.replace(params, c_entry="end"), batch.a, batch.b, c=c)
            != shipped
        )
        >= 16
    )
    assert (
        len(Context("fp6_e2m3", "fp4_e2m1", 64, params.block_size, "fp32", seed=5).cancelled_c(64))
        == 0
    )


@pytest.mark.parametrize("a_format, b_format", [("fp16", "fp32"), ("fp8_e4m3fnuz", "fp8_e5m2fnuz")])
def test_cancelled_ties_show_the_second_alignment_in_a_narrow_output(a_format, b_format):
    """Under an fp16 output the alignment ties (c's fp32 ties) show nothing; the cancelled ties
    show mi300's second alignment (31 against 30 or 32) and its accumulator's tie rule (nearest
    even against nearest toward +inf) on several of 64 rows. An fp32 output gets none: the
    alignment ties serve it."""
    params = any_pair("mi300").params(
        a_format, b_format, "fp16"
    )  # fp16 x fp32: no instruction's pair
    ctx = Context(a_format, b_format, 64, params.block_size, "fp16", seed=5)

    def differing(batch, **change):
        c = batch.c.view(np.float32)
        return np.count_nonzero(
            dot_with_params(dataclasses.replace(params, **change), batch.a, batch.b, c=c)
            != dot_with_params(params, batch.a, batch.b, c=c)
        )

    ties = ctx.alignment_ties(64)
    assert (
        differing(ties, second_alignment_bits=30) == differing(ties, second_alignment_bits=32) == 0
    )
    batch = ctx.cancelled_ties(64)
    assert len(batch) == 64
    assert (
        differing(batch, second_alignment_bits=30) >= 2
        and differing(batch, second_alignment_bits=32) >= 2
    )
    assert differing(batch, accumulator_rounding="nearest_toward_positive") >= 16
    assert (
        len(Context(a_format, b_format, 64, params.block_size, "fp32", seed=5).cancelled_ties(64))
        == 0
    )


def test_scaled_zeros_show_a_grids_last_place_as_the_sign_of_zero():
    """mxdotp-rmm E2M3 x E2M3 -> bf16: zero elements, c = -0, one block's scale exponent X
    anywhere in -150..0. The hwconfig reference's rule: a grid of n fraction bits passes the
    zero accumulator (its last place 2^-150) through, -0, where the grid's last place 2^(X-n)
    lies more than accumulator_max_right_shift (24) places above it, else the sum is +0 (the
    blocks of scale 1 pass it through for any grid tried here). Grids of 18 and 34 bits (what
    the probe once emitted, and the unit) differ on some rows, each as that rule says."""
    params = load_hwconfig(HW / "mxdotp-rmm.yaml").params("fp6_e2m3", "fp6_e2m3", "bf16")
    ctx = Context("fp6_e2m3", "fp6_e2m3", 64, params.block_size, "bf16", seed=6)
    batch = ctx.fit_c(ctx.scaled_zeros(64))
    assert np.all(get_format("fp6_e2m3").decode(batch.a) == 0) and np.all(
        get_format("fp6_e2m3").decode(batch.b) == 0
    )
    assert np.all(batch.c.view(np.float32) == 0) and np.all(np.signbit(batch.c.view(np.float32)))
    exponents = (batch.scale_a.astype(int) - 127) + (batch.scale_b.astype(int) - 127)
    assert np.all(np.count_nonzero(exponents, axis=1) <= 1)
    scale_exponent = exponents.sum(axis=1)
    assert (
        scale_exponent.min() >= -150 and scale_exponent.max() <= 0 and np.ptp(scale_exponent) >= 100
    )
    outputs = {}
    for bits in (18, 34):
        grid = dataclasses.replace(params, grid_fraction_bits=bits)
        outputs[bits] = dot_with_params(
            grid,
            batch.a,
            batch.b,
            scale_a=batch.scale_a,
            scale_b=batch.scale_b,
            c=batch.c.view(np.float32),
        ).astype(np.uint64)
        passes = (scale_exponent - bits) - (-150) > params.grid_max_right_shift
        assert np.array_equal(outputs[bits], np.where(passes, 0x8000, 0))
    assert np.count_nonzero(outputs[18] != outputs[34]) >= 4


def test_a_stream_is_the_same_in_every_process():
    """A probe's stream hangs on its name through a digest, not on Python's ``hash`` (salted per
    process): a process with another hash seed draws the same numbers; other names, others."""
    import subprocess
    import sys

    from mxsim.probe.inputs import stream

    code = "from mxsim.probe.inputs import stream; print(stream(3, 'trees', 'settled').integers(1 << 62, size=4))"
    drawn = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "PYTHONHASHSEED": "1", "PYTHONPATH": str(REPO)},
    ).stdout
    assert drawn == f"{stream(3, 'trees', 'settled').integers(1 << 62, size=4)}\n"
    assert not np.array_equal(
        stream(3, "trees").integers(1 << 62, size=4), stream(3, "window").integers(1 << 62, size=4)
    )
