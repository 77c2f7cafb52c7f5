"""Ties: sums on a tie or a hair off one of fp32, c's or the output's precision."""

from __future__ import annotations

import math

import numpy as np

from ...exact import fp32_bits_rounded
from ..draw import Batch, Drawing, FP32


class TiesFamilies(Drawing):
    """Ties: sums on a tie or a hair off one of fp32, c's or the output's precision."""

    def ties(self, n: int) -> Batch:
        """c and terms near its rounding points in fp32, fp16 and bf16, and fp64 for an fp64 c or
        output (half an ulp, a quarter, just above): rounding modes, ties and sticky bits."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            exponent = int(self.rng.integers(low, high + 3))
            if row % 4 == 0:  # no c: a large term is the reference
                exponent = self.set_term(
                    batch, row, int(self.rng.integers(self.k)), exponent, bool(self.rng.integers(2))
                )
                first = 1
            else:
                batch.c[row] = self.random_c(
                    exponent, bool(self.rng.integers(2)), bits=int(self.rng.choice(self.precisions))
                )
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
            significand = (
                (1 << output_bits) | int(self.rng.integers(0, 1 << (output_bits - 1))) << 1 | 1
            )
            negative = bool(self.rng.integers(2))
            batch.c[row] = self.c_bits(
                [math.ldexp(-significand if negative else significand, exponent - output_bits)]
            )[0]
            self.set_term(
                batch,
                row,
                int(self.rng.integers(self.k)),
                exponent - gap,
                bool(self.rng.integers(2)),
            )
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
            terms = (
                [pairs[h]] * (1 << (e - h))
                + [pairs[e - precision]] * tie
                + [pairs[x], (self.A.negated(pairs[x][0]), pairs[x][1])]
            )
            negative = bool(self.rng.integers(2))
            for position, (a, b) in zip(
                self.rng.choice(self.k, size=len(terms), replace=False), terms
            ):
                batch.a[row, position], batch.b[row, position] = (
                    (self.A.negated(a) if negative else a),
                    b,
                )
            c_negative = bool(self.rng.integers(2)) if tie else not negative
            gap = int(self.rng.choice(wider)) + int(self.rng.integers(0, 2))
            batch.c[row] = self.c_bits([math.ldexp(-1.0 if c_negative else 1.0, x - gap)])[0]
        return batch

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
        low, high = (
            max(low, -150),
            min(high, 103),
        )  # c, 2^(half + 1) to 2^(half + 24), a normal fp32
        for row in range(n):
            half = int(self.rng.integers(low, high + 1))  # the tie's exponent, within the products
            j = int(self.rng.integers(1, 17))
            pairs = [self._exact_power_pair(half), self._exact_power_pair(half - j)]
            if None in pairs:
                continue
            negative = bool(self.rng.integers(2))
            significand = ((1 << 23) | int(self.rng.integers(0, 1 << 23))) & ~1
            # c's ulp is 2^(half + 1): the product 2^half is half of it
            batch.c[row] = fp32_bits_rounded(
                [np.ldexp(float(significand), half + 1) * (-1 if negative else 1)]
            )[0]
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
        low, high = (
            self.full_span()
        )  # (the products lie outside the output's range: c cancels them)
        # products 2^(h-16) .. 2^(h+24); c a normal fp32; the result inside the output's range
        low = max(low + 16, -150, self.out_emin - precision)
        high = min(high - 24, 103, self.out_fmt.emax - precision - 1)
        if low > high:
            return self.empty(0)
        for row in range(n):
            half = int(self.rng.integers(low, high + 1))
            j = int(self.rng.integers(1, 17))
            pairs = [
                self._exact_power_pair(exponent, normal=True)
                for exponent in (half, half - j, half + 24)
            ]
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
            batch.c[row] = self.random_c(
                top - int(self.rng.integers(16, 33)), bool(self.rng.integers(2)), bits=24
            )
        return batch
