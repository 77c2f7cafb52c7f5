"""One unit under several rounding modes, one box per mode: a base config and a view per mode.

Each box is probed on its own (:func:`~mxsim.probe.core.probe`). A search decides every key
under its box's rounding, so the boxes' configs may differ beyond the rounding keys where
values alike under one mode are not under another (an E4M3 grid of 33 or 34 fraction bits:
alike to nearest, not toward zero). The base is the config of one mode's box; each mode's view
is the base with that mode's rounding keys (:data:`~mxsim.probe.core.ROUNDING_KEYS`) when
the result misses none of its box's answers in the run (every probe's rows and every
validation's), else with every key where its own config differs. So each view misses none of
its box's answers its own config misses none of. The base is the mode whose config leaves the
fewest keys in the views (the first listed of those).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..datapath.schema import SCHEMA
from .core import ROUNDING_KEYS, ProbeResult, held_value, probe


@dataclass
class ModesResult:
    """The result per mode, the mode whose config is the base, and each mode's view: the keys
    (path -> value) it holds over the base."""

    results: dict[str, ProbeResult]
    base: str
    views: dict[str, dict]

    @property
    def exact(self) -> bool:
        return all(result.exact for result in self.results.values())

    def report(self) -> dict:
        return {
            "base": self.base,
            "views": self.views,
            "exact": self.exact,
            "modes": {mode: result.report() for mode, result in self.results.items()},
        }

    def view_yaml(self, mode: str, base_file: str, name: str) -> str:
        """Mode ``mode``'s view as a config that ``extends`` the base written as ``base_file``
        (a path relative to the view's file)."""
        result = self.results[mode]
        lines = [
            f"# The view of mode {mode} over the base (mode {self.base}): {result.queries} dot products "
            f"asked of its box; its own probe: {result.validation.mismatches} mismatches in "
            f"{result.validation.vectors} validation vectors.",
            (
                "# Only the rounding differs from the base: it misses none of its box's answers in its run."
                if set(self.views[mode]) <= set(ROUNDING_KEYS)
                else "# Keys beyond the rounding differ from the base: with the rounding alone it missed answers of its box."
            ),
            "mxsim_hwconfig: 1",
            f"extends: {json.dumps(base_file)}",
            f"name: {json.dumps(name)}",
            f"description: {json.dumps(f'probed under mode {mode}: the base with the keys below')}",
        ]
        sections: dict = {}
        for path, value in self.views[mode].items():
            section, key = path.split(".")
            sections.setdefault(section, []).append(f"  {key}: {json.dumps(value)}")
        for section in SCHEMA:
            if section in sections:
                lines += [f"{section}:", *sections[section]]
        return "\n".join(lines) + "\n"


def _paths(config: dict) -> list[str]:
    """The key paths a probed config holds (formats and block size given by the caller)."""
    return [
        f"{section}.{key}"
        for section, body in config.items()
        if isinstance(body, dict)
        for key in body
        if f"{section}.{key}" not in ("inputs.a_formats", "inputs.b_formats", "output.format")
    ]


def probe_modes(
    units: dict, a_format: str, b_format: str, k: int, *, progress=None, **options
) -> ModesResult:
    """Probe each of ``units`` (mode name -> unit: the same hardware under another rounding
    mode) with :func:`~mxsim.probe.core.probe` and the same ``options``; then choose the base
    and the views (module docstring)."""
    results = {}
    for mode, unit in units.items():
        said = None if progress is None else (lambda line, mode=mode: progress(f"[{mode}] {line}"))
        results[mode] = probe(unit, a_format, b_format, k, progress=said, **options)
    best = None
    for base in results:
        base_config = results[base].config
        views = {}
        for mode, result in results.items():
            own = result.config
            differing = {
                path: held_value(own, path)
                for path in _paths(own)
                if held_value(own, path) != held_value(base_config, path)
            }
            rounding = {path: value for path, value in differing.items() if path in ROUNDING_KEYS}
            trial = {
                section: dict(body) if isinstance(body, dict) else body
                for section, body in base_config.items()
            }
            for path, value in rounding.items():
                section, key = path.split(".")
                trial.setdefault(section, {})[key] = value
            views[mode] = (
                rounding
                if len(rounding) == len(differing) or result.misses(trial) == 0
                else differing
            )
        if best is None or sum(map(len, views.values())) < sum(map(len, best[1].values())):
            best = (base, views)
    return ModesResult(results, *best)
