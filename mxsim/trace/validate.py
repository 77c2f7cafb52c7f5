"""Validation of an in-memory trace: op, attrs, tensor names/dtypes/shapes, quant specs, network.

Every problem raises :class:`mxsim.errors.TraceError` naming the trace, the layer and the
field (:func:`trace_error`); :func:`validate_trace` stops at the first one.
"""

from __future__ import annotations

import numpy as np

from ..errors import BudgetError, MxsimError, TraceError
from ..limits import check_array_budget, is_integer
from .model import (
    CONV_OPS,
    FLOAT_DTYPES,
    NETWORK_OPS,
    NUMERIC_DTYPES,
    OPERANDS,
    OPS,
    REQUIRED_TENSORS,
    TENSOR_ROLES,
    Layer,
    Network,
    Trace,
)
from .quant import BFPQuant, MXQuant, NVFP4Quant, QDQQuant
from .reference import REFERENCE_MODES


def trace_error(
    trace: str, message: str, layer: str | None = None, field: str | None = None
) -> TraceError:
    """A TraceError whose message reads ``trace T: layer L: field F: message``.

    The parts are also attributes (``trace``, ``layer``, ``field``) for programs.
    """
    where = [f"trace {trace}"]
    if layer is not None:
        where.append(f"layer {layer!r}")
    if field is not None:
        where.append(f"field {field!r}")
    error = TraceError(": ".join(where) + ": " + message)
    error.trace, error.layer, error.field = trace, layer, field
    return error


def _int_pair(value) -> bool:
    return (
        isinstance(value, (list, tuple)) and len(value) == 2 and all(is_integer(v) for v in value)
    )


def _check_conv_attrs(op: str, attrs: dict, fail) -> None:
    keys = ("stride", "padding", "dilation", "groups") + (
        ("output_padding",) if op == "conv_transpose2d" else ()
    )
    for key in keys:
        if key not in attrs:
            fail(f"attrs.{key}", f"missing ({op} needs {', '.join(keys)})")
    extra = set(attrs) - set(keys)
    if extra:
        fail(f"attrs.{sorted(extra, key=str)[0]}", f"not a {op} attribute")
    if op == "conv_transpose2d" and not (
        _int_pair(attrs["output_padding"]) and min(attrs["output_padding"]) >= 0
    ):
        fail(
            "attrs.output_padding",
            f"must be [oh, ow] with ints >= 0, got {attrs['output_padding']!r}",
        )
    if not (_int_pair(attrs["stride"]) and min(attrs["stride"]) >= 1):
        fail("attrs.stride", f"must be [sh, sw] with ints >= 1, got {attrs['stride']!r}")
    if not (_int_pair(attrs["dilation"]) and min(attrs["dilation"]) >= 1):
        fail("attrs.dilation", f"must be [dh, dw] with ints >= 1, got {attrs['dilation']!r}")
    pad = attrs["padding"]
    if not (
        isinstance(pad, (list, tuple))
        and len(pad) == 2
        and all(_int_pair(p) and min(p) >= 0 for p in pad)
    ):
        fail("attrs.padding", f"must be [[top, bottom], [left, right]] with ints >= 0, got {pad!r}")
    if not (is_integer(attrs["groups"]) and attrs["groups"] >= 1):
        fail("attrs.groups", f"must be an int >= 1, got {attrs['groups']!r}")


def _broadcastable(shape: tuple, target: tuple) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def check_layer(layer: Layer, fail) -> None:
    """Check one layer's op, attrs, tensor names/dtypes/shapes and quant specs.

    ``fail(field, message)`` must raise; it is called for the first problem found.
    """
    if layer.op not in OPS:
        fail("op", f"unknown op {layer.op!r}; accepted: {', '.join(OPS)}")
    for operand in sorted(layer.codes_only, key=str):
        if operand not in ("input", "weight") or not isinstance(layer.quant.get(operand), MXQuant):
            fail(
                "codes_only",
                f"{operand!r}: only an input or weight with an MX spec is stored as codes",
            )
    if not isinstance(layer.reference, str) or layer.reference not in REFERENCE_MODES:
        fail(
            "reference",
            f"unknown reference {layer.reference!r}; accepted: {', '.join(REFERENCE_MODES)}",
        )
    if layer.reference != "float32" and not {"input", "weight"} <= layer.codes_only:
        fail(
            "reference",
            f"a {layer.reference} output is reconstructed from the operands' codes: both must be "
            "codes only",
        )
    t = layer.tensors
    if not isinstance(t, dict):
        fail("tensors", f"must be a mapping of tensor name -> numpy array, got {type(t).__name__}")
    for name in REQUIRED_TENSORS:
        if name not in t:
            fail(name, "missing tensor")
    for name, array in t.items():
        if name not in TENSOR_ROLES:
            fail(name, f"unknown tensor name; accepted: {', '.join(TENSOR_ROLES)}")
        if not isinstance(array, np.ndarray):
            fail(name, f"must be a numpy array, got {type(array).__name__}")
        if array.dtype.name not in FLOAT_DTYPES:
            fail(
                name,
                f"dtype {array.dtype} is not allowed here (expected one of {', '.join(FLOAT_DTYPES)})",
            )
        if array.size == 0:
            fail(name, f"shape {array.shape} is empty; a layer's tensors need at least one element")
    x, w, out = t["input"].shape, t["weight"].shape, t["output"].shape
    bias = t.get("bias")
    attrs = layer.attrs if isinstance(layer.attrs, dict) else fail("attrs", "must be a mapping")
    if layer.op in ("linear", "matmul"):
        extra = set(attrs) - {"alpha", "beta"}
        if extra:
            fail(f"attrs.{sorted(extra, key=str)[0]}", f"not a {layer.op} attribute (alpha, beta)")
        for key in ("alpha", "beta"):
            if key in attrs and (
                isinstance(attrs[key], bool) or not isinstance(attrs[key], (int, float))
            ):
                fail(f"attrs.{key}", f"must be a number, got {attrs[key]!r}")
    if layer.op == "linear":
        if len(w) != 2:
            fail("weight", f"linear weight must be (N, K), got shape {w}")
        if len(x) < 1 or x[-1] != w[1]:
            fail("input", f"shape {x} does not end in K = {w[1]} (weight shape {w})")
        expected = x[:-1] + (w[0],)
        if out != expected:
            fail(
                "output", f"shape {out} does not match input {x} x weight {w}: expected {expected}"
            )
    elif layer.op == "matmul":
        if len(x) < 2 or len(w) < 2:
            fail(
                "input" if len(x) < 2 else "weight",
                f"matmul operands must be at least 2-d, got {x} and {w}",
            )
        if x[-1] != w[-2]:
            fail(
                "weight",
                f"shape {w}: K = {w[-2]} does not match the input's K = {x[-1]} (input {x})",
            )
        try:
            batch = np.broadcast_shapes(x[:-2], w[:-2])
        except ValueError:
            fail("weight", f"batch dimensions of {x} and {w} do not broadcast")
        expected = batch + (x[-2], w[-1])
        if out != expected:
            fail(
                "output", f"shape {out} does not match input {x} @ weight {w}: expected {expected}"
            )
    else:
        _check_conv_attrs(layer.op, attrs, fail)
        if len(x) != 4:
            fail("input", f"{layer.op} input must be (N, C, H, W), got shape {x}")
        if len(w) != 4:
            layout = "(O, C/groups, kh, kw)" if layer.op == "conv2d" else "(C, O/groups, kh, kw)"
            fail("weight", f"{layer.op} weight must be {layout}, got shape {w}")
        try:
            geometry = layer.conv_geometry()
        except MxsimError as error:
            fail("weight", str(error))
        if out != geometry.output_shape:
            fail(
                "output",
                f"shape {out} does not match the convolution: expected {geometry.output_shape}",
            )
        try:  # replay lowers the input to an (groups, M, K) im2col matrix of float64
            check_array_budget(
                (geometry.groups, geometry.gemm_m, geometry.gemm_k), 8, "its im2col lowering"
            )
        except BudgetError as error:
            fail("input", str(error))
        if bias is not None and bias.shape != (geometry.out_channels,):
            fail(
                "bias",
                f"{layer.op} bias must be ({geometry.out_channels},), got shape {bias.shape}",
            )
    if bias is not None and layer.op not in CONV_OPS and not _broadcastable(bias.shape, out):
        fail("bias", f"shape {bias.shape} does not broadcast to the output shape {out}")
    for operand in OPERANDS:
        quantized = t.get(f"{operand}_quantized")
        if quantized is not None:
            if operand not in t:
                fail(f"{operand}_quantized", f"present without {operand}")
            if quantized.shape != t[operand].shape:
                fail(
                    f"{operand}_quantized",
                    f"shape {quantized.shape} differs from {operand} {t[operand].shape}",
                )
    if not isinstance(layer.quant, dict):
        fail("quant", "must be a mapping of operand -> spec or None")
    for operand, spec in layer.quant.items():
        if operand not in OPERANDS:
            fail(f"quant.{operand}", f"unknown operand; accepted: {', '.join(OPERANDS)}")
        if spec is None:
            continue
        if not isinstance(spec, (MXQuant, BFPQuant, QDQQuant, NVFP4Quant)):
            fail(
                f"quant.{operand}",
                f"must be MXQuant, BFPQuant, QDQQuant, NVFP4Quant or None, got {type(spec).__name__}",
            )
        if operand not in t:
            fail(f"quant.{operand}", f"spec given but the layer has no {operand} tensor")
        rank = t[operand].ndim
        if spec.axis is None:
            if not (isinstance(spec, QDQQuant) and spec.scale.size == 1):
                fail(f"quant.{operand}.axis", "unresolved (None)")
        elif not -rank <= spec.axis < rank:
            fail(f"quant.{operand}.axis", f"{spec.axis} is out of range for the {rank}-d {operand}")
        if isinstance(spec, QDQQuant) and spec.axis is not None:
            dim = t[operand].shape[spec.axis]
            expected = (dim,) if spec.block_size == 0 else None
            if expected is not None and spec.scale.size > 1 and spec.scale.shape != expected:
                fail(
                    f"quant.{operand}.scale",
                    f"per-axis scale shape {spec.scale.shape}, expected {expected}",
                )
            if spec.block_size:
                blocked = list(t[operand].shape)
                blocked[spec.axis] = -(-dim // spec.block_size)
                if spec.scale.shape != tuple(blocked):
                    fail(
                        f"quant.{operand}.scale",
                        f"blocked scale shape {spec.scale.shape}, expected {tuple(blocked)}",
                    )
        if (
            isinstance(spec, (MXQuant, NVFP4Quant))
            and spec.scales is not None
            and spec.axis is not None
        ):
            shape = list(t[operand].shape)
            dim = shape.pop(spec.axis)
            expected = (*shape, -(-dim // spec.block_size))
            if isinstance(spec, NVFP4Quant) and dim % spec.block_size:
                fail(
                    f"quant.{operand}.axis",
                    f"the {operand}'s axis {spec.axis} ({dim}) is not a multiple of the NVFP4 "
                    f"block size {spec.block_size}",
                )
            if spec.scales.shape != expected:
                fail(
                    f"quant.{operand}.scales",
                    f"shape {spec.scales.shape}, expected {expected} (the operand's blocks "
                    "with the axis last)",
                )
        if isinstance(spec, QDQQuant):
            for key, array in spec.arrays(operand).items():
                if array.dtype.name not in NUMERIC_DTYPES:
                    fail(key, f"dtype {array.dtype} is not a plain numeric dtype")


def check_network(network: Network, layers: dict[str, Layer], dataset: dict | None, fail) -> None:
    """Check a network recipe against the layers (by name) and the dataset, shapes included;
    ``fail(field, message)`` raises."""
    if dataset is None:
        fail("network", "a network needs a dataset (its input array)")
    if not isinstance(network.input, str) or network.input not in dataset:
        fail(
            "network.input",
            f"{network.input!r} is not a dataset array ({', '.join(sorted(dataset))})",
        )
    if dataset[network.input].size == 0:
        fail("network.input", f"the dataset array {network.input!r} is empty")
    for key in ("labels", "targets"):
        name = getattr(network, key)
        if name is not None and (not isinstance(name, str) or name not in dataset):
            fail(
                f"network.{key}", f"{name!r} is not a dataset array ({', '.join(sorted(dataset))})"
            )
        if name is not None and dataset[name].dtype.kind not in "iu":
            fail(f"network.{key}", f"{key} must be integers, got {dataset[name].dtype}")
    if (
        network.targets is not None
        and dataset[network.targets].shape != dataset[network.input].shape
    ):
        fail(
            "network.targets",
            f"shape {dataset[network.targets].shape} differs from the input's "
            f"{dataset[network.input].shape}",
        )
    if network.model is not None:
        model = network.model
        if not isinstance(model, dict) or set(model) != {"architecture", "config", "state"}:
            fail("network.model", "must be a mapping with architecture, config and state")
        if not isinstance(model["config"], dict) or not isinstance(model["state"], str):
            fail("network.model", "config must be a mapping and state a dataset name prefix")
        if not any(name.startswith(model["state"]) for name in dataset):
            fail("network.model.state", f"no dataset array starts with {model['state']!r}")
        if network.steps:
            fail("network.steps", "must be empty when network.model rebuilds the network")
        return
    if not network.steps:
        fail("network.steps", "empty")
    for index, step in enumerate(network.steps):
        where = f"network.steps[{index}]"
        if not isinstance(step, dict):
            fail(where, f"must be a mapping, got {step!r}")
        if "layer" in step:
            if set(step) != {"layer"}:
                fail(where, f"a layer step has only the key 'layer', got {sorted(step)}")
            if not isinstance(step["layer"], str) or step["layer"] not in layers:
                fail(where, f"unknown layer {step['layer']!r}")
        elif "op" in step:
            op = step["op"]
            if not isinstance(op, str) or op not in NETWORK_OPS:
                fail(where, f"unknown op {op!r}; accepted: {', '.join(NETWORK_OPS)}")
            extra = set(step) - {"op"} - set(NETWORK_OPS[op])
            if extra:
                fail(where, f"op {op} takes no key {sorted(extra, key=str)[0]!r}")
            if op == "flatten" and not (
                is_integer(step.get("start_dim", 1)) and step.get("start_dim", 1) >= 0
            ):
                fail(where, "flatten start_dim must be an int >= 0")
        else:
            fail(where, "must have a 'layer' or an 'op' key")
    _check_network_shapes(network, layers, dataset, fail)


def _layer_output_shape(layer: Layer, shape: tuple) -> tuple | str:
    """The output shape of ``layer`` applied to an input of ``shape``, or why it cannot be."""
    weight = layer.weight.shape
    if layer.op == "linear":
        if not shape or shape[-1] != weight[1]:
            return f"takes inputs (..., {weight[1]}), gets {shape}"
        return shape[:-1] + (weight[0],)
    if layer.op == "matmul":
        if len(shape) < 2 or shape[-1] != weight[-2]:
            return f"takes inputs (..., M, {weight[-2]}), gets {shape}"
        try:
            batch = np.broadcast_shapes(shape[:-2], weight[:-2])
        except ValueError:
            return f"input batch dims {shape[:-2]} do not broadcast with the weight's {weight[:-2]}"
        return tuple(batch) + (shape[-2], weight[-1])
    if len(shape) != 4:
        return f"takes (N, C, H, W) inputs, gets {shape}"
    try:
        return tuple(layer.conv_geometry(shape).output_shape)
    except MxsimError as error:
        return str(error)


def _check_network_shapes(network: Network, layers: dict, dataset: dict, fail) -> None:
    """Walk the steps with shapes only: every layer gets an input it takes, every flatten a
    ``start_dim`` below its input's rank (torch's rule), and the labels are one per row of
    the last value."""
    shape = tuple(dataset[network.input].shape)
    for index, step in enumerate(network.steps):
        where = f"network.steps[{index}]"
        if "layer" in step:
            out = _layer_output_shape(layers[step["layer"]], shape)
            if isinstance(out, str):
                fail(where, f"layer {step['layer']!r} {out}")
            shape = out
        elif step["op"] == "flatten":
            start = step.get("start_dim", 1)
            if start >= len(shape):
                fail(
                    where,
                    f"flatten start_dim {start} is not below the rank {len(shape)} of its input {shape}",
                )
            shape = shape[:start] + (int(np.prod(shape[start:])),)
    if network.labels is not None:
        labels = dataset[network.labels].shape
        if len(labels) != 1 or not shape or labels[0] != shape[0]:
            fail(
                "network.labels",
                f"labels of shape {labels} do not give one label per row of the network's "
                f"output {shape}",
            )


def validate_trace(trace: Trace, label: str | None = None) -> None:
    """Raise TraceError for the first problem in an in-memory trace."""
    if not isinstance(trace, Trace):
        raise TraceError(f"expected a Trace, got {type(trace).__name__}")
    label = label or trace.name
    if not isinstance(trace.name, str) or not trace.name:
        raise trace_error(label, "must have a non-empty name", field="name")
    if not isinstance(trace.layers, list):
        raise trace_error(
            label,
            f"layers must be a list of Layer objects, got {type(trace.layers).__name__}",
            field="layers",
        )
    for key, value in (
        ("source", trace.source),
        ("metadata", trace.metadata),
        ("dataset", trace.dataset or {}),
    ):
        if not isinstance(value, dict):
            raise trace_error(label, f"must be a mapping, got {type(value).__name__}", field=key)
    names = set()
    for layer in trace.layers:
        if not isinstance(layer, Layer):
            raise trace_error(
                label, f"layers must be Layer objects, got {type(layer).__name__}", field="layers"
            )
        if not isinstance(layer.name, str) or not layer.name:
            raise trace_error(label, "a layer has an empty name", field="layers")
        if layer.name in names:
            raise trace_error(label, "duplicate layer name", layer=layer.name, field="name")
        names.add(layer.name)

        def fail(field_name, message, _layer=layer.name):
            raise trace_error(label, message, layer=_layer, field=field_name)

        check_layer(layer, fail)
    if trace.dataset is not None:
        for key, array in trace.dataset.items():
            if not isinstance(key, str):
                raise trace_error(
                    label, f"dataset array names must be strings, got {key!r}", field="dataset"
                )
            if not isinstance(array, np.ndarray) or array.dtype.name not in NUMERIC_DTYPES:
                raise trace_error(
                    label,
                    "dataset arrays must be plain numeric numpy arrays",
                    field=f"dataset.{key}",
                )

    def fail_network(field_name, message):
        raise trace_error(label, message, field=field_name)

    if trace.network is not None and not isinstance(trace.network, Network):
        raise trace_error(
            label, f"must be a Network or None, got {type(trace.network).__name__}", field="network"
        )
    if trace.network is not None:
        check_network(
            trace.network,
            {layer.name: layer for layer in trace.layers},
            trace.dataset,
            fail_network,
        )
