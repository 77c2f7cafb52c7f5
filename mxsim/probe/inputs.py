"""Input families the probes draw from: batches of dot products designed to expose one
datapath choice (cancellation, ties, tree positions, c placement, specials), plus random
realistic vectors. Everything is built from the format table (no per-format code)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from ..datapath.schema import SCHEMA
from ..formats import get_format
from .units import c_code_bits

FP32 = get_format("fp32")
FP64 = get_format("fp64")

#: Scale codes finite and nonzero both as E8M0 (2^-87 .. 2^-1) and as UE4M3 (2^-3 .. 448): rows
#: with these tell the two scale formats apart before the probe knows which the unit reads.
SHARED_SCALE_CODES = np.arange(0x28, 0x7F, dtype=np.uint8)


@dataclass
class Batch:
    """n dot products as the unit takes them (see :mod:`mxsim.probe.units`)."""

    a: np.ndarray        # (n, K) uint64 stored codes
    b: np.ndarray
    scale_a: np.ndarray  # (n, blocks) uint8
    scale_b: np.ndarray
    c: np.ndarray        # (n,) c's carrier bits: uint32 fp32 bits, or uint64 fp64 bits for fp64 c

    def __len__(self) -> int:
        return len(self.a)

    def take(self, rows) -> "Batch":
        return Batch(self.a[rows], self.b[rows], self.scale_a[rows], self.scale_b[rows], self.c[rows])

    def put(self, rows, other: "Batch") -> "Batch":
        """The batch with ``rows`` replaced by other's rows (in order); returns self."""
        for name in ("a", "b", "scale_a", "scale_b", "c"):
            getattr(self, name)[rows] = getattr(other, name)
        return self

    @staticmethod
    def join(batches) -> "Batch":
        batches = list(batches)
        batches = [batch for batch in batches if len(batch)] or batches[:1]  # all empty: the first
        return Batch(*(np.concatenate([getattr(batch, name) for batch in batches])
                       for name in ("a", "b", "scale_a", "scale_b", "c")))

    def row(self, i: int) -> dict:
        """Row i as plain numbers (the evidence report's record of a decisive input)."""
        return {"a": [int(x) for x in self.a[i]], "b": [int(x) for x in self.b[i]],
                "scale_a": [int(x) for x in self.scale_a[i]], "scale_b": [int(x) for x in self.scale_b[i]],
                "c": f"0x{int(self.c[i]):0{2 * self.c.itemsize}x}"}


def fp32_bits(values) -> np.ndarray:
    """float64 values rounded to fp32 (past its range: +-Inf), as bit patterns."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float32).view(np.uint32)


def stream(seed: int, *names: str) -> np.random.Generator:
    """A random generator of its own for ``names`` (a probe's name, a part of the run) under a
    run's ``seed``: numpy's SeedSequence over the seed and a BLAKE2b digest of each name, so
    that it is the same in every process (Python's ``hash`` of a string is salted per
    process) and no other stream's draws move it."""
    digests = [int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") for name in names]
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
        exponents = np.arange(-160, 160)
        powers = np.exp2(exponents.astype(float))
        exact = self.fmt.decode(self.fmt.encode(powers)) == powers
        #: exponent y -> the code of 2^y, for every power of two the format holds (from 2^-160 to 2^159)
        self.powers = dict(zip(exponents[exact].tolist(), self.fmt.encode(powers[exact]).astype(np.uint64).tolist()))

    def _specials(self) -> list[int]:
        field_bits = self.fmt.bits - self.fmt.padding_bits
        if field_bits > 20:
            probe = np.array([np.inf, -np.inf, np.nan], dtype=np.float64)
            codes = self.fmt.encode(probe, overflow="inf_nan") if self.fmt.has_nan else np.array([], dtype=np.uint64)
            return sorted({int(c) for c, v in zip(codes, self.fmt.decode(codes)) if not np.isfinite(v)})
        codes = (np.arange(1 << field_bits, dtype=np.int64) << self.fmt.padding_bits).astype(np.uint64)
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
        self.power_codes, self.power_exponents = self.codes[powers], np.log2(self.values[powers]).astype(np.int64)
        self.zero = int(self.codes[self.values == 0][0]) if (self.values == 0).any() else None

    def power(self, exponent) -> np.ndarray:
        """Codes of 2^exponent (elementwise), the nearest power the format holds."""
        exponent = np.clip(np.asarray(exponent), self.power_exponents[0], self.power_exponents[-1])
        return self.power_codes[np.searchsorted(self.power_exponents, exponent)]

    def between(self, rng, low: int, high: int, shape) -> np.ndarray:
        """Random finite codes of values in [2^low, 2^(high+1)) (the nearest nonzero ones if none)."""
        inside = np.flatnonzero((self.values >= 2.0 ** low) & (self.values < 2.0 ** (high + 1)))
        if not inside.size:
            nonzero = np.flatnonzero(self.values > 0)
            inside = nonzero[[0]] if 2.0 ** high < self.values[nonzero[0]] else nonzero[[-1]]
        return self.codes[rng.choice(inside, size=shape)]


class Context:
    """What the probes know of the unit's interface: formats, K, block size, output format,
    the scale format held so far (scale codes are written in it); a seeded generator; a pool
    of element pairs indexed by their product's exponent."""

    def __init__(self, a_format: str, b_format: str, k: int, block_size: int, out_format: str, seed: int = 0,
                 scale_format: str = "e8m0", c_format: str = "fp32"):
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
        self.A = _Operand(get_format(a_format), self.rng)
        self.B = _Operand(get_format(b_format), self.rng)
        pairs = 1 << 15
        ia = self.rng.integers(0, len(self.A.codes), pairs)
        ib = self.rng.integers(0, len(self.B.codes), pairs)
        with np.errstate(over="ignore", under="ignore"):  # fp64 elements: products past float64's range
            products = self.A.values[ia] * self.B.values[ib]
        keep = (products > 0) & np.isfinite(products)  # positive products; signs are applied per term
        self.pool_a, self.pool_b = self.A.codes[ia][keep], self.B.codes[ib][keep]
        self.pool_exponent = np.floor(np.log2(products[keep])).astype(np.int64)
        self.exponents = np.unique(self.pool_exponent)

    # -- c wider than 32 bits: its carrier

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
        self.c_extremes = [] if self.c_carrier is FP32 else [
            self.c_carrier.max_finite, -self.c_carrier.max_finite, tiny, -tiny, np.ldexp(1.0, 1 - self.c_carrier.bias)]

    def c_bits(self, values) -> np.ndarray:
        """float64 values rounded to c's carrier (nearest even; past its range +-Inf), as bits."""
        with np.errstate(over="ignore"):
            return np.asarray(values, dtype=self.c_dtype).view(self.c_code_dtype)

    def c_format_edge(self, n: int) -> Batch:
        """c subnormal in c's format or in its lowest normal binades (a value of the format
        after :meth:`fit_c`), with one to three terms of its size and up to 30 binades below:
        the emin a subnormal c aligns at in the first tree (``inputs.c_format`` under
        ``accumulator_exponent: format_emin``)."""
        batch = self.empty(n)
        fmt = get_format(self.c_format)
        emin = 1 - fmt.bias
        for row in range(n):
            exponent = emin - int(self.rng.integers(-1, fmt.mantissa_bits + 1))
            negative = bool(self.rng.integers(2))
            batch.c[row] = self.random_c(exponent, negative, bits=int(self.rng.integers(1, fmt.mantissa_bits + 2)))
            for position in self.positions(int(self.rng.integers(1, 4))):
                self.set_term(batch, row, int(position), exponent + int(self.rng.integers(-30, 4)), bool(self.rng.integers(2)))
        return batch

    # -- building blocks

    def fit_c(self, batch: Batch) -> Batch:
        """The batch with each c rounded (to nearest even, past the range to +-Inf) to a value of
        the unit's c format: a unit taking fp16 c is asked only fp16 values."""
        if self.c_format != self.c_carrier.name:
            fmt = get_format(self.c_format)
            batch.c[:] = self.c_bits(fmt.decode(fmt.encode(batch.c.view(self.c_dtype), overflow="inf_nan")))
        return batch

    def empty(self, n: int) -> Batch:
        """n rows of +0 elements, scales 1, c = +0."""
        return Batch(np.full((n, self.k), self.A.zero, np.uint64), np.full((n, self.k), self.B.zero, np.uint64),
                     np.full((n, self.blocks), self.scale.one, np.uint8), np.full((n, self.blocks), self.scale.one, np.uint8),
                     np.zeros(n, self.c_code_dtype))

    def pair_at(self, exponent: int) -> tuple[int, int, int]:
        """A random element pair whose product's exponent is the pool's nearest to ``exponent``
        (returns a code, b code, the product's exponent)."""
        nearest = self.exponents[np.argmin(np.abs(self.exponents - exponent))]
        choices = np.flatnonzero(self.pool_exponent == nearest)
        i = choices[self.rng.integers(len(choices))]
        return int(self.pool_a[i]), int(self.pool_b[i]), int(nearest)

    def set_term(self, batch: Batch, row: int, position: int, exponent: int, negative: bool,
                 pair: tuple[int, int, int] | None = None) -> int:
        """Put a product of about 2^exponent (``pair``'s, when given) at (row, position);
        returns its exponent. Where the elements cannot reach it and the position's block
        holds nothing else yet, the block's A scale makes up the difference, and B's what
        A's cannot reach (a unit without scales ignores them)."""
        a, b, got = pair or self.pair_at(exponent)
        if negative:
            a = self.A.negated(a)
        block = position // self.block_size
        members = slice(block * self.block_size, (block + 1) * self.block_size)
        alone = (np.all(batch.a[row, members] == self.A.zero) and batch.scale_a[row, block] == self.scale.one
                 and batch.scale_b[row, block] == self.scale.one)
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
        return np.concatenate([distinct, self.rng.integers(0, self.k, max(extra, 0))]) if extra > 0 else distinct

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

    # -- families

    def realistic(self, n: int, scaled: bool = True) -> Batch:
        """Gaussian data quantized into each operand format (per-block max to the format's
        largest value, times 2^-U{0..3}), scales near 1, c of the dot's size (a fifth zero)."""
        batch = self.empty(n)
        for operand, out in ((self.A, batch.a), (self.B, batch.b)):
            fmt = operand.fmt
            x = self.rng.standard_normal((n, self.k))
            for start in range(0, self.k, self.block_size):
                block = x[:, start:start + self.block_size]
                peak = np.abs(block).max(axis=1, keepdims=True)
                largest = min(fmt.max_finite, 2.0 ** 16)  # wide formats: moderate magnitudes
                shift = self.rng.integers(0, 4, (n, 1)) + (self.rng.integers(-6, 7, (n, 1)) if largest >= 2 ** 16 else 0)
                x[:, start:start + self.block_size] = block / peak * largest * np.exp2(-shift.astype(float))
            out[:] = fmt.encode(x).astype(np.uint64)
        if scaled:
            batch.scale_a[:] = self.scale.between(self.rng, -4, 4, batch.scale_a.shape)
            batch.scale_b[:] = self.scale.between(self.rng, -4, 4, batch.scale_b.shape)
        typical = np.sqrt(self.k) * min(self.A.fmt.max_finite, 2.0 ** 16) * min(self.B.fmt.max_finite, 2.0 ** 16) / 4
        c = self.rng.standard_normal(n) * typical * np.exp2(self.rng.integers(-8, 3, n))
        c[self.rng.random(n) < 0.2] = 0.0
        batch.c[:] = self.c_bits(np.clip(c, -3e38, 3e38))
        return batch

    def uniform(self, n: int) -> Batch:
        """Uniformly random codes (any code, specials included: the whole dynamic range),
        scales 1 +- 8 binades, c from random fp32 bits or of the dot's size."""
        batch = self.empty(n)
        for operand, out in ((self.A, batch.a), (self.B, batch.b)):
            fmt = operand.fmt
            fields = random_fields(self.rng, fmt.bits - fmt.padding_bits, (n, self.k))
            codes = (fields << fmt.padding_bits).astype(np.uint64)
            if fmt.twos_complement:  # the most negative code has no negation; keep it rare
                codes[self.rng.random(codes.shape) < 0.5] = operand.zero
            out[:] = codes
        batch.scale_a[:] = self.scale.between(self.rng, -8, 8, batch.scale_a.shape)
        batch.scale_b[:] = self.scale.between(self.rng, -8, 8, batch.scale_b.shape)
        batch.c[:] = self.rng.integers(0, 1 << self.c_carrier.bits, n, dtype=np.uint64).astype(self.c_code_dtype)
        sized = self.rng.random(n) < 0.5
        high = float(self.span()[1])
        with np.errstate(over="ignore"):  # fp64 products reach 2^2046: such a c is +-Inf
            batch.c[sized] = self.c_bits(self.rng.standard_normal(int(sized.sum())) * np.exp2(high + self.rng.integers(-8, 4, int(sized.sum()))))
        return batch

    def cancellation(self, n: int) -> Batch:
        """A product and its exact negation (or a near negation) and 1-4 small terms 0..60
        binades below them (0..2p+8 for a c or output of p > 24 significant bits: fp64's
        106-bit products): what survives shows the window width and how bits below it go."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            place = self.positions(6)
            top = int(self.rng.integers(max(low, high - 8), high + 1))
            a, b, top = self.pair_at(top)
            batch.a[row, place[0]], batch.b[row, place[0]] = a, b
            batch.a[row, place[1]] = self.A.negated(a)
            batch.b[row, place[1]] = b
            if row % 4 == 3:  # near negation: b's neighbouring code
                batch.b[row, place[1]] = b ^ np.uint64(1 << self.B.fmt.padding_bits)
            for i in range(2, 2 + int(self.rng.integers(1, 5))):
                if i < len(place):
                    self.set_term(batch, row, place[i], top - int(self.rng.integers(0, self.reach)), bool(self.rng.integers(2)))
            if row % 3 == 2:
                batch.c[row] = self.random_c(top - int(self.rng.integers(0, self.reach)), bool(self.rng.integers(2)))
        return batch

    def ties(self, n: int) -> Batch:
        """c and terms near its rounding points in fp32, fp16 and bf16, and fp64 for an fp64 c or
        output (half an ulp, a quarter, just above): rounding modes, ties and sticky bits."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            exponent = int(self.rng.integers(low, high + 3))
            if row % 4 == 0:  # no c: a large term is the reference
                exponent = self.set_term(batch, row, int(self.rng.integers(self.k)), exponent, bool(self.rng.integers(2)))
                first = 1
            else:
                batch.c[row] = self.random_c(exponent, bool(self.rng.integers(2)), bits=int(self.rng.choice(self.precisions)))
                first = 0
            precision = int(self.rng.choice(self.precisions))
            place = self.positions(4)
            for i in range(first, first + int(self.rng.integers(1, 4))):
                gap = precision + int(self.rng.integers(-2, 8))
                self.set_term(batch, row, place[i], exponent - gap, bool(self.rng.integers(2)))
        return batch

    def output_ties(self, n: int) -> Batch:
        """c a rounding point of the output (half an ulp past one of its normal values, either
        sign) and a term of either sign 1..16 binades below the last bit of a wider
        precision (fp32's 24 bits for an fp16 or bf16 output, fp16's 11 for bf16): the exact
        result lies a hair off the tie, closer than that precision holds, so an accumulator
        that rounds to it first puts the result on the tie or beside it, and the output's
        rounding shows whether and how (an fp32 accumulator rounding toward -inf against an
        exact one, under an fp16 output). No rows where no precision listed is wider than the
        output's (an fp32 output with fp32 c)."""
        output_bits = self.out_fmt.mantissa_bits + 1
        wider = [p for p in self.precisions if p > output_bits]
        if not wider:
            return self.empty(0)
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            precision = int(self.rng.choice(wider))
            gap = precision + int(self.rng.integers(1, 17))
            # the tie's exponent: in the output's normal range, where the term gap binades below
            # it is a product the elements make (else its block's scales make up the difference)
            first, last = max(self.out_emin, low + gap), min(self.out_fmt.emax - 1, high + gap)
            if first > last:
                first, last = self.out_emin, self.out_fmt.emax - 1
            exponent = int(self.rng.integers(first, last + 1))
            significand = (1 << output_bits) | int(self.rng.integers(0, 1 << (output_bits - 1))) << 1 | 1
            negative = bool(self.rng.integers(2))
            batch.c[row] = self.c_bits([math.ldexp(-significand if negative else significand, exponent - output_bits)])[0]
            self.set_term(batch, row, int(self.rng.integers(self.k)), exponent - gap, bool(self.rng.integers(2)))
        return batch

    def window_ties(self, n: int) -> Batch:
        """For an output narrower than fp32 (else no rows): positive products summing to a tie
        of the output, 2^e (one power of two, or two equal ones) and 2^(e-p) (half the output's
        last place at 2^e; p its precision), e in the output's normal range, all in one aligned
        group of four positions (one tree of any size from 4, and no narrow accumulator
        rounding between them), and c = +2^(e-d), d of p+2..50 (every other row at most
        e + 24, inside fp16's range). Exact, c breaks the tie upward; a window narrower than
        about d bits drops c and the tie rounds to 2^e's even significand. So the output shows
        the width where the products span too few binades for any of them to pass a window
        (E2M3: 2^-6 to 2^6), c alone reaching past it. No rows where the elements make no such
        sum."""
        pairs, options = self._output_ties()
        if not options:
            return self.empty(0)
        precision = self.out_fmt.mantissa_bits + 1
        batch = self.empty(n)
        for row in range(n):
            e, h = options[int(self.rng.integers(len(options)))]
            start = 4 * int(self.rng.integers(max(self.k // 4, 1)))
            group = np.arange(start, min(start + 4, self.k))
            place = self.rng.choice(group, size=(1 << (e - h)) + 1, replace=False)
            batch.a[row, place[:-1]], batch.b[row, place[:-1]] = pairs[h]
            batch.a[row, place[-1]], batch.b[row, place[-1]] = pairs[e - precision]
            batch.c[row] = self.c_bits([math.ldexp(1.0, e - self._tiny_gap(row, e))])[0]
        return batch

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
        return pairs, [(e, h) for h in sorted(pairs) for e in (h, h + 1)
                       if e - precision in pairs and self.out_emin <= e < self.out_fmt.emax and (e == h or self.k >= 3)]

    def _tiny_gap(self, row: int, exponent: int) -> int:
        """How many binades below 2^exponent a tiny c goes: p+2..50 (p the output's precision),
        every other row at most exponent + 24 (a c inside fp16's range)."""
        precision = self.out_fmt.mantissa_bits + 1
        farthest = 50 if row % 2 else max(precision + 2, min(50, exponent + 24))
        return int(self.rng.integers(precision + 2, farthest + 1))

    def spread_ties(self, n: int) -> Batch:
        """For an output narrower than fp32 and K >= 5 (else no rows): the products of
        :meth:`window_ties` (2^e, and on every other row its tie's last bit 2^(e-p)) and a
        product 2^x beside its negation (x from e to the top of the span), all at random
        positions across K and negated together on a random half of the rows; c = 2^(x-g), g
        one of the precisions wider than the output's or one more, of either sign beside a tie
        and of the sign opposite the products' beside a value. Exact, c moves the result off
        the tie (which a rounding to nearest shows) or off the value (a rounding toward zero).
        Where 2^x and -2^x share a tree they cancel there, and c passes any window wider than
        g; in two trees the accumulator between them holds 2^x + c, and its precision cuts c.
        So the rows show which positions share a tree where the products are exact in any
        window and nothing else does (b200-tcgen05 E3M2 x E2M1 -> bf16)."""
        pairs, options = self._output_ties()
        options = [(e, h) for e, h in options if max(pairs) >= e]
        if not options or self.k < 5:
            return self.empty(0)
        precision = self.out_fmt.mantissa_bits + 1
        wider = [p for p in self.precisions if p > precision]
        batch = self.empty(n)
        for row in range(n):
            e, h = options[int(self.rng.integers(len(options)))]
            above = [x for x in pairs if x >= e]
            x = above[int(self.rng.integers(len(above)))]
            tie = bool(row % 2)
            terms = [pairs[h]] * (1 << (e - h)) + [pairs[e - precision]] * tie + [
                pairs[x], (self.A.negated(pairs[x][0]), pairs[x][1])]
            negative = bool(self.rng.integers(2))
            for position, (a, b) in zip(self.rng.choice(self.k, size=len(terms), replace=False), terms):
                batch.a[row, position], batch.b[row, position] = (self.A.negated(a) if negative else a), b
            c_negative = bool(self.rng.integers(2)) if tie else not negative
            gap = int(self.rng.choice(wider)) + int(self.rng.integers(0, 2))
            batch.c[row] = self.c_bits([math.ldexp(-1.0 if c_negative else 1.0, x - gap)])[0]
        return batch

    def cancelled_c(self, n: int) -> Batch:
        """For an output narrower than fp32 (else no rows): a product near the largest, 2^top,
        at position 0, its negation at position K - 1 (in a later tree for every tree shorter
        than K), and c with 24 random significant bits, of either sign, 16..32 binades below
        2^top. Where c enters with 2^top, an fp32 accumulator (or a window) keeps only its bits
        above 2^top's last place, rounded its way, and the cancellation leaves those as the
        result, which the narrow output shows; c added at the end stays whole. The results of
        narrow products (b200-tcgen05 E2M3 x E2M1 -> bf16) show this on no other rows."""
        if self.out_fmt.mantissa_bits >= FP32.mantissa_bits or self.k < 2:
            return self.empty(0)
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            a, b, top = self.pair_at(int(self.rng.integers(max(low, high - 3), high + 1)))
            batch.a[row, 0], batch.b[row, 0] = a, b
            batch.a[row, self.k - 1], batch.b[row, self.k - 1] = self.A.negated(a), b
            batch.c[row] = self.random_c(top - int(self.rng.integers(16, 33)), bool(self.rng.integers(2)), bits=24)
        return batch

    def scaled_zeros(self, n: int) -> Batch:
        """Elements +0 only, c = -0, and one block's scales putting its trees' scale exponent X
        anywhere in -150..0 (the other blocks' scales 1). Each tree's products sum to exactly
        zero: a fixed-point grid whose last place 2^(X-n) lies more than its
        accumulator_max_right_shift places above the zero accumulator's passes the -0 through,
        else the sum is +0, so the sign shows n + that shift. Random rows meet such scales only
        in corners, and where the products are exact on any grid of a few bits (E2M3, E3M2)
        nothing else shows it (mxdotp-rmm E2M3 x E2M3 -> bf16, E3M2 x E3M2 -> fp32)."""
        batch = self.empty(n)
        blocks = self.rng.integers(self.blocks, size=n)
        exponents = self.rng.integers(-150, 1, size=n)
        batch.scale_a[np.arange(n), blocks] = self.scale.power(exponents // 2)
        batch.scale_b[np.arange(n), blocks] = self.scale.power(exponents - exponents // 2)
        batch.c[:] = self.c_bits([-0.0])[0]
        return batch

    def trees(self, n: int) -> Batch:
        """A product B at one position, -B at another, a small term at a third (and sometimes
        c = B): which terms share a tree, and in what order trees meet the accumulator."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            place = self.positions(4)
            top = int(self.rng.integers(max(low, high - 6), high + 1))
            a, b, top = self.pair_at(top)
            batch.a[row, place[0]], batch.b[row, place[0]] = a, b
            if row % 3 == 0:
                batch.c[row] = int(self.c_bits([-(self.A.fmt.decode(np.array([a], np.uint64))[0]
                                                * self.B.fmt.decode(np.array([b], np.uint64))[0])])[0])
            else:
                batch.a[row, place[1]] = self.A.negated(a)
                batch.b[row, place[1]] = b
                if row % 6 == 1:  # a full-precision c below B: rounded with B in the accumulator unless B cancels first
                    batch.c[row] = self.random_c(top - int(self.rng.integers(1, 13)), bool(self.rng.integers(2)))
            gap = int(self.rng.integers(4, 30))
            if len(place) > 2:  # K = 2: B and -B alone
                self.set_term(batch, row, place[2], top - gap, bool(self.rng.integers(2)))
            if row % 2 and len(place) > 3:
                self.set_term(batch, row, place[3], top - int(self.rng.integers(4, 30)), bool(self.rng.integers(2)))
        return batch

    def sum_cancel(self, n: int) -> Batch:
        """A tree's sum cancelled by c down to its low bits: a term of 2^top and 2-5 of either
        sign 1 to the window held (24 when null) binades below it, in one aligned run of 4..32
        positions (one tree for every tree size of a power of two at least the run), and c the
        negated exact sum rounded to 5-10 significant bits, so that what is left is the sum's
        low bits: a tree sum rounded to fewer bits than the terms span shows even in a narrow
        output."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            size = min(1 << int(self.rng.integers(2, 6)), self.k)
            start = int(self.rng.integers(0, self.k // size)) * size
            place = self.rng.permutation(np.arange(start, start + size))[:int(self.rng.integers(3, 7))]
            reach = max(1, min(self.window if self.window is not None else 24, high - low))
            top = int(self.rng.integers(min(high, low + reach), high + 1))
            self.set_term(batch, row, int(place[0]), top, bool(self.rng.integers(2)))
            for position in place[1:]:
                self.set_term(batch, row, int(position), top - int(self.rng.integers(1, reach + 1)), bool(self.rng.integers(2)))
            blocks = np.arange(self.k) // self.block_size
            scales = (self.scale.fmt.decode(batch.scale_a[row].astype(np.uint64))[blocks]
                      * self.scale.fmt.decode(batch.scale_b[row].astype(np.uint64))[blocks])
            total = float(np.sum(self.A.fmt.decode(batch.a[row]) * self.B.fmt.decode(batch.b[row]) * scales))
            if total and math.isfinite(total):
                step = 2.0 ** (math.floor(math.log2(abs(total))) - int(self.rng.integers(4, 10)))
                batch.c[row] = self.c_bits([-round(total / step) * step])[0]
        return batch

    def pair_trees(self, n: int) -> Batch:
        """B, -B and a term 8..40 binades smaller at three positions of one aligned run of 2^j
        positions (or B and -B in a run of 2, the small term anywhere): which pairs a balanced
        tree of rounded adds sums first, against a chain or a fused tree (a small term added to
        B before -B is lost to the rounding, added to B - B = 0 it stays)."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            size = 1 << int(self.rng.integers(1, max(2, self.k.bit_length())))
            size = min(size, 1 << (self.k.bit_length() - 1))
            start = int(self.rng.integers(0, self.k // size)) * size
            run = self.rng.permutation(np.arange(start, start + size))
            if size < 2:  # K = 1
                place = [int(p) for p in self.positions(3)]
            else:
                place = [int(p) for p in run[:3]] if size >= 4 else [*map(int, run[:2]), int(self.rng.integers(self.k))]
            if place[2] in place[:2]:
                place = place[:2]
            a, b, top = self.pair_at(int(np.clip(self.rng.integers(-8, 9), low, high)))  # inside every float's range
            batch.a[row, place[0]], batch.b[row, place[0]] = a, b
            batch.a[row, place[1]], batch.b[row, place[1]] = self.A.negated(a), b
            if len(place) == 3:
                self.set_term(batch, row, place[2], top - int(self.rng.integers(8, 41)), bool(self.rng.integers(2)))
            if row % 4 == 3:
                batch.c[row] = self.random_c(top - int(self.rng.integers(8, 41)), bool(self.rng.integers(2)))
        return batch

    def accumulator_entry(self, n: int) -> Batch:
        """c far above or below the products, or cancelling one: where c enters."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            terms = self.positions(int(self.rng.integers(1, 5)))
            exponents = [self.set_term(batch, row, p, int(self.rng.integers(low, high + 1)), bool(self.rng.integers(2)))
                         for p in terms]
            gap = int(self.rng.integers(-40, 41))
            batch.c[row] = self.random_c(max(exponents) + gap, bool(self.rng.integers(2)), bits=int(self.rng.choice([1, 8, 24])))
        return batch

    def zero_results(self, n: int) -> Batch:
        """Results that are exactly zero: all products +-0 with c = +-0, a product cancelled
        by c or by its negation (c = -0 beside it), and negative sums that underflow the
        output (scales or c that put them far below its range): the sign of a zero."""
        batch = self.empty(n)
        for row in range(n):
            kind = row % 4
            if kind == 0:  # signed zero elements only
                self._negative_zero_products(batch, row, self.rng.random(self.k) < 0.5)
                batch.c[row] = self.c_bits([-0.0 if self.rng.integers(2) else 0.0])[0]
            elif kind == 1:  # a product and c = -product
                low, high = self.span()
                a, b, _ = self.pair_at(int(self.rng.integers(low, high + 1)))
                place = int(self.rng.integers(self.k))
                batch.a[row, place], batch.b[row, place] = a, b
                value = float(self.A.fmt.decode(np.array([a], np.uint64))[0] * self.B.fmt.decode(np.array([b], np.uint64))[0])
                batch.c[row] = self.c_bits([-value])[0]
            elif kind == 2:  # a product and its negation, c = -0
                self._cancel_row(batch, row)
                batch.c[row] = self.c_bits([-0.0])[0]
            else:  # a tiny negative result: below the output's smallest subnormal
                target = self.out_emin - self.out_fmt.mantissa_bits - int(self.rng.integers(1, 4))
                low, high = self.span()
                exponent = self.set_term(batch, row, int(self.rng.integers(self.k)), int(np.clip(target, low, high)), True)
                if exponent > target:  # the elements cannot reach it: c alone is the result
                    batch.a[row], batch.b[row] = self.A.zero, self.B.zero
                    batch.c[row] = self.c_bits([-np.ldexp(1.0, max(target, self.c_min_exponent))])[0]
        return batch

    def zero_chains(self, n: int) -> Batch:
        """Chains whose early step leaves a zero that later steps of -0 products meet: three
        rows in four put a negative product below a quarter of the smallest subnormal of fp32,
        of c's carrier and of the output (the smallest A element times an element of 2^-3 or
        less, scales making up what the elements cannot reach) in the first half, which a
        step rounds to -0; the fourth cancels a * 1 with -a * 1 (a of 2^-60..2^60, which a
        step holds exactly) in the first two positions (+0). Every other product is -0 and c is +-0: an accumulator that signs each
        step's zero (``zero_sign: ieee_steps``) keeps the -0, the whole sum's rule gives +0."""
        batch = self.empty(n)
        batch.b[:] = self.B.one  # -0 * 1 (or +0 * -0 where only B has a -0)
        self._negative_zero_products(batch, slice(None), slice(None))
        batch.c[:] = self.c_bits(np.where(self.rng.random(n) < 0.5, -0.0, 0.0))
        tiny_a, a_exponent = self._smallest_code(self.A)
        below = min(FP32, self.c_carrier, self.out_fmt, key=lambda fmt: fmt.min_subnormal)
        target = int(np.log2(below.min_subnormal)) - 2
        # elements of 2^-60 .. 2^60: a step holds each exactly (one is the smallest when none is)
        moderate = self.A.codes[np.abs(np.log2(np.abs(self.A.values))) <= 60]
        moderate = moderate if moderate.size else self.A.codes[[np.argmin(np.abs(self.A.values))]]
        for row in range(n):
            position = 0 if row % 2 else int(self.rng.integers(max(1, self.k // 2)))
            if row % 4 == 3:  # exact cancellation to +0 in the first two steps: a * 1 and -a * 1
                a = int(self.rng.choice(moderate))
                batch.a[row, :2] = [a, self.A.negated(a)][:self.k]
                batch.b[row, :2] = self.B.one
                continue
            b, b_exponent = self._smallest_code(self.B, largest=-3, rng=self.rng)
            batch.a[row, position] = self.A.negated(tiny_a)
            batch.b[row, position] = b
            shortfall = target - (a_exponent + b_exponent)
            if shortfall < 0:  # the block's scales take the product down (a unit without scales ignores them)
                block = position // self.block_size
                batch.scale_a[row, block] = self.scale.power(shortfall // 2)
                got = int(np.log2(self.scale.fmt.decode(batch.scale_a[row, block:block + 1].astype(np.uint64))[0]))
                batch.scale_b[row, block] = self.scale.power(shortfall - got)
        return batch

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

    def _smallest_code(self, operand: _Operand, largest: int | None = None, rng=None) -> tuple[int, int]:
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

    def overflow(self, n: int) -> Batch:
        """Sums just past the accumulator's range (fp32, or the output format's): c near the
        format's largest value with a term of its sign, or the largest elements at large
        scales. Under a directed rounding toward zero this tells +-Inf from the largest value."""
        batch = self.empty(n)
        low, high = self.full_span()  # sums past the range: never cut to the output's
        for row in range(n):
            fmt = FP32 if row % 2 else self.out_fmt
            top = math.frexp(fmt.max_finite)[1] - 1  # np.log2 rounds fp64's largest up to 1024
            negative = bool(self.rng.integers(2))
            if row % 3 == 2:  # the largest elements, scales that carry them past the range
                batch.a[row], batch.b[row] = self.A.max_code, self.B.max_code
                if negative:
                    batch.a[row] = self.A.negate(batch.a[row])
                need = top + 1 - (high + int(np.log2(self.k)))
                batch.scale_a[row] = self.scale.power(need // 2 + int(self.rng.integers(0, 3)))
                batch.scale_b[row] = self.scale.power(need - need // 2)
                continue
            significand = fmt.max_finite / 2.0 ** top * (1 - float(self.rng.random()) * 2.0 ** -(fmt.mantissa_bits - 2))
            batch.c[row] = self.c_bits([np.ldexp(significand, top) * (-1 if negative else 1)])[0]
            for position in self.positions(int(self.rng.integers(1, 4))):
                self.set_term(batch, row, int(position), top - int(self.rng.integers(0, fmt.mantissa_bits + 2)), negative)
        return batch

    def partial_overflow(self, n: int) -> Batch:
        """Realistic rows with one block emptied but for two terms of opposite signs, the later
        one or two binades above the earlier, the block's scales carrying the earlier just past
        the range of fp32 (odd rows) or of the output format (even rows): the block's exact sum
        overflows (or stays finite) with the later term's sign, while a tree, step or promotion
        that ends between them takes the earlier alone, overflows with its sign and keeps that
        ±Inf. They show where partial sums are rounded (tree size, promotion, term order) under
        scales at the extremes. Where the scales cannot carry the terms there (no scales,
        UE4M3), the products keep their own size, three binades below the largest."""
        batch = self.realistic(n)
        high = self.full_span()[1]
        for row in range(n):
            fmt = FP32 if row % 2 else self.out_fmt
            top = math.frexp(fmt.max_finite)[1] - 1
            block = int(self.rng.integers(self.blocks))
            start, stop = block * self.block_size, min((block + 1) * self.block_size, self.k)
            if stop - start < 2:
                continue
            batch.a[row, start:stop], batch.b[row, start:stop] = self.A.zero, self.B.zero
            early, late = sorted(int(p) for p in start + self.rng.choice(stop - start, 2, replace=False))
            negative = bool(self.rng.integers(2))
            a, b, exponent = self.pair_at(high - 3)  # room for the later term above it
            batch.a[row, early] = self.A.negated(a) if negative else a
            batch.b[row, early] = b
            a, b, _ = self.pair_at(exponent + int(self.rng.integers(1, 3)))
            batch.a[row, late] = a if negative else self.A.negated(a)
            batch.b[row, late] = b
            shift = top + 1 - exponent
            batch.scale_a[row, block] = self.scale.power(shift // 2)
            batch.scale_b[row, block] = self.scale.power(shift - shift // 2)
        return batch

    def subnormal_accumulator(self, n: int) -> Batch:
        """c subnormal in fp32 or in the output format, with terms of its size and a little
        above or below it: the exponent a subnormal accumulator aligns with."""
        batch = self.empty(n)
        for row in range(n):
            fmt = FP32 if row % 2 else self.out_fmt
            emin = 1 - fmt.bias
            exponent = emin - int(self.rng.integers(1, fmt.mantissa_bits + 1))
            bits = max(1, exponent - (emin - fmt.mantissa_bits) + 1)
            batch.c[row] = self.random_c(exponent, bool(self.rng.integers(2)), bits=min(bits, self.c_precision))
            for position in self.positions(int(self.rng.integers(1, 4))):
                self.set_term(batch, row, int(position), exponent + int(self.rng.integers(-30, 8)), bool(self.rng.integers(2)))
        return batch

    def tiny_terms(self, n: int) -> Batch:
        """One to three terms far below 1 (2^-200 .. 2^0), zero products beside them and c = +-0
        or tiny: whether zeros take part in the alignment reference, and where."""
        batch = self.empty(n)
        for row in range(n):
            exponent = int(self.rng.integers(-200, 1))
            for position in self.positions(int(self.rng.integers(1, 4))):
                self.set_term(batch, row, int(position), exponent - int(self.rng.integers(0, 30)), bool(self.rng.integers(2)))
            if row % 3 == 0:
                batch.c[row] = self.random_c(exponent - int(self.rng.integers(-10, 30)), bool(self.rng.integers(2)))
            elif row % 3 == 1:
                batch.c[row] = self.c_bits([-0.0])[0]
        return batch

    def zero_anchor(self, n: int) -> Batch:
        """c = +-0 beside a power-of-two term in the output's subnormal range or just above
        (its block's scales carry it there) and, in another block where there is one, a term of
        the other sign a window below a random anchor at or above the large term: where zero
        terms (c, zero products, all-zero groups) pull the reference up to that anchor or
        above, the window drops the small term; else it stays, and the sum rounded toward zero
        is one step lower. Scaled units meet such references only through tiny scales (E8M0
        group sums, whose zero groups count at 2^-139 in MMA-Sim's model)."""
        batch = self.empty(n)
        lowest = self.out_emin - self.out_fmt.mantissa_bits
        powers = (_powers_of_two(self.A), _powers_of_two(self.B))
        for row in range(n):
            top = int(self.rng.integers(lowest, self.out_emin + 2))
            negative = bool(self.rng.integers(2))
            first = int(self.rng.integers(min(self.block_size, self.k)))
            self.set_term(batch, row, first, top, negative, pair=self._nearest_power_pair(powers, top))
            others = [j for j in range(self.blocks) if j != first // self.block_size]
            if others:
                block = int(self.rng.choice(others))
                position = block * self.block_size + int(self.rng.integers(min(self.block_size, self.k - block * self.block_size)))
            else:
                position = (first + 1 + int(self.rng.integers(self.k - 1))) % self.k if self.k > 1 else first
            anchor = int(self.rng.integers(top, self.out_emin + 3))  # a zero term there or above cuts the small term
            window = self.window if self.window is not None else int(self.rng.integers(20, 41))
            gap = top - anchor + window + int(self.rng.integers(0, 3))
            if position != first:
                self.set_term(batch, row, position, top - gap, not negative)
            batch.c[row] = fp32_bits([-0.0 if row % 2 else 0.0])[0]
        return batch

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

    def grid(self, n: int) -> Batch:
        """c 0..150 binades above or below the products, and products that sum to exactly zero
        beside a c far above or below them: a fixed-point grid's reach for the accumulator."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            top = int(self.rng.integers(low, high + 1))
            if row % 3 == 0:  # an exact zero sum
                a, b, top = self.pair_at(top)
                place = self.positions(2)
                batch.a[row, place[0]], batch.b[row, place[0]] = a, b
                batch.a[row, place[1]] = self.A.negated(a)
                batch.b[row, place[1]] = b
            else:
                top = max(self.set_term(batch, row, int(p), top - int(self.rng.integers(0, 8)), bool(self.rng.integers(2)))
                          for p in self.positions(int(self.rng.integers(1, 4))))
            gap = int(self.rng.integers(-150, 151))
            batch.c[row] = self.random_c(int(np.clip(top + gap, -140, 126)), bool(self.rng.integers(2)),
                                         bits=int(self.rng.choice([1, 8, 24])))
        return batch

    def scales(self, n: int) -> Batch:
        """Realistic rows with scales spread over the scale format's range (tiny, huge, NaN
        scales), B's near the reciprocal of A's."""
        batch = self.realistic(n)
        shape = batch.scale_a.shape
        batch.scale_a[:] = self.rng.choice(self.scale.codes, size=shape)
        value = self.scale.fmt.decode(batch.scale_a.astype(np.uint64))
        exponent = -np.floor(np.log2(np.where(value > 0, value, 1.0))).astype(np.int64)
        batch.scale_b[:] = self.scale.power(exponent + self.rng.integers(-40, 41, shape))
        batch.scale_a[self.rng.random(shape) < 0.05] = self.scale.nan
        batch.c[self.rng.random(n) < 0.5] = 0
        return batch

    def scale_formats(self, n: int) -> Batch:
        """Realistic rows whose scale codes are finite both as E8M0 and as UE4M3 (written before
        the probe knows which the unit reads), c zero in half the rows: whether scales matter,
        where they enter, and their format."""
        batch = self.realistic(n, scaled=False)
        for scales in (batch.scale_a, batch.scale_b):
            scales[:] = self.rng.choice(SHARED_SCALE_CODES, size=scales.shape)
        batch.c[self.rng.random(n) < 0.5] = 0
        return batch

    def groups(self, n: int) -> Batch:
        """Terms of mixed signs in one block, below the window's anchor (a c of one significant
        bit, or another block's scale over one product) by the window held (``window``; 0..60
        binades when it is null), so that the window cuts through their low bits: one cut of a
        group's exact sum differs from one per product, and an anchor at a binade boundary lets
        a result rounded toward zero show it. Every third row with another block has that
        block's products cancel exactly, which keeps its scale the anchor."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            block = int(self.rng.integers(self.blocks))
            members = np.arange(block * self.block_size, min((block + 1) * self.block_size, self.k))
            place = self.rng.choice(members, size=min(len(members), int(self.rng.integers(2, 7))), replace=False)
            top = int(self.rng.integers(max(low, high - 4), high + 1))
            negative = bool(self.rng.integers(2))
            for position in place:  # mostly of the anchor's other sign
                self.set_term(batch, row, int(position), top - int(self.rng.integers(0, 4)), bool(self.rng.random() < 0.7) != negative)
            gap = (int(self.rng.integers(0, 61)) if self.window is None
                   else self.window + top - int(self.rng.integers(0, 6)))
            others = [j for j in range(self.blocks) if j != block]
            if others and row % 2:  # another block's scale sets the anchor
                other = int(self.rng.choice(others))
                width = min(self.block_size, self.k - other * self.block_size)
                position = other * self.block_size + int(self.rng.integers(width))
                a, b, got = self.pair_at(int(self.rng.integers(low, high + 1)))  # its leading bit: anywhere
                if negative:
                    a = self.A.negated(a)
                batch.a[row, position], batch.b[row, position] = a, b
                if row % 3 == 0 and width > 1:  # its products cancel: the anchor is its scale, not its sum
                    twin = other * self.block_size + (position - other * self.block_size + 1) % width
                    batch.a[row, twin], batch.b[row, twin] = self.A.negated(a), b
                batch.scale_a[row, other] = self.scale.power(gap)
            else:
                batch.c[row] = self.c_bits([np.ldexp(-1.0 if negative else 1.0, int(np.clip(gap, -126, 127)))])[0]
        return batch

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
        return sorted({get_format(name).emax + 1 for name in SCHEMA["output"]["format"].choices} & set(range(high + 1)))

    def product_overflow(self, n: int) -> Batch:
        """A product of 2^(n-1) or 2^n for n an overflow boundary (or anywhere in the 64
        binades below the largest product, when none is reached), beside its negation (an
        exact zero, or NaN from Inf - Inf), a c of its size and the other sign, or a near
        negation: where a product becomes ±Inf."""
        batch = self.empty(n)
        high = self._largest_product_exponent()
        boundaries = self.overflow_boundaries()
        for row in range(n):
            place = self.positions(2)
            negative = bool(self.rng.integers(2))
            target = (int(self.rng.choice(boundaries)) - int(self.rng.integers(0, 2)) if boundaries
                      else high - int(self.rng.integers(0, 65)))
            exponent = self.set_term(batch, row, int(place[0]), target, negative)
            kind = row % 3
            if kind == 0 and len(place) > 1:
                batch.a[row, place[1]] = self.A.negate(batch.a[row, place[[0]]])[0]
                batch.b[row, place[1]] = batch.b[row, place[0]]
            elif kind == 1:
                batch.c[row] = self.random_c(min(exponent, 127), not negative)
            elif len(place) > 1:
                self.set_term(batch, row, int(place[1]), exponent - int(self.rng.integers(0, 3)), not negative)
        return batch

    def special_accumulator(self, n: int) -> Batch:
        """A NaN or ±Inf c, or a NaN or Inf element early in the row (half the rows, where A has
        such codes), then one product of 2^E later in the row, E across every exponent the
        elements' products reach: whether, and from which E up, a NaN or Inf accumulator no
        longer reaches the result (``adder.special_accumulator_exponent``)."""
        batch = self.empty(n)
        specials = self.c_bits([np.nan, np.inf, -np.inf])
        for row in range(n):
            early, late = sorted(int(p) for p in self.positions(2))
            low, high = self.full_span()  # products past a narrow output's range drop it too
            target = int(self.rng.integers(low, high + 1))
            self.set_term(batch, row, late, target, bool(self.rng.integers(2)))
            if row % 2 and self.A.special_codes and early != late:
                batch.a[row, early] = self.rng.choice(self.A.special_codes)
                batch.b[row, early] = self.B.one
            else:
                batch.c[row] = specials[self.rng.integers(len(specials))]
        return batch

    def flushed_results(self, n: int) -> Batch:
        """c just inside fp32's normal range and 1-2 terms of the other sign a little smaller:
        results at and below the smallest normal, negative in half the rows (a flushed or
        rounded-away result keeps or loses its sign), or subnormal c alone."""
        batch = self.empty(n)
        emin = 1 - FP32.bias
        for row in range(n):
            negative = bool(self.rng.integers(2))
            exponent = emin + int(self.rng.integers(0, 4))
            if row % 4 == 3:  # a subnormal c alone: read as a zero of its sign or as +0
                batch.c[row] = self.random_c(emin - int(self.rng.integers(1, 20)), negative, bits=1)
                continue
            batch.c[row] = self.random_c(exponent, negative, bits=int(self.rng.choice([1, 8, 24])))
            for position in self.positions(int(self.rng.integers(1, 3))):
                self.set_term(batch, row, int(position), exponent - int(self.rng.integers(0, 3)), not negative)
        return batch

    def draw_from(self, *names: str) -> "Context":
        """Draw the families from here on from the stream of ``names`` under the context's seed
        (:func:`stream`): what one caller draws moves no other's rows."""
        self.rng = stream(self.seed, *names)
        return self

    def subnormal_products(self, n: int) -> Batch:
        """A subnormal element of A or B times a large one of the other (a product well inside
        the normal range when the subnormal is read as itself), c zero or of the product's
        size: subnormal elements read as themselves or as zero, whatever the products become."""
        batch = self.empty(n)
        for row in range(n):
            for position in self.positions(int(self.rng.integers(1, 3))):
                small, large = (self.A, self.B) if (row + int(position)) % 2 else (self.B, self.A)
                subnormal = small.codes[np.abs(small.values) < small.fmt.min_normal]
                if not subnormal.size:
                    continue
                big = large.codes[np.abs(large.values) >= large.fmt.max_finite / 16]
                pair = (int(self.rng.choice(subnormal)), int(self.rng.choice(big)))
                a, b = pair if small is self.A else pair[::-1]
                batch.a[row, position], batch.b[row, position] = a, b
            if row % 2:
                value = float(self.A.fmt.decode(batch.a[row]) @ self.B.fmt.decode(batch.b[row]))
                batch.c[row] = fp32_bits([value * float(self.rng.uniform(-2, 2))])[0]
        return batch

    def _exact_power_pair(self, exponent: int, normal: bool = False):
        """Codes (a, b) whose product is exactly 2^exponent, or None where no two powers of two
        the formats hold make it; with ``normal``, both elements normal (a subnormal element's
        exponent sum lies above its product: a window anchored there cuts the product)."""
        for y, code in self.A.powers.items():
            if exponent - y in self.B.powers and (not normal or (2.0 ** y >= self.A.fmt.min_normal
                                                                 and 2.0 ** (exponent - y) >= self.B.fmt.min_normal)):
                return int(code), int(self.B.powers[exponent - y])
        return None

    def alignment_ties(self, n: int) -> Batch:
        """c of 24 significant bits, its last one even, of either sign, with half its ulp (a tie)
        and a power of two 1..16 binades below that, both positive, at the two positions of one
        aligned pair (2i, 2i + 1): the tie is broken (away from c's even neighbour) only if the
        second alignment keeps that power, so where it stops shows (n + 1 bits). In one pair the
        two share every tree of two or more products (in two trees the tie is rounded before the
        power arrives); positive, the tree sum's floor toward -inf drops the power (negative,
        it would break every tie whatever n is)."""
        batch = self.empty(n)
        low, high = self.span()
        low, high = max(low, -150), min(high, 103)  # c, 2^(half + 1) to 2^(half + 24), a normal fp32
        for row in range(n):
            half = int(self.rng.integers(low, high + 1))  # the tie's exponent, within the products
            j = int(self.rng.integers(1, 17))
            pairs = [self._exact_power_pair(half), self._exact_power_pair(half - j)]
            if None in pairs:
                continue
            negative = bool(self.rng.integers(2))
            significand = ((1 << 23) | int(self.rng.integers(0, 1 << 23))) & ~1
            # c's ulp is 2^(half + 1): the product 2^half is half of it
            batch.c[row] = fp32_bits([np.ldexp(float(significand), half + 1) * (-1 if negative else 1)])[0]
            place = self.positions(2)
            if place[0] ^ 1 < self.k:
                place[1] = place[0] ^ 1
            for position, (a, b) in zip(place, pairs):
                batch.a[row, position], batch.b[row, position] = a, b
        return batch

    def cancelled_ties(self, n: int) -> Batch:
        """For an output narrower than fp32 (else no rows): :meth:`alignment_ties` made visible
        there. c = ±(2^(h+24) + L·2^(h+2)), L of 1..p-1 bits (p the output's precision), an
        fp32 whose last bit is even; the pair 2^h (half its ulp: a tie) and 2^(h-j), j 1..16, at
        positions 2i, 2i + 1 in the first half; at position K - 1, in a later tree for any tree
        shorter than K, 2^(h+24) of c's other sign. The accumulator rounds the tie to c or to c's
        neighbour as the second alignment keeps 2^(h-j) or not (or, with it gone, as its
        rounding breaks ties); the last product cancels c's leading bit, so that the result,
        ±L·2^(h+2) or an fp32 ulp off, is exact in the output. Both elements of every product
        are normal powers of two."""
        if self.out_fmt.mantissa_bits >= FP32.mantissa_bits:
            return self.empty(0)
        batch = self.empty(n)
        precision = self.out_fmt.mantissa_bits + 1
        low, high = self.full_span()  # (the products lie outside the output's range: c cancels them)
        # products 2^(h-16) .. 2^(h+24); c a normal fp32; the result inside the output's range
        low = max(low + 16, -150, self.out_emin - precision)
        high = min(high - 24, 103, self.out_fmt.emax - precision - 1)
        if low > high:
            return self.empty(0)
        for row in range(n):
            half = int(self.rng.integers(low, high + 1))
            j = int(self.rng.integers(1, 17))
            pairs = [self._exact_power_pair(exponent, normal=True) for exponent in (half, half - j, half + 24)]
            negative = bool(self.rng.integers(2))
            low_bits = int(self.rng.integers(1, 1 << (precision - 1)))
            first = int(self.rng.integers(0, self.k // 2)) & ~1
            if None in pairs or first + 1 >= self.k - 1:
                continue
            value = np.ldexp(1.0, half + 24) + np.ldexp(float(low_bits), half + 2)
            batch.c[row] = self.c_bits([-value if negative else value])[0]
            for position, (a, b) in zip((first, first + 1), pairs[:2]):
                batch.a[row, position], batch.b[row, position] = a, b
            a, b = pairs[2]
            batch.a[row, self.k - 1] = a if negative else self.A.negated(a)
            batch.b[row, self.k - 1] = b
        return batch

    def corners(self, n: int) -> Batch:
        """Specials and extremes: NaN/Inf/max/min-subnormal elements, signed zeros, NaN and
        extreme scales, special c, sums past the output's range and below its normal range."""
        batch = self.realistic(n)
        special_c = self.c_bits([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, 1e-45, -1e-45,
                               1.1754944e-38, 6.1e-5, 65504.0, 65520.0, -65536.0, *self.c_extremes])
        for row in range(n):
            kind = row % 8
            place = self.positions(int(self.rng.integers(1, 4)))
            if kind == 0:  # special or extreme elements
                for operand, codes in ((self.A, batch.a), (self.B, batch.b)):
                    pick = operand.special_codes + [operand.max_code, operand.min_code, operand.negated(operand.zero)]
                    codes[row, place] = self.rng.choice(pick, size=len(place))
            elif kind == 1:  # all zeros, some or all negative: the sign of an exact zero
                batch.a[row] = self.A.zero
                batch.b[row] = self.B.zero
                negative = self.rng.random(self.k) < (0.5 if row % 16 == 1 else 1.0)
                self._negative_zero_products(batch, row, negative)
                batch.c[row] = special_c[int(self.rng.integers(0, 2))]
            elif kind == 2:  # special c
                batch.c[row] = special_c[int(self.rng.integers(len(special_c)))]
            elif kind == 3:  # overflow: the largest elements, large scales
                batch.a[row] = self.A.max_code
                batch.b[row] = self.B.max_code
                if self.rng.integers(2):
                    batch.a[row, place] = self.A.negate(batch.a[row, place])
                batch.scale_a[row] = self.scale.between(self.rng, 23, 127, self.blocks)
                batch.scale_b[row] = self.scale.between(self.rng, 0, 127, self.blocks)
            elif kind == 4 and row % 16 == 4:  # results far below the range: tiny scales
                batch.scale_a[row] = self.scale.between(self.rng, -127, -88, self.blocks)
                batch.scale_b[row] = self.scale.between(self.rng, -127, -88, self.blocks)
                batch.c[row] = special_c[int(self.rng.choice([0, 7, 8, 9]))]
            elif kind == 4:  # results in the output's subnormal range: scales that put them there
                target = self.out_emin - self.out_fmt.mantissa_bits + int(self.rng.integers(-3, self.out_fmt.mantissa_bits + 4))
                row_exponent = self.span()[1] + int(np.log2(self.k))
                shift = target - row_exponent
                batch.scale_a[row] = self.scale.power(shift // 2)
                batch.scale_b[row] = self.scale.power(shift - shift // 2)
                batch.c[row] = special_c[int(self.rng.choice([0, 7, 8, 9]))] if self.rng.integers(2) else 0
            elif kind == 5:  # subnormal elements
                batch.a[row, place] = self.A.min_code
                batch.b[row, place] = self.B.min_code if self.rng.integers(2) else self.B.one
                batch.c[row] = 0
            elif kind == 6:  # NaN scale, or a zero scale where the format has one
                zero = self.scale.zero is not None and row % 16 == 14
                batch.scale_a[row, int(self.rng.integers(self.blocks))] = self.scale.zero if zero else self.scale.nan
            else:  # exact cancellation to zero with c
                self._cancel_row(batch, row)
        return batch

    def _cancel_row(self, batch: Batch, row: int) -> None:
        half = self.k // 2
        batch.a[row, half:half * 2] = self.A.negate(batch.a[row, :half])
        batch.b[row, half:half * 2] = batch.b[row, :half]
        batch.a[row, half * 2:] = self.A.zero
        batch.scale_a[row] = batch.scale_a[row, 0]
        batch.scale_b[row] = batch.scale_b[row, 0]
        batch.c[row] = 0 if self.rng.integers(2) else self.c_bits([-0.0])[0]
