"""What the probes' input families are built from: a batch of dot products, the operands'
codes, the scale codes, seeded streams, and :class:`Drawing`, which holds the unit's interface
and the building blocks every family uses (terms at an exponent, c in its carrier, positions;
exact power-of-two pairs and FP32 bits from :mod:`mxsim.exact`, shared with the golden vectors).
The families themselves live in :mod:`mxsim.probe.families`, one module per kind;
:class:`mxsim.probe.inputs.Context` holds them all."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from ..datapath.schema import SCHEMA
from ..exact import exact_power_pair, power_codes
from ..formats import get_format
from .units import c_code_bits

FP32 = get_format("fp32")
FP64 = get_format("fp64")

#: Scale codes finite and nonzero both as E8M0 (2^-87 .. 2^-1) and as UE4M3 (2^-3 .. 448): rows
#: with these tell the two scale formats apart before the probe knows which the unit reads.
SHARED_SCALE_CODES = np.arange(0x28, 0x7F, dtype=np.uint8)
SHARED_SCALE_CODES.setflags(write=False)  # (one array for every caller)


@dataclass
class Batch:
    """n dot products as the unit takes them (see :mod:`mxsim.probe.units`)."""

    a: np.ndarray  # (n, K) uint64 stored codes
    b: np.ndarray
    scale_a: np.ndarray  # (n, blocks) uint8
    scale_b: np.ndarray
    c: np.ndarray  # (n,) c's carrier bits: uint32 fp32 bits, or uint64 fp64 bits for fp64 c

    def __len__(self) -> int:
        return len(self.a)

    def take(self, rows) -> "Batch":
        return Batch(
            self.a[rows], self.b[rows], self.scale_a[rows], self.scale_b[rows], self.c[rows]
        )

    def put(self, rows, other: "Batch") -> "Batch":
        """The batch with ``rows`` replaced by other's rows (in order); returns self."""
        for name in ("a", "b", "scale_a", "scale_b", "c"):
            getattr(self, name)[rows] = getattr(other, name)
        return self

    @staticmethod
    def join(batches) -> "Batch":
        batches = list(batches)
        batches = [batch for batch in batches if len(batch)] or batches[:1]  # all empty: the first
        return Batch(
            *(
                np.concatenate([getattr(batch, name) for batch in batches])
                for name in ("a", "b", "scale_a", "scale_b", "c")
            )
        )

    def row(self, i: int) -> dict:
        """Row i as plain numbers (the evidence report's record of a decisive input)."""
        return {
            "a": [int(x) for x in self.a[i]],
            "b": [int(x) for x in self.b[i]],
            "scale_a": [int(x) for x in self.scale_a[i]],
            "scale_b": [int(x) for x in self.scale_b[i]],
            "c": f"0x{int(self.c[i]):0{2 * self.c.itemsize}x}",
        }


def stream(seed: int, *names: str) -> np.random.Generator:
    """A random generator of its own for ``names`` (a probe's name, a part of the run) under a
    run's ``seed``: numpy's SeedSequence over the seed and a BLAKE2b digest of each name, so
    that it is the same in every process (Python's ``hash`` of a string is salted per
    process) and no other stream's draws move it."""
    digests = [
        int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
        for name in names
    ]
    return np.random.default_rng(np.random.SeedSequence([seed, *digests]))


def random_fields(rng, bits: int, size) -> np.ndarray:
    """Uniformly random ``bits``-bit fields (int64; uint64 for 64-bit codes, past int64)."""
    return rng.integers(0, 1 << bits, size=size, dtype=np.int64 if bits < 63 else np.uint64)


class _Operand:
    """One operand format's finite nonzero codes and values, and how to negate a code."""

    def __init__(self, fmt, rng):
        self.fmt = fmt
        field_bits = fmt.bits - fmt.padding_bits
        if field_bits <= 20:
            fields = np.arange(1 << field_bits, dtype=np.int64)
        else:  # wide formats: a sample of codes (64-bit codes overflow int64)
            fields = random_fields(rng, field_bits, 1 << 16)
        codes = (fields << fields.dtype.type(fmt.padding_bits)).astype(np.uint64)
        values = fmt.decode(codes)
        finite = np.isfinite(values) & (values != 0)
        self.codes, self.values = codes[finite], values[finite]
        if fmt.twos_complement:  # a code whose negation the format cannot hold is no use
            keep = fmt.decode(fmt.encode(-self.values)) == -self.values
            self.codes, self.values = self.codes[keep], self.values[keep]
        self.zero = int(fmt.encode(np.array([0.0]))[0])
        flipped = self.zero ^ (1 << (fmt.bits - 1))
        flipped_value = fmt.decode(np.array([flipped], dtype=np.uint64))[0]
        #: the code of -0, or None where the format has none (integers; fnuz formats, whose
        #: zero with the sign bit set is NaN)
        self.negative_zero = flipped if flipped_value == 0 and np.signbit(flipped_value) else None
        self.one = int(fmt.encode(np.array([1.0]))[0])
        self.max_code = int(self.codes[np.argmax(self.values)])
        positive = self.values > 0
        self.min_code = int(self.codes[positive][np.argmin(self.values[positive])])
        self.special_codes = self._specials()
        #: exponent y -> the code of 2^y, for every power of two the format holds (from 2^-160 to 2^159)
        self.powers = power_codes(fmt)

    def _specials(self) -> list[int]:
        field_bits = self.fmt.bits - self.fmt.padding_bits
        if field_bits > 20:
            probe = np.array([np.inf, -np.inf, np.nan], dtype=np.float64)
            codes = (
                self.fmt.encode(probe, overflow="inf_nan")
                if self.fmt.has_nan
                else np.array([], dtype=np.uint64)
            )
            return sorted(
                {int(c) for c, v in zip(codes, self.fmt.decode(codes)) if not np.isfinite(v)}
            )
        codes = (np.arange(1 << field_bits, dtype=np.int64) << self.fmt.padding_bits).astype(
            np.uint64
        )
        values = self.fmt.decode(codes)
        return [int(c) for c in codes[~np.isfinite(values)]]

    def negate(self, codes: np.ndarray) -> np.ndarray:
        """The codes of the values' negatives: the sign bit flipped (a zero's negation is the
        format's -0, or NaN for an fnuz format), or a two's complement format's negative."""
        if self.fmt.twos_complement:
            return self.fmt.encode(-self.fmt.decode(codes)).astype(np.uint64)
        return codes ^ np.uint64(1 << (self.fmt.bits - 1))

    def negated(self, code: int) -> int:
        """One code of the value's negative (:meth:`negate`)."""
        return int(self.negate(np.array([code], dtype=np.uint64))[0])


#: Operands of formats of up to 20 field bits, built once per process: every code is listed,
#: so no generator is drawn from, and a probe builds several Drawings on the same formats.
_LISTED_OPERANDS: dict = {}


def _operand(fmt, rng) -> _Operand:
    """``fmt``'s :class:`_Operand` (its codes and values read-only where it is shared)."""
    if fmt.bits - fmt.padding_bits > 20:
        return _Operand(fmt, rng)
    if fmt not in _LISTED_OPERANDS:
        operand = _Operand(fmt, rng)
        operand.codes.setflags(write=False)
        operand.values.setflags(write=False)
        _LISTED_OPERANDS[fmt] = operand
    return _LISTED_OPERANDS[fmt]


def _powers_of_two(operand: _Operand) -> tuple[np.ndarray, np.ndarray]:
    """An operand format's codes of positive powers of two, and their exponents."""
    positive = np.isfinite(operand.values) & (operand.values > 0)
    exponents = np.round(np.log2(np.where(positive, operand.values, 1.0)))
    with np.errstate(over="ignore"):  # fp64's largest values round to 2^1024: inf, not a power held
        exact = positive & (np.exp2(exponents) == operand.values)
    return operand.codes[exact], exponents[exact].astype(np.int64)


class _Scales:
    """One scale format's codes: the code of 1, of NaN, and of each power of two it holds, and
    its finite codes by value (E8M0: the powers 2^-127..2^127; UE4M3: 0 and 2^-9..448)."""

    def __init__(self, fmt):
        self.fmt = fmt
        codes = np.arange(1 << fmt.bits, dtype=np.uint64)
        values = fmt.decode(codes)
        finite = np.isfinite(values)
        self.codes, self.values = codes[finite].astype(np.uint8), values[finite]
        self.nan = int(codes[np.isnan(values)][0])
        self.one = int(self.codes[self.values == 1.0][0])
        powers = self.values > 0
        powers &= np.exp2(np.floor(np.log2(np.where(powers, self.values, 1.0)))) == self.values
        self.power_codes, self.power_exponents = (
            self.codes[powers],
            np.log2(self.values[powers]).astype(np.int64),
        )
        self.zero = int(self.codes[self.values == 0][0]) if (self.values == 0).any() else None

    def power(self, exponent) -> np.ndarray:
        """Codes of 2^exponent (elementwise), the nearest power the format holds."""
        exponent = np.clip(np.asarray(exponent), self.power_exponents[0], self.power_exponents[-1])
        return self.power_codes[np.searchsorted(self.power_exponents, exponent)]

    def between(self, rng, low: int, high: int, shape) -> np.ndarray:
        """Random finite codes of values in [2^low, 2^(high+1)) (the nearest nonzero ones if none)."""
        inside = np.flatnonzero((self.values >= 2.0**low) & (self.values < 2.0 ** (high + 1)))
        if not inside.size:
            nonzero = np.flatnonzero(self.values > 0)
            inside = nonzero[[0]] if 2.0**high < self.values[nonzero[0]] else nonzero[[-1]]
        return self.codes[rng.choice(inside, size=shape)]


class Drawing:
    """What the probes know of the unit's interface: formats, K, block size, output format,
    the scale format held so far (scale codes are written in it); a seeded generator; a pool
    of element pairs indexed by their product's exponent; and the building blocks the
    families (:mod:`mxsim.probe.families`) share."""

    def __init__(
        self,
        a_format: str,
        b_format: str,
        k: int,
        block_size: int,
        out_format: str,
        seed: int = 0,
        scale_format: str = "e8m0",
        c_format: str = "fp32",
    ):
        self.a_format, self.b_format = get_format(a_format).name, get_format(b_format).name
        self.out_format = get_format(out_format).name
        self.k, self.block_size = k, block_size
        self.out_fmt = get_format(out_format)
        self.out_emin = 1 - self.out_fmt.bias
        self.c_format = get_format(c_format).name
        self._c_carrier(get_format(c_format))
        self.blocks = -(-k // block_size)
        self.scale = _Scales(get_format(scale_format))
        self.window: int | None = None  # the alignment window held when a family is drawn (groups)
        #: Whether :meth:`span` keeps to the exponents the output shows (:meth:`output_span`).
        self.in_output_range = False
        self.seed = seed
        self.rng = np.random.default_rng(seed)  # the operands' codes and the pool; then draw_from
        self.A = _operand(get_format(a_format), self.rng)
        self.B = _operand(get_format(b_format), self.rng)
        pairs = 1 << 15
        ia = self.rng.integers(0, len(self.A.codes), pairs)
        ib = self.rng.integers(0, len(self.B.codes), pairs)
        with np.errstate(
            over="ignore", under="ignore"
        ):  # fp64 elements: products past float64's range
            products = self.A.values[ia] * self.B.values[ib]
        keep = (products > 0) & np.isfinite(
            products
        )  # positive products; signs are applied per term
        self.pool_a, self.pool_b = self.A.codes[ia][keep], self.B.codes[ib][keep]
        self.pool_exponent = np.floor(np.log2(products[keep])).astype(np.int64)
        self.exponents = np.unique(self.pool_exponent)
        self._at_exponent: dict[int, np.ndarray] = {}  # exponent -> its pool indices (pair_at)

    def _c_carrier(self, c_fmt) -> None:
        """How c travels: as fp32 bits when fp32 holds every value of c's format (fp32, fp16,
        bf16), else as fp64 bits (uint64). The families write c through :meth:`c_bits`; where
        the carrier is wider than fp32 their c and tie points reach its precision and range."""
        self.c_carrier = FP32 if c_code_bits(c_fmt.name) == FP32.bits else FP64
        self.c_dtype = np.dtype(np.float32 if self.c_carrier is FP32 else np.float64)
        self.c_code_dtype = np.dtype(np.uint32 if self.c_carrier is FP32 else np.uint64)
        self.c_precision = self.c_carrier.mantissa_bits + 1
        self.c_min_exponent = 1 - self.c_carrier.bias - self.c_carrier.mantissa_bits  # fp32: -149
        tiny = np.ldexp(1.0, self.c_min_exponent)
        # tie points (bf16, fp16, fp32 significands, and c's or the output's when wider) and how
        # far below a cancelled pair terms go (60 binades; past a 53-bit significand's products)
        widest = max(self.c_precision, self.out_fmt.mantissa_bits + 1)
        self.precisions = [8, 11, 24] + ([widest] if widest > 24 else [])
        self.reach = 61 if widest <= 24 else 2 * widest + 9
        # special c beyond fp32's list: the carrier's extremes (none for fp32, whose are listed)
        self.c_extremes = (
            []
            if self.c_carrier is FP32
            else [
                self.c_carrier.max_finite,
                -self.c_carrier.max_finite,
                tiny,
                -tiny,
                np.ldexp(1.0, 1 - self.c_carrier.bias),
            ]
        )

    def c_bits(self, values) -> np.ndarray:
        """float64 values rounded to c's carrier (nearest even; past its range +-Inf), as bits."""
        with np.errstate(over="ignore"):
            return np.asarray(values, dtype=self.c_dtype).view(self.c_code_dtype)

    def fit_c(self, batch: Batch) -> Batch:
        """The batch with each c rounded (to nearest even, past the range to +-Inf) to a value of
        the unit's c format: a unit taking fp16 c is asked only fp16 values."""
        if self.c_format != self.c_carrier.name:
            fmt = get_format(self.c_format)
            batch.c[:] = self.c_bits(
                fmt.decode(fmt.encode(batch.c.view(self.c_dtype), overflow="inf_nan"))
            )
        return batch

    def empty(self, n: int) -> Batch:
        """n rows of +0 elements, scales 1, c = +0."""
        return Batch(
            np.full((n, self.k), self.A.zero, np.uint64),
            np.full((n, self.k), self.B.zero, np.uint64),
            np.full((n, self.blocks), self.scale.one, np.uint8),
            np.full((n, self.blocks), self.scale.one, np.uint8),
            np.zeros(n, self.c_code_dtype),
        )

    def pair_at(self, exponent: int) -> tuple[int, int, int]:
        """A random element pair whose product's exponent is the pool's nearest to ``exponent``
        (returns a code, b code, the product's exponent)."""
        nearest = int(self.exponents[np.argmin(np.abs(self.exponents - exponent))])
        if nearest not in self._at_exponent:
            self._at_exponent[nearest] = np.flatnonzero(self.pool_exponent == nearest)
        choices = self._at_exponent[nearest]
        i = choices[self.rng.integers(len(choices))]
        return int(self.pool_a[i]), int(self.pool_b[i]), int(nearest)

    def set_term(
        self,
        batch: Batch,
        row: int,
        position: int,
        exponent: int,
        negative: bool,
        pair: tuple[int, int, int] | None = None,
    ) -> int:
        """Put a product of about 2^exponent (``pair``'s, when given) at (row, position);
        returns its exponent. Where the elements cannot reach it and the position's block
        holds nothing else yet, the block's A scale makes up the difference, and B's what
        A's cannot reach (a unit without scales ignores them)."""
        a, b, got = pair or self.pair_at(exponent)
        if negative:
            a = self.A.negated(a)
        block = position // self.block_size
        members = slice(block * self.block_size, (block + 1) * self.block_size)
        alone = (
            np.all(batch.a[row, members] == self.A.zero)
            and batch.scale_a[row, block] == self.scale.one
            and batch.scale_b[row, block] == self.scale.one
        )
        batch.a[row, position], batch.b[row, position] = a, b
        if got != exponent and alone:
            for scales in (batch.scale_a, batch.scale_b):
                code = int(self.scale.power(exponent - got))
                scales[row, block] = code
                got += int(np.log2(self.scale.fmt.decode(np.array([code], np.uint64))[0]))
        return got

    def random_c(self, exponent: int, negative: bool, bits: int | None = None) -> int:
        """A c of about 2^exponent with ``bits`` significant bits (None: the carrier's precision)."""
        bits = self.c_precision if bits is None else bits
        significand = (1 << (bits - 1)) | int(self.rng.integers(0, 1 << (bits - 1)))
        with np.errstate(over="ignore"):  # past the carrier's range: +-Inf, as c_bits rounds it
            value = np.ldexp(float(significand), exponent - bits + 1) * (-1 if negative else 1)
        return int(self.c_bits([value])[0])

    def positions(self, count: int) -> np.ndarray:
        """Distinct random positions; for K below 4 (a unit of one or two products per dot),
        up to four, the extra ones repeating a position (a later term there replaces an
        earlier one), so that every family can place the terms it names."""
        distinct = self.rng.choice(self.k, size=min(count, self.k), replace=False)
        extra = min(count, 4) - len(distinct)
        return (
            np.concatenate([distinct, self.rng.integers(0, self.k, max(extra, 0))])
            if extra > 0
            else distinct
        )

    def span(self) -> tuple[int, int]:
        """The products' exponents the families draw from: all the elements reach, or where
        ``in_output_range`` is set, :meth:`output_span`."""
        return self.output_span() if self.in_output_range else self.full_span()

    def full_span(self) -> tuple[int, int]:
        """The smallest and largest exponent of the elements' products."""
        return int(self.exponents[0]), int(self.exponents[-1])

    def output_span(self) -> tuple[int, int]:
        """:meth:`full_span` cut to the exponents a finite nonzero output has (fp16: 2^-24 to
        2^15), where the two overlap: on rows past a narrow output's range most results are
        ±Inf or zero and tell few keys apart."""
        low, high = self.full_span()
        cut = (max(low, self.out_emin - self.out_fmt.mantissa_bits), min(high, self.out_fmt.emax))
        return cut if cut[0] <= cut[1] else (low, high)

    def _output_ties(self) -> tuple[dict, list[tuple[int, int]]]:
        """For an output narrower than fp32 (else none): the exact power-of-two products the
        elements make ({exponent: (a, b)}), and each (e, h) where 2^e, an output value in its
        normal range, is one product 2^h (h = e) or two (h = e - 1, K >= 3), and its tie's
        last bit 2^(e-p) is a product too (p the output's precision)."""
        if self.out_fmt.mantissa_bits >= FP32.mantissa_bits or self.k < 2:
            return {}, []
        precision = self.out_fmt.mantissa_bits + 1
        low, high = self.span()
        pairs = {y: pair for y in range(low, high + 1) if (pair := self._exact_power_pair(y))}
        return pairs, [
            (e, h)
            for h in sorted(pairs)
            for e in (h, h + 1)
            if e - precision in pairs
            and self.out_emin <= e < self.out_fmt.emax
            and (e == h or self.k >= 3)
        ]

    def _tiny_gap(self, row: int, exponent: int) -> int:
        """How many binades below 2^exponent a tiny c goes: p+2..50 (p the output's precision),
        every other row at most exponent + 24 (a c inside fp16's range)."""
        precision = self.out_fmt.mantissa_bits + 1
        farthest = 50 if row % 2 else max(precision + 2, min(50, exponent + 24))
        return int(self.rng.integers(precision + 2, farthest + 1))

    def _negative_zero_products(self, batch: Batch, rows, positions) -> None:
        """Make the products at ``positions`` of ``rows`` -0: A's -0 (B's element left as it
        is), or B's -0 beside A's +0 where only B has one (an fnuz or integer A). Where neither
        has one, no product can be -0 and A's zero negated is put there as before (NaN for an
        fnuz A, +0 for an integer): rows as they were, on which MMA-Sim's CDNA3 FP8 families'
        searches were measured (with +0 there, `f32_16x16x32_fp8_fp8` kept a wrong window)."""
        if self.A.negative_zero is None and self.B.negative_zero is not None:
            batch.a[rows, positions] = self.A.zero
            batch.b[rows, positions] = self.B.negative_zero
        else:
            batch.a[rows, positions] = self.A.negated(self.A.zero)

    def _smallest_code(
        self, operand: _Operand, largest: int | None = None, rng=None
    ) -> tuple[int, int]:
        """A positive code and its value's exponent: the format's smallest value, or (with
        ``largest``) a random power of two 2^-(0..7) times 2^largest the format holds exactly
        (its smallest value where none is)."""
        fmt = operand.fmt
        values = [fmt.min_subnormal]
        if largest is not None:
            values = [np.ldexp(1.0, largest - int(rng.integers(0, 8)))] + values
        for value in values:
            code = int(fmt.encode(np.array([value]))[0])
            if fmt.decode(np.array([code], np.uint64))[0] == value:
                return code, int(np.log2(value))
        return operand.min_code, int(np.floor(np.log2(operand.values[operand.values > 0].min())))

    def _nearest_power_pair(self, powers, exponent: int) -> tuple[int, int, int] | None:
        """Codes of an A and a B power of two whose product is nearest 2^exponent (a product
        on the output's grid: the small term's cut shows in a sum rounded toward zero), or
        None where a format holds none."""
        (a_codes, a_exponents), (b_codes, b_exponents) = powers
        if not len(a_codes) or not len(b_codes):
            return None
        error = np.abs(a_exponents[:, None] + b_exponents[None, :] - exponent)
        nearest = np.argwhere(error == error.min())
        i, j = nearest[int(self.rng.integers(len(nearest)))]
        return int(a_codes[i]), int(b_codes[j]), int(a_exponents[i] + b_exponents[j])

    def _largest_product_exponent(self) -> int:
        """floor(log2(largest A x largest B)), exact, without forming the product (fp64's
        overflows a float)."""
        (ma, ea), (mb, eb) = math.frexp(self.A.fmt.max_finite), math.frexp(self.B.fmt.max_finite)
        return ea + eb - (1 if ma * mb >= 0.5 else 2)

    def overflow_boundaries(self) -> list[int]:
        """Exponents n where a product of 2^n would overflow a format a multiplier may write it
        in (emax + 1 of each output format: fp16 16, fp32 and bf16 128, ...), of those the
        elements' products reach."""
        high = self._largest_product_exponent()
        return sorted(
            {get_format(name).emax + 1 for name in SCHEMA["output"]["format"].choices}
            & set(range(high + 1))
        )

    def draw_from(self, *names: str) -> "Drawing":
        """Draw the families from here on from the stream of ``names`` under the context's seed
        (:func:`stream`): what one caller draws moves no other's rows."""
        self.rng = stream(self.seed, *names)
        return self

    def _exact_power_pair(self, exponent: int, normal: bool = False):
        """Codes (a, b) whose product is exactly 2^exponent, or None where no two powers of two
        the formats hold make it; with ``normal``, both elements normal (a subnormal element's
        exponent sum lies above its product: a window anchored there cuts the product)."""
        least = (self.A.fmt.min_normal, self.B.fmt.min_normal) if normal else (0.0, 0.0)
        return exact_power_pair(self.A.powers, self.B.powers, exponent, *least)

    def _cancel_row(self, batch: Batch, row: int) -> None:
        half = self.k // 2
        batch.a[row, half : half * 2] = self.A.negate(batch.a[row, :half])
        batch.b[row, half : half * 2] = batch.b[row, :half]
        batch.a[row, half * 2 :] = self.A.zero
        batch.scale_a[row] = batch.scale_a[row, 0]
        batch.scale_b[row] = batch.scale_b[row, 0]
        batch.c[row] = 0 if self.rng.integers(2) else self.c_bits([-0.0])[0]
