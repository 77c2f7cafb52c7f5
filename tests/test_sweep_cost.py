"""The hardware-cost proxy, against values worked out by hand from its definition (docs/sweep.md)."""

from __future__ import annotations

from conftest import REPO
from mxsim.datapath import load_hwconfig
from mxsim.datapath.config import vary_hwconfig
from mxsim.sweep import hardware_cost

H100 = load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml")


def test_h100_fp8():
    # fp8_e4m3: max 448 = 1.75 * 2^8, min subnormal 2^-9 -> products span (8+8+2) - (-9-9) = 36 bits.
    # 13-bit window, truncate: 15 bits; 32 terms + the accumulator in the tree: 1 + 15 + ceil(log2 33) = 22.
    assert hardware_cost(H100) == {
        "product_range_bits": 36,
        "window_bits": 15,
        "adder_width_bits": 22,
        "tree_bits": 32 * 22,
        "accumulator_bits": 32,
        "cost_bits": 32 * 22 + 32,
    }


def test_exact_tree_and_kulisch_accumulator():
    # kulisch: exact 36-bit window, 1 + 36 + 6 = 43-bit adder; accumulator 36 + 508 + 32 = 576.
    cost = hardware_cost(load_hwconfig(REPO / "hwconfigs" / "kulisch.yaml"))
    assert (cost["window_bits"], cost["adder_width_bits"], cost["accumulator_bits"]) == (
        36,
        43,
        576,
    )
    assert cost["cost_bits"] == 32 * 43 + 576


def test_carry_bits_sticky_promotion_and_narrow_accumulator():
    config = vary_hwconfig(
        H100,
        {
            "adder.carry_bits": 3,
            "adder.below_window": "sticky",
            "adder.fused_terms": 16,
            "accumulator.format": "bf16",
        },
        name="x",
    )
    # carry_bits: the register is 1 + (13 + 2) + 3 + 1 (sticky) = 20 bits; window 13 + 2 + 1 = 16.
    cost = hardware_cost(config)
    assert (cost["window_bits"], cost["adder_width_bits"], cost["accumulator_bits"]) == (16, 20, 16)
    assert cost["tree_bits"] == 16 * 20
    promoted = hardware_cost(load_hwconfig(REPO / "hwconfigs" / "h100-fp8-promoted.yaml"))
    assert promoted["accumulator_bits"] == 32 + 32


def test_narrower_window_costs_less():
    costs = [
        hardware_cost(vary_hwconfig(H100, {"adder.align_fraction_bits": f}, name="x"))["cost_bits"]
        for f in (8, 13, 20)
    ]
    assert costs == [32 * (22 - 5) + 32, 32 * 22 + 32, 32 * (22 + 7) + 32]
