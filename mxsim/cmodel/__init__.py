"""C reference models of dot-product units: ``mxsim export c`` (docs/cmodel.md)."""

from .export import export_c, generate

__all__ = ["export_c", "generate"]
