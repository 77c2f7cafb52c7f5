"""Named semantic options of MX block quantization, and the profiles that bundle them.

Every point where public MX implementations disagree is one field of
:class:`QuantOptions`. A *profile* is a named set of values reproducing one library; see
``docs/profiles.md`` for each value's source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import MxsimError, UnknownNameError
from ..formats.rounding import OVERFLOW_POLICIES, ROUNDING_MODES

SCALE_RULES = ("floor", "ceil", "even", "rceil")
EXPONENT_SOURCES = ("bits", "field", "log2")
NONFINITE_POLICIES = ("nan_block", "propagate", "inf_scale_max", "inf_field", "raise")
ZERO_SIGNS = ("code", "positive", "input", "input_if_underflow", "input_unless_underflow")
SCALE_UNDERFLOW_POLICIES = ("clamp", "unclamped", "unclamped_eps")
SCALE_OVERFLOW_POLICIES = ("nan", "clamp")


@dataclass(frozen=True)
class QuantOptions:
    """How a block's shared scale and its elements are computed.

    Attributes:
        scale_rule: shared exponent ``X = E - emax`` with ``E`` from the block's amax
            ``= m * 2^e`` (1 <= m < 2): ``floor``: E = e (OCP v1.0). ``ceil``: E = e + 1
            iff m > 1. ``even``: E = e + 1 iff m >= 2 - 2^-(p+1), p = ``even_fraction_bits``
            (amax rounded half-up to the element precision carries). ``rceil``: E = e + 1
            iff m > max_finite / 2^emax (no element clips).
        exponent_source: how ``e`` is read. ``bits``: from the exponent bits, exact for every
            input including subnormals. ``field``: the input's biased exponent field minus its
            bias, so a subnormal amax reads as -bias (-127 for float32): Quark ONNX, torchao.
            ``log2``: for floor/ceil, floor/ceil of ``log2(amax)`` rounded to the input's
            precision — the float-log2 trap of microxcaling's Python path, Quark torch
            floor/ceil and gfloat (float32 7.9999995 -> e = 3). For rceil, ``log2`` means
            X = ceil(log2(amax / max_finite)) with the quotient and the log2 each rounded to
            the input's precision (torchao's eager RCEIL; a quotient that underflows to 0
            gives X = -150). even always uses bits.
        element_rounding: rounding of each scaled element (a mode of ROUNDING_MODES).
        element_overflow: ``saturate`` (clip to ±max_finite), ``inf_nan`` or ``inf`` (mxsim.formats.rounding).
        nonfinite: a NaN or ±Inf in a block. ``nan_block``: scale 0xFF, the whole block
            decodes to NaN. ``propagate``: NaN/Inf are ignored for amax; NaN elements get
            the element's NaN code; :func:`fake_quantize` returns NaN and ±Inf elements
            unchanged (Quark ONNX). ``inf_scale_max``: NaN makes a NaN block; Inf makes
            X = 127 (log2(Inf) clamped), the Inf element saturates and the rest mostly flush
            (Quark even, gfloat, torchao RCEIL). ``inf_field``: NaN makes a NaN block; Inf
            reads as its exponent field, amax = 2^128 for float32, so X = 128 - emax and the
            Inf element saturates (torchao FLOOR). ``raise``. Under the ``even`` rule an amax
            that rounds past the input's largest binade (to its Inf pattern) counts as an Inf
            (every policy but ``propagate``; ``raise`` makes that block NaN).
        scale_underflow: ``clamp`` keeps X >= -127 (E8M0's smallest). ``unclamped`` lets X go
            lower (Quark ONNX, Quark floor/ceil). ``unclamped_eps``: unclamped, but X < -149
            (2^X underflows float32) becomes X = -23 (float32 eps; Quark floor/ceil).
            Only :func:`fake_quantize` can hold X < -127.
        scale_overflow: X > 127: ``nan`` (scale 0xFF) or ``clamp`` to 127.
        int8_minus_two: whether MX INT8 may produce code 0x80 (-2.0 × scale).
        int8_min_step_exponent: None, or k: MX INT8's step 2^(X-6) is raised to at least
            2^k by raising X (Quark torch clamps its affine scale to float32's smallest
            normal, k = -126).
        min_scale_element_exponent: None, or k: blocks whose scale is 2^-127 (code 0x00)
            encode their elements from x · 2^-k while the scale stays 2^-127 (torchao: -126
            from its clamp of the float scale to 2^-126, 0 from RCEIL's reciprocal 1.0).
        even_fraction_bits: overrides of p in the ``even`` rule, as (format name, p) pairs;
            by default p is the element's fraction bits in its top binade (3 for fp8_e4m3,
            6 for int8). Quark uses 8 for int8.
        zero_signs: the sign of a zero result in :func:`fake_quantize`'s float output, as
            (format name, rule) pairs; unlisted formats use ``code``. ``code``: the element
            code's (a sign-magnitude format keeps the input's sign, INT8 gives +0).
            ``positive``: +0. ``input``: the input's sign. ``input_if_underflow``: the
            input's sign where |x| · 2^-X is at most 2^-150 (already a float32 zero), else +0
            (Quark ONNX MXINT8 with half-even rounding, whose ``py3_round`` returns +0).
            ``input_unless_underflow``: the input's sign where x divided by the element's
            step 2^(X-p) (p the fraction bits of the format's top binade, 6 for INT8) is a
            nonzero float32, |x| · 2^(p-X) > 2^-150, else +0 (Brevitas' MX INT8, whose
            x / step + 0.0 turns an input -0, and a quotient that underflowed, into +0).
            Codes are not affected.
        seed: seed for stochastic element rounding.

    An all-zero block gets X = -127 (code 0x00), as torchao and gfloat store it; libraries
    that do not expose the scale differ only invisibly (see docs/profiles.md).
    """

    scale_rule: str = "floor"
    exponent_source: str = "bits"
    element_rounding: str = "nearest_even"
    element_overflow: str = "saturate"
    nonfinite: str = "nan_block"
    scale_underflow: str = "clamp"
    scale_overflow: str = "nan"
    int8_minus_two: bool = True
    even_fraction_bits: tuple[tuple[str, int], ...] = ()
    int8_min_step_exponent: int | None = None
    min_scale_element_exponent: int | None = None
    zero_signs: tuple[tuple[str, str], ...] = ()
    seed: int = 0

    def __post_init__(self):
        choices = {
            "scale_rule": SCALE_RULES,
            "exponent_source": EXPONENT_SOURCES,
            "element_rounding": ROUNDING_MODES,
            "element_overflow": OVERFLOW_POLICIES,
            "nonfinite": NONFINITE_POLICIES,
            "scale_underflow": SCALE_UNDERFLOW_POLICIES,
            "scale_overflow": SCALE_OVERFLOW_POLICIES,
        }
        for name, accepted in choices.items():
            if not isinstance(getattr(self, name), str) or getattr(self, name) not in accepted:
                raise UnknownNameError(f"value for option {name}", getattr(self, name), accepted)
        if not isinstance(self.int8_minus_two, bool):
            raise MxsimError("option int8_minus_two must be True or False")
        pairs = self.even_fraction_bits
        if not isinstance(pairs, tuple) or not all(
            isinstance(p, tuple)
            and len(p) == 2
            and isinstance(p[0], str)
            and isinstance(p[1], int)
            and 0 <= p[1] <= 50
            for p in pairs
        ):
            raise MxsimError(
                "option even_fraction_bits must be a tuple of (format name, bits 0..50) pairs"
            )
        for name in ("int8_min_step_exponent", "min_scale_element_exponent"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not -1000 < value < 1000
            ):
                raise MxsimError(f"option {name} must be None or an integer exponent")
        pairs = self.zero_signs
        if not isinstance(pairs, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in pairs
        ):
            raise MxsimError("option zero_signs must be a tuple of (format name, rule) pairs")
        for _, rule in pairs:
            if rule not in ZERO_SIGNS:
                raise UnknownNameError("zero sign rule", rule, ZERO_SIGNS)
        if (
            not isinstance(self.seed, int)
            or isinstance(self.seed, bool)
            or not 0 <= self.seed < 1 << 63
        ):
            raise MxsimError(f"option seed must be an integer 0..2**63-1, got {self.seed!r}")


# Each value's source is in docs/profiles.md.
_QUARK_FP_ELEMENTS = ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1")
# Quark's C++ element rounding (fake_quantize_element) returns an unsigned 0; torch casts keep the sign.
_QUARK_TORCH_ZERO_SIGNS = tuple((name, "positive") for name in _QUARK_FP_ELEMENTS[2:])
_QUARK_TORCH: dict[str, Any] = dict(
    int8_minus_two=False, int8_min_step_exponent=-126, zero_signs=_QUARK_TORCH_ZERO_SIGNS
)

PROFILES: dict[str, QuantOptions] = {
    # OCP MX v1.0 as written: floor from exact exponent bits, RNE, saturating elements.
    "ocp": QuantOptions(),
    # microsoft/microxcaling, default MxSpecs, Python path: float log2 in the input dtype,
    # ties away from zero, MXINT8 clamped to ±127/64, NaN/Inf -> NaN block.
    "microxcaling": QuantOptions(
        exponent_source="log2", element_rounding="nearest_away", int8_minus_two=False
    ),
    # AMD Quark torch fake_quantize_mx, default scale_calculation_mode="even" (bit trick).
    "quark": QuantOptions(
        scale_rule="even",
        nonfinite="inf_scale_max",
        scale_overflow="clamp",
        even_fraction_bits=(("int8", 8),),
        **_QUARK_TORCH,
    ),
    # Quark torch floor / ceil modes: float log2 in the input dtype, no clamp, eps fallback.
    "quark-floor": QuantOptions(
        exponent_source="log2", scale_underflow="unclamped_eps", **_QUARK_TORCH
    ),
    "quark-ceil": QuantOptions(
        scale_rule="ceil", exponent_source="log2", scale_underflow="unclamped_eps", **_QUARK_TORCH
    ),
    # Quark ONNX MXQuantizeDequantize (CPU runtime): exponent field, unclamped, NaN/Inf passed
    # through, MXINT8 ties to even (rounding_mode 2, as Quark's configs set it).
    "quark-onnx": QuantOptions(
        exponent_source="field",
        nonfinite="propagate",
        scale_underflow="unclamped",
        zero_signs=tuple((name, "positive") for name in _QUARK_FP_ELEMENTS)
        + (("int8", "input_if_underflow"),),
    ),
    # torchao prototype mx_formats to_mx (0.18, eager): FLOOR (default) from exponent bits,
    # Inf read as 2^128, code-0x00 blocks quantized against 2^-126.
    "torchao": QuantOptions(
        exponent_source="field", nonfinite="inf_field", min_scale_element_exponent=-126
    ),
    # torchao RCEIL, eager fallback: ceil(float32 log2(amax / max)), Inf -> 0xFE, code-0x00 blocks unscaled.
    "torchao-rceil": QuantOptions(
        scale_rule="rceil",
        exponent_source="log2",
        nonfinite="inf_scale_max",
        min_scale_element_exponent=0,
    ),
    # gfloat quantize_block + compute_scale_amax: float log2, Inf -> scale 2^127, X clipped to 127.
    "gfloat": QuantOptions(
        exponent_source="log2", nonfinite="inf_scale_max", scale_overflow="clamp"
    ),
}


def profiles_markdown() -> str:
    """The PROFILES table as Markdown (docs/profiles.md embeds it verbatim)."""
    names = list(PROFILES)
    lines = [
        "| option | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for field in dataclasses.fields(QuantOptions):
        if field.name == "seed":
            continue
        cells = []
        for name in names:
            value = getattr(PROFILES[name], field.name)
            if isinstance(value, tuple):  # (format name, value) pairs
                value = ", ".join(f"{key}={item}" for key, item in value)
            cells.append(f"`{value}`" if value != "" else "—")
        lines.append(f"| {field.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def resolve_options(profile: str = "ocp", **overrides) -> QuantOptions:
    """The options of ``profile`` with ``overrides`` applied; unknown names list the valid ones."""
    if not isinstance(profile, str) or profile not in PROFILES:
        raise UnknownNameError("profile", profile, PROFILES)
    if not overrides:  # the profile itself (frozen): no copy, no re-validation per call
        return PROFILES[profile]
    fields = {f.name for f in dataclasses.fields(QuantOptions)}
    for key in overrides:
        if key not in fields:
            raise UnknownNameError("quantization option", key, fields)
    return dataclasses.replace(PROFILES[profile], **overrides)
