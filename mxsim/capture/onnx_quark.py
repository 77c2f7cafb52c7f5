"""Quark's ONNX quantizer ops read as mxsim specs, and computed with mxsim's quantizers.

Quark's custom ops (domain ``com.amd.quark``, or the legacy ``com.vai.quantize`` names
``MXFixNeuron``/``BFPFixNeuron``): ``MXQuantizeDequantize`` -> :class:`~mxsim.trace.quant.MXQuant`
with the ``quark-onnx`` profile; ``BFPQuantizeDequantize`` -> :class:`~mxsim.trace.quant.BFPQuant`.
:func:`quark_node_function` is the executor hook (:func:`mxsim.capture.onnx_graph.run_graph`)
that computes them in numpy (:func:`mxsim.fake_quantize` for MX, :func:`mxsim.quantize_bfp`
for BFP), since onnxruntime cannot load them without Quark's library.
"""

from __future__ import annotations

import numpy as np

from ..errors import MxsimError, UnknownNameError
from ..formats import get_format
from ..quantize import BFPSpec
from ..trace.quant import BFPQuant, MXQuant
from .onnx_graph import attributes, text

QUARK_DOMAINS = ("com.amd.quark", "com.vai.quantize")
MX_OP_TYPES = ("MXQuantizeDequantize", "MXFixNeuron")
BFP_OP_TYPES = ("BFPQuantizeDequantize", "BFPFixNeuron")

#: Quark ``MXQuantizeDequantize.rounding_mode`` -> mxsim options of int8 elements; Quark applies
#: it to int8 only (fp elements always round half to even). Modes 0 (``std::round``) and 1
#: (``dpu_round``) keep the input's sign on a zero result; mode 2 (``py3_round``) follows the
#: ``quark-onnx`` profile's ``zero_signs`` (docs/profiles.md).
QUARK_INT8_OPTIONS = {
    0: {"element_rounding": "nearest_away", "zero_signs": (("int8", "input"),)},
    1: {"element_rounding": "nearest_toward_positive", "zero_signs": (("int8", "input"),)},
    2: {"element_rounding": "nearest_even"},
}
#: Attribute defaults of Quark's custom ops (Quark's op documentation / custom_op_*.h).
MX_DEFAULTS = {"element_dtype": "int8", "axis": 1, "block_size": 32, "rounding_mode": 0}
BFP_DEFAULTS = {
    "bfp_method": "to_bfp",
    "axis": 1,
    "bit_width": 16,
    "block_size": 8,
    "rounding_mode": 0,
    "sub_block_size": 2,
    "sub_block_shift_bits": 1,
    "convert_to_bfloat_before_bfp": 0,
    "use_compiler_version_cpu_kernel": 0,
}


def is_quark(node) -> bool:
    """Whether ``node`` is one of Quark's MX/BFP quantizer ops that mxsim emulates."""
    return node.domain in QUARK_DOMAINS and node.op_type in MX_OP_TYPES + BFP_OP_TYPES


def quark_spec(node, rank: int, bfp_kernel: str = "cpu") -> MXQuant | BFPQuant:
    """The mxsim spec equivalent to a Quark MX/BFP custom node applied to a rank-``rank`` tensor.

    MX: ``element_dtype`` -> format, ``axis`` (rank 1: 0), ``block_size``; profile
    ``quark-onnx``; ``rounding_mode`` sets the int8 element rounding (0 half away, 1 half
    toward +inf, 2 half even) and zero sign (:data:`QUARK_INT8_OPTIONS`) and is ignored for
    fp elements, as Quark does. BFP:
    ``bfp_method`` (``to_bfp_prime_shared`` read as ``to_bfp_prime``), ``bit_width``,
    ``block_size``, ``sub_block_size``, ``sub_block_shift_bits`` (``to_bfp`` has none),
    ``rounding_mode``; ``bfp_kernel`` picks whose kernel semantics (cpu or cuda) to reproduce.
    Both bypass one-element tensors like Quark's op wrapper.
    """
    where = f"node {node.name!r} ({node.domain}::{node.op_type})"
    mx = node.op_type in MX_OP_TYPES
    defaults = MX_DEFAULTS if mx else BFP_DEFAULTS
    attrs = {**defaults, **{k: text(v) for k, v in attributes(node).items()}}
    unknown = set(attrs) - set(defaults)
    if unknown:
        raise MxsimError(f"{where}: unknown attribute(s) {sorted(unknown, key=str)}")
    axis = attrs["axis"]
    if rank == 1:
        axis = 0  # Quark: "when the rank of the input is 1, the axis ... is fixed to 0"
    elif not -rank <= axis < rank:
        raise MxsimError(f"{where}: axis {axis} is out of range for a rank-{rank} input")
    axis %= rank
    try:
        if mx:
            fmt = get_format(attrs["element_dtype"])
            rounding = attrs["rounding_mode"]
            if rounding not in QUARK_INT8_OPTIONS:
                raise MxsimError(f"rounding_mode must be 0, 1 or 2, got {rounding!r}")
            options = QUARK_INT8_OPTIONS[rounding] if fmt.name == "int8" else {}
            return MXQuant(
                fmt.name,
                axis,
                attrs["block_size"],
                "quark-onnx",
                options,
                bypass_single_element=True,
            )
        if attrs["convert_to_bfloat_before_bfp"]:
            raise MxsimError("convert_to_bfloat_before_bfp=1 is not modelled by mxsim")
        if attrs["use_compiler_version_cpu_kernel"]:
            raise MxsimError("use_compiler_version_cpu_kernel=1 is not modelled by mxsim")
        method = (
            "to_bfp_prime" if attrs["bfp_method"] == "to_bfp_prime_shared" else attrs["bfp_method"]
        )
        if method == "to_bfp":  # Quark ignores the sub-block attributes for plain BFP
            sub, shift = attrs["block_size"], 0
        else:
            sub, shift = attrs["sub_block_size"], attrs["sub_block_shift_bits"]
        spec = BFPSpec(
            method,
            attrs["bit_width"],
            attrs["block_size"],
            sub,
            shift,
            attrs["rounding_mode"],
            bfp_kernel,
        )
        return BFPQuant(spec, axis, bypass_single_element=True)
    except (MxsimError, UnknownNameError) as error:
        raise MxsimError(f"{where}: {error}") from None


def evaluate_quark(node, x: np.ndarray, bfp_kernel: str) -> np.ndarray:
    """Quark's custom op on ``x`` with mxsim's quantizers; float16 goes through float32, as Quark does.

    A tensor of one element (rank 0 included, e.g. hardswish's constants 3 and 6) passes
    through unchanged, as Quark's runtime passes it."""
    if x.dtype not in (np.float32, np.float16):
        raise MxsimError(
            f"node {node.name!r} ({node.op_type}): input must be float32 or float16, got {x.dtype}"
        )
    if x.size == 1:
        quark_spec(node, max(x.ndim, 1), bfp_kernel)  # attributes are still checked
        return x.copy()
    spec = quark_spec(node, x.ndim, bfp_kernel)
    return np.asarray(spec.fake_quantize(x.astype(np.float32))).astype(x.dtype)


def quark_node_function(bfp_kernel: str):
    """The executor hook (``python_node`` of :func:`mxsim.capture.onnx_graph.run_graph`) that
    computes Quark's MX/BFP nodes with ``bfp_kernel``'s BFP semantics, and refuses Quark's
    other custom ops (they need Quark's library)."""

    def python_node(node):
        if is_quark(node):
            return lambda inputs: evaluate_quark(node, inputs[0], bfp_kernel)
        if node.domain in QUARK_DOMAINS:
            raise MxsimError(
                f"node {node.name!r}: {node.domain}::{node.op_type} needs Quark's custom-op library "
                "and is not emulated by mxsim (supported: MXQuantizeDequantize, BFPQuantizeDequantize)"
            )
        return None

    return python_node
