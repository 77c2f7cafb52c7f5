"""mxsim: a bit-accurate emulator of MX (OCP Microscaling) accelerator datapaths."""

__version__ = "0.1.0"
