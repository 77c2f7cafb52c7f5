"""The exported C model as a live scoreboard: examples/rtl/dpi/mxdot_dpi_tb.sv under Verilator
drives mxdot_fp4.sv with constrained-random stimulus and checks every result against the model
over DPI-C. The good unit must pass and every broken variant (parameter BUG) must be caught.
Without verilator the test skips, or fails when the CI environment variable is set."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from test_golden_rtl import BUGS

RTL = REPO / "examples" / "rtl"


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """The test bench built once (every variant in it): its executable."""
    if shutil.which("verilator") is None:
        message = "verilator is not installed; the DPI-C bench of the C model needs it"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI is set: install it, see docs/cmodel.md)")
        pytest.skip(message)
    build = tmp_path_factory.mktemp("dpi")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run(
        ["make", "-C", str(RTL), "dpi-build", f"BUILD={build}", f"PYTHON={sys.executable}"],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    return build / "dpi_obj" / "mxdot_dpi_tb"


def run_bench(bench, bug: int, count: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bench), f"+bug={bug}", f"+count={count}", "+verilator+seed+7"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_good_unit_passes(bench):
    done = run_bench(bench, 0, 5000)
    assert done.returncode == 0 and "BUG=0: 5000 passed, 0 failed" in done.stdout, (
        done.stdout + done.stderr
    )


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_broken_variant_is_caught_with_its_stages(bench, bug):
    done = run_bench(bench, bug, 5000)
    assert done.returncode != 0, f"BUG={bug} ({BUGS[bug]}) passed the scoreboard"
    match = re.search(
        r"MISMATCH \(BUG=(\d+)\) \d+: .*: unit ([0-9a-f]{8}), C model ([0-9a-f]{8})", done.stdout
    )
    assert match and int(match.group(1)) == bug and match.group(2) != match.group(3), done.stdout
    assert (
        "tree 0:" in done.stdout and "accumulator after it" in done.stdout
    )  # the model's stage values
