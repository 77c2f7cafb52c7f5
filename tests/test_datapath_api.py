"""The datapath: real GPU results, kernel against the Fraction twin, exact configs, corners."""

from __future__ import annotations

import dataclasses
import math
import re
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from conftest import REPO, any_pair, arrays_in, byte_copies, same_float
from mxsim import get_format
from mxsim.quantize import MXGroups, MXTensor, quantize, quantize_bfp, quantize_grouped
from mxsim.datapath import as_float, dot, explain, load_hwconfig, matmul, matmul_batched
from mxsim.datapath import batch as batch_module
from mxsim.datapath.config import DatapathParams, check_consistency
from mxsim.datapath.api import (
    _kernel_arguments,
    dot_with_each_params,
    dot_with_params,
    kernel_c_dtype,
    kernel_output_dtype,
    times_power_of_two,
    as_float_times_power_of_two,
)
from mxsim.datapath.reference import dot_reference
from mxsim.errors import ConfigError, MxsimError
from mxsim.formats.reference import encode_reference

HWCONFIGS = sorted((REPO / "hwconfigs").glob("*.yaml"))


def _distinct_datapaths(paths) -> list:
    """One param per distinct datapath among the configs ``paths``: configs whose params agree
    for every format pair and output format compute the same bits, so the comparisons with the
    twin run once for them; the param's id names every config sharing it."""
    shared: dict[tuple, list] = {}
    for path in paths:
        config = load_hwconfig(path)
        outs = sorted({"fp32", "fp16", "bf16", config.sections[("output", "format")]})
        key = tuple(
            repr(config.params(a_format, b_format, out_format))
            for a_format, b_format in config.format_pairs
            for out_format in outs
        )
        shared.setdefault(key, []).append(path)
    return [pytest.param(group[0], id="+".join(p.stem for p in group)) for group in shared.values()]


DATAPATHS = _distinct_datapaths(HWCONFIGS)
ORACLES = REPO / "tests" / "data" / "gpu-fp8"
FP8 = {"E4M3": "fp8_e4m3", "E5M2": "fp8_e5m2"}


def hw(name: str):
    return load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")


def oracle(gpu: str, fmt: str):
    data = np.load(ORACLES / f"{gpu}_{fmt}.npz", allow_pickle=False)
    element = get_format(FP8[fmt])
    a = element.encode(data["a"].view(np.float32))
    b = element.encode(data["b"].view(np.float32))
    assert (
        element.decode(a) == data["a"].view(np.float32)
    ).all()  # the inputs are exact FP8 values
    return a, b, data["c"].view(np.float32), data["d_fp32"], data["d_fp16"]


# --- real hardware ------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", ["H100", "B200"])
@pytest.mark.parametrize("fmt", ["E4M3", "E5M2"])
def test_gpu_fp32_results_bit_for_bit(gpu, fmt):
    a, b, c, d_fp32, _ = oracle(gpu, fmt)
    if gpu == "H100":
        c = np.zeros_like(c)  # the H100 fp32 measurement ran with c = 0 (oracle README)
    out = dot(hw(gpu.lower() + "-fp8"), a, b, a_format=FP8[fmt], b_format=FP8[fmt], c=c)
    assert int((out != d_fp32).sum()) == 0


@pytest.mark.parametrize("gpu", ["H100", "B200"])
@pytest.mark.parametrize("fmt", ["E4M3", "E5M2"])
def test_gpu_fp16_results_bit_for_bit(gpu, fmt):
    a, b, c, _, d_fp16 = oracle(gpu, fmt)
    out = dot(
        hw(gpu.lower() + "-fp8"), a, b, a_format=FP8[fmt], b_format=FP8[fmt], c=c, out_format="fp16"
    )
    widened = as_float(out, "fp16").astype(np.float32).view(np.uint32)
    assert int((widened != d_fp16).sum()) == 0


def published_b200(rounding: str) -> DatapathParams:
    """Khattak & Mikaitis' B200 model: c aligned into a 25-fraction-bit window, one rounding."""
    base = hw("b200-fp8").params("fp8_e4m3", "fp8_e4m3")
    return DatapathParams(
        **{
            **base.__dict__,
            "accumulator_in_tree": True,
            "sum_significant_bits": None,
            "accumulator_rounding": rounding,
            "output_rounding": rounding,
        }
    )


@pytest.mark.parametrize(
    "fmt, rounding, misses_all, misses_first_200",
    [
        ("E4M3", "toward_zero", 1793, 67),
        ("E4M3", "nearest_even", 246, 14),
        ("E5M2", "toward_zero", 1764, 72),
    ],
)
def test_published_b200_model_misses_what_its_authors_report(
    fmt, rounding, misses_all, misses_first_200
):
    # The oracle README quotes 67/200 (14/200 round-to-nearest) for E4M3: an independent check
    # that mxsim's generic datapath reproduces the published model itself.
    a, b, c, d_fp32, _ = oracle("B200", fmt)
    params = published_b200(rounding)
    params = DatapathParams(**{**params.__dict__, "a_format": FP8[fmt], "b_format": FP8[fmt]})
    miss = dot_with_params(params, a, b, c=c) != d_fp32
    assert (int(miss.sum()), int(miss[:200].sum())) == (misses_all, misses_first_200)


def test_worked_example_b200_case_3935_needs_the_toward_zero_product_rounding():
    a, b, c, d_fp32, _ = oracle("B200", "E5M2")
    row = slice(3935, 3936)
    assert hex(int(d_fp32[3935])) == "0xc10ddf7c"
    params = hw("b200-fp8").params("fp8_e5m2", "fp8_e5m2")
    assert dot_with_params(params, a[row], b[row], c=c[row])[0] == 0xC10DDF7C
    nearest = DatapathParams(**{**params.__dict__, "sum_rounding": "nearest_even"})
    assert dot_with_params(nearest, a[row], b[row], c=c[row])[0] == 0xC10DDF7D


# --- kernel == reference twin --------------------------------------------------------------------

MX_ELEMENTS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8", "mx9", "mx4"]
ROUNDINGS = ["nearest_even", "toward_zero", "toward_negative", "toward_positive", "nearest_away"]


@st.composite
def random_params(draw) -> DatapathParams:
    fused = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32]))
    scales = draw(st.sampled_from(["none", "products", "block_sum", "group_sum"]))
    block = (
        fused * draw(st.integers(1, 3))
        if scales == "block_sum"
        else draw(st.sampled_from([4, 8, 16, 32]))
    )
    group = 16
    if scales == "group_sum":  # whole groups in blocks and trees
        group = draw(st.sampled_from([1, 2, 4, 8, 16]))
        fused = group * draw(st.integers(1, 4))
        block = group * draw(st.integers(1, 3))
    acc_format = draw(st.sampled_from(["fp32", "fp16", "bf16", "exact"]))
    exact = acc_format == "exact"
    # sampled_from spreads the choices evenly (one_of(none(), ...) leans on None).
    window = "exact" if exact else draw(st.sampled_from(["exact", "narrow", "wide"]))
    fraction_bits = {
        "exact": None,
        "narrow": draw(st.integers(0, 11)),
        "wide": draw(st.integers(12, 30)),
    }[window]
    acc_in_tree = False if scales == "block_sum" else draw(st.booleans())
    promotion = None
    if not exact and draw(st.booleans()):
        promotion = fused * draw(st.integers(1, 4))
    order = None
    if scales != "group_sum" and draw(st.booleans()):
        order = tuple(draw(st.permutations(list(range(fused * draw(st.integers(1, 2)))))))
    # A fixed-point grid (cvfpu MXDOTP) in a quarter of the units: exact products outside of
    # which the accumulator is aligned, one scale per tree, small shift limits so that its
    # pass-through rules are met often.
    grid = not exact and scales in ("none", "products") and draw(st.integers(0, 3)) == 0
    if grid:
        window, fraction_bits, acc_in_tree, promotion, order = "exact", None, False, None, None
    trees_in_blocks = order is None and promotion is None and draw(st.booleans())
    same_format = draw(st.booleans())
    a_format = draw(st.sampled_from(MX_ELEMENTS))
    params = DatapathParams(
        a_format=a_format,
        b_format=a_format if same_format else draw(st.sampled_from(MX_ELEMENTS)),
        same_format=same_format,
        trees_in_blocks=trees_in_blocks or (grid and block % fused != 0),
        grid_fraction_bits=draw(st.integers(34, 60)) if grid else None,
        grid_max_left_shift=draw(st.integers(0, 80)),
        grid_max_right_shift=draw(st.integers(0, 30)),
        block_size=block,
        scales=scales,
        scale_format=draw(st.sampled_from(["e8m0", "ue4m3"])) if scales == "group_sum" else "e8m0",
        input_subnormals=draw(st.booleans()),
        c_format=draw(st.sampled_from(["fp32", "fp16", "bf16"])),
        product_fraction_bits=None if grid else draw(st.one_of(st.none(), st.integers(0, 6))),
        fused_terms=fused,
        group_terms=group,
        term_order=order,
        accumulator_in_tree=acc_in_tree,
        align_reference=draw(st.sampled_from(["exponent_sum", "leading_bit"])),
        align_fraction_bits=fraction_bits,
        below_window=draw(st.sampled_from(["truncate", "floor", "nearest_even", "sticky"])),
        carry_bits=None
        if fraction_bits is None or not draw(st.booleans())
        else draw(st.integers(0, 6)),
        adder_overflow=draw(st.sampled_from(["wrap", "saturate"])),
        sum_significant_bits=None
        if exact or grid or not draw(st.booleans())
        else draw(st.integers(1, 30)),
        sum_rounding=draw(st.sampled_from(ROUNDINGS)),
        accumulator_format=acc_format,
        accumulator_rounding=draw(st.sampled_from(ROUNDINGS)),
        accumulator_subnormals=draw(st.booleans()),
        c_entry="initial" if promotion or grid else draw(st.sampled_from(["initial", "end"])),
        c_add_rounding=draw(st.sampled_from(ROUNDINGS)),
        promotion_interval=promotion,
        output_format=draw(st.sampled_from(["fp32", "fp16", "bf16"])),
        output_rounding=draw(st.sampled_from(ROUNDINGS)),
        output_subnormals=draw(st.booleans()),
        accumulator_exponent=draw(st.sampled_from(["leading_bit", "format_emin"])),
        zero_term_exponent=draw(st.sampled_from([None, -133, -21, -4, 3])),
        accumulator_overflow=draw(st.sampled_from(["ieee", "infinity"])),
        output_zero_sign=draw(
            st.sampled_from(["ieee", "positive", "exact_positive", "ieee_steps"])
        ),
        input_zero_sign=draw(st.sampled_from(["keep", "positive"])),
        product_overflow_exponent=draw(st.sampled_from([None, None, None, 0, 6, 12])),
        structure="fused",
        parity_windows=False,
        second_alignment_bits=None,
        far_accumulator="floor",
        special_accumulator_exponent=None,
    )
    params = with_adder_structure(draw, params)
    try:
        check_consistency(params, "random")
    except ConfigError:
        assume(False)  # a combination the config loader rejects
    return params


def with_adder_structure(draw, params: DatapathParams) -> DatapathParams:
    """``params`` in a third of the cases turned into a pairwise rounded adder, or a windowed
    tree with parity windows and/or a second alignment (what those keys need set with them)."""
    structure = draw(st.sampled_from(["fused"] * 4 + ["pairwise_rounded", "second_alignment"]))
    if structure == "fused":
        return params
    floating = dict(
        accumulator_format=params.accumulator_format
        if params.accumulator_format != "exact"
        else "fp32",
        c_entry="initial",
        promotion_interval=None,
        grid_fraction_bits=None,
    )
    if params.scales == "group_sum":
        floating.update(scales="products", scale_format="e8m0")
    if structure == "pairwise_rounded":
        return dataclasses.replace(params, structure=structure, **floating)
    parity = draw(st.booleans())
    params = dataclasses.replace(
        params,
        **floating,
        parity_windows=parity,
        second_alignment_bits=None if parity and draw(st.booleans()) else draw(st.integers(0, 40)),
        far_accumulator=draw(st.sampled_from(["floor", "zero"])),
        accumulator_in_tree=False,
        align_fraction_bits=params.align_fraction_bits
        if params.align_fraction_bits is not None
        else draw(st.integers(0, 30)),
        below_window=params.below_window if params.below_window != "sticky" else "floor",
        sum_significant_bits=None,
        trees_in_blocks=params.trees_in_blocks and params.term_order is None,
    )
    return with_special_accumulator_exponent(draw, params)


def with_special_accumulator_exponent(draw, params: DatapathParams) -> DatapathParams:
    """``adder.special_accumulator_exponent`` drawn where it applies (a second alignment that
    drops far accumulators), null in half the cases."""
    if params.second_alignment_bits is None or params.far_accumulator != "zero":
        return params
    return dataclasses.replace(
        params, special_accumulator_exponent=draw(st.one_of(st.none(), st.integers(-30, 40)))
    )


def realistic_operand(
    rng, fmt_name: str, block_size: int | None, rows: int, length: int, scale_format: str = "e8m0"
):
    """Codes of normal-distributed rows at a few magnitudes (clipped to the format) and, for
    units with block scales (``block_size`` given), scales near 1 (codes of ``scale_format``):
    what a quantized layer hands a unit. Sums stay well inside fp16's range."""
    fmt = get_format(fmt_name)
    magnitude = np.exp2(rng.integers(-3, 4, size=(rows, 1)).astype(np.float64))
    x = np.clip(rng.standard_normal((rows, length)) * magnitude, -fmt.max_finite, fmt.max_finite)
    codes = fmt.encode(x)
    if block_size is None:
        return codes, None
    scale_fmt = get_format(scale_format)
    near_one = scale_fmt.encode(np.exp2(rng.uniform(-4, 3, size=(rows, -(-length // block_size)))))
    return codes, near_one.astype(np.uint8)


CORNER_SHARE = 0.15  # of random cases: uniform codes (NaN/Inf/max), special scales and c


def random_inputs(draw, params: DatapathParams, rows: int):
    """Mostly realistic finite operands; a minority of corner cases (uniform codes, which
    hit NaN/Inf/0 and the largest values, special scales, special c)."""
    length = draw(st.integers(1, 70))  # any K: partial trees and partial term-order periods
    blocks = -(-length // params.block_size)
    scaled = params.scales != "none"
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if rng.random() >= CORNER_SHARE:  # not a hypothesis draw: those lean on the bounds
        event("inputs: realistic")
        a, scale_a = realistic_operand(
            rng,
            params.a_format,
            params.block_size if scaled else None,
            rows,
            length,
            params.scale_format,
        )
        b, scale_b = realistic_operand(
            rng,
            params.b_format,
            params.block_size if scaled else None,
            rows,
            length,
            params.scale_format,
        )
        c = rng.standard_normal(rows) * np.exp2(rng.integers(-4, 5, size=rows))
        c[rng.random(rows) < 0.3] = 0.0
        return a, b, scale_a, scale_b, c_of_format(c, params.c_format)
    event("inputs: corners")
    fmt_a, fmt_b = get_format(params.a_format), get_format(params.b_format)
    codes = lambda fmt: (
        np.array(
            draw(  # noqa: E731  (field codes, then placed above the padding: tf32)
                st.lists(
                    st.lists(
                        st.integers(0, (1 << fmt.field_bits) - 1), min_size=length, max_size=length
                    ),
                    min_size=rows,
                    max_size=rows,
                )
            ),
            dtype=fmt.code_dtype,
        )
        << fmt.code_dtype.type(fmt.padding_bits)
    )
    a, b = codes(fmt_a), codes(fmt_b)
    scale_fmt = get_format(params.scale_format)
    one, top = int(scale_fmt.encode(np.array([1.0]))[0]), (1 << scale_fmt.bits) - 1
    scale = st.one_of(
        st.integers(one - 9, one + 9), st.sampled_from([0, 1, one, top - 2, top - 1, top])
    )
    scales = lambda: np.array(  # noqa: E731
        draw(
            st.lists(
                st.lists(scale, min_size=blocks, max_size=blocks), min_size=rows, max_size=rows
            )
        ),
        dtype=np.uint8,
    )
    scale_a, scale_b = (scales(), scales()) if scaled else (None, None)
    c_value = st.one_of(
        st.floats(width=32, allow_nan=False, allow_infinity=False),
        st.floats(-100, 100, width=32),
        st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3.4e38]),
    )
    c = np.array(draw(st.lists(c_value, min_size=rows, max_size=rows)), dtype=np.float64)
    return a, b, scale_a, scale_b, c_of_format(c, params.c_format)


def c_of_format(c: np.ndarray, c_format: str) -> np.ndarray:
    """Values rounded into ``c_format`` (±Inf beyond it), in the dtype the kernels read."""
    return get_format(c_format).round(c, overflow="inf").astype(kernel_c_dtype(c_format))


def assert_kernel_matches_reference(params, a, b, scale_a, scale_b, c):
    out = dot_with_params(params, a, b, scale_a=scale_a, scale_b=scale_b, c=c)
    out_format = get_format(params.output_format)
    for i in range(a.shape[0]):
        value = dot_reference(
            params,
            a[i].tolist(),
            b[i].tolist(),
            None if scale_a is None else scale_a[i].tolist(),
            None if scale_b is None else scale_b[i].tolist(),
            float(c[i]),
        )
        want = int(out_format.encode(np.array([value]), overflow="inf_nan")[0])
        assert int(out[i]) == want, (i, params, hex(int(out[i])), hex(want), value)
        event(
            "output: "
            + (
                "NaN/Inf"
                if not math.isfinite(value)
                else "zero"
                if value == 0
                else "finite nonzero"
            )
        )


@settings(max_examples=120)
@given(data=st.data())
def test_kernel_equals_reference_on_random_configs(data):
    params = data.draw(random_params())
    window = (
        "exact"
        if params.align_fraction_bits is None
        else "narrow"
        if params.align_fraction_bits < 12
        else "wide"
    )
    event(
        f"config: window {window}, below {params.below_window}, carry {params.carry_bits is not None}, "
        f"sum bits {params.sum_significant_bits is not None}, order {params.term_order is not None}, "
        f"grid {params.grid_fraction_bits is not None}, trees in blocks {params.trees_in_blocks}"
    )
    event(
        f"adder: {params.structure}, parity windows {params.parity_windows}, "
        f"second alignment {params.second_alignment_bits is not None}"
    )
    assert_kernel_matches_reference(params, *random_inputs(data.draw, params, rows=3))


@settings(max_examples=60)
@given(data=st.data())
def test_dot_with_each_params_is_a_dot_with_params_call_per_params(data):
    """The batch entry (operands checked once for many units) gives each unit's bits as its own
    ``dot_with_params`` call does, dtype included, and refuses operands as the first call to
    refuse them does. The units share the first one's element formats (one probe batch); half
    of them share its scale layout and c format too, the others bring their own, which the
    operands may not fit."""
    first = data.draw(random_params())
    units = [first]
    for _ in range(data.draw(st.integers(1, 5))):
        other = dataclasses.replace(
            data.draw(random_params()),
            a_format=first.a_format,
            b_format=first.b_format,
            same_format=first.same_format,
        )
        if data.draw(st.booleans()):
            other = dataclasses.replace(
                other,
                scales=first.scales,
                scale_format=first.scale_format,
                block_size=first.block_size,
                group_terms=first.group_terms,
                fused_terms=first.fused_terms,
                term_order=first.term_order,
                c_format=first.c_format,
            )
        try:
            check_consistency(other, "random")
        except ConfigError:
            continue
        units.append(other)
    a, b, scale_a, scale_b, c = random_inputs(data.draw, first, rows=4)
    method = data.draw(st.sampled_from(["auto", "kernel"]))
    operands = dict(scale_a=scale_a, scale_b=scale_b, c=c, method=method)
    want, refusal = [], None
    for params in units:
        try:
            want.append(dot_with_params(params, a, b, **operands))
        except MxsimError as error:
            refusal = error
            break
    event(f"units: {len(units)}, {'refused' if refusal else 'all computed'}")
    if refusal is not None:
        with pytest.raises(type(refusal), match=re.escape(str(refusal))):
            dot_with_each_params(units, a, b, **operands)
        return
    got = dot_with_each_params(units, a, b, **operands)
    assert len(got) == len(want)
    for params, bits, expected in zip(units, got, want):
        assert bits.dtype == expected.dtype and np.array_equal(bits, expected), params


def bounded_fields():
    """(params field, key) of every integer key with documented bounds."""
    from mxsim.datapath.schema import SCHEMA

    fields = {f.name for f in dataclasses.fields(DatapathParams)}
    return [
        (key.field or name, key)
        for section in SCHEMA.values()
        for name, key in section.items()
        if key.kind in ("int", "optional_int")
        and key.minimum is not None
        and (key.field or name) in fields
    ]


@pytest.mark.parametrize("below_window", ["floor", "sticky", "nearest_even"])
@pytest.mark.parametrize("zero_term_exponent", [1022, 900, 100])
def test_a_term_far_below_a_high_zero_term_window_keeps_its_sign(below_window, zero_term_exponent):
    """A tree whose zero terms place the window's LSB at 2^1022 (``zero_term_exponent`` at its
    bound): a product of 2^-148 lies 1170 binades below it, where its float64 scaling
    underflows to 0, yet floor keeps -1 LSB of a negative one and sticky sets its bit; the
    Fraction twin's bits, for products of either sign and scales from 2^-127."""
    base = hw("b200-fp8").params("fp8_e4m3", "fp8_e4m3")
    params = dataclasses.replace(
        base,
        block_size=4,
        scales="products",
        scale_format="e8m0",
        fused_terms=4,
        align_fraction_bits=0,
        below_window=below_window,
        zero_term_exponent=zero_term_exponent,
        carry_bits=None,
    )
    check_consistency(params, "test")
    a = np.array([[0, 0, 0, 8], [0, 0, 0, 8], [0, 0, 8, 8]], dtype=np.uint8)  # 2^-6
    b = np.array([[0, 0, 0, 136], [0, 0, 0, 8], [0, 0, 136, 136]], dtype=np.uint8)  # -2^-6
    scale_a = np.full((3, 1), 118, dtype=np.uint8)  # 2^-9
    scale_b = np.zeros((3, 1), dtype=np.uint8)  # 2^-127
    out = dot_with_params(params, a, b, scale_a=scale_a, scale_b=scale_b)
    for i in range(3):
        value = dot_reference(params, a[i].tolist(), b[i].tolist(), [118], [0], 0.0)
        want = int(get_format("fp32").encode(np.array([value]), overflow="inf_nan")[0])
        assert int(out[i]) == want, (i, hex(int(out[i])), hex(want), value)


@settings(max_examples=40)
@given(data=st.data())
def test_kernel_equals_reference_with_keys_at_their_bounds(data):
    """Every integer key drawn to its documented bounds (or next to them) in some cases: the
    kernel and the Fraction twin agree over the whole documented range, not only the
    realistic values of the test above."""
    params = data.draw(random_params())
    changes = {}
    for field, key in bounded_fields():
        if (
            getattr(params, field) is None
            and key.kind == "optional_int"
            and field != "zero_term_exponent"
        ):
            continue  # a key that needs others set with it keeps null
        if data.draw(st.integers(0, 3)) == 0:
            high = key.maximum if key.maximum is not None else key.minimum + 2**20
            changes[field] = data.draw(
                st.sampled_from([key.minimum, high, key.minimum + 1, high - 1])
            )
    params = dataclasses.replace(params, **changes)
    try:
        check_consistency(params, "bounds")
    except ConfigError:
        assume(False)
    for field, value in changes.items():
        event(f"{field} at a bound")
    assert_kernel_matches_reference(params, *random_inputs(data.draw, params, rows=2))


def test_zero_term_exponent_past_fp64_is_refused_and_at_1023_agrees():
    """1100 made the kernel return -Inf where the twin gives +0, and 1023 with a 0-bit window
    +0 where the twin floors -4.5 to -2^1023 (-Inf in fp32); the key now ends at 1022, where
    kernel, twin and explain agree."""
    import yaml

    from mxsim.datapath import parse_hwconfig

    raw = yaml.safe_load((REPO / "hwconfigs" / "ocp-exact.yaml").read_text())
    fmt = get_format("fp6_e2m3")
    a, b = fmt.encode(np.array([[0, -1.5]])), fmt.encode(np.array([[0, 3.0]]))
    raw["adder"].update(zero_term_exponent=1100, align_fraction_bits=50)
    for value in (1100, 1023):
        raw["adder"]["zero_term_exponent"] = value
        with pytest.raises(
            ConfigError, match="zero_term_exponent: expected an integer -1100..1022"
        ):
            parse_hwconfig(raw)
    for below in ("truncate", "floor", "nearest_even", "sticky"):
        for fraction_bits in (0, 50):
            raw["adder"].update(
                zero_term_exponent=1022, align_fraction_bits=fraction_bits, below_window=below
            )
            hw = parse_hwconfig(raw)
            got = dot(hw, a, b, a_format="fp6_e2m3", b_format="fp6_e2m3", method="kernel")
            shown = explain(hw, a[0], b[0], a_format="fp6_e2m3", b_format="fp6_e2m3")
            # -4.5 kept on a grid of 2^(1022 - F): 0 toward zero or to nearest, -2^(1022 - F) (-Inf in fp32) floored
            floored = below in ("floor", "sticky") and fraction_bits < 1022 - 127
            assert int(got[0]) == shown["bits"] == (0xFF800000 if floored else 0)


@pytest.mark.slow  # a sweep over every shipped datapath
@pytest.mark.parametrize("config", DATAPATHS)
@settings(max_examples=60)
@given(data=st.data())
def test_kernel_equals_reference_on_shipped_configs(config, data):
    unit = load_hwconfig(config)
    a_format, b_format = data.draw(st.sampled_from(unit.format_pairs))
    out_format = data.draw(
        st.sampled_from(sorted({"fp32", "fp16", "bf16", unit.sections[("output", "format")]}))
    )
    params = unit.params(a_format, b_format, out_format)
    assert_kernel_matches_reference(params, *random_inputs(data.draw, params, rows=2))


MATRIX_CORE_ELEMENTS = [
    "fp16",
    "bf16",
    "tf32",
    "fp8_e4m3fnuz",
    "fp8_e5m2fnuz",
    "fp8_e4m3",
    "fp4_e2m1",
]


@st.composite
def matrix_core_params(draw) -> DatapathParams:
    """The matrix-core adders (AMD CDNA2's pairwise rounded adds, CDNA3's parity windows and
    second alignment) around their shipped configs, every neighbouring key varied."""
    pairwise = draw(st.booleans())
    unit = load_hwconfig(REPO / "hwconfigs" / ("mi250.yaml" if pairwise else "mi300.yaml"))
    params = dataclasses.replace(
        unit.params(unit.a_formats[0], unit.b_formats[0], "fp32"),
        a_format=draw(st.sampled_from(MATRIX_CORE_ELEMENTS)),
        b_format=draw(st.sampled_from(MATRIX_CORE_ELEMENTS)),
        fused_terms=draw(st.sampled_from([1, 2, 3, 4, 8, 16])),
        input_subnormals=draw(st.booleans()),
        input_zero_sign=draw(st.sampled_from(["keep", "positive"])),
        product_overflow_exponent=draw(st.sampled_from([None, 128, 20, 4])),
        accumulator_format=draw(st.sampled_from(["fp32", "fp32", "fp16", "bf16"])),
        accumulator_rounding=draw(st.sampled_from(ROUNDINGS)),
        accumulator_subnormals=draw(st.booleans()),
        accumulator_overflow=draw(st.sampled_from(["ieee", "infinity"])),
        output_format=draw(st.sampled_from(["fp32", "fp16", "bf16"])),
        output_rounding=draw(st.sampled_from(ROUNDINGS)),
        output_subnormals=draw(st.booleans()),
        output_zero_sign=draw(st.sampled_from(["ieee", "positive", "exact_positive"])),
    )
    if not pairwise:
        parity = draw(st.booleans())
        params = dataclasses.replace(
            params,
            parity_windows=parity,
            align_fraction_bits=draw(st.integers(0, 30)),
            below_window=draw(st.sampled_from(["truncate", "floor", "nearest_even"])),
            second_alignment_bits=draw(
                st.one_of(st.integers(0, 40), st.none() if parity else st.integers(0, 40))
            ),
            far_accumulator=draw(st.sampled_from(["floor", "zero"])),
        )
        params = with_special_accumulator_exponent(draw, params)
    check_consistency(params, "matrix-core")
    return params


@settings(max_examples=50)
@given(data=st.data())
def test_kernel_equals_reference_on_matrix_core_adders(data):
    params = data.draw(matrix_core_params())
    event(
        f"adder: {params.structure}, parity windows {params.parity_windows}, "
        f"second alignment {params.second_alignment_bits is not None}"
    )
    assert_kernel_matches_reference(params, *random_inputs(data.draw, params, rows=3))


# --- exact configurations against Fraction arithmetic ----------------------------------------------


def exact_value(fmt_name, codes, scale_codes, block_size):
    fmt = get_format(fmt_name)
    values = [fmt.value_of(int(code)) for code in codes]
    return [
        v * Fraction(2) ** (int(scale_codes[i // block_size]) - 127) for i, v in enumerate(values)
    ]


def rne_fp32(value: Fraction) -> Fraction:
    return get_format("fp32").value_of(
        encode_reference(get_format("fp32"), value, "nearest_even", "inf_nan")
    )


@settings(max_examples=80)
@given(data=st.data())
def test_exact_configs_equal_exactly_rounded_fraction_sums(data):
    fmt = data.draw(st.sampled_from(["fp8_e4m3", "fp6_e2m3", "fp4_e2m1", "int8", "fp8_e5m2"]))
    finite_codes = [
        int(c)
        for c in np.flatnonzero(
            np.isfinite(get_format(fmt).decode(np.arange(1 << get_format(fmt).bits)))
        )
    ]
    length = data.draw(st.integers(1, 96))
    a = np.array(
        [data.draw(st.lists(st.sampled_from(finite_codes), min_size=length, max_size=length))],
        dtype=np.uint8,
    )
    b = np.array(
        [data.draw(st.lists(st.sampled_from(finite_codes), min_size=length, max_size=length))],
        dtype=np.uint8,
    )
    blocks = -(-length // 32)
    scale_a = np.array(
        [data.draw(st.lists(st.integers(100, 154), min_size=blocks, max_size=blocks))],
        dtype=np.uint8,
    )
    scale_b = np.array(
        [data.draw(st.lists(st.integers(100, 154), min_size=blocks, max_size=blocks))],
        dtype=np.uint8,
    )
    c = np.array([data.draw(st.floats(-1e3, 1e3, width=32))], dtype=np.float32)
    products = [
        x * y
        for x, y in zip(
            exact_value(fmt, a[0], scale_a[0], 32), exact_value(fmt, b[0], scale_b[0], 32)
        )
    ]
    kulisch = rne_fp32(Fraction(float(c[0])) + sum(products))
    ocp = Fraction(float(c[0]))
    for start in range(0, length, 32):
        ocp = rne_fp32(ocp + sum(products[start : start + 32]))
    mxdotp = Fraction(
        float(c[0])
    )  # the RTL: 8 FP8, 11 FP6 or 16 FP4 per operation, each block on its own
    lanes = 16 if fmt == "fp4_e2m1" else 11 if fmt.startswith("fp6") else 8
    for block in range(0, length, 32):
        for start in range(block, min(block + 32, length), lanes):
            mxdotp = rne_fp32(mxdotp + sum(products[start : min(start + lanes, block + 32)]))
    for name, expected in (("kulisch", kulisch), ("ocp-exact", ocp), ("mxdotp", mxdotp)):
        if name == "mxdotp" and fmt == "int8":
            continue  # MXDOTP has no INT8 lanes
        out = dot(hw(name), a, b, a_format=fmt, b_format=fmt, scale_a=scale_a, scale_b=scale_b, c=c)
        assert Fraction(float(as_float(out)[0])) == expected, name


@pytest.mark.parametrize(
    "a_format, b_format",
    [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2"), ("fp8_e4m3", "fp8_e5m2")],
)
def test_every_fp8_pair_product_is_exact(a_format, b_format):
    # One-term dot products through the Kulisch unit: fp32 holds every FP8 x FP8 product.
    grid_a, grid_b = np.meshgrid(
        np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8), indexing="ij"
    )
    a, b = grid_a.reshape(-1, 1), grid_b.reshape(-1, 1)
    out = as_float(dot(hw("kulisch"), a, b, a_format=a_format, b_format=b_format))
    with np.errstate(invalid="ignore"):
        expected = get_format(a_format).decode(a[:, 0]) * get_format(b_format).decode(
            b[:, 0]
        )  # exact in float64
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(out[finite], expected[finite])
    # NaN inputs and Inf x 0 give NaN; Inf x finite nonzero gives a signed Inf.
    assert np.array_equal(np.isnan(out), np.isnan(expected))
    assert np.array_equal(out[np.isinf(expected)], expected[np.isinf(expected)])
    zero = expected == 0
    assert np.array_equal(
        np.signbit(out[zero]), np.zeros(zero.sum(), dtype=bool)
    )  # +0 unless c and all are -0


# --- special values and corners ------------------------------------------------------------------------


def one_dot(
    unit, a_values, b_values, fmt="fp8_e5m2", c=0.0, scale_a=None, scale_b=None, out_format=None
):
    element = get_format(fmt)
    overflow = "inf_nan" if element.has_nan else "saturate"
    a = element.encode(np.array([a_values], dtype=np.float64), overflow=overflow)
    b = element.encode(np.array([b_values], dtype=np.float64), overflow=overflow)
    sa = None if scale_a is None else np.array([scale_a], dtype=np.uint8)
    sb = None if scale_b is None else np.array([scale_b], dtype=np.uint8)
    out = dot(
        unit,
        a,
        b,
        a_format=fmt,
        b_format=fmt,
        scale_a=sa,
        scale_b=sb,
        c=np.array([c], dtype=np.float32),
        out_format=out_format,
    )
    return float(as_float(out, out_format or "fp32")[0]), int(out[0])


@pytest.mark.parametrize("name", ["ocp-exact", "kulisch", "mxdotp", "h100-fp8", "b200-fp8"])
def test_nan_and_infinity_follow_ieee(name):
    unit = hw(name)
    assert math.isnan(one_dot(unit, [np.nan, 1.0], [1.0, 1.0])[0])
    assert one_dot(unit, [np.inf, 1.0], [1.0, 1.0])[0] == math.inf
    assert math.isnan(one_dot(unit, [np.inf, -np.inf], [1.0, 1.0])[0])
    assert math.isnan(one_dot(unit, [np.inf, 1.0], [0.0, 1.0])[0])
    assert one_dot(unit, [1.0], [1.0], c=-np.inf)[0] == -math.inf
    value, bits = one_dot(unit, [1.0], [1.0], c=np.nan)
    assert math.isnan(value) and bits == 0x7FC00000  # the canonical quiet NaN


def test_nan_scale_makes_its_block_nan():
    unit = hw("ocp-exact")
    ones = [1.0] * 64
    assert math.isnan(
        one_dot(unit, ones, ones, fmt="fp8_e4m3", scale_a=[127, 255], scale_b=[127, 127])[0]
    )
    assert (
        one_dot(unit, ones, ones, fmt="fp8_e4m3", scale_a=[127, 128], scale_b=[126, 127])[0]
        == 32 * 0.5 + 32 * 2
    )


def test_overflow_beyond_fp32_depends_on_the_rounding():
    big = [57344.0] * 32
    scales = [254]  # 2^127 each: the sum is far above fp32's range
    assert one_dot(hw("ocp-exact"), big, big, scale_a=scales, scale_b=[127])[0] == math.inf
    kulisch_fp16 = one_dot(hw("kulisch"), [57344.0] * 2, [2.0] * 2, out_format="fp16")[0]
    assert kulisch_fp16 == math.inf
    # Rounding toward zero saturates at the largest finite value, as IEEE 754 says.
    params = hw("ocp-exact").params("fp8_e5m2", "fp8_e5m2")
    toward_zero = DatapathParams(**{**params.__dict__, "accumulator_rounding": "toward_zero"})
    codes = get_format("fp8_e5m2").encode(np.array([big]))
    out = dot_with_params(
        toward_zero,
        codes,
        codes,
        scale_a=np.array([scales], dtype=np.uint8),
        scale_b=np.array([[127]], dtype=np.uint8),
    )
    assert as_float(out)[0] == float(np.finfo(np.float32).max)


def test_all_zero_blocks_and_signed_zeros():
    unit = hw("ocp-exact")
    assert one_dot(unit, [0.0] * 32, [1.0] * 32) == (0.0, 0)
    assert one_dot(unit, [-0.0] * 4, [1.0] * 4, c=-0.0) == (-0.0, 0x80000000)
    assert one_dot(unit, [-0.0] * 4, [1.0] * 4, c=0.0) == (0.0, 0)


def test_massive_cancellation_is_exact_in_exact_units_and_lossy_on_h100():
    a = [57344.0, 2.0**-16, -57344.0]
    b = [57344.0, 2.0**-16, 57344.0]
    assert one_dot(hw("kulisch"), a, b)[0] == 2.0**-32
    assert one_dot(hw("ocp-exact"), a, b)[0] == 2.0**-32
    assert (
        one_dot(hw("h100-fp8"), a, b)[0] == 0.0
    )  # the tiny product falls out of the 13-bit window


def test_alignment_window_edge_on_h100():
    # max(ea+eb) = 0; the window keeps multiples of 2^-13. A product of exactly 2^-13 survives,
    # 2^-14 is truncated away; 3 * 2^-14 keeps 2^-13.
    unit = hw("h100-fp8")
    assert one_dot(unit, [1.0, 2.0**-13], [1.0, 1.0])[0] == 1 + 2.0**-13
    assert one_dot(unit, [1.0, 2.0**-14], [1.0, 1.0])[0] == 1.0
    assert one_dot(unit, [1.0, 3 * 2.0**-14], [1.0, 1.0])[0] == 1 + 2.0**-13


def test_promotion_interval_recovers_precision_lost_by_hopper():
    # 128 products of 1.0, then 128 of 2^-8 (an fp8_e4m3 subnormal), twice: 257 exactly.
    # Plain H100: once the in-tree accumulator holds 128 (R = 7, window LSB 2^(7-13) = 2^-6),
    # every 2^-8 truncates to nothing: 256. Promoted every 128 products, each run of 2^-8
    # starts from a zero accumulator (R = -6, the subnormals' alignment exponent), is summed
    # exactly to 0.5, and the fp32 outer sum gets 128 + 0.5 + 128 + 0.5 = 257.
    values = ([1.0] * 128 + [2.0**-8] * 128) * 2
    ones = [1.0] * len(values)
    assert one_dot(hw("kulisch"), values, ones, fmt="fp8_e4m3")[0] == 257.0
    assert one_dot(hw("h100-fp8"), values, ones, fmt="fp8_e4m3")[0] == 256.0
    assert one_dot(hw("h100-fp8-promoted"), values, ones, fmt="fp8_e4m3")[0] == 257.0


# Two products of 448 x 448 = 401408 overflow an fp16 accumulator (max 65504).
BIG = [448.0, 448.0]


@pytest.mark.parametrize(
    "sign, c, expected",
    [
        (-1.0, math.inf, math.nan),  # the first tree's -Inf meets c = +Inf at the end
        (-1.0, -math.inf, -math.inf),
        (-1.0, 1.0, -math.inf),
        (1.0, math.nan, math.nan),
    ],
)
def test_c_added_at_the_end_meets_the_accumulators_overflow_by_an_ieee_add(sign, c, expected):
    # The H200's FP8 mma.sync with fp16 output: fp16 trees from zero, then c by an fp16 add
    # (HADD2), which gives NaN for -Inf + Inf, as the GPU does.
    params = hw("h200").params("fp8_e4m3", "fp8_e4m3", "fp16")
    assert params.c_entry == "end"
    a = [sign * x for x in BIG] + [0.0] * 30
    assert same_float(dot_values(params, a, BIG + [0.0] * 30, c=c), expected)


@pytest.mark.parametrize(
    "first, second, c, expected",
    [
        (1.0, -1.0, 0.0, math.nan),  # +Inf from the first interval, -Inf from the second
        (1.0, 1.0, 0.0, math.inf),
        (1.0, 0.0, -math.inf, math.nan),  # c starts the outer accumulator at -Inf
        (1.0, 0.0, math.inf, math.inf),
        (0.0, -1.0, 5.0, -math.inf),
    ],
)
def test_promotion_adds_each_intervals_overflow_into_the_outer_accumulator(
    first, second, c, expected
):
    # An fp16 accumulator promoted every 32 products into the fp32 outer accumulator: each
    # interval's overflow enters the outer register as an IEEE add would take it.
    params = windowed(accumulator_format="fp16", promotion_interval=32)
    zeros = [0.0] * 30
    a = [first * x for x in BIG] + zeros + [second * x for x in BIG] + zeros
    b = (BIG + zeros) * 2
    assert same_float(dot_values(params, a, b, c=c), expected)


# --- each adder key on hand-worked examples ------------------------------------------------------


def windowed(**changes) -> DatapathParams:
    """H100's fp32 unit (window of 13 fraction bits, accumulator in the tree) with a plain fp32
    round-to-nearest-even accumulator and no n-bit normalisation, so one key shows at a time."""
    base = hw("h100-fp8").params("fp8_e5m2", "fp8_e5m2")
    return DatapathParams(
        **{
            **base.__dict__,
            "sum_significant_bits": None,
            "accumulator_rounding": "nearest_even",
            "output_rounding": "nearest_even",
            **changes,
        }
    )


def dot_values(params, a_values, b_values, c=0.0, scale_a=None, scale_b=None) -> float:
    a_fmt, b_fmt = get_format(params.a_format), get_format(params.b_format)
    a, b = a_fmt.encode(np.array([a_values])), b_fmt.encode(np.array([b_values]))
    assert (a_fmt.decode(a) == a_values).all() and (
        b_fmt.decode(b) == b_values
    ).all()  # exact inputs
    sa = None if scale_a is None else np.array([scale_a], dtype=np.uint8)
    sb = None if scale_b is None else np.array([scale_b], dtype=np.uint8)
    out = dot_with_params(params, a, b, scale_a=sa, scale_b=sb, c=np.array([c], dtype=np.float32))
    twin = dot_reference(params, a[0].tolist(), b[0].tolist(), scale_a, scale_b, c)
    value = float(as_float(out, params.output_format)[0])
    assert same_float(value, twin)
    return value


# R = 0 (1.0 x 1.0), window LSB 2^-13; the second term is -0.75 or -0.5 LSB.
@pytest.mark.parametrize(
    "below, three_quarters, half",
    [
        ("truncate", 1.0, 1.0),  # toward zero: both vanish
        ("floor", 1 - 2.0**-13, 1 - 2.0**-13),  # toward -inf: one LSB each
        ("nearest_even", 1 - 2.0**-13, 1.0),  # -0.75 -> -1; the tie -0.5 -> -0 (even)
        ("sticky", 1 - 2.0**-14, 1 - 2.0**-14),  # one half-LSB bit, set: -2^-14
    ],
)
def test_below_window_rules(below, three_quarters, half):
    params = windowed(below_window=below)
    assert dot_values(params, [1.0, -(2.0**-14 + 2.0**-15)], [1.0, 1.0]) == three_quarters
    assert dot_values(params, [1.0, -(2.0**-14)], [1.0, 1.0]) == half


@pytest.mark.parametrize(
    "carry_bits, overflow, expected",
    [
        (0, "wrap", -2.0),
        (0, "saturate", 3.5),
        (1, "wrap", 6.0),
        (1, "saturate", 6.0),
    ],
)
def test_carry_bits_set_the_adder_width(carry_bits, overflow, expected):
    # Window of 1 fraction bit below R = 0: the register holds 1 + (1 + 2) + carry_bits bits in
    # units of 2^-1. Four products of 1.5 are 12 units: a 4-bit register (-8..7) wraps to -4
    # units or saturates at 7; a 5-bit one (-16..15) holds 12 = 6.0.
    params = windowed(align_fraction_bits=1, carry_bits=carry_bits, adder_overflow=overflow)
    assert dot_values(params, [1.5] * 4, [1.0] * 4) == expected


@pytest.mark.parametrize(
    "fraction_bits, expected", [(None, 3.0625), (5, 3.0625), (4, 3.0), (1, 3.0), (0, 2.0)]
)
def test_product_fraction_bits_truncate_each_product(fraction_bits, expected):
    # 1.75^2 = 3.0625 = 1.10001b x 2^1: five fraction bits keep it, four or fewer lose the 2^-4.
    params = windowed(align_fraction_bits=None, product_fraction_bits=fraction_bits)
    params = DatapathParams(**{**params.__dict__, "a_format": "fp8_e4m3", "b_format": "fp8_e4m3"})
    assert dot_values(params, [1.75], [1.75]) == expected


@pytest.mark.parametrize("reference, expected", [("exponent_sum", 2.5), ("leading_bit", 2.0)])
def test_alignment_reference(reference, expected):
    # 1.5 x 1.5 = 2.25 and 1.0 x 0.25, two window fraction bits. exponent_sum: R = 0 + 0, LSB
    # 2^-2 keeps both exactly (2.5). leading_bit: R = floor(log2 2.25) = 1, LSB 2^-1: 2.25 -> 2.0
    # and 0.25 -> 0.
    params = windowed(align_fraction_bits=2, align_reference=reference)
    assert dot_values(params, [1.5, 1.0], [1.5, 0.25]) == expected


def test_block_sum_scales_apply_to_each_tree_sum():
    # Two blocks of four, one tree each, scales 2^1 and 2^-1 on A: 4 x 1 x 2 + 4 x 1.25 x 0.5.
    params = windowed(scales="block_sum", block_size=4, fused_terms=4, accumulator_in_tree=False)
    assert (
        dot_values(
            params, [1.0] * 4 + [1.25] * 4, [1.0] * 8, scale_a=[128, 126], scale_b=[127, 127]
        )
        == 10.5
    )
    # The window is the unscaled tree's: 1 + 2^-14 loses its 2^-14 whatever the scale.
    assert (
        dot_values(params, [1.0, 2.0**-14, 0.0, 0.0], [1.0] * 4, scale_a=[137], scale_b=[127])
        == 1024.0
    )


def test_c_entry_initial_or_end():
    # fp16 accumulator, window 10 fraction bits, c = 2048: at the start c joins every tree's
    # alignment (R = 11, LSB 2^1), so the product 1.0 truncates away and 3.0 keeps 2; added at
    # the end, the product survives its tree whole and 2048 + 1 and 2048 + 3 are ties that
    # round (nearest even) to 2048 and 2052 in fp16.
    start = windowed(
        align_fraction_bits=10, accumulator_format="fp16", output_format="fp16", c_entry="initial"
    )
    end = DatapathParams(**{**start.__dict__, "c_entry": "end", "c_add_rounding": "nearest_even"})
    assert dot_values(start, [1.0], [1.0], c=2048.0) == 2048.0
    assert dot_values(start, [3.0], [1.0], c=2048.0) == 2050.0
    assert dot_values(end, [1.0], [1.0], c=2048.0) == 2048.0
    assert dot_values(end, [3.0], [1.0], c=2048.0) == 2052.0


# --- explain, matmul, errors -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["h100-fp8", "ocp-exact", "b200-fp8"])
def test_explain_agrees_with_dot(name):
    a, b, c, _, _ = oracle("B200", "E4M3")
    unit = hw(name)
    report = explain(unit, a[7], b[7], a_format="fp8_e4m3", b_format="fp8_e4m3", c=float(c[7]))
    bits = dot(unit, a[7:8], b[7:8], a_format="fp8_e4m3", b_format="fp8_e4m3", c=c[7:8])
    assert report["bits"] == int(bits[0])
    stages = [s["stage"] for s in report["stages"]]
    assert stages.count("product") == 32 and stages[-1] == "output"


@pytest.mark.parametrize(
    "name, a_format, b_format, a, b, c, bits, stage",
    [
        # A second alignment (c at E = 0) floors the tree sum 2^-24 + 2^-40 to 2^-32: 1 + 2^-24 is
        # a tie, to even 1.0; exact (mi100), 1 + 2^-23.
        (
            "mi300",
            "fp16",
            "fp16",
            [2.0**-12, 2.0**-20],
            [2.0**-12, 2.0**-20],
            1.0,
            0x3F800000,
            "second_alignment",
        ),
        (
            "mi100",
            "fp16",
            "fp16",
            [2.0**-12, 2.0**-20],
            [2.0**-12, 2.0**-20],
            1.0,
            0x3F800001,
            "tree",
        ),
        # Pairwise rounded adds: (1 + 2^-24) + (2^-24 + 0) rounds twice to 1.0.
        (
            "mi250",
            "fp16",
            "fp16",
            [1.0, 2.0**-12, 2.0**-12, 0.0],
            [1.0, 2.0**-12, 2.0**-12, 1.0],
            0.0,
            0x3F800000,
            "pairwise",
        ),
        (
            "mi100",
            "fp16",
            "fp16",
            [1.0, 2.0**-12, 2.0**-12, 0.0],
            [1.0, 2.0**-12, 2.0**-12, 1.0],
            0.0,
            0x3F800001,
            "tree",
        ),
        # Parity windows: the odd product -2^-27 is exact in its own window, then floored to -2^-24.
        (
            "mi300",
            "fp8_e4m3fnuz",
            "fp8_e5m2fnuz",
            [1.0, -(2.0**-10)],
            [1.0, 2.0**-17],
            0.0,
            0x3F7FFFFF,
            "parity_windows",
        ),
        # c = -2^-60 far below E = 0: dropped on the FP8 path (1.0), floored to -2^-24 on fp16's.
        (
            "mi300",
            "fp8_e4m3fnuz",
            "fp8_e4m3fnuz",
            [1.0],
            [1.0],
            -(2.0**-60),
            0x3F800000,
            "second_alignment",
        ),
        ("mi300", "fp16", "fp16", [1.0], [1.0], -(2.0**-60), 0x3F7FFFFF, "second_alignment"),
        # A NaN or Inf c aligns at exponent -1 on the FP8 path: a product of 2^26 (E = 26) drops it,
        # one of 2^24 does not; a NaN element in the first tree is dropped with the running sum.
        (
            "mi300",
            "fp8_e5m2fnuz",
            "fp8_e5m2fnuz",
            [2.0**13],
            [2.0**13],
            np.nan,
            0x4C800000,
            "special_accumulator",
        ),
        (
            "mi300",
            "fp8_e5m2fnuz",
            "fp8_e5m2fnuz",
            [2.0**12],
            [2.0**12],
            np.inf,
            0x7F800000,
            "output",
        ),
        (
            "mi300",
            "fp8_e5m2fnuz",
            "fp8_e5m2fnuz",
            [np.nan] + [1.0] * 15 + [2.0**13],
            [1.0] * 16 + [2.0**13],
            0.0,
            0x4C800000,
            "special_accumulator",
        ),
        (
            "mi300",
            "fp8_e5m2fnuz",
            "fp8_e5m2fnuz",
            [1.0] * 16 + [2.0**13, np.nan],
            [1.0] * 16 + [2.0**13, 1.0],
            0.0,
            0x7FC00000,
            "output",
        ),
        # Products of 2^200 overflow to +Inf and -Inf: NaN; the exact sum is +0.
        (
            "mi300",
            "bf16",
            "bf16",
            [2.0**100, -(2.0**100)],
            [2.0**100, 2.0**100],
            0.0,
            0x7FC00000,
            "output",
        ),
        (
            "mi100",
            "bf16",
            "bf16",
            [2.0**100, -(2.0**100)],
            [2.0**100, 2.0**100],
            0.0,
            0x00000000,
            "output",
        ),
        # Zero signs: -0 sums are +0 (exact_positive; c = -0 read as +0), where IEEE gives -0.
        ("mi100", "fp16", "fp16", [-0.0], [1.0], -0.0, 0x00000000, "output"),
        ("mi250", "fp16", "fp16", [-0.0] * 4, [1.0] * 4, -0.0, 0x00000000, "pairwise"),
        ("mi100", "fp32", "fp32", [-0.0], [1.0], -0.0, 0x80000000, "output"),  # an fma chain: IEEE
    ],
)
def test_matrix_core_units_explained(name, a_format, b_format, a, b, c, bits, stage):
    unit = hw(name)
    a_codes = get_format(a_format).encode(np.array([a])).astype(np.int64)
    b_codes = get_format(b_format).encode(np.array([b])).astype(np.int64)
    assert np.array_equal(
        get_format(a_format).decode(a_codes), np.array([a]), equal_nan=True
    )  # the values are exact
    report = explain(unit, a_codes[0], b_codes[0], a_format=a_format, b_format=b_format, c=c)
    result = dot(
        unit, a_codes, b_codes, a_format=a_format, b_format=b_format, c=np.array([c], np.float32)
    )
    assert report["bits"] == int(result[0]) == bits, (hex(report["bits"]), hex(int(result[0])))
    assert stage in [s["stage"] for s in report["stages"]]


def test_matmul_equals_row_dots():
    rng = np.random.default_rng(5)
    A = rng.standard_normal((5, 70)).astype(np.float32)
    B = rng.standard_normal((70, 3)).astype(np.float32)
    unit = hw("ocp-exact")
    qa, qb = quantize(A, "fp8_e4m3", axis=1), quantize(B, "fp6_e2m3", axis=0)
    result = matmul(unit, qa, qb)
    for m in range(5):
        for n in range(3):
            row = dot(
                unit,
                qa.codes[m : m + 1],
                qb.codes[n : n + 1],
                a_format="fp8_e4m3",
                b_format="fp6_e2m3",
                scale_a=qa.scales[m : m + 1],
                scale_b=qb.scales[n : n + 1],
            )
            assert result.bits[m, n] == row[0]
    assert np.allclose(result.values, qa.dequantize() @ qb.dequantize(), rtol=1e-6)


def test_bad_inputs_get_clear_errors():
    unit = hw("ocp-exact")
    a = np.zeros((2, 32), dtype=np.uint8)
    with pytest.raises(MxsimError, match="same shape"):
        dot(unit, a, a[:, :16], a_format="fp8_e4m3", b_format="fp8_e4m3")
    with pytest.raises(MxsimError, match="integer numpy array"):
        dot(unit, a.astype(float), a, a_format="fp8_e4m3", b_format="fp8_e4m3")
    with pytest.raises(MxsimError, match="codes must lie"):
        dot(unit, a + 16, a, a_format="fp4_e2m1", b_format="fp4_e2m1")
    with pytest.raises(MxsimError, match=r"shape \(2, 1\)"):
        dot(
            unit,
            a,
            a,
            a_format="fp8_e4m3",
            b_format="fp8_e4m3",
            scale_a=np.zeros((2, 2), dtype=np.uint8),
        )
    with pytest.raises(MxsimError, match="float32"):
        dot(unit, a, a, a_format="fp8_e4m3", b_format="fp8_e4m3", c=np.zeros(2))
    with pytest.raises(ConfigError, match="not supported by this unit"):
        dot(hw("h100-fp8"), a, a, a_format="fp4_e2m1", b_format="fp8_e4m3")
    with pytest.raises(MxsimError, match="takes no scales"):
        dot(
            hw("h100-fp8"),
            a,
            a,
            a_format="fp8_e4m3",
            b_format="fp8_e4m3",
            scale_a=np.zeros((2, 1), dtype=np.uint8),
        )
    with pytest.raises(MxsimError, match="HardwareConfig"):
        dot(42, a, a, a_format="fp8_e4m3", b_format="fp8_e4m3")
    with pytest.raises(ConfigError, match="no such file"):
        dot(Path("/nonexistent.yaml"), a, a, a_format="fp8_e4m3", b_format="fp8_e4m3")


@pytest.mark.parametrize("name", ["MX9", "MX6", "MX4"])
def test_shared_microexponent_operands_multiply_exactly(name):
    # BFP elements carry their sub-block's microexponent shift into the product exponent; the
    # bfp-exact unit must give RNE_fp32 of each exact 16-element block sum, accumulated.
    from mxsim import quantize_bfp

    rng = np.random.default_rng(11)
    A = (rng.standard_normal((4, 48)) * np.exp2(rng.integers(-6, 6, (4, 48)))).astype(np.float32)
    B = (rng.standard_normal((48, 3)) * np.exp2(rng.integers(-6, 6, (48, 3)))).astype(np.float32)
    ta, tb = quantize_bfp(A, name, axis=1), quantize_bfp(B, name, axis=0)
    result = matmul(hw("bfp-exact"), ta.as_mx_tensor(), tb.as_mx_tensor())
    qa, qb = ta.dequantize(), tb.dequantize()  # exact values, float32
    for m in range(4):
        for n in range(3):
            acc = Fraction(0)
            for start in range(0, 48, 16):
                block = sum(
                    Fraction(float(qa[m, k])) * Fraction(float(qb[k, n]))
                    for k in range(start, start + 16)
                )
                acc = rne_fp32(acc + block)
            assert Fraction(float(result.values[m, n])) == acc
    # The microexponents matter: a sub-block shifted by d = 1 halves its step.
    assert (ta.microexponents > 0).any()


@pytest.mark.parametrize("overflow", ["wrap", "saturate"])
def test_adder_overflow_wraps_or_saturates(overflow):
    # A window of 1 fraction bit below R = 0 and no carry bits: the adder holds 1 + (1 + 2) + 0
    # = 4-bit signed integers in units of 2^-1 (-8 .. 7). Four products of 1.5 sum to 6.0 = 12
    # units: wrapped to 12 - 16 = -4 units (-2.0), or saturated at 7 units (3.5).
    params = hw("h100-fp8").params("fp8_e4m3", "fp8_e4m3")
    params = DatapathParams(
        **{
            **params.__dict__,
            "align_fraction_bits": 1,
            "carry_bits": 0,
            "adder_overflow": overflow,
            "sum_significant_bits": None,
        }
    )
    codes = get_format("fp8_e4m3").encode(np.array([[1.5, 1.5, 1.5, 1.5]]))
    ones = get_format("fp8_e4m3").encode(np.array([[1.0, 1.0, 1.0, 1.0]]))
    value = float(as_float(dot_with_params(params, codes, ones))[0])
    assert value == {"wrap": -2.0, "saturate": 3.5}[overflow]


# --- K not a multiple of the tree or the term-order period: kernel, twin and explain agree ----

PARTIAL_LENGTHS = [1, 2, 3, 5, 15, 16, 17, 31, 33, 47, 64, 100]
FINITE_ROWS = 3  # per K, beside one corner row: finite inputs are the majority


def corner_row(rng, case, params, a, b, scale_a, scale_b, c):
    """Turn the last row into one corner (NaN/Inf element, zero row, NaN scale, infinite c,
    exact cancellation), chosen by ``case``."""
    a_fmt = get_format(params.a_format)
    kinds = ["zero", "inf_c", "cancel"]
    if a_fmt.has_nan:
        kinds.append("nan_element")
    if scale_a is not None:
        kinds.append("nan_scale")
    kind = kinds[case % len(kinds)]
    if kind == "zero":
        a[-1] = 0
    elif kind == "inf_c":
        c[-1] = np.float32(-np.inf)
    elif kind == "cancel":
        b[-1] = b[0]
        a[-1] = a_fmt.encode(-a_fmt.decode(a[0]))  # exact negation
        if scale_a is not None:
            scale_a[-1], scale_b[-1] = scale_a[0], scale_b[0]
        c[-1] = 0.0
    elif kind == "nan_element":
        a[-1, rng.integers(a.shape[1])] = a_fmt.encode(np.array([np.nan]), overflow="inf_nan")[0]
    else:
        scale_a[-1, -1] = (1 << get_format(params.scale_format).bits) - 1  # the NaN code


@pytest.mark.slow  # a sweep over every shipped datapath
@pytest.mark.parametrize("out_format", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("config_path", DATAPATHS)
def test_partial_trees_kernel_twin_and_explain_agree(config_path, out_format):
    # Every K of PARTIAL_LENGTHS; the element formats rotate through the unit's accepted ones.
    config = load_hwconfig(config_path)
    rng = np.random.default_rng(zlib.crc32(f"{config_path.stem}/{out_format}".encode()))
    rows = FINITE_ROWS + 1
    finite = 0
    for case, length in enumerate(PARTIAL_LENGTHS):
        a_format = config.a_formats[case % len(config.a_formats)]
        b_format = config.b_formats[(case // 2) % len(config.b_formats)]
        if (a_format, b_format) not in config.format_pairs:  # a unit with one format for A and B
            b_format = a_format
        params = config.params(a_format, b_format, out_format)
        block_size = None if params.scales == "none" else params.block_size
        a, scale_a = realistic_operand(rng, a_format, block_size, rows, length, params.scale_format)
        b, scale_b = realistic_operand(rng, b_format, block_size, rows, length, params.scale_format)
        c = (rng.standard_normal(rows) * np.exp2(rng.integers(-4, 5, size=rows))).astype(np.float32)
        corner_row(rng, case, params, a, b, scale_a, scale_b, c)
        out = dot(
            config,
            a,
            b,
            a_format=a_format,
            b_format=b_format,
            scale_a=scale_a,
            scale_b=scale_b,
            c=c,
            out_format=out_format,
        )
        values = as_float(out, out_format)
        for row in range(rows):
            record = explain(
                config,
                a[row],
                b[row],
                a_format=a_format,
                b_format=b_format,  # the twin, staged
                scale_a=None if scale_a is None else scale_a[row],
                scale_b=None if scale_b is None else scale_b[row],
                c=float(c[row]),
                out_format=out_format,
            )
            assert record["bits"] == int(out[row]), (
                length,
                row,
                hex(record["bits"]),
                hex(int(out[row])),
            )
            assert same_float(record["value"], float(values[row]))
        finite += int(np.isfinite(values[:FINITE_ROWS]).sum())
    assert finite >= 0.9 * FINITE_ROWS * len(
        PARTIAL_LENGTHS
    )  # finite arithmetic is what this exercises


@pytest.mark.parametrize("name", ["h100-fp8", "b200-fp8", "h200-fp8"])
@pytest.mark.parametrize("length", [1, 3, 20])
def test_fp16_output_with_a_term_order_sums_short_rows(name, length):
    # All-ones rows: the exact answer is K, representable in fp16.
    ones = np.full((2, length), get_format("fp8_e4m3").encode(np.array([1.0]))[0])
    out = dot(hw(name), ones, ones, a_format="fp8_e4m3", b_format="fp8_e4m3", out_format="fp16")
    assert as_float(out, "fp16").tolist() == [float(length)] * 2
    record = explain(
        hw(name), ones[0], ones[0], a_format="fp8_e4m3", b_format="fp8_e4m3", out_format="fp16"
    )
    assert record["value"] == float(length) and record["bits"] == int(out[0])


@pytest.mark.parametrize("method", ["kernel", "auto"])
@pytest.mark.parametrize(
    "name, out_format",
    [
        ("h100-fp8", "fp16"),
        ("b200-fp8", "fp16"),
        ("h100-fp8", "fp32"),
        ("ocp-exact", "fp32"),
        ("mxdotp", "bf16"),
    ],
)
def test_gemm_with_ragged_shapes_equals_the_twin(name, out_format, method):
    # M, N and K are multiples of no tile, tree or term-order period.
    config = hw(name)
    fmt = config.a_formats[0]
    params = config.params(fmt, fmt, out_format)
    rng = np.random.default_rng(7)
    m, n, k = 5, 7, 37
    ta = quantize(rng.standard_normal((m, k)), fmt, axis=1, block_size=params.block_size)
    tb = quantize(rng.standard_normal((k, n)), fmt, axis=0, block_size=params.block_size)
    if params.scales == "none":  # a unit without block scales takes the codes with scale 1
        ta = dataclasses.replace(ta, scales=np.full_like(ta.scales, 127))
        tb = dataclasses.replace(tb, scales=np.full_like(tb.scales, 127))
    c = rng.standard_normal((m, n)).astype(np.float32)
    result = matmul(config, ta, tb, c=c, out_format=out_format, tile_rows=3, method=method)
    codes_a, codes_b = ta.codes.reshape(m, -1), tb.codes.reshape(n, -1)
    scales_a, scales_b = ta.scales.reshape(m, -1), tb.scales.reshape(n, -1)
    out_fmt = get_format(out_format)
    for i in range(m):
        for j in range(n):
            twin = dot_reference(
                params,
                codes_a[i].tolist(),
                codes_b[j].tolist(),
                None if params.scales == "none" else scales_a[i].tolist(),
                None if params.scales == "none" else scales_b[j].tolist(),
                float(c[i, j]),
            )
            assert same_float(float(out_fmt.decode(result.bits[i : i + 1, j])[0]), twin), (i, j)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "tf32"])
def test_per_tensor_scale_casts_formats_as_wide_as_fp16(fmt):
    # One scale per tensor by the amax rule is FP8 practice: it would put bf16 elements at
    # 2^127, whose products overflow the unit's fp32 sums (every output ±Inf). fp16, bf16 and
    # tf32 are cast (scale 1), as replay casts them, in matmul and matmul_batched alike.
    hw = load_hwconfig(REPO / "hwconfigs" / "h200-cublas.yaml")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 5, 64)).astype(np.float32)
    b = rng.standard_normal((2, 64, 3)).astype(np.float32)
    formats = dict(a_format=fmt, b_format=fmt)
    cast = [
        [quantize(x, fmt, axis=axis, per_tensor_scale=True, tensor_scale_exponent=0) for x in xs]
        for xs, axis in ((a, 1), (b, 0))
    ]
    want = matmul_batched(hw, *cast)
    assert np.isfinite(want.values).all()
    got = matmul(hw, a[0], b[0], per_tensor_scale=True, **formats)
    assert got.scale_exponent == 0
    np.testing.assert_array_equal(got.bits, want.bits[0])
    batched = matmul_batched(hw, a, b, per_tensor_scale=True, **formats)
    np.testing.assert_array_equal(batched.bits, want.bits)
    fp8 = matmul(
        load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml"), a[0], b[0], per_tensor_scale=True
    )
    assert fp8.scale_exponent != 0  # FP8 keeps the amax rule


def test_matmul_per_tensor_scale_runs_float_operands_on_a_unit_without_block_scales():
    import dataclasses

    hw = load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml")
    rng = np.random.default_rng(12)
    a = (rng.standard_normal((4, 64)) * 50).astype(np.float32)
    b = (rng.standard_normal((64, 3)) / 50).astype(np.float32)
    c = rng.standard_normal((4, 3)).astype(np.float32)
    with pytest.raises(MxsimError, match="per_tensor_scale=True"):
        matmul(hw, a, b)
    result = matmul(hw, a, b, c=c, per_tensor_scale=True)
    qa = quantize(
        a,
        "fp8_e4m3",
        axis=1,
        block_size=hw.sections[("inputs", "block_size")],
        per_tensor_scale=True,
    )
    qb = quantize(
        b,
        "fp8_e4m3",
        axis=0,
        block_size=hw.sections[("inputs", "block_size")],
        per_tensor_scale=True,
    )
    shift = qa.tensor_scale_exponent + qb.tensor_scale_exponent
    assert result.scale_exponent == shift != 0
    # the unit multiplies the scaled elements with c * 2^-shift; values are scaled back exactly
    unscaled = matmul(
        hw,
        dataclasses.replace(qa, tensor_scale_exponent=0),
        dataclasses.replace(qb, tensor_scale_exponent=0),
        c=np.ldexp(c, -shift).astype(np.float32),
    )
    np.testing.assert_array_equal(result.bits, unscaled.bits)
    np.testing.assert_array_equal(result.values, np.ldexp(unscaled.values, shift))
    exact = a.astype(np.float64) @ b.astype(np.float64) + c
    assert np.abs(result.values - exact).max() < 0.1 * np.abs(exact).max()


# --- batches of GEMMs (attention heads): one call, the bits of one call per group -------------

BATCH_UNITS = [
    "ocp-exact",
    "h100-fp8",
    "kulisch",
    "mxdotp",
    "b200-fp8",
    "bfp-exact",
    "mxdotp-paper",
]


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(BATCH_UNITS),
    shape=st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 70), st.integers(1, 5)),
    method=st.sampled_from(["auto", "kernel"]),
    with_c=st.booleans(),
    specials=st.integers(0, 2),
    holes=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_matmul_batched_equals_one_matmul_per_group_and_the_twin(
    name, shape, method, with_c, specials, holes, seed
):
    config = hw(name)
    groups, m, k, n = shape
    per_tensor = config.sections[("inputs", "scales")] == "none"
    rng = np.random.default_rng(seed)
    # activations and weights of realistic spread, each group its own magnitude (own per-tensor scale)
    A = rng.standard_normal((groups, m, k)) * np.exp2(rng.integers(-6, 6, (groups, 1, 1)))
    B = rng.standard_normal((groups, k, n)) * np.exp2(rng.integers(-6, 6, (groups, 1, 1)))
    if specials and not per_tensor:  # a minority of corners: NaN/Inf send outputs to the kernel
        A[rng.integers(groups), rng.integers(m), rng.integers(k)] = [np.nan, np.inf][specials - 1]
    if holes and not per_tensor:  # runs of zeros: whole blocks of zeros, a column of B zeros
        # (per-tensor units: an all-zero group's tensor scale leaves c inexact, refused)
        first = rng.integers(k)
        A[:, rng.integers(m), first : first + rng.integers(1, 40)] = 0.0
        B[rng.integers(groups), :, rng.integers(n)] = 0.0
    c = rng.standard_normal((groups, m, n)).astype(np.float32) if with_c else None
    if c is not None and specials:  # a -0 accumulator input (the kernel's too)
        c[rng.integers(groups), rng.integers(m), rng.integers(n)] = -0.0
    reports = []  # with progress: passes of 5 rows (whole groups together; the BLAS route's own), each reported
    batch = matmul_batched(
        config,
        A,
        B,
        c=c,
        method=method,
        per_tensor_scale=per_tensor,
        tile_rows=5,
        progress=lambda done, total: reports.append((done, total)),
    )
    assert reports[-1] == (groups * m, groups * m)
    np.testing.assert_array_equal(
        matmul_batched(config, A, B, c=c, method=method, per_tensor_scale=per_tensor).bits,
        batch.bits,
    )
    params = config.params(config.a_formats[0], config.b_formats[0])
    block = params.block_size
    out_fmt = get_format(params.output_format)
    for g in range(groups):
        one = matmul(
            config,
            A[g],
            B[g],
            c=None if c is None else c[g],
            method=method,
            per_tensor_scale=per_tensor,
        )
        np.testing.assert_array_equal(batch.bits[g], one.bits)
        assert batch.scale_exponents[g] == one.scale_exponent
        np.testing.assert_array_equal(batch.values[g], one.values)
    # the twin on one output per group, from the operands as matmul quantizes them
    for g in range(groups):
        qa = quantize(
            A[g], config.a_formats[0], axis=1, block_size=block, per_tensor_scale=per_tensor
        )
        qb = quantize(
            B[g], config.b_formats[0], axis=0, block_size=block, per_tensor_scale=per_tensor
        )
        i, j = rng.integers(m), rng.integers(n)
        shift = qa.tensor_scale_exponent + qb.tensor_scale_exponent
        c_in = 0.0 if c is None else float(np.ldexp(np.float64(c[g, i, j]), -shift))
        twin = dot_reference(
            params,
            qa.codes[i].tolist(),
            qb.codes[j].tolist(),
            None if per_tensor else qa.scales[i].tolist(),
            None if per_tensor else qb.scales[j].tolist(),
            c_in,
        )
        assert same_float(float(out_fmt.decode(batch.bits[g, i : i + 1, j])[0]), twin), (g, i, j)


@pytest.mark.parametrize("small_groups", [True, False])
@pytest.mark.parametrize("name", ["ocp-exact", "kulisch", "bfp-exact", "mxdotp", "h100-fp8"])
def test_matmul_batched_with_a_kept_b_gives_the_bits_of_calls_without(
    monkeypatch, name, small_groups
):
    """A B kept in ``b_memo`` (its codes; the BLAS route's decoded panels or the window
    route's tiles) gives, for new A's and c's, the bits of calls that decode B anew; the memo
    is filled once, per unit params. Through the small-groups routes (which keep B's codes
    only) and, with their bounds lowered, the per-GEMM routes."""
    if not small_groups:
        monkeypatch.setattr(batch_module, "SMALL_GROUP_OUTPUTS", 0)
        monkeypatch.setattr(batch_module, "WINDOW_GROUP_OUTPUTS", 0)
    config = hw(name)
    per_tensor = config.sections[("inputs", "scales")] == "none"
    fmt, block = config.b_formats[0], config.sections[("inputs", "block_size")]
    rng = np.random.default_rng(5)
    tensors_b = [
        quantize(b, fmt, axis=0, block_size=block, per_tensor_scale=per_tensor)
        for b in rng.standard_normal((2, 70, 6)) * [[[1.0]], [[2.0**-20]]]
    ]
    memo = {}
    for scale in (1.0, 2.0**30, 2.0**-30):
        A = rng.standard_normal((2, 5, 70)) * scale
        c = rng.standard_normal((2, 5, 6)).astype(np.float32)
        kept = matmul_batched(config, A, tensors_b, c=c, per_tensor_scale=per_tensor, b_memo=memo)
        anew = matmul_batched(config, A, tensors_b, c=c, per_tensor_scale=per_tensor)
        np.testing.assert_array_equal(kept.bits, anew.bits)
        assert len(memo) == 1 and "codes" in next(iter(memo.values()))
        assert bool(next(iter(memo.values()))["route"]) is not small_groups


@pytest.mark.parametrize(
    "name, per_tensor", [("b200-fp8", True), ("h100-fp8", True), ("ocp-exact", False)]
)
def test_matmul_batched_reads_a_broadcast_c_as_the_same_c_written_out(name, per_tensor):
    """A c repeated along rows, columns or groups (stride 0: a bias row as replay passes it)
    gives the bits of the same c as a contiguous array, with per-tensor shifts that differ
    from group to group (NaN, Inf and -0 in c); a c whose shift is not exact is refused alike."""
    config = hw(name)
    rng = np.random.default_rng(21)
    A = rng.standard_normal((3, 7, 64)) * np.array([1.0, 2.0**20, 2.0**-9])[:, None, None]
    B = rng.standard_normal((3, 64, 5))
    row = rng.standard_normal(5).astype(np.float32)
    row[:3] = [np.nan, np.inf, -0.0]
    column = rng.standard_normal((7, 1)).astype(np.float32)
    per_group = rng.standard_normal((7, 5)).astype(np.float32)
    for c in (
        np.broadcast_to(row, (3, 7, 5)),
        np.broadcast_to(column, (3, 7, 5)),
        np.broadcast_to(per_group, (3, 7, 5)),
        np.broadcast_to(row, (3, 7, 5))[:, ::2],
    ):
        A_c = A[:, : c.shape[1]]
        got = matmul_batched(config, A_c, B, c=c, per_tensor_scale=per_tensor)
        want = matmul_batched(
            config, A_c, B, c=np.ascontiguousarray(c), per_tensor_scale=per_tensor
        )
        np.testing.assert_array_equal(got.bits, want.bits)
        np.testing.assert_array_equal(got.scale_exponents, want.scale_exponents)
    if per_tensor:  # the smallest subnormal shifted down by 2^20's exponent underflows
        tiny = np.broadcast_to(np.float32(2.0**-149), (3, 7, 5))
        for c in (tiny, np.ascontiguousarray(tiny)):
            with pytest.raises(MxsimError, match="is not exact"):
                matmul_batched(config, A, B, c=c, per_tensor_scale=True)


def test_matmul_batched_with_a_kept_b_of_folded_trees_gives_the_bits_of_calls_without(
    monkeypatch,
):
    """bfp-exact's trees span several blocks, folded onto their least scale: the memo keeps
    B's folded exponents and its panel, decoded into float32 or float64 as the A of the call
    needs (A's rises add to the sums' bits), and the bits stay those of calls without it
    when A's rises change from call to call (uniform rows: float32; rows of blocks many
    binades apart: float64), zeros and c included. (Groups of more outputs than the
    small-groups route takes, its float32 kernel's bound lowered to the others': the memo
    is the BLAS route's.)"""
    monkeypatch.setattr(batch_module, "FLOAT32_GROUP_FACTOR", 1)
    config = hw("bfp-exact")
    fmt, block = config.b_formats[0], config.sections[("inputs", "block_size")]
    rng = np.random.default_rng(8)
    # blocks a binade or two apart: B's rises are small, but not all 0
    B = np.sign(rng.standard_normal((3, 40, 30))) * rng.choice(
        [1.0, 1.5, 2.0, 3.0, 6.0], (3, 40, 30)
    )
    B[1, :, 2] = 0.0
    tensors_b = [quantize(b, fmt, axis=0, block_size=block) for b in B]
    memo = {}
    uniform = np.sign(rng.standard_normal((3, 40, 40)))
    wide = rng.standard_normal((3, 40, 40)) * np.ldexp(1.0, rng.integers(-12, 12, (3, 40, 40)))
    for A in (uniform, wide, uniform, wide * 2.0**40):
        c = rng.standard_normal((3, 40, 30)).astype(np.float32)
        kept = matmul_batched(config, A, tensors_b, c=c, b_memo=memo)
        anew = matmul_batched(config, A, tensors_b, c=c)
        np.testing.assert_array_equal(kept.bits, anew.bits)
        for g in range(3):
            one = matmul(
                config, quantize(A[g], fmt, axis=1, block_size=block), tensors_b[g], c=c[g]
            )
            np.testing.assert_array_equal(kept.bits[g], one.bits)
    (kept_params,) = memo.values()
    assert "folded" in kept_params["route"]


def test_matmul_batched_takes_lists_of_mxtensors_and_empty_batches():
    config = hw("ocp-exact")
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((3, 4, 40)), rng.standard_normal((3, 40, 2))
    tensors_a = [quantize(a, "fp8_e4m3", axis=1) for a in A]
    tensors_b = [quantize(b, "fp8_e4m3", axis=0) for b in B]
    np.testing.assert_array_equal(
        matmul_batched(config, tensors_a, tensors_b).bits, matmul_batched(config, A, B).bits
    )
    empty = matmul_batched(config, np.zeros((0, 4, 40)), np.zeros((0, 40, 2)))
    assert empty.bits.shape == (0, 4, 2) and empty.values.shape == (0, 4, 2)
    assert matmul_batched(config, np.zeros((2, 0, 40)), np.zeros((2, 40, 3))).bits.shape == (
        2,
        0,
        3,
    )


@pytest.mark.parametrize("name", ["ocp-exact", "h100-fp8"])
def test_matmul_batched_takes_mxgroups_as_the_list_of_their_groups(name):
    """An MXGroups operand (one object for all heads) gives the bits of the list of its groups
    and of the float arrays it was quantized from; per-tensor scaled groups keep their own
    exponents."""
    config = hw(name)
    per_tensor = config.sections[("inputs", "scales")] == "none"
    fmt, block = config.a_formats[0], config.sections[("inputs", "block_size")]
    rng = np.random.default_rng(8)
    A = rng.standard_normal((4, 5, 45)) * np.exp2(rng.integers(-8, 8, (4, 1, 1)))
    B = rng.standard_normal((4, 45, 3)) * np.exp2(rng.integers(-8, 8, (4, 1, 1)))
    c = rng.standard_normal((4, 5, 3)).astype(np.float32)
    group_a = quantize_grouped(A, fmt, block, per_tensor_scale=per_tensor)
    rows_b = quantize_grouped(B.transpose(0, 2, 1), fmt, block, per_tensor_scale=per_tensor)
    group_b = dataclasses.replace(rows_b, shape=(45, 3), axis=0)
    if per_tensor:
        assert len(set(group_a.tensor_scale_exponents.tolist())) > 1
    got = matmul_batched(config, group_a, group_b, c=c)
    listed = matmul_batched(config, group_a.tensors(), group_b.tensors(), c=c)
    floats = matmul_batched(config, A, B, c=c, per_tensor_scale=per_tensor)
    for other in (listed, floats):
        np.testing.assert_array_equal(got.bits, other.bits)
        np.testing.assert_array_equal(got.scale_exponents, other.scale_exponents)
    none = quantize_grouped(np.zeros((0, 5, 45)), fmt, block)
    empty = matmul_batched(
        config,
        none,
        dataclasses.replace(
            quantize_grouped(np.zeros((0, 3, 45)), fmt, block), shape=(45, 3), axis=0
        ),
    )
    assert empty.bits.shape == (0, 5, 3)


def _groups(**changes):
    """Two (3, 40) groups of fp8_e4m3 along axis 1 in blocks of 32, with ``changes``."""
    grouped = quantize_grouped(np.ones((2, 3, 40)), "fp8_e4m3")
    return dataclasses.replace(grouped, **changes)


@pytest.mark.parametrize(
    "A, message",
    [
        (_groups(block_size=16), "A: block size 16 differs from the unit's 32"),
        (_groups(axis=0), "A: expected an MXGroups of 2-D groups quantized along axis 1"),
        (_groups(shape=(1, 3, 40)), "A: expected an MXGroups of 2-D groups quantized along axis 1"),
        (_groups(codes=np.ones((2, 3, 64))), "A: codes must be an integer numpy array"),
        (_groups(codes=[[[0] * 64] * 3] * 2), "A: codes must be an integer numpy array"),
        (_groups(scales=np.full((2, 3, 2), 127)), "A: scales must be a uint8 numpy array"),
        (
            _groups(tensor_scale_exponents=np.zeros(2)),
            "A: tensor_scale_exponents must be an integer numpy array",
        ),
        (
            _groups(codes=np.zeros((2, 3, 32), np.uint8)),
            "groups padded by 24 in blocks of 32 needs codes (G, 3, 64) (64 a multiple of 32), "
            "scales (G, 3, 2)",
        ),
        (_groups(codes=np.zeros((6, 64), np.uint8)), "needs codes (G, 3, 64)"),
        (_groups(scales=np.zeros((2, 3, 1), np.uint8)), "needs codes (G, 3, 64)"),
        (_groups(padding=8), "needs codes (G, 3, 48) (48 a multiple of 32)"),
        (_groups(padding=-24), "needs codes (G, 3, 16)"),
        (_groups(padding=56), "needs codes (G, 3, 96)"),
        (_groups(tensor_scale_exponents=np.zeros(3, np.int64)), "tensor_scale_exponents (G,)"),
        (
            _groups(tensor_scale_exponents=np.array([0, 128])),
            "A: tensor_scale_exponents must lie in [-127, 127]",
        ),
        (
            _groups(codes=np.full((2, 3, 64), 256, np.uint16)),
            "A: fp8_e4m3 codes must lie in [0, 256) (field codes, as quantize writes them), "
            "got 256 to 256",
        ),
        (_groups(codes=np.full((2, 3, 64), -1, np.int16)), "A: fp8_e4m3 codes must lie in"),
    ],
)
def test_matmul_batched_refuses_a_bad_mxgroups(A, message):
    B = quantize_grouped(np.ones((2, 5, 40)), "fp8_e4m3")
    B = dataclasses.replace(B, shape=(40, 5), axis=0)
    with pytest.raises(MxsimError) as caught:
        matmul_batched(hw("ocp-exact"), A, B)
    assert message in str(caught.value)
    one = dataclasses.replace(
        B,
        codes=B.codes[:1],
        scales=B.scales[:1],
        tensor_scale_exponents=B.tensor_scale_exponents[:1],
    )
    with pytest.raises(MxsimError, match="matmul_batched: A has 2 groups, B has 1"):
        matmul_batched(hw("ocp-exact"), _groups(), one)
    longer = _groups(  # padded past one block, as BFP operands are: valid, but not B's length
        codes=np.zeros((2, 3, 96), np.uint8), scales=np.full((2, 3, 3), 127, np.uint8), padding=56
    )
    with pytest.raises(MxsimError, match="A and B are padded along K to 96 and 64 elements"):
        matmul_batched(hw("ocp-exact"), longer, B)


@pytest.mark.parametrize(
    "A, B, kwargs, message",
    [
        (
            np.ones((2, 32)),
            np.ones((2, 32, 2)),
            {},
            "A: expected a (G, rows, columns) float array, an MXGroups or a sequence",
        ),
        (
            np.ones((2, 3, 32)),
            5,
            {},
            "B: expected a (G, rows, columns) float array, an MXGroups or a list of MXTensors, got int",
        ),
        ([], np.ones((1, 32, 2)), {}, "A: an empty list of MXTensors"),
        (np.ones((2, 3, 32)), np.ones((3, 32, 2)), {}, "matmul_batched: A has 2 groups, B has 3"),
        (np.ones((2, 3, 32)), np.ones((2, 31, 2)), {}, "matmul_batched: inner dimensions differ"),
        (np.ones((0, 3, 32)), np.ones((1, 32, 2)), {}, "are not (G, M, K) and (G, K, N)"),
        (
            np.ones((2, 3, 32)),
            np.ones((2, 32, 2)),
            {"c": np.ones((2, 3, 2))},
            "c: expected a float32 array",
        ),
        (
            np.ones((2, 3, 32)),
            np.ones((2, 32, 2)),
            {"c": np.ones((1, 3, 2), np.float32)},
            "c: expected shape (2, 3, 2)",
        ),
        (
            np.ones((2, 3, 32)),
            np.ones((2, 32, 2)),
            {"tile_rows": 0},
            "matmul_batched: tile_rows: expected an integer",
        ),
        (
            np.ones((2, 3, 32)),
            np.ones((2, 32, 2)),
            {"method": "blas"},
            "matmul_batched: method: expected one of",
        ),
        (
            np.ones((2, 3, 32)),
            np.ones((2, 32, 2)),
            {"progress": 1},
            "matmul_batched: progress must be None",
        ),
        (
            np.ones((2, 3, 32)),
            np.ones((2, 32, 2)),
            {"b_memo": []},
            "matmul_batched: b_memo must be None or a dict, got list",
        ),
    ],
)
def test_matmul_batched_refuses_bad_arguments(A, B, kwargs, message):
    with pytest.raises(MxsimError) as caught:
        matmul_batched(hw("ocp-exact"), A, B, **kwargs)
    assert message in str(caught.value)


def test_matmul_batched_refuses_groups_that_differ():
    config = hw("ocp-exact")
    a4 = quantize(np.ones((2, 32)), "fp8_e4m3", axis=1)
    a5 = quantize(np.ones((2, 32)), "fp8_e5m2", axis=1)
    b = quantize(np.ones((32, 2)), "fp8_e4m3", axis=0)
    with pytest.raises(
        MxsimError, match=r"A\[1\]: fp8_e5m2 \(2, 32\) along axis 1 differs from A\[0\]'s fp8_e4m3"
    ):
        matmul_batched(config, [a4, a5], [b, b])
    with pytest.raises(MxsimError, match=r"B\[0\]: expected an MXTensor quantized along axis 0"):
        matmul_batched(config, [a4], [a4])


@pytest.mark.parametrize("out_format", ["fp32", "fp16", "bf16"])
def test_as_float_is_the_formats_decode_bit_for_bit(out_format):
    """numpy's widening of fp32/fp16 bits gives decode's values: subnormals, -0, canonical NaN."""
    fmt = get_format(out_format)
    rng = np.random.default_rng(4)
    every = np.arange(1 << 16) if fmt.bits == 16 else rng.integers(0, 1 << 32, 1 << 16)
    corners = (
        [0x7F800001, 0xFFC00000, 0x7F800000, 0x80000001, 0x00000001, 0x80000000]
        if fmt.bits == 32
        else []
    )
    bits = np.concatenate([every, corners]).astype(fmt.code_dtype)
    np.testing.assert_array_equal(
        as_float(bits, out_format).view(np.uint64), fmt.decode(bits).view(np.uint64)
    )
    np.testing.assert_array_equal(as_float(bits.astype(np.int64), out_format), fmt.decode(bits))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_times_power_of_two_rounds_as_ldexp(dtype):
    """Subnormal, underflowing and overflowing results, -0, NaN and Inf included."""
    rng = np.random.default_rng(9)
    info = np.finfo(dtype)
    x = (rng.uniform(-1, 1, 4096) * np.exp2(rng.integers(info.minexp, info.maxexp, 4096))).astype(
        dtype
    )
    x[:6] = [0.0, -0.0, np.nan, np.inf, -np.inf, info.smallest_subnormal]
    for exponent in (-300, -160, -127, -40, -1, 0, 1, 40, 127, 200):
        with np.errstate(over="ignore", under="ignore"):
            np.testing.assert_array_equal(
                times_power_of_two(x, exponent).view(np.uint8), np.ldexp(x, exponent).view(np.uint8)
            )
    exponents = rng.integers(-140, 120, (4096,))
    with np.errstate(over="ignore", under="ignore"):
        np.testing.assert_array_equal(
            times_power_of_two(x, exponents).view(np.uint8), np.ldexp(x, exponents).view(np.uint8)
        )


@pytest.mark.parametrize("out_format", ["fp32", "fp16", "bf16", "fp64"])
def test_as_float_times_power_of_two_is_the_two_steps_bit_for_bit(out_format):
    """The one-pass decode and scale equals ``as_float`` then ``times_power_of_two``: every
    fp16/bf16 code, random fp32/fp64 codes with NaN (signalling too), Inf, -0 and subnormal
    codes, each power from one that leaves nearly every value subnormal or zero to one that
    overflows nearly every value, per group or per element, zero powers and powers that are not
    normal float64s (ldexp's path)."""
    fmt = get_format(out_format)
    rng = np.random.default_rng(12)
    if fmt.bits == 16:
        codes = np.arange(1 << 16)
    else:
        codes = rng.integers(0, 1 << fmt.bits, 1 << 14, dtype=np.uint64)
        corners = [0, 1, (1 << (fmt.bits - 1)) | 1, 1 << (fmt.bits - 1)]  # 0, subnormals, -0
        exponent_ones = ((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits
        corners += [exponent_ones, exponent_ones | 1, exponent_ones | (1 << fmt.mantissa_bits - 1)]
        codes = np.concatenate([codes, np.array(corners, dtype=np.uint64)])
    bits = codes[: codes.size // 64 * 64].astype(fmt.code_dtype).reshape(4, -1, 16)
    scalings = [0, 5, -60, 300, -1100, 1000, 1030, -1080]
    scalings += [np.array(rng.integers(-1074, 1100, (4, 1, 1)))]
    scalings += [np.array([[[0]], [[3]], [[-2]], [[0]]]), rng.integers(-150, 150, bits.shape)]
    scalings += [np.array([3, -2]).reshape(2, 1, 1, 1)]  # a result larger than bits
    for exponents in scalings:
        with np.errstate(over="ignore", under="ignore"):
            want = times_power_of_two(as_float(bits, out_format), exponents)
            got = as_float_times_power_of_two(bits, out_format, exponents)
        assert got.dtype == np.float64 and got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


def test_kernels_see_one_output_dtype_for_every_output_format():
    """fp16/bf16 outputs come from the same compiled kernels as fp32 (bits converted after);
    fp64 outputs alone need 64-bit codes."""
    from mxsim.datapath import _kernels

    unit = hw("h100-fp8")
    codes = get_format("fp8_e4m3").encode(np.tile([1.0, 2.0, 3.0, 0.5], (2, 8)))
    for out_format in ("fp32", "fp16", "bf16"):
        bits = dot(
            unit, codes, codes, a_format="fp8_e4m3", b_format="fp8_e4m3", out_format=out_format
        )
        assert (
            bits.dtype == get_format(out_format).code_dtype
            and (as_float(bits, out_format) == 114.0).all()
        )
        result = matmul(
            hw("ocp-exact"),
            np.ones((2, 32)),
            np.ones((32, 3)),
            out_format=out_format,
            method="kernel",
        )
        assert (
            result.bits.dtype == get_format(out_format).code_dtype and (result.values == 32.0).all()
        )
    assert {str(kernel_output_dtype(name)) for name in ("fp32", "fp16", "bf16")} == {"uint32"}
    assert str(kernel_output_dtype("fp64")) == "uint64"
    out_dtypes = {
        str(signature[-3].dtype)
        for kernel in _kernels.KERNELS.values()
        for signature in kernel.signatures
    }
    assert out_dtypes <= {"uint32", "uint64"}  # (out, then the start and stop rows)


def test_empty_operands():
    unit = hw("ocp-exact")
    out = matmul(unit, np.zeros((0, 64)), np.ones((64, 3)))
    assert out.bits.shape == (0, 3)
    assert matmul(unit, np.ones((2, 64)), np.zeros((64, 0))).bits.shape == (2, 0)
    c = np.array([[1.5, -2.0]], np.float32)
    assert matmul(unit, np.zeros((1, 0)), np.zeros((0, 2)), c=c).values.tolist() == [[1.5, -2.0]]
    codes = np.zeros((3, 0), np.int64)
    bits = dot(
        unit, codes, codes, a_format="fp8_e4m3", b_format="fp8_e4m3", c=np.full(3, 0.25, np.float32)
    )
    assert as_float(bits).tolist() == [0.25] * 3
    assert dot(
        unit,
        np.zeros((0, 8), np.int64),
        np.zeros((0, 8), np.int64),
        a_format="fp8_e4m3",
        b_format="fp8_e4m3",
    ).shape == (0,)
    assert explain(unit, [], [], a_format="fp8_e4m3", b_format="fp8_e4m3", c=3.0)["value"] == 3.0


@pytest.mark.parametrize(
    "a, b, kwargs, message",
    [
        ([1.5, 2], [1, 2], {}, "a: expected an integer numpy array of fp8_e4m3 codes"),
        (["x"], [1], {}, "a: expected an integer numpy array"),
        ([1, 2], [1], {}, "a and b must have the same length, got 2 and 1"),
        ([1, 300], [1, 2], {}, "a: codes must lie in [0, 256)"),
        ([1], [1], {"c": "1"}, "c: expected a real number, got str"),
        ([1], [1], {"scale_a": [127, 127]}, "scale_a: expected shape (1, 1)"),
        ([[1]], [[1]], {}, "a: expected a list or 1-D array of integer codes, got shape (1, 1)"),
    ],
)
def test_explain_refuses_bad_operands(a, b, kwargs, message):
    with pytest.raises(MxsimError) as caught:
        explain(hw("ocp-exact"), a, b, a_format="fp8_e4m3", b_format="fp8_e4m3", **kwargs)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"progress": 3}, "matmul: progress must be None or a callable"),
        ({"tile_rows": 0}, "matmul: tile_rows: expected an integer >= 1, got 0"),
        ({"method": ["auto"]}, "matmul: method: expected one of auto, kernel, got ['auto']"),
        ({"A": 3}, "A: expected a 2-D float array or an MXTensor, got int"),
        ({"B": [["x"]]}, "B: expected numbers"),
    ],
)
def test_matmul_refuses_argument_mix_ups(kwargs, message):
    arguments = {"A": np.ones((2, 32)), "B": np.ones((32, 2)), **kwargs}
    with pytest.raises(MxsimError) as caught:
        matmul(hw("ocp-exact"), **arguments)
    assert message in str(caught.value)


def _tensor(fmt: str, **changes) -> MXTensor:
    """A (4, 64) tensor of ``fmt`` along axis 1 in blocks of 32, with ``changes``."""
    x = np.linspace(-2.0, 2.0, 256).reshape(4, 64)
    return dataclasses.replace(quantize(x, fmt, axis=1, per_tensor_scale=True), **changes)


TF32_BITS = np.ones((4, 64), np.float32).view(np.uint32)  # fp32 patterns, not field codes


@pytest.mark.parametrize(
    "A, message",
    [
        # a kernel would read past its tables: the process could crash
        (_tensor("tf32", codes=TF32_BITS), "A: tf32 codes must lie in [0, 524288)"),
        (
            _tensor("fp4_e2m1", codes=np.full((4, 64), 200, np.uint8)),
            "fp4_e2m1 codes must lie in [0, 16)",
        ),
        (_tensor("fp8_e4m3", codes=np.full((4, 64), -3, np.int64)), "got -3 to -3"),
        (_tensor("fp8_e4m3", codes=np.ones((4, 64))), "A: codes must be an integer numpy array"),
        (_tensor("fp8_e4m3", codes=np.zeros((4, 32), np.uint8)), "needs codes (4, 64)"),
        (_tensor("fp8_e4m3", scales=np.zeros((4, 2))), "and integer scales (4, 2)"),
        (_tensor("fp8_e4m3", scales=np.full((4, 2), 256)), "A: scale codes must lie in [0, 255]"),
        (_tensor("fp8_e4m3", padding=8), "needs codes (4, 72) and integer scales (4, 2) (72 a"),
        (_tensor("fp8_e4m3", axis=2), "A: expected a 2-D MXTensor"),
    ],
)
def test_matmul_refuses_a_bad_mxtensor(A, message):
    B = quantize(np.ones((64, 3)), A.element_format.name, axis=0, per_tensor_scale=True)
    unit = hw("h200-wgmma") if A.element_format.name == "tf32" else hw("ocp-exact")
    with pytest.raises(MxsimError) as caught:
        matmul(unit, A, B)
    assert message in str(caught.value)
    with pytest.raises(MxsimError):  # a list of them for matmul_batched (its own words)
        matmul_batched(unit, [A, A], [B, B])


def test_matmul_output_over_the_memory_budget(monkeypatch):
    monkeypatch.setenv("MXSIM_MAX_BYTES", "100K")
    with pytest.raises(MxsimError, match=r"matmul: the \(M, N\) output needs"):
        matmul(hw("ocp-exact"), np.ones((200, 32)), np.ones((32, 200)))


def test_matmul_gives_the_blas_route_the_stored_codes(monkeypatch):
    # 8-bit codes reach the BLAS route as stored, no widened copy of either operand (the
    # route decodes them a few rows at a time), and its bits are the generic kernel's.
    import mxsim.datapath.api as api

    seen = []
    real = api.blas_matmul

    def spy(params, kernel_args, codes_a, codes_b, *rest):
        seen.append((codes_a, codes_b))
        return real(params, kernel_args, codes_a, codes_b, *rest)

    monkeypatch.setattr(api, "blas_matmul", spy)
    rng = np.random.default_rng(3)
    a = quantize(rng.standard_normal((40, 96)).astype(np.float32), "fp8_e4m3", axis=1)
    b = quantize(rng.standard_normal((96, 24)).astype(np.float32), "fp8_e4m3", axis=0)
    auto = matmul(hw("ocp-exact"), a, b)
    ((codes_a, codes_b),) = seen
    assert codes_a.dtype == codes_b.dtype == np.uint8
    assert np.shares_memory(codes_a, a.codes) and np.shares_memory(codes_b, b.codes)
    kernel = matmul(hw("ocp-exact"), a, b, method="kernel")
    np.testing.assert_array_equal(auto.bits, kernel.bits)


def test_codes_keep_an_unsigned_width_and_kernels_get_theirs():
    from mxsim.datapath.api import _codes, _kernel_codes

    fp8, fp32 = get_format("fp8_e4m3"), get_format("fp32")
    codes = np.array([[0, 0x7E, 0xFE]], dtype=np.uint8)
    kept = _codes(codes, "a", fp8)
    assert kept.dtype == np.uint8 and np.shares_memory(kept, codes)
    widened = _kernel_codes(kept)
    assert widened.dtype == np.uint32 and widened.tolist() == [[0, 126, 254]]
    for dtype in (np.int64, np.int8, np.uint64):  # signed or wider: the kernels' uint32
        assert _codes(codes.astype(dtype) & 0x7E, "a", fp8).dtype == np.uint32
    assert _codes(np.array([[0x3F800000]], np.uint32), "a", fp32).dtype == np.uint32
    with pytest.raises(MxsimError, match="codes must lie in"):
        _codes(np.array([[-1]], np.int8), "a", fp8)


@pytest.mark.parametrize(
    "name, a_format, features",
    [
        ("h100-fp8", "fp8_e4m3", ()),  # an alignment window and an fp32 accumulator only
        ("mxdotp", "fp8_e4m3", ("F_GRID",)),  # grid.fraction_bits: 34
        ("kulisch", "fp8_e4m3", ("F_EXACT",)),  # accumulator.format: exact
        ("a100-dmma", "fp64", ("F_WIDE",)),  # fp64 x fp64: 106-bit products
        ("mi250", "fp16", ("F_PAIRWISE",)),  # structure: pairwise_rounded
        ("b200-tcgen05-mxf4nvf4", "fp4_e2m1", ("F_GROUP_SUM",)),  # scales: group_sum
        ("mi300", "fp16", ("F_SECOND_ALIGNMENT",)),  # second_alignment_bits: 31
        ("mi300", "fp8_e4m3fnuz", ("F_PARITY", "F_SECOND_ALIGNMENT")),  # its fp8 override
    ],
)
def test_kernel_features_name_the_stages_the_config_declares(name, a_format, features):
    """The generic kernel is compiled per feature set: each bit stands for a key of the
    config's YAML (the comments), and no other is set."""
    from mxsim.datapath import _kernels
    from mxsim.datapath.api import _kernel_config

    params = hw(name).params(a_format, a_format, None, None)
    record = _kernel_config(params)[0]
    fmt = get_format(a_format).kernel_params
    expected = sum(getattr(_kernels, feature) for feature in features)
    assert _kernels.kernel_features(record, fmt, fmt) == expected


def test_mixed_code_widths_add_no_kernel_signature():
    """An fp8 operand beside an fp16 one runs in the kernel compiled for two fp16 operands (h100's
    datapath with every pair accepted: the real unit pairs fp16 only with fp16)."""
    from mxsim.datapath import _kernels

    unit = any_pair("h100")
    fp8, fp16 = get_format("fp8_e4m3"), get_format("fp16")
    a8 = fp8.encode(np.tile([1.0, 2.0, 3.0, 0.5], (2, 8)))
    a16 = fp16.encode(np.tile([1.0, 2.0, 3.0, 0.5], (2, 8)))
    same = dot(unit, a16, a16, a_format="fp16", b_format="fp16", method="kernel")
    signatures = [s for kernel in _kernels.KERNELS.values() for s in kernel.signatures]
    pairs = {tuple(str(s[i].dtype) for i in (0, 1)) for s in signatures}
    mixed = dot(unit, a8, a16, a_format="fp8_e4m3", b_format="fp16", method="kernel")
    np.testing.assert_array_equal(mixed, same)
    signatures = [s for kernel in _kernels.KERNELS.values() for s in kernel.signatures]
    assert {tuple(str(s[i].dtype) for i in (0, 1)) for s in signatures} == pairs
    assert all(a == b for a, b in pairs)


# --- elements wider than 16 bits: decoded by the kernel from their bit fields ---------------------


@pytest.mark.parametrize("config", ["kulisch", "h100"])
def test_fp32_elements_decode_directly(config):
    # fp32 operands would need a 2^32-entry table of every code; the kernel decodes each code's
    # bit fields. Exact products (48 bits) and the twin decide every output; the Kulisch unit
    # is also the exactly rounded sum, computed here in Fractions.
    fp32 = get_format("fp32")
    hw = load_hwconfig(REPO / "hwconfigs" / f"{config}.yaml")
    params = dataclasses.replace(
        hw.params(hw.a_formats[0], hw.b_formats[0], "fp32"),
        a_format="fp32",
        b_format="fp32",
        scales="none",
    )
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((40, 48)) * np.exp2(rng.integers(-60, 60, (40, 48)))).astype(
        np.float32
    )
    y = (rng.standard_normal((40, 48)) * np.exp2(rng.integers(-60, 60, (40, 48)))).astype(
        np.float32
    )
    x[0, :3] = [0.0, -0.0, np.float32(2.0**-149)]  # zeros and a subnormal element
    a, b = fp32.encode(x), fp32.encode(y)
    out = dot_with_params(params, a, b)
    for i in range(len(out)):
        value = dot_reference(params, a[i].tolist(), b[i].tolist())
        assert int(out[i]) == int(fp32.encode(np.array([value]), overflow="inf_nan")[0]), i
        if config == "kulisch":
            exact = sum(
                (Fraction(float(p)) * Fraction(float(q)) for p, q in zip(x[i], y[i])), Fraction(0)
            )
            assert out[i] == encode_reference(fp32, exact, "nearest_even", "inf_nan"), i


WIDE_B_FORMATS = ["fp64", "fp32", "bf16", "fp8_e4m3", "int8"]


@st.composite
def wide_params(draw, zero_signs=("ieee", "positive", "ieee_steps")) -> DatapathParams:
    """Exact-tree units (what fp64 products allow) over fp64 A and any B, fp64 c."""
    fused = draw(st.sampled_from([1, 2, 3, 4, 8]))
    scales = draw(st.sampled_from(["none", "products", "block_sum"]))
    acc_format = draw(st.sampled_from(["fp64", "fp32", "fp16", "exact"]))
    promotion = None
    if acc_format != "exact" and draw(st.booleans()):
        promotion = fused * draw(st.integers(1, 3))
    order = None
    if draw(st.booleans()):
        order = tuple(draw(st.permutations(list(range(fused * draw(st.integers(1, 2)))))))
    params = dataclasses.replace(  # fp64 A and c: two kernel signatures (fp64 or narrow outputs)
        hw("a100-dmma").params("fp64", "fp64"),
        b_format=draw(st.sampled_from(WIDE_B_FORMATS)),
        scales=scales,
        block_size=fused * draw(st.integers(1, 3)),
        input_subnormals=draw(st.booleans()),
        fused_terms=fused,
        term_order=order,
        trees_in_blocks=order is None and promotion is None and draw(st.booleans()),
        accumulator_in_tree=scales != "block_sum" and draw(st.booleans()),
        accumulator_format=acc_format,
        accumulator_rounding=draw(st.sampled_from(ROUNDINGS)),
        accumulator_subnormals=draw(st.booleans()),
        promotion_interval=promotion,
        c_entry="initial" if promotion else draw(st.sampled_from(["initial", "end"])),
        accumulator_overflow=draw(st.sampled_from(["ieee", "infinity"])),
        output_format=draw(st.sampled_from(["fp64", "fp32", "bf16"])),
        output_rounding=draw(st.sampled_from(ROUNDINGS)),
        output_subnormals=draw(st.booleans()),
        output_zero_sign=draw(st.sampled_from(zero_signs)),
    )
    if params.output_zero_sign == "ieee_steps":  # what it needs (see check_consistency)
        params = dataclasses.replace(
            params,
            promotion_interval=None,
            c_entry="initial",
            **{
                field: "nearest_even"
                for field in ("accumulator_rounding", "output_rounding")
                if getattr(params, field) == "toward_negative"
            },
        )
    try:
        check_consistency(params, "random")
    except ConfigError:
        assume(False)
    return params


def wide_operand(rng, fmt_name: str, rows: int, length: int, corners: bool) -> np.ndarray:
    """Codes of normal values over a wide range of magnitudes (clipped to the format), or
    uniformly random codes (every exponent, subnormals, Inf and NaN) for corner rows."""
    fmt = get_format(fmt_name)
    if corners:
        return rng.integers(0, 1 << fmt.bits, (rows, length), dtype=np.uint64).astype(
            fmt.code_dtype
        )
    magnitude = np.exp2(rng.integers(-40, 41, size=(rows, 1)).astype(np.float64))
    return fmt.encode(
        np.clip(rng.standard_normal((rows, length)) * magnitude, -fmt.max_finite, fmt.max_finite)
    )


@settings(max_examples=60)
@given(params=wide_params(), seed=st.integers(0, 2**32 - 1), length=st.integers(0, 40))
def test_wide_elements_kernel_equals_reference(params, seed, length):
    # fp64 products (106 bits, 2^-2148 .. 2^2048) go exactly into the limbs; the Fraction twin
    # decides every output, on mostly realistic rows and a minority of uniformly random codes.
    rng = np.random.default_rng(seed)
    corners = rng.random() < CORNER_SHARE
    event("inputs: " + ("corners" if corners else "realistic"))
    rows = 3
    a = wide_operand(rng, params.a_format, rows, length, corners)
    b = wide_operand(rng, params.b_format, rows, length, corners)
    blocks = -(-length // params.block_size)
    scale_a, scale_b = (rng.integers(120, 135, (rows, blocks)).astype(np.uint8) for _ in range(2))
    if params.scales == "none":
        scale_a = scale_b = None
    elif corners:
        scale_a[0, :1] = 0xFF  # a NaN block
    c = rng.standard_normal(rows) * np.exp2(rng.integers(-40, 41, rows))
    if corners:
        c[:2] = rng.choice([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-310], 2)
    assert_kernel_matches_reference(params, a, b, scale_a, scale_b, c_of_format(c, params.c_format))


# --- output.zero_sign: ieee_steps (a chain of IEEE FMAs) -------------------------------------------

FP64_TINY = 2.0**-1074  # times 1/8 it underflows to a zero of its sign under nearest even
# (a, b, c, result under ieee_steps, result under ieee), one product per FMA step, worked by
# hand from IEEE 754: an exact zero sum is -0 only when every addend is -0, and a value that
# rounds to zero keeps its sign.
ZERO_CHAIN_CORNERS = [
    (
        [-FP64_TINY, -0.0, 0.0, -0.0],
        [0.125, 1.0, -1.0, 1.0],
        0.0,
        -0.0,
        0.0,
    ),  # -0 after an underflow stays
    ([-0.0] * 4, [1.0] * 4, -0.0, -0.0, -0.0),  # every addend -0
    (
        [1.0, -1.0, -0.0, -0.0],
        [1.0] * 4,
        -0.0,
        0.0,
        0.0,
    ),  # a cancellation gives +0, -0 products keep it
    ([1.0, -0.0, -0.0, -0.0], [-1.0, 1.0, 1.0, 1.0], 1.0, 0.0, 0.0),  # c cancelled
    (
        [-FP64_TINY, -0.0, 0.0, 0.0],
        [0.125, 1.0, 1.0, 1.0],
        0.0,
        0.0,
        0.0,
    ),  # a +0 product ends the -0
    (
        [0.0, 0.0, 0.0, -FP64_TINY],
        [1.0, 1.0, 1.0, 0.125],
        0.0,
        -0.0,
        -0.0,
    ),  # the last step underflows
    ([FP64_TINY, -0.0, -0.0, -0.0], [-0.125, 1.0, 1.0, 1.0], -0.0, -0.0, 0.0),
    (
        [FP64_TINY, -0.0, -0.0, -0.0],
        [0.125, 1.0, 1.0, 1.0],
        -0.0,
        0.0,
        0.0,
    ),  # +2^-1077 underflows to +0
]


@pytest.mark.parametrize("a, b, c, steps, ieee", ZERO_CHAIN_CORNERS)
def test_ieee_steps_zero_signs_on_an_fma_chain(a, b, c, steps, ieee):
    fp64 = get_format("fp64")
    a_codes, b_codes = fp64.encode(np.array([a])), fp64.encode(np.array([b]))
    for zero_sign, want in (("ieee_steps", steps), ("ieee", ieee)):
        params = dataclasses.replace(
            hw("a100-dmma").params("fp64", "fp64"), output_zero_sign=zero_sign
        )
        got = as_float(dot_with_params(params, a_codes, b_codes, c=np.array([c])), "fp64")[0]
        twin = dot_reference(params, a_codes[0].tolist(), b_codes[0].tolist(), c=c)
        for value in (got, twin):
            assert value == want and math.copysign(1.0, value) == math.copysign(1.0, want), (
                zero_sign,
                value,
            )


@pytest.mark.parametrize(
    "zero_sign, want", [("ieee_steps", -0.0), ("ieee", -0.0), ("exact_positive", 0.0)]
)
def test_an_exact_accumulator_is_one_step(zero_sign, want):
    fp64 = get_format("fp64")
    params = dataclasses.replace(
        hw("a100-dmma").params("fp64", "fp64"),
        accumulator_format="exact",
        output_zero_sign=zero_sign,
    )
    a, b = fp64.encode(np.array([[-0.0, 0.0, -0.0]])), fp64.encode(np.array([[1.0, -2.0, 0.0]]))
    got = as_float(dot_with_params(params, a, b, c=np.array([-0.0])), "fp64")[0]
    twin = dot_reference(params, a[0].tolist(), b[0].tolist(), c=-0.0)
    assert [math.copysign(1.0, v) for v in (got, twin)] == [
        math.copysign(1.0, want)
    ] * 2 and got == twin == 0


def test_ieee_steps_refuses_the_steps_it_does_not_sign():
    params = dataclasses.replace(
        hw("a100-dmma").params("fp64", "fp64"), output_zero_sign="ieee_steps"
    )
    check_consistency(params, "ok")
    for changes, path in (
        ({"accumulator_rounding": "toward_negative"}, "accumulator.rounding"),
        ({"accumulator_format": "exact", "output_rounding": "toward_negative"}, "output.rounding"),
        ({"c_entry": "end"}, "accumulator.c_entry"),
        ({"promotion_interval": 4, "fused_terms": 4}, "accumulator.promotion_interval"),
    ):
        with pytest.raises(ConfigError, match=re.escape(path) + ".*ieee_steps needs"):
            check_consistency(dataclasses.replace(params, **changes), "unit.yaml")


@settings(max_examples=40)
@given(
    params=wide_params(zero_signs=("ieee_steps",)),
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(1, 12),
)
def test_ieee_steps_kernel_equals_reference_near_zero(params, seed, length):
    # Operands made to meet exact zeros: underflowing products of both signs, signed zeros,
    # cancelling pairs; the Fraction twin decides every output.
    rng = np.random.default_rng(seed)
    a_values = rng.choice(
        [0.0, -0.0, FP64_TINY, -FP64_TINY, 2.0**-1000, -(2.0**-1000), 1.0, -1.0], (3, length)
    )
    b_values = rng.choice([0.0, -0.0, 0.125, -0.125, 1.0, -1.0], (3, length))
    a = get_format(params.a_format).encode(a_values)
    b = get_format(params.b_format).encode(b_values)
    blocks = -(-length // params.block_size)
    scale_a = scale_b = None if params.scales == "none" else np.full((3, blocks), 127, np.uint8)
    c = rng.choice([0.0, -0.0, FP64_TINY, -FP64_TINY, 1.0, -1.0], 3)
    assert_kernel_matches_reference(params, a, b, scale_a, scale_b, c_of_format(c, params.c_format))


def test_fp64_kulisch_is_the_exactly_rounded_sum():
    # An exact accumulator over fp64 products is the exact sum rounded once, whatever the
    # magnitudes: products from 2^-2148 to 2^2046 and exact cancellation, checked in Fractions.
    params = dataclasses.replace(
        hw("a100-dmma").params("fp64", "fp64"), accumulator_format="exact", fused_terms=4
    )
    rng = np.random.default_rng(11)
    x = rng.standard_normal((50, 12)) * np.exp2(rng.integers(-1070, 1020, (50, 12)))
    y = rng.standard_normal((50, 12)) * np.exp2(rng.integers(-1070, 1020, (50, 12)))
    x[1, 6:], y[1, 6:] = x[1, :6], -y[1, :6]  # the sum cancels exactly
    x[2, :2], y[2, :2] = [5e-324, 2.0**1023], [5e-324, 1.5]  # the smallest and a large product
    out = dot_with_params(params, x.view(np.uint64), y.view(np.uint64))
    fp64 = get_format("fp64")
    for i in range(50):
        exact = sum((Fraction(p) * Fraction(q) for p, q in zip(x[i], y[i])), Fraction(0))
        assert int(out[i]) == encode_reference(fp64, exact, "nearest_even", "inf_nan"), i
    assert out[1] == 0


@pytest.mark.parametrize(
    "path, value",
    [
        ("adder.align_fraction_bits", 40),
        ("adder.sum_significant_bits", 40),
        ("multiplier.product_fraction_bits", 52),
    ],
)
def test_fp64_products_refuse_what_would_cut_them(tmp_path, path, value):
    section, key = path.split(".")
    text = (REPO / "hwconfigs" / "a100-dmma.yaml").read_text()
    if f"\n{section}:\n" in text:
        text = text.replace(f"\n{section}:\n", f"\n{section}:\n  {key}: {value}\n", 1)
    else:
        text += f"{section}:\n  {key}: {value}\n"
    config = tmp_path / "cut.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=rf"{path}: .*106 bits.*exact trees"):
        load_hwconfig(config)
    params = dataclasses.replace(
        hw("a100-dmma").params("fp64", "fp64"), **{key: value}
    )  # the field is the key
    codes = get_format("fp64").encode(np.ones((1, 4)))
    with pytest.raises(
        ConfigError, match=rf"<params>: {path}: .*106 bits"
    ):  # resolved params: refused as well
        dot_with_params(params, codes, codes)


@pytest.mark.parametrize(
    "c, c_format, message",
    [
        (np.ones(2, np.float16), None, "expected a float32 or float64 array of fp64 values"),
        (np.ones(2, np.int64), None, "got dtype int64"),
        (np.full(2, 1 + 2.0**-20, np.float32), "bf16", "every value must be a bf16 value"),
        (np.ones(2, np.float32), "fp8_e4m3", "format of c 'fp8_e4m3' is not one of"),
        (np.ones(2, np.float32), "fp99", "unknown format"),
    ],
)
def test_c_format_refuses_what_it_cannot_hold(c, c_format, message):
    codes = get_format("fp64").encode(np.ones((2, 4)))
    with pytest.raises(MxsimError, match=message):
        dot(hw("a100-dmma"), codes, codes, a_format="fp64", b_format="fp64", c=c, c_format=c_format)


def test_c_format_accepts_its_values_in_float32_or_its_own_dtype():
    codes = get_format("fp64").encode(np.array([[1.0, 2.0**-60, 3.0, -1.0]]))
    ones = get_format("fp64").encode(np.array([[1.0, 1.0, 1 / 3, 1.0]]))
    got = [
        dot(hw("a100-dmma"), codes, ones, a_format="fp64", b_format="fp64", c=c)
        for c in (np.array([0.5]), np.array([0.5], np.float32))
    ]
    # the FMA chain: 0.5 + 1 = 1.5; + 2^-60 rounds back to 1.5; + 3 * RN(1/3) = 2.5 exactly; - 1
    assert [as_float(bits, "fp64").tolist() for bits in got] == [[1.5], [1.5]]
    fp16 = get_format("fp16")
    a = fp16.encode(np.ones((1, 4)))
    with pytest.raises(MxsimError, match="every value must be a fp16 value"):
        dot(
            hw("v100"),
            a,
            a,
            a_format="fp16",
            b_format="fp16",
            c=np.array([1 + 2.0**-12], np.float32),
            c_format="fp16",
        )
    assert (
        as_float(
            dot(
                hw("v100"),
                a,
                a,
                a_format="fp16",
                b_format="fp16",
                c=np.array([0.25], np.float16),
                c_format="fp16",
            )
        )[0]
        == 4.25
    )


def test_fp64_explain_agrees_with_dot():
    rng = np.random.default_rng(3)
    fp64 = get_format("fp64")
    a, b = (
        fp64.encode(rng.standard_normal((4, 8))),
        fp64.encode(rng.standard_normal((4, 8)) * 1e-300),
    )
    c = rng.standard_normal(4) * 1e-300
    bits = dot(hw("h100-dmma"), a, b, a_format="fp64", b_format="fp64", c=c)
    assert bits.dtype == np.uint64
    for m in range(4):
        told = explain(hw("h100-dmma"), a[m], b[m], a_format="fp64", b_format="fp64", c=float(c[m]))
        assert (
            told["bits"] == bits[m]
            and [s["stage"] for s in told["stages"]].count("accumulate") == 8
        )
    one = fp64.encode(np.ones(2))
    assert (
        explain(hw("h100-dmma"), one, one, a_format="fp64", b_format="fp64", c=-(10**400))["value"]
        == -math.inf
    )
    for c_format, value in (
        ("fp16", 2.0**-24),
        ("fp32", 3 * 2.0**-26),
    ):  # c rounds into its format first
        assert (
            explain(
                hw("v100"),
                [0],
                [0],
                a_format="fp16",
                b_format="fp16",
                c=3 * 2.0**-26,
                c_format=c_format,
            )["value"]
            == value
        )


# --- NVFP4 GEMMs ----------------------------------------------------------------------------------


def test_nvfp4_matmul_rows_are_the_units_dot_products_and_values_carry_the_tensor_scales():
    from mxsim.quantize.nvfp4 import quantize_nvfp4, tensor_scale_from_amax

    rng = np.random.default_rng(19)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    w = rng.standard_normal((5, 96)).astype(np.float32)  # B^T, as NVFP4 weights are stored
    A = quantize_nvfp4(x, tensor_scale_from_amax(np.abs(x).max()))
    B = quantize_nvfp4(w, tensor_scale_from_amax(np.abs(w).max()))
    unit = hw("b200-nvfp4")
    result = matmul(unit, A, B, tile_rows=4)
    for m in range(6):
        bits = dot(
            unit,
            np.repeat(A.codes[m : m + 1], 5, 0),
            B.codes,
            a_format="fp4_e2m1",
            b_format="fp4_e2m1",
            scale_a=np.repeat(A.scales[m : m + 1], 5, 0),
            scale_b=B.scales,
        )
        assert np.array_equal(bits, result.bits[m])
    assert result.tensor_scale == A.tensor_scale * B.tensor_scale
    np.testing.assert_array_equal(
        result.values, as_float(result.bits) * (A.tensor_scale * B.tensor_scale)
    )
    exact = A.exact_values() @ B.exact_values().T
    assert (
        np.abs(result.values - exact).max() <= 2.0**-20 * np.abs(exact).max()
    )  # truncation to fp32 per k64


def test_nvfp4_matmul_refuses_mismatched_operands():
    from mxsim.quantize.nvfp4 import quantize_nvfp4

    A = quantize_nvfp4(np.ones((2, 32), np.float32))
    cases = [
        (lambda: matmul(hw("b200-nvfp4"), A, np.ones((32, 2))), "both must be 2-D NVFP4Tensors"),
        (
            lambda: matmul(hw("b200-nvfp4"), A, quantize_nvfp4(np.ones((2, 48), np.float32))),
            "inner dimensions",
        ),
        (lambda: matmul(hw("b200-tcgen05-mxf4"), A, A), "ue4m3 scales per 16 differ"),
        (
            lambda: matmul(
                hw("b200-nvfp4"),
                quantize_nvfp4(np.ones((2, 32), np.float32), 1.0),
                A,
                c=np.zeros((2, 2), np.float32),
            ),
            "c with NVFP4 tensor scales",
        ),
        (
            lambda: matmul(hw("b200-nvfp4"), np.ones((2, 32)), np.ones((32, 2))),
            "give NVFP4Tensor operands",
        ),
    ]
    for call, message in cases:
        with pytest.raises(MxsimError, match=message):
            call()


def unchanged_operands(name: str, fmt_name: str, shape, rng):
    """(A, B, c) of a (G, M, K) x (G, K, N) batch for the shipped unit ``name``: realistic
    values quantized as the unit takes them (bfp-exact: MX9 blocks; a unit without scales:
    one scale per tensor), and a c of normal values beside -0, ±Inf, NaN and subnormals."""
    groups, m, k, n = shape
    x = rng.standard_normal((groups, m, k)) * np.exp2(rng.integers(-6, 7, (groups, m, 1)))
    w = rng.standard_normal((groups, n, k))
    config = hw(name)
    if name == "bfp-exact":
        a, b = (
            MXGroups.of(
                [quantize_bfp(v.astype(np.float32), fmt_name, axis=1).as_mx_tensor() for v in x]
            ),
            MXGroups.of(
                [quantize_bfp(v.T.astype(np.float32), fmt_name, axis=0).as_mx_tensor() for v in w]
            ),
        )
    else:
        per_tensor = config.sections[("inputs", "scales")] == "none"
        a = quantize_grouped(x, fmt_name, 32, per_tensor_scale=per_tensor)
        rows = quantize_grouped(w, fmt_name, 32, per_tensor_scale=per_tensor)
        b = dataclasses.replace(rows, shape=(k, n), axis=0)
    c = rng.standard_normal((groups, m, n)).astype(np.float32)
    c.reshape(-1)[: 5 * 7 : 7] = [-0.0, np.inf, -np.inf, np.nan, 1e-40]
    return config, a, b, c


@pytest.mark.parametrize(
    "name, fmt_name",
    [
        ("ocp-exact", "fp8_e4m3"),
        ("kulisch", "fp6_e3m2"),
        ("bfp-exact", "MX9"),
        ("mxdotp-paper", "fp8_e4m3"),
        ("mxdotp", "fp4_e2m1"),
        ("h100-fp8", "fp8_e4m3"),
        ("b200-fp8", "fp8_e5m2"),
        ("h100", "fp16"),
    ],
)
@pytest.mark.parametrize("shape", [(3, 14, 14, 32), (2, 40, 70, 48), (2, 136, 64, 144)])
def test_entry_points_leave_their_inputs_and_kept_b_unchanged(name, fmt_name, shape):
    """``matmul_batched`` (with a ``b_memo``, called twice), ``matmul`` (MX operands, and
    float operands it quantizes) and ``dot`` on a MiniLM-like batch (the small-groups
    routes) and one of 40 x 48 outputs per group with K padded (the BLAS and window
    routes) leave every byte of their operands, scales and c as they were, and the kept B
    of the memo as the first call left it; the second call's bits are the first's, and the
    generic kernel's."""
    rng = np.random.default_rng(41)
    config, a, b, c = unchanged_operands(name, fmt_name, shape, rng)
    inputs = byte_copies([a, b, c])
    memo: dict = {}
    first = matmul_batched(config, a, b, c=c, b_memo=memo)
    kept = byte_copies(memo)
    assert kept and byte_copies([a, b, c]) == inputs
    again = matmul_batched(config, a, b, c=c, b_memo=memo)
    assert byte_copies(memo) == kept and byte_copies([a, b, c]) == inputs
    np.testing.assert_array_equal(again.bits, first.bits)
    want = matmul_batched(config, a, b, c=c, method="kernel")
    np.testing.assert_array_equal(first.bits, want.bits)
    assert byte_copies([a, b, c]) == inputs
    single_a, single_b = a.group(0), b.group(0)
    singles = byte_copies([single_a, single_b])
    got = matmul(config, single_a, single_b, c=c[0])
    np.testing.assert_array_equal(got.bits, first.bits[0])
    assert byte_copies([single_a, single_b]) == singles and byte_copies([a, b, c]) == inputs
    if name != "bfp-exact":  # (matmul quantizes float operands to MX or per tensor)
        x = rng.standard_normal((shape[1], shape[2])).astype(np.float32)
        w = rng.standard_normal((shape[2], shape[3]))
        floats = byte_copies([x, w])
        per_tensor = config.sections[("inputs", "scales")] == "none"
        matmul(
            config, x, w, a_format=fmt_name, b_format=fmt_name, c=c[0], per_tensor_scale=per_tensor
        )
        assert byte_copies([x, w]) == floats and byte_copies([a, b, c]) == inputs
    scaled = config.sections[("inputs", "scales")] != "none"
    codes_a, codes_b = a.codes[0], b.codes[0]
    scale_a, scale_b = (a.scales[0], b.scales[0]) if scaled else (None, None)
    row_c = c[0, :, 0].copy()
    row_c[:3] = [-0.0, np.nan, 2.0**-140]
    dot_inputs = byte_copies([codes_a, codes_b, scale_a, scale_b, row_c])
    rows = min(codes_a.shape[0], codes_b.shape[0])
    dot_args = (codes_a[:rows], codes_b[:rows])
    dot(
        config,
        *dot_args,
        a_format=a.element_format.name,
        b_format=b.element_format.name,
        scale_a=None if scale_a is None else scale_a[:rows],
        scale_b=None if scale_b is None else scale_b[:rows],
        c=row_c[:rows],
    )
    assert byte_copies([codes_a, codes_b, scale_a, scale_b, row_c]) == dot_inputs
    assert byte_copies([a, b, c]) == inputs


@pytest.mark.parametrize("path", sorted((REPO / "hwconfigs").glob("*.yaml")), ids=lambda p: p.stem)
def test_kept_kernel_arguments_are_read_only(path):
    """Every array of the generic kernel's arguments, kept per params (element and scale
    tables, record, term order, the formats' parameters), refuses an in-place write."""
    config = load_hwconfig(path)
    arrays = arrays_in(
        list(_kernel_arguments(config.params(config.a_formats[0], config.b_formats[0]))[2])
    )
    assert len(arrays) == 14
    assert not [a for a in arrays if a.flags.writeable]
