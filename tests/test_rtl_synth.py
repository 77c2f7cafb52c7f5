"""Yosys on generated units: cells, transistors and depth come out of a real synthesis, cached per
design. CI synthesizes one 1-element unit, flat and module by module; ``MXSIM_RTL_LONG`` adds a
window comparison and a damaged cache entry (each synthesis takes minutes on a loaded 2-core
machine)."""

from __future__ import annotations

import pytest

import os

from mxsim.datapath import parse_hwconfig
from mxsim.rtl import generate_unit
from mxsim.rtl.synth import NETLIST, design_key, have_yosys, run_yosys, script, synthesize
from test_golden_rtl import require


LONG = pytest.mark.skipif(
    not os.environ.get("MXSIM_RTL_LONG"), reason="MXSIM_RTL_LONG=1 (docs/rtl.md)"
)


def small_unit(window: int, k: int = 1):
    """A k-element FP4 unit (one block, E8M0 scales) with c in a window of ``window`` bits."""
    config = parse_hwconfig(
        {
            "mxsim_hwconfig": 1,
            "name": f"small-w{window}",
            "inputs": {"a_formats": ["fp4_e2m1"], "b_formats": ["fp4_e2m1"], "block_size": k},
            "adder": {"fused_terms": k, "accumulator_in_tree": True, "align_fraction_bits": window},
            "accumulator": {"rounding": "toward_zero"},
            "output": {"rounding": "toward_zero"},
        },
        "<small>",
    )
    return generate_unit(config, "fp4_e2m1", "fp4_e2m1", k)


def test_area_and_depth_from_yosys(tmp_path, monkeypatch):
    require(have_yosys(), "Yosys")
    monkeypatch.setenv("MXSIM_SYNTH_CACHE", str(tmp_path))
    unit = small_unit(4)
    first = synthesize(unit)
    assert (
        first.cells > 100
        and first.transistors > 2 * first.cells
        and first.depth > 10
        and not first.cached
    )
    again = synthesize(unit)
    assert again.cached and (again.cells, again.transistors, again.depth) == (
        first.cells,
        first.transistors,
        first.depth,
    )
    assert (tmp_path / f"{design_key(unit)}.json").is_file()
    # the depth of the written netlist is ltp's on the same netlist
    assert run_yosys(unit, script(unit) + f"write_blif -icells {NETLIST}\n").depth == first.depth
    # module by module, then flattened: its own cache entry, a depth, and no fewer gates or
    # levels than the flat flow (nothing is optimised across module boundaries)
    modular = synthesize(unit, hierarchical=True)
    assert design_key(unit, hierarchical=True) != design_key(unit)
    assert (tmp_path / f"{design_key(unit, hierarchical=True)}.json").is_file()
    assert modular.cells >= first.cells and modular.transistors >= first.transistors
    assert first.depth <= modular.depth and not modular.cached


@LONG
def test_a_wider_window_costs_more(tmp_path, monkeypatch):
    require(have_yosys(), "Yosys")
    monkeypatch.setenv("MXSIM_SYNTH_CACHE", str(tmp_path))
    narrow, wide = synthesize(small_unit(8, 2)), synthesize(small_unit(24, 2))
    assert wide.cells > narrow.cells and wide.transistors > narrow.transistors


@LONG
def test_a_damaged_cache_entry_is_recomputed(tmp_path, monkeypatch):
    require(have_yosys(), "Yosys")
    monkeypatch.setenv("MXSIM_SYNTH_CACHE", str(tmp_path))
    unit = small_unit(4)
    (tmp_path / f"{design_key(unit)}.json").write_text("{not json")
    result = synthesize(unit)
    assert not result.cached and result.cells > 0


def test_yosys_reads_a_tree_of_one_product(tmp_path):
    """A tree of one product (an FMA chain) negates its sized significand; Yosys reads the
    unit (it once took ``-49'(x)`` for a cast to size -49)."""
    import subprocess

    from pathlib import Path

    from mxsim.datapath import load_hwconfig
    from mxsim.datapath.config import vary_hwconfig

    require(have_yosys(), "Yosys")
    mi100 = Path(__file__).resolve().parent.parent / "hwconfigs" / "mi100.yaml"
    hw = vary_hwconfig(load_hwconfig(mi100), {"inputs.block_size": 1}, "mi100-k1")
    unit = generate_unit(hw, "fp32", "fp32", 1)
    for name, source in unit.files.items():
        (tmp_path / name).write_text(source)
    done = subprocess.run(
        [
            "yosys",
            "-q",
            "-p",
            f"read_verilog -sv {' '.join(unit.files)}; hierarchy -top {unit.name}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-500:]


def test_blif_depth_counts_gate_levels_as_ltp_does():
    """Inputs and constants are level 0, each gate one more than its deepest input; buffers
    and connections are wires; a cover of several inputs or a loop is an error."""
    from mxsim.errors import MxsimError
    from mxsim.rtl.synth import blif_depth

    netlist = """.model top
.inputs a b c
.outputs y z
.names $false
.subckt $_NAND_ A=a B=b Y=n1
.subckt $_NOT_ A=n1 Y=n2
.names n2 n3
1 1
.subckt $_NOR_ A=n3 \\
 B=c Y=n4
.conn n4 y
.subckt $_NAND_ A=c B=$false Y=z
.end
"""
    assert blif_depth(netlist) == 3  # a -> NAND -> NOT -> (buffer) -> NOR
    assert blif_depth(".model t\n.inputs a\n.outputs a\n.end\n") == 0
    with pytest.raises(MxsimError, match="more than one input"):
        blif_depth(".names a b y\n11 1\n")
    with pytest.raises(MxsimError, match="loop"):
        blif_depth(".subckt $_NOT_ A=x Y=y\n.subckt $_NOT_ A=y Y=x\n")
