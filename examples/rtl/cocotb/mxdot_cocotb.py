"""cocotb 2.x tests of mxdot_fp4: the DUT against mxsim's golden model, called from Python.

No vector files: each test makes the inputs with mxsim.golden's case generators (random and
corners for fp4_e2m1 x fp4_e2m1, K = k = 32), asks the expected function for the output bits
and compares them with the DUT's, bit for bit. The DUT takes fp4 codes only: a config
without the fp4_e2m1 x fp4_e2m1 pair (an fp64 unit among them) is refused, naming the pairs
it accepts. Run through run_cocotb.py. Environment:

    MXSIM_GOLDEN_EXPECTED  "module:factory": factory(unit) returns the expected function
                           (default: mxsim.dot on MXSIM_HWCONFIG)
    MXSIM_HWCONFIG         hardware config YAML (default: hwconfigs/ocp-exact.yaml, read only
                           when no MXSIM_GOLDEN_EXPECTED is given)
    MXSIM_GOLDEN_CASES     random vectors (default 500)
    MXSIM_GOLDEN_SEED      seed (default 1)
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import cocotb
from cocotb.triggers import Timer

from mxsim.golden import GoldenUnit, dot_expected_fn, fill_expected, make_cases, units_from_hwconfig

PAIR = ("fp4_e2m1", "fp4_e2m1")
REPO = Path(__file__).resolve().parents[3]


def golden_unit_and_expected():
    """The unit the DUT implements and its expected function (see the module docstring)."""
    spec = os.environ.get("MXSIM_GOLDEN_EXPECTED")
    config = os.environ.get("MXSIM_HWCONFIG") or (
        "" if spec else str(REPO / "hwconfigs" / "ocp-exact.yaml")
    )
    hw = None
    if config and Path(config).is_file():
        from mxsim.datapath import load_hwconfig

        hw = load_hwconfig(config)
        unit = units_from_hwconfig(hw, pairs=[PAIR])[0]
    else:
        unit = GoldenUnit("ocp-exact", "none", *PAIR)
    if spec:
        module, _, name = spec.partition(":")
        return unit, getattr(importlib.import_module(module), name)(unit)
    if hw is None:
        raise RuntimeError(
            f"no hardware config at {config}: set MXSIM_HWCONFIG or MXSIM_GOLDEN_EXPECTED"
        )
    return unit, dot_expected_fn(hw, unit)


def pack(codes, bits: int) -> int:
    """Element i at bits [bits*i +: bits]."""
    return sum(int(code) << (bits * i) for i, code in enumerate(codes))


async def check_kind(dut, kind: str) -> None:
    unit, expected_fn = golden_unit_and_expected()
    cases = int(os.environ.get("MXSIM_GOLDEN_CASES", "500"))
    seed = int(os.environ.get("MXSIM_GOLDEN_SEED", "1"))
    vectors = fill_expected(make_cases(unit, kind, cases, seed), expected_fn)
    failed = 0
    for i in range(len(vectors)):
        dut.a.value = pack(vectors.a[i], 4)
        dut.b.value = pack(vectors.b[i], 4)
        dut.scale_a.value = int(vectors.scale_a[i, 0])
        dut.scale_b.value = int(vectors.scale_b[i, 0])
        dut.c.value = int(vectors.c[i])
        await Timer(1, unit="ns")
        got, want = dut.d.value.to_unsigned(), int(vectors.d[i])
        if got != want:
            failed += 1
            if failed <= 10:
                dut._log.error(
                    "%s %d (%s): c=%08x got %08x, expected %08x",
                    kind,
                    i,
                    vectors.labels[i],
                    int(vectors.c[i]),
                    got,
                    want,
                )
    dut._log.info("%s: %d passed, %d failed", kind, len(vectors) - failed, failed)
    assert failed == 0, f"{kind}: {failed} of {len(vectors)} vectors differ from the golden model"


@cocotb.test()
async def random_vectors(dut):
    """Random vectors (mxsim.golden random distributions)."""
    await check_kind(dut, "random")


@cocotb.test()
async def corner_vectors(dut):
    """Every corner case of mxsim.golden for the unit."""
    await check_kind(dut, "corners")
