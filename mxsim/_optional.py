"""Importing optional dependencies with an error that says which extra to install."""

from __future__ import annotations

import importlib

from .errors import MxsimError

EXTRAS = {
    "torch": "torch",
    "onnx": "onnx",
    "onnxruntime": "onnx",
    "matplotlib": "plots",
    "transformers": "models",
    "PIL": "examples",
    "quark": "oracles",
}


def require(module: str):
    """Import ``module`` or raise MxsimError naming the ``mxsim[...]`` extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        extra = EXTRAS.get(module.split(".")[0], module)
        raise MxsimError(
            f"{module} is not installed ({error}); install it with: pip install 'mxsim[{extra}]'"
        ) from None
