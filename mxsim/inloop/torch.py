"""A PyTorch model with every matmul and convolution computed by an mxsim unit (``mxsim[torch]``).

Interception is the capture's (:mod:`mxsim.capture.torch`): ``F.linear``,
``torch.matmul``/``@``, ``F.scaled_dot_product_attention`` at the call, and the ATen GEMMs
(``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``mv``, ``dot``, ``convolution``, CPU fused
attention) no such call covered. Each becomes a trace layer, is computed by
:func:`mxsim.replay.run.run_layer` on the unit, and its result replaces torch's, as a
float32 tensor of the same shape. Attention runs as ``q @ k^T`` on the unit, softmax in torch
(float32), then ``P @ v`` on the unit. Ops capture lists as skipped (integer GEMMs, conv3d,
...) keep torch's result and are listed in :attr:`UnitInLoop.skipped`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from .._optional import require
from ..capture.torch import QuantArg, _Recorder, intercepting
from ..datapath import HardwareConfig, load_hwconfig
from ..errors import MxsimError
from ..replay.run import run_layer
from ..trace.model import Layer

SCALINGS = ("auto", "block", "tensor")


def _unit(hw) -> HardwareConfig:
    return hw if isinstance(hw, HardwareConfig) else load_hwconfig(hw)


def check_scaling(scaling: str) -> bool | None:
    """``scaling`` -> the ``per_tensor_scale`` argument of :func:`~mxsim.replay.run.run_layer`."""
    if scaling not in SCALINGS:
        raise MxsimError(f"scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
    return None if scaling == "auto" else scaling == "tensor"


class UnitInLoop(_Recorder):
    """The recorder of :func:`torch_unit`: computes each layer on the unit instead of keeping it.

    ``layers``: names of the layers computed so far, in order; ``skipped``: ops left to torch.
    """

    def __init__(self, torch, model, hw: HardwareConfig, quant: QuantArg, a_format, b_format, out_format,
                 per_tensor_scale):
        super().__init__(torch, model, quant)
        self.hw = hw
        self.a_format, self.b_format, self.out_format = a_format, b_format, out_format
        self.per_tensor_scale = per_tensor_scale
        self.computed_layers: list[str] = []

    def computed(self, layer: Layer) -> np.ndarray:
        self.layers.pop()  # the operands are not kept
        self.computed_layers.append(layer.name)
        return run_layer(layer, self.hw, element_format=self.a_format, weight_format=self.b_format,
                         per_tensor_scale=self.per_tensor_scale, out_format=self.out_format, with_ideal=False).values


@contextlib.contextmanager
def torch_unit(model, hw, *, a_format: str | None = None, b_format: str | None = None,
               out_format: str | None = None, scaling: str = "auto", quant: QuantArg = None) -> Iterator[UnitInLoop]:
    """While active, every matmul and convolution PyTorch runs is computed by the unit ``hw``.

    Args:
        model: the ``nn.Module`` to be run (its parameter and module names name the layers,
            and ``quant`` callables receive its modules), or None.
        hw: a :class:`HardwareConfig`, or the path of a config for :func:`mxsim.load_hwconfig`.
        a_format, b_format: element formats for the input (A) and weight (B) operands, OCP
            profile (b_format defaults to a_format). None: the layer's ``quant`` spec when the
            unit can run it, else the unit's first accepted format.
        out_format: the unit's output format (default: the config's).
        scaling: ``"auto"`` (block scales if the unit has them, else one power-of-two scale per
            operand tensor, chosen by the OCP floor rule on the tensor's max, applied to the
            elements before encoding and undone exactly on the output), ``"block"`` or
            ``"tensor"`` (error if the unit cannot).
        quant: the model's quantizers, as for :func:`mxsim.capture.torch` (a mapping
            applied to every layer, or ``callable(layer_name, module)``).

    Yields the :class:`UnitInLoop` (``computed_layers``, ``skipped``). Runs under
    ``torch.no_grad()``; each replaced result is a new float32 tensor (no autograd history);
    the bias is added in float64 before that rounding.
    """
    torch = require("torch")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise MxsimError(f"torch_unit: model must be a torch.nn.Module or None, got {type(model).__name__}")
    recorder = UnitInLoop(torch, model, _unit(hw), quant, a_format, b_format, out_format, check_scaling(scaling))
    with intercepting(torch, model, recorder):
        yield recorder
