"""The vector file: ``$readmemh``-readable hex lines with a self-describing header.

File format (one file per unit and case kind)::

    // mxsim golden vectors, format 1
    // config: <name> sha256 <hex digest>
    // mxsim <version>, seed <seed>, kind <kind>, vectors <n>
    // unit: a <fmt>, b <fmt>, K <K>, k <k>, out <fmt>
    // word: <bits> bits, <digits> hex digits per line, fields most significant first, '_' between fields
    // field <name> [<msb>:<lsb>] <bits> bits (<items> x <item_bits>): <meaning>
    ...
    <a>_<b>_<scale_a>_<scale_b>_<c>_<d>
    ...

``$readmemh`` skips the ``//`` comments and ignores the ``_`` separators (Verilog number
syntax), so each line loads as one ``word_bits``-wide memory word; the ``field`` lines give
its bit slices. Digits are lowercase.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import BudgetError, InputFileError, MxsimError
from ..fileio import read_text
from ..limits import check_budget, check_path
from .layout import Field, VectorLayout

FILE_FORMAT_VERSION = 1
_HEX = np.array(list("0123456789abcdef"))
_HEX.setflags(write=False)
_FIELD_LINE = re.compile(r"^// field (\w+) \[(\d+):(\d+)\] (\d+) bits \((\d+) x (\d+)\): (.*)$")


@dataclass
class VectorSet:
    """Vectors as arrays: one row per vector.

    Attributes:
        a, b: element codes, shape (n, K), unsigned integers (up to uint64).
        scale_a, scale_b: E8M0 codes, shape (n, K/k), uint8; None for units without scales.
        c: accumulator input bits in the unit's ``c_format``, shape (n,): uint32 for FP32,
            uint64 for FP64.
        d: expected output bits, shape (n,): uint32, or uint64 for an fp64 output (None
            before the expected function ran).
        labels: one short name per vector saying which case it is.
    """

    a: np.ndarray
    b: np.ndarray
    scale_a: np.ndarray | None
    scale_b: np.ndarray | None
    c: np.ndarray
    d: np.ndarray | None = None
    labels: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.c.shape[0])

    def rows(self, start: int, stop: int) -> "VectorSet":
        """Vectors ``start`` to ``stop - 1`` (views of the arrays, not copies)."""

        def part(array):
            return None if array is None else array[start:stop]

        return VectorSet(
            self.a[start:stop],
            self.b[start:stop],
            part(self.scale_a),
            part(self.scale_b),
            self.c[start:stop],
            part(self.d),
            self.labels[start:stop],
        )

    def column(self, name: str) -> np.ndarray:
        """The field ``name`` as an (n, items) integer array."""
        value = getattr(self, name)
        if value is None:
            raise MxsimError(f"golden: vector field {name!r} is not set")
        return value if value.ndim == 2 else value.reshape(-1, 1)


def hex_column(values: np.ndarray, item_bits: int, hex_digits: int) -> np.ndarray:
    """Each row of ``values`` (n, items) packed (item i at bits [i*item_bits +: item_bits]) as hex text."""
    values = np.asarray(values, dtype=np.uint64)
    values = values if values.ndim == 2 else values.reshape(-1, 1)
    n, items = values.shape
    if item_bits < 64 and values.size and int(values.max()) >> item_bits:
        raise MxsimError(f"golden: a value does not fit its {item_bits}-bit field")
    bits = ((values[:, :, None] >> np.arange(item_bits, dtype=np.uint64)) & np.uint64(1)).astype(
        np.uint8
    )
    bits = bits.reshape(n, items * item_bits)
    padded = np.zeros((n, 4 * hex_digits), dtype=np.uint8)
    padded[:, : items * item_bits] = bits
    nibbles = padded.reshape(n, hex_digits, 4) @ np.array([1, 2, 4, 8], dtype=np.uint8)
    chars = np.ascontiguousarray(_HEX[nibbles[:, ::-1]])
    return chars.view(f"<U{hex_digits}").reshape(n)


def format_lines(layout: VectorLayout, vectors: VectorSet) -> list[str]:
    """The data lines (no newline) of ``vectors``: fields in layout order joined by ``_``."""
    columns = [hex_column(vectors.column(f.name), f.item_bits, f.hex_digits) for f in layout.fields]
    return ["_".join(parts) for parts in zip(*columns)]


def header_lines(
    layout: VectorLayout, unit, *, mxsim_version: str, seed: int, kind: str, count: int
) -> list[str]:
    """The ``//`` header lines (no newline) that describe a vector file."""
    lines = [
        f"// mxsim golden vectors, format {FILE_FORMAT_VERSION}",
        f"// config: {unit.config_name} sha256 {unit.config_hash}",
        f"// mxsim {mxsim_version}, seed {seed}, kind {kind}, vectors {count}",
        f"// unit: a {unit.a_format}, b {unit.b_format}, K {unit.dot_length}, k {unit.block_size}, out {unit.out_format}",
        f"// word: {layout.word_bits} bits, {layout.hex_digits} hex digits per line, "
        "fields most significant first, '_' between fields",
    ]
    for f in layout.fields:
        lines.append(
            f"// field {f.name} [{f.msb}:{f.lsb}] {f.bits} bits ({f.items} x {f.item_bits}): {f.meaning}"
        )
    return lines


def parse_vector_text(text: str, source: str = "<vectors>") -> tuple[VectorLayout, VectorSet]:
    """Parse a vector file's text (as written by :func:`format_lines` after its header).

    The layout is read from the header's ``// field`` lines. Returns the layout and the
    vectors (labels empty). Raises MxsimError naming the line for malformed input.
    """
    fields: list[Field] = []
    rows: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("//"):
            match = _FIELD_LINE.match(stripped)
            if match:
                name, msb, lsb, bits, items, item_bits, meaning = match.groups()
                msb, lsb = int(msb), int(lsb)
                fields.append(
                    Field(
                        name,
                        lsb,
                        int(bits),
                        (msb - lsb + 1) // 4,
                        int(items),
                        int(item_bits),
                        meaning,
                    )
                )
            continue
        rows.append((number, stripped))
    if not fields:
        raise MxsimError(f"{source}: no '// field' header lines; not an mxsim golden vector file")
    _check_fields(fields, source)
    layout = VectorLayout(tuple(fields))
    widths = [f.hex_digits for f in layout.fields]
    words = []
    for number, line in rows:
        parts = line.split("_")
        if [len(p) for p in parts] != widths:
            raise MxsimError(
                f"{source}:{number}: expected fields of {widths} hex digits, got {line!r}"
            )
        try:
            words.append(int("".join(parts), 16))
        except ValueError:
            raise MxsimError(f"{source}:{number}: not hexadecimal: {line!r}") from None
    columns = {}
    for f in layout.fields:
        mask = (1 << f.item_bits) - 1
        dtype = _code_dtype(f.item_bits)
        column = np.zeros((len(words), f.items), dtype=dtype)
        for row, word in enumerate(words):
            value = word >> f.lsb
            if value >> f.bits & ((1 << (f.width - f.bits)) - 1):
                raise MxsimError(
                    f"{source}:{rows[row][0]}: padding bits of field {f.name!r} are not zero"
                )
            for item in range(f.items):
                column[row, item] = (value >> (item * f.item_bits)) & mask
        columns[f.name] = column
    n = len(words)
    vectors = VectorSet(
        a=columns["a"],
        b=columns["b"],
        scale_a=columns.get("scale_a"),
        scale_b=columns.get("scale_b"),
        c=columns["c"].reshape(n).astype(_word_dtype(layout.field("c").item_bits)),
        d=columns["d"].reshape(n).astype(_word_dtype(layout.field("d").item_bits)),
    )
    return layout, vectors


def _code_dtype(bits: int) -> type:
    """The smallest unsigned dtype of ``bits``-bit items (1..64)."""
    return (
        np.uint8
        if bits <= 8
        else np.uint16
        if bits <= 16
        else np.uint32
        if bits <= 32
        else np.uint64
    )


def _word_dtype(bits: int) -> type:
    """c's and d's dtype: uint32 (every unit's FP32 c; fp32, fp16, bf16 outputs), uint64 for 64 bits."""
    return np.uint32 if bits <= 32 else np.uint64


def _check_fields(fields: list[Field], source: str) -> None:
    """The header's fields are those generate writes: a, b, c, d (scale_a, scale_b optional),
    each once, c and d one item each, items of 1..64 bits, at most 65,536 items."""
    names = [f.name for f in fields]
    missing = [name for name in ("a", "b", "c", "d") if name not in names]
    unknown = [name for name in names if name not in ("a", "b", "scale_a", "scale_b", "c", "d")]
    if missing or unknown or len(set(names)) != len(names):
        raise MxsimError(
            f"{source}: the '// field' lines name {', '.join(map(repr, names))[:200]}; expected a, b, "
            "c, d and optionally scale_a, scale_b, each once"
        )
    for f in fields:
        if not (
            1 <= f.item_bits <= 64 and 1 <= f.items <= (1 if f.name in ("c", "d") else 1 << 16)
        ):
            raise MxsimError(
                f"{source}: field {f.name!r} declares {f.items} items of {f.item_bits} bits; expected "
                "items of 1..64 bits, one for c and d, at most 65536 otherwise"
            )


def read_vector_file(path: str | Path) -> tuple[VectorLayout, VectorSet]:
    """Read a vector file written by :func:`mxsim.golden.generate` (see :func:`parse_vector_text`).

    The file must be ASCII text (as generate writes it) whose size, checked before reading,
    fits the memory budget (``MXSIM_MAX_BYTES``; parsing takes a few times the text's size);
    anything else is an :class:`~mxsim.errors.InputFileError` naming the file."""
    path = check_path(path, "read_vector_file: path")

    def fail(message):
        raise InputFileError(f"{path}: {message}")

    try:
        if not path.is_file():
            fail("no such file")
        size = path.stat().st_size
    except OSError as error:
        fail(f"cannot read: {error.strerror or error}")
    try:
        check_budget(4 * size, f"reading the vector file ({size} bytes of text)")
    except BudgetError as error:
        fail(str(error))
    text = read_text(path, fail, encoding="ascii", limit=size)
    return parse_vector_text(text, str(path))
