"""The datapath schema: every key of a hardware config's dot-product unit, declared once.

Each :class:`Key` of :data:`SCHEMA` states what the YAML accepts (type, default, accepted
values), what the key means, the :class:`DatapathParams` field that carries it, how the
kernel's parameter record holds it (:class:`Record`), and which of its values each fast route
computes bit for bit (``blas``: the float64-BLAS route of ``blas.py``; ``window``: the
vectorised route of ``window.py``; ``groups``: the group-sum route of ``groups.py``). Everything else is derived from this one table: the
loader's checks (``config.py``), :class:`DatapathParams`, the kernel record's dtype
(:func:`record_dtype`), the routes' eligibility (:func:`route_accepts`) and the key tables
of docs/hwconfig.md (:func:`schema_markdown`).

A key that declares nothing for a route makes that route refuse every unit, so a new key
reaches the generic kernel (and its reference twin) until someone shows that a route
computes it exactly: no route can silently ignore a key.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from ..formats import format_names, get_format
from ..formats.rounding import ROUNDING_MODES, overflow_code, rounding_code
from ..limits import MAX_BLOCK_SIZE

ELEMENT_FORMATS = format_names("element", "bfp_element", "tensor_input", "wide")
SCALE_FORMATS = format_names("scale")
WIDE_FORMATS = format_names("wide")
#: Wide formats whose values are float32 values: what the fast routes (uint32 outputs, float32 c) hold.
FLOAT32_FORMATS = tuple(name for name in WIDE_FORMATS if get_format(name).bits <= 32)
DIRECTED_AND_NEAREST = tuple(m for m in ROUNDING_MODES if m != "stochastic")
REQUIRED = object()
#: The kernel record's ``zero_term_exponent`` for null: below every exponent, so zero terms never set R.
NO_ZERO_TERM_EXPONENT = -(1 << 40)
#: The kernel record's ``special_accumulator_exponent`` for null: a NaN/Inf accumulator is never dropped.
NO_SPECIAL_ACCUMULATOR_EXPONENT = -(1 << 40)
#: The kernel record's ``product_overflow_exponent`` for null: above every product's exponent.
NO_PRODUCT_OVERFLOW = 1 << 40
#: ``accumulator.overflow`` values and the formats' overflow policy each one rounds with.
ACCUMULATOR_OVERFLOW = {"ieee": "inf_nan", "infinity": "inf"}
ROUTES = ("blas", "window", "groups", "fma", "fp32_steps")

#: A route's declaration for a key: ``accepts(value, params)`` is true when the route computes
#: the unit bit for bit with this value of the key (given the unit's other values).
Accepts = Callable[[Any, Any], bool]


def any_value(value, params) -> bool:
    """Declaration of a key whose every value a route computes exactly (or never reads)."""
    return True


def only(*accepted) -> Accepts:
    """Declaration of a key that a route computes exactly for these values alone."""
    return lambda value, params: value in accepted


def window_product_overflow(value, params) -> bool:
    """The window route's declaration of ``multiplier.overflow_exponent``: none, or a unit
    without block scales, whose products the route bounds (``datapath.window``: by the
    formats' largest values, or per call by a wide format's operands' largest exponents)."""
    return value is None or params.scales == "none"


def window_second_alignment(value, params) -> bool:
    """The window route's declaration of ``adder.second_alignment_bits``: none, or a second
    alignment after each tree (the accumulator outside the tree, no n-bit sum, c entering
    first, no promotion) at most 51 bits wide (its register is a float64)."""
    return value is None or (
        not params.accumulator_in_tree
        and params.sum_significant_bits is None
        and params.c_entry == "initial"
        and params.promotion_interval is None
        and value + 2 <= 53
    )


@dataclass(frozen=True)
class Record:
    """How the kernel's parameter record holds a key: ``encode(value)`` as ``dtype`` in the
    field ``name`` (empty: the key's :class:`DatapathParams` field)."""

    encode: Callable[[Any], Any]
    dtype: type = np.int64
    name: str = ""


BY_KIND: Any = object()  # a key's record field follows from its kind (see _record_of)


@dataclass(frozen=True)
class Key:
    """One config key. ``kind``: "int", "optional_int" (null allowed), "bool", "str" (one of
    ``choices``), "order" (null or a permutation), "format" (one of ``choices``),
    "format_list" or "format_groups" (null or a list of format lists). ``default`` is
    :data:`REQUIRED` if the key has none. ``field`` names its :class:`DatapathParams` field (empty: the key's name; None: the key has none — the
    accepted formats, of which the params hold the chosen one). ``record`` says how the
    kernel record holds it (None: the kernel gets it otherwise, e.g. as element tables or
    format parameters). ``blas``/``window``/``groups``/``fma``/``fp32_steps`` are the routes'
    declarations (None: the route refuses)."""

    kind: str
    default: Any
    meaning: str
    choices: tuple = ()
    minimum: int | None = None
    maximum: int | None = None
    field: str | None = ""
    record: Record | None = BY_KIND
    blas: Accepts | None = None
    window: Accepts | None = None
    groups: Accepts | None = None
    fma: Accepts | None = None
    fp32_steps: Accepts | None = None


def _exact_accumulator_or(accepts: Accepts) -> Accepts:
    """BLAS route: a key of the rounding accumulator that an exact (Kulisch) one never reads."""
    return lambda value, params: params.accumulator_format == "exact" or accepts(value, params)


def _trees_inside_blocks(value, params) -> bool:
    return value == "none" or params.block_size % params.fused_terms == 0


def _trees_inside_or_of_whole_blocks(value, params) -> bool:
    return _trees_inside_blocks(value, params) or params.fused_terms % params.block_size == 0


def _pairwise_or(accepts: Accepts) -> Accepts:
    """fp32-steps route: a key a pairwise_rounded adder never reads, which the route takes
    for exact trees where ``accepts``."""
    return lambda value, params: params.structure == "pairwise_rounded" or accepts(value, params)


def _window_parity(value, params) -> bool:
    """The window route's declaration of ``adder.parity_windows``: false, or a unit whose
    trees have an even number of terms and take them in k order (the route reorders each
    tree's positions even ones first: ``datapath.window.tree_order``)."""
    return not value or (params.term_order is None and params.fused_terms % 2 == 0)


def _same_trees_as_k_order(value, params) -> bool:
    return not value or params.block_size % params.fused_terms == 0


SCHEMA: dict[str, dict[str, Key]] = {
    "inputs": {
        "a_formats": Key(
            "format_list",
            REQUIRED,
            "element formats accepted for operand A",
            ELEMENT_FORMATS,
            field=None,
            record=None,
            blas=any_value,
            window=any_value,
            groups=any_value,
            fma=any_value,
            fp32_steps=any_value,  # fp32_steps.fp32_steps_apply checks the formats
        ),  # routes check the formats
        "b_formats": Key(
            "format_list",
            REQUIRED,
            "element formats accepted for operand B",
            ELEMENT_FORMATS,
            field=None,
            record=None,
            blas=any_value,
            window=any_value,
            groups=any_value,
            fma=any_value,
            fp32_steps=any_value,
        ),
        "format_groups": Key(
            "format_groups",
            None,
            "null: every A format with every B format. A list of format lists: an (A, B) pair is accepted "
            "only when one list holds both (an instruction's formats that may mix, e.g. [[fp16], [bf16], "
            "[fp8_e4m3, fp8_e5m2]]); formats the unit does not take may be listed (a narrower view "
            "extending the config keeps its groups), each it takes must be in a list",
            ELEMENT_FORMATS,
            field=None,
            record=None,
            blas=any_value,
            window=any_value,
            groups=any_value,
            fma=any_value,
            fp32_steps=any_value,
        ),
        "block_size": Key(
            "int",
            32,
            "k: elements sharing one E8M0 scale",
            minimum=1,
            maximum=MAX_BLOCK_SIZE,
            blas=any_value,
            window=any_value,
            groups=any_value,
            fma=any_value,
            fp32_steps=any_value,
        ),  # groups: whole groups, checked there
        "scales": Key(
            "str",
            "products",
            "where block scales enter: 'products' adds (Xa-127)+(Xb-127) to every product's exponent "
            "before alignment; 'block_sum' multiplies each tree's sum (trees must lie inside one block); "
            "'group_sum': each group of adder.group_terms products is summed exactly and times the scale "
            "pair is one term of the tree, aligned at the scales' exponent sum (Blackwell kind::mxf4nvf4); "
            "'none': the unit takes no scales (plain FP8 tensor cores)",
            ("none", "products", "block_sum", "group_sum"),
            # BLAS: one scale per tree, or trees of whole blocks folded onto their least scale
            # where the data allows (blas._folded_trees); per block for an exact accumulator;
            # trees cut per block (trees_in_blocks) with a grid.
            # Window: one per tree. group_sum: not yet shown exact on either route.
            blas=lambda value, params: (
                value != "group_sum"
                and (
                    _exact_accumulator_or(_trees_inside_or_of_whole_blocks)(value, params)
                    or (params.grid_fraction_bits is not None and params.trees_in_blocks)
                )
            ),
            window=lambda value, params: (
                value != "group_sum" and _trees_inside_blocks(value, params)
            ),
            groups=only("group_sum"),
            fma=only("none"),
            fp32_steps=only("none"),
        ),
        "scale_format": Key(
            "format",
            "e8m0",
            "format of the block scale codes: 'e8m0' (2^(code-127), 0xFF NaN) or 'ue4m3' (unsigned E4M3, "
            "0x7F NaN; needs scales: group_sum). A scale's alignment exponent is floor(log2 s), at least "
            "the format's emin when it has subnormals",
            SCALE_FORMATS,
            record=None,  # the kernel gets the scale format's value and exponent tables
            blas=only("e8m0"),
            window=only("e8m0"),
            groups=any_value,  # the route reads the scale format's tables (groups.py checks them)
            fma=any_value,
            fp32_steps=any_value,
        ),
        "subnormals": Key(
            "bool",
            True,
            "false: subnormal input elements are read as zero (same sign)",
            field="input_subnormals",  # the element tables read them as zero; so does the kernel's decode
            blas=only(True),
            window=any_value,
            groups=any_value,
            fma=only(True),
            fp32_steps=any_value,  # the route's value tables read them as the kernel's
        ),
        "c_format": Key(
            "format",
            "fp32",
            "format of the accumulator input c (the API may ask for another, as Volta's mma takes f16 or "
            "f32 c beside an f32 d): every c must be a value of it (the API refuses others); c then enters "
            "exactly as c_entry says. With accumulator_exponent: format_emin, c in the first tree aligns at "
            "no less than this format's emin either (MMA-Sim's Volta m8n8k4 with f16 c: a subnormal fp16 c "
            "aligns at 2^-14)",
            WIDE_FORMATS,
            record=Record(lambda value: 1 - get_format(value).bias, name="c_format_emin"),
            blas=only(*FLOAT32_FORMATS),  # exact trees: R places no window
            # window: it flags subnormal accumulators, not c below a wider emin than the accumulator's
            window=lambda value, params: (
                value in FLOAT32_FORMATS
                and (
                    params.accumulator_exponent == "leading_bit"
                    or params.accumulator_format == "exact"
                    or get_format(value).bias >= get_format(params.accumulator_format).bias
                )
            ),
            groups=only("fp32"),
            fma=any_value,
            fp32_steps=only(*FLOAT32_FORMATS),
        ),
        "same_format": Key(
            "bool",
            False,
            "true: A and B share one element format per operation (the unit has a single source-format "
            "field, as cvfpu MXDOTP); a mixed (A, B) pair is refused",
            record=None,  # decided when the params are resolved: the kernel never sees a mixed pair
            blas=any_value,
            window=any_value,
            groups=any_value,
            fma=any_value,
            fp32_steps=any_value,
        ),
        "zero_sign": Key(
            "str",
            "keep",
            "the sign of a zero input: 'keep' (-0 is -0, a flushed subnormal keeps its sign); 'positive': "
            "every input element and c that is zero, or read as zero (subnormals: false for elements, "
            "accumulator.subnormals: false for c), is +0 (MMA-Sim's CDNA2 flush: a magnitude below the "
            "smallest normal reads as +0)",
            ("keep", "positive"),
            field="input_zero_sign",
            record=Record(lambda value: value == "positive", np.bool_, "input_zeros_positive"),
            blas=only("keep"),
            window=only("keep"),
            groups=only("keep"),
            fma=only("keep"),
            fp32_steps=any_value,  # the route's value tables and accumulator start read it
        ),
    },
    "multiplier": {
        "product_fraction_bits": Key(
            "optional_int",
            None,
            "null: exact products; n: each product's significand truncated (toward zero) to 1+n bits",
            minimum=0,
            maximum=52,
            blas=only(None),
            window=only(None),
            groups=only(None),
            fma=only(None),
            fp32_steps=only(None),
        ),
        "overflow_exponent": Key(
            "optional_int",
            None,
            "null: products never overflow. n: a product of magnitude 2^n or more is ±Inf (an infinite product: "
            "Inf - Inf gives NaN), as a multiplier with an fp32 exponent range makes it (CDNA3 MFMA: 128)",
            minimum=-1022,
            maximum=1023,
            field="product_overflow_exponent",
            record=Record(lambda value: NO_PRODUCT_OVERFLOW if value is None else value),
            blas=only(None),
            window=window_product_overflow,
            groups=only(None),
            fma=only(None),
            fp32_steps=only(None),
        ),
    },
    "adder": {
        "fused_terms": Key(
            "int",
            32,
            "products aligned and added in one tree pass",
            minimum=1,
            maximum=MAX_BLOCK_SIZE,
            blas=any_value,
            window=any_value,
            groups=any_value,
            fma=only(1),
            fp32_steps=any_value,
        ),
        "structure": Key(
            "str",
            "fused",
            "'fused': each tree's terms are aligned and added in one pass (steps 4-5). 'pairwise_rounded': "
            "each product is rounded into the accumulator format (accumulator.rounding, .subnormals, "
            ".overflow), a tree's products are summed by a balanced binary tree of two-operand adds "
            "((p0+p1)+(p2+p3)), each rounded the same way, and the tree's result is added to the "
            "accumulator the same way; IEEE arithmetic throughout (Inf - Inf is NaN, zero signs as IEEE "
            "adds give them); the alignment keys are not read (MMA-Sim's CDNA2 fp16/bf16 MFMA)",
            ("fused", "pairwise_rounded"),
            record=Record(lambda value: value == "pairwise_rounded", np.bool_, "pairwise_rounded"),
            blas=only("fused"),
            window=only("fused"),
            groups=only("fused"),
            fma=only("fused"),
            fp32_steps=any_value,  # pairwise_rounded, or exact trees (fp32_steps.py)
        ),
        "term_order": Key(
            "order",
            None,
            "null: products enter trees in k order. A permutation of 0..T-1: each run of T products "
            "is reordered by it before being cut into trees (H100/B200 fp16 path: k mod 4 in {0,1} first). "
            "K that is not a multiple of T is padded to one with empty positions (no term, not even +0), "
            "as a unit fed zero-padded operands; a partial last tree of any unit simply has fewer terms",
            maximum=MAX_BLOCK_SIZE,
            record=Record(
                lambda order: len(order) if order else 0, name="term_order_length"
            ),  # + the order array
            blas=only(None),
            window=any_value,  # the route reorders K by it (datapath.window.in_tree_order)
            groups=only(None),
            fma=only(None),
            fp32_steps=only(None),
        ),
        "trees_in_blocks": Key(
            "bool",
            False,
            "true: trees restart at every block boundary, so a tree never mixes blocks (a unit that "
            "takes one scale pair per operation: a block of 32 in trees of 11 is 11 + 11 + 10 terms). "
            "false: trees are cut from the whole of K",
            # Both routes cut trees from K: the same trees whenever fused_terms divides block_size.
            # BLAS with a grid: its accumulation cuts each block's trees as the kernel does.
            blas=lambda value, params: (
                _same_trees_as_k_order(value, params) or params.grid_fraction_bits is not None
            ),
            window=_same_trees_as_k_order,
            groups=_same_trees_as_k_order,
            fma=only(False),
            fp32_steps=_same_trees_as_k_order,
        ),
        "group_terms": Key(
            "int",
            16,
            "scales: group_sum: products per group (a group lies inside one block and one tree). The group's "
            "exact sum g times its scales sa*sb is one term of value g*sa*sb and alignment exponent "
            "ea+eb (the scales' exponents); a group whose products are all zero, or whose scale is zero, "
            "is a zero term (see zero_term_exponent); one whose products cancel keeps ea+eb",
            minimum=1,
            maximum=MAX_BLOCK_SIZE,
            blas=any_value,
            window=any_value,  # read only with group_sum, which these two routes refuse
            groups=any_value,  # whole groups in blocks and trees: checked by groups.py
            fma=any_value,
            fp32_steps=any_value,
        ),
        "accumulator_in_tree": Key(
            "bool",
            True,
            "true: the running accumulator joins the tree's alignment like one more term (its bits "
            "below the window are lost); false: the tree sum is added to the accumulator exactly, "
            "then rounded once",
            blas=any_value,  # exact trees: acc + sum is rounded once either way
            window=any_value,
            groups=any_value,
            fma=any_value,  # one product a tree, no window: one rounding of d + a * b either way
            fp32_steps=any_value,  # exact trees: acc + sum is rounded once either way
        ),
        "align_reference": Key(
            "str",
            "exponent_sum",
            "the alignment reference R: 'exponent_sum' = max of ea+eb over the tree's nonzero products "
            "(element exponents clamped to their format's emin, scale exponents added), as tensor cores "
            "do; 'leading_bit' = max floor(log2|p|). The accumulator, when in the tree, counts with "
            "floor(log2|acc|)",
            ("exponent_sum", "leading_bit"),
            record=Record(lambda value: value == "leading_bit", np.bool_, "align_leading_bit"),
            blas=any_value,  # exact trees: R places no window
            window=only("exponent_sum"),
            groups=any_value,  # a group term aligns at its scales' exponent sum, whatever this key
            fma=only("exponent_sum"),
            fp32_steps=any_value,  # exact trees: R places no window
        ),
        "align_fraction_bits": Key(
            "optional_int",
            None,
            "null: exact, no bits lost. n: terms are kept to multiples of 2^(R-n); what falls below "
            "follows below_window (H100 FP8: 13)",
            minimum=0,
            maximum=50,
            blas=only(None),
            window=lambda value, params: value is not None,  # its range: window.window_applies
            groups=lambda value, params: value is not None,  # its range: groups.groups_apply
            fma=only(None),
            fp32_steps=_pairwise_or(only(None)),
        ),
        "below_window": Key(
            "str",
            "truncate",
            "bits below the window: 'truncate' (each term's magnitude toward zero, sign-magnitude), "
            "'floor' (toward -inf, two's complement), 'nearest_even' (each term rounded to the window), "
            "'sticky' (truncate, and jam a sticky bit one place below the window)",
            ("truncate", "floor", "nearest_even", "sticky"),
            blas=any_value,  # read only with a window
            window=only("truncate"),
            groups=only("truncate"),
            fma=only("truncate"),
            fp32_steps=any_value,  # read only with a window
        ),
        "carry_bits": Key(
            "optional_int",
            None,
            "null: the adder never overflows. n: with a window, the adder holds signed integers of "
            "1 + (align_fraction_bits + 2) + n bits in units of the window's LSB (one more with "
            "sticky); a tree sum beyond that follows adder_overflow",
            minimum=0,
            maximum=40,
            blas=only(None),
            window=only(None),
            groups=only(None),
            fma=only(None),
            fp32_steps=_pairwise_or(only(None)),
        ),
        "adder_overflow": Key(
            "str",
            "wrap",
            "a tree sum beyond the adder's width: 'wrap' (two's complement, modulo 2^width) or "
            "'saturate' (clamped to the most negative / most positive register value)",
            ("wrap", "saturate"),
            record=Record(lambda value: value == "saturate", np.bool_, "adder_saturates"),
            blas=any_value,
            window=any_value,
            groups=any_value,  # read only with carry_bits
            fma=only("wrap"),
            fp32_steps=any_value,  # read only with carry_bits
        ),
        "sum_significant_bits": Key(
            "optional_int",
            None,
            "null: the tree sum goes straight to the accumulator rounding. n: the normalised tree sum "
            "is first rounded to n significant bits with sum_rounding (H100 FP8: 14, toward zero)",
            minimum=1,
            maximum=40,
            blas=only(None),
            window=any_value,  # its range: window.window_applies
            groups=any_value,  # its range: groups.groups_apply
            fma=only(None),
            fp32_steps=_pairwise_or(only(None)),
        ),
        "sum_rounding": Key(
            "str",
            "toward_zero",
            "rounding to sum_significant_bits",
            DIRECTED_AND_NEAREST,
            record=Record(rounding_code),
            blas=any_value,  # read only with sum_significant_bits
            window=only(*DIRECTED_AND_NEAREST),
            groups=only(*DIRECTED_AND_NEAREST),
            fma=any_value,
            fp32_steps=any_value,  # read only with sum_significant_bits
        ),
        "parity_windows": Key(
            "bool",
            False,
            "true: a tree's products at even and at odd positions (counted from the tree's start) are "
            "aligned and added in two separate windows, each with its own reference R and "
            "align_fraction_bits; the two sums are then kept to multiples of 2^(R - align_fraction_bits) "
            "for the larger R, toward -inf, and added, R being that larger one (MMA-Sim's CDNA3 FP8 MFMA)",
            blas=only(False),
            window=_window_parity,
            groups=only(False),
            fma=only(False),
            fp32_steps=_pairwise_or(only(False)),
        ),
        "second_alignment_bits": Key(
            "optional_int",
            None,
            "null: the accumulator joins the tree or is added to its sum exactly (accumulator_in_tree). "
            "n (with accumulator_in_tree: false and a window): a second alignment adds the accumulator "
            "to the tree's sum at E = max(R, e), R the tree's reference (none for a tree without a "
            "nonzero product), e the accumulator's exponent (of its leading bit), at least its format's emin "
            "(that emin for a zero accumulator); the tree sum keeps multiples of 2^(E-n-1) and the "
            "accumulator multiples of 2^(E - align_fraction_bits), both toward -inf; their exact sum is "
            "cut to n+1 significant bits toward -inf (no finer than 2^(emin-n)), then rounded into the "
            "accumulator format (MMA-Sim's CDNA3 MFMA: 31)",
            minimum=0,
            maximum=40,
            blas=only(None),
            window=window_second_alignment,
            groups=only(None),
            fma=only(None),
            fp32_steps=_pairwise_or(only(None)),
        ),
        "far_accumulator": Key(
            "str",
            "floor",
            "second_alignment_bits: an accumulator whose exponent e lies below E - align_fraction_bits - 1: "
            "'floor' keeps it toward -inf like any other (a negative one becomes -2^(E - align_fraction_bits)); "
            "'zero' drops it (MMA-Sim's CDNA3 FP8 MFMA)",
            ("floor", "zero"),
            record=Record(lambda value: value == "zero", np.bool_, "far_accumulator_dropped"),
            blas=any_value,
            window=any_value,
            groups=any_value,  # read only with second_alignment_bits, which all refuse
            fma=only("floor"),
            fp32_steps=any_value,  # read only with second_alignment_bits
        ),
        "special_accumulator_exponent": Key(
            "optional_int",
            None,
            "null: an accumulator that is NaN or ±Inf (c, or an earlier tree's result) stays so to the "
            "output, as in IEEE arithmetic. e (with second_alignment_bits and far_accumulator: zero): such "
            "an accumulator enters the second alignment with exponent e, so E = max(R, e), and is dropped "
            "as a far finite one is when e < E - align_fraction_bits - 1: the result is then the tree's sum "
            "alone. A NaN or ±Inf product in the tree itself keeps the result NaN or ±Inf (MMA-Sim's CDNA3 "
            "FP8 MFMA: -1, the exponent its frexp gives NaN and Inf, so a NaN or Inf c or running sum "
            "vanishes under products of 2^25 and more; not measured on hardware)",
            minimum=-1100,
            maximum=1100,
            record=Record(
                lambda value: NO_SPECIAL_ACCUMULATOR_EXPONENT if value is None else value
            ),
            blas=only(None),
            # A NaN or Inf accumulator is c's (flagged by the route) or an overflow's (flagged).
            window=any_value,
            groups=only(None),
            fma=only(None),
            fp32_steps=_pairwise_or(only(None)),
        ),
        "accumulator_exponent": Key(
            "str",
            "leading_bit",
            "the exponent the accumulator aligns with when it joins the tree: 'leading_bit' = "
            "floor(log2|acc|); 'format_emin' = max(floor(log2|acc|), emin of the accumulator format, "
            "and in the first tree, where it holds c, emin of inputs.c_format), so a subnormal accumulator "
            "aligns as a subnormal element does (MMA-Sim's tensor cores)",
            ("leading_bit", "format_emin"),
            record=Record(
                lambda value: value == "format_emin", np.bool_, "accumulator_exponent_clamped"
            ),
            blas=any_value,  # exact trees: R places no window
            window=any_value,  # the two differ only for a subnormal accumulator, which the route flags
            groups=any_value,  # likewise
            fma=only("leading_bit"),
            fp32_steps=any_value,  # exact trees: R places no window
        ),
        "zero_term_exponent": Key(
            "optional_int",
            None,
            "null: zero products and a zero accumulator take no part in the alignment reference. n: "
            "in a tree with a zero product (or zero group: scales: group_sum), or with the accumulator "
            "in the tree and zero (c = 0 included), R is at least n, as if the zeros were terms of exponent n (MMA-Sim's e_zero: "
            "-133 for fp32 and -21 for fp16 outputs on Hopper and Blackwell); nonzero terms below "
            "2^(n - align_fraction_bits) are then lost. At most 1022, so that the window's lowest bit "
            "lies below fp64's top binade: a floor that high already loses every term of every unit",
            minimum=-1100,
            maximum=1022,
            record=Record(lambda value: NO_ZERO_TERM_EXPONENT if value is None else value),
            blas=any_value,  # exact trees: R places no window
            # window: it flags every lane with a nonzero term whose R lies below n. Its R is the
            # kernel's without scales and with per-product scales (both add the scale pair to
            # every exponent sum); with block_sum the kernel compares n with R before the tree's
            # scale, which the route does not.
            window=lambda value, params: value is None or params.scales in ("none", "products"),
            groups=any_value,  # it raises R to n for zero groups and a zero accumulator, as the kernel
            fma=only(None),
            fp32_steps=any_value,  # exact trees: R places no window
        ),
    },
    "accumulator": {
        "format": Key(
            "format",
            "fp32",
            "format each tree result is rounded into ('exact': a wide fixed-point that never rounds, "
            "Kulisch; then only the output rounds)",
            WIDE_FORMATS + ("exact",),
            field="accumulator_format",
            record=Record(
                lambda value: value == "exact", np.bool_, "accumulator_exact"
            ),  # + its format parameters
            blas=only("fp32", "exact"),
            window=only(*FLOAT32_FORMATS),
            groups=only(*FLOAT32_FORMATS),
            fma=any_value,
            fp32_steps=only("fp32"),
        ),
        "rounding": Key(
            "str",
            "nearest_even",
            "rounding into the accumulator",
            DIRECTED_AND_NEAREST,
            field="accumulator_rounding",
            record=Record(rounding_code),
            # BLAS: RNE by round-to-odd; with a grid every mode (_blas_kernels.round_fp32).
            blas=_exact_accumulator_or(
                lambda value, params: (
                    value == "nearest_even"
                    or (params.grid_fraction_bits is not None and value in DIRECTED_AND_NEAREST)
                )
            ),
            window=only(*DIRECTED_AND_NEAREST),
            groups=only(*DIRECTED_AND_NEAREST),
            fma=only("nearest_even"),
            fp32_steps=only("nearest_even"),
        ),
        "subnormals": Key(
            "bool",
            True,
            "false: subnormal accumulator values flush to zero (same sign)",
            field="accumulator_subnormals",
            blas=_exact_accumulator_or(only(True)),
            window=any_value,  # subnormal accumulator values are flagged for the generic kernel
            groups=any_value,  # likewise
            fma=only(True),
            fp32_steps=_pairwise_or(only(True)),  # pairwise: flushed results are flagged
        ),
        "c_entry": Key(
            "str",
            "initial",
            "'initial': c (converted to the accumulator format with its rounding) is the accumulator's "
            "first value; 'end': the accumulator starts at 0 and c, rounded to the accumulator format "
            "(nearest even), is added after the last tree with c_add_rounding (B200, fp16 paths)",
            ("initial", "end"),
            record=Record(lambda value: value == "end", np.bool_, "c_at_end"),
            blas=_exact_accumulator_or(only("initial")),
            window=any_value,  # 'end': one binary32 add at the end (datapath.window)
            groups=only("initial"),
            fma=only("initial"),
            fp32_steps=only("initial"),
        ),
        "c_add_rounding": Key(
            "str",
            "nearest_even",
            "rounding of the final c add (c_entry: end)",
            DIRECTED_AND_NEAREST,
            record=Record(rounding_code),
            blas=any_value,
            window=any_value,
            groups=any_value,  # read only with c_entry: end
            fma=any_value,
            fp32_steps=any_value,  # read only with c_entry: end
        ),
        "overflow": Key(
            "str",
            "ieee",
            "a result beyond the accumulator format's range: 'ieee' gives ±Inf, or the largest finite "
            "value under the directed modes that round toward it (toward_zero); 'infinity' gives ±Inf "
            "under every rounding (MMA-Sim's tensor cores: the sum is rounded and then converted)",
            tuple(ACCUMULATOR_OVERFLOW),
            field="accumulator_overflow",
            record=Record(lambda value: overflow_code(ACCUMULATOR_OVERFLOW[value])),
            blas=_exact_accumulator_or(only("ieee")),
            window=any_value,  # the route flags every overflow for the generic kernel
            groups=any_value,  # likewise
            fma=only("ieee"),
            fp32_steps=any_value,  # the route flags every non-finite result
        ),
        "promotion_interval": Key(
            "optional_int",
            None,
            "null: one accumulator. n: every n products the accumulator is added (RNE, fp32) into an "
            "outer fp32 accumulator, which c starts, and cleared (DeepSeek-V3's fix for Hopper); "
            "a multiple of fused_terms",
            minimum=1,
            maximum=1 << 30,
            blas=only(None),
            window=any_value,  # an fp32 accumulator's promotion (datapath.window)
            groups=only(None),
            fma=only(None),
            fp32_steps=only(None),
        ),
    },
    "grid": {
        "fraction_bits": Key(
            "optional_int",
            None,
            "null: no fixed-point grid. n: each tree's products (exact) are summed exactly on a fixed-point "
            "grid whose LSB weighs 2^(X - n), X the tree's scale exponent (Xa-127)+(Xb-127); the accumulator "
            "(outside the tree) is aligned to that grid by its LSB, 2^(e - m) with e its exponent (the format's "
            "emin for subnormals, emin - 1 for zero) and m its mantissa bits; unless a pass-through rule "
            "below returns the accumulator unchanged (its bits, -0 included), accumulator + products is "
            "rounded once with accumulator.rounding and an exact zero is +0 (cvfpu MXDOTP: 34)",
            minimum=0,
            maximum=200,
            field="grid_fraction_bits",
            # BLAS: the config's checks leave one scale pair per tree (_blas_kernels.accumulate_grid_fp32)
            blas=any_value,
            window=only(None),
            groups=only(None),
            fma=only(None),
            fp32_steps=only(None),
        ),
        "accumulator_max_left_shift": Key(
            "int",
            70,
            "with a grid: an accumulator whose LSB lies more than this many places above the grid's LSB is "
            "the result unchanged, whatever the products (cvfpu MXDOTP: 70)",
            minimum=0,
            maximum=1000,
            field="grid_max_left_shift",
            blas=any_value,
            window=any_value,  # read only with a grid
            groups=any_value,
            fma=any_value,
            fp32_steps=any_value,
        ),
        "accumulator_max_right_shift": Key(
            "int",
            24,
            "with a grid: an accumulator whose LSB lies more than this many places below the grid's LSB "
            "(its low bits folded into a sticky bit) is the result unchanged when the tree's products sum "
            "to exactly zero (cvfpu MXDOTP: 24)",
            minimum=0,
            maximum=1000,
            field="grid_max_right_shift",
            blas=any_value,
            window=any_value,  # read only with a grid
            groups=any_value,
            fma=any_value,
            fp32_steps=any_value,
        ),
    },
    "output": {
        "format": Key(
            "format",
            "fp32",
            "default output format (the API may ask for another)",
            WIDE_FORMATS,
            field="output_format",
            record=None,  # the kernel gets its format parameters
            blas=only("fp32"),
            window=only(*FLOAT32_FORMATS),
            groups=only(*FLOAT32_FORMATS),
            fma=any_value,  # the accumulator's (datapath.fma): nothing to round
            fp32_steps=only("fp32"),  # the accumulator's: nothing to round
        ),
        "rounding": Key(
            "str",
            "nearest_even",
            "rounding of the accumulator into the output",
            DIRECTED_AND_NEAREST,
            field="output_rounding",
            record=Record(rounding_code),
            # BLAS: an fp32 accumulator into an fp32 output never rounds; an exact one rounds once.
            blas=lambda value, params: (
                params.accumulator_format != "exact" or value == "nearest_even"
            ),
            window=only(*DIRECTED_AND_NEAREST),
            groups=only(*DIRECTED_AND_NEAREST),
            fma=any_value,  # the accumulator's format: nothing to round
            fp32_steps=any_value,  # an fp32 accumulator into an fp32 output never rounds
        ),
        "subnormals": Key(
            "bool",
            True,
            "false: subnormal outputs flush to zero (same sign)",
            field="output_subnormals",
            blas=only(True),
            window=any_value,
            groups=any_value,
            fma=only(True),
            fp32_steps=any_value,  # subnormal results are flagged
        ),  # subnormal outputs are flagged
        "zero_sign": Key(
            "str",
            "ieee",
            "the sign of a zero result: 'ieee' (+0 unless c and every product are -0, and a negative "
            "result that rounds to zero keeps its sign); 'positive': every zero result is +0 (MMA-Sim's "
            "tensor cores add +0.0 to each result); 'exact_positive': an exact zero sum is +0 even when "
            "c and every product are -0, a negative result that rounds to zero keeps its sign (MMA-Sim's "
            "CDNA1 MFMA); 'ieee_steps': each rounding into the accumulator is an IEEE step: its exact zero is "
            "-0 when every addend of the step (the running accumulator, c at first, and each product of the "
            "tree) is -0, else +0, a step result that rounds to zero keeps its sign, and the accumulator "
            "carries that zero into the next step (an IEEE FMA chain: MMA-Sim's fp64 mma and MFMA); needs "
            "accumulator.rounding other than toward_negative (output.rounding too for an exact accumulator, "
            "its one step), c_entry: initial, promotion_interval and grid.fraction_bits null",
            ("ieee", "positive", "exact_positive", "ieee_steps"),
            field="output_zero_sign",
            # window: a lane it leaves unflagged is never -0 (c = -0 and underflows are flagged);
            # ieee_steps: not shown exact on the fast routes.
            blas=only("ieee"),
            window=only("ieee", "positive", "exact_positive"),
            groups=only("ieee", "positive", "exact_positive"),  # groups: as the window route
            fma=only("ieee_steps"),
            fp32_steps=lambda value, params: (
                value
                in (
                    ("ieee", "positive")
                    if params.structure == "pairwise_rounded"
                    else ("positive", "exact_positive")
                )
            ),
        ),
    },
}


def keys() -> Iterator[tuple[str, str, Key]]:
    """(section, name, key) of every key of :data:`SCHEMA`, in table order."""
    for section, entries in SCHEMA.items():
        for name, key in entries.items():
            yield section, name, key


def param_field(name: str, key: Key) -> str | None:
    """The :class:`DatapathParams` field of a key (None for the accepted-format lists)."""
    return None if key.field is None else key.field or name


_KIND_TYPES = {
    "int": int,
    "optional_int": int | None,
    "bool": bool,
    "str": str,
    "format": str,
    "order": tuple[int, ...] | None,
}


class _KeptHash:
    """The base of :class:`DatapathParams`: a slot (outside the fields and ``__dict__``)
    keeping the object's hash, which every cached lookup by a unit's parameters (a model's
    GEMMs, each call a handful) would otherwise compute over its dozens of fields. Not
    pickled: a string's hash differs from process to process."""

    __slots__ = ("_kept_hash",)

    def __getstate__(self) -> dict:
        return dict(self.__dict__)


def params_class(schema: dict[str, dict[str, Key]]) -> type:
    """The frozen dataclass of one unit's resolved parameters: ``a_format``, ``b_format``
    (the chosen element formats), then one field per key of ``schema``."""
    fields: list[tuple[str, Any]] = [("a_format", str), ("b_format", str)]
    for entries in schema.values():
        for name, key in entries.items():
            if (field := param_field(name, key)) is not None:
                fields.append((field, _KIND_TYPES[key.kind]))
    cls = dataclasses.make_dataclass("DatapathParams", fields, bases=(_KeptHash,), frozen=True)
    cls.__module__ = __name__  # pickled by reference, as a class written here would be
    fields_hash: Any = cls.__dict__["__hash__"]  # the dataclass's hash of the fields

    def __hash__(self) -> int:  # the fields' hash, worked out once per object
        try:
            return self._kept_hash
        except AttributeError:
            value = fields_hash(self)
            object.__setattr__(self, "_kept_hash", value)
            return value

    cls.__hash__ = __hash__  # type: ignore[method-assign, assignment]
    cls.__doc__ = (
        "The resolved parameters of one unit for one (A format, B format) pair: a field per "
        "key of SCHEMA (see it, or docs/hwconfig.md, for exact meanings)."
    )
    return cls


if TYPE_CHECKING:

    @dataclass(frozen=True)
    class DatapathParams:
        """For the type checker: the fields are made from SCHEMA at run time (:func:`params_class`),
        each typed by its key's kind (``_KIND_TYPES``), so they are read here as ``Any``."""

        def __init__(self, **fields: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...
else:
    DatapathParams = params_class(SCHEMA)


def param_fields() -> tuple[str, ...]:
    """Every field a :class:`DatapathParams` of the current schema has."""
    return ("a_format", "b_format") + tuple(
        field for _, name, key in keys() if (field := param_field(name, key)) is not None
    )


def _record_of(name: str, key: Key) -> Record | None:
    """The key's record field, with the defaults by kind filled in."""
    if key.record is None:
        return None
    field = _recorded_field(name, key)
    if key.record is not BY_KIND:
        return key.record if key.record.name else dataclasses.replace(key.record, name=field)
    if key.kind == "int":
        return Record(int, np.int64, field)
    if key.kind == "optional_int":
        return Record(lambda value: -1 if value is None else value, np.int64, field)  # null is -1
    if key.kind == "bool":
        return Record(bool, np.bool_, field)
    if key.kind == "str":
        return Record(key.choices.index, np.int64, field)  # the value's position among the choices
    raise ValueError(f"key {name!r} of kind {key.kind!r} must say how the kernel record holds it")


def _recorded_field(name: str, key: Key) -> str:
    """The :class:`DatapathParams` field of a key the kernel record holds (every such key has one)."""
    field = param_field(name, key)
    if field is None:
        raise ValueError(f"key {name!r} has a kernel record but no DatapathParams field")
    return field


_schema_memos: tuple = (None, {})


def _schema_memo(name: str) -> dict:
    """The memo ``name`` of values worked out from the schema table, emptied whenever the
    table is replaced (tests swap it)."""
    global _schema_memos
    if _schema_memos[0] is not SCHEMA:
        _schema_memos = (SCHEMA, {})
    return _schema_memos[1].setdefault(name, {})


def _record_layout() -> tuple[np.dtype, tuple]:
    """(record dtype, ((record field, encoder, params field), ...)) of the current schema
    table, worked out once per table (the probe asks for thousands of records)."""
    memo = _schema_memo("record layout")
    if not memo:
        recorded = [
            (record, _recorded_field(name, key))
            for _, name, key in keys()
            if (record := _record_of(name, key))
        ]
        dtype = np.dtype([(record.name, record.dtype) for record, _ in recorded], align=True)
        memo["layout"] = (
            dtype,
            tuple((record.name, record.encode, field) for record, field in recorded),
        )
    return memo["layout"]


def record_dtype() -> np.dtype:
    """The numpy structured dtype of the kernel's parameter record: one field per key that has
    one, in table order (one dtype for every unit, so the kernels compile once)."""
    return _record_layout()[0]


@functools.lru_cache(maxsize=4096)
def kernel_record(params) -> np.ndarray:
    """The kernel's parameter record of ``params``, as a one-element structured array
    (read-only, cached per params)."""
    dtype, fields = _record_layout()
    # one tuple, converted field by field as assigning each field would (the probe asks for
    # thousands of records: a structured array's field assignment costs microseconds)
    record = np.array(
        [tuple(encode(getattr(params, field)) for _, encode, field in fields)], dtype=dtype
    )
    record.setflags(write=False)
    return record


_ROUTE_MEMO_LIMIT = 4096  # params of a large sweep: the memo is dropped and refilled


def route_accepts(route: str, params) -> bool:
    """Whether every key's value in ``params`` is one the route (one of ``ROUTES``)
    computes exactly, by each key's declaration. A key without a declaration for the route,
    or a params field no key declares, refuses the route. Remembered per (route, params)
    while the schema table is the same object (every GEMM of a model asks again)."""
    memo = _schema_memo("route accepts")
    if len(memo) > _ROUTE_MEMO_LIMIT:
        memo.clear()
    key = (route, params)
    if key not in memo:
        memo[key] = _route_accepts(route, params)
    return memo[key]


def _route_checks(route: str, params_type: type) -> tuple | None:
    """((params field or None, the key's declaration for the route), ...) of every key, or
    None where no params of ``params_type`` can take the route (a key without a declaration
    for it, or fields other than the schema's): worked out once per schema table, route and
    params class (the probe asks about thousands of params)."""
    memo = _schema_memo("route checks")
    if (route, params_type) not in memo:
        checks = tuple((param_field(name, key), getattr(key, route)) for _, name, key in keys())
        fields = tuple(field.name for field in dataclasses.fields(params_type))
        refused = fields != param_fields() or any(accepts is None for _, accepts in checks)
        memo[route, params_type] = None if refused else checks
    return memo[route, params_type]


def _route_accepts(route: str, params) -> bool:
    checks = _route_checks(route, type(params))
    return checks is not None and all(
        accepts(None if field is None else getattr(params, field), params)
        for field, accepts in checks
    )


def schema_markdown() -> str:
    """The schema as Markdown tables (docs/hwconfig.md embeds this text verbatim)."""
    lines = []
    for section, entries in SCHEMA.items():
        lines += [
            f"### `{section}`",
            "",
            "| key | type | default | accepted | meaning |",
            "|---|---|---|---|---|",
        ]
        for name, key in entries.items():
            default = (
                "required"
                if key.default is REQUIRED
                else ("null" if key.default is None else f"`{key.default}`")
            )
            if isinstance(key.default, bool):
                default = f"`{str(key.default).lower()}`"
            if key.choices:
                accepted = ", ".join(f"`{c}`" for c in key.choices)
            elif key.kind == "order":
                accepted = f"null or at most {key.maximum} entries"
            elif key.minimum is not None:
                accepted = (
                    f"{key.minimum}..{key.maximum}"
                    if key.maximum is not None
                    else f">= {key.minimum}"
                )
            else:
                accepted = "true, false" if key.kind == "bool" else ""
            lines.append(f"| `{name}` | {key.kind} | {default} | {accepted} | {key.meaning} |")
        lines.append("")
    return "\n".join(lines)


DOCS_BEGIN = "<!-- key tables: generated from mxsim/datapath/schema.py (docs_with_schema) -->"
DOCS_END = "<!-- end of generated key tables -->"


def docs_with_schema(text: str) -> str:
    """``text`` (docs/hwconfig.md) with the key tables between its markers regenerated."""
    before, begin, rest = text.partition(DOCS_BEGIN)
    _, end, after = rest.partition(DOCS_END)
    if not (begin and end):
        raise ValueError(f"the text lacks the markers {DOCS_BEGIN!r} ... {DOCS_END!r}")
    return f"{before}{DOCS_BEGIN}\n\n{schema_markdown()}\n{DOCS_END}{after}"
