"""mxsim: a bit-accurate emulator of MX (OCP Microscaling) accelerator datapaths.

``import mxsim`` is cheap: it loads no Numba kernel. The names below are imported on first
use, and the kernels they call are compiled (first run) or loaded from the per-user cache
when first called (see :mod:`mxsim._compile`).
"""

from ._compile import configure_cache

__version__ = "0.1.0"

configure_cache()  # before any kernel module is imported

# Public name -> the subpackage it comes from. ``mxsim.quantize`` is the subpackage; its
# ``quantize`` function is ``mxsim.quantize_mx`` here, beside ``quantize_bfp``.
_EXPORTS = {
    "HardwareConfig": "datapath",
    "as_float": "datapath",
    "dot": "datapath",
    "explain": "datapath",
    "load_hwconfig": "datapath",
    "matmul": "datapath",
    "matmul_batched": "datapath",
    "FORMATS": "formats",
    "FormatInfo": "formats",
    "custom_format": "formats",
    "get_format": "formats",
    "BFP_SPECS": "quantize",
    "PROFILES": "quantize",
    "BFPSpec": "quantize",
    "BFPTensor": "quantize",
    "MXTensor": "quantize",
    "NVFP4Tensor": "quantize",
    "QuantOptions": "quantize",
    "fake_quantize": "quantize",
    "quantize_bfp": "quantize",
    "quantize_mx": "quantize",
    "quantize_nvfp4": "quantize",
}
_RENAMED = {"quantize_mx": "quantize"}

__all__ = sorted(_EXPORTS)


_SUBPACKAGES = (
    "capture",
    "cycles",
    "datapath",
    "errors",
    "formats",
    "golden",
    "inloop",
    "probe",
    "quantize",
    "replay",
    "trace",
)


def __getattr__(name: str):
    import importlib

    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)  # the import sets the attribute
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mxsim' has no attribute {name!r}")
    module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
    value = getattr(module, _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBPACKAGES))
