"""Capture a PyTorch model's nn.Linear and nn.Conv2d layers into a trace (``mxsim[torch]``).

Forward hooks record, for every call of every ``nn.Linear`` / ``nn.Conv2d`` during one
forward pass on the sample inputs: the input, the weight, the bias and the output, as numpy
arrays (bfloat16 is widened to float32 exactly; other float dtypes are kept). The capture runs
under ``torch.no_grad()`` and does not change the model's train/eval mode: call
``model.eval()`` first for inference behaviour (dropout, batch norm).

Quantization specs (``quant=``) are annotations: the captured tensors are the float values the
model computed; the specs tell replay how to quantize each operand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..errors import MxsimError
from ._optional import require
from .format import Layer, Network, Trace, validate_trace
from .quant import BFPQuant, MXQuant, QDQQuant

QuantArg = None | Mapping | Callable


def _to_numpy(tensor):
    torch = require("torch")
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
        tensor = tensor.to(torch.float32)
    return tensor.cpu().numpy().copy()


def _conv_padding(module, input_shape) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right)) zero padding of an nn.Conv2d with padding_mode 'zeros'."""
    padding = module.padding
    if padding == "valid":
        return ((0, 0), (0, 0))
    if padding == "same":
        pairs = []
        for dilation, kernel in zip(module.dilation, module.kernel_size):
            total = dilation * (kernel - 1)
            pairs.append((total // 2, total - total // 2))  # torch puts the odd pixel after
        return tuple(pairs)
    ph, pw = padding
    return ((ph, ph), (pw, pw))


def _reduction_axis(op: str, operand: str, ndim: int) -> int:
    """The axis of ``operand`` that runs along the GEMM reduction K (channels for conv)."""
    if op == "conv2d":
        return 1
    return ndim - 1 if operand == "input" else 1


def _resolve_quant(quant: QuantArg, name: str, module, op: str, tensors: dict) -> dict:
    """Every operand the layer has -> its spec (axis resolved) or None."""
    unquantized = {operand: None for operand in ("input", "weight", "bias") if operand in tensors}
    specs = quant(name, module) if callable(quant) else quant
    if specs is None:
        return unquantized
    if not isinstance(specs, Mapping):
        raise MxsimError(
            f"capture_torch: quant for layer {name!r} must map operand -> spec, got {type(specs).__name__}")
    resolved = unquantized
    for operand, spec in specs.items():
        if operand not in ("input", "weight", "bias"):
            raise MxsimError(f"capture_torch: quant operand must be input, weight or bias, got {operand!r}")
        if operand not in tensors:  # e.g. a bias spec for a layer without bias
            continue
        if spec is None:
            continue
        if not isinstance(spec, (MXQuant, BFPQuant, QDQQuant)):
            raise MxsimError(f"capture_torch: quant[{operand!r}] must be MXQuant, BFPQuant or QDQQuant")
        ndim = tensors[operand].ndim
        axis = _reduction_axis(op, operand, ndim) if spec.axis is None else spec.axis % ndim
        resolved[operand] = spec.with_axis(axis)
    return resolved


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
                steps.append({"layer": names[0]})
            elif isinstance(module, nn.ReLU):
                steps.append({"op": "relu"})
            elif isinstance(module, nn.Flatten):
                if module.end_dim != -1:
                    return False
                steps.append({"op": "flatten", "start_dim": int(module.start_dim)})
            elif isinstance(module, nn.Identity):
                continue
            elif isinstance(module, (nn.Dropout, nn.Dropout1d, nn.Dropout2d)) and not module.training:
                continue  # identity in eval mode
            else:
                return False
        return True

    return Network(input_name, tuple(steps)) if walk(model) and steps else None


def capture_torch(model, sample_inputs, *, quant: QuantArg = None, name: str = "torch-model",
                  source: Mapping | None = None, metadata: Mapping | None = None,
                  dataset: Mapping[str, np.ndarray] | None = None, network: bool | None = None) -> Trace:
    """Run ``model`` once on ``sample_inputs`` and capture every Linear/Conv2d call.

    Args:
        model: an ``nn.Module``.
        sample_inputs: a tensor, or a tuple/list of positional arguments.
        quant: None; a mapping ``{"input": spec, "weight": spec, "bias": spec}`` applied to
            every layer; or ``callable(layer_name, module) -> mapping | None``. A spec whose
            ``axis`` is None gets the operand's reduction axis (conv input/weight: 1; linear
            input: last; linear weight: 1).
        name, source, metadata: recorded in the manifest (``source.framework`` is "torch").
        dataset: arrays saved with the trace for end-to-end evaluation, e.g.
            ``{"inputs": x, "labels": y}``.
        network: record a sequential recipe (:class:`Network`) for ``nn.Sequential`` models
            built from Linear/Conv2d/ReLU/Flatten/Identity/eval-mode Dropout. None: when
            possible (needs ``dataset["inputs"]`` to be the sample input); True: required
            (raises otherwise); False: never.

    Layer names are the modules' qualified names (``features.0``); a module called more than
    once gets ``name#2``, ``name#3``... for the later calls. A Conv2d with a non-zero
    ``padding_mode`` (reflect, replicate, circular) is recorded with its input already padded
    by that mode and padding 0.
    """
    torch = require("torch")
    nn = torch.nn
    F = torch.nn.functional
    if not isinstance(model, nn.Module):
        raise MxsimError(f"capture_torch: model must be a torch.nn.Module, got {type(model).__name__}")
    args = tuple(sample_inputs) if isinstance(sample_inputs, (tuple, list)) else (sample_inputs,)
    layers: list[Layer] = []
    calls: dict[str, int] = {}
    layer_names: dict[int, list[str]] = {}
    handles = []

    def make_hook(module_name: str):
        def hook(module, inputs, output):
            count = calls.get(module_name, 0) + 1
            calls[module_name] = count
            layer_name = module_name if count == 1 else f"{module_name}#{count}"
            layer_names.setdefault(id(module), []).append(layer_name)
            x = inputs[0]
            if not isinstance(x, torch.Tensor) or not isinstance(output, torch.Tensor):
                raise MxsimError(f"capture_torch: {module_name}: expected tensor input and output")
            source = {"module": module_name, "type": type(module).__name__}
            if x.dtype == torch.bfloat16:
                source["dtype"] = "bfloat16"
            if isinstance(module, nn.Conv2d):
                op = "conv2d"
                if x.dim() != 4:
                    raise MxsimError(f"capture_torch: {module_name}: unbatched conv2d input {tuple(x.shape)} "
                                     "is not supported; pass a batch (N, C, H, W)")
                if module.padding_mode != "zeros":
                    x = F.pad(x, module._reversed_padding_repeated_twice, mode=module.padding_mode)
                    padding = ((0, 0), (0, 0))
                    source["padding_mode"] = module.padding_mode
                else:
                    padding = _conv_padding(module, x.shape)
                attrs = {"stride": list(module.stride), "padding": [list(p) for p in padding],
                         "dilation": list(module.dilation), "groups": int(module.groups)}
            else:
                op = "linear"
                attrs = {}
            tensors = {"input": _to_numpy(x), "weight": _to_numpy(module.weight), "output": _to_numpy(output)}
            if module.bias is not None:
                tensors["bias"] = _to_numpy(module.bias)
            specs = _resolve_quant(quant, layer_name, module, op, tensors)
            layers.append(Layer(layer_name, op, tensors, attrs, specs, source))
        return hook

    for module_name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            handles.append(module.register_forward_hook(make_hook(module_name or type(module).__name__)))
    if not handles:
        raise MxsimError("capture_torch: the model has no nn.Linear or nn.Conv2d modules")
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for handle in handles:
            handle.remove()
    recipe = None
    if network is not False:
        input_matches = (dataset is not None and "inputs" in dataset and len(args) == 1
                         and np.array_equal(np.asarray(dataset["inputs"]), _to_numpy(args[0])))
        recipe = _sequential_network(model, layer_names, "inputs") if input_matches else None
        if recipe is not None and "labels" in dataset:
            recipe = Network(recipe.input, recipe.steps, "labels")
        if network is True and recipe is None:
            raise MxsimError("capture_torch: network=True needs an nn.Sequential of Linear/Conv2d/ReLU/Flatten/"
                             "Identity/eval Dropout, each layer called once, and dataset['inputs'] equal to "
                             "the sample input")
    trace = Trace(name, layers, {"framework": "torch", "torch_version": torch.__version__, **dict(source or {})},
                  dict(metadata or {}), None if dataset is None else {k: np.asarray(v) for k, v in dataset.items()},
                  recipe)
    validate_trace(trace)
    return trace
