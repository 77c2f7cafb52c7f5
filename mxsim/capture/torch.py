"""Capture every matmul and convolution a PyTorch model runs into a trace (``mxsim[torch]``).

The model runs once on the sample inputs, under ``torch.no_grad()`` (its train/eval mode is
not changed: call ``model.eval()`` first for inference behaviour), with two interception
modes active:

* a ``TorchFunctionMode`` records ``F.linear``, ``torch.matmul`` / ``@`` and
  ``F.scaled_dot_product_attention`` at the call the model makes, so a Linear keeps its
  input's rank, a batched matmul its batch dims, and attention is recorded as its two matmuls
  whichever kernel PyTorch picks;
* a ``TorchDispatchMode`` sees every ATen op that actually runs and records the GEMM-like
  ones no call above covered: ``mm``, ``addmm`` (HF ``Conv1D``), ``bmm``, ``baddbmm``,
  ``mv``, ``addmv``, ``dot``, ``convolution`` (conv1d/conv2d, grouped, depthwise, transposed)
  and PyTorch's CPU fused scaled-dot-product attention, which is recorded as its two matmuls
  (``sdpa.qk``: ``q @ k^T``, unscaled; ``sdpa.pv``: ``softmax(scale * q @ k^T + mask) @ v``,
  computed with torch in the inputs' dtype; the model itself continues with the fused
  kernel's result). Ops that decompose in C++ (``einsum``, the math SDPA backend,
  ``nn.MultiheadAttention``'s functional form, RNN cells) reach this level as their GEMMs.

Any other op that looks like a matmul or convolution (``_trilinear``, fused attention kernels
of other devices, conv3d, integer GEMMs...) is listed in ``source.skipped`` (name, op,
reason) and reported with a :class:`mxsim.errors.CaptureWarning` — never dropped silently.
The fast paths of ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` are switched off
during the capture so that their projections run as separate ops.

Quantization specs (``quant=``) are annotations: the captured tensors are the float values the
model computed; the specs tell replay how to quantize each operand. A model quantized by AMD
Quark's torch quantizer is captured with Quark's own quantization instead
(:mod:`mxsim.capture.torch_quark`): its quantizer modules run outside the interception, each
operand is recorded as the quantizer's float input with Quark's output in
``<operand>_quantized``, and its spec is the quantizer's reading where that reproduces Quark's
values bit for bit (else none, with ``source.quant_notes``). A Linear whose weight is torchao's
``MXTensor`` is recorded with torchao's quantization of its input and its dequantized weight
(one whose weight is a weight-only ``NVFP4Tensor``: its weight alone)
(:mod:`mxsim.capture.torch_torchao`), read the same way; so are Brevitas' quantizer proxies,
whose QuantTensors a quantized layer passes to ``F.linear`` (:mod:`mxsim.capture.torch_brevitas`),
and the quantizers mxsim puts on the Linears of a quantized checkpoint it loaded (Quark's
exporter, a torchao state dict: :mod:`mxsim.capture.torch_checkpoint`), whose weight specs
carry the checkpoint's scale codes.

What the interception cannot see through is refused with one :class:`MxsimError` line
(:func:`check_model`); an exception torch raises while the model runs becomes one line naming
the module (:func:`running`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Mapping

import numpy as np

from .._optional import require
from ..errors import CaptureWarning, MxsimError
from ..formats import get_format
from ..trace.model import Layer, Network, Trace
from ..trace.quant import BFPQuant, MXQuant, QDQQuant
from ..trace.validate import validate_trace
from . import torch_brevitas, torch_checkpoint, torch_quark, torch_torchao

QuantArg = None | Mapping | Callable

#: ATen ops recorded as layers (by overload-packet name).
DISPATCH_GEMMS = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "mv",
    "addmv",
    "dot",
    "vdot",
    "convolution",
    "_scaled_dot_product_flash_attention_for_cpu",
)
#: Prefixes of the ``_``-separated words of ATen op names that multiply matrices (besides
#: words ending in ``mm`` and the vector products); such an op not in DISPATCH_GEMMS is
#: listed as skipped.
GEMM_LIKE_PREFIXES = (
    "matmul",
    "conv",
    "attention",
    "linear",
    "bilinear",
    "trilinear",
    "einsum",
    "tensordot",
    "rnn",
    "lstm",
    "gru",
    "transformer",
)
#: Words of ops that match the above but do not multiply matrices.
NOT_GEMM_PREFIXES = ("upsample", "backward", "convert", "im2col", "col2im")


def _to_numpy(tensor, copy: bool = True) -> np.ndarray:
    """The tensor's values as a numpy array: a copy, or with ``copy=False`` a view where
    torch allows one (for a caller that reads it before the model runs on)."""
    torch = require("torch")
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
        tensor = tensor.to(torch.float32)
    array = tensor.cpu().numpy()
    return array.copy() if copy else array


def _rounded_tensor(torch, values: np.ndarray, dtype):
    """float64 ``values`` as a tensor of the float ``dtype``, each rounded once to nearest even
    (IEEE overflow to Inf): numpy's casts for float16/32/64; bfloat16, which numpy lacks,
    through mxsim's bf16 encoder rather than torch's cast, which passes through float32."""
    values = np.asarray(values, dtype=np.float64)
    if dtype == torch.bfloat16:
        codes = get_format("bf16").encode(values, "nearest_even", "inf_nan")
        return torch.from_numpy(np.ascontiguousarray(codes).view(np.int16)).view(torch.bfloat16)
    numpy_dtype = {
        torch.float16: np.float16,
        torch.float32: np.float32,
        torch.float64: np.float64,
    }.get(dtype)
    if numpy_dtype is None:
        raise MxsimError(
            f"a unit's result cannot be returned as {dtype}: float16, bfloat16, float32 or float64 only"
        )
    with np.errstate(over="ignore"):  # overflow gives Inf, as the IEEE cast does
        return torch.from_numpy(np.ascontiguousarray(values.astype(numpy_dtype)))


def _looks_like_gemm(op_name: str) -> bool:
    words = [w for w in op_name.lower().split("_") if w]
    if any(w.startswith(NOT_GEMM_PREFIXES) for w in words):
        return False
    return any(
        w.endswith("mm") or w in ("mv", "addmv", "dot", "vdot") or w.startswith(GEMM_LIKE_PREFIXES)
        for w in words
    )


def _default_axis(op: str, operand: str, ndim: int) -> int:
    """The axis of ``operand`` that runs along the GEMM reduction K (channels for convolutions)."""
    if operand == "bias":
        return ndim - 1
    if op == "conv2d":
        return 1
    if op == "conv_transpose2d":
        return 1 if operand == "input" else 0
    if operand == "input":
        return ndim - 1
    return 1 if op == "linear" else ndim - 2


def _resolve_quant(quant: QuantArg, name: str, module, op: str, tensors: dict) -> dict:
    """Every operand the layer has -> its spec (axis resolved) or None."""
    resolved = {operand: None for operand in ("input", "weight", "bias") if operand in tensors}
    specs = quant(name, module) if callable(quant) else quant
    if specs is None:
        return resolved
    if not isinstance(specs, Mapping):
        raise MxsimError(
            f"capture_torch: quant for layer {name!r} must map operand -> spec, got {type(specs).__name__}"
        )
    for operand, spec in specs.items():
        if operand not in ("input", "weight", "bias"):
            raise MxsimError(
                f"capture_torch: quant operand must be input, weight or bias, got {operand!r}"
            )
        if operand not in tensors or spec is None:  # e.g. a bias spec for a layer without bias
            continue
        if not isinstance(spec, (MXQuant, BFPQuant, QDQQuant)):
            raise MxsimError(
                f"capture_torch: quant[{operand!r}] must be MXQuant, BFPQuant or QDQQuant"
            )
        ndim = tensors[operand].ndim
        axis = _default_axis(op, operand, ndim) if spec.axis is None else spec.axis % ndim
        resolved[operand] = spec.with_axis(axis)
    return resolved


def _bind(func, args, kwargs) -> dict:
    """An ATen op's arguments by schema name, defaults filled in."""
    bound = {}
    for index, argument in enumerate(func._schema.arguments):
        if index < len(args) and not argument.kwarg_only:
            bound[argument.name] = args[index]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


class _Recorder:
    """Layers, skipped ops and naming state of one capture.

    ``computed(layer)`` is asked for each recorded layer's value: None (here) lets the model go
    on with the value torch computed; a subclass returns an array in the layer's output layout
    to put in its place (the last one is in ``result``)."""

    WHO = "capture_torch"  # names the caller in errors

    def __init__(self, torch, model, quant: QuantArg):
        self.torch = torch
        self.quant = quant
        self.result: np.ndarray | None = None
        self.layers: list[Layer] = []
        self.skipped: list[dict] = []
        self.suppress = 0  # > 0 while a recorded call (or the recorder itself) runs ops
        self.copies = (
            True  # layers keep copies of their tensors (False: views, read at once by ``computed``)
        )
        self.module_stack: list[tuple[str, object]] = []
        self.calls: dict[str, int] = {}
        self.layer_names: dict[int, list[str]] = {}  # id(module owning the weight) -> layer names
        # id(a library quantizer's output) -> (that output, its float input, quantizer, module path)
        self.library_outputs: dict[int, tuple] = {}
        self.last_entered = ""  # the module entered last (named in errors)
        self.params: dict[
            int, list[tuple[str, object, object]]
        ] = {}  # storage ptr -> (qualified name, param, owner)
        for module_name, module in (
            model.named_modules(remove_duplicate=False) if model is not None else ()
        ):
            for param_name, param in module.named_parameters(recurse=False, remove_duplicate=False):
                qualified = f"{module_name}.{param_name}" if module_name else param_name
                entry = (qualified, param, module)
                bucket = self.params.setdefault(self.storage_key(param), [])
                if all(qualified != other[0] for other in bucket):
                    bucket.append(entry)

    # ------------------------------------------------------------------ naming

    def module_path(self) -> str:
        return self.module_stack[-1][0] if self.module_stack else ""

    def current_module(self):
        return self.module_stack[-1][1] if self.module_stack else None

    @staticmethod
    def storage_key(tensor):
        """The data pointer of ``tensor``'s storage; for a wrapper subclass without one
        (torchao's MXTensor), the tensor's own identity."""
        try:
            return tensor.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return ("id", id(tensor))

    def parameter(self, tensor):
        """(qualified name, owner module, transposed) if ``tensor`` is a parameter, a slice of one
        (e.g. the q rows of ``in_proj_weight``) or the 2-d transpose of either; else None."""
        torch = self.torch
        if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
            return None
        here = self.module_path()
        matches = []
        for qualified, param, owner in self.params.get(self.storage_key(tensor), []):
            if tensor.dtype != param.dtype or tensor.dim() != param.dim():
                continue
            if tensor.stride() == param.stride():
                matches.append((qualified, owner, False))
            elif tensor.dim() == 2 and tensor.stride() == param.stride()[::-1]:
                matches.append((qualified, owner, True))
        if not matches:
            return None
        # a tied weight has several names: prefer the one under the module running now
        matches.sort(key=lambda m: (not (m[0].startswith(here + ".") or not here), len(m[0])))
        return matches[0]

    def check_operands(self, op: str, *operands) -> None:
        """Refuse (one line naming the module) a call whose operands are not plain tensors: a
        tensor subclass or a library's quantized tensor object (Brevitas' QuantTensor...); a
        torchao MXTensor is taken as a linear call's weight only."""
        torch = self.torch
        for value in operands:
            if (
                value is not None
                and type(value) not in (torch.Tensor, torch.nn.Parameter)
                and not (op == "linear" and torch_torchao.is_torchao_tensor(value))
            ):
                module = self.current_module()
                raise MxsimError(
                    f"{self.WHO}: module {self.module_path() or '<model>'!r} "
                    f"({type(module).__name__ if module is not None else 'no module'}) calls {op} with a "
                    f"{type(value).__name__}, which is not supported (plain tensors, AMD Quark's "
                    "quantizer modules and torchao's MXTensor and NVFP4Tensor weights are)"
                )

    def unique(self, base: str) -> str:
        count = self.calls.get(base, 0) + 1
        self.calls[base] = count
        return base if count == 1 else f"{base}#{count}"

    def local_name(self, op_name: str) -> str:
        path = self.module_path()
        return f"{path}.{op_name}" if path else op_name

    @staticmethod
    def parameter_layer_name(qualified: str) -> str:
        for suffix in (".weight", "_weight"):
            if qualified.endswith(suffix) and len(qualified) > len(suffix):
                return qualified[: -len(suffix)]
        return qualified

    # ------------------------------------------------------------------ recording

    def skip(self, op: str, reason: str, name: str | None = None) -> None:
        self.skipped.append(
            {"name": name or self.local_name(op.split(".")[-1]), "op": op, "reason": reason}
        )

    def add(
        self,
        op: str,
        tensors: dict,
        attrs: dict,
        source: dict,
        op_name: str,
        weight_param=None,
        name: str | None = None,
    ) -> None:
        """Record one layer; ``weight_param`` (qualified name, owner, transposed) names it."""
        torch = self.torch
        library = self.library_operands(tensors)
        if weight_param is None and "weight" in library:
            weight_param = self.parameter(library["weight"][0])
        module = self.current_module()
        if name is None:
            if weight_param is not None:
                base, module = self.parameter_layer_name(weight_param[0]), weight_param[1]
                source["parameter"] = weight_param[0]
            else:
                base = self.local_name(op_name)
            name = self.unique(base)
        if weight_param is not None:
            self.layer_names.setdefault(id(weight_param[1]), []).append(name)
        arrays = {}
        for key, value in tensors.items():
            if value is None:
                continue
            if value.dtype == torch.bfloat16:
                source["dtype"] = "bfloat16"
            arrays[key] = _to_numpy(value, self.copies)
        source.setdefault("module", self.module_path())
        if module is not None:
            source.setdefault("type", type(module).__name__)
        specs = _resolve_quant(self.quant, name, module, op, arrays)
        self.library_specs(name, library, arrays, specs, source)
        layer = Layer(name, op, arrays, attrs, specs, source)
        self.layers.append(layer)
        self.result = self.computed(layer)

    def library_operands(self, tensors: dict) -> dict:
        """The operands of a layer being recorded that a library quantizer produced: each is
        replaced in ``tensors`` by the quantizer's float input, its quantized values going to
        ``<operand>_quantized``; returns operand -> (float input, quantizer, quantizer path).
        The outputs of quantizers no layer consumed (output quantizers) are dropped."""
        found = {}
        for operand in ("input", "weight", "bias"):
            value = tensors.get(operand)
            entry = self.library_outputs.get(id(value)) if value is not None else None
            if entry is not None and entry[0] is value:
                found[operand] = entry[1:]
                tensors[operand], tensors[f"{operand}_quantized"] = entry[1], value
        self.library_outputs.clear()
        return found

    def library_specs(
        self, name: str, library: dict, arrays: dict, specs: dict, source: dict
    ) -> None:
        """The specs of the operands a library quantized (they replace ``quant=``'s): the
        quantizer's reading where it reproduces the library's values bit for bit, else none,
        with a note (``source.quant_notes``); ``source.quantizers`` names each quantizer."""
        for operand, (_, quantizer, path) in library.items():
            where = f"layer {name!r}, {operand} quantizer {path!r}"
            if torch_brevitas.is_brevitas_quantizer(quantizer):  # its output tensor not seen
                quantizer = torch_brevitas.Applied(quantizer, None)
            torchao = torch_torchao.is_quantization(quantizer)
            ndim = arrays[operand].ndim
            if torchao:
                library_name, spec = (
                    "torchao",
                    quantizer.spec(self.torch, ndim) or torch_quark.UNREAD,
                )
            elif torch_checkpoint.is_stored_quantizer(quantizer):
                library_name, spec = "the checkpoint", quantizer.spec(ndim)
            elif isinstance(quantizer, torch_brevitas.Applied):
                library_name, spec = "Brevitas", quantizer.spec(ndim, where)
            else:
                library_name, spec = (
                    "Quark",
                    torch_quark.quantizer_spec(quantizer, ndim, where, arrays[operand]),
                )
            described = (
                quantizer
                if torchao
                or torch_checkpoint.is_stored_quantizer(quantizer)
                or isinstance(quantizer, torch_brevitas.Applied)
                else type(quantizer).__name__
            )
            source.setdefault("quantizers", {})[operand] = f"{path} ({described})"
            note = ""
            if spec in (torch_quark.UNREAD, torch_brevitas.UNREAD):
                spec, note = None, f"{described} is not read by mxsim; its values are recorded"
            elif spec is not None:
                same, note = torch_quark.reproduces(
                    spec, arrays[operand], arrays[f"{operand}_quantized"], library_name
                )
                spec = spec if same else None
            if note:
                source.setdefault("quant_notes", {})[operand] = note
            specs[operand] = spec

    def computed(self, layer: Layer) -> np.ndarray | None:
        return None

    def run_gemm(self, func, args, kwargs, a, b, bias=None):
        """The output of an intercepted ``F.linear`` or matmul call, ``a @ b`` (+ ``bias``;
        ``b`` None for a linear call whose weight is not 2-d): torch computes it here."""
        return func(*args, **kwargs)

    def replacing(self, value):
        """``value`` (a torch tensor), or the last recorded layer's computed result in its
        shape and dtype (rounded once from the result's float64, nearest even)."""
        if self.result is None:
            return value
        result, self.result = self.result, None
        # reshaped in numpy: a torch reshape would run through the interception's modes
        return _rounded_tensor(self.torch, np.reshape(result, tuple(value.shape)), value.dtype)

    def torchao_linear(self, x, weight) -> tuple:
        """The input and weight of ``F.linear(x, weight)`` with torchao's MXTensor (or weight-only
        NVFP4Tensor) ``weight`` as torchao quantizes them (tensors that :meth:`library_operands` recognises)."""
        param = self.parameter(weight)
        path = param[0] if param else f"{self.module_path()}.weight"
        where = f"{self.WHO}: module {self.module_path() or '<model>'!r}"
        torch_torchao.check_supported(weight, where)
        with _outside_modes(self.torch):
            operands = torch_torchao.linear_operands(self.torch, x, weight, where)
        for operand, (values, float_values, quantization) in operands.items():
            where_from = path if operand == "weight" else f"{path}.act_quant_kwargs"
            self.library_outputs[id(values)] = (values, float_values, quantization, where_from)
        x = operands["input"][0] if "input" in operands else x  # NVFP4: weight-only
        return x, operands["weight"][0], param

    def unwrap(self, value):
        """``value``, or the values of a Brevitas QuantTensor that a recorded quantizer produced
        (registered as that quantizer's output for :meth:`library_operands`)."""
        entry = (
            self.library_outputs.get(id(value)) if torch_brevitas.is_quant_tensor(value) else None
        )
        if entry is None or entry[0] is not value:
            return value
        values = value.value
        applied = torch_brevitas.Applied(entry[2], value)  # its scales are read from the tensor
        self.library_outputs[id(values)] = (values, entry[1], applied, entry[3])
        return values

    def float_operands(self, op: str, *tensors) -> bool:
        bad = [t for t in tensors if t is not None and not t.is_floating_point()]
        if bad:
            self.skip(op, f"non-float operands ({', '.join(str(t.dtype) for t in bad)})")
        return not bad

    def gemm(
        self,
        op: str,
        a,
        b,
        out,
        bias=None,
        alpha=1.0,
        beta=1.0,
        promoted: str | None = None,
        op_name: str = "matmul",
    ) -> None:
        """``alpha * a @ b + beta * bias`` (numpy matmul semantics; a 1-d operand is promoted to
        a 1-row / 1-column matrix): a ``linear`` layer when ``b`` is a 2-d parameter's
        transpose, else ``matmul`` (named after a parameter operand if there is one)."""
        if not self.float_operands(op, a, b, bias):
            return
        source = {"op": op}
        if promoted:
            source["promoted"] = promoted
        attrs = {k: float(v) for k, v in (("alpha", alpha), ("beta", beta)) if float(v) != 1.0}
        if bias is not None and bias.dim() == 1 and out.dim() >= 2 and promoted == "vector":
            bias = bias[:, None]  # addmv: (M,) is per row, the promoted output is (M, 1)
        param = self.parameter(b)
        if param is not None and param[2]:
            self.add(
                "linear",
                {"input": a, "weight": b.t(), "bias": bias, "output": out},
                attrs,
                source,
                op_name,
                param,
            )
            return
        self.add(
            "matmul",
            {"input": a, "weight": b, "bias": bias, "output": out},
            attrs,
            source,
            op_name,
            param or self.parameter(a),
        )

    def matmul_call(
        self, op: str, a, b, out, op_name: str = "matmul", bias=None, alpha=1.0, beta=1.0
    ) -> None:
        """torch.matmul semantics incl. 1-d operands."""
        if a.dim() == 0 or b.dim() == 0:
            self.skip(op, "0-d operand")
            return
        promoted = None
        if a.dim() == 1 and b.dim() == 1:
            a, b, out, promoted = a[None, :], b[:, None], out.reshape(1, 1), "dot"
        elif a.dim() == 1:
            a, out, promoted = a[None, :], out.unsqueeze(-2), "row"
        elif b.dim() == 1:
            b, out, promoted = b[:, None], out.unsqueeze(-1), "vector"
        self.gemm(op, a, b, out, bias, alpha, beta, promoted, op_name)

    def convolution(self, op: str, bound: dict, out) -> None:
        x, w, bias = bound["input"], bound["weight"], bound["bias"]
        if not self.float_operands(op, x, w, bias):
            return
        spatial = x.dim() - 2
        transposed = bool(bound["transposed"])
        kind = "conv_transpose2d" if transposed else "conv2d"
        if spatial not in (1, 2):
            self.skip(op, f"{spatial}-d convolution (only 1-d and 2-d are captured)")
            return
        stride, padding = list(bound["stride"]), list(bound["padding"])
        dilation, output_padding = list(bound["dilation"]), list(bound["output_padding"])
        source = {"op": op}
        if spatial == 1:  # a 1-d convolution is a 2-d one of height 1
            x, w, out = x.unsqueeze(2), w.unsqueeze(2), out.unsqueeze(2)
            stride, padding, dilation, output_padding = (
                [1] + stride,
                [0] + padding,
                [1] + dilation,
                [0] + output_padding,
            )
            source["conv1d_as_2d"] = True
        attrs = {
            "stride": [int(v) for v in stride],
            "padding": [[int(p), int(p)] for p in padding],
            "dilation": [int(v) for v in dilation],
            "groups": int(bound["groups"]),
        }
        if transposed:
            attrs["output_padding"] = [int(v) for v in output_padding]
        self.add(
            kind,
            {"input": x, "weight": w, "bias": bias, "output": out},
            attrs,
            source,
            kind,
            self.parameter(bound["weight"]),
        )

    def sdpa(self, op: str, bound: dict):
        """Scaled dot-product attention as its two matmuls (see the module docstring); returns
        the attention output a unit computed, or None (skipped, or nothing computed it): the
        model's own result is used."""
        torch = self.torch
        q, k, v = bound["query"], bound["key"], bound["value"]
        mask, scale = bound.get("attn_mask"), bound.get("scale")
        if not self.float_operands(op, q, k, v):
            return
        if float(bound.get("dropout_p", 0.0)) > 0:
            self.skip(op, "attention dropout (dropout_p > 0) is random; capture in eval mode")
            return
        if (
            q.dim() >= 3 and k.shape[-3] != q.shape[-3]
        ):  # grouped-query attention: a k/v head serves several q heads
            repeat = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(repeat, dim=-3), v.repeat_interleave(repeat, dim=-3)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        key_t = k.transpose(-2, -1)
        scores = torch.matmul(q, key_t)
        base = self.unique(self.local_name("sdpa"))
        details = {
            "op": op,
            "softmax_scale": scale,
            "is_causal": bool(bound.get("is_causal")),
            "mask": None
            if mask is None
            else ("boolean" if mask.dtype == torch.bool else "additive"),
        }
        self.add(
            "matmul",
            {"input": q, "weight": key_t, "output": scores},
            {},
            dict(details),
            "",
            name=f"{base}.qk",
        )
        computed = self.result is not None
        scores = self.replacing(scores).to(q.dtype)
        logits = scores * scale
        if bound.get("is_causal"):
            causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
            logits = logits.masked_fill(~causal, float("-inf"))
        if mask is not None:
            logits = (
                logits.masked_fill(~mask, float("-inf"))
                if mask.dtype == torch.bool
                else logits + mask
            )
        probabilities = torch.softmax(logits, dim=-1)
        out = torch.matmul(probabilities, v)
        self.add(
            "matmul",
            {"input": probabilities, "weight": v, "output": out},
            {},
            dict(details),
            "",
            name=f"{base}.pv",
        )
        if not computed and self.result is None:  # no unit computed either matmul: the model
            return None  # continues with its own kernel's result (the decomposition rounds apart)
        return self.replacing(out)

    def dispatch(self, func, args, kwargs, out):
        """Record (or list as skipped) one ATen op that ran outside any recorded call; returns
        the op's result to use."""
        name = func.overloadpacket.__name__
        op = f"aten.{name}"
        if name not in DISPATCH_GEMMS:
            if _looks_like_gemm(name):
                self.skip(op, "a matmul-like op that capture does not lower to a GEMM layer")
            return out
        bound = _bind(func, args, kwargs)
        if name in ("mm", "bmm", "mv", "dot", "vdot"):
            other = bound.get("mat2", bound.get("vec", bound.get("tensor", bound.get("other"))))
            self.matmul_call(op, bound["self"], other, out, name)
        elif name in ("addmm", "baddbmm", "addmv"):
            a = bound.get("mat1", bound.get("batch1", bound.get("mat")))
            b = bound.get("mat2", bound.get("batch2", bound.get("vec")))
            self.matmul_call(op, a, b, out, name, bound["self"], bound["alpha"], bound["beta"])
        elif name == "convolution":
            self.convolution(op, bound, out)
        else:  # fused attention: (output, logsumexp); the logsumexp is left as torch computed it
            attention = self.sdpa(op, bound)
            return out if attention is None else (attention.to(out[0].dtype), *out[1:])
        return self.replacing(out)


def _sequential_network(model, layer_names: dict, input_name: str) -> Network | None:
    """Steps for an nn.Sequential (nested allowed) made only of Linear, Conv2d, ReLU, Flatten,
    Identity and Dropout (eval mode), each layer called once; else None."""
    torch = require("torch")
    nn = torch.nn
    if not isinstance(model, nn.Sequential):
        return None
    steps = []

    def walk(container):
        for module in container.children():
            if isinstance(module, nn.Sequential):
                if not walk(module):
                    return False
            elif isinstance(module, (nn.Linear, nn.Conv2d)):
                names = layer_names.get(id(module), [])
                if len(names) != 1:
                    return False
                if isinstance(module, nn.Conv2d) and (
                    module.padding_mode != "zeros" or module.padding == "same"
                ):
                    return False  # the recorded input is already padded
                steps.append({"layer": names[0]})
            elif isinstance(module, nn.ReLU):
                steps.append({"op": "relu"})
            elif isinstance(module, nn.Flatten):
                if module.end_dim != -1:
                    return False
                steps.append({"op": "flatten", "start_dim": int(module.start_dim)})
            elif isinstance(module, nn.Identity):
                continue
            elif (
                isinstance(module, (nn.Dropout, nn.Dropout1d, nn.Dropout2d)) and not module.training
            ):
                continue  # identity in eval mode
            else:
                return False
        return True

    return Network(input_name, tuple(steps)) if walk(model) and steps else None


def _modes(torch, recorder: _Recorder):
    """The function-level and dispatch-level interception modes of one capture."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    F = torch.nn.functional
    sdpa = F.scaled_dot_product_attention
    matmuls = {
        torch.matmul: False,
        torch.Tensor.matmul: False,
        torch.Tensor.__matmul__: False,
        torch.Tensor.__rmatmul__: True,
    }

    class FunctionMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if recorder.suppress or (
                func is not F.linear and func is not sdpa and func not in matmuls
            ):
                return func(*args, **kwargs)
            recorder.suppress += 1
            try:
                if (
                    func is F.linear
                ):  # a Brevitas layer passes its quantizers' QuantTensors: their values
                    args = tuple(recorder.unwrap(v) for v in args)
                recorder.check_operands(
                    getattr(func, "__name__", "matmul"),
                    *args[:3],
                    *(v for v in kwargs.values() if not isinstance(v, (bool, int, float))),
                )
                if func is sdpa:
                    out = func(*args, **kwargs)
                    names = (
                        "query",
                        "key",
                        "value",
                        "attn_mask",
                        "dropout_p",
                        "is_causal",
                        "scale",
                        "enable_gqa",
                    )
                    attention = recorder.sdpa(
                        "F.scaled_dot_product_attention", {**dict(zip(names, args)), **kwargs}
                    )
                    return out if attention is None else attention.to(out.dtype)
                if func is F.linear:
                    x, w = (
                        args[0] if args else kwargs["input"],
                        args[1] if len(args) > 1 else kwargs["weight"],
                    )
                    bias = args[2] if len(args) > 2 else kwargs.get("bias")
                    # torchao's own quantization of the operands, read first: its refusals are clearer
                    library = (
                        recorder.torchao_linear(x, w)
                        if torch_torchao.is_torchao_tensor(w)
                        else None
                    )
                    out = recorder.run_gemm(
                        func, args, kwargs, x, w.t() if w.dim() == 2 else None, bias
                    )
                    x, w, param = library or (x, w, None)
                    if recorder.float_operands("F.linear", x, w, bias):
                        recorder.add(
                            "linear",
                            {"input": x, "weight": w, "bias": bias, "output": out},
                            {},
                            {"op": "F.linear"},
                            "linear",
                            param or recorder.parameter(w),
                        )
                else:
                    a, b = args[0], args[1] if len(args) > 1 else kwargs["other"]
                    if matmuls[func]:
                        a, b = b, a
                    out = recorder.run_gemm(func, args, kwargs, a, b)
                    recorder.matmul_call("torch.matmul", a, b, out)
                return recorder.replacing(out)
            finally:
                recorder.result = None
                recorder.suppress -= 1

    class DispatchMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if not recorder.suppress:
                recorder.suppress += 1
                try:
                    out = recorder.dispatch(func, args, kwargs, out)
                finally:
                    recorder.result = None
                    recorder.suppress -= 1
            return out

    return FunctionMode(), DispatchMode()


def check_model(torch, model, who: str) -> None:
    """Refuse, one line each, what the interception cannot see through: a ``torch.compile``d
    module, a parameter or buffer that is a tensor subclass with its own dispatch (other than
    torchao's MXTensor weights), a torch function or dispatch mode already active."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    modes = [
        type(m).__name__
        for m in (*_get_current_function_mode_stack(), *_get_current_dispatch_mode_stack())
    ]
    if modes:
        raise MxsimError(
            f"{who}: a torch mode is already active ({', '.join(modes)}); run it outside other "
            "torch function/dispatch modes"
        )
    if model is None:
        return
    compiled = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    compiled = getattr(compiled, "OptimizedModule", ())
    for path, module in model.named_modules():
        if isinstance(module, compiled):
            raise MxsimError(
                f"{who}: module {path or '<model>'!r} is compiled by torch.compile, which is not "
                "supported; pass the module before compiling (its _orig_mod)"
            )
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, tensor in tensors:
            qualified = f"{path}.{name}" if path else name
            if torch_torchao.is_torchao_tensor(tensor):
                torch_torchao.check_supported(
                    tensor, f"{who}: {qualified} of module {path or '<model>'!r}"
                )
                continue
            plain = type(tensor) in (torch.Tensor, torch.nn.Parameter) or (
                isinstance(tensor, torch.nn.Parameter) and type(tensor.data) is torch.Tensor
            )
            if not plain:
                raise MxsimError(
                    f"{who}: {qualified} of module {path or '<model>'!r} ({type(module).__name__}) is a "
                    f"{type(tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor).__name__}"
                    ", a tensor subclass, which is not supported (plain tensors, AMD Quark's "
                    "quantizer modules and torchao's MXTensor and NVFP4Tensor weights are)"
                )


@contextlib.contextmanager
def running(recorder: _Recorder, who: str):
    """Turn an exception torch raises while the model runs into one MxsimError line naming the
    module it was raised in (the last one entered) and the exception (chained)."""
    try:
        yield
    except MxsimError:
        raise
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AssertionError) as error:
        where = recorder.last_entered or "<model>"
        first = (str(error).strip().splitlines() or [""])[0]
        raise MxsimError(
            f"{who}: module {where!r} raised {type(error).__name__} ({first[:200]}); "
            "it is not supported"
        ) from error


@contextlib.contextmanager
def _outside_modes(torch):
    """Every torch function and dispatch mode taken off while active (put back after), so that
    a library's quantizer runs as it does without mxsim (Quark compiles it with
    ``torch.compile(fullgraph=True)``, which refuses to run under a dispatch mode)."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode_temporarily
    from torch.utils._python_dispatch import _disable_current_modes

    with contextlib.ExitStack() as stack:
        for _ in range(len(_get_current_function_mode_stack())):
            stack.enter_context(_pop_mode_temporarily())
        stack.enter_context(_disable_current_modes())
        yield


def _library_forward(torch, recorder: _Recorder, module, path: str, forward):
    """``module``'s forward run outside the interception modes, its output remembered with its
    float input (:meth:`_Recorder.library_operands` matches it to the layer that uses it)."""

    def library_forward(x, *args, **kwargs):
        with _outside_modes(torch):
            out = forward(x, *args, **kwargs)
        if (
            (isinstance(out, torch.Tensor) or torch_brevitas.is_quant_tensor(out))
            and isinstance(x, torch.Tensor)
            and out is not x
        ):
            recorder.library_outputs[id(out)] = (out, x, module, path)
        return out

    return library_forward


@contextlib.contextmanager
def intercepting(torch, model, recorder: _Recorder):
    """While active, every matmul and convolution run goes through ``recorder`` (under
    ``torch.no_grad()``, with the MultiheadAttention fast path off; module hooks on ``model``,
    if given, name the layers)."""
    handles = []

    def enter(path, module):
        def hook(_module, _inputs):
            recorder.module_stack.append((path, module))
            recorder.last_entered = path or type(module).__name__

        return hook

    def leave(_module, _inputs, _output):
        recorder.module_stack.pop()

    wrapped = []
    for module_name, module in model.named_modules() if model is not None else ():
        handles.append(module.register_forward_pre_hook(enter(module_name, module)))
        handles.append(module.register_forward_hook(leave, always_call=True))
        if (
            torch_quark.is_quark_quantizer(module)
            or torch_brevitas.is_brevitas_quantizer(module)
            or torch_checkpoint.is_stored_quantizer(module)
        ):
            wrapped.append((module, vars(module).get("forward")))
            module.forward = _library_forward(torch, recorder, module, module_name, module.forward)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    function_mode, dispatch_mode = _modes(torch, recorder)
    try:
        torch.backends.mha.set_fastpath_enabled(False)
        with torch.no_grad(), function_mode, dispatch_mode:
            yield recorder
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        for handle in handles:
            handle.remove()
        for module, forward in wrapped:
            if forward is None:
                del module.forward
            else:
                module.forward = forward
        recorder.library_outputs.clear()


def capture_torch(
    model,
    sample_inputs,
    *,
    quant: QuantArg = None,
    name: str = "torch-model",
    source: Mapping | None = None,
    metadata: Mapping | None = None,
    dataset: Mapping[str, np.ndarray] | None = None,
    network: bool | None = None,
) -> Trace:
    """Run ``model`` once on ``sample_inputs`` and capture every matmul and convolution it runs.

    Args:
        model: an ``nn.Module``.
        sample_inputs: a tensor, a tuple/list of positional arguments, or a mapping of
            keyword arguments (e.g. a tokenizer's ``input_ids`` and ``attention_mask``).
        quant: None; a mapping ``{"input": spec, "weight": spec, "bias": spec}`` applied to
            every layer; or ``callable(layer_name, module) -> mapping | None`` (``module``: the
            module owning the layer's weight parameter, else the module running the op). A
            spec whose ``axis`` is None gets the operand's reduction axis (input: last axis,
            channels (1) for convolutions; weight: 1 for linear and conv2d, -2 for matmul, 0
            for conv_transpose2d; bias: last axis).
        name, source, metadata: recorded in the manifest (``source.framework`` is "torch").
        dataset: arrays saved with the trace for end-to-end evaluation, e.g.
            ``{"inputs": x, "labels": y}``.
        network: record a sequential recipe (:class:`Network`) for ``nn.Sequential`` models
            built from Linear/Conv2d/ReLU/Flatten/Identity/eval-mode Dropout. None: when
            possible (needs ``dataset["inputs"]`` to be the sample input); True: required
            (raises otherwise); False: never.

    Layers, in execution order (see the module docstring for how they are found):

    * ``linear``: ``F.linear`` (every ``nn.Linear``, of any input rank) and ``mm``/``addmm``
      whose right operand is a 2-d parameter's transpose; weight (N, K) as stored.
    * ``matmul``: ``torch.matmul``/``@`` (batch dims kept, a 1-d operand promoted to a
      matrix, ``source.promoted``), ``mm``/``addmm`` with a (K, N) weight (HF ``Conv1D``),
      ``bmm``, ``baddbmm`` (bias = the added tensor; ``alpha``/``beta`` attrs), ``mv``,
      ``dot``, and the two matmuls of each attention call.
    * ``conv2d`` / ``conv_transpose2d``: ``aten.convolution`` in 2-d, and 1-d as height 1
      (``source.conv1d_as_2d``); the padding the op applies is explicit (``padding="same"``
      and non-zero ``padding_mode`` inputs arrive padded).

    Names: a layer whose weight is a parameter is named after it (``h.0.attn.c_attn`` for
    ``h.0.attn.c_attn.weight``, ``attn.in_proj`` for ``attn.in_proj_weight``); other layers
    are ``<module path>.<op>`` (``h.0.attn.sdpa.qk``, ``layer.0.attention.self.matmul``).
    A name used again gets ``#2``, ``#3``...
    """
    torch = require("torch")
    nn = torch.nn
    if not isinstance(model, nn.Module):
        raise MxsimError(
            f"capture_torch: model must be a torch.nn.Module, got {type(model).__name__}"
        )
    kwargs = dict(sample_inputs) if isinstance(sample_inputs, Mapping) else {}
    args = (
        ()
        if kwargs
        else tuple(sample_inputs)
        if isinstance(sample_inputs, (tuple, list))
        else (sample_inputs,)
    )
    check_model(torch, model, "capture_torch")
    recorder = _Recorder(torch, model, quant)
    with intercepting(torch, model, recorder), running(recorder, "capture_torch"):
        model(*args, **kwargs)
    if not recorder.layers:
        raise MxsimError(
            "capture_torch: the model ran no matmul or convolution"
            + (f" that could be captured (skipped: {recorder.skipped})" if recorder.skipped else "")
        )
    if recorder.skipped:
        listed = "; ".join(f"{s['name']} ({s['op']}): {s['reason']}" for s in recorder.skipped[:5])
        more = f"; and {len(recorder.skipped) - 5} more" if len(recorder.skipped) > 5 else ""
        warnings.warn(
            f"capture_torch: {len(recorder.skipped)} matmul-like op(s) not captured, listed in "
            f"source.skipped: {listed}{more}",
            CaptureWarning,
            stacklevel=2,
        )
    recipe = None
    if network is not False:
        input_matches = (
            dataset is not None
            and "inputs" in dataset
            and len(args) == 1
            and np.array_equal(np.asarray(dataset["inputs"]), _to_numpy(args[0]))
        )
        recipe = (
            _sequential_network(model, recorder.layer_names, "inputs") if input_matches else None
        )
        if recipe is not None and "labels" in dataset:
            recipe = Network(recipe.input, recipe.steps, "labels")
        if network is True and recipe is None:
            raise MxsimError(
                "capture_torch: network=True needs an nn.Sequential of Linear/Conv2d/ReLU/Flatten/"
                "Identity/eval Dropout, each layer called once, and dataset['inputs'] equal to "
                "the sample input"
            )
    trace_source = {"framework": "torch", "torch_version": torch.__version__, **dict(source or {})}
    if recorder.skipped:
        trace_source["skipped"] = recorder.skipped
    trace = Trace(
        name,
        recorder.layers,
        trace_source,
        dict(metadata or {}),
        None if dataset is None else {k: np.asarray(v) for k, v in dataset.items()},
        recipe,
    )
    validate_trace(trace)
    return trace
