"""The golden vectors on real RTL: examples/rtl/mxdot_fp4.sv under Icarus Verilog, two flows.

1. SystemVerilog test bench reading the vector files with $readmemh (mxdot_tb.sv).
2. cocotb 2.x, comparing the DUT with the golden model called from Python (run_cocotb.py).

Expected outputs come from the independent Fraction model (test_golden_model), so a pass
proves the RTL and the model agree bit for bit; the broken variants (parameter BUG) must
fail. Without iverilog/cocotb these tests skip, or fail when the CI environment variable is set.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from mxsim.golden import GoldenUnit, generate
from test_golden_model import ocp_exact_expected_fn

RTL = REPO / "examples" / "rtl"
KINDS = ("random", "corners", "exhaustive")
BUGS = {
    1: "truncates instead of rounding",
    2: "rounding ignores the sticky bit",
    3: "drops the alignment sticky of the block term",
    4: "flushes subnormal results to zero",
    5: "exact zeros always +0",
    6: "overflow saturates to max finite",
    7: "subnormal elements read as zero",
}
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed$", re.MULTILINE)


def require(available: bool, what: str) -> None:
    """Skip without the tool; under CI (the CI environment variable set) fail instead."""
    if available:
        return
    message = f"{what} is not installed; the RTL proof of the golden vectors needs it"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set: install it, see docs/golden.md)")
    pytest.skip(message)


def require_icarus() -> None:
    require(
        shutil.which("iverilog") is not None and shutil.which("vvp") is not None,
        "Icarus Verilog (iverilog, vvp)",
    )


@pytest.fixture(scope="module")
def vectors(tmp_path_factory):
    """fp4 x fp4 vector files (K = k = 32) with expected bits from the Fraction model: kind -> (path, count)."""
    out = tmp_path_factory.mktemp("golden")
    unit = GoldenUnit("ocp-exact", "fraction-model", "fp4_e2m1", "fp4_e2m1")
    manifest = generate(
        unit, out, cases=1000, seed=2024, kinds=KINDS, expected_fn=ocp_exact_expected_fn(unit)
    )
    files = manifest["units"][0]["files"]
    return {kind: (out / files[kind]["vectors"], files[kind]["count"]) for kind in KINDS}


def compile_bench(bench: str, bug: int, out: Path) -> Path:
    """Compile examples/rtl's ``bench``.sv around mxdot_fp4.sv with parameter BUG; the .vvp path."""
    target = out / f"{bench}_bug{bug}.vvp"
    subprocess.run(
        [
            "iverilog",
            "-g2012",
            f"-P{bench}.BUG={bug}",
            "-o",
            str(target),
            str(RTL / "mxdot_fp4.sv"),
            str(RTL / f"{bench}.sv"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return target


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """Compile the test bench for a BUG value (cached): returns the .vvp path."""
    require_icarus()
    out = tmp_path_factory.mktemp("rtl")
    built = {}

    def compile_variant(bug: int):
        if bug not in built:
            built[bug] = compile_bench("mxdot_tb", bug, out)
        return built[bug]

    return compile_variant


def simulate(vvp_file, vector_file, count=None):
    """Run the test bench: (exit status, passed, failed, output)."""
    args = ["vvp", "-n", str(vvp_file), f"+vectors={vector_file}", "+show=5"]
    if count is not None:
        args.append(f"+count={count}")
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    match = SUMMARY.search(output)
    assert match, f"no summary line in the test bench output:\n{output}"
    return result.returncode, int(match.group(1)), int(match.group(2)), output


@pytest.mark.parametrize("kind", KINDS)
def test_correct_rtl_passes_every_vector(build, vectors, kind):
    path, count = vectors[kind]
    status, passed, failed, output = simulate(build(0), path, count)
    assert (status, passed, failed) == (0, count, 0), output


@pytest.mark.parametrize(
    "bug", sorted(BUGS), ids=[f"bug{b}-{BUGS[b].replace(' ', '-')}" for b in sorted(BUGS)]
)
def test_broken_rtl_is_caught_by_the_corner_vectors(build, vectors, bug):
    path, count = vectors["corners"]
    status, passed, failed, output = simulate(build(bug), path, count)
    assert failed > 0 and passed + failed == count, output
    assert status != 0 and "FATAL" in output.upper(), output  # $fatal: non-zero exit


def test_one_flipped_expected_bit_is_one_failure(build, vectors, tmp_path):
    path, count = vectors["corners"]
    lines = path.read_text().splitlines()
    first_data = next(i for i, line in enumerate(lines) if not line.startswith("//"))
    target = first_data + 100
    lines[target] = lines[target][:-1] + format(int(lines[target][-1], 16) ^ 1, "x")  # d's last bit
    changed = tmp_path / "flipped.hex"
    changed.write_text("\n".join(lines) + "\n")
    status, passed, failed, output = simulate(build(0), changed, count)
    assert (passed, failed) == (count - 1, 1) and status != 0
    assert "FAIL 100:" in output


def test_bench_refuses_an_empty_or_short_read(build, vectors, tmp_path):
    empty = tmp_path / "empty.hex"
    empty.write_text("// nothing\n")
    status, passed, failed, output = simulate(build(0), empty)
    assert status != 0 and passed == 0
    path, count = vectors["corners"]
    status, *_ = simulate(build(0), path, count + 1)  # fewer vectors than the manifest says
    assert status != 0


def test_cocotb_flow_good_and_broken(tmp_path):
    require_icarus()
    try:
        import cocotb  # noqa: F401
        import cocotb_tools.runner  # noqa: F401
    except ImportError:
        require(False, "cocotb 2.x (pip install cocotb)")
    script = RTL / "cocotb" / "run_cocotb.py"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    common = [
        "--cases",
        "200",
        "--expected",
        "test_golden_model:ocp_exact_expected_fn",
        "--python-path",
        str(REPO / "tests"),
        "--build-dir",
        str(tmp_path),
    ]
    good = subprocess.run(
        [sys.executable, str(script), "--bug", "0", *common],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert good.returncode == 0 and "cocotb: 2 passed, 0 failed" in good.stdout, (
        good.stdout[-3000:] + good.stderr[-3000:]
    )
    corners = re.search(r"corners: (\d+) passed, (\d+) failed", good.stdout + good.stderr)
    assert corners and int(corners.group(1)) > 1000 and corners.group(2) == "0"
    broken = subprocess.run(
        [sys.executable, str(script), "--bug", "3", *common],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    output = broken.stdout + broken.stderr
    assert broken.returncode == 1 and re.search(r"mxdot_cocotb\.corner_vectors\s+FAIL", output), (
        output[-3000:]
    )
    assert re.search(r"corners: \d+ passed, [1-9]\d* failed", output), output[
        -3000:
    ]  # failed on vectors, not on an error
