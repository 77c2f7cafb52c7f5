"""How an operand is laid out in memory: packed elements plus per-block scale metadata.

An operand is a stack of *rows*, each a run of ``length`` elements along the blocked axis
(the reduction axis K for operands A and B, the channel axis for outputs). Packing rule:

* the elements of one row are packed densely at ``element_bits`` each, and the row is
  padded to a whole byte (a row starts at a byte address, so rows can be fetched alone);
* the metadata of one row -- ``ceil(length / block_size)`` scales of ``scale_bits`` plus
  ``ceil(length / subblock_size)`` microexponents of ``microexponent_bits`` -- is packed
  densely and padded to a whole byte, separately from the elements;
* a partial block at the end of a row still carries a full scale.

Microexponents count as scale (metadata) bytes, not element bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from mxsim.errors import UnknownNameError
from mxsim.cycles.layers import ceil_div
from mxsim.formats import FORMATS, get_format


@dataclass(frozen=True)
class StorageBytes:
    """Bytes of one operand in memory, elements and scale metadata apart."""

    element_bytes: int
    scale_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.element_bytes + self.scale_bytes

    def times(self, count: int) -> StorageBytes:
        """The bytes moved when this operand is transferred ``count`` times."""
        return StorageBytes(self.element_bytes * count, self.scale_bytes * count)


@dataclass(frozen=True)
class OperandStorage:
    """Element width and block-scaling metadata of an operand in memory.

    ``block_size`` None means no scales (a plain tensor); then ``scale_bits`` is ignored.
    ``subblock_size``/``microexponent_bits`` describe the shared microexponents of MX4/6/9
    (one ``microexponent_bits`` field per ``subblock_size`` elements).
    """

    element_bits: int
    block_size: int | None
    scale_bits: int = 8
    subblock_size: int | None = None
    microexponent_bits: int = 0

    def __post_init__(self) -> None:
        if self.element_bits < 1:
            raise ValueError(f"element_bits must be >= 1, got {self.element_bits}")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be None or >= 1, got {self.block_size}")
        if self.scale_bits < 0 or self.microexponent_bits < 0:
            raise ValueError("scale_bits and microexponent_bits must be >= 0")
        if self.microexponent_bits and self.subblock_size is None:
            raise ValueError("microexponent_bits needs a subblock_size")
        if self.subblock_size is not None:
            if (
                self.block_size is None
                or self.subblock_size < 1
                or self.block_size % self.subblock_size
            ):
                raise ValueError(
                    f"subblock_size {self.subblock_size} must divide block_size {self.block_size}"
                )

    @classmethod
    def plain(cls, bytes_per_word: int) -> OperandStorage:
        """Unscaled words of ``bytes_per_word`` bytes, as SCALE-Sim assumes (it uses 1)."""
        return cls(element_bits=8 * bytes_per_word, block_size=None)

    def row_bytes(self, length: int) -> StorageBytes:
        """Bytes of one row of ``length`` elements along the blocked axis (see module doc)."""
        element_bytes = ceil_div(length * self.element_bits, 8)
        if self.block_size is None:
            return StorageBytes(element_bytes, 0)
        metadata_bits = ceil_div(length, self.block_size) * self.scale_bits
        if self.subblock_size is not None:
            metadata_bits += ceil_div(length, self.subblock_size) * self.microexponent_bits
        return StorageBytes(element_bytes, ceil_div(metadata_bits, 8))

    def operand_bytes(self, rows: int, length: int) -> StorageBytes:
        """Bytes of a ``rows`` x ``length`` operand blocked along its ``length`` axis."""
        return self.row_bytes(length).times(rows)


FORMAT_STORAGE: dict[str, OperandStorage] = {
    name: OperandStorage(
        fmt.storage_bits, fmt.block_size, fmt.scale_bits, fmt.subblock_size, fmt.microexponent_bits
    )
    for name, fmt in FORMATS.items()
    if fmt.role != "scale"
}
"""Storage of the element and wide formats by table key, from the format table's storage fields."""


def storage_for_format(name: str) -> OperandStorage:
    """The :data:`FORMAT_STORAGE` entry for ``name`` (any name :func:`get_format` accepts)."""
    key = get_format(name).name
    if key not in FORMAT_STORAGE:
        raise UnknownNameError("stored format", name, FORMAT_STORAGE)
    return FORMAT_STORAGE[key]
