"""SystemVerilog of one configured dot-product unit, generated from its resolved parameters.

:func:`generate_unit` turns a hardware config and one (A, B) element-format pair into a
:class:`RtlUnit`: a top module ``<name>`` with a documented port list (operands packed as the
golden vectors pack them, docs/golden.md), per-format decode modules and the generic stages of
``mxsim_rtl_lib.sv``, wired tree by tree as docs/hwconfig.md's seven steps describe the unit.
Everything comes from the parameters' values (widths, windows, modes); nothing from a config's
name. A parameter value the generator does not build is refused (:data:`COVERED`, one
``ConfigError`` naming the key).

Semantics follow docs/hwconfig.md exactly (the RTL is shown equal to ``mxsim.dot`` on golden
vectors by tests/test_rtl_*.py); the design choices where hardware has freedom:

* element decode is a table of every code (formats of at most TABLE_BITS bits), so any
  element format of the format table decodes the same way, subnormal flushing and zero signs
  included; a wider IEEE-shaped format (fp16, bf16, tf32, fp32, fp64) decodes by its fields
  to the same outputs; UE4M3 and E8M0 scales of ``scales: group_sum`` decode by a table too;
* an exact tree (no window) sums its products on a fixed-point grid spanning the formats'
  exponent range (and the E8M0 scale exponents' when its products lie in several blocks);
  its sum meets the accumulator in a two-term adder that jams what falls below its window
  into a sticky bit (exact for rounding, see ``mxr_add_round``);
* a windowed tree aligns every term (a product, or a group's exact sum times its scales) to
  ``2^(R-F)`` as ``below_window`` says and adds them in a register of ``carry_bits`` (exact
  width when null).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from ..datapath import DatapathParams, load_hwconfig
from ..datapath.config import HardwareConfig
from ..datapath.reference import tree_positions
from ..datapath.schema import keys, param_field
from ..errors import ArgumentError, ConfigError
from ..formats import get_format
from ..formats.bits import floor_log2
from ..formats.reference import decode_reference

LIBRARY = Path(__file__).with_name("mxsim_rtl_lib.sv")
EXW = 16  # exponent bus width: every exponent of a covered unit lies within +-2^15
MAX_K = 4096  # elements per dot product a generated unit may take
TABLE_BITS = 9  # element formats of at most this many bits decode by a table of every code
E8M0_EXPONENTS = (-127, 127)  # the exponents of the finite E8M0 scale codes 0..254
FP32_SHAPE = (8, 23)  # (EB, MB) of the outer accumulator of promotion_interval
MODES = {
    "nearest_even": 0,
    "nearest_away": 1,
    "toward_zero": 2,
    "toward_positive": 3,
    "toward_negative": 4,
    "nearest_toward_positive": 5,
}
WINDOW_MODES = {"truncate": 0, "floor": 1, "nearest_even": 2, "sticky": 3}
IEEE_FORMATS = ("fp64", "fp32", "fp16", "bf16")  # accumulator, output and c formats it builds


def _any(value, params) -> bool:
    return True


def _only(*accepted):
    def accepts(value, params) -> bool:
        return value in accepted

    accepts.accepted = accepted
    return accepts


#: For each DatapathParams field: which of its values the generator builds (given the unit's
#: other values). A key missing here is refused whatever its value.
COVERED = {
    "block_size": _any,
    # group sums are built as the terms of a windowed tree
    "scales": lambda v, p: (
        v in ("none", "products")
        or (v == "group_sum" and p.align_fraction_bits is not None)
        # (the loader refuses block_sum with the grid keys: a grid takes products' scales)
        or (v == "block_sum" and p.grid_fraction_bits is None)
    ),
    "scale_format": _any,
    "input_subnormals": _any,
    "c_format": _only(*IEEE_FORMATS),
    "same_format": _any,
    "input_zero_sign": _any,
    "product_fraction_bits": _any,
    "product_overflow_exponent": _any,
    "fused_terms": _any,
    "structure": _any,  # (the loader keeps pairwise adds to IEEE formats, c initial)
    "term_order": _any,
    "trees_in_blocks": _any,
    "group_terms": _any,
    "accumulator_in_tree": _any,
    # leading_bit: the products' own leading bits (group-sum terms: not built)
    "align_reference": lambda v, p: v == "exponent_sum" or p.scales != "group_sum",
    "align_fraction_bits": _any,
    "below_window": _any,
    "carry_bits": _any,
    "adder_overflow": _any,
    "sum_significant_bits": _any,
    "sum_rounding": _any,
    "parity_windows": _any,  # (the loader keeps the accumulator out of the tree)
    # a second alignment of the tree sum and the accumulator (outside the tree, a window)
    "second_alignment_bits": lambda v, p: (
        v is None
        or (
            not p.accumulator_in_tree
            and p.align_fraction_bits is not None
            and p.accumulator_format in IEEE_FORMATS
        )
    ),
    "far_accumulator": _any,  # read only with second_alignment_bits
    "special_accumulator_exponent": _any,  # (read by the second alignment only)
    "accumulator_exponent": _any,
    "zero_term_exponent": _any,
    "accumulator_format": _only(*IEEE_FORMATS, "exact"),
    "accumulator_rounding": _any,
    "accumulator_subnormals": _any,
    "c_entry": _any,
    "c_add_rounding": _any,
    "accumulator_overflow": _any,
    # the outer fp32 accumulator starts as c (an fp64 c: its first add reads 64 bits)
    "promotion_interval": lambda v, p: v is None or p.accumulator_format in IEEE_FORMATS,
    "grid_fraction_bits": _any,
    "grid_max_left_shift": _any,
    "grid_max_right_shift": _any,
    "output_format": _only(*IEEE_FORMATS),
    "output_rounding": _any,
    "output_subnormals": _any,
    "output_zero_sign": _any,
}


def check_covered(params: DatapathParams, source: str) -> None:
    """Raise ConfigError naming the first key whose value the generator does not build."""
    for section, name, key in keys():
        fieldname = param_field(name, key)
        if fieldname is None:
            continue
        value = getattr(params, fieldname)
        accepts = COVERED.get(fieldname)
        if accepts is None or not accepts(value, params):
            shown = (
                "null"
                if value is None
                else str(value).lower()
                if isinstance(value, bool)
                else value
            )
            accepted = getattr(accepts, "accepted", None)
            hint = (
                f" (built: {', '.join('null' if v is None else str(v) for v in accepted)})"
                if accepted
                else ""
            )
            raise ConfigError(
                source, f"{section}.{name}", f"{shown} is not covered by the RTL generator{hint}"
            )
    for key, operand in (
        ("inputs.a_formats", params.a_format),
        ("inputs.b_formats", params.b_format),
    ):
        fmt = get_format(operand)
        if fmt.bits > TABLE_BITS and not _ieee_shaped(fmt):
            raise ConfigError(
                source,
                key,
                f"element format {fmt.name} ({fmt.bits} bits) is not covered "
                f"by the RTL generator (elements of at most {TABLE_BITS} bits, or IEEE-shaped "
                "wider ones)",
            )


def _ieee_shaped(fmt) -> bool:
    """A sign-magnitude float with IEEE specials (all-ones exponent: Inf, NaN): decoded by
    its fields rather than by a table of every code."""
    return (
        fmt.specials == "ieee"
        and fmt.exponent_bits > 0
        and fmt.signed
        and not fmt.twos_complement
        and not fmt.scale_bits
        and fmt.bits == 1 + fmt.exponent_bits + fmt.mantissa_bits + fmt.padding_bits
    )


# --- element decode tables ----------------------------------------------------------------------


@dataclass(frozen=True)
class ElementDecode:
    """One element format's decode as the datapath reads it (docs/hwconfig.md step 1): per
    code (nan, inf, zero, sign, alignment exponent, significand), value = sig * 2^(exp - frac)."""

    name: str
    bits: int
    frac: int  # fraction bits of sig
    emin: int  # smallest alignment exponent
    emax: int
    rows: tuple  # per code: (nan, inf, zero, sign, exponent, sig); empty for a decode by fields
    # a decode by fields (formats wider than 8 bits): (exponent bits, mantissa bits, bias,
    # padding bits, subnormals flushed, zeros positive)
    fields: tuple | None = None

    @property
    def sig_bits(self) -> int:
        return self.frac + 1


def element_decode(fmt_name: str, subnormals: bool, zeros_positive: bool) -> ElementDecode:
    """The decode of one element format: a row per code for formats of at most TABLE_BITS
    bits, the IEEE fields' rule for wider ones (values as the format table's decode,
    docs/hwconfig.md)."""
    fmt = get_format(fmt_name)
    if fmt.bits > TABLE_BITS and _ieee_shaped(fmt):
        emin = 1 - fmt.bias
        emax = (1 << fmt.exponent_bits) - 2 - fmt.bias
        shape = (
            fmt.exponent_bits,
            fmt.mantissa_bits,
            fmt.bias,
            fmt.padding_bits,
            not (subnormals and fmt.subnormals),
            zeros_positive,
        )
        return ElementDecode(fmt.name, fmt.bits, fmt.mantissa_bits, emin, emax, (), shape)
    anchor = Fraction(fmt.min_normal if fmt.exponent_bits else fmt.max_finite)
    emin = floor_log2(anchor)
    values = []
    for code in range(1 << fmt.bits):
        value = decode_reference(fmt, code)
        if (
            isinstance(value, Fraction)
            and not subnormals
            and value != 0
            and abs(value) < Fraction(fmt.min_normal)
        ):
            value = Fraction(0) if value > 0 else -0.0
        values.append(value)
    finite = [
        abs(Fraction(v))
        for v in values
        if not (isinstance(v, float) and not math.isfinite(v)) and v != 0
    ]
    exponents = [max(floor_log2(v), emin) for v in finite]
    frac = max(
        (
            Fraction(v / Fraction(2) ** e).denominator.bit_length() - 1
            for v, e in zip(finite, exponents)
        ),
        default=0,
    )
    rows = []
    for value in values:
        if isinstance(value, float) and math.isnan(value):
            rows.append((1, 0, 0, 0, 0, 0))
        elif isinstance(value, float) and math.isinf(value):
            rows.append((0, 1, 0, int(value < 0), 0, 0))
        elif value == 0:
            negative = (
                isinstance(value, float) and math.copysign(1.0, value) < 0 and not zeros_positive
            )
            rows.append((0, 0, 1, int(negative), 0, 0))
        else:
            magnitude = abs(Fraction(value))
            exponent = max(floor_log2(magnitude), emin)
            sig = magnitude / Fraction(2) ** (exponent - frac)
            assert sig.denominator == 1 and sig < 2 ** (frac + 1)
            rows.append((0, 0, 0, int(value < 0), exponent, int(sig)))
    return ElementDecode(fmt.name, fmt.bits, frac, emin, max(exponents, default=emin), tuple(rows))


def _signed(value: int, width: int = EXW) -> str:
    return f"-{width}'sd{-value}" if value < 0 else f"{width}'sd{value}"


def _decode_module(name: str, table: ElementDecode) -> str:
    if table.fields is not None:
        return _field_decode_module(name, table)
    w, s = table.bits, table.sig_bits
    lines = [
        f"// {name}: {table.name} element decode (docs/hwconfig.md step 1), one row per code:",
        f"// value = sig * 2^(exp - {table.frac}); exp is the alignment exponent (at least {table.emin}).",
        f"module {name} (",
        f"    input  logic [{w - 1}:0] code,",
        "    output logic nan, output logic inf, output logic zero, output logic sign,",
        f"    output logic signed [{EXW - 1}:0] exp,",
        f"    output logic [{s - 1}:0] sig",
        ");",
        "  always_comb begin",
        "    case (code)",
    ]
    for code, (nan, inf, zero, sign, exponent, sig) in enumerate(table.rows):
        lines.append(
            f"      {w}'d{code}: begin nan = 1'b{nan}; inf = 1'b{inf}; zero = 1'b{zero}; sign = 1'b{sign}; "
            f"exp = {_signed(exponent)}; sig = {s}'d{sig}; end"
        )
    lines += [
        "      default: begin nan = 1'b0; inf = 1'b0; zero = 1'b1; sign = 1'b0; exp = '0; sig = '0; end",
        "    endcase",
        "  end",
        "endmodule",
        "",
    ]
    return "\n".join(lines)


def _field_decode_module(name: str, table: ElementDecode) -> str:
    """An IEEE-shaped element decoded by its fields: the same outputs as a table's rows."""
    eb, mb, bias, pad, flush, zeros_positive = table.fields
    w = table.bits
    zero = "field == '0" if flush else "field == '0 && man == '0"
    return "\n".join(
        [
            f"// {name}: {table.name} element decode (docs/hwconfig.md step 1) by its fields: sign,",
            f"// {eb} exponent bits (bias {bias}), {mb} mantissa bits"
            + (f", {pad} padding bits (ignored: mxsim takes them 0)" if pad else "")
            + "; all-ones exponent: Inf, NaN.",
            f"// value = sig * 2^(exp - {mb}); exp is the alignment exponent (at least {table.emin})"
            + ("; subnormals flush to zero" if flush else "")
            + ("; zeros are +0" if zeros_positive else "")
            + ".",
            f"module {name} (",
            f"    input  logic [{w - 1}:0] code,",
            "    output logic nan, output logic inf, output logic zero, output logic sign,",
            f"    output logic signed [{EXW - 1}:0] exp,",
            f"    output logic [{mb}:0] sig",
            ");",
            f"  logic [{eb - 1}:0] field; logic [{mb - 1}:0] man; logic finite;",
            f"  assign field = code[{w - 2}:{w - 1 - eb}];",
            f"  assign man = code[{pad + mb - 1}:{pad}];",
            "  assign nan = &field && man != '0;",
            "  assign inf = &field && man == '0;",
            f"  assign zero = {zero};",
            "  assign finite = !(&field) && !zero;",
            f"  assign sign = !nan && {'!zero && ' if zeros_positive else ''}code[{w - 1}];",
            f"  assign exp = !finite ? '0 : field == '0 ? {_signed(table.emin)} : "
            f"{EXW}'($signed({{1'b0, field}})) - {_signed(bias)};",
            "  assign sig = !finite ? '0 : {field != '0, man};",
            "endmodule",
            "",
        ]
    )


# --- the unit -----------------------------------------------------------------------------------


@dataclass
class RtlUnit:
    """A generated unit: its top module's name, its SystemVerilog files and its ports.

    ``files`` maps file names to text: ``<name>.sv`` (the unit) and ``mxsim_rtl_lib.sv``.
    ``ports`` lists (name, direction, width, meaning) in port order.
    """

    name: str
    params: DatapathParams
    dot_length: int
    pipeline: int
    files: dict = field(default_factory=dict)
    ports: list = field(default_factory=list)


def _format_shape(name: str) -> tuple[int, int]:
    fmt = get_format(name)
    return fmt.exponent_bits, fmt.mantissa_bits


def _sext(expr: str, width: int, to: int) -> str:
    """expr (a signed width-bit value) sign-extended to ``to`` bits."""
    return expr if to == width else f"{{{{{to - width}{{{expr}[{width - 1}]}}}}, {expr}}}"


def _balanced_sum(terms: list[str]) -> str:
    """The terms added as a balanced tree of two-input adds ('0 for none)."""
    if not terms:
        return "'0"
    while len(terms) > 1:
        terms = [f"({terms[i]} + {terms[i + 1]})" for i in range(0, len(terms) - 1, 2)] + terms[
            len(terms) // 2 * 2 :
        ]
    return terms[0]


def _bits(n: int) -> int:
    return max(1, n.bit_length())


def generate_unit(
    hw,
    a_format: str,
    b_format: str,
    k: int | None = None,
    *,
    name: str | None = None,
    pipeline: int = 0,
) -> RtlUnit:
    """The RTL of ``hw`` (a loaded config or a YAML path) for one element-format pair.

    ``k``: elements per dot product (default: the block size; a multiple of it when the unit
    takes scales, 1..4096). ``pipeline``: register stages on the result (0: combinational;
    1..8 registers clocked by ``clk``, for synthesis to retime). ``name``: the top module's
    name (default ``mxdot_<config>_<A>x<B>_k<K>``, made an identifier).
    """
    config = hw if isinstance(hw, HardwareConfig) else load_hwconfig(hw)
    params = config.params(a_format, b_format)
    check_covered(params, config.source)
    if k is None:
        k = params.block_size
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ArgumentError(f"rtl: k must be an integer 1..{MAX_K}, got {k!r}")
    if params.scales != "none" and k % params.block_size:
        raise ArgumentError(
            f"rtl: k ({k}) must be a multiple of inputs.block_size ({params.block_size})"
        )
    if isinstance(pipeline, bool) or not isinstance(pipeline, int) or not 0 <= pipeline <= 8:
        raise ArgumentError(f"rtl: pipeline must be an integer 0..8, got {pipeline!r}")
    if name is None:
        name = f"mxdot_{config.name}_{params.a_format}x{params.b_format}_k{k}"
    name = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    if not name or not (name[0].isalpha() or name[0] == "_") or len(name) > 120:
        raise ArgumentError(
            f"rtl: module name {name!r} must start with a letter and be at most 120 characters"
        )
    unit = RtlUnit(name=name, params=params, dot_length=k, pipeline=pipeline)
    body, ports = _Builder(unit, config).build()
    unit.ports = ports
    unit.files = {f"{name}.sv": body, LIBRARY.name: LIBRARY.read_text(encoding="utf-8")}
    return unit


class _Builder:
    """Emits the top module's text stage by stage."""

    def __init__(self, unit: RtlUnit, config: HardwareConfig):
        self.unit, self.p, self.k = unit, unit.params, unit.dot_length
        self.config = config
        zeros_positive = self.p.input_zero_sign == "positive"
        self.da = element_decode(self.p.a_format, self.p.input_subnormals, zeros_positive)
        self.db = element_decode(self.p.b_format, self.p.input_subnormals, zeros_positive)
        self.lines: list[str] = []
        self.tree_specials: list[str] = []  # per tree: its NaN/Inf flag
        self.tree_products: list[list] = []  # per tree: its positions
        self.negzero_terms: list[str] = []  # per product: it keeps "every addend is -0" true
        self.ovf_terms: list[tuple] = []  # (overflow, its sign, trees before it) in order
        self.scaled = self.p.scales != "none"
        # c travels as FP32 bits (a value of c_format), or FP64 bits for an fp64 c
        self.c_container = "fp64" if self.p.c_format == "fp64" else "fp32"
        self.c_eb, self.c_mb = _format_shape(self.c_container)
        self.c_bits = 1 + self.c_eb + self.c_mb
        self.blocks = self.k // self.p.block_size if self.scaled else 0
        # special_accumulator_exponent: the running (NaN, +Inf, -Inf) state, tree by tree
        self.state: tuple | None = None

    def emit(self, text: str = "") -> None:
        self.lines.append(text)

    def build(self) -> tuple[str, list]:
        p, u = self.p, self.unit
        wa, wb = self.da.bits, self.db.bits
        out_eb, out_mb = _format_shape(p.output_format)
        ports = [
            (
                "a",
                "input",
                self.k * wa,
                f"A element codes ({p.a_format}), element i at [{wa}i+{wa - 1}:{wa}i]",
            ),
            (
                "b",
                "input",
                self.k * wb,
                f"B element codes ({p.b_format}), element i at [{wb}i+{wb - 1}:{wb}i]",
            ),
        ]
        if self.scaled:
            ports += [
                (
                    f"scale_{x}",
                    "input",
                    8 * self.blocks,
                    f"{x.upper()} {p.scale_format.upper()} scale codes, block j at [8j+7:8j]",
                )
                for x in "ab"
            ]
        ports += [
            (
                "c",
                "input",
                self.c_bits,
                f"accumulator input c, {self.c_container.upper()} bits (a {p.c_format} value)",
            ),
            ("d", "output", 1 + out_eb + out_mb, f"result, {p.output_format} bits"),
        ]
        if u.pipeline:
            ports.insert(
                0, ("clk", "input", 1, f"clock of the {u.pipeline} result register stage(s)")
            )
        dec_a, dec_b = f"{u.name}_decode_a", f"{u.name}_decode_b"
        text = [
            f"// {u.name}: generated by mxsim rtl from hardware config '{self.config.name}'",
            f"// ({self.config.digest[:16]}), A {p.a_format}, B {p.b_format}, K = {self.k}.",
            "//",
            "//   d = the unit's dot product c + sum_k a_k * b_k (docs/hwconfig.md), bit for bit as mxsim.dot.",
            "//",
            "// Ports:",
        ]
        text += [f"//   {n:8s} {d:6s} [{w - 1}:0]  {m}" for n, d, w, m in ports]
        text += [
            "//",
            f"// {'Combinational' if not u.pipeline else f'{u.pipeline} register stage(s) on the result'}.",
            "// Key values: "
            + ", ".join(
                f"{f}={getattr(p, f)}"
                for f in (
                    "block_size",
                    "scales",
                    "fused_terms",
                    "accumulator_in_tree",
                    "align_fraction_bits",
                    "below_window",
                    "carry_bits",
                    "sum_significant_bits",
                    "zero_term_exponent",
                    "grid_fraction_bits",
                    "accumulator_format",
                    "accumulator_rounding",
                    "output_rounding",
                    "output_zero_sign",
                )
            ),
            "",
            _decode_module(dec_a, self.da),
        ]
        if self.da != self.db:
            text.append(_decode_module(dec_b, self.db))
        else:
            dec_b = dec_a
        self.scale_module = None
        port_text = ",\n".join(f"    {d} logic [{w - 1}:0] {n}" for n, d, w, _ in ports)
        self.emit(f"module {u.name} (\n{port_text}\n);")
        self._decode_and_multiply(dec_a, dec_b)
        self._c_entry()
        if p.structure == "pairwise_rounded":
            text.append(self._pairwise())
            self.emit("endmodule")
            if self.scale_module:
                text.append(self.scale_module)
            return "\n".join(text + self.lines) + "\n", ports
        acc = "acc0"
        trees = tree_positions(self.k, p)
        if p.accumulator_format == "exact":  # exact sums: one tree holds every position
            trees = [[k for tree in trees for k in tree]]
        outer = "c_outer" if p.promotion_interval else None
        shape = (self.c_eb, self.c_mb)  # the outer accumulator's: c's container, then fp32
        for index, positions in enumerate(trees):
            acc = self._tree(index, positions, acc)
            done = (index + 1) * p.fused_terms
            if p.promotion_interval and done % p.promotion_interval == 0 and index < len(trees) - 1:
                outer, acc = self._promote(f"pr{index}", outer, shape, acc), "acc0"
                shape = FP32_SHAPE
        if outer:
            acc = self._promote("pr_end", outer, shape, acc)
        acc = self._c_at_end(acc)
        self._output(acc)
        self.emit("endmodule")
        if self.scale_module:
            text.append(self.scale_module)
        return "\n".join(text + self.lines) + "\n", ports

    # steps 1-2
    def _decode_and_multiply(self, dec_a: str, dec_b: str) -> None:
        p, da, db = self.p, self.da, self.db
        sa, sb = da.sig_bits, db.sig_bits
        self.ft = da.frac + db.frac  # product fraction bits: value = psig * 2^(pexp - ft)
        self.ps = sa + sb
        self.pemin, self.pemax = da.emin + db.emin, da.emax + db.emax
        k = self.k
        self.emit(
            "  // Steps 1-2: decode each element, multiply exactly (value = psig * 2^(pexp - "
            f"{self.ft}), pexp with the block's scale exponent)."
        )
        for name, n in (("a", sa), ("b", sb)):
            self.emit(f"  logic [{k - 1}:0] {name}_nan, {name}_inf, {name}_zero, {name}_sign;")
            self.emit(f"  logic signed [{EXW - 1}:0] {name}_exp [{k}];")
            self.emit(f"  logic [{n - 1}:0] {name}_sig [{k}];")
        self.emit(f"  logic [{k - 1}:0] p_nan, p_inf, p_zero, p_sign;")
        self.emit(
            f"  logic signed [{EXW - 1}:0] p_exp [{k}];  // alignment exponent, scale included"
        )
        self.emit(f"  logic signed [{EXW - 1}:0] p_uexp [{k}];  // without the scale")
        self.emit(f"  logic [{self.ps - 1}:0] p_sig [{k}];")
        if p.scales == "group_sum":
            self._group_scales()
        elif self.scaled:
            nb = self.blocks
            self.emit(
                f"  logic signed [{EXW - 1}:0] x_exp [{nb}];  // block scale exponent (Xa-127)+(Xb-127)"
            )
            self.emit(f"  logic [{nb - 1}:0] x_nan;")
            self.emit("  always_comb begin")
            self.emit(f"    for (int j = 0; j < {nb}; j++) begin")
            self.emit(
                f"      x_exp[j] = {EXW}'($signed({{1'b0, scale_a[8*j +: 8]}})) + {EXW}'($signed({{1'b0, scale_b[8*j +: 8]}})) - {EXW}'sd254;"
            )
            self.emit(
                "      x_nan[j] = (scale_a[8*j +: 8] == 8'hff) || (scale_b[8*j +: 8] == 8'hff);"
            )
            self.emit("    end")
            self.emit("  end")
        wa, wb = da.bits, db.bits
        self.emit("  genvar gk;")
        self.emit(f"  for (gk = 0; gk < {k}; gk++) begin : element")
        self.emit(
            f"    {dec_a} dec_a (.code(a[{wa}*gk +: {wa}]), .nan(a_nan[gk]), .inf(a_inf[gk]), .zero(a_zero[gk]), "
            ".sign(a_sign[gk]), .exp(a_exp[gk]), .sig(a_sig[gk]));"
        )
        self.emit(
            f"    {dec_b} dec_b (.code(b[{wb}*gk +: {wb}]), .nan(b_nan[gk]), .inf(b_inf[gk]), .zero(b_zero[gk]), "
            ".sign(b_sign[gk]), .exp(b_exp[gk]), .sig(b_sig[gk]));"
        )
        scale_nan = (
            f" || x_nan[gk / {p.block_size}]" if p.scales in ("products", "block_sum") else ""
        )
        # block_sum with a window: the scale multiplies the tree's sum (_tree), not each product
        per_product = p.scales == "products" or (
            p.scales == "block_sum" and p.align_fraction_bits is None
        )
        scale_exp = f" + x_exp[gk / {p.block_size}]" if per_product else ""
        self.emit(
            f"    assign p_nan[gk] = a_nan[gk] || b_nan[gk]{scale_nan} || (a_inf[gk] && b_zero[gk]) || (b_inf[gk] && a_zero[gk]);"
        )
        if p.product_overflow_exponent is None:
            self.emit("    assign p_inf[gk] = !p_nan[gk] && (a_inf[gk] || b_inf[gk]);")
        else:  # multiplier.overflow_exponent n: a finite product of 2^n or more is +-Inf
            pw = _bits(self.ps) + 1
            self.emit(f"    logic [{self.ps - 1}:0] p_raw; logic [{pw - 1}:0] p_top; logic p_big;")
            self.emit(f"    assign p_raw = {self.ps}'(a_sig[gk]) * {self.ps}'(b_sig[gk]);")
            self.emit(f"    mxr_msb #(.W({self.ps}), .PW({pw})) p_msb (.x(p_raw), .pos(p_top));")
            # (a NaN or Inf element is told by its flags: p_big only decides finite products)
            self.emit(
                f"    assign p_big = p_raw != '0 && p_exp[gk] - {EXW}'sd{self.ft} + "
                f"{EXW}'($signed({{1'b0, p_top}})) >= {_signed(p.product_overflow_exponent)};"
            )
            self.emit("    assign p_inf[gk] = !p_nan[gk] && (a_inf[gk] || b_inf[gk] || p_big);")
        self.emit("    assign p_zero[gk] = !p_nan[gk] && !p_inf[gk] && (a_zero[gk] || b_zero[gk]);")
        self.emit("    assign p_sign[gk] = a_sign[gk] ^ b_sign[gk];")
        self.emit("    assign p_uexp[gk] = a_exp[gk] + b_exp[gk];")
        self.emit(f"    assign p_exp[gk] = p_uexp[gk]{scale_exp};")
        exact = f"(p_nan[gk] || p_inf[gk]) ? '0 : {self.ps}'(a_sig[gk]) * {self.ps}'(b_sig[gk])"
        if p.product_fraction_bits is None or p.product_fraction_bits + 1 >= self.ps:
            self.emit(f"    assign p_sig[gk] = {exact};")
        else:  # multiplier.product_fraction_bits: the significand cut to 1 + n bits toward zero
            self.emit(f"    logic [{self.ps - 1}:0] p_full;")
            self.emit(f"    assign p_full = {exact};")
            self.emit(
                f"    mxr_truncate #(.W({self.ps}), .N({p.product_fraction_bits})) cut (.sig(p_full), .out(p_sig[gk]));"
            )
        self.emit("  end")

    def _group_scales(self) -> None:
        """scales: group_sum: each block's two scale codes decoded by the scale format's table
        (value = sig * 2^(exp - frac), exp = max(floor(log2 s), emin))."""
        p, nb = self.p, self.blocks
        self.ds = element_decode(p.scale_format, True, False)
        w, s = self.ds.bits, self.ds.sig_bits
        dec = f"{self.unit.name}_decode_scale"
        self.scale_module = _decode_module(dec, self.ds)
        for x in "ab":
            self.emit(f"  logic [{nb - 1}:0] s{x}_nan, s{x}_inf, s{x}_zero, s{x}_sign;")
            self.emit(f"  logic signed [{EXW - 1}:0] s{x}_exp [{nb}];")
            self.emit(f"  logic [{s - 1}:0] s{x}_sig [{nb}];")
        self.emit(f"  logic [{nb - 1}:0] s_nan;  // a NaN scale: the result is NaN")
        self.emit("  genvar gj;")
        self.emit(f"  for (gj = 0; gj < {nb}; gj++) begin : scale")
        for x in "ab":
            self.emit(
                f"    {dec} dec_s{x} (.code(scale_{x}[8*gj +: {w}]), .nan(s{x}_nan[gj]), .inf(s{x}_inf[gj]), "
                f".zero(s{x}_zero[gj]), .sign(s{x}_sign[gj]), .exp(s{x}_exp[gj]), .sig(s{x}_sig[gj]));"
            )
        self.emit("    assign s_nan[gj] = sa_nan[gj] || sb_nan[gj];")
        self.emit("  end")

    # step 6's start: c into the accumulator
    def _c_entry(self) -> None:
        p = self.p
        self.emit(
            "  // c: unpacked; NaN and Inf go to the specials, the finite value enters the accumulator."
        )
        self.emit(
            f"  logic c_nan, c_inf, c_zero, c_sign; logic signed [{EXW - 1}:0] c_exp; logic [{self.c_mb}:0] c_sig;"
        )
        self.emit(
            f"  mxr_unpack #(.EB({self.c_eb}), .MB({self.c_mb}), .EXW({EXW})) c_unpack (.code(c), .nan(c_nan), .inf(c_inf), .zero(c_zero), "
            ".sign(c_sign), .exp(c_exp), .sig(c_sig));"
        )
        self.emit("  logic c_special; assign c_special = c_nan || c_inf;")
        # inputs.zero_sign: positive without accumulator.subnormals: a nonzero c below the
        # accumulator format's smallest normal is read as +0 (before any rounding)
        flushed = None
        if (
            p.input_zero_sign == "positive"
            and not p.accumulator_subnormals
            and p.accumulator_format != "exact"
        ):
            acc_emin = 1 - get_format(p.accumulator_format).bias
            flushed = (
                f"!c_zero && !c_special && (c_exp < {_signed(acc_emin)} || "
                f"(!c_sig[{self.c_mb}] && c_exp <= {_signed(acc_emin)}))"
            )
        if flushed:
            self.emit(f"  logic c_flushed; assign c_flushed = {flushed};")
        flush, self.c_flushed = (" || c_flushed", "c_flushed") if flushed else ("", "1'b0")
        # a zero c, or a NaN/Inf one, is +0 in the accumulator (exact zero)
        self.emit(
            f"  logic c_finite_sign; assign c_finite_sign = c_sign && !c_zero && !(c_special{flush});"
        )
        cw = self.c_mb + 1
        self.emit(
            f"  logic [{cw - 1}:0] c_mag; assign c_mag = (c_special{flush}) ? {cw}'d0 : c_sig;"
        )
        self.emit(
            f"  logic signed [{EXW - 1}:0] c_lsb; assign c_lsb = c_exp - {EXW}'sd{self.c_mb};"
        )
        self.negative_zero_c = "(c_zero && c_sign" + (
            ")" if p.input_zero_sign == "keep" else " && 1'b0)"
        )
        if p.accumulator_format == "exact":
            self.acc_eb = None
            self.emit("  logic c_ovf; assign c_ovf = 1'b0;")
            return
        self.acc_eb, self.acc_mb = _format_shape(p.accumulator_format)
        aw = 1 + self.acc_eb + self.acc_mb
        self.emit(
            f"  logic [{aw - 1}:0] acc0;  // the accumulator's first value ({p.accumulator_format} code)"
        )
        self.emit("  logic c_ovf;")
        if p.c_entry == "initial" and not p.promotion_interval:
            self.emit(f"  logic [{aw - 1}:0] c_rounded;")
            self.emit(
                f"  {self._round_inst('c_round', 'c_finite_sign', 'c_mag', self.c_mb + 1, 'c_lsb', p.accumulator_format, p.accumulator_rounding, p.accumulator_subnormals, self._acc_ovf_inf(), 'c_rounded', 'c_ovf')}"
            )
            grid_minus = p.grid_fraction_bits is not None and p.input_zero_sign == "keep"
            steps = p.output_zero_sign == "ieee_steps"  # the first step's addends include c
            neg = (
                f"{self.negative_zero_c} && !c_special ? {{1'b1, {aw - 1}'d0}} : "
                if grid_minus or steps
                else ""
            )
            self.emit(f"  assign acc0 = c_ovf ? '0 : {neg}c_rounded;")
            if p.special_accumulator_exponent is not None:
                self.emit("  logic st_c_n, st_c_p, st_c_m;  // c's NaN or Inf, or its overflow")
                self.emit("  assign st_c_n = c_nan;")
                self.emit(
                    f"  assign st_c_p = (c_inf && !c_sign) || (c_ovf && !c_rounded[{aw - 1}]);"
                )
                self.emit(f"  assign st_c_m = (c_inf && c_sign) || (c_ovf && c_rounded[{aw - 1}]);")
                self.state = ("st_c_n", "st_c_p", "st_c_m")
        else:
            self.emit("  assign acc0 = '0; assign c_ovf = 1'b0;")
        if p.promotion_interval:  # c starts the outer fp32 accumulator (its container's bits)
            self.emit(
                f"  logic [{self.c_bits - 1}:0] c_outer; assign c_outer = (c_special || c_zero{flush}) ? '0 : c;"
            )

    def _pairwise(self) -> str:
        """adder.structure: pairwise_rounded (steps 4-7): c and each product rounded into the
        accumulator format as IEEE values (NaN, +-Inf, signed zeros kept), each tree's
        products added pair by pair ((p0+p1)+(p2+p3), an odd last one carried up), the tree's
        result added to the accumulator, every add an IEEE add rounded with the accumulator's
        rounding, subnormals and overflow; then the output rounding. Returns the IEEE add
        module's text."""
        p, u = self.p, self.unit
        eb, mb = self.acc_eb, self.acc_mb
        aw = 1 + eb + mb
        nan = f"{{1'b0, {{{eb}{{1'b1}}}}, 1'b1, {mb - 1}'d0}}"
        add = f"{u.name}_ieee_add"
        ovf_inf = self._acc_ovf_inf()
        round_args = (
            p.accumulator_format,
            p.accumulator_rounding,
            p.accumulator_subnormals,
            ovf_inf,
        )
        self.emit("  // pairwise_rounded: c and every product rounded into the accumulator format.")
        minus_c = "1'b0" if p.input_zero_sign == "positive" else "c_sign"
        self.emit(f"  logic [{aw - 1}:0] pw_c, pw_c_rounded;")
        self.emit(
            f"  assign pw_c_rounded = c_nan ? {nan} : c_inf ? {{c_sign, {{{eb}{{1'b1}}}}, {mb}'d0}} : "
            f"(c_zero || {self.c_flushed}) ? {{{minus_c}, {aw - 1}'d0}} : c_rounded;"
        )
        # inputs.zero_sign: positive: a c that is zero, or rounds to zero, starts as +0
        zero_c = (
            f"pw_c_rounded[{aw - 2}:0] == '0 ? '0 : " if p.input_zero_sign == "positive" else ""
        )
        self.emit(f"  assign pw_c = {zero_c}pw_c_rounded;")
        self.emit(
            f"  logic [{aw - 1}:0] q [{self.k}];  // the products as accumulator-format values"
        )
        self.emit(f"  for (gk = 0; gk < {self.k}; gk++) begin : product_round")
        self.emit(f"    logic [{aw - 1}:0] rounded; logic ovf;")
        self.emit(
            f"    {self._round_inst('round_p', 'p_sign[gk]', 'p_sig[gk]', self.ps, f'p_exp[gk] - {EXW}' + chr(39) + f'sd{self.ft}', *round_args, 'rounded', 'ovf')}"
        )
        self.emit(
            f"    assign q[gk] = p_nan[gk] ? {nan} : p_inf[gk] ? {{p_sign[gk], {{{eb}{{1'b1}}}}, {mb}'d0}} : "
            f"p_zero[gk] ? {{p_sign[gk], {aw - 1}'d0}} : rounded;"
        )
        self.emit("  end")
        acc = "pw_c"
        count = 0

        def ieee_add(x: str, y: str) -> str:
            nonlocal count
            name = f"s{count}"
            count += 1
            self.emit(
                f"  logic [{aw - 1}:0] {name}; {add} add_{name} (.x({x}), .y({y}), .z({name}));"
            )
            return name

        for index, positions in enumerate(tree_positions(self.k, p)):
            level = [f"q[{k}]" for k in positions if k is not None]
            if not level:
                continue
            self.emit(
                f"  // Tree {index}: products {', '.join(v[2:-1] for v in level)} pair by pair."
            )
            while len(level) > 1:
                pairs = [ieee_add(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
                level = pairs + level[len(pairs) * 2 :]
            acc = ieee_add(acc, level[0])
        ob, om = _format_shape(p.output_format)
        ow = 1 + ob + om
        self.emit(
            "  // Step 7: the accumulator, a NaN, an infinity or a finite value, into the output."
        )
        self._acc_unpack("o_a", acc)
        self.emit(f"  logic [{ow - 1}:0] o_rounded, result; logic o_ovf;")
        self.emit(
            f"  {self._round_inst('o_round', 'o_a_sign', 'o_a_sig', mb + 1, f'o_a_exp - {EXW}' + chr(39) + f'sd{mb}', p.output_format, p.output_rounding, p.output_subnormals, 0, 'o_rounded', 'o_ovf')}"
        )
        zero = "'0" if p.output_zero_sign == "positive" else "o_rounded"
        self.emit(
            f"  assign result = o_a_nan ? {{1'b0, {{{ob}{{1'b1}}}}, 1'b1, {om - 1}'d0}} : "
            f"o_a_inf ? {{o_a_sign, {{{ob}{{1'b1}}}}, {om}'d0}} : (o_rounded[{ow - 2}:0] == '0) ? {zero} : o_rounded;"
        )
        self._result("result")
        minus_zero = "1'b1" if p.accumulator_rounding == "toward_negative" else "x[AW-1] && y[AW-1]"
        exact_zero = "1'b1" if p.accumulator_rounding == "toward_negative" else "1'b0"
        return f"""
// {add}: z = x + y, an IEEE 754 add of two {p.accumulator_format} values rounded with
// the accumulator's rounding ({p.accumulator_rounding}), subnormals and overflow: NaN in, or
// Inf - Inf, gives NaN; an infinity passes; zero + zero is -0 only when both are -0 (or
// rounding toward -inf); x + 0 is x; an exact zero sum is +0 (-0 toward -inf).
module {add} (
    input  logic [{aw - 1}:0] x,
    input  logic [{aw - 1}:0] y,
    output logic [{aw - 1}:0] z
);
  localparam int AW = {aw};
  logic x_nan, x_inf, x_zero, x_sign, y_nan, y_inf, y_zero, y_sign, ovf;
  logic signed [{EXW - 1}:0] x_exp, y_exp;
  logic [{mb}:0] x_sig, y_sig;
  logic [{aw - 1}:0] sum;
  mxr_unpack #(.EB({eb}), .MB({mb}), .EXW({EXW})) ux (.code(x), .nan(x_nan), .inf(x_inf), .zero(x_zero), .sign(x_sign), .exp(x_exp), .sig(x_sig));
  mxr_unpack #(.EB({eb}), .MB({mb}), .EXW({EXW})) uy (.code(y), .nan(y_nan), .inf(y_inf), .zero(y_zero), .sign(y_sign), .exp(y_exp), .sig(y_sig));
  mxr_add_round #(.WX({mb + 2}), .WY({mb + 1}), .EB({eb}), .MB({mb}), .MODE({MODES[p.accumulator_rounding]}), .SUBN({int(p.accumulator_subnormals)}), .OVF_INF({ovf_inf}), .EXW({EXW})) add (
      .x(x_sign ? -({mb + 2}'($unsigned(x_sig))) : {mb + 2}'($unsigned(x_sig))), .lsb_x(x_exp - {EXW}'sd{mb}),
      .sign_y(y_sign), .mag_y(y_sig), .lsb_y(y_exp - {EXW}'sd{mb}), .code(sum), .ovf(ovf));
  always_comb begin
    if (x_nan || y_nan || (x_inf && y_inf && x_sign != y_sign)) z = {nan};
    else if (x_inf) z = x;
    else if (y_inf) z = y;
    else if (x_zero && y_zero) z = {{{minus_zero}, {aw - 1}'d0}};
    else if (y_zero) z = x;
    else if (x_zero) z = y;
    else if (x[AW-2:0] == y[AW-2:0] && x_sign != y_sign) z = {{{exact_zero}, {aw - 1}'d0}};
    else z = sum;
  end
endmodule
"""

    def _promote(self, name: str, outer: str, shape: tuple, acc: str) -> str:
        """promotion_interval: the accumulator (of its own format) added into the outer fp32
        accumulator (which c starts: ``shape`` is the (EB, MB) of ``outer``'s code, c's
        container before the first add), rounded to nearest even; an overflow becomes the
        running special and the outer accumulator 0. Returns the outer accumulator's new fp32
        code."""
        self.emit(f"  // promotion: {acc} added into the outer fp32 accumulator (nearest even).")
        self._acc_unpack(f"{name}_a", acc)
        self._acc_unpack(f"{name}_o", outer, shape)
        w = self.acc_mb + 2
        self.emit(
            f"  logic signed [{w - 1}:0] {name}_x; assign {name}_x = {name}_a_sign ? -({w}'($unsigned({name}_a_sig))) : {w}'($unsigned({name}_a_sig));"
        )
        self.emit(f"  logic [31:0] {name}_sum, {name}_out; logic {name}_ovf;")
        self.emit(
            f"  mxr_add_round #(.WX({w}), .WY({shape[1] + 1}), .EB(8), .MB(23), "
            f".MODE({MODES['nearest_even']}), .SUBN(1), .OVF_INF(0), .EXW({EXW})) {name}_add (.x({name}_x), "
            f".lsb_x({name}_a_exp - {EXW}'sd{self.acc_mb}), .sign_y({name}_o_sign), .mag_y({name}_o_sig), "
            f".lsb_y({name}_o_exp - {EXW}'sd{shape[1]}), .code({name}_sum), .ovf({name}_ovf));"
        )
        self.emit(f"  assign {name}_out = {name}_ovf ? '0 : {name}_sum;")
        self._note_overflow(f"{name}_ovf", f"{name}_sum[31]", len(self.tree_specials))
        return f"{name}_out"

    def _acc_ovf_inf(self) -> int:
        return int(self.p.accumulator_overflow == "infinity")

    def _round_inst(
        self, inst, sign, mag, width, lsb, fmt, rounding, subnormals, ovf_inf, code, ovf
    ) -> str:
        eb, mb = _format_shape(fmt) if isinstance(fmt, str) else fmt
        return (
            f"mxr_round #(.W({width}), .EB({eb}), .MB({mb}), .MODE({MODES[rounding]}), .SUBN({int(subnormals)}), "
            f".OVF_INF({ovf_inf}), .EXW({EXW})) {inst} (.sign({sign}), .mag({mag}), .lsb({lsb}), .code({code}), .ovf({ovf}));"
        )

    def _acc_unpack(self, prefix: str, acc: str, shape: tuple | None = None) -> None:
        """The accumulator code ``acc`` unpacked (``shape``: (EB, MB) of another format)."""
        eb, mb = shape or (self.acc_eb, self.acc_mb)
        self.emit(
            f"  logic {prefix}_nan, {prefix}_inf, {prefix}_zero, {prefix}_sign; logic signed [{EXW - 1}:0] {prefix}_exp; "
            f"logic [{mb}:0] {prefix}_sig;"
        )
        self.emit(
            f"  mxr_unpack #(.EB({eb}), .MB({mb}), .EXW({EXW})) {prefix}_unpack (.code({acc}), .nan({prefix}_nan), "
            f".inf({prefix}_inf), .zero({prefix}_zero), .sign({prefix}_sign), .exp({prefix}_exp), .sig({prefix}_sig));"
        )

    # steps 3-6, one tree
    def _tree(self, index: int, positions: list, acc_in: str) -> str:
        p = self.p
        t = f"t{index}"
        ks = [k for k in positions if k is not None]
        self.emit(
            f"  // Tree {index}: k = {', '.join('pad' if k is None else str(k) for k in positions)}."
        )
        spec = " || ".join(f"p_nan[{k}] || p_inf[{k}]" for k in ks) or "1'b0"
        if p.scales == "group_sum":
            spec += "".join(f" || s_nan[{j}]" for j in sorted({k // p.block_size for k in ks}))
        self.emit(f"  logic {t}_special; assign {t}_special = {spec};")
        self.tree_specials.append(f"{t}_special")
        self.tree_products.append(ks)
        self.negzero_terms += [
            f"(p_zero[{k}] && p_sign[{k}]) || p_nan[{k}] || p_inf[{k}]" for k in ks
        ]
        nz = {k: f"!p_zero[{k}] && !p_nan[{k}] && !p_inf[{k}]" for k in ks}
        exact_acc = p.accumulator_format == "exact"
        if not exact_acc:
            self._acc_unpack(f"{t}_a", acc_in)
        if p.align_fraction_bits is None:
            s_name, s_width, s_lsb = self._exact_sum(t, ks, nz)
            if exact_acc:
                return self._exact_result(t, s_name, s_width, s_lsb)
            if p.grid_fraction_bits is not None:
                return self._grid(t, ks, s_name, s_width, s_lsb, acc_in)
            x = (s_name, s_width, s_lsb)
            in_tree = False
        else:
            if p.parity_windows:
                x = self._parity_sum(t, index, positions, nz)
            else:
                x = self._window_sum(t, index, positions, nz)
            r = f"{t}_r"  # the tree's reference, read by the second alignment
            if p.scales == "block_sum" and ks:  # the tree's sum and R times its block's scale
                x = (x[0], x[1], f"({x[2]} + x_exp[{ks[0] // p.block_size}])")
                r = f"({t}_r + x_exp[{ks[0] // p.block_size}])"
            in_tree = p.accumulator_in_tree
            if p.second_alignment_bits is not None:
                if self.state:
                    return self._special_accumulator(t, ks, x, r, acc_in)
                return self._second_align(t, x, r)
            x = self._normalise(t, *x)
        return self._accumulate(t, x, in_tree)

    def _exact_sum(self, t: str, ks: list, nz: dict) -> tuple[str, int, str]:
        """An exact tree's product sum: S * 2^lsb, S two's complement on one fixed-point grid.
        Products sharing one block scale sit on a grid spanning the elements' exponents, the
        scale added to the sum's LSB; products of several blocks (an exact tree across block
        scales) on one spanning the scale exponents' range as well, each block's sum at its
        own scale (:meth:`_block_terms`)."""
        p = self.p
        blocks = {k // p.block_size for k in ks} if self.scaled else set()
        per_product = len(blocks) > 1 and p.scales == "products"
        low = self.pemin + (2 * E8M0_EXPONENTS[0] if per_product else 0)
        span = self.pemax - self.pemin
        if per_product:
            span += 2 * (E8M0_EXPONENTS[1] - E8M0_EXPONENTS[0])
        if len(ks) == 1:  # one product is its own exact sum: no grid
            (k,) = ks
            width = self.ps + 1
            self.emit(f"  logic signed [{width - 1}:0] {t}_s;  // the tree's one product")
            self.emit(f"  logic signed [{EXW - 1}:0] {t}_s_lsb;")
            self.emit(
                f"  assign {t}_s = !({nz[k]}) ? '0 : p_sign[{k}] ? -({width}'(p_sig[{k}])) : {width}'(p_sig[{k}]);"
            )
            self.emit(f"  assign {t}_s_lsb = p_exp[{k}] - {EXW}'sd{self.ft};")
            return f"{t}_s", width, f"{t}_s_lsb"
        width = self.ps + span + _bits(max(len(ks), 1)) + 1
        self.emit(
            f"  logic signed [{width - 1}:0] {t}_s;  // exact product sum, LSB 2^(pemin - ft + X)"
        )
        self.emit(f"  logic signed [{EXW - 1}:0] {t}_s_lsb;")
        if per_product:
            terms = self._block_terms(t, ks, nz, width)
            self.emit(f"  assign {t}_s = {_balanced_sum(terms)};")
            self.emit(f"  assign {t}_s_lsb = {_signed(low - self.ft)};")
            return f"{t}_s", width, f"{t}_s_lsb"
        terms = []
        for i, k in enumerate(ks):
            self.emit(
                f"  logic signed [{width - 1}:0] {t}_f{i};  // product k = {k} on the grid, signed"
            )
            self.emit(
                f"  assign {t}_f{i} = !({nz[k]}) ? '0 : p_sign[{k}] ? -({width}'(p_sig[{k}]) << (p_uexp[{k}] - {_signed(low)}))"
                f" : {width}'(p_sig[{k}]) << (p_uexp[{k}] - {_signed(low)});"
            )
            terms.append(f"{t}_f{i}")
        self.emit(f"  assign {t}_s = {_balanced_sum(terms)};")
        x = (
            f" + x_exp[{ks[0] // p.block_size}]"
            if ks and p.scales in ("products", "block_sum")
            else ""
        )
        self.emit(f"  assign {t}_s_lsb = {_signed(low - self.ft)}{x};")
        return f"{t}_s", width, f"{t}_s_lsb"

    def _block_terms(self, t: str, ks: list, nz: dict, width: int) -> list[str]:
        """An exact tree across block scales: each block's products summed exactly on a grid
        spanning the elements' exponents (LSB 2^(pemin - ft)), then that sum, sign-extended,
        shifted by its scale exponent onto the tree's grid (LSB 2^(pemin - ft - 254)): one wide
        shifter and adder per block instead of one per product, the negation at block width."""
        p = self.p
        terms = []
        for j in sorted({k // p.block_size for k in ks}):
            members = [k for k in ks if k // p.block_size == j]
            bw = self.ps + self.pemax - self.pemin + _bits(len(members)) + 1
            parts = []
            for k in members:
                shifted = f"({bw}'(p_sig[{k}]) << (p_uexp[{k}] - {_signed(self.pemin)}))"
                parts.append(f"(!({nz[k]}) ? {bw}'sd0 : p_sign[{k}] ? -{shifted} : {shifted})")
            self.emit(
                f"  logic signed [{bw - 1}:0] {t}_b{j};  // block {j}'s products, LSB 2^(pemin - ft)"
            )
            self.emit(f"  assign {t}_b{j} = {_balanced_sum(parts)};")
            self.emit(f"  logic signed [{width - 1}:0] {t}_g{j};  // block {j} on the tree's grid")
            self.emit(
                f"  assign {t}_g{j} = {{{{{width - bw}{{{t}_b{j}[{bw - 1}]}}}}, {t}_b{j}}}"
                f" << (x_exp[{j}] - {_signed(2 * E8M0_EXPONENTS[0])});"
            )
            terms.append(f"{t}_g{j}")
        return terms

    def _product_terms(self, ks: list, nz: dict) -> list[tuple]:
        """A tree's products as window terms: (valid, alignment exponent, sign, magnitude,
        its width, its LSB's exponent, the most places its LSB lies above the window's LSB
        beyond F, how many binades above the alignment exponent its value may reach).
        align_reference: leading_bit aligns a product at floor(log2|p|) = pexp - ft + the
        position of its significand's leading bit; its LSB then lies at most F places above
        the window's LSB."""
        f = self.p.align_fraction_bits
        lmax = max(0, f - self.ft)
        exps = {k: f"p_exp[{k}]" for k in ks}
        if self.p.align_reference == "leading_bit":
            lmax, pw = f, _bits(self.ps) + 1
            for k in ks:
                self.emit(f"  logic [{pw - 1}:0] p_top{k}; logic signed [{EXW - 1}:0] p_lead{k};")
                self.emit(
                    f"  mxr_msb #(.W({self.ps}), .PW({pw})) p_msb{k} (.x(p_sig[{k}]), .pos(p_top{k}));"
                )
                self.emit(
                    f"  assign p_lead{k} = p_exp[{k}] - {EXW}'sd{self.ft} + {EXW}'($signed({{1'b0, p_top{k}}}));"
                )
                exps[k] = f"p_lead{k}"
        return [
            (
                f"({nz[k]})",
                exps[k],
                f"p_sign[{k}]",
                f"({nz[k]}) ? p_sig[{k}] : {self.ps}'d0",
                self.ps,
                f"p_exp[{k}] - {EXW}'sd{self.ft}",
                lmax,
                2,
            )
            for k in ks
        ]

    def _group_terms(self, t: str, positions: list, nz: dict) -> tuple[list, list]:
        """scales: group_sum: per group of group_terms positions, the exact sum g of its
        products times its block's scales sa*sb, one window term aligned at ea + eb (window
        terms as _product_terms); and per group its zero-term flag (all products zero, or a
        zero scale, the scales not NaN)."""
        p, ds = self.p, self.ds  # A and B scales share one format
        terms, zeros = [], []
        for g, start in enumerate(range(0, len(positions), p.group_terms)):
            ks = [k for k in positions[start : start + p.group_terms] if k is not None]
            if not ks:
                continue
            j = ks[0] // p.block_size
            s_name, s_width, s_lsb = self._exact_sum(f"{t}_g{g}", ks, nz)
            mw = s_width - 1 + 2 * ds.sig_bits
            name = f"{t}_g{g}"
            scale_zero = f"sa_zero[{j}] || sb_zero[{j}]"
            all_zero = " && ".join(f"p_zero[{k}]" for k in ks)
            self.emit(f"  logic {name}_valid, {name}_zero; logic [{mw - 1}:0] {name}_mag;")
            self.emit(f"  logic signed [{EXW - 1}:0] {name}_exp, {name}_lsb;")
            self.emit(f"  assign {name}_valid = !({all_zero}) && !({scale_zero}) && !s_nan[{j}];")
            self.emit(f"  assign {name}_zero = (({all_zero}) || {scale_zero}) && !s_nan[{j}];")
            self.emit(
                f"  assign {name}_mag = {mw}'({s_name}[{s_width - 1}] ? -{s_name} : {s_name}) * "
                f"{mw}'(sa_sig[{j}]) * {mw}'(sb_sig[{j}]);"
            )
            self.emit(f"  assign {name}_exp = sa_exp[{j}] + sb_exp[{j}];")
            self.emit(f"  assign {name}_lsb = {s_lsb} + {name}_exp - {EXW}'sd{2 * ds.frac};")
            # g * sa * sb < 2^(ea + eb + headroom); its LSB at most offset above ea + eb
            offset = self.pemin - self.ft - 2 * ds.frac
            headroom = max(mw + offset, 0)
            terms.append(
                (
                    f"{name}_valid",
                    f"{name}_exp",
                    f"{s_name}[{s_width - 1}]",
                    f"{name}_valid ? {name}_mag : {mw}'d0",
                    mw,
                    f"{name}_lsb",
                    max(0, p.align_fraction_bits + offset),
                    headroom,
                )
            )
            zeros.append(f"{name}_zero")
        return terms, zeros

    def _window_sum(self, t: str, index: int, positions: list, nz: dict) -> tuple[str, int, str]:
        """A windowed tree (step 4-5): reference R, every term kept to multiples of 2^(R-F) as
        below_window says, the kept terms added (in the carry_bits register when given)."""
        p = self.p
        ks = [k for k in positions if k is not None]
        f = p.align_fraction_bits
        sticky = p.below_window == "sticky"
        if p.scales == "group_sum":
            window_terms, zeros = self._group_terms(t, positions, nz)
        else:
            window_terms = self._product_terms(ks, nz)
            zeros = [f"p_zero[{k}]" for k in ks]
        terms = len(window_terms) + (1 if p.accumulator_in_tree else 0)
        headroom = max([2] + [term[7] for term in window_terms])
        wo = f + headroom + 1 + int(sticky) + 1
        width = wo + _bits(max(terms, 1))
        a = f"{t}_a"
        self.emit(
            f"  logic signed [{EXW - 1}:0] {t}_r, {t}_wlsb;  // reference R, window LSB R - F"
        )
        self.emit(f"  logic {t}_any, {t}_has_zero;")
        acc_exp = None
        if p.accumulator_in_tree:
            self.emit(f"  logic signed [{EXW - 1}:0] {t}_acc_exp;")
            if p.accumulator_exponent == "format_emin":
                bound = ""
                if index == 0:
                    c_emin = 1 - get_format(p.c_format).bias
                    bound = f"({a}_exp > {_signed(c_emin)}) ? {a}_exp : {_signed(c_emin)}"
                self.emit(f"  assign {t}_acc_exp = {bound or a + '_exp'};")
            else:
                pw = _bits(self.acc_mb + 1) + 1
                self.emit(f"  logic [{pw - 1}:0] {t}_acc_top;")
                self.emit(
                    f"  mxr_msb #(.W({self.acc_mb + 1}), .PW({pw})) {t}_acc_msb (.x({a}_sig), .pos({t}_acc_top));"
                )
                self.emit(
                    f"  assign {t}_acc_exp = {a}_exp - {EXW}'sd{self.acc_mb} + {EXW}'($signed({{1'b0, {t}_acc_top}}));"
                )
            acc_exp = f"{t}_acc_exp"
        cands = [(valid, exp) for valid, exp, *_ in window_terms]
        if acc_exp:
            cands.append((f"!{a}_zero", acc_exp))
        zeros += [f"{a}_zero"] if acc_exp else []
        zero_any = " || ".join(zeros) or "1'b0"
        self.emit(f"  assign {t}_has_zero = {zero_any};")
        if p.zero_term_exponent is not None:
            cands.append((f"{t}_has_zero", _signed(p.zero_term_exponent)))
        if p.second_alignment_bits is not None or p.parity_windows:  # R only with a nonzero term
            self.emit(
                f"  logic {t}_nonzero; assign {t}_nonzero = {' || '.join(v for v, *_ in window_terms) or chr(48)};"
            )
        self.emit("  // R: the largest exponent of a nonzero term (balanced max tree)")
        any_name, r_name = self._max_tree(f"{t}_rmax", cands)
        self.emit(f"  assign {t}_any = {any_name};")
        self.emit(f"  assign {t}_r = {r_name};")
        self.emit(f"  assign {t}_wlsb = {t}_r - {EXW}'sd{f};")
        self.emit(f"  logic signed [{wo - 1}:0] {t}_al [{terms}];")
        for i, (_, _, sign, sig, wi, lsb, lmax, _) in enumerate(window_terms):
            self.emit(
                f"  mxr_window_term #(.WI({wi}), .LMAX({lmax}), .WO({wo}), .MODE({WINDOW_MODES[p.below_window]}), "
                f".EXW({EXW})) {t}_term{i} (.sign({sign}), .sig({sig}), "
                f".lsb({lsb}), .wlsb({t}_wlsb), .out({t}_al[{i}]));"
            )
        if acc_exp:
            self.emit(
                f"  mxr_window_term #(.WI({self.acc_mb + 1}), .LMAX({f + self.acc_mb + 1}), .WO({wo}), "
                f".MODE({WINDOW_MODES[p.below_window]}), .EXW({EXW})) {t}_term_acc (.sign({a}_sign), .sig({a}_sig), "
                f".lsb({a}_exp - {EXW}'sd{self.acc_mb}), .wlsb({t}_wlsb), .out({t}_al[{terms - 1}]));"
            )
        self.emit(f"  logic signed [{width - 1}:0] {t}_total, {t}_sum;")
        self.emit(
            f"  assign {t}_total = {_balanced_sum([_sext(f'{t}_al[{i}]', wo, width) for i in range(terms)])};"
        )
        total = f"{t}_total"
        if p.carry_bits is not None and 1 + f + 2 + p.carry_bits + int(sticky) < width:
            rw = 1 + f + 2 + p.carry_bits + int(sticky)
            lo, hi = f"-({width}'sd1 <<< {rw - 1})", f"({width}'sd1 <<< {rw - 1}) - {width}'sd1"
            if p.adder_overflow == "saturate":
                self.emit(
                    f"  assign {t}_sum = ({total} > {hi}) ? {hi} : ({total} < {lo}) ? {lo} : {total};  "
                    f"// saturates the {rw}-bit register"
                )
            else:
                self.emit(
                    f"  assign {t}_sum = {{{{{width - rw}{{{total}[{rw - 1}]}}}}, {total}[{rw - 1}:0]}};  "
                    f"// wraps in the {rw}-bit register"
                )
        else:
            self.emit(f"  assign {t}_sum = {total};")
        lsb = f"{t}_wlsb - {EXW}'sd1" if sticky else f"{t}_wlsb"
        self.emit(f"  logic signed [{EXW - 1}:0] {t}_sum_lsb; assign {t}_sum_lsb = {lsb};")
        return f"{t}_sum", width, f"{t}_sum_lsb"

    def _parity_sum(self, t: str, index: int, positions: list, nz: dict) -> tuple[str, int, str]:
        """adder.parity_windows: the even and the odd tree positions each summed in a window of
        its own (reference R_h), each sum kept toward -inf to multiples of 2^(R-F) for the
        larger R, and added; ``{t}_r`` = R and ``{t}_nonzero`` as a single window gives them."""
        f = self.p.align_fraction_bits
        halves = []
        for h, part in (("e", positions[0::2]), ("o", positions[1::2])):
            if any(k is not None for k in part):
                halves.append((f"{t}{h}", *self._window_sum(f"{t}{h}", index, part, nz)))
        self.emit(f"  logic signed [{EXW - 1}:0] {t}_r, {t}_wlsb; logic {t}_nonzero;")
        any_name, r_name = self._max_tree(
            f"{t}_pmax", [(f"{h}_nonzero", f"{h}_r") for h, *_ in halves]
        )
        self.emit(f"  assign {t}_nonzero = {any_name};")
        self.emit(f"  assign {t}_r = {r_name};")
        self.emit(f"  assign {t}_wlsb = {t}_r - {EXW}'sd{f};")
        width = max(w for _, _, w, _ in halves) + 3
        kept = []
        for h, s, w, lsb in halves:
            self.emit(f"  logic signed [{w + 1}:0] {h}_kept;")
            self.emit(
                f"  mxr_window_term #(.WI({w}), .LMAX(0), .WO({w + 2}), .MODE(1), .EXW({EXW})) {h}_floor ("
                f".sign({s}[{w - 1}]), .sig({s}[{w - 1}] ? {w}'(-{s}) : {w}'({s})), .lsb({lsb}), .wlsb({t}_wlsb), .out({h}_kept));"
            )
            kept.append(_sext(f"{h}_kept", w + 2, width))
        self.emit(f"  logic signed [{width - 1}:0] {t}_sum; assign {t}_sum = {' + '.join(kept)};")
        return f"{t}_sum", width, f"{t}_wlsb"

    def _special_accumulator(self, t: str, ks: list, x: tuple, r: str, acc_in: str) -> str:
        """special_accumulator_exponent e: a NaN/Inf accumulator (the running state of c's and
        the earlier trees' specials) meets the tree at E = max(R, e); with no NaN/Inf of the
        tree's own and e < E - F - 1 it is dropped, the accumulator's finite part with it.
        The tree's specials join the state, then its overflow when the state holds none."""
        p, aw = self.p, 1 + self.acc_eb + self.acc_mb
        sn, sp, sm = self.state
        own_n = " || ".join(f"p_nan[{k}]" for k in ks) or "1'b0"
        own_p = " || ".join(f"(p_inf[{k}] && !p_sign[{k}])" for k in ks) or "1'b0"
        own_m = " || ".join(f"(p_inf[{k}] && p_sign[{k}])" for k in ks) or "1'b0"
        e, f = p.special_accumulator_exponent, p.align_fraction_bits
        self.emit(f"  logic {t}_own_n, {t}_own_p, {t}_own_m, {t}_drop;")
        self.emit(
            f"  assign {t}_own_n = {own_n}; assign {t}_own_p = {own_p}; assign {t}_own_m = {own_m};"
        )
        self.emit(
            f"  assign {t}_drop = ({sn} || {sp} || {sm}) && !({t}_own_n || {t}_own_p || {t}_own_m) && "
            f"{t}_nonzero && {r} > {_signed(e + f + 1)};"
        )
        self.emit(
            f"  logic [{aw - 1}:0] {t}_kept_acc; assign {t}_kept_acc = {t}_drop ? '0 : {acc_in};"
        )
        self._acc_unpack(f"{t}_k", f"{t}_kept_acc")
        acc = self._second_align(t, x, r, f"{t}_k")
        m = f"{t}_m"
        self.emit(f"  logic {m}_n, {m}_p, {m}_m, {t}_sn, {t}_sp, {t}_sm;")
        for x_, own, prev in (
            ("n", f"{t}_own_n", sn),
            ("p", f"{t}_own_p", sp),
            ("m", f"{t}_own_m", sm),
        ):
            self.emit(f"  assign {m}_{x_} = {own} || (!{t}_drop && {prev});")
        counts = f"({t}_ovf && !({m}_n || {m}_p || {m}_m))"
        self.emit(f"  assign {t}_sn = {m}_n;")
        self.emit(f"  assign {t}_sp = {m}_p || ({counts} && !{t}_rounded[{aw - 1}]);")
        self.emit(f"  assign {t}_sm = {m}_m || ({counts} && {t}_rounded[{aw - 1}]);")
        self.state = (f"{t}_sn", f"{t}_sp", f"{t}_sm")
        return acc

    def _max_tree(self, prefix: str, cands: list) -> tuple[str, str]:
        """(valid, value) of the largest valid candidate, as a balanced tree of comparators."""
        if not cands:
            return "1'b0", "'0"
        level = cands
        depth = 0
        while len(level) > 1:
            nxt = []
            for i in range(0, len(level) - 1, 2):
                (va, xa), (vb, xb) = level[i], level[i + 1]
                name = f"{prefix}_{depth}_{i // 2}"
                self.emit(f"  logic {name}_v; logic signed [{EXW - 1}:0] {name};")
                self.emit(f"  assign {name}_v = {va} || {vb};")
                self.emit(
                    f"  assign {name} = (({vb}) && (!({va}) || ({xb}) > ({xa}))) ? {xb} : {xa};"
                )
                nxt.append((f"{name}_v", name))
            if len(level) % 2:
                nxt.append(level[-1])
            level, depth = nxt, depth + 1
        return level[0]

    def _normalise(self, t: str, s: str, width: int, lsb: str) -> tuple[str, int, str]:
        """sum_significant_bits n: the tree sum rounded to n significant bits (a wide exponent)."""
        p = self.p
        n = p.sum_significant_bits
        if n is None:
            return s, width, lsb
        mb = n - 1
        self.emit(f"  // sum_significant_bits: rounded to {n} bits ({p.sum_rounding}).")
        self.emit(
            f"  logic [{10 + mb}:0] {t}_n_code; logic {t}_n_ovf, {t}_n_nan, {t}_n_inf, {t}_n_zero, {t}_n_sign;"
        )
        self.emit(f"  logic signed [{EXW - 1}:0] {t}_n_exp; logic [{mb}:0] {t}_n_sig;")
        self.emit(
            f"  {self._round_inst(f'{t}_n_round', f'{s}[{width - 1}]', f'{s}[{width - 1}] ? {width}' + chr(39) + f'(-{s}) : {width}' + chr(39) + f'({s})', width, lsb, (10, mb), p.sum_rounding, True, 0, f'{t}_n_code', f'{t}_n_ovf')}"
        )
        self.emit(
            f"  mxr_unpack #(.EB(10), .MB({mb}), .EXW({EXW})) {t}_n_unpack (.code({t}_n_code), .nan({t}_n_nan), "
            f".inf({t}_n_inf), .zero({t}_n_zero), .sign({t}_n_sign), .exp({t}_n_exp), .sig({t}_n_sig));"
        )
        self.emit(
            f"  logic signed [{mb + 1}:0] {t}_n; assign {t}_n = {t}_n_sign ? -({mb + 2}'($unsigned({t}_n_sig))) : {mb + 2}'($unsigned({t}_n_sig));"
        )
        self.emit(
            f"  logic signed [{EXW - 1}:0] {t}_n_lsb; assign {t}_n_lsb = {t}_n_exp - {EXW}'sd{mb};"
        )
        return f"{t}_n", mb + 2, f"{t}_n_lsb"

    def _accumulate(self, t: str, x: tuple, in_tree: bool) -> str:
        """Step 5-6: the tree sum (plus the accumulator when outside the tree) rounded once into
        the accumulator format; an overflow becomes the running special and the accumulator 0."""
        p = self.p
        s, width, lsb = x
        aw = 1 + self.acc_eb + self.acc_mb
        a = f"{t}_a"
        self.emit(f"  logic [{aw - 1}:0] {t}_rounded, {t}_acc; logic {t}_ovf;")
        common = (
            f".EB({self.acc_eb}), .MB({self.acc_mb}), .MODE({MODES[p.accumulator_rounding]}), "
            f".SUBN({int(p.accumulator_subnormals)}), .OVF_INF({self._acc_ovf_inf()}), .EXW({EXW})"
        )
        if in_tree:
            mag = f"{s}[{width - 1}] ? {width}'(-{s}) : {width}'({s})"
            self.emit(
                f"  mxr_round #(.W({width}), {common}) {t}_round (.sign({s}[{width - 1}]), .mag({mag}), .lsb({lsb}), "
                f".code({t}_rounded), .ovf({t}_ovf));"
            )
        else:
            self.emit(
                f"  mxr_add_round #(.WX({width}), .WY({self.acc_mb + 1}), {common}) {t}_add (.x({s}), .lsb_x({lsb}), "
                f".sign_y({a}_sign), .mag_y({a}_sig), .lsb_y({a}_exp - {EXW}'sd{self.acc_mb}), .code({t}_rounded), .ovf({t}_ovf));"
            )
        return self._accumulated(t)

    def _second_align(self, t: str, x: tuple, r: str, a: str | None = None) -> str:
        """adder.second_alignment_bits n: at E = max(R, e) (R, the expression ``r``, only when
        the tree has a nonzero term; e the accumulator's alignment exponent, emin for zero and
        subnormals) the tree
        sum kept to multiples of 2^(E-n-1), the accumulator to 2^(E-F), both toward -inf (the
        accumulator dropped below E-F-1 with far_accumulator: zero); their sum cut toward -inf
        to n+1 significant bits (no finer than 2^(emin-n)), rounded into the accumulator."""
        p = self.p
        s, width, lsb = x
        n, f, mb = p.second_alignment_bits, p.align_fraction_bits, self.acc_mb
        a, aw = a or f"{t}_a", 1 + self.acc_eb + self.acc_mb
        emin = 2 - (1 << (self.acc_eb - 1))
        g = max(n + 1, f)  # both kept values on the grid of LSB 2^(E-g)
        l1, l2 = max(0, n + 1 - f), max(0, f - mb)
        w1, w2 = width + l1 + 2, max(f, mb) + 4
        wt = max(w1 + g - n - 1, w2 + g - f) + 1
        self.emit(f"  // second alignment ({n} + 1 bits) of the tree sum and the accumulator.")
        self.emit(f"  logic signed [{EXW - 1}:0] {t}_e2, {t}_cut_lsb, {t}_lead;")
        self.emit(
            f"  assign {t}_e2 = ({t}_nonzero && {r} > {a}_exp) ? {r} : {a}_exp;  // E = max(R, e)"
        )
        self.emit(f"  logic signed [{w1 - 1}:0] {t}_ks; logic signed [{w2 - 1}:0] {t}_ka;")
        self.emit(
            f"  mxr_window_term #(.WI({width}), .LMAX({l1}), .WO({w1}), .MODE(1), .EXW({EXW})) {t}_keep_sum ("
            f".sign({s}[{width - 1}]), .sig({s}[{width - 1}] ? {width}'(-{s}) : {width}'({s})), .lsb({lsb}), "
            f".wlsb({t}_e2 - {EXW}'sd{n + 1}), .out({t}_ks));"
        )
        self.emit(f"  logic signed [{w2 - 1}:0] {t}_ka_all;")
        self.emit(
            f"  mxr_window_term #(.WI({mb + 1}), .LMAX({l2}), .WO({w2}), .MODE(1), .EXW({EXW})) {t}_keep_acc ("
            f".sign({a}_sign), .sig({a}_sig), .lsb({a}_exp - {EXW}'sd{mb}), .wlsb({t}_e2 - {EXW}'sd{f}), .out({t}_ka_all));"
        )
        drop = f"({a}_exp < {t}_e2 - {EXW}'sd{f + 1})" if p.far_accumulator == "zero" else "1'b0"
        self.emit(f"  assign {t}_ka = {drop} ? '0 : {t}_ka_all;")
        self.emit(f"  logic signed [{wt - 1}:0] {t}_tot; logic [{wt - 1}:0] {t}_tot_mag;")
        self.emit(
            f"  assign {t}_tot = ({_sext(f'{t}_ks', w1, wt)} <<< {g - n - 1}) + ({_sext(f'{t}_ka', w2, wt)} <<< {g - f});"
        )
        self.emit(f"  assign {t}_tot_mag = {t}_tot[{wt - 1}] ? -{t}_tot : {t}_tot;")
        pw = _bits(wt) + 1
        self.emit(f"  logic [{pw - 1}:0] {t}_tot_top;")
        self.emit(
            f"  mxr_msb #(.W({wt}), .PW({pw})) {t}_tot_msb (.x({t}_tot_mag), .pos({t}_tot_top));"
        )
        self.emit(
            f"  assign {t}_lead = {t}_e2 - {EXW}'sd{g} + {EXW}'($signed({{1'b0, {t}_tot_top}}));"
        )
        self.emit(
            f"  assign {t}_cut_lsb = ({t}_lead > {_signed(emin)} ? {t}_lead : {_signed(emin)}) - {EXW}'sd{n};"
        )
        w3 = n + 4
        self.emit(f"  logic signed [{w3 - 1}:0] {t}_cut;")
        self.emit(
            f"  mxr_window_term #(.WI({wt}), .LMAX({n}), .WO({w3}), .MODE(1), .EXW({EXW})) {t}_cut_sum ("
            f".sign({t}_tot[{wt - 1}]), .sig({t}_tot_mag), .lsb({t}_e2 - {EXW}'sd{g}), .wlsb({t}_cut_lsb), .out({t}_cut));"
        )
        self.emit(f"  logic [{aw - 1}:0] {t}_rounded, {t}_acc; logic {t}_ovf;")
        self.emit(
            f"  {self._round_inst(f'{t}_round', f'{t}_cut[{w3 - 1}]', f'{t}_cut[{w3 - 1}] ? {w3}' + chr(39) + f'(-{t}_cut) : {w3}' + chr(39) + f'({t}_cut)', w3, f'{t}_cut_lsb', p.accumulator_format, p.accumulator_rounding, p.accumulator_subnormals, self._acc_ovf_inf(), f'{t}_rounded', f'{t}_ovf')}"
        )
        return self._accumulated(t)

    def _accumulated(self, t: str) -> str:
        """The tree's rounded accumulator ``{t}_rounded`` (overflow ``{t}_ovf``) as the next
        accumulator: an overflow becomes the running special and the accumulator 0."""
        p = self.p
        a, aw = f"{t}_a", 1 + self.acc_eb + self.acc_mb
        rounded = f"{t}_rounded"
        if p.output_zero_sign == "ieee_steps":
            # an IEEE step: its exact zero is -0 when the accumulator and every product are -0
            ks = self.tree_products[-1]
            minus = " && ".join(
                [f"{a}_zero && {a}_sign"] + [f"p_zero[{k}] && p_sign[{k}]" for k in ks]
            )
            self.emit(f"  logic {t}_negative_step; assign {t}_negative_step = {minus};")
            rounded = f"({t}_negative_step && {t}_rounded[{aw - 2}:0] == '0 ? {{1'b1, {aw - 1}'d0}} : {t}_rounded)"
        self.emit(f"  assign {t}_acc = {t}_ovf ? '0 : {rounded};")
        self._note_overflow(f"{t}_ovf", f"{t}_rounded[{aw - 1}]", len(self.tree_specials))
        return f"{t}_acc"

    def _grid(self, t: str, ks: list, s: str, width: int, lsb: str, acc_in: str) -> str:
        """grid.fraction_bits n: the accumulator passes unchanged when its LSB lies more than
        max_left_shift places above the grid's (LSB 2^(X-n)), or more than max_right_shift
        below it while the products sum to 0; else acc + S is rounded once."""
        p = self.p
        a = f"{t}_a"
        aw = 1 + self.acc_eb + self.acc_mb
        x = f"x_exp[{ks[0] // p.block_size}]" if ks and self.scaled else f"{EXW}'sd0"
        emin = 1 - get_format(p.accumulator_format).bias
        self.emit(
            f"  logic signed [{EXW - 1}:0] {t}_offset;  // accumulator LSB above the grid's LSB"
        )
        self.emit(
            f"  assign {t}_offset = ({a}_zero ? {_signed(emin - 1)} : {a}_exp) - {EXW}'sd{self.acc_mb} - ({x} - {EXW}'sd{p.grid_fraction_bits});"
        )
        self.emit(
            f"  logic {t}_pass; assign {t}_pass = ({t}_offset > {EXW}'sd{p.grid_max_left_shift}) || "
            f"(({t}_offset < -{EXW}'sd{p.grid_max_right_shift}) && ({s} == '0));"
        )
        acc = self._accumulate(t, (s, width, lsb), False)
        self.emit(f"  logic [{aw - 1}:0] {t}_grid; assign {t}_grid = {t}_pass ? {acc_in} : {acc};")
        self.ovf_terms[-1] = (f"({self.ovf_terms[-1][0]} && !{t}_pass)",) + self.ovf_terms[-1][1:]
        return f"{t}_grid"

    def _exact_result(self, t: str, s: str, width: int, lsb: str) -> str:
        """accumulator.format exact, one block: c + S rounded once into the output format."""
        p = self.p
        ob, om = _format_shape(p.output_format)
        self.emit(f"  logic [{ob + om}:0] {t}_out; logic {t}_ovf;")
        self.emit(
            f"  mxr_add_round #(.WX({width}), .WY({self.c_mb + 1}), .EB({ob}), .MB({om}), .MODE({MODES[p.output_rounding]}), "
            f".SUBN({int(p.output_subnormals)}), .OVF_INF(0), .EXW({EXW})) {t}_add (.x({s}), .lsb_x({lsb}), "
            f".sign_y(c_finite_sign), .mag_y(c_mag), .lsb_y(c_lsb), .code({t}_out), .ovf({t}_ovf));"
        )
        return f"{t}_out"

    def _note_overflow(self, ovf: str, sign: str, trees_seen: int) -> None:
        """An overflow counts (becomes the result's infinity) when no NaN/Inf came before it."""
        self.ovf_terms.append((ovf, sign, trees_seen))

    def _c_at_end(self, acc: str) -> str:
        p = self.p
        if p.accumulator_format == "exact" or p.c_entry != "end":
            return acc
        aw = 1 + self.acc_eb + self.acc_mb
        self.emit(
            "  // c_entry end: c rounded into the accumulator format (nearest even), then added."
        )
        self.emit(f"  logic [{aw - 1}:0] ce_c, ce_sum, ce_acc; logic ce_c_ovf, ce_ovf;")
        self.emit(
            f"  {self._round_inst('ce_round', 'c_finite_sign', 'c_mag', self.c_mb + 1, 'c_lsb', p.accumulator_format, 'nearest_even', p.accumulator_subnormals, self._acc_ovf_inf(), 'ce_c', 'ce_c_ovf')}"
        )
        self._acc_unpack("ce_a", acc)
        self._acc_unpack("ce_cc", "ce_c")
        common = (
            f".EB({self.acc_eb}), .MB({self.acc_mb}), .MODE({MODES[p.c_add_rounding]}), "
            f".SUBN({int(p.accumulator_subnormals)}), .OVF_INF({self._acc_ovf_inf()}), .EXW({EXW})"
        )
        w = self.acc_mb + 2
        self.emit(
            f"  logic signed [{w - 1}:0] ce_x; assign ce_x = ce_a_sign ? -({w}'($unsigned(ce_a_sig))) : {w}'($unsigned(ce_a_sig));"
        )
        self.emit(
            f"  mxr_add_round #(.WX({w}), .WY({self.acc_mb + 1}), {common}) ce_add (.x(ce_x), .lsb_x(ce_a_exp - {EXW}'sd{self.acc_mb}), "
            f".sign_y(ce_cc_sign), .mag_y(ce_c_ovf ? {self.acc_mb + 1}'d0 : ce_cc_sig), .lsb_y(ce_cc_exp - {EXW}'sd{self.acc_mb}), "
            ".code(ce_sum), .ovf(ce_ovf));"
        )
        self.emit(f"  assign ce_acc = ce_c_ovf ? {acc} : (ce_ovf ? '0 : ce_sum);")
        self._note_overflow("ce_c_ovf", "ce_c[" + str(aw - 1) + "]", len(self.tree_specials))
        self._note_overflow(
            "(ce_ovf && !ce_c_ovf)", "ce_sum[" + str(aw - 1) + "]", len(self.tree_specials)
        )
        return "ce_acc"

    def _output(self, acc: str) -> None:
        """Step 7 and the specials: NaN, the infinities, the sign of zero."""
        p = self.p
        ob, om = _format_shape(p.output_format)
        ow = 1 + ob + om
        self.emit(
            "  // Step 7: the accumulator rounded into the output format; specials; the sign of zero."
        )
        self.emit(f"  logic [{ow - 1}:0] o_rounded; logic o_ovf;")
        if p.accumulator_format == "exact":
            self.emit(f"  assign o_rounded = {acc}; assign o_ovf = 1'b0;")
        else:
            # with promotion the last value is the outer fp32 accumulator's
            mb = 23 if p.promotion_interval else self.acc_mb
            self._acc_unpack("o_a", acc, FP32_SHAPE if p.promotion_interval else None)
            self.emit(
                f"  {self._round_inst('o_round', 'o_a_sign', 'o_a_sig', mb + 1, f'o_a_exp - {EXW}' + chr(39) + f'sd{mb}', p.output_format, p.output_rounding, p.output_subnormals, 0, 'o_rounded', 'o_ovf')}"
            )
        specials = self.tree_specials
        # the overflow that counts: the first one with no NaN/Inf (c, products) before it
        self.emit("  logic ovf_counts, ovf_sign;")
        ovfs = (
            [("c_ovf", "c_rounded[" + str(self.acc_eb + self.acc_mb) + "]", 0)]
            if p.accumulator_format != "exact"
            and p.c_entry == "initial"
            and not p.promotion_interval
            else []
        ) + self.ovf_terms
        conds = []
        for ovf, sign, seen in ovfs:
            before = " || ".join(["c_special"] + specials[:seen])
            conds.append((f"({ovf} && !({before}))", sign))
        self.emit(f"  assign ovf_counts = {' || '.join(c for c, _ in conds) or chr(48)};")
        self.emit(f"  assign ovf_sign = {''.join(f'{c} ? {sg} : ' for c, sg in conds)}1'b0;")
        nans = ["c_nan", "(|p_nan)"] + (["(|s_nan)"] if p.scales == "group_sum" else [])
        self.emit("  logic any_nan, pos_inf, neg_inf;")
        if self.state:  # the state after the last tree
            self.emit(
                f"  assign any_nan = {self.state[0]}; assign pos_inf = {self.state[1]}; assign neg_inf = {self.state[2]};"
            )
        else:
            self.emit(f"  assign any_nan = {' || '.join(nans)};")
            self.emit(
                "  assign pos_inf = (c_inf && !c_sign) || (|(p_inf & ~p_sign)) || (ovf_counts && !ovf_sign);"
            )
            self.emit(
                "  assign neg_inf = (c_inf && c_sign) || (|(p_inf & p_sign)) || (ovf_counts && ovf_sign);"
            )
        negzero = [self.negative_zero_c] + self.negzero_terms
        # ieee_steps: the accumulator carries each step's zero sign (an exact accumulator
        # is one step, the ieee rule)
        ieee = p.output_zero_sign == "ieee" or (
            p.output_zero_sign == "ieee_steps" and p.accumulator_format == "exact"
        )
        if p.grid_fraction_bits is not None or not ieee:
            self.emit("  logic all_negative_zero; assign all_negative_zero = 1'b0;")
        else:
            self.emit(
                "  logic all_negative_zero; assign all_negative_zero = "
                + " && ".join(f"({z})" for z in negzero)
                + ";"
            )
        self.emit(f"  logic [{ow - 1}:0] result;")
        self.emit("  always_comb begin")
        self.emit(
            f"    if (any_nan || (pos_inf && neg_inf)) result = {{1'b0, {{{ob}{{1'b1}}}}, 1'b1, {om - 1}'d0}};"
        )
        self.emit(
            f"    else if (pos_inf || neg_inf) result = {{neg_inf, {{{ob}{{1'b1}}}}, {om}'d0}};"
        )
        self.emit(f"    else if (o_rounded[{ow - 2}:0] == '0) begin")
        if p.output_zero_sign == "positive":
            self.emit("      result = '0;")
        else:
            self.emit(f"      result = {{o_rounded[{ow - 1}] || all_negative_zero, {ow - 1}'d0}};")
        self.emit("    end else result = o_rounded;")
        self.emit("  end")
        self._result("result")

    def _result(self, result: str) -> None:
        """d: ``result``, through the pipeline's register stages when there are any."""
        u = self.unit
        ow = 1 + sum(_format_shape(self.p.output_format))
        if u.pipeline:
            self.emit(f"  logic [{ow - 1}:0] {', '.join(f'stage{i}' for i in range(u.pipeline))};")
            self.emit("  always_ff @(posedge clk) begin")
            self.emit(f"    stage0 <= {result};")
            for i in range(1, u.pipeline):
                self.emit(f"    stage{i} <= stage{i - 1};")
            self.emit("  end")
            self.emit(f"  assign d = stage{u.pipeline - 1};")
        else:
            self.emit(f"  assign d = {result};")
