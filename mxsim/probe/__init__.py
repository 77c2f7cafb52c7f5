"""``mxsim probe``: characterise an unknown dot-product unit from outside and emit its hwconfig.

A consumer of :mod:`mxsim.datapath` (its public ``dot`` and ``parse_hwconfig`` only): the
probe predicts each candidate datapath choice with mxsim and asks the unit where candidates
disagree. See docs/probe.md.
"""

from .core import DEFAULT_BUDGET, Decision, ProbeResult, Validation, probe
from .units import CountingUnit, HwconfigUnit, ProbeError, SubprocessUnit, load_callable

__all__ = [
    "DEFAULT_BUDGET",
    "CountingUnit",
    "Decision",
    "HwconfigUnit",
    "ProbeError",
    "ProbeResult",
    "SubprocessUnit",
    "Validation",
    "load_callable",
    "probe",
]
