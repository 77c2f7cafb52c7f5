"""The probes' input families, one module per kind, each a mixin on
:class:`mxsim.probe.draw.Drawing`; :class:`mxsim.probe.inputs.Context` holds them all."""
