"""Black-box units the probe queries: an mxsim config, a Python callable, a subprocess.

A *unit* is any callable ``unit(a, b, scale_a, scale_b, c) -> bits`` computing n dot products
of length K at once:

- ``a``, ``b``: (n, K) ``uint64`` arrays of stored element codes (tf32 as fp32 bit patterns);
- ``scale_a``, ``scale_b``: (n, ceil(K / block_size)) ``uint8`` arrays of scale codes: E8M0
  (127 = 1, 0xFF = NaN), or UE4M3 (7 bits, 0x38 = 1, 0x7F = NaN) once the probe has found the
  unit reads UE4M3 (before that it sends codes both read as finite); a unit that takes no
  scales ignores them;
- ``c``: (n,) ``uint32`` fp32 bit patterns of the accumulator input (values of the probe's
  ``c_format``); for an fp64 ``c_format``, ``uint64`` fp64 bit patterns;
- the result: n output bit patterns of the output format (fp64: 64 bits, fp32: 32,
  fp16/bf16: 16).

:class:`CountingUnit` wraps any of them for the probe: it checks every answer (shape, integer,
in range), counts queries and time, and turns whatever the unit raises into one
:class:`ProbeError` line. The subprocess adapter speaks the line protocol of docs/probe.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import selectors
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..errors import ArgumentError, MxsimError
from ..formats import get_format


class ProbeError(MxsimError):
    """The unit under probe failed: it raised, died, hung, or answered something unreadable."""


def _one_line(text) -> str:
    return " ".join(str(text).split())


# ----------------------------------------------------------------------------- adapters


class HwconfigUnit:
    """An mxsim hardware config as a black box: ``mxsim.dot`` on one (A, B, output) format path."""

    def __init__(self, hw, a_format: str, b_format: str, out_format: str | None = None, c_format: str | None = None):
        from ..datapath import load_hwconfig
        from ..datapath.config import HardwareConfig

        self.config = hw if isinstance(hw, HardwareConfig) else load_hwconfig(hw)
        self.params = self.config.params(a_format, b_format, out_format, c_format)  # checks the pair
        self.a_format, self.b_format, self.out_format = self.params.a_format, self.params.b_format, self.params.output_format
        self.c_format = self.params.c_format  # c_format None: the config's inputs.c_format
        self.block_size = self.params.block_size

    def __call__(self, a, b, scale_a, scale_b, c):
        from ..datapath import dot

        scaled = self.params.scales != "none"
        return dot(self.config, a, b, a_format=self.a_format, b_format=self.b_format,
                   scale_a=scale_a if scaled else None, scale_b=scale_b if scaled else None,
                   c=c_values(c, self.c_format), out_format=self.out_format, c_format=self.c_format)


def c_code_bits(c_format: str) -> int:
    """Width of c's bit patterns as units get them: 64 (fp64 bits) for a c format wider than
    32 bits, else 32 (fp32 bits)."""
    return 64 if get_format(c_format).bits > 32 else 32


def c_values(c, c_format: str) -> np.ndarray:
    """c's bit patterns (see the module docstring) as float32 or float64 values."""
    if c_code_bits(c_format) == 64:
        return np.asarray(c, dtype=np.uint64).view(np.float64)
    return np.asarray(c, dtype=np.uint32).view(np.float32)


def load_callable(spec: str):
    """``module:function`` (a dotted module on ``sys.path``, or ``path/to/file.py:function``)
    as the function object; a bad spec raises :class:`ArgumentError` naming it."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ArgumentError(f"--unit: expected module:function or file.py:function, got {spec!r}")
    module_name, function_name = spec.split(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ArgumentError(f"--unit: no such file {module_name!r}")
            loader = importlib.util.spec_from_file_location(f"_mxsim_probe_unit_{path.stem}", path)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ArgumentError:
        raise
    except BaseException as error:  # an import runs arbitrary code: report any failure in one line
        if isinstance(error, KeyboardInterrupt):
            raise
        raise ArgumentError(f"--unit: cannot import {module_name!r}: {type(error).__name__}: {_one_line(error)}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ArgumentError(f"--unit: {module_name!r} has no callable {function_name!r}")
    return function


def _hex_field(codes: np.ndarray, width: int) -> str:
    """One hexadecimal number holding ``codes`` (element i in bits [w*i+w-1 : w*i])."""
    value = 0
    for code in reversed(codes.tolist()):
        value = (value << width) | int(code)
    digits = -(-width * len(codes) // 4)
    return format(value, f"0{digits}x")


def format_request(a, b, scale_a, scale_b, c, a_bits: int, b_bits: int, c_bits: int = 32) -> str:
    """One protocol request line (without the newline): ``A B SA SB C`` in hexadecimal (C:
    ``c_bits`` / 4 digits, 8 for fp32 bits, 16 for fp64 bits)."""
    return " ".join((_hex_field(a, a_bits), _hex_field(b, b_bits), _hex_field(scale_a, 8),
                     _hex_field(scale_b, 8), format(int(c), f"0{c_bits // 4}x")))


def parse_request(line: str, k: int, blocks: int, a_bits: int, b_bits: int, c_bits: int = 32):
    """The fields of a request line: (a codes, b codes, scale_a, scale_b, c bits) as int lists
    (the inverse of :func:`format_request`; a unit written in Python may use it). A field
    wider than its codes (or C than ``c_bits``) raises ValueError."""
    fields = line.split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 hexadecimal fields, got {len(fields)}")
    numbers = [int(field, 16) for field in fields]
    for number, width, name in zip(numbers, (k * a_bits, k * b_bits, 8 * blocks, 8 * blocks, c_bits),
                                   ("A", "B", "SA", "SB", "C")):
        if number < 0 or number >> width:
            raise ValueError(f"field {name} does not fit in {width} bits")

    def unpack(value, count, width):
        return [(value >> (width * i)) & ((1 << width) - 1) for i in range(count)]

    return (unpack(numbers[0], k, a_bits), unpack(numbers[1], k, b_bits), unpack(numbers[2], blocks, 8),
            unpack(numbers[3], blocks, 8), numbers[4])


class SubprocessUnit:
    """A unit behind a command speaking the line protocol (docs/probe.md) on stdin/stdout.

    Each request is one line, ``A B SA SB C`` (hexadecimal; element i of A in bits
    [w*i+w-1 : w*i] of A, w the format's code width; block j's scale in bits [8j+7 : 8j];
    C the fp32 bits of c, 8 digits, or its fp64 bits, 16 digits, for an fp64 ``c_format``);
    the unit answers each with one line holding the output bits in
    hexadecimal. Requests go out in chunks of ``chunk`` lines; each answer must come within
    ``timeout`` seconds. Death, silence, or a line that is not a hexadecimal number of the
    output's width raises :class:`ProbeError` (one line, with the end of the unit's stderr).
    """

    def __init__(self, command: str, a_format: str, b_format: str, out_format: str = "fp32",
                 timeout: float = 30.0, chunk: int = 64, c_format: str = "fp32"):
        if not isinstance(command, str) or not command.strip():
            raise ArgumentError("--command: expected a non-empty command line")
        try:
            self.argv = shlex.split(command)
        except ValueError as error:
            raise ArgumentError(f"--command: cannot split {command!r}: {error}") from None
        self.a_bits, self.b_bits = get_format(a_format).bits, get_format(b_format).bits
        self.out_bits = get_format(out_format).bits
        self.c_bits = c_code_bits(c_format)
        self.timeout, self.chunk = float(timeout), int(chunk)
        self.requests = 0
        self._process = None
        self._stderr = None
        self._buffer = b""

    def _start(self):
        self._stderr = tempfile.TemporaryFile()
        try:
            self._process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=self._stderr, bufsize=0)
        except OSError as error:
            raise ProbeError(f"cannot start the unit command {self.argv[0]!r}: {error.strerror or error}") from None
        os.set_blocking(self._process.stdout.fileno(), False)

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - 300))
        tail = _one_line(self._stderr.read().decode("utf-8", "replace"))
        return f" (stderr: {tail})" if tail else ""

    def _failure(self, what: str) -> ProbeError:
        self.close()
        return ProbeError(f"unit command {self.argv[0]!r} {what} at request {self.requests + 1}{self._stderr_tail()}")

    def _read_line(self, deadline: float) -> bytes:
        selector = selectors.DefaultSelector()
        selector.register(self._process.stdout, selectors.EVENT_READ)
        try:
            while b"\n" not in self._buffer:
                if len(self._buffer) > 4096:
                    raise self._failure("answered a line longer than 4096 bytes")
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise self._failure(f"gave no answer within {self.timeout:g} s")
                data = self._process.stdout.read(65536)
                if not data:
                    self._process.wait()
                    raise self._failure(f"exited (status {self._process.returncode})")
                self._buffer += data
        finally:
            selector.close()
        line, _, self._buffer = self._buffer.partition(b"\n")
        if len(line) > 4096:  # one read may bring a whole long line, newline included
            raise self._failure("answered a line longer than 4096 bytes")
        return line

    def _answer(self, line: bytes) -> int:
        text = line.decode("ascii", "replace").strip()
        digits = -(-self.out_bits // 4)
        if not text or len(text) > digits or any(ch not in "0123456789abcdefABCDEF" for ch in text):
            shown = text[:40] + ("..." if len(text) > 40 else "")
            raise self._failure(f"answered {shown!r}, not {digits} hexadecimal digits")
        return int(text, 16)

    def __call__(self, a, b, scale_a, scale_b, c):
        if self._process is None:
            self._start()
        out = np.empty(len(a), dtype=np.uint64)
        for start in range(0, len(a), self.chunk):
            stop = min(start + self.chunk, len(a))
            lines = "".join(format_request(a[i], b[i], scale_a[i], scale_b[i], c[i], self.a_bits, self.b_bits, self.c_bits) + "\n"
                            for i in range(start, stop))
            try:
                self._process.stdin.write(lines.encode("ascii"))
                self._process.stdin.flush()
            except (BrokenPipeError, OSError):
                self._process.wait()
                raise self._failure(f"exited (status {self._process.returncode})") from None
            for i in range(start, stop):
                out[i] = self._answer(self._read_line(time.monotonic() + self.timeout))
                self.requests += 1
        return out

    def close(self):
        """Stop the unit's process (closing its stdin first, then killing it if it lingers)."""
        process, self._process = getattr(self, "_process", None), None
        if process is None:
            return
        try:
            process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __del__(self):
        self.close()


# ----------------------------------------------------------------------------- counting wrapper


class CountingUnit:
    """A unit checked and counted: ``queries`` dot products asked, ``seconds`` spent in the unit."""

    def __init__(self, unit, out_format: str, budget: int):
        if not callable(unit):
            raise ArgumentError(f"probe: unit must be callable (a, b, scale_a, scale_b, c) -> bits, got {type(unit).__name__}")
        self.unit = unit
        self.out_bits = get_format(out_format).bits
        self.budget = budget
        self.queries = 0
        self.seconds = 0.0

    def __call__(self, a, b, scale_a, scale_b, c) -> np.ndarray:
        rows = len(a)
        if self.queries + rows > self.budget:
            raise ProbeError(f"the probe would need more than its budget of {self.budget} dot products")
        started = time.perf_counter()
        try:
            answer = self.unit(a.copy(), b.copy(), scale_a.copy(), scale_b.copy(), c.copy())
        except ProbeError:
            raise
        except Exception as error:
            raise ProbeError(f"the unit raised {type(error).__name__}: {_one_line(error)}") from None
        finally:
            self.seconds += time.perf_counter() - started
        self.queries += rows
        try:
            bits = np.asarray(answer)
        except Exception:  # an object numpy cannot hold
            raise ProbeError(f"the unit answered {type(answer).__name__}, not an array of output bits") from None
        if bits.shape != (rows,) or not (np.issubdtype(bits.dtype, np.integer) or bits.dtype == object):
            raise ProbeError(f"the unit answered shape {bits.shape} dtype {bits.dtype}; expected {rows} integer output bit patterns")
        try:
            values = [int(value) for value in bits.tolist()]
        except (TypeError, ValueError):
            raise ProbeError("the unit answered values that are not integers") from None
        if any(value < 0 or value >> self.out_bits for value in values):
            raise ProbeError(f"the unit answered a value outside 0..2^{self.out_bits}-1")
        return np.array(values, dtype=np.uint64)


def python_path_hint() -> None:
    """Let ``module:function`` find modules in the working directory, as ``python -m`` does."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
