"""What a vector file is for (:class:`GoldenUnit`) and how one vector is laid out in bits.

A vector is one wide word, written as hexadecimal digits, made of fields placed
most-significant first::

    a | b | scale_a | scale_b | c | d

``a`` and ``b`` are packed buses of element codes (element ``i`` at bits
``[i*w + w-1 : i*w]`` of the field, ``w`` the format's width), ``scale_a``/``scale_b`` packed
buses of E8M0 codes (block ``j`` at ``[8j+7 : 8j]``; absent when the unit takes no scales),
``c`` the accumulator input bits (FP32, or FP64 for a unit whose c is fp64) and ``d`` the
expected output bits. Every field is
padded with zero bits at its top to a whole number of hexadecimal digits, so fields can be
separated by ``_`` in the file and ``$readmemh`` reads the line as one number whose bit
slices are the fields.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, ConfigError, MxsimError
from ..exact import power_codes
from ..formats import get_format

SCALE_BITS = 8
MAX_CODE_BITS = 64  # element codes are stored as unsigned integers of up to 64 bits
#: Formats c may be written in: FP32 for every unit (c is given as FP32 bits), FP64 for a unit
#: whose ``inputs.c_format`` is fp64 (its c values are not all FP32 values).
C_FORMATS = ("fp32", "fp64")
OUT_FORMATS = ("fp32", "fp16", "bf16", "fp64")


@dataclass(frozen=True)
class GoldenUnit:
    """One dot-product unit as the vectors see it: one (A format, B format) pair of a config.

    Attributes:
        config_name: the hardware config's ``name``.
        config_hash: the config's sha256 digest (hex), recorded in headers and the manifest.
        a_format, b_format: element format names (table keys) of operands A and B.
        block_size: k, elements sharing one E8M0 scale.
        dot_length: K, elements per dot product (a vector); a multiple of ``block_size``.
        out_format: the output format whose bits ``d`` holds (``fp32``, ``fp16``, ``bf16`` or ``fp64``).
        scaled: whether the unit takes block scales (false: no scale fields; the expected
            function gets ``None`` scales).
        scale_format: the scale codes' format (``inputs.scale_format``: ``e8m0``, ``ue4m3``).
        align_fraction_bits: the adder's alignment window (``adder.align_fraction_bits``: terms
            kept to multiples of 2^(R-n) below the reference R) or None when exact; corner
            cases put alignment shifts at its edge.
        c_format: the format of c's bits in the vectors (``fp32``, or ``fp64`` for a unit whose
            ``inputs.c_format`` is fp64).
    """

    config_name: str
    config_hash: str
    a_format: str
    b_format: str
    block_size: int = 32
    dot_length: int = 32
    out_format: str = "fp32"
    scaled: bool = True
    align_fraction_bits: int | None = None
    scale_format: str = "e8m0"
    c_format: str = "fp32"
    #: The config's ``inputs.c_format`` when it is narrower than FP32 (fp16, bf16): c is still
    #: written as FP32 bits, but every c is a value of this format (the unit refuses others).
    c_value_format: str = ""

    def __post_init__(self):
        for operand in ("a_format", "b_format"):
            fmt = get_format(getattr(self, operand))
            if fmt.bits > MAX_CODE_BITS:
                raise MxsimError(
                    f"golden: {operand} {fmt.name} is wider than {MAX_CODE_BITS} bits; element codes must fit uint64"
                )
            if fmt.padding_bits:
                raise MxsimError(
                    f"golden: {operand} {fmt.name} codes carry {fmt.padding_bits} padding bits, which "
                    "the vectors do not hold; choose other format pairs"
                )
            object.__setattr__(self, operand, fmt.name)
        scale = get_format(self.scale_format)
        if scale.role != "scale" or scale.bits > SCALE_BITS:
            raise MxsimError(
                f"golden: scale_format must be a block scale format of at most {SCALE_BITS} bits, "
                f"got {self.scale_format!r}"
            )
        object.__setattr__(self, "scale_format", scale.name)
        if self.out_format not in OUT_FORMATS:
            raise MxsimError(
                f"golden: out_format must be {', '.join(OUT_FORMATS)}, got {self.out_format!r}"
            )
        if self.c_format not in C_FORMATS:
            raise MxsimError(
                f"golden: c_format must be {' or '.join(C_FORMATS)}, got {self.c_format!r}"
            )
        if self.block_size < 1 or self.dot_length < 1 or self.dot_length % self.block_size:
            raise MxsimError(
                f"golden: dot_length ({self.dot_length}) must be a positive multiple of block_size ({self.block_size})"
            )

    @property
    def n_blocks(self) -> int:
        """Scale codes per operand per vector: K / k (0 when the unit takes no scales)."""
        return self.dot_length // self.block_size if self.scaled else 0

    @property
    def scale_one(self) -> int:
        """The scale code of 1.0."""
        return int(get_format(self.scale_format).encode(np.array([1.0]))[0])

    @property
    def scale_nan(self) -> int:
        """The scale code of NaN (the largest code: E8M0 0xFF, UE4M3 0x7F)."""
        return (1 << get_format(self.scale_format).bits) - 1

    @property
    def power_of_two_scales(self) -> bool:
        """Whether every scale is a power of two (a format without significand bits: E8M0)."""
        return get_format(self.scale_format).mantissa_bits == 0

    def scale_code_of_power(self, exponent: int) -> int | None:
        """The scale code of exactly 2^exponent, or None when the scale format has none."""
        return _power_of_two_codes(self.scale_format).get(exponent)

    def c_bits_in_value_format(self, bits: np.ndarray) -> np.ndarray:
        """c's FP32 bits rounded (to nearest even, ±Inf beyond its range, NaN kept) to values
        of :attr:`c_value_format`; the bits as they are without one."""
        if not self.c_value_format:
            return bits
        with np.errstate(invalid="ignore"):  # NaN c stays NaN
            values = self.c_values(bits).astype(np.float64)
            rounded = get_format(self.c_value_format).round(values, overflow="inf")
        return np.asarray(rounded, dtype=np.float32).view(np.uint32)

    def c_values(self, bits: np.ndarray) -> np.ndarray:
        """c's bits (uint32 for FP32, uint64 for FP64) as the float values they are."""
        dtype = np.dtype(f"f{get_format(self.c_format).bits // 8}")
        return np.asarray(bits, dtype=f"u{dtype.itemsize}").view(dtype)

    @property
    def pair_name(self) -> str:
        return f"{self.a_format}x{self.b_format}"

    def file_stem(self, kind: str) -> str:
        """File name stem of this unit's vectors of one case kind: ``<config>.<A>x<B>.<kind>``."""
        return f"{self.config_name}.{self.pair_name}.{kind}"


@functools.lru_cache(maxsize=None)
def _power_of_two_codes(scale_format: str) -> dict[int, int]:
    """{e: code} of the scale format's codes whose value is exactly 2^e."""
    return power_codes(get_format(scale_format))


def units_from_hwconfig(hw, pairs=None, dot_length: int | None = None) -> list[GoldenUnit]:
    """The :class:`GoldenUnit` of every (A, B) format pair of a loaded hardware config.

    Args:
        hw: a config from ``mxsim.load_hwconfig`` (reads ``name``, ``digest``, ``format_pairs``
            and ``params(a, b)``).
        pairs: (a_format, b_format) pairs to keep (default: every pair the config accepts).
        dot_length: K per vector (default: the block size k, one block per dot product).
    """
    source = getattr(hw, "source", "<config>")
    accepted = list(hw.format_pairs)
    if pairs is None:
        chosen = accepted
        padded = [
            (a, b) for a, b in accepted if get_format(a).padding_bits or get_format(b).padding_bits
        ]
        if padded:
            usable = [f"{a},{b}" for a, b in accepted if (a, b) not in padded]
            raise ConfigError(
                source,
                "inputs",
                "golden vectors do not hold element codes with padding bits (tf32); "
                f"{', '.join(f'{a} x {b}' for a, b in padded)} do not fit: choose pairs (--pair A,B or pairs=)"
                + (f" among {' '.join(usable)}" if usable else ""),
            )
    else:
        if (
            isinstance(pairs, (str, bytes))
            or not isinstance(pairs, (list, tuple))
            or not all(
                isinstance(pair, (list, tuple))
                and len(pair) == 2
                and all(isinstance(n, str) for n in pair)
                for pair in pairs
            )
        ):
            raise ArgumentError("golden: pairs must be a list of (A format, B format) name pairs")
        chosen = [(get_format(a).name, get_format(b).name) for a, b in pairs]
        repeated = sorted({pair for pair in chosen if chosen.count(pair) > 1})
        if repeated:  # written twice and counted twice in the manifest otherwise
            raise ArgumentError(
                f"golden: format pair {repeated[0][0]},{repeated[0][1]} is given more than once; "
                "give each pair once"
            )
        for pair in chosen:
            if pair not in accepted:
                raise ConfigError(
                    source,
                    "inputs",
                    f"format pair {pair[0]} x {pair[1]} is not accepted by this unit; "
                    f"accepted: {', '.join(f'{a}x{b}' for a, b in accepted)}",
                )
    units = []
    for a_format, b_format in chosen:
        params = hw.params(a_format, b_format)
        k = params.block_size
        units.append(
            GoldenUnit(
                config_name=hw.name,
                config_hash=hw.digest,
                a_format=a_format,
                b_format=b_format,
                block_size=k,
                dot_length=k if dot_length is None else dot_length,
                out_format=params.output_format,
                scaled=params.scales != "none",
                align_fraction_bits=getattr(params, "align_fraction_bits", None),
                scale_format=params.scale_format,
                c_format=params.c_format if params.c_format in C_FORMATS else "fp32",
                c_value_format="" if params.c_format in C_FORMATS else params.c_format,
            )
        )
    return units


@dataclass(frozen=True)
class Field:
    """One field of a vector word.

    Attributes:
        name: ``a``, ``b``, ``scale_a``, ``scale_b``, ``c`` or ``d``.
        lsb: bit position of the field's least significant bit in the word.
        bits: payload width (``items * item_bits``).
        hex_digits: digits the field takes in the file (payload padded at the top).
        items: number of packed items (elements, scales; 1 for c and d).
        item_bits: width of one item; item ``i`` is at field bits ``[i*item_bits +: item_bits]``.
        meaning: one line for humans.
    """

    name: str
    lsb: int
    bits: int
    hex_digits: int
    items: int
    item_bits: int
    meaning: str

    @property
    def width(self) -> int:
        """Bits the field occupies in the word (payload plus padding)."""
        return 4 * self.hex_digits

    @property
    def msb(self) -> int:
        return self.lsb + self.width - 1

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "msb": self.msb,
            "lsb": self.lsb,
            "bits": self.bits,
            "hex_digits": self.hex_digits,
            "items": self.items,
            "item_bits": self.item_bits,
            "meaning": self.meaning,
        }


@dataclass(frozen=True)
class VectorLayout:
    """The fields of one vector word, most significant first."""

    fields: tuple[Field, ...]

    @property
    def word_bits(self) -> int:
        return sum(f.width for f in self.fields)

    @property
    def hex_digits(self) -> int:
        return self.word_bits // 4

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)


def layout_for(unit: GoldenUnit) -> VectorLayout:
    """The vector layout of ``unit``: a, b, [scale_a, scale_b,] c, d, most significant first."""
    a_bits, b_bits = get_format(unit.a_format).bits, get_format(unit.b_format).bits
    out_bits = get_format(unit.out_format).bits
    K = unit.dot_length
    specs = [
        (
            "a",
            K,
            a_bits,
            f"A element codes ({unit.a_format}), element i at bits [{a_bits}i+{a_bits - 1}:{a_bits}i]",
        ),
        (
            "b",
            K,
            b_bits,
            f"B element codes ({unit.b_format}), element i at bits [{b_bits}i+{b_bits - 1}:{b_bits}i]",
        ),
    ]
    if unit.scaled:
        nb = unit.n_blocks
        specs += [
            (
                "scale_a",
                nb,
                SCALE_BITS,
                f"A {unit.scale_format.upper()} scale codes, block j (elements {unit.block_size}j..) at bits [8j+7:8j]",
            ),
            (
                "scale_b",
                nb,
                SCALE_BITS,
                f"B {unit.scale_format.upper()} scale codes, block j at bits [8j+7:8j]",
            ),
        ]
    specs += [
        (
            "c",
            1,
            get_format(unit.c_format).bits,
            f"accumulator input, {unit.c_format.upper()} bits",
        ),
        ("d", 1, out_bits, f"expected output, {unit.out_format} bits"),
    ]
    fields = []
    lsb = sum(-(-items * item_bits // 4) * 4 for _, items, item_bits, _ in specs)
    for name, items, item_bits, meaning in specs:
        bits = items * item_bits
        digits = -(-bits // 4)
        lsb -= 4 * digits
        fields.append(Field(name, lsb, bits, digits, items, item_bits, meaning))
    return VectorLayout(tuple(fields))
