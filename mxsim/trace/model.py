"""The in-memory trace: :class:`Trace`, :class:`Layer`, :class:`Network`, and the format's vocabulary.

A trace on disk is a directory with a versioned YAML manifest and NPZ tensor files
(``docs/trace-format.md`` is the full reference)::

    TRACE/
      manifest.yaml          format: mxsim-trace, version: 1, source, layers, ...
      layers/000-NAME.npz    one file per layer: input, weight, bias, output, ...
      dataset.npz            optional: arrays for end-to-end evaluation (inputs, labels)

:mod:`.validate` checks a trace against the rules below; :mod:`.io` reads and writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import MxsimError
from .conv import Conv2dGeometry, ConvTranspose2dGeometry
from .quant import QuantSpec

FORMAT_NAME = "mxsim-trace"
#: Version 2 stores every layer array once, as a content-addressed blob in ``tensors/``;
#: version 1 (one NPZ per layer) still loads.
FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
MANIFEST_NAME = "manifest.yaml"
DATASET_FILE = "dataset.npz"
BLOB_DIR = "tensors"

OPS = ("linear", "matmul", "conv2d", "conv_transpose2d")
CONV_OPS = ("conv2d", "conv_transpose2d")
OPERANDS = ("input", "weight", "bias")
#: Tensor names a layer file may hold besides the QDQ arrays ``quant.<operand>.scale|zero_point``.
TENSOR_ROLES = (
    "input",
    "weight",
    "bias",
    "output",
    "input_quantized",
    "weight_quantized",
    "bias_quantized",
)
REQUIRED_TENSORS = ("input", "weight", "output")
FLOAT_DTYPES = ("float16", "float32", "float64")
#: dtypes allowed anywhere (QDQ zero points, dataset labels): plain numbers only.
NUMERIC_DTYPES = FLOAT_DTYPES + (
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
)
NETWORK_OPS = {"relu": {}, "flatten": {"start_dim": 1}, "identity": {}}


@dataclass(eq=False)
class Layer:
    """One captured GEMM-like layer.

    * ``name``: unique within the trace.
    * ``op``: ``linear`` (``output = alpha * input @ weight.T + beta * bias``, weight (N, K)),
      ``matmul`` (``output = alpha * input @ weight + beta * bias``, numpy matmul semantics
      with batch broadcasting, weight (..., K, N), which may be an activation), ``conv2d`` or
      ``conv_transpose2d`` (weight (C, O/groups, kh, kw)) (:mod:`mxsim.trace.conv` conventions).
    * ``tensors``: ``input``, ``weight``, ``output`` always; ``bias`` optional. Operands are
      the float values *before* quantization; where the source model quantized an operand
      itself (QDQ or Quark nodes), ``<operand>_quantized`` holds what the layer actually
      consumed. ``output`` is the source framework's result (the float reference).
    * ``attrs``: conv2d: ``stride`` [sh, sw], ``padding`` [[top, bottom], [left, right]],
      ``dilation`` [dh, dw], ``groups``; conv_transpose2d: the same plus ``output_padding``
      [oh, ow]; linear and matmul: optional ``alpha``, ``beta`` (default 1.0).
    * ``quant``: operand name -> spec or None (not quantized / unknown).
    * ``source``: free-form provenance (module or node name, op type...).
    * ``codes_only``: operands (``input``, ``weight``) whose float before quantization the
      trace does not keep (saved with ``floats=False``): their tensor holds the model's
      quantized values, decoded from the stored element codes and scales.
    * ``reference``: how the trace holds ``output``: ``float32`` (the reference itself) or a
      residual mode of :data:`mxsim.trace.reference.REFERENCE_MODES` (``residual8``: the
      reference reconstructed from the exact MX product of the codes and a coarse residual,
      within the bound that module states).
    """

    name: str
    op: str
    tensors: dict[str, np.ndarray]
    attrs: dict = field(default_factory=dict)
    quant: dict[str, QuantSpec | None] = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    codes_only: frozenset = frozenset()
    reference: str = "float32"

    @property
    def input(self) -> np.ndarray:
        return self.tensors["input"]

    @property
    def weight(self) -> np.ndarray:
        return self.tensors["weight"]

    @property
    def bias(self) -> np.ndarray | None:
        return self.tensors.get("bias")

    @property
    def output(self) -> np.ndarray:
        return self.tensors["output"]

    def quantized(self, operand: str) -> np.ndarray | None:
        """What the source model fed the GEMM for ``operand`` after its own quantizer, if recorded."""
        return self.tensors.get(f"{operand}_quantized")

    def conv_geometry(
        self, input_shape: tuple | None = None
    ) -> Conv2dGeometry | ConvTranspose2dGeometry:
        """The geometry of a conv2d / conv_transpose2d layer (from its input/weight shapes and
        attrs; ``input_shape`` replaces the recorded input's shape, e.g. another batch size)."""
        if self.op not in CONV_OPS:
            raise MxsimError(f"layer {self.name!r} is {self.op}, not a convolution")
        a = self.attrs
        shape = self.input.shape if input_shape is None else tuple(input_shape)
        if self.op == "conv2d":
            return Conv2dGeometry.from_shapes(
                shape, self.weight.shape, a["stride"], a["padding"], a["dilation"], a["groups"]
            )
        return ConvTranspose2dGeometry.from_shapes(
            shape,
            self.weight.shape,
            a["stride"],
            a["padding"],
            a["output_padding"],
            a["dilation"],
            a["groups"],
        )


@dataclass(frozen=True)
class Network:
    """A sequential recipe to run the captured layers end to end.

    ``input``: the dataset array fed to the first step. ``steps``: each either
    ``{"layer": NAME}`` (run that layer on the current value; its weights/bias from the
    trace) or ``{"op": OP, ...}`` with OP in ``relu``, ``flatten`` (``start_dim``, default 1:
    ``x.reshape(x.shape[:start_dim] + (-1,))``) or ``identity``. ``labels``: an optional
    dataset array of integer class labels for accuracy (argmax of the last value).

    A network that is not sequential is rebuilt instead: ``model`` is ``{"architecture":
    NAME, "config": {...}, "state": PREFIX}`` (NAME one of
    :data:`mxsim.inloop.charlm.ARCHITECTURES`; its parameters are the dataset arrays named
    PREFIX + parameter name) and ``steps`` is empty. ``targets``: an optional dataset array of
    integer next-token ids, as many as ``input`` has token ids, for perplexity.
    """

    input: str
    steps: tuple
    labels: str | None = None
    targets: str | None = None
    model: dict | None = None

    def to_manifest(self) -> dict:
        out = {"input": self.input, "steps": [dict(s) for s in self.steps], "labels": self.labels}
        if self.targets is not None:
            out["targets"] = self.targets
        if self.model is not None:
            out["model"] = {
                "architecture": self.model["architecture"],
                "config": dict(self.model["config"]),
                "state": self.model["state"],
            }
        return out


@dataclass(eq=False)
class Trace:
    """A captured model: layers, plus optional dataset and network recipe.

    ``source``: where it came from (``framework``: torch / onnx, ``model``, free-form
    details). ``metadata``: free-form plain data (e.g. ``float_accuracy``). ``path``: the
    directory it was loaded from (None if built in memory).
    """

    name: str
    layers: list[Layer]
    source: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    dataset: dict[str, np.ndarray] | None = None
    network: Network | None = None
    path: Path | None = None

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        names = ", ".join(layer.name for layer in self.layers)
        raise MxsimError(f"trace {self.name!r} has no layer {name!r}; layers: {names}")
