"""A PyTorch model with every matmul and convolution computed by an mxsim unit (``mxsim[torch]``).

Interception is the capture's (:mod:`mxsim.capture.torch`): ``F.linear``,
``torch.matmul``/``@``, ``F.scaled_dot_product_attention`` at the call, and the ATen GEMMs
(``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``mv``, ``dot``, ``convolution``, CPU fused
attention) no such call covered. Each becomes a trace layer, is computed by
:func:`mxsim.replay.layer.run_layer` on the unit, and its result replaces torch's, as a
tensor of the same shape and dtype (the unit's float64 result, bias added, rounded once).
Attention runs as ``q @ k^T`` on the unit, softmax in torch (float32), then ``P @ v`` on the
unit. Ops capture lists as skipped (integer GEMMs, ...) keep
torch's result and are listed in :attr:`UnitInLoop.skipped`; a float convolution the unit
cannot compute (3-d) raises MxsimError. An empty output (a batch of 0 rows) computes nothing.
A model quantized by AMD Quark or by torchao's MX (or weight-only NVFP4) workflow computes each layer from its own
quantized operands, as capture records them (:mod:`mxsim.capture.torch_quark`,
:mod:`mxsim.capture.torch_torchao`); :attr:`UnitInLoop.model_quantization` says
which quantizer each operand came from and how it was read. With ``quantized_only`` the unit
computes only those layers, each also computed as the library's model computes it and the two
compared (:attr:`UnitInLoop.library_sqnr_db`); the matmuls the library left in float run in
torch, as in the library's own model (:attr:`UnitInLoop.in_torch`).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator

import numpy as np

from .._optional import require
from ..capture.torch import (
    QuantArg,
    _Recorder,
    _rounded_tensor,
    check_model,
    intercepting,
    running,
)
from ..datapath import HardwareConfig, load_hwconfig
from ..errors import MxsimError
from ..limits import memory_budget
from ..parallel import progress_bar
from ..replay.layer import run_layer
from ..trace.model import Layer
from ..trace.quant import MXQuant, NVFP4Quant, QDQQuant

SCALINGS = ("auto", "block", "tensor")


def _unit(hw) -> HardwareConfig:
    return hw if isinstance(hw, HardwareConfig) else load_hwconfig(hw)


def check_scaling(scaling: str) -> bool | None:
    """``scaling`` -> the ``per_tensor_scale`` argument of :func:`~mxsim.replay.layer.run_layer`."""
    if scaling not in SCALINGS:
        raise MxsimError(f"scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
    return None if scaling == "auto" else scaling == "tensor"


def layer_on_unit(
    layer: Layer,
    hw: HardwareConfig,
    a_format,
    b_format,
    per_tensor_scale,
    out_format,
    weight_quantizations: dict | None = None,
    input_quantizations: dict | None = None,
    weight_memo: dict | None = None,
) -> np.ndarray:
    """``layer``'s output (float64, the layer's layout) computed by ``hw``, and nothing else
    (no ideal, no clipping counts). A layer without outputs (an empty batch) computes nothing.
    ``weight_quantizations``, ``input_quantizations``, ``weight_memo``: as for
    :func:`~mxsim.replay.layer.run_layer`."""
    if layer.output.size == 0:
        return np.zeros(layer.output.shape)
    return run_layer(
        layer,
        hw,
        element_format=a_format,
        weight_format=b_format,
        per_tensor_scale=per_tensor_scale,
        out_format=out_format,
        with_ideal=False,
        strict=True,
        count_clipped=False,
        weight_quantizations=weight_quantizations,
        input_quantizations=input_quantizations,
        weight_memo=weight_memo,
    ).values


def model_quantization(layer: Layer) -> dict[str, str]:
    """Operand -> which of the model's quantizers the unit took it from and how mxsim reads it
    (the spec the unit computes with), or why the unit got the quantizer's values as floats."""
    taken = {}
    for operand, quantizer in layer.source["quantizers"].items():
        spec = layer.quant.get(operand)
        if spec is not None:
            manifest = (
                spec.to_manifest(operand)
                if isinstance(spec, (QDQQuant, MXQuant, NVFP4Quant))
                else spec.to_manifest()
            )
            taken[operand] = f"{quantizer}: {spec.kind} {manifest}"
        else:
            note = layer.source.get("quant_notes", {}).get(operand, "")
            taken[operand] = f"{quantizer}: its values, as floats ({note})"
    return taken


def _quantized_from(layer: Layer, operand: str) -> np.ndarray:
    """The values replay quantizes for ``operand`` when the unit does not take the model's:
    the library's recorded values for an operand mxsim does not read, else the float
    (:class:`~mxsim.replay.operands.LayerOperands`, ``a_float``)."""
    recorded = layer.quantized(operand)
    return (
        recorded
        if layer.quant.get(operand) is None and recorded is not None
        else layer.tensors[operand]
    )


#: The share of the memory budget (docs/limits.md) the weights' kept decoded forms may take.
DECODED_SHARE = 0.25


def _held_bytes(memo: dict) -> int:
    """Bytes of the numpy arrays held in a (nested) memo of decoded forms."""
    total = 0
    for value in memo.values():
        if isinstance(value, dict):
            total += _held_bytes(value)
        elif isinstance(value, tuple):
            total += sum(v.nbytes for v in value if isinstance(v, np.ndarray))
        elif isinstance(value, np.ndarray):
            total += value.nbytes
    return total


class UnitInLoop(_Recorder):
    """The recorder of :func:`torch_unit`: computes each layer on the unit instead of keeping it.

    ``layers``: names of the layers computed so far, in order; ``skipped``: ops left to torch;
    ``in_torch``: with ``quantized_only``, the layers no library quantizer fed, run in torch;
    ``library_sqnr_db``: with ``quantized_only``, (layer, SQNR in dB of the unit's output,
    rounded to the model's dtype, against the library's own output of the layer from the same
    operands; ``inf`` when equal) per layer computed;
    ``not_read``: ``layer.operand`` of each operand a library quantized whose quantization mxsim
    does not read (the unit got the library's values as floats, and quantized them itself).
    ``weight_quantizations``: the quantized weights kept for the next forward, emptied when the
    context ends: parameter (held by a weak reference) -> {view of it (data pointer, shape,
    stride, dtype) -> (a copy of the view's values as unsigned integers, the quantizations of
    those values, their decoded forms (``run_layer``'s ``weight_memo``; filled while all
    weights' decoded forms together, ``decoded_bytes``, take at most :data:`DECODED_SHARE` of
    the memory budget, docs/limits.md: up to about 14 bytes per weight element))}. A view's
    quantizations and decoded forms are used while its values are bit for bit the copy,
    however they were changed in between: torch's ``_version`` counter would miss changes
    through ``param.data`` (``param.data.copy_``), which it does not count. Only weights that
    are the model's parameters or views of them are kept; activations (attention's keys and
    values) are quantized per call, once for consecutive layers that read one tensor with
    the same values (``kept_input``: the last layer input's torch identity (data pointer,
    shape, stride, dtype), a copy of its values as unsigned integers and their quantizations;
    attention's query, key and value projections read one activation).
    """

    WHO = "torch_unit"

    def __init__(
        self,
        torch,
        model,
        hw: HardwareConfig,
        quant: QuantArg,
        a_format,
        b_format,
        out_format,
        per_tensor_scale,
        bar=None,
        quantized_only: bool = False,
    ):
        super().__init__(torch, model, quant)
        self.copies = False  # each layer is computed, and dropped, before the model goes on
        self.hw = hw
        self.a_format, self.b_format, self.out_format = a_format, b_format, out_format
        self.per_tensor_scale = per_tensor_scale
        self.computed_layers: list[str] = []
        self.bar = bar
        self.weight_quantizations = torch.utils.weak.WeakIdKeyDictionary()
        self.weight = None  # the torch weight of the layer being recorded
        self.input = None  # and its torch input
        self.kept_input: tuple | None = None
        self.model_quantization: dict[str, dict[str, str]] = {}
        self.quantized_only = quantized_only
        self.in_torch: list[str] = []
        self.not_read: set[str] = set()
        self.library_sqnr_db: list[tuple[str, float]] = []
        self.decoded_bytes = 0  # held by the weights' kept decoded forms

    def skip(self, op: str, reason: str, name: str | None = None) -> None:
        """Ops left to torch are listed; a float convolution the unit cannot compute (3-d) is
        refused: left in float it would pass for the unit's result."""
        super().skip(op, reason, name)
        if op == "aten.convolution" and "non-float" not in reason:
            skipped = self.skipped[-1]
            raise MxsimError(
                f"torch_unit: {skipped['name']} ({op}): {reason}; the unit cannot compute it"
            )

    def run_gemm(self, func, args, kwargs, a, b, bias=None):
        """A placeholder of the call's output shape and dtype (no float GEMM: the unit's result
        replaces it) when ``a`` and ``b`` are float matrices (or batches of them) of one dtype
        whose product torch would compute; any other call runs in torch (which computes it, or
        raises its own error; calls the unit does not compute are kept, as :meth:`skip` lists).
        With ``quantized_only`` every call runs in torch: the library's own output of a layer it
        quantized (compared with the unit's), torch's value of any other."""
        torch = self.torch
        operands = [t for t in (a, b, bias) if t is not None]
        if self.quantized_only:
            return func(*args, **kwargs)
        if (
            b is None
            or a.dim() < 2
            or b.dim() < 2
            or a.shape[-1] != b.shape[-2]
            or any(not t.is_floating_point() or t.dtype != a.dtype for t in operands)
            or (bias is not None and tuple(bias.shape) != (b.shape[-1],))
        ):
            return func(*args, **kwargs)
        try:  # numpy's rule is torch's; torch's own runs its ops through the interception
            batch = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
        except ValueError:
            return func(*args, **kwargs)
        return torch.empty((*batch, a.shape[-2], b.shape[-1]), dtype=a.dtype)

    def add(self, op: str, tensors: dict, *args, **kwargs) -> None:
        """Record (and compute) one layer, its torch weight at hand for :meth:`kept_quantizations`."""
        self.weight, self.input = tensors.get("weight"), tensors.get("input")
        try:
            super().add(op, tensors, *args, **kwargs)
        finally:
            self.weight = self.input = None

    def kept_quantizations(self, weight_values: np.ndarray) -> tuple[dict, dict] | None:
        """The kept quantizations and decoded forms (``run_layer``'s ``weight_quantizations``
        and ``weight_memo``) of the weight of the layer being recorded, whose values are
        ``weight_values``, both emptied if those values changed; None when the weight is not
        a parameter of the model or a view of one."""
        weight = self.weight
        if (
            weight is None
            or not isinstance(weight, self.torch.Tensor)
            or weight.layout != self.torch.strided
        ):
            return None
        root = weight if weight._base is None else weight._base
        try:
            storage = weight.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return None
        if not any(root is param for _, param, _ in self.params.get(storage, ())):
            return None
        views = self.weight_quantizations.setdefault(root, {})
        view = (weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.dtype)
        bits = weight_values.view(f"u{weight_values.itemsize}")
        kept = views.get(view)
        if kept is None or not np.array_equal(kept[0], bits):
            if kept is not None:
                self.decoded_bytes -= _held_bytes(kept[2])
            kept = views[view] = (bits.copy(), {}, {})
        return kept[1], kept[2]

    def kept_input_quantizations(self, input_values: np.ndarray) -> dict | None:
        """The kept quantizations (``run_layer``'s ``input_quantizations``) of the input of the
        layer being recorded, whose values are ``input_values``: the last layer's when that
        read the same torch tensor (same identity) with bit for bit the same values, else a
        new mapping that replaces it; None for an input that is not a strided torch tensor."""
        source = self.input
        if not isinstance(source, self.torch.Tensor) or source.layout != self.torch.strided:
            return None
        identity = (source.data_ptr(), tuple(source.shape), source.stride(), source.dtype)
        bits = input_values.view(f"u{input_values.itemsize}")
        kept = self.kept_input
        if (
            kept is None
            or kept[0] != identity
            or kept[1].dtype != bits.dtype
            or not np.array_equal(kept[1], bits)
        ):
            kept = self.kept_input = (identity, bits.copy(), {})
        return kept[2]

    def computed(self, layer: Layer) -> np.ndarray | None:
        self.layers.pop()  # the operands are not kept
        if self.quantized_only and "quantizers" not in layer.source:
            self.in_torch.append(layer.name)  # torch's value, computed already, stands
            return None
        self.computed_layers.append(layer.name)
        if "quantizers" in layer.source:
            self.model_quantization[layer.name] = model_quantization(layer)
            for operand in layer.source["quantizers"]:
                if layer.quant.get(operand) is None:
                    self.not_read.add(f"{layer.name}.{operand}")
        kept = self.kept_quantizations(_quantized_from(layer, "weight"))
        quantizations, memo = kept if kept is not None else (None, None)
        held = None if memo is None else _held_bytes(memo)
        if not memo and self.decoded_bytes > memory_budget() * DECODED_SHARE:
            memo = None  # the budget's share is spent: this weight is decoded per call
        values = layer_on_unit(
            layer,
            self.hw,
            self.a_format,
            self.b_format,
            self.per_tensor_scale,
            self.out_format,
            quantizations,
            self.kept_input_quantizations(_quantized_from(layer, "input")),
            memo,
        )
        if memo is not None:
            self.decoded_bytes += _held_bytes(memo) - held
        if self.quantized_only:
            self.library_sqnr_db.append((layer.name, self._library_sqnr_db(layer, values)))
        if self.bar is not None:
            self.bar.update(1)
        return values

    def _library_sqnr_db(self, layer: Layer, values: np.ndarray) -> float:
        """SQNR (dB) of the unit's ``values``, rounded to the model's dtype as the model gets
        them, against the layer's output as torch computed it (the library's own)."""
        torch = self.torch
        library = np.asarray(layer.tensors["output"], dtype=np.float64)
        dtype = (
            torch.bfloat16
            if layer.source.get("dtype") == "bfloat16"
            else {np.float16: torch.float16, np.float64: torch.float64}.get(
                layer.tensors["output"].dtype.type, torch.float32
            )
        )
        unit = _rounded_tensor(torch, values, dtype).double().numpy().reshape(library.shape)
        noise = float(np.sum((unit - library) ** 2))
        if noise == 0:
            return math.inf
        signal = float(np.sum(library**2))
        return -math.inf if signal == 0 else 10 * math.log10(signal / noise)


@contextlib.contextmanager
def torch_unit(
    model,
    hw,
    *,
    a_format: str | None = None,
    b_format: str | None = None,
    out_format: str | None = None,
    scaling: str = "auto",
    quant: QuantArg = None,
    progress: bool | None = None,
    quantized_only: bool = False,
) -> Iterator[UnitInLoop]:
    """While active, every matmul and convolution PyTorch runs is computed by the unit ``hw``.

    Args:
        model: the ``nn.Module`` to be run (its parameter and module names name the layers,
            and ``quant`` callables receive its modules), or None.
        hw: a :class:`HardwareConfig`, or the path of a config for :func:`mxsim.load_hwconfig`.
        a_format, b_format: element formats for the input (A) and weight (B) operands, OCP
            profile (b_format defaults to a_format). None: the layer's ``quant`` spec (refused,
            MxsimError, when the unit cannot take it as recorded: docs/replay.md, "Formats a
            unit cannot take"); an operand without one gets the unit's first accepted format.
        out_format: the unit's output format (default: the config's).
        scaling: ``"auto"`` (block scales if the unit has them, else one power-of-two scale per
            operand tensor, chosen by the OCP floor rule on the tensor's max, applied to the
            elements before encoding and undone exactly on the output), ``"block"`` or
            ``"tensor"`` (error if the unit cannot).
        quant: the model's quantizers, as for :func:`mxsim.capture.torch` (a mapping
            applied to every layer, or ``callable(layer_name, module)``).
        progress: count the layers computed on stderr (a tqdm bar with ``mxsim[progress]``,
            else a plain counter); None (default): when stderr is a terminal.
        quantized_only: the unit computes only the layers whose operands a library quantizer
            of the model produced (AMD Quark, torchao, Brevitas: the model's own quantized
            operands), each compared with the library's own output of the layer
            (:attr:`UnitInLoop.library_sqnr_db`; torch computes it too, one float GEMM more
            per layer); every other matmul (attention's ``q @ k^T`` and ``P @ v``, layers the
            library left in float) runs in torch as the library's model runs it, and is
            listed in :attr:`UnitInLoop.in_torch`.

    A weight that is one of the model's parameters (or a view of one) is quantized once per
    context: later calls reuse its quantization while its values are bit for bit the ones
    quantized (a change in place, through the parameter or ``.data``, is seen), and its
    decoded forms (the kernels' codes, the BLAS route's float64 values) while they fit a
    quarter of the memory budget (docs/limits.md); the kept quantizations are dropped when the
    context ends (:attr:`UnitInLoop.weight_quantizations`).

    Yields the :class:`UnitInLoop` (``computed_layers``, ``skipped``). Runs under
    ``torch.no_grad()``; each replaced result is a new tensor of torch's dtype (no autograd
    history): the unit's result with the bias added in float64, rounded once to that dtype
    (nearest even; float16, bfloat16, float32 or float64).
    """
    torch = require("torch")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise MxsimError(
            f"torch_unit: model must be a torch.nn.Module or None, got {type(model).__name__}"
        )
    check_model(torch, model, "torch_unit")
    unit, per_tensor_scale = _unit(hw), check_scaling(scaling)
    bar = progress_bar(None, "layer", sys.stderr.isatty() if progress is None else bool(progress))
    recorder = UnitInLoop(
        torch,
        model,
        unit,
        quant,
        a_format,
        b_format,
        out_format,
        per_tensor_scale,
        bar,
        quantized_only,
    )
    try:
        with intercepting(torch, model, recorder), running(recorder, "torch_unit"):
            yield recorder
    finally:
        recorder.weight_quantizations.clear()
        recorder.kept_input = None
        if bar is not None:
            bar.close()
