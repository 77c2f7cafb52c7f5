"""Packing element codes into the bytes a hardware memory holds, and back.

Bit order (documented, fixed): codes are laid out as one little-endian bit stream — code i
occupies stream bits [i*w, (i+1)*w), least significant bit first, and stream bit b is bit
(b mod 8) of byte b // 8. So two fp4 codes share a byte with code 0 in the low nibble, and
four fp6 codes fill three bytes. A partial last byte is zero-filled. Scales are one E8M0
byte per block, unchanged.
"""

from __future__ import annotations

import numpy as np

from ..errors import MxsimError


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack integer codes of ``bits`` (1..8) bits each into a uint8 byte array (see module doc)."""
    codes = np.asarray(codes)
    if not 1 <= bits <= 8:
        raise MxsimError(f"pack_codes: bits must be in 1..8, got {bits}")
    if codes.size and (codes.min() < 0 or codes.max() >= (1 << bits)):
        raise MxsimError(f"pack_codes: codes must lie in [0, {1 << bits})")
    flat = codes.astype(np.uint8).reshape(-1, 1)
    stream = np.unpackbits(flat, axis=1, bitorder="little")[:, :bits].reshape(-1)
    return np.packbits(stream, bitorder="little")


def unpack_codes(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first ``count`` codes of ``bits`` bits each from bytes packed by :func:`pack_codes`."""
    data = np.asarray(data, dtype=np.uint8).reshape(-1)
    if not 1 <= bits <= 8:
        raise MxsimError(f"unpack_codes: bits must be in 1..8, got {bits}")
    if data.size * 8 < count * bits:
        raise MxsimError(
            f"unpack_codes: {data.size} bytes hold fewer than {count} codes of {bits} bits"
        )
    stream = np.unpackbits(data, bitorder="little")[: count * bits].reshape(count, bits)
    return np.packbits(stream, axis=1, bitorder="little").reshape(-1)
