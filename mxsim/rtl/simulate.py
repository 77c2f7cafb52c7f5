"""Run a generated unit on golden-vector files under Icarus Verilog or Verilator.

The test bench reads a ``mxsim golden`` vector file (docs/golden.md: one word per line,
fields a, b, [scale_a, scale_b,] c, d, most significant first, each padded to whole hex
digits), drives the unit's ports with each vector's inputs and compares every output bit
with ``d``. It prints ``N passed, M failed`` and the first failing vectors.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import MxsimError
from .generate import RtlUnit

SIMULATORS = ("iverilog", "verilator")
_RESULT = re.compile(r"^(\d+) passed, (\d+) failed$", re.MULTILINE)


@dataclass(frozen=True)
class SimResult:
    """One vector file's outcome: counts and the first failures' lines."""

    passed: int
    failed: int
    failures: tuple[str, ...]


def vector_fields(unit: RtlUnit) -> list[tuple[str, int, int]]:
    """(port, lsb in the word, bits) of every data port, as the golden vectors lay them out."""
    data = [(name, width) for name, direction, width, _ in unit.ports if name != "clk"]
    lsb = sum(-(-width // 4) * 4 for _, width in data)
    fields = []
    for name, width in data:
        lsb -= -(-width // 4) * 4
        fields.append((name, lsb, width))
    return fields


def testbench(unit: RtlUnit, max_vectors: int = 1 << 20) -> str:
    """The test bench module ``tb`` for ``unit`` (plusargs: +vectors=FILE, +count=N, +show=N)."""
    fields = vector_fields(unit)
    word = sum(-(-bits // 4) * 4 for _, _, bits in fields)
    declare = "\n".join(
        f"  logic [{bits - 1}:0] {name};" for name, _, bits in fields if name != "d"
    )
    slices = "\n".join(
        f"        {name} = word[{lsb} +: {bits}];" for name, lsb, bits in fields if name != "d"
    )
    d_lsb, d_bits = next((lsb, bits) for name, lsb, bits in fields if name == "d")
    ports = ", ".join(f".{name}({name})" for name, _, _ in fields)
    clock = ""
    if unit.pipeline:
        ports = ".clk(clk), " + ports
        clock = "  logic clk = 1'b0;\n"
    settle = (
        "".join("        #1 clk = 1'b1; #1 clk = 1'b0;\n" for _ in range(unit.pipeline))
        or "        #1;\n"
    )
    return f"""// tb: golden vectors through {unit.name}, every output bit compared.
`timescale 1ns / 1ps
module tb;
  logic [{word - 1}:0] mem [0:{max_vectors - 1}];
  logic [{word - 1}:0] word;
{declare}
  logic [{d_bits - 1}:0] d, expected;
{clock}  {unit.name} dut ({ports});
  string path;
  int show, passed, failed, index, count;
  initial begin
    if (!$value$plusargs("vectors=%s", path)) $fatal(1, "tb: give +vectors=FILE");
    if (!$value$plusargs("show=%d", show)) show = 5;
    // +count=N: the file's vector count (needed by 2-state simulators, which cannot tell an
    // unread word by its X bits); without it the bench stops at the first unread word.
    if (!$value$plusargs("count=%d", count)) count = -1;
    $readmemh(path, mem);
    passed = 0; failed = 0; index = 0;
    while (index < {max_vectors} && (count >= 0 ? index < count : ^mem[index] !== 1'bx)) begin
        word = mem[index];
{slices}
        expected = word[{d_lsb} +: {d_bits}];
{settle}        if (d === expected) passed = passed + 1;
        else begin
          failed = failed + 1;
          if (failed <= show) $display("FAIL %0d: word %h: got %h, expected %h", index, word, d, expected);
        end
        index = index + 1;
    end
    $display("%0d passed, %0d failed", passed, failed);
    $finish;
  end
endmodule
"""


def probe_testbench(unit: RtlUnit) -> str:
    """The module ``probe_tb``: ``unit`` speaking mxsim probe's line protocol (docs/probe.md) on
    stdin/stdout, one answer per request line (``A B SA SB C`` in hex; ``A B C`` without scales)."""
    if unit.pipeline:
        raise MxsimError("rtl: the probe test bench drives a combinational unit (pipeline 0)")
    inputs = [(name, width) for name, direction, width, _ in unit.ports if direction == "input"]
    declare = "\n".join(f"  logic [{width - 1}:0] {name};" for name, width in inputs)
    d_bits = next(width for name, _, width, _ in unit.ports if name == "d")
    names = [name for name, _ in inputs]
    ports = ", ".join(f".{name}({name})" for name in names + ["d"])
    return f"""// probe_tb: {unit.name} answering mxsim probe's line protocol (docs/probe.md).
`timescale 1ns / 1ps
module probe_tb;
  localparam int STDIN = 32'h8000_0000;
{declare}
  logic [{d_bits - 1}:0] d;
  int fields;
  {unit.name} dut ({ports});
  initial begin
    forever begin
      fields = $fscanf(STDIN, "{" ".join(["%h"] * len(names))}", {", ".join(names)});
      if (fields != {len(names)}) $finish;
      #1;
      $display("%h", d);
      $fflush();
    end
  end
endmodule
"""


def have(simulator: str) -> bool:
    """Whether the simulator's programs are on PATH."""
    programs = {"iverilog": ("iverilog", "vvp"), "verilator": ("verilator",)}[simulator]
    return all(shutil.which(p) for p in programs)


def simulate(
    unit: RtlUnit, vector_files, simulator: str = "iverilog", work_dir=None, timeout: float = 1800
) -> dict[str, SimResult]:
    """Compile ``unit`` with its test bench once and run every vector file; {file name: result}."""
    if simulator not in SIMULATORS:
        raise MxsimError(
            f"rtl: simulator must be one of {', '.join(SIMULATORS)}, got {simulator!r}"
        )
    if not have(simulator):
        raise MxsimError(f"rtl: {simulator} is not installed (apt-get install {simulator})")
    with tempfile.TemporaryDirectory(prefix="mxsim-rtl-", dir=work_dir) as tmp:
        root = Path(tmp)
        sources = []
        for name, text in unit.files.items():
            (root / name).write_text(text, encoding="utf-8")
            sources.append(str(root / name))
        counts = {}
        for path in vector_files:
            lines = Path(path).read_text(encoding="ascii").splitlines()
            counts[path] = sum(1 for line in lines if line.strip() and not line.startswith("//"))
        (root / "tb.sv").write_text(
            testbench(unit, max(max(counts.values(), default=1), 1)), encoding="utf-8"
        )
        sources.append(str(root / "tb.sv"))
        if simulator == "iverilog":
            _run(["iverilog", "-g2012", "-o", str(root / "tb.vvp"), *sources], root, timeout)
            command = ["vvp", "-n", str(root / "tb.vvp")]
        else:
            # -O0: the C++ compile dominates a run of a few thousand vectors
            _run(
                [
                    "verilator",
                    "--binary",
                    "-j",
                    "1",
                    "-CFLAGS",
                    "-O0",
                    "-Wno-fatal",
                    "-Wno-lint",
                    "-Wno-style",
                    "--top-module",
                    "tb",
                    "-Mdir",
                    str(root / "obj"),
                    "-o",
                    "tb",
                    *sources,
                ],
                root,
                timeout,
            )
            command = [str(root / "obj" / "tb")]
        results = {}
        for path in vector_files:
            output = _run(
                command + [f"+vectors={Path(path).resolve()}", f"+count={counts[path]}"],
                root,
                timeout,
            )
            match = _RESULT.search(output)
            if match is None:
                raise MxsimError(
                    f"rtl: {simulator} printed no result for {path}:\n{output[-2000:]}"
                )
            failures = tuple(line for line in output.splitlines() if line.startswith("FAIL"))
            results[Path(path).name] = SimResult(int(match.group(1)), int(match.group(2)), failures)
        return results


def _run(command: list[str], cwd: Path, timeout: float) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise MxsimError(
            f"rtl: {command[0]} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
        )
    return done.stdout + done.stderr
