"""Read SCALE-Sim topology CSV files (conv and GEMM) as they are.

Formats, as SCALE-Sim 3.0.0 reads them (scalesim/topology_utils.py):

* conv: ``Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels,
  Num Filter, Strides`` -- one stride for both axes;
* GEMM: ``Layer, M, N, K``;
* either may carry one more field, an N:M sparsity ratio, which SCALE-Sim ignores unless
  sparsity support is switched on in its config; mxsim always ignores it.

The first line is a header and is always skipped, as are blank lines. SCALE-Sim drops the
last field of every row (its sample files end rows with a comma, sometimes followed by a
comment such as ``#dw``); mxsim instead drops a trailing empty field and a trailing field
starting with ``#``, so rows with or without the trailing comma both read correctly.
A conv layer whose name contains ``DP`` is a depthwise convolution: like SCALE-Sim, mxsim
splits it into one single-channel layer per channel, named ``<name>Channel_<i>``.
The file must be UTF-8 (a BOM is allowed) and describe at most MAX_LAYERS layers.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from mxsim.cycles.layers import ConvLayer, GemmLayer, Layer
from mxsim.errors import InputFileError, MxsimError
from mxsim.fileio import read_text
from mxsim.limits import check_path, shown

CONV_COLUMNS = (
    "Layer name",
    "IFMAP Height",
    "IFMAP Width",
    "Filter Height",
    "Filter Width",
    "Channels",
    "Num Filter",
    "Strides",
)
GEMM_COLUMNS = ("Layer", "M", "N", "K")
_SPARSITY = re.compile(r"^\d+\s*:\s*\d+$")
#: Most layers one topology file may describe (depthwise layers count once per channel).
MAX_LAYERS = 1_000_000
#: Largest value of one dimension (M, N, K, heights, widths, channels, filters, strides).
MAX_DIMENSION = 1 << 32


def detect_topology_kind(header_fields: list[str]) -> str | None:
    """``"gemm"`` for an ``Layer, M, N, K`` header, ``"conv"`` for an ``IFMAP ...`` header."""
    lowered = [field.strip().lower() for field in header_fields]
    if lowered[1:4] == ["m", "n", "k"]:
        return "gemm"
    if len(lowered) >= len(CONV_COLUMNS) and "ifmap" in lowered[1]:
        return "conv"
    return None


def _fields(line: str) -> list[str]:
    fields = [field.strip() for field in line.split(",")]
    if fields and fields[-1].startswith("#"):
        fields.pop()
    if fields and fields[-1] == "":
        fields.pop()
    return fields


def read_scalesim_topology(path: str | Path, kind: str | None = None) -> list[Layer]:
    """Layers of a SCALE-Sim topology file, in file order.

    ``kind`` is ``"conv"``, ``"gemm"`` or None to tell from the header. Conv rows become
    :class:`ConvLayer` (depthwise ``DP`` rows split per channel), GEMM rows
    :class:`GemmLayer`. A malformed file raises :class:`MxsimError` naming the file, the
    line and the column.
    """
    path = check_path(path, "read_scalesim_topology: path")

    def fail(message: str):
        raise InputFileError(f"{path}: cannot read topology file: {message}")

    lines = read_text(path, fail, encoding="utf-8-sig").splitlines()
    if not lines:
        raise MxsimError(f"{path}: empty topology file; line 1 must be a header")
    header = _fields(lines[0])
    if kind is None:
        kind = detect_topology_kind(header)
        if kind is None:
            raise MxsimError(
                f"{path}:1: cannot tell conv from GEMM topology by the header; expected "
                f"'{', '.join(CONV_COLUMNS)}' or '{', '.join(GEMM_COLUMNS)}'"
            )
    if kind not in ("conv", "gemm"):
        raise MxsimError(f"topology kind must be 'conv' or 'gemm', got {kind!r}")
    columns = CONV_COLUMNS if kind == "conv" else GEMM_COLUMNS

    layers: list[Layer] = []
    for line_number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = _fields(line)
        where = f"{path}:{line_number}"
        if len(fields) < len(columns):
            raise MxsimError(
                f"{where}: column {len(fields) + 1} ({columns[len(fields)]}): missing; a {kind} row "
                f"has {len(columns)} fields: {', '.join(columns)}"
            )
        extra = fields[len(columns) :]
        if extra and not _SPARSITY.match(extra[0]):
            raise MxsimError(
                f"{where}: column {len(columns) + 1}: expected an N:M sparsity "
                f"ratio or nothing, got {shown(extra[0], 40)}"
            )
        if len(extra) > 1:
            raise MxsimError(
                f"{where}: column {len(columns) + 2}: unexpected field {shown(extra[1], 40)}"
            )
        values = []
        for index in range(1, len(columns)):
            text = fields[index]
            # ASCII digits only: int() also takes "1_000", other scripts' digits and 4000-digit numbers
            if not (text.isascii() and text.lstrip("-").isdigit()):
                raise MxsimError(
                    f"{where}: column {index + 1} ({columns[index]}): expected an integer, "
                    f"got {shown(text, 40)}"
                )
            if len(text) > 13 or int(text) > MAX_DIMENSION:
                raise MxsimError(
                    f"{where}: column {index + 1} ({columns[index]}): expected at most "
                    f"{MAX_DIMENSION}, got {shown(text, 40)}"
                )
            values.append(int(text))
        try:
            layers.extend(_make_layers(kind, fields[0], values, MAX_LAYERS - len(layers)))
        except MxsimError as error:
            raise MxsimError(f"{where}: {error}") from None
    if not layers:
        raise MxsimError(f"{path}: no layers after the header line")
    return layers


def _make_layers(kind: str, name: str, values: list[int], room: int) -> list[Layer]:
    if kind == "gemm":
        m, n, k = values
        return [GemmLayer(name, M=m, N=n, K=k)]
    height, width, filter_height, filter_width, channels, filters, stride = values
    layer = ConvLayer(
        name, height, width, filter_height, filter_width, channels, filters, stride, stride
    )
    if "DP" in name:
        if channels > room:
            raise MxsimError(
                f"a depthwise layer of {channels} channels would make more than "
                f"{MAX_LAYERS} layers in all (one per channel)"
            )
        return [
            replace(layer, name=f"{name}Channel_{index}", channels=1) for index in range(channels)
        ]
    return [layer]
