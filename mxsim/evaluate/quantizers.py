"""A model quantized by a library itself, for ``evaluate_hf(..., quantizer="quark:mxfp8_e4m3")``.

A quantizer name is ``LIBRARY:SPEC`` (:data:`QUANTIZERS`):

* ``quark:SPEC``: AMD Quark's torch ``ModelQuantizer`` (amd-quark 0.13) with one OCP MX spec for
  the weights and the input tensors of every layer Quark quantizes (``QuantLinear``, its
  quantized convolutions): ``QConfig(global_quant_config=QLayerConfig(weight=S,
  input_tensors=S))`` with ``S = OCP_MX...Spec(ch_axis=-1)`` (blocks of 32 along each layer's K,
  E8M0 scales, Quark's default scale rule ``even``), dynamic: no calibration data. The model
  stays float32.
* ``torchao:SPEC``: torchao's ``quantize_(model, MXDynamicActivationMXWeightConfig(...))``
  (torchao 0.18; blocks of 32, its default scale rule, its emulated kernels) on the model cast
  to bfloat16, as torchao requires: every ``nn.Linear`` gets an MX weight and dynamic MX
  activations.

Both quantize the model in place. The element format of every spec is an mxsim format (the
``element`` column): a unit in the loop must take it for both operands, with block scales.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings
from dataclasses import dataclass

from .._optional import require
from ..capture import torch_torchao
from ..datapath import HardwareConfig
from ..errors import ArgumentError, MxsimError
from .models import library_error


@dataclass(frozen=True)
class LibraryQuantizer:
    """One ``LIBRARY:SPEC``: the library's setting (a Quark spec class, a torch/torchao dtype)
    and the mxsim element format it quantizes both operands to, in blocks of ``block_size``."""

    name: str
    library: str
    setting: str
    element: str
    block_size: int = 32

    @property
    def title(self) -> str:
        return LIBRARIES[self.library][2]


#: library -> (module imported to quantize, its distribution, what it is called); both are in
#: the ``oracles`` extra.
LIBRARIES = {
    "quark": ("quark.torch", "amd-quark", "AMD Quark"),
    "torchao": ("torchao.prototype.mx_formats.inference_workflow", "torchao", "torchao"),
}
#: library -> spec -> (the library's setting, mxsim element format).
_SPECS = {
    "quark": {
        "mxfp8_e4m3": ("OCP_MXFP8E4M3Spec", "fp8_e4m3"),
        "mxfp8_e5m2": ("OCP_MXFP8E5M2Spec", "fp8_e5m2"),
        "mxfp6_e2m3": ("OCP_MXFP6E2M3Spec", "fp6_e2m3"),
        "mxfp6_e3m2": ("OCP_MXFP6E3M2Spec", "fp6_e3m2"),
        "mxfp4": ("OCP_MXFP4Spec", "fp4_e2m1"),
        "mxint8": ("OCP_MXINT8Spec", "int8"),
    },
    "torchao": {
        "mxfp8_e4m3": ("float8_e4m3fn", "fp8_e4m3"),
        "mxfp8_e5m2": ("float8_e5m2", "fp8_e5m2"),
        "mxfp4": ("float4_e2m1fn_x2", "fp4_e2m1"),
    },
}
QUANTIZERS = {
    f"{library}:{spec}": LibraryQuantizer(f"{library}:{spec}", library, setting, element)
    for library, specs in _SPECS.items()
    for spec, (setting, element) in specs.items()
}


def parse_quantizer(text) -> LibraryQuantizer:
    """The :class:`LibraryQuantizer` named ``LIBRARY:SPEC``; else one error naming the argument
    and the accepted names."""
    if not isinstance(text, str) or text.count(":") != 1:
        shown = str(text) if len(str(text)) <= 60 else f"{str(text)[:57]}..."
        raise ArgumentError(
            f"quantizer: expected LIBRARY:SPEC ({', '.join(LIBRARIES)}; e.g. quark:mxfp8_e4m3), "
            f"got {shown!r}"
        )
    library, spec = text.split(":")
    if library not in _SPECS:
        raise ArgumentError(
            f"quantizer: unknown library {library[:40]!r}; accepted: {', '.join(_SPECS)}"
        )
    if spec not in _SPECS[library]:
        raise ArgumentError(
            f"quantizer: {library} has no spec {spec[:40]!r}; accepted: "
            + ", ".join(f"{library}:{name}" for name in _SPECS[library])
        )
    return QUANTIZERS[text]


def check_units_take(quantizer: LibraryQuantizer, units: list[HardwareConfig]) -> None:
    """Every unit takes the quantizer's operands as the library quantized them: its element
    format for both operands, with block scales whose blocks fit the library's; else one error
    naming the unit."""
    fmt = quantizer.element
    for hw in units:
        block = hw.sections[("inputs", "block_size")]
        reasons = []
        if fmt not in hw.a_formats or fmt not in hw.b_formats:
            takes = sorted(set(hw.a_formats) & set(hw.b_formats), key=hw.a_formats.index)
            reasons.append(f"takes {', '.join(takes)} for both operands, not {fmt}")
        if hw.sections[("inputs", "scales")] == "none":
            reasons.append("has no block scales")
        elif not block or quantizer.block_size % block:
            reasons.append(f"has blocks of {block}")
        if reasons:
            raise ArgumentError(
                f"unit {hw.name} cannot take {quantizer.name}'s operands ({fmt} in blocks of "
                f"{quantizer.block_size} with E8M0 scales): it {' and '.join(reasons)}; use a unit "
                f"with block scales that takes {fmt} (e.g. hwconfigs/ocp-exact.yaml)"
            )


def import_library(quantizer: LibraryQuantizer):
    """The library's module, imported (Quark's quantizers uncompiled: ``QUARK_DISABLE_COMPILE``
    set unless the caller set it, since compiling them costs minutes per spec); one error
    naming the quantizer and what to install when it is missing."""
    module, distribution, title = LIBRARIES[quantizer.library]
    if quantizer.library == "quark" and "quark" not in sys.modules:
        os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
    try:
        with _silenced():
            __import__(module)
    except ImportError as error:
        raise MxsimError(
            f"quantizer {quantizer.name}: {title} is not installed ({error}); install it with: "
            f"pip install 'mxsim[oracles]' (or pip install {distribution})"
        ) from None
    return sys.modules[module]


@contextlib.contextmanager
def _silenced():
    """A library's chatter (its log lines, banners and progress bars on stdout and stderr)
    kept off mxsim's output while it imports or quantizes; its warnings too."""
    import logging

    saved = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(saved)


def quantize_model(quantizer: LibraryQuantizer, model, where: str):
    """``model`` quantized in place by the library (see the module docstring) and returned
    with the number of layers it quantized. Whatever the library raises, or a model in which
    it quantized no layer, is one :class:`MxsimError` naming ``where`` and the quantizer."""
    torch = require("torch")
    library = import_library(quantizer)
    try:
        with _silenced():
            if quantizer.library == "quark":
                model = _quark(library, quantizer, model)
            else:
                model = _torchao(torch, quantizer, model)
    except MxsimError:
        raise
    except Exception as error:  # the library refusing the model: a bad input, not a crash
        raise MxsimError(
            f"{where}: {quantizer.title} cannot quantize the model with "
            f"{quantizer.name}: {library_error(error)}"
        ) from None
    layers = quantized_layers(quantizer, model)
    if not layers:
        raise MxsimError(
            f"{where}: {quantizer.title} quantized no layer of the model with "
            f"{quantizer.name} (it quantizes nn.Linear layers"
            + (" and convolutions)" if quantizer.library == "quark" else ")")
        )
    return model, layers


def _quark(library, quantizer: LibraryQuantizer, model):
    from quark.torch.quantization.config import config

    spec = getattr(config, quantizer.setting)(ch_axis=-1).to_quantization_spec()
    layer = config.QLayerConfig(weight=spec, input_tensors=spec)
    return library.ModelQuantizer(config.QConfig(global_quant_config=layer)).quantize_model(
        model, None
    )


def _torchao(torch, quantizer: LibraryQuantizer, model):
    from torchao.prototype.mx_formats import inference_workflow
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    dtype = getattr(torch, quantizer.setting)
    model = model.to(torch.bfloat16)
    quantize_(
        model,
        inference_workflow.MXDynamicActivationMXWeightConfig(
            activation_dtype=dtype, weight_dtype=dtype, kernel_preference=KernelPreference.EMULATED
        ),
    )
    return model


def quantized_layers(quantizer: LibraryQuantizer, model) -> int:
    """How many layers of ``model`` the library quantized (Quark: modules holding a
    ``_weight_quantizer``; torchao: weights that are its tensor subclass)."""
    if quantizer.library == "quark":
        return sum(hasattr(m, "_weight_quantizer") for m in model.modules())
    return sum(torch_torchao.is_torchao_tensor(getattr(m, "weight", None)) for m in model.modules())


def library_version(quantizer: LibraryQuantizer) -> str:
    """``distribution version`` of the library that quantized."""
    from importlib import metadata

    distribution = LIBRARIES[quantizer.library][1]
    try:
        return f"{distribution} {metadata.version(distribution)}"
    except metadata.PackageNotFoundError:
        return distribution
