"""One probe per datapath choice: the values it tells apart and the inputs that tell them apart.

A :class:`Probe` names the key paths it decides, lists candidate values (dicts of key path ->
value, the preferred one first: among candidates no probe input tells apart, the first is
kept), and draws its inputs from the families of :class:`~mxsim.probe.inputs.Context`. The
engine (:mod:`mxsim.probe.core`) predicts every candidate's output with mxsim on those
inputs, asks the unit only where the candidates disagree, and keeps the candidates that
reproduce every answer. A new datapath key needs one more entry in :data:`PROBES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..datapath.api import kernel_c_dtype
from ..datapath.schema import DIRECTED_AND_NEAREST, SCHEMA
from ..formats import get_format
from .inputs import Batch, Context

Candidates = list[dict]


@dataclass(frozen=True)
class Probe:
    name: str
    keys: tuple[str, ...]
    candidates: Callable[[Context, dict], Candidates]
    #: The probe's rows in the order the engine predicts them (it asks chunk by chunk, the
    #: first chunks the most candidates), drawn from the probe's own stream (Context.draw_from).
    inputs: Callable[[Context], Batch]
    what: str  # one line for the report and docs/probe.md
    #: A late probe runs only once the others have settled (passes until no decision changes):
    #: its keys (AMD matrix-core datapaths) imitate a window or a tree size decided wrongly in an
    #: early pass, and one taken then would lock a unit without them into a wrong search.
    late: bool = False
    #: A strict probe leaves the value held unless another fits every answer: pairwise rounded
    #: adds, parity windows or an overflowing product imitate a datapath
    #: whose other keys are still off better than it does itself (a unit without them would be
    #: led astray).
    strict: bool = False
    #: Rows joined after the others once the late probes run: rows that tell a key apart only
    #: under a settled hypothesis, and under an early one would lead a search astray.
    settled: Callable[[Context], Batch] | None = None


def _maximum(path: str) -> int:
    section, key = path.split(".")
    return SCHEMA[section][key].maximum


#: A window, a rounded tree sum or the accumulator in the tree rule out a fixed-point grid: a
#: grid kept from an early pass must not lock those keys out of later ones.
NO_GRID = {"grid.fraction_bits": None}


def _group_sizes(ctx: Context, hyp: dict) -> list[int]:
    """Group sizes that divide both the block and the tree (a group lies inside each); not 1,
    which only moves the products placement's alignment anchor to the scales' exponent."""
    return [
        g
        for g in range(2, ctx.block_size + 1)
        if ctx.block_size % g == 0 and hyp["adder.fused_terms"] % g == 0
    ]


def _all_scales(ctx: Context, hyp: dict) -> Candidates:
    """Power-of-two E8M0 scales on the products or the tree sums, no scales, or group sums
    times E8M0 or UE4M3 scales (groups of the size held, or the largest that fits: the groups
    probe decides the size)."""
    e8m0 = {"inputs.scale_format": "e8m0"}
    candidates = [
        {"inputs.scales": "products", **e8m0},
        {"inputs.scales": "none", **e8m0},
        {"inputs.scales": "block_sum", "adder.accumulator_in_tree": False, **e8m0},
    ]
    sizes = _group_sizes(ctx, hyp)
    if not sizes:
        return candidates
    size = hyp["adder.group_terms"] if hyp["adder.group_terms"] in sizes else sizes[-1]
    return candidates + [
        {
            "inputs.scales": "group_sum",
            "inputs.scale_format": fmt,
            "adder.group_terms": size,
            **NO_GRID,
        }
        for fmt in SCHEMA["inputs"]["scale_format"].choices
    ]


def _near_windows(hyp: dict, reach: int) -> list:
    """The window held and those up to ``reach`` bits wider or narrower (null: null alone)."""
    held = hyp["adder.align_fraction_bits"]
    if held is None:
        return [None]
    return [
        held + d
        for d in sorted(range(-reach, reach + 1), key=abs)
        if 0 <= held + d <= _maximum("adder.align_fraction_bits")
    ]


def _scales(ctx: Context, hyp: dict) -> Candidates:
    """As :func:`_all_scales`, in the scale format held (the inputs are written in it); scales
    on the products and on group sums each with the window held or up to two bits off: they
    anchor the window a bit or two apart, so a window decided with one is off for the other."""
    return [
        {**c, "adder.align_fraction_bits": window}
        for c in _all_scales(ctx, hyp)
        if c["inputs.scale_format"] == hyp["inputs.scale_format"]
        for window in (
            _near_windows(hyp, 2)
            if c["inputs.scales"] in ("products", "group_sum")
            else [hyp["adder.align_fraction_bits"]]
        )
    ]


def _groups(ctx: Context, hyp: dict) -> Candidates:
    """Group sums of each size, the size held first, each with the window held or up to four
    bits wider or narrower: a group sum is aligned at its scales' exponent, not at its own
    leading bit, so a window decided with another group size may sit a few bits off. The size
    held first: without a window (exact sums) no input tells the sizes apart, and a smaller
    size kept there admits tree sizes that no larger group divides (groups of 2, then trees of
    30 at K = 32), which lock the larger sizes out of every later pass."""
    if hyp["inputs.scales"] != "group_sum":
        return [{"adder.group_terms": hyp["adder.group_terms"]}]
    sizes = sorted(_group_sizes(ctx, hyp), key=lambda g: g != hyp["adder.group_terms"])
    return [
        {"adder.group_terms": g, "adder.align_fraction_bits": window}
        for g in sizes
        for window in _near_windows(hyp, 4)
    ]


def _input_subnormals(ctx: Context, hyp: dict) -> Candidates:
    # The value held first: two probes decide the key, and one whose inputs tell nothing apart
    # must not undo the other's decision.
    held = hyp["inputs.subnormals"]
    return [{"inputs.subnormals": value} for value in (held, not held)]


def _product_bits(ctx: Context, hyp: dict) -> Candidates:
    widest = 2 * (ctx.A.fmt.mantissa_bits + ctx.B.fmt.mantissa_bits) + 2
    return [{"multiplier.product_fraction_bits": None}] + [
        {"multiplier.product_fraction_bits": n}
        for n in range(0, min(widest, _maximum("multiplier.product_fraction_bits")) + 1)
    ]


def _accumulator(ctx: Context, hyp: dict) -> Candidates:
    return [
        {"accumulator.format": fmt, "accumulator.rounding": rounding}
        for fmt in ("fp32", "exact", "fp16", "bf16", *_wide_accumulators(ctx))
        for rounding in DIRECTED_AND_NEAREST
    ]


def _accumulator_and_overflow(ctx: Context, hyp: dict) -> Candidates:
    """:func:`_accumulator`'s candidates with the overflow held, then each directed rounding
    with the other overflow: under a rounding toward zero an overflowing sum is the largest
    value or Inf by that key alone, so where products reach past the accumulator's range
    (bf16, tf32: up to 2^256) a rounding toward zero with the overflow held wrong misses
    every such row and loses to nearest-even, which the overflow probe then cannot tell
    apart (MMA-Sim's Ampere and Ada bf16: Inf under a rounding toward zero)."""
    candidates = _accumulator(ctx, hyp)
    candidates += [
        {**c, "accumulator.overflow": other}
        for other in _overflows_held_first(hyp)[1:]
        for c in candidates
        if not c["accumulator.rounding"].startswith("nearest")
    ] + _output_alike(ctx, hyp)
    return (
        _held_first(candidates, hyp)
        if _output_narrower(ctx, hyp["accumulator.format"])
        else candidates
    )


def _output_narrower(ctx: Context, accumulator: str) -> bool:
    """Whether the output keeps fewer significant bits than the accumulator format (not an exact
    one, which rounds nothing): the accumulator's last bits may then not reach the output."""
    return (
        accumulator != "exact" and get_format(accumulator).mantissa_bits > ctx.out_fmt.mantissa_bits
    )


def _held_first(candidates: Candidates, hyp: dict) -> Candidates:
    """The candidates with the one the hypothesis holds moved to the front: where the probe's
    rows tell it from none of the others, it stays. An output narrower than the accumulator
    hides its last bit on the accumulator probe's rows (v100 fp16 -> bf16: a rounding toward
    zero, found by the coarse start on realistic rows, fit the next pass's rows as well as
    nearest-even, listed first, which then was kept and led the later probes astray). Where
    the output is as wide, the first listed that fits stays the choice (the simplest)."""
    held = [c for c in candidates if all(hyp.get(key) == value for key, value in c.items())]
    return held + [c for c in candidates if c not in held]


def _output_alike(ctx: Context, hyp: dict) -> Candidates:
    """Where the output is narrower than an accumulator format, that accumulator with each
    directed rounding other than the output's held, the output rounded alike. An accumulator
    rounded to the output's own format hides the output's rounding, so before the output probe
    has decided it, an fp16 accumulator rounding toward zero imitates an fp32 one with the
    output rounding toward zero better than the fp32 one does with the output's rounding held
    (b200-tcgen05-mxf4 E2M1 x E2M1 -> fp16). Directed only: the nearest modes led h100's fp16
    CI search astray (1,978 -> 3,683 queries), and the output's own default is nearest."""
    return [
        {"accumulator.format": fmt, "accumulator.rounding": rounding, "output.rounding": rounding}
        for fmt in ("fp32", *_wide_accumulators(ctx))
        if get_format(fmt).bits > ctx.out_fmt.bits
        for rounding in DIRECTED_AND_NEAREST
        if not rounding.startswith("nearest") and rounding != hyp["output.rounding"]
    ]


def _wide_accumulators(ctx: Context) -> tuple[str, ...]:
    """The output's or c's format where wider than fp32 (fp64): an accumulator of it."""
    return tuple(
        dict.fromkeys(fmt for fmt in (ctx.out_format, ctx.c_format) if get_format(fmt).bits > 32)
    )


def _output(ctx: Context, hyp: dict) -> Candidates:
    return [
        {
            "output.rounding": rounding,
            "output.subnormals": out_sub,
            "accumulator.subnormals": acc_sub,
        }
        for rounding in DIRECTED_AND_NEAREST
        for out_sub in (True, False)
        for acc_sub in (True, False)
    ]


def _window(ctx: Context, hyp: dict) -> Candidates:
    # A window is read by fused trees only: it brings them back when pairwise adds are held.
    widths = range(0, _maximum("adder.align_fraction_bits") + 1)
    narrow = _output_narrower(ctx, "fp32")
    if narrow:
        # The width held first: where the alignment-reference probe moved it a bit, a narrower
        # width with another rounding below it that fits the window rows as well as the output
        # shows them would move it back each pass, and the rounding below the window would never
        # be decided at the width held (b200-tcgen05-mxf4 E2M1 x E2M1 -> fp16: 34 nearest-even
        # and 35 truncated in turn). Under an fp32 output the rows tell the widths apart, and
        # holding a width first kept a wrong one (MMA-Sim CDNA3 f32_16x16x32_fp8_fp8).
        widths = sorted(widths, key=lambda bits: bits != hyp["adder.align_fraction_bits"])
    # Where c is held outside the trees (a grid needs it there; or it is added after them or at
    # the end), no window reaches it: each window is also offered with c in the first tree, or
    # a c that the window cuts is locked out (b200-tcgen05 E3M2 x E2M1 -> fp16: products exact
    # in any window, a tiny c truncated, and a grid held; MMA-Sim RTX Blackwell f8f6f4
    # E2M1 x E4M3 -> f16: c added at the end, rounded toward zero, imitating its cut).
    outside = (
        hyp.get("grid.fraction_bits") is not None
        or not hyp["adder.accumulator_in_tree"]
        or hyp["accumulator.c_entry"] != "initial"
    )
    entries = (
        [{}, {"adder.accumulator_in_tree": True, "accumulator.c_entry": "initial"}]
        if outside
        else [{}]
    )
    windows = [
        {
            "adder.align_fraction_bits": bits,
            "adder.below_window": below,
            "adder.structure": "fused",
            **NO_GRID,
            **entry,
        }
        for bits in widths
        for below in SCHEMA["adder"]["below_window"].choices
        for entry in entries
    ]
    return (
        [{"adder.align_fraction_bits": None}]
        + windows
        + (_windows_with_sum_roundings(windows, hyp) if narrow else [])
    )


def _windows_with_sum_roundings(windows: Candidates, hyp: dict) -> Candidates:
    """Where a rounded tree sum is held, each window (of the width held, when one is) again
    with the sum's other roundings (the window probe offers them for outputs narrower than
    fp32): a sum rounded to nearest with no window imitates a cut window with the sum rounded
    toward zero under a narrow output, and neither key moves alone (b200-tcgen05-mxf4
    E2M1 x E2M1 -> fp16: an exact sum to 24 bits to nearest for 35 bits truncated and 24
    toward zero). Every width with a window held led a CI path's search
    astray (b200-tcgen05-mxf4nvf4-e8m0-block16: 1,651 -> 4,458 queries)."""
    if hyp["adder.sum_significant_bits"] is None:
        return []
    held = hyp["adder.align_fraction_bits"]
    return [
        {**window, "adder.sum_rounding": rounding}
        for rounding in DIRECTED_AND_NEAREST
        if rounding != hyp["adder.sum_rounding"]
        for window in windows
        if held is None or window["adder.align_fraction_bits"] == held
    ]


def _align_reference(ctx: Context, hyp: dict) -> Candidates:
    """Each reference with the window held or a bit wider or narrower: a product's leading bit
    is its exponent sum or one above, so a window decided under the other reference sits a bit
    off (tf32's 24-bit window from the exponent sums reads as 25 from the leading bits, and
    neither key moves alone)."""
    return [
        {"adder.align_reference": value, "adder.align_fraction_bits": window}
        for value in SCHEMA["adder"]["align_reference"].choices
        for window in _near_windows(hyp, 1)
    ]


def _sum_bits(ctx: Context, hyp: dict) -> Candidates:
    return [{"adder.sum_significant_bits": None}] + [
        {"adder.sum_significant_bits": bits, "adder.sum_rounding": rounding, **NO_GRID}
        for bits in range(1, _maximum("adder.sum_significant_bits") + 1)
        for rounding in DIRECTED_AND_NEAREST
    ]


def _carry(ctx: Context, hyp: dict) -> Candidates:
    if hyp.get("adder.align_fraction_bits") is None:
        return [{"adder.carry_bits": None}]
    return [{"adder.carry_bits": None}] + [
        {"adder.carry_bits": bits, "adder.adder_overflow": overflow}
        for bits in range(0, _maximum("adder.carry_bits") + 1)
        for overflow in SCHEMA["adder"]["adder_overflow"].choices
    ]


def interleaved_orders(k: int) -> list[tuple[int, ...]]:
    """Term orders that take runs of ``chunk`` positions with stride ``stride * chunk`` first
    (k mod 4 in {0, 1} first is chunk 2, stride 2), for every period up to k."""
    orders = []
    for chunk in (1, 2, 4, 8):
        for stride in (2, 4):
            period = chunk * stride
            while period <= k:
                order = tuple(sorted(range(period), key=lambda j: ((j // chunk) % stride, j)))
                if order not in orders:
                    orders.append(order)
                period *= 2
    return orders


def _tree_sizes(k: int) -> list[int]:
    """Every size up to 64, and the divisors of K beyond: the divisors of K first (a unit's
    trees mostly tile its K), then the others, each in ascending order. Where the rows tell a
    ragged split from whole trees apart only rarely (trees of 8 or 11 at K = 11: fp6 products
    span fewer binades than fp32 holds), the size tiling K is kept."""
    sizes = set(range(1, min(k, 64) + 1)) | {f for f in range(1, k + 1) if k % f == 0}
    return sorted(sizes, key=lambda f: (k % f != 0, f))


def _intervals(fused: int, k: int) -> list[int | None]:
    """No promotion, or promotion every fused * 2^j products (j >= 0) short of K, or only at
    the end (:func:`_at_end`)."""
    intervals, n = [None], fused
    while n < k:
        intervals.append(n)
        n *= 2
    return intervals + [_at_end(fused, k)]


def _at_end(fused: int, k: int) -> int:
    """The promotion interval that acts only at the end of K products: the smallest multiple
    of the tree size reaching K. The accumulator is then added to c rounded to nearest even, as
    a unit promoting every 128 products does when probed at K = 64."""
    return -(-k // fused) * fused


def _trees(ctx: Context, hyp: dict) -> Candidates:
    # Promotion rides along: a tree size is only seen right with the promotion interval it has.
    # Trees that restart at each block (no promotion): only a size that does not divide it
    # differs. Where K fits in one block they compute as the others, but a grid (one scale per
    # tree) admits only them: each comes right after its sibling, so that a grid held at
    # K = 11 keeps trees of 11 rather than the first size dividing the block.
    within = ctx.k <= ctx.block_size
    candidates = []
    for f in _tree_sizes(ctx.k):
        for n in _intervals(f, ctx.k):
            candidates.append(
                {
                    "adder.fused_terms": f,
                    "adder.term_order": None,
                    "accumulator.promotion_interval": n,
                    "adder.trees_in_blocks": False,
                }
            )
            if within and n is None and ctx.block_size % f:
                candidates.append({**candidates[-1], "adder.trees_in_blocks": True})
    candidates += [
        {
            "adder.fused_terms": f,
            "adder.term_order": None,
            "accumulator.promotion_interval": None,
            "adder.trees_in_blocks": True,
        }
        for f in _tree_sizes(ctx.k)
        if not within and ctx.block_size % f
    ]
    for order in interleaved_orders(ctx.k):
        candidates += [
            {
                "adder.fused_terms": f,
                "adder.term_order": list(order),
                "adder.trees_in_blocks": False,
            }
            for f in range(1, len(order))
            if len(order) % f == 0
        ]
    return candidates


def _c_entry(ctx: Context, hyp: dict) -> Candidates:
    """Where c enters; the values held first where a grid is held: the c entry rows read a
    grid (c outside exact trees) as c in an exact tree, and a grid dropped here is decided
    afresh by the grid probe each pass (see :func:`_grid`)."""
    entries = [{"accumulator.c_entry": "initial"}] + [
        {"accumulator.c_entry": "end", "accumulator.c_add_rounding": rounding}
        for rounding in DIRECTED_AND_NEAREST
    ]
    candidates = [
        {"adder.accumulator_in_tree": in_tree, **entry, **(NO_GRID if in_tree else {})}
        for in_tree in (True, False)
        for entry in entries
    ]
    return candidates if hyp.get("grid.fraction_bits") is None else _held_first(candidates, hyp)


#: Window widths the coarse probe tries: fp16/tf32 products up to fp32's significand and a little past.
COARSE_WINDOWS = range(10, 29)


def _coarse(ctx: Context, hyp: dict) -> Candidates:
    """Tree sizes (powers of two up to K), windows and the accumulator's rounding together."""
    return _coarse_with(
        ctx,
        [
            {"accumulator.rounding": rounding, "output.rounding": rounding}
            for rounding in ("nearest_even", "toward_zero")
        ],
    )


def _coarse_with(ctx: Context, roundings: Candidates) -> Candidates:
    """Each tree size with a null window, or 10..28 bits truncated or rounded to nearest even,
    or even and odd positions in windows of their own, truncated or floored, each with every
    rounding given. Parity windows are among them because products spanning far more than a
    window (an fp8 times an fp32) show them on nearly every row, so that no key decided one at
    a time fits until they are held (mi300 E5M2FNUZ x fp32 -> fp32)."""
    sizes = [f for f in (1 << j for j in range(ctx.k.bit_length())) if f <= ctx.k]
    sizes += [ctx.k] if ctx.k not in sizes else []  # one tree over an odd K (11 FP6 elements)
    windows = (
        [{"adder.align_fraction_bits": None}]
        + [
            {"adder.align_fraction_bits": bits, "adder.below_window": below, **NO_GRID}
            for bits in COARSE_WINDOWS
            for below in ("truncate", "nearest_even")
        ]
        + [
            {
                "adder.align_fraction_bits": bits,
                "adder.below_window": below,
                "adder.parity_windows": True,
                "adder.accumulator_in_tree": False,
                **NO_GRID,
            }
            for bits in COARSE_WINDOWS
            for below in ("truncate", "floor")
        ]
    )
    return [
        {
            "adder.fused_terms": f,
            "adder.term_order": None,
            "accumulator.promotion_interval": None,
            "adder.trees_in_blocks": False,
            **rounding,
            **window,
        }
        for rounding in roundings
        for window in windows
        for f in sizes
    ]


def _coarse_overflow(ctx: Context, hyp: dict) -> Candidates:
    """As :func:`_coarse`, the rounding toward zero taken with either overflow rule (the
    largest value or Inf). The tree, cancellation and ties rows of formats with 8-bit exponents (bf16, tf32)
    put products near 2^250, and wherever B and -B fall in different trees the accumulator
    overflows: under a rounding toward zero its overflow rule decides those rows, so a
    toward-zero datapath is seen right only with its own rule (a100's tf32 x bf16 -> fp32: 78
    of the coarse probe's 320 rows)."""
    return _coarse_with(
        ctx,
        [{"accumulator.rounding": "nearest_even", "output.rounding": "nearest_even"}]
        + [
            {
                "accumulator.rounding": "toward_zero",
                "output.rounding": "toward_zero",
                "accumulator.overflow": rule,
            }
            for rule in SCHEMA["accumulator"]["overflow"].choices
        ],
    )


def products_pass_fp32(ctx: Context) -> bool:
    """Whether the element pairs' products reach past fp32's range (bf16, tf32, fp32 elements):
    only there can the rows of :func:`_coarse_overflow` overflow the accumulator."""
    return ctx.span()[1] >= FP32_PAST_RANGE


#: The exponent of the smallest power of two past fp32's largest finite value.
FP32_PAST_RANGE = 128


def _overflows_held_first(hyp: dict) -> list[str]:
    """The accumulator overflow held, then the other (a rounding toward zero is seen right only
    with its own overflow: :func:`_accumulator_and_overflow`)."""
    held = hyp["accumulator.overflow"]
    return [held] + [value for value in SCHEMA["accumulator"]["overflow"].choices if value != held]


def _promotion(ctx: Context, hyp: dict) -> Candidates:
    fused = hyp["adder.fused_terms"]
    return [
        {"accumulator.promotion_interval": n}
        for n in (None, *range(fused, ctx.k, fused), _at_end(fused, ctx.k))
    ]


def _wider_c_formats(ctx: Context) -> list[str]:
    """The formats holding every value of the format c is asked in that the kernels read c
    in alike (fp16 c: fp32; none for fp32 or fp64 c)."""
    given = get_format(ctx.c_format)
    return [
        name
        for name in SCHEMA["inputs"]["c_format"].choices
        if name != given.name
        and kernel_c_dtype(name) == kernel_c_dtype(given.name)
        and get_format(name).exponent_bits >= given.exponent_bits
        and get_format(name).mantissa_bits >= given.mantissa_bits
    ]


def _c_format(ctx: Context, hyp: dict) -> Candidates:
    """The format c is asked in first, then the wider ones (:func:`_wider_c_formats`), each
    with the accumulator exponent held first and the other one after: c's format is seen only
    where a subnormal c aligns at its format's emin, which the accumulator exponent's own
    inputs (fp32 or output subnormals) cannot show when c is narrower."""
    given = get_format(ctx.c_format)
    wider = _wider_c_formats(ctx)
    if not wider:
        return [{"inputs.c_format": given.name}]
    held = hyp["adder.accumulator_exponent"]
    exponents = [held] + [
        value for value in SCHEMA["adder"]["accumulator_exponent"].choices if value != held
    ]
    return [
        {"inputs.c_format": name, "adder.accumulator_exponent": exponent}
        for name in (given.name, *wider)
        for exponent in exponents
    ]


def _zero_sign(ctx: Context, hyp: dict) -> Candidates:
    return [{"output.zero_sign": value} for value in SCHEMA["output"]["zero_sign"].choices]


def _overflow(ctx: Context, hyp: dict) -> Candidates:
    # The value held first: the accumulator probe decides the key too, and inputs that tell
    # nothing apart (a rounding to nearest, or promotion, held) must not undo its decision.
    return [{"accumulator.overflow": value} for value in _overflows_held_first(hyp)]


def _accumulator_exponent(ctx: Context, hyp: dict) -> Candidates:
    return [
        {"adder.accumulator_exponent": value}
        for value in SCHEMA["adder"]["accumulator_exponent"].choices
    ]


#: Zero-term exponents tried: from below fp32's smallest subnormal exponent to 2^20.
ZERO_TERM_EXPONENTS = range(-200, 21)


def _zero_term_exponent(ctx: Context, hyp: dict) -> Candidates:
    """No zero exponent or 2^n; where a tree sum rounded to some bits is held, each also with
    none: on tiny sums a rounded sum imitates a zero term pulling the reference up (the tree
    sum probe comes after this one), and a zero exponent kept beside a rounded sum that is not
    there cuts ordinary sums (MMA-Sim's Ampere bf16)."""
    values = [None, *ZERO_TERM_EXPONENTS]
    candidates = [{"adder.zero_term_exponent": n} for n in values]
    if hyp["adder.sum_significant_bits"] is not None:
        candidates += [
            {"adder.zero_term_exponent": n, "adder.sum_significant_bits": None} for n in values
        ]
    return candidates


#: Grid fraction bits tried (the schema allows up to 200): the smallest E5M2 x E5M2 product,
#: 2^-32, needs 32; 80 leaves room for a wider grid.
GRID_FRACTION_BITS = range(0, 81)


#: What a grid needs of the other keys (set with it, so that no earlier decision locks it out).
GRID_NEEDS = {
    "adder.accumulator_in_tree": False,
    "adder.align_fraction_bits": None,
    "adder.sum_significant_bits": None,
    "adder.term_order": None,
    "accumulator.promotion_interval": None,
    "accumulator.c_entry": "initial",
    "multiplier.product_fraction_bits": None,
}


def _grid(ctx: Context, hyp: dict) -> Candidates:
    """No grid, or n fraction bits with what a grid needs; a grid takes one scale per tree, so
    where the tree size held does not divide the block its trees restart at each block (a tree
    size decided before the grid, on rows that a narrow output rounds alike, would otherwise
    lock every grid out).

    Where a grid is held, each width moves ``accumulator_max_left_shift`` with it: the outputs
    depend on n only through the left shift less n (an accumulator passed through above the
    grid) and the right shift plus n (a zero sum's sign), and the grid reach probe, run after
    this one, decides the first. With the shift held, the grid probe's rows weighed the two
    against each other: under a directed rounding (where the left shift shows) a grid of E2M3
    products, exact on any grid of 6 bits or more, swung between two widths pass after pass.
    The grid reach probe's 1,024 rows and the scaled zeros' sweep of every scale exponent pin
    both sums to the place (fewer rows left them a place or two off, and a validation seldom
    meets the rows between)."""
    needs = dict(GRID_NEEDS)
    if ctx.block_size % hyp["adder.fused_terms"]:
        needs["adder.trees_in_blocks"] = True
    held = hyp.get("grid.fraction_bits")

    def reach(n: int) -> dict:
        if held is None:
            return {}
        shift = hyp["grid.accumulator_max_left_shift"] + n - held
        return {"grid.accumulator_max_left_shift": min(max(shift, 0), GRID_SHIFT_LIMIT)}

    return [{"grid.fraction_bits": None}] + [
        {"grid.fraction_bits": n, **needs, **reach(n)} for n in GRID_FRACTION_BITS
    ]


#: Accumulator shifts tried: 0 .. 160 places (past that, an fp32 accumulator meets no product).
GRID_SHIFTS = range(0, 161)
#: The largest left shift a grid width carries with it (:func:`_grid`): the schema's maximum.
GRID_SHIFT_LIMIT = SCHEMA["grid"]["accumulator_max_left_shift"].maximum


def _grid_shift(key: str) -> Callable[[Context, dict], Candidates]:
    """The schema's default first: past some shift (about 36 places above the grid under
    round-to-nearest) every larger one gives the same outputs, and the default is kept."""
    path = f"grid.{key}"

    def candidates(ctx: Context, hyp: dict) -> Candidates:
        default = SCHEMA["grid"][key].default
        if hyp.get("grid.fraction_bits") is None:
            return [{path: hyp.get(path, default)}]
        return [{path: default}] + [{path: n} for n in GRID_SHIFTS if n != default]

    return candidates


def _c_format_inputs(ctx: Context) -> Batch:
    """The c format probe's rows, none where it has nothing to decide."""
    if not _wider_c_formats(ctx):
        return ctx.empty(0)
    return _families(c_format_edge=128, accumulator_entry=32)(ctx)


def _zero_sign_inputs(ctx: Context) -> Batch:
    """Zero results, zero chains and corners, shuffled together."""
    return _families(zero_results=64, zero_chains=32, corners=32)(ctx)


# -- AMD matrix-core keys (pairwise rounded adds, product overflow, input zero sign, parity
# windows, the second alignment): each its own probe below.


def _structure(ctx: Context, hyp: dict) -> Candidates:
    """One fused pass per tree, or pairwise rounded adds over balanced trees of 2^j products
    (the tree size rides along: a pairwise tree is seen right only with its own size)."""
    sizes = [f for f in (1 << j for j in range(ctx.k.bit_length())) if f <= ctx.k]
    return [{"adder.structure": "fused"}] + [
        {
            "adder.structure": "pairwise_rounded",
            "adder.fused_terms": f,
            "adder.term_order": None,
            "accumulator.promotion_interval": None,
            "adder.trees_in_blocks": False,
            "accumulator.c_entry": "initial",
            **NO_GRID,
        }
        for f in sizes
    ]


def _overflow_exponent(ctx: Context, hyp: dict) -> Candidates:
    """No product overflow, or ±Inf from 2^n up, n past the largest finite value of a format a
    multiplier may write its product in (Context.overflow_boundaries: 16, 128, ...), of those
    the formats' products reach (null where none is)."""
    return [{"multiplier.overflow_exponent": None}] + [
        {"multiplier.overflow_exponent": n} for n in ctx.overflow_boundaries()
    ]


def _zero_signs(ctx: Context, hyp: dict) -> Candidates:
    """Zero inputs kept with the result's zero sign held (first: the zero sign probe decides it
    alone for such a unit, and a second opinion on other inputs would swing it pass by pass),
    or read as +0 with each rule for the sign of a zero result: a -0 input read as +0 and a
    result that is -0 under IEEE rules are told apart only together."""
    return [{"inputs.zero_sign": "keep", "output.zero_sign": hyp["output.zero_sign"]}] + [
        {"inputs.zero_sign": inputs, "output.zero_sign": output}
        for inputs in SCHEMA["inputs"]["zero_sign"].choices
        for output in SCHEMA["output"]["zero_sign"].choices
    ]


def _parity_windows(ctx: Context, hyp: dict) -> Candidates:
    """One window, or even and odd positions in windows of their own (summed toward -inf at
    the larger one's LSB), with each way bits below a window go but sticky."""
    if hyp["adder.align_fraction_bits"] is None:
        return [{"adder.parity_windows": False}]
    return [{"adder.parity_windows": False}] + [
        {
            "adder.parity_windows": True,
            "adder.below_window": below,
            "adder.accumulator_in_tree": False,
        }
        for below in SCHEMA["adder"]["below_window"].choices
        if below != "sticky"
    ]


def _second_alignment(ctx: Context, hyp: dict) -> Candidates:
    """No second alignment, or one of n + 1 bits with a far accumulator floored or dropped, and
    with it the window and how bits below it go (but sticky), for the window held or a bit off
    and any n, or for n the window held or a bit off and up to 16 bits narrower windows (only
    with a window: the key needs one). A window decided before a second alignment was held
    sits where it best imitated it: near its own width or near the second alignment's."""
    held = hyp["adder.align_fraction_bits"]
    if held is None:
        return [{"adder.second_alignment_bits": None}]
    none = [{"adder.second_alignment_bits": None}]
    if hyp["adder.second_alignment_bits"] is not None and not hyp["adder.accumulator_in_tree"]:
        # A second alignment held took the accumulator out of the tree, and the c entry probe
        # cannot put it back while one is held (no config has both): null brings it back too.
        none.append({"adder.second_alignment_bits": None, "adder.accumulator_in_tree": True})
    widest = _maximum("adder.second_alignment_bits")
    pairs = [(n, window) for n in range(widest + 1) for window in _near_windows(hyp, 1)]
    pairs += [
        (n, window)
        for n in _near_windows(hyp, 1)
        if n <= widest
        for window in range(max(0, held - 16), held - 1)
    ]
    return none + [
        {
            "adder.second_alignment_bits": n,
            "adder.far_accumulator": far,
            "adder.align_fraction_bits": window,
            "adder.below_window": below,
            "adder.accumulator_in_tree": False,
            "adder.sum_significant_bits": None,
            "accumulator.c_entry": "initial",
            "accumulator.promotion_interval": None,
        }
        for n, window in pairs
        for far in SCHEMA["adder"]["far_accumulator"].choices
        for below in SCHEMA["adder"]["below_window"].choices
        if below != "sticky"
    ]


def _special_accumulator(ctx: Context, hyp: dict) -> Candidates:
    """A NaN or Inf accumulator kept to the output (null), or aligned at exponent e by a second
    alignment that drops far accumulators, so that a tree whose reference reaches
    e + align_fraction_bits + 2 drops it: every e the products' exponents tell apart (only with
    a window; the key needs one). Where no such second alignment is held, each e comes with
    one of the window's width: a NaN against ±Inf shows the pair where an output too narrow
    for the second alignment's own rows shows nothing of it (the second alignment probe then
    settles its width)."""
    window = hyp["adder.align_fraction_bits"]
    if window is None:
        return [{"adder.special_accumulator_exponent": None}]
    low, high = ctx.span()
    held = hyp["adder.second_alignment_bits"] is not None and hyp["adder.far_accumulator"] == "zero"
    needs = (
        {}
        if held
        else {
            "adder.second_alignment_bits": min(window, _maximum("adder.second_alignment_bits")),
            "adder.far_accumulator": "zero",
            "adder.accumulator_in_tree": False,
            "adder.sum_significant_bits": None,
            "accumulator.c_entry": "initial",
            "accumulator.promotion_interval": None,
        }
    )
    return [{"adder.special_accumulator_exponent": None}] + [
        {"adder.special_accumulator_exponent": e, **needs}
        for e in range(low - window - 3, high - window)
    ]


def _families(**counts: int) -> Callable[[Context], Batch]:
    """The families' rows shuffled together, so that each chunk the engine predicts mixes them."""

    def draw(ctx: Context) -> Batch:
        batch = ctx.fit_c(
            Batch.join(getattr(ctx, family)(count) for family, count in counts.items())
        )
        return batch.take(ctx.rng.permutation(len(batch)))

    return draw


def _in_turn(**counts: int) -> Callable[[Context], Batch]:
    """The families' rows one family after another."""

    def draw(ctx: Context) -> Batch:
        return Batch.join(
            ctx.fit_c(getattr(ctx, family)(count)) for family, count in counts.items()
        )

    return draw


def _then(first: Callable[[Context], Batch], **last: int) -> Callable[[Context], Batch]:
    """``first``'s rows, then each family of ``last`` in turn: rows the engine reaches only while
    the earlier ones leave candidates apart."""

    def draw(ctx: Context) -> Batch:
        return Batch.join([first(ctx), _in_turn(**last)(ctx)])

    return draw


PROBES: tuple[Probe, ...] = (
    # First: every other family writes scale codes in the format held, which this one decides
    # from codes both formats read as finite.
    Probe(
        "scale format",
        ("inputs.scales", "inputs.scale_format"),
        _all_scales,
        _families(scale_formats=192),
        "whether scales matter, where they enter, and whether they are E8M0 powers of two or UE4M3",
    ),
    # Then: every family's exact-zero rows read the sign of zero.
    Probe(
        "zero sign",
        ("output.zero_sign",),
        _zero_sign,
        _zero_sign_inputs,
        "the sign of an exact-zero or underflowed result: IEEE (of the whole sum or of each step) or always +0",
    ),
    Probe(
        "scales",
        ("inputs.scales", "adder.align_fraction_bits"),
        _scales,
        _families(scales=96, realistic=48, corners=48, groups=96),
        "whether scales matter, and whether they enter the products, the tree sums or the group sums",
    ),
    Probe(
        "input subnormals",
        ("inputs.subnormals",),
        _input_subnormals,
        _families(corners=96, cancellation=48),
        "subnormal elements read as themselves or as zero",
    ),
    # Once the late probes run (rows only under an output narrower than fp32): a tiny c off an
    # output value or tie, which shows c's tree where nothing else does; in early passes these
    # rows can lead a first search away from the unit (h100's E4M3 x E5M2 -> fp16 path).
    Probe(
        "trees",
        ("adder.fused_terms", "adder.term_order", "accumulator.promotion_interval"),
        _trees,
        _families(trees=384, accumulator_entry=64, realistic=32),
        "how many products share a tree and which positions enter together",
        settled=_in_turn(spread_ties=128),
    ),
    # Last (rows only under an output narrower than fp32): products on an output tie and a tiny
    # c, which alone passes the window where the products span too few binades (b200-tcgen05
    # E2M3 x E2M3 -> fp16).
    Probe(
        "window",
        ("adder.align_fraction_bits", "adder.below_window"),
        _window,
        _then(_families(cancellation=256, ties=128, trees=64), window_ties=64),
        "alignment window width and how bits below it go: cancellation leaves terms 0..60 binades down",
    ),
    Probe(
        "parity windows",
        ("adder.parity_windows", "adder.below_window"),
        _parity_windows,
        _families(cancellation=192, ties=64, realistic=64),
        "even and odd positions aligned in windows of their own: a small negative term floored, not truncated",
        late=True,
        strict=True,
    ),
    Probe(
        "groups",
        ("adder.group_terms", "adder.align_fraction_bits"),
        _groups,
        _families(groups=256, cancellation=64, realistic=32),
        "how many products a group sums exactly before its scales: a window anchored above cuts group sums",
    ),
    # Last, in turn: its output ties (under an fp16 output an
    # exact accumulator and an fp32 one rounding toward -inf give the same bits on every other
    # row: kulisch INT8 x E2M1) and, where the output is narrower than fp32 (which rounds fp32
    # ties away), ties whose rounding a later product's cancellation carries into the output,
    # and c rounded with a large first tree that a later one cancels.
    Probe(
        "accumulator",
        ("accumulator.format", "accumulator.rounding", "accumulator.overflow", "output.rounding"),
        _accumulator_and_overflow,
        _then(
            _families(ties=256, realistic=64, uniform=64),
            output_ties=64,
            cancelled_ties=64,
            cancelled_c=64,
        ),
        "the accumulator's format, rounding and overflow: c and terms at fp32/fp16/bf16 ties and sticky points",
    ),
    Probe(
        "output",
        ("output.rounding", "output.subnormals", "accumulator.subnormals"),
        _output,
        _families(ties=128, corners=128, uniform=64, flushed_results=64),
        "output rounding and subnormal flushing of the accumulator and the output",
    ),
    Probe(
        "input zero sign",
        ("inputs.zero_sign", "output.zero_sign"),
        _zero_signs,
        _families(flushed_results=128, zero_results=64, corners=32),
        "zero and flushed inputs read with their sign or as +0, with the sign of a zero result",
    ),
    Probe(
        "subnormal products",
        ("inputs.subnormals",),
        _input_subnormals,
        _families(subnormal_products=64),
        "a subnormal element times a large one: read as itself (a normal product) or as zero",
    ),
    Probe(
        "accumulator overflow",
        ("accumulator.overflow",),
        _overflow,
        _families(overflow=96, corners=32),
        "a sum past the accumulator's range under a rounding toward zero: the largest value or Inf",
    ),
    Probe(
        "product overflow",
        ("multiplier.overflow_exponent",),
        _overflow_exponent,
        _families(product_overflow=192),
        "products from 2^n up as ±Inf: a product beside its negation or a c of the other sign",
        strict=True,
    ),
    Probe(
        "products",
        ("multiplier.product_fraction_bits",),
        _product_bits,
        _families(cancellation=192, ties=64),
        "product precision: a product and its near negation leave the product's low bits",
    ),
    Probe(
        "alignment reference",
        ("adder.align_reference", "adder.align_fraction_bits"),
        _align_reference,
        _families(cancellation=128, accumulator_entry=64),
        "the exponent the window hangs from: the largest exponent sum or the largest product's leading bit",
    ),
    Probe(
        "accumulator exponent",
        ("adder.accumulator_exponent",),
        _accumulator_exponent,
        _families(subnormal_accumulator=128, accumulator_entry=32),
        "the exponent a subnormal accumulator aligns with in the tree: its leading bit or the format's emin",
    ),
    Probe(
        "c format",
        ("inputs.c_format", "adder.accumulator_exponent"),
        _c_format,
        _c_format_inputs,
        "the format c is read in when it is asked in a narrower one: the emin a subnormal c aligns at",
    ),
    Probe(
        "zero terms",
        ("adder.zero_term_exponent", "adder.sum_significant_bits"),
        _zero_term_exponent,
        _families(tiny_terms=256, zero_results=32, zero_anchor=128),
        "whether zero products and a zero accumulator pull the alignment reference up to 2^n",
    ),
    # Its sums cancelled by c come last: bf16 and fp16 outputs show a rounded tree
    # sum on few other rows (h100-fp8-promoted E5M2 x E4M3 -> bf16: none of the others).
    Probe(
        "tree sum",
        ("adder.sum_significant_bits", "adder.sum_rounding"),
        _sum_bits,
        _then(_families(ties=192, cancellation=128, uniform=64), sum_cancel=64),
        "rounding of the tree sum before the accumulator",
    ),
    Probe(
        "adder width",
        ("adder.carry_bits", "adder.adder_overflow"),
        _carry,
        _families(corners=128, realistic=64),
        "carry bits of the tree adder and what happens past them",
    ),
    # Last (rows only under an output narrower than fp32): c rounded with a large first tree
    # that a later one cancels.
    Probe(
        "c entry",
        ("adder.accumulator_in_tree", "accumulator.c_entry", "accumulator.c_add_rounding"),
        _c_entry,
        _then(_families(accumulator_entry=256, ties=64, trees=64), cancelled_c=64),
        "where c enters: in the first tree, added exactly after it, or at the end with its own rounding",
    ),
    Probe(
        "second alignment",
        ("adder.second_alignment_bits", "adder.far_accumulator", "adder.accumulator_in_tree"),
        _second_alignment,
        _then(
            _families(accumulator_entry=192, alignment_ties=96, ties=64, cancellation=64),
            cancelled_ties=64,
        ),
        "the tree sum and c aligned again at the larger exponent, both floored, the sum cut to n + 1 bits",
        late=True,
    ),
    Probe(
        "special accumulator",
        (
            "adder.special_accumulator_exponent",
            "adder.second_alignment_bits",
            "adder.far_accumulator",
        ),
        _special_accumulator,
        _families(special_accumulator=128),
        "a NaN or Inf c or running sum, dropped by a second alignment from a tree of large products on",
        late=True,
    ),
    # After the fused keys: pairwise rounded adds are weighed against the best fused datapath
    # found, not against exact trees that a window or a second alignment would still refine.
    Probe(
        "structure",
        ("adder.structure", "adder.fused_terms"),
        _structure,
        _families(pair_trees=192, trees=96, cancellation=64, ties=64, realistic=32),
        "one fused pass per tree, or each product rounded and summed by pairwise rounded adds",
        late=True,
        strict=True,
    ),
    # Last: zero products under scales that put the
    # grid's last place anywhere.
    Probe(
        "grid",
        (
            "grid.fraction_bits",
            "grid.accumulator_max_left_shift",
            "adder.accumulator_in_tree",
            "adder.align_fraction_bits",
            "adder.sum_significant_bits",
            "adder.term_order",
            "accumulator.promotion_interval",
            "accumulator.c_entry",
            "multiplier.product_fraction_bits",
        ),
        _grid,
        _then(
            _families(grid=128, zero_results=64, corners=384, ties=64, cancellation=64),
            scaled_zeros=151,
        ),
        "a fixed-point grid summing each tree's exact products, and its fraction bits",
    ),
    Probe(
        "grid reach",
        ("grid.accumulator_max_left_shift",),
        _grid_shift("accumulator_max_left_shift"),
        _families(grid=1024),
        "how far above the grid an accumulator passes through unchanged",
    ),
    Probe(
        "grid zero sum",
        ("grid.accumulator_max_right_shift",),
        _grid_shift("accumulator_max_right_shift"),
        _families(grid=256),
        "how far below the grid an accumulator passes through when the products sum to zero",
    ),
    Probe(
        "promotion",
        ("accumulator.promotion_interval",),
        _promotion,
        _families(trees=128, accumulator_entry=64, realistic=32),
        "an outer fp32 accumulator taking the inner one every n products",
    ),
)

#: A second start, tried when the search from the schema's defaults ends with mismatches: each of
#: these keys is seldom seen right while the others are wrong (a 24-bit truncating window with a
#: rounding toward zero, say, from an exact tree and nearest-even), so they are decided together
#: on realistic data before the probes of :data:`PROBES` run again.
COARSE = Probe(
    "coarse",
    (
        "adder.fused_terms",
        "adder.align_fraction_bits",
        "adder.below_window",
        "accumulator.rounding",
        "output.rounding",
    ),
    _coarse,
    _families(realistic=128, ties=64, cancellation=64, trees=64),
    "tree size, window and rounding together: a second start for the search",
)

#: A third start where the coarse one still ends with mismatches and the products pass fp32's
#: range (:func:`products_pass_fp32`): the coarse probe with the overflow rule beside a
#: rounding toward zero. Named as the coarse probe: it takes the coarse rows, drawn once.
COARSE_OVERFLOW = Probe(
    "coarse",
    (*COARSE.keys, "accumulator.overflow"),
    _coarse_overflow,
    COARSE.inputs,
    "tree size, window, rounding and overflow rule together: a third start for the search",
)
