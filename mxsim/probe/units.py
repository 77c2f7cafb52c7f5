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
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ..errors import ArgumentError, MxsimError
from ..formats import get_format
from ..limits import is_integer, shown


class ProbeError(MxsimError):
    """The unit under probe failed: it raised, died, hung, or answered something unreadable."""


def _one_line(text) -> str:
    return " ".join(str(text).split())


# ----------------------------------------------------------------------------- adapters


class HwconfigUnit:
    """An mxsim hardware config as a black box: ``mxsim.dot`` on one (A, B, output) format path."""

    def __init__(
        self,
        hw,
        a_format: str,
        b_format: str,
        out_format: str | None = None,
        c_format: str | None = None,
    ):
        from ..datapath import load_hwconfig
        from ..datapath.config import HardwareConfig

        self.config = hw if isinstance(hw, HardwareConfig) else load_hwconfig(hw)
        self.params = self.config.params(
            a_format, b_format, out_format, c_format
        )  # checks the pair
        self.a_format, self.b_format, self.out_format = (
            self.params.a_format,
            self.params.b_format,
            self.params.output_format,
        )
        self.c_format = self.params.c_format  # c_format None: the config's inputs.c_format
        self.block_size = self.params.block_size

    def __call__(self, a, b, scale_a, scale_b, c):
        from ..datapath import dot

        scaled = self.params.scales != "none"
        return dot(
            self.config,
            a,
            b,
            a_format=self.a_format,
            b_format=self.b_format,
            scale_a=scale_a if scaled else None,
            scale_b=scale_b if scaled else None,
            c=c_values(c, self.c_format),
            out_format=self.out_format,
            c_format=self.c_format,
        )


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
        raise ArgumentError(
            f"--unit: expected module:function or file.py:function, got {shown(spec)}"
        )
    module_name, function_name = spec.split(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ArgumentError(f"--unit: no such file {shown(module_name)}")
            loader = importlib.util.spec_from_file_location(f"_mxsim_probe_unit_{path.stem}", path)
            module = importlib.util.module_from_spec(loader)
            writes_bytecode = sys.dont_write_bytecode
            sys.dont_write_bytecode = True  # no __pycache__ left beside the user's file
            try:
                loader.loader.exec_module(module)
            finally:
                sys.dont_write_bytecode = writes_bytecode
        else:
            module = importlib.import_module(module_name)
    except ArgumentError:
        raise
    except (
        BaseException
    ) as error:  # an import runs arbitrary code (sys.exit too): any failure is one line
        raise ArgumentError(
            f"--unit: cannot import {shown(module_name)}: {type(error).__name__}: "
            f"{shown(_one_line(error))}"
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ArgumentError(f"--unit: {shown(module_name)} has no callable {shown(function_name)}")
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
    return " ".join(
        (
            _hex_field(a, a_bits),
            _hex_field(b, b_bits),
            _hex_field(scale_a, 8),
            _hex_field(scale_b, 8),
            format(int(c), f"0{c_bits // 4}x"),
        )
    )


def parse_request(line: str, k: int, blocks: int, a_bits: int, b_bits: int, c_bits: int = 32):
    """The fields of a request line: (a codes, b codes, scale_a, scale_b, c bits) as int lists
    (the inverse of :func:`format_request`; a unit written in Python may use it). A field
    wider than its codes (or C than ``c_bits``) raises ValueError."""
    fields = line.split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 hexadecimal fields, got {len(fields)}")
    numbers = [int(field, 16) for field in fields]
    for number, width, name in zip(
        numbers,
        (k * a_bits, k * b_bits, 8 * blocks, 8 * blocks, c_bits),
        ("A", "B", "SA", "SB", "C"),
    ):
        if number < 0 or number >> width:
            raise ValueError(f"field {name} does not fit in {width} bits")

    def unpack(value, count, width):
        return [(value >> (width * i)) & ((1 << width) - 1) for i in range(count)]

    return (
        unpack(numbers[0], k, a_bits),
        unpack(numbers[1], k, b_bits),
        unpack(numbers[2], blocks, 8),
        unpack(numbers[3], blocks, 8),
        numbers[4],
    )


class _StderrTail:
    """A unit's stderr, drained by a thread as it comes so the unit never blocks on it, and
    kept bounded: its first and last :data:`STDERR_KEEP` bytes and a byte count."""

    def __init__(self, stream):
        self.head, self.tail, self.size = b"", b"", 0
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream):
        try:  # raw reads: the main thread never waits on a lock this thread holds
            while True:
                data = os.read(stream.fileno(), 65536)
                if not data:
                    break
                self.size += len(data)
                if len(self.head) < STDERR_KEEP:
                    room = STDERR_KEEP - len(self.head)
                    self.head, data = self.head + data[:room], data[room:]
                self.tail = (self.tail + data)[-STDERR_KEEP:]
        except (OSError, ValueError):
            pass
        finally:
            stream.close()

    def text(self) -> str:
        """`` (stderr: HEAD ... TAIL)``: about 80 characters from each end, or ``""``."""
        self._thread.join(0.2)  # let the last bytes of a unit that just died arrive
        head = _one_line(self.head.decode("utf-8", "replace"))
        tail = _one_line(self.tail.decode("utf-8", "replace"))
        if not head and not tail:
            return ""
        if len(head) > ECHO_CHARS:
            head = head[:ECHO_CHARS] + "..."
        if self.size > len(self.head):  # more than the head was written: show its end too
            tail = tail[-ECHO_CHARS:]
            return f" (stderr, {self.size} bytes: {head} ... {tail})"
        return f" (stderr: {head})"


#: Bytes of a unit's stderr kept from its start and from its end (the rest is only counted),
#: and characters of each shown in an error.
STDERR_KEEP = 4096
ECHO_CHARS = 80


class SubprocessUnit:
    """A unit behind a command speaking the line protocol (docs/probe.md) on stdin/stdout.

    Each request is one line, ``A B SA SB C`` (hexadecimal; element i of A in bits
    [w*i+w-1 : w*i] of A, w the format's code width; block j's scale in bits [8j+7 : 8j];
    C the fp32 bits of c, 8 digits, or its fp64 bits, 16 digits, for an fp64 ``c_format``);
    the unit answers each with one line holding the output bits in
    hexadecimal. Requests go out in chunks of ``chunk`` lines; each answer must come within
    ``timeout`` seconds, and every write and wait is bounded by it too (a unit that stops
    reading, or closes its stdout and keeps running, is stopped). Death, silence, or a line
    that is not a hexadecimal number of the output's width raises :class:`ProbeError` (one
    line, with the start and end of the unit's stderr, of which only the first and last
    :data:`STDERR_KEEP` bytes are kept). The unit runs in its own process group, killed as a
    whole when it is stopped.
    """

    def __init__(
        self,
        command: str,
        a_format: str,
        b_format: str,
        out_format: str = "fp32",
        timeout: float = 30.0,
        chunk: int = 64,
        c_format: str = "fp32",
    ):
        if not isinstance(command, str) or not command.strip():
            raise ArgumentError("--command: expected a non-empty command line")
        try:
            self.argv = shlex.split(command)
        except ValueError as error:
            raise ArgumentError(f"--command: cannot split {shown(command)}: {error}") from None
        if not self.argv or "\x00" in command:
            raise ArgumentError(f"--command: expected a command line, got {shown(command)}")
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float, np.integer, np.floating))
            or not 0 < float(timeout) <= 3600
        ):
            raise ArgumentError(f"--timeout: expected seconds in (0, 3600], got {shown(timeout)}")
        if not is_integer(chunk) or not 1 <= chunk <= 4096:
            raise ArgumentError(f"chunk: expected an integer 1..4096, got {shown(chunk)}")
        self.a_bits, self.b_bits = get_format(a_format).bits, get_format(b_format).bits
        self.out_bits = get_format(out_format).bits
        self.c_bits = c_code_bits(c_format)
        self.timeout, self.chunk = float(timeout), int(chunk)
        self.requests = 0
        self._process = None
        self._stderr = None
        self._buffer = b""

    def _start(self):
        try:
            self._process = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
            )
        except (OSError, ValueError) as error:
            raise ProbeError(
                f"cannot start the unit command {shown(self.argv[0])}: "
                f"{getattr(error, 'strerror', None) or error}"
            ) from None
        self._stderr = _StderrTail(self._process.stderr)
        self._buffer = b""
        os.set_blocking(self._process.stdout.fileno(), False)
        os.set_blocking(self._process.stdin.fileno(), False)

    def _stderr_tail(self) -> str:
        return "" if self._stderr is None else self._stderr.text()

    def _failure(self, what: str) -> ProbeError:
        self.close()
        return ProbeError(
            f"unit command {shown(self.argv[0])} {what} at request {self.requests + 1}{self._stderr_tail()}"
        )

    def _exited(self, deadline: float) -> ProbeError:
        """The unit closed its stdout (or stdin): its exit status if it ends by ``deadline``."""
        try:
            self._process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return self._failure(f"closed its output and did not exit within {self.timeout:g} s")
        return self._failure(f"exited (status {self._process.returncode})")

    def _pump(self, data: bytes, deadline: float, lines: int) -> None:
        """Write ``data`` to the unit and read until ``lines`` answer lines are buffered, both
        at once (a unit answering as it reads may fill its stdout before it has read every
        request), within ``deadline``."""
        selector = selectors.DefaultSelector()
        stdin, stdout = self._process.stdin, self._process.stdout
        selector.register(stdout, selectors.EVENT_READ)
        if data:
            selector.register(stdin, selectors.EVENT_WRITE)
        try:
            while data or self._buffer.count(b"\n") < lines:
                if len(self._buffer) - (self._buffer.rfind(b"\n") + 1) > 4096:
                    raise self._failure("answered a line longer than 4096 bytes")
                if len(self._buffer) > 4097 * (self.chunk + 1):
                    raise self._failure("answered more lines than it was asked")
                left = deadline - time.monotonic()
                events = selector.select(left) if left > 0 else []
                if not events:
                    raise self._failure(f"gave no answer within {self.timeout:g} s")
                for key, _ in events:
                    if key.fileobj is stdin:
                        try:
                            written = os.write(stdin.fileno(), data[:65536])
                        except BlockingIOError:
                            continue
                        except OSError:  # BrokenPipeError: the unit closed its stdin or died
                            raise self._exited(deadline) from None
                        data = data[written:]
                        if not data:
                            selector.unregister(stdin)
                    else:
                        try:
                            chunk = os.read(stdout.fileno(), 65536)
                        except BlockingIOError:
                            continue
                        if not chunk:
                            raise self._exited(deadline)
                        self._buffer += chunk
        finally:
            selector.close()

    def _read_line(self, deadline: float) -> bytes:
        self._pump(b"", deadline, 1)
        line, _, self._buffer = self._buffer.partition(b"\n")
        if len(line) > 4096:  # one read may bring a whole long line, newline included
            raise self._failure("answered a line longer than 4096 bytes")
        return line

    def _answer(self, line: bytes) -> int:
        text = line.decode("ascii", "replace").strip()
        digits = -(-self.out_bits // 4)
        if not text or len(text) > digits or any(ch not in "0123456789abcdefABCDEF" for ch in text):
            shown_text = text[:40] + ("..." if len(text) > 40 else "")
            raise self._failure(f"answered {shown_text!r}, not {digits} hexadecimal digits")
        return int(text, 16)

    def __call__(self, a, b, scale_a, scale_b, c):
        if self._process is None:
            self._start()
        out = np.empty(len(a), dtype=np.uint64)
        for start in range(0, len(a), self.chunk):
            stop = min(start + self.chunk, len(a))
            lines = "".join(
                format_request(
                    a[i], b[i], scale_a[i], scale_b[i], c[i], self.a_bits, self.b_bits, self.c_bits
                )
                + "\n"
                for i in range(start, stop)
            )
            # the writing is bounded as one answer is: a unit must read as it answers
            self._pump(lines.encode("ascii"), time.monotonic() + self.timeout, 0)
            for i in range(start, stop):
                out[i] = self._answer(self._read_line(time.monotonic() + self.timeout))
                self.requests += 1
            if (
                b"\n" in self._buffer
            ):  # an answer no request asked for: every later one would be off by one
                raise self._failure("answered more lines than it was asked")
        return out

    def close(self):
        """Stop the unit's process (closing its stdin first, then killing its process group
        if it lingers past 2 s, or past ``timeout`` if that is shorter)."""
        process, self._process = getattr(self, "_process", None), None
        if process is None:
            return
        try:
            process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(timeout=min(2.0, self.timeout))
        except subprocess.TimeoutExpired:
            pass
        try:  # the group too: children the unit started may hold its pipes open
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
        if process.returncode is None:
            process.kill()
            process.wait()
        try:
            process.stdout.close()  # stderr: its draining thread closes it at its end
        except OSError:
            pass

    def __del__(self):
        self.close()


# ----------------------------------------------------------------------------- counting wrapper


class CountingUnit:
    """A unit checked and counted: ``queries`` dot products asked, ``seconds`` spent in the unit."""

    def __init__(self, unit, out_format: str, budget: int):
        if not callable(unit):
            raise ArgumentError(
                f"probe: unit must be callable (a, b, scale_a, scale_b, c) -> bits, got {type(unit).__name__}"
            )
        self.unit = unit
        self.out_bits = get_format(out_format).bits
        self.budget = budget
        self.queries = 0
        self.seconds = 0.0

    def __call__(self, a, b, scale_a, scale_b, c) -> np.ndarray:
        rows = len(a)
        if self.queries + rows > self.budget:
            raise ProbeError(
                f"the probe would need more than its budget of {self.budget} dot products"
            )
        started = time.perf_counter()
        try:
            answer = self.unit(a.copy(), b.copy(), scale_a.copy(), scale_b.copy(), c.copy())
        except ProbeError:
            raise
        except (
            BaseException
        ) as error:  # SystemExit, KeyboardInterrupt...: the unit's end is the probe's, in one line
            raise ProbeError(
                f"the unit raised {type(error).__name__}: {shown(_one_line(error))}"
            ) from None
        finally:
            self.seconds += time.perf_counter() - started
        self.queries += rows
        return self.check_answer(answer, rows)

    def check_answer(self, answer, rows: int) -> np.ndarray:
        """``answer`` as ``rows`` output bit patterns (uint64) if it is a sequence of integers
        (numpy integer dtypes, or Python/numpy integers in an object array; never bools,
        floats, strings or other objects, even where ``int()`` would take them) each of the
        output's width; else :class:`ProbeError`."""
        try:
            bits = np.asarray(answer)
        except BaseException:  # an object numpy cannot hold, or whose conversion raises
            raise ProbeError(
                f"the unit answered {shown(type(answer).__name__)}, not an array of output bits"
            ) from None
        if bits.shape != (rows,) or not (
            np.issubdtype(bits.dtype, np.integer)
            or (bits.dtype == object and all(is_integer(value) for value in bits.tolist()))
        ):
            raise ProbeError(
                f"the unit answered shape {shown(bits.shape)} dtype {bits.dtype}; expected {rows} "
                "integer output bit patterns (no floats, strings or bools)"
            )
        values = [int(value) for value in bits.tolist()]
        if any(value < 0 or value >> self.out_bits for value in values):
            raise ProbeError(f"the unit answered a value outside 0..2^{self.out_bits}-1")
        return np.array(values, dtype=np.uint64)


def python_path_hint() -> None:
    """Let ``module:function`` find modules in the working directory, as ``python -m`` does."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
