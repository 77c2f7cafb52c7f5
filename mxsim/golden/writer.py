"""Generate golden vector files and their manifest for a hardware config.

Expected outputs come from an *expected function* ``expected_fn(a, b, scale_a, scale_b, c)``
(arrays as in :class:`~mxsim.golden.vectors.VectorSet`, c as the bits of the unit's c format:
uint32 FP32, or uint64 FP64) returning the
output bits, one per vector. By default it is :func:`dot_expected_fn`, a thin adapter around
``mxsim.dot``; pass another (or a factory taking the :class:`GoldenUnit`) to generate from a
different reference.

Output directory, for each unit (format pair) and case kind::

    <config>.<A>x<B>.<kind>.hex           vectors (see mxsim.golden.vectors)
    <config>.<A>x<B>.<kind>.labels.txt    "<index> <label>" per vector
    <config>.<A>x<B>.<kind>.stages.jsonl  one JSON stage record per vector (stage_dumps=True)
    manifest.json                         what was generated (see generate())

The same config, arguments and mxsim version give byte-identical files. The whole output is
written into a fresh hidden directory beside the output directory, which then replaces it in
one step (:func:`mxsim.fileio.staged_directory`), so a reader or a kill finds the old complete
set of files or the new one, never a mixture; the output directory must therefore be new,
empty, or an earlier golden output (one with a golden manifest).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import zlib
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import ArgumentError, MxsimError
from ..fileio import check_output_directory, staged_directory, write_atomic
from ..limits import check_budget, check_int
from ..formats import get_format
from .cases import GENERATORS, KINDS, exhaustive_count
from .layout import GoldenUnit, layout_for, units_from_hwconfig
from .stages import datapath_stage_fn, exact_stages, json_safe
from .vectors import FILE_FORMAT_VERSION, VectorSet, format_lines, header_lines

MANIFEST_NAME = "manifest.json"
CHUNK = 2048  # vectors per expected_fn call (progress granularity)
MAX_DOT_LENGTH = 1 << 16
MAX_STAGE_VECTORS = (
    10_000  # per stage file: fp4 x fp4 exhaustive (8448) fits, fp8 x fp8 (65536) does not
)

ExpectedFn = Callable[..., np.ndarray]


def dot_expected_fn(hw, unit: GoldenUnit) -> ExpectedFn:
    """The default expected function: ``mxsim.dot`` on one unit's format pair, as output bits."""
    from mxsim.datapath import (
        dot,
    )  # lazily: the datapath is not needed to read or write vector files

    def expected(a, b, scale_a, scale_b, c):
        out = dot(
            hw,
            a,
            b,
            a_format=unit.a_format,
            b_format=unit.b_format,
            scale_a=scale_a,
            scale_b=scale_b,
            c=unit.c_values(c),
            out_format=unit.out_format,
        )
        return output_bits(out, unit.out_format)

    expected.__qualname__ = "mxsim.dot"
    return expected


def output_bits(out, out_format: str) -> np.ndarray:
    """``out`` as bit patterns (uint32, or uint64 for a 64-bit format): float arrays are viewed
    as their bits, integers kept."""
    out = np.asarray(out)
    bits = get_format(out_format).bits
    if out.dtype.kind == "f":
        view = {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(out.dtype.itemsize)
        if view is None or out.dtype.itemsize * 8 != bits:
            raise MxsimError(f"golden: expected {out_format} output, got {out.dtype} values")
        out = out.view(view)
    if out.dtype.kind not in "iu":
        raise MxsimError(f"golden: expected output bits as integers, got dtype {out.dtype}")
    if out.size and (int(out.min()) < 0 or int(out.max()) >> bits):
        raise MxsimError(f"golden: expected output bits do not fit {bits}-bit {out_format}")
    return out.astype(np.uint32 if bits <= 32 else np.uint64)


class Progress:
    """A progress bar over vectors: tqdm when installed, else a plain counter on stderr."""

    def __init__(self, total: int, enabled, description: str = "mxsim golden"):
        self.total = total
        self.done = 0
        self.callback = enabled if callable(enabled) else None
        self.enabled = bool(enabled) and self.callback is None
        self.bar = None
        self.last = 0.0
        if self.enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc=description, unit="vec", file=sys.stderr)
        self.description = description

    def grow(self, n: int) -> None:
        """Add ``n`` vectors to the total (work whose size shows only as it is made)."""
        self.total += n
        if n and self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def update(self, n: int) -> None:
        self.done += n
        if self.callback is not None:
            self.callback(self.done, self.total)
        elif self.bar is not None:
            self.bar.update(n)
        elif self.enabled:
            now = time.monotonic()
            if now - self.last >= 0.5 or self.done == self.total:
                self.last = now
                print(
                    f"\r{self.description}: {self.done}/{self.total} vectors",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            print(file=sys.stderr, flush=True)


def _kinds(kinds) -> list[str]:
    if isinstance(kinds, str):
        kinds = [kinds]
    if not isinstance(kinds, (list, tuple)):
        raise ArgumentError(
            f"golden: kinds must be a case kind or a list of them ({', '.join(KINDS)})"
        )
    chosen = []
    for kind in kinds:
        if not isinstance(kind, str) or kind not in KINDS:
            raise MxsimError(f"golden: unknown case kind {kind!r}; accepted: {', '.join(KINDS)}")
        if kind not in chosen:
            chosen.append(kind)
    if not chosen:
        raise MxsimError("golden: no case kind given")
    return chosen


def case_rng(seed: int, unit: GoldenUnit, kind: str) -> np.random.Generator:
    """The generator for one unit and kind: depends only on the seed and their names."""
    return np.random.default_rng([seed, zlib.crc32(unit.file_stem(kind).encode())])


def make_cases(unit: GoldenUnit, kind: str, cases: int, seed: int) -> VectorSet:
    """The input vectors (no expected outputs) of one unit and kind; c rounded into the
    unit's ``c_value_format`` where it has one (a config whose c is fp16 or bf16)."""
    vectors = GENERATORS[kind](unit, cases, case_rng(seed, unit, kind))
    vectors.c = unit.c_bits_in_value_format(vectors.c)
    return vectors


def fill_expected(
    vectors: VectorSet, expected_fn: ExpectedFn, progress: Progress | None = None
) -> VectorSet:
    """Set ``vectors.d`` from ``expected_fn``, called in chunks of CHUNK vectors."""
    parts = []
    for start in range(0, len(vectors), CHUNK):
        stop = min(start + CHUNK, len(vectors))
        rows = slice(start, stop)
        bits = expected_fn(
            vectors.a[rows],
            vectors.b[rows],
            None if vectors.scale_a is None else vectors.scale_a[rows],
            None if vectors.scale_b is None else vectors.scale_b[rows],
            vectors.c[rows],
        )
        bits = np.asarray(bits)
        if bits.shape != (stop - start,):
            raise MxsimError(
                f"golden: expected_fn returned shape {bits.shape} for {stop - start} vectors"
            )
        if bits.dtype.kind not in "iu":
            raise MxsimError(
                f"golden: expected_fn must return output bits as integers, got dtype {bits.dtype}"
            )
        parts.append(bits.astype(np.uint64 if bits.dtype.itemsize > 4 else np.uint32))
        if progress is not None:
            progress.update(stop - start)
    vectors.d = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
    return vectors


def _check_stage_count(unit: GoldenUnit, kind: str, count: int) -> None:
    if count > MAX_STAGE_VECTORS:
        raise MxsimError(
            f"golden: stage dumps are limited to {MAX_STAGE_VECTORS} vectors per file (each replays the vector "
            f"through the exact twin, about 2 ms, and writes about 4.5 KB); {unit.pair_name} {kind} has {count}. "
            "Generate without stages, or with fewer cases"
        )


def _stage_lines(vectors: VectorSet, stage_fn) -> Iterable[str]:
    """The stage file's text, CHUNK vectors at a time (an exhaustive set's records run to
    hundreds of MB): ``stage_fn`` gets consecutive slices, and each record's ``index`` is set
    to its vector's position in the whole set."""
    for start in range(0, len(vectors), CHUNK):
        stop = min(start + CHUNK, len(vectors))
        records = list(stage_fn(vectors.rows(start, stop)))
        if len(records) != stop - start or not all(isinstance(record, dict) for record in records):
            raise MxsimError(
                f"golden: the stage function must give one dict per vector; got {len(records)} "
                f"records for {stop - start} vectors"
            )
        lines = []
        for offset, record in enumerate(records):
            record = dict(json_safe(record), index=start + offset)
            lines.append(
                json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"
            )
        yield "".join(lines)


def _known_count(unit: GoldenUnit, kind: str, cases: int) -> int:
    """Vectors of one unit and kind known before making them (0 for corners: a list whose
    length shows only once it is built)."""
    if kind == "random":
        return cases
    return exhaustive_count(unit) if kind == "exhaustive" else 0


def _resolve_units(hw, pairs, dot_length) -> tuple[object, list[GoldenUnit]]:
    if isinstance(hw, (str, Path)):
        from ..datapath.config import load_hwconfig

        hw = load_hwconfig(hw)
    if isinstance(hw, GoldenUnit):
        return None, [hw]
    if isinstance(hw, (list, tuple)) and hw and all(isinstance(u, GoldenUnit) for u in hw):
        return None, list(hw)
    from ..datapath.config import HardwareConfig

    if not isinstance(hw, HardwareConfig):
        raise ArgumentError(
            f"golden: hw must be a HardwareConfig, a hwconfig path or GoldenUnits, got {type(hw).__name__}"
        )
    return hw, units_from_hwconfig(hw, pairs=pairs, dot_length=dot_length)


def generate(
    hw,
    out_dir,
    cases: int = 1000,
    seed: int = 0,
    kinds: str | Iterable[str] = ("random", "corners"),
    stage_dumps: bool = False,
    progress=None,
    *,
    pairs=None,
    dot_length: int | None = None,
    expected_fn: ExpectedFn | None = None,
    expected_factory: Callable[[GoldenUnit], ExpectedFn] | None = None,
    stage_fn: Callable[[VectorSet], list[dict]] | None = None,
) -> dict:
    """Write golden vectors for every format pair of ``hw`` into ``out_dir``; return the manifest.

    Args:
        hw: a config from ``mxsim.load_hwconfig`` (or a path to its YAML), or one or more
            :class:`GoldenUnit` (then ``expected_fn``/``expected_factory`` is required).
        out_dir: output directory (created if missing).
        cases: random vectors per format pair (corners and exhaustive are fixed lists), an
            integer >= 0 within the memory budget (about 64 bytes per element; docs/limits.md).
            0 writes empty random files.
        seed: random seed, an integer 0..2**63-1; files depend only on (config, arguments,
            mxsim version).
        kinds: ``"random"``, ``"corners"``, ``"exhaustive"``, or a sequence of them.
        stage_dumps: also write ``.stages.jsonl`` (the datapath's explain records when mxsim
            has ``explain``, else exact-arithmetic stages; see :mod:`mxsim.golden.stages`).
        progress: None (a bar when there are ≥ 20000 vectors and stderr is a terminal),
            True/False, or a callable ``(done, total)``.
        pairs: (a_format, b_format) pairs to generate (default: all the config accepts).
        dot_length: K per vector, 1..MAX_DOT_LENGTH (default k: one block per dot product).
        expected_fn: ``(a, b, scale_a, scale_b, c) -> output bits``, for a single unit.
        expected_factory: ``unit -> expected_fn``, for several units.
        stage_fn: ``vectors -> records`` overriding the stage source (single unit); called on
            consecutive slices of at most 2048 vectors, one dict per vector, whose ``index``
            the writer sets to the vector's position in the file.

    The manifest (also written to ``out_dir/manifest.json``): ``format``, ``format_version``,
    ``mxsim_version``, ``config`` (name, sha256), ``seed``, ``cases``, ``kinds``,
    ``expected`` (the expected function's name), ``counts`` (vectors per kind, all units),
    and ``units``: per format pair its parameters, ``layout`` (word bits and fields with
    msb/lsb) and ``files`` per kind (file names, ``count``, ``sha256`` of the vector file).
    """
    chosen_kinds = _kinds(kinds)
    cases = check_int(cases, "golden: cases", 0)
    seed = check_int(seed, "golden: seed", 0, 2**63 - 1)
    if dot_length is not None:
        dot_length = check_int(dot_length, "golden: dot_length", 1, MAX_DOT_LENGTH)
    hw, units = _resolve_units(hw, pairs, dot_length)
    for unit in units:  # the vectors' arrays and hex text, about 64 bytes per element
        check_budget(
            cases * unit.dot_length * 64,
            f"golden: {cases} random vectors of length {unit.dot_length}",
        )
    if expected_fn is not None and expected_factory is not None:
        raise MxsimError("golden: pass expected_fn or expected_factory, not both")
    if (expected_fn is not None or stage_fn is not None) and len(units) != 1:
        raise MxsimError(
            f"golden: expected_fn/stage_fn serve one format pair but the config has {len(units)}; "
            "restrict pairs= or pass expected_factory"
        )
    if expected_fn is None and expected_factory is None and hw is None:
        raise MxsimError(
            "golden: generating from GoldenUnit objects needs expected_fn or expected_factory"
        )
    if len({(u.config_name, u.config_hash) for u in units}) != 1:
        raise MxsimError("golden: all units must come from one config")
    stems = [unit.pair_name for unit in units]
    if len(set(stems)) != len(
        stems
    ):  # one file set per pair: a repeated unit would be written twice
        raise ArgumentError(
            f"golden: a format pair is given more than once ({', '.join(stems)}); give each once"
        )
    out = check_output_directory(out_dir, _is_golden_output, "golden: out_dir")
    # Vectors are made, written and dropped one (unit, kind) at a time, so memory holds one
    # set. The progress total starts at the counts known beforehand (random and exhaustive,
    # whose sizes are also checked here, before anything is written) and grows by each
    # corner list as it is made.
    total = 0
    for unit in units:
        for kind in chosen_kinds:
            count = _known_count(unit, kind, cases)
            if stage_dumps:
                _check_stage_count(unit, kind, count)
            if kind == "exhaustive":  # the vectors' arrays and hex text, as for random
                check_budget(
                    count * unit.dot_length * 64,
                    f"golden: exhaustive {unit.pair_name}, {count} vectors of length {unit.dot_length}",
                )
            total += count
    if progress is None:
        progress = total >= 20000 and sys.stderr.isatty()
    with staged_directory(out) as staging:
        return _write_units(
            hw,
            units,
            staging,
            chosen_kinds,
            cases,
            seed,
            stage_dumps,
            Progress(total, progress),
            expected_fn,
            expected_factory,
            stage_fn,
        )


def _is_golden_output(directory: Path) -> bool:
    """Whether ``directory`` holds a golden manifest (an earlier output, which may be replaced)."""
    manifest = directory / MANIFEST_NAME
    try:
        if not manifest.is_file() or manifest.stat().st_size > 64 << 20:
            return False
        return json.loads(manifest.read_text(encoding="utf-8")).get("format") == "mxsim-golden"
    except (OSError, ValueError, AttributeError):
        return False


def _write_units(
    hw,
    units,
    out: Path,
    chosen_kinds,
    cases,
    seed,
    stage_dumps,
    bar: Progress,
    expected_fn,
    expected_factory,
    stage_fn,
) -> dict:
    """Make and write every unit's vectors and the manifest into ``out``; return the manifest."""
    manifest_units = []
    counts = {kind: 0 for kind in chosen_kinds}
    expected_name = None
    try:
        for unit in units:
            fn = expected_fn or (
                expected_factory(unit) if expected_factory else dot_expected_fn(hw, unit)
            )
            expected_name = expected_name or getattr(fn, "__qualname__", type(fn).__name__)
            stages = stage_fn or (datapath_stage_fn(hw, unit) if stage_dumps else None)
            layout = layout_for(unit)
            files = {}
            for kind in chosen_kinds:
                vectors = make_cases(unit, kind, cases, seed)
                bar.grow(len(vectors) - _known_count(unit, kind, cases))
                fill_expected(vectors, fn, bar)
                stem = unit.file_stem(kind)
                lines = header_lines(
                    layout,
                    unit,
                    mxsim_version=__version__,
                    seed=seed,
                    kind=kind,
                    count=len(vectors),
                )
                text = "\n".join(lines + format_lines(layout, vectors)) + "\n"
                write_atomic(out / f"{stem}.hex", text)
                labels = "".join(f"{i} {label}\n" for i, label in enumerate(vectors.labels))
                write_atomic(out / f"{stem}.labels.txt", labels)
                entry = {
                    "vectors": f"{stem}.hex",
                    "labels": f"{stem}.labels.txt",
                    "stages": None,
                    "count": len(vectors),
                    "sha256": hashlib.sha256(text.encode("ascii")).hexdigest(),
                }
                if stage_dumps:
                    _check_stage_count(unit, kind, len(vectors))
                    write_atomic(
                        out / f"{stem}.stages.jsonl",
                        _stage_lines(vectors, stages or partial(exact_stages, unit)),
                    )
                    entry["stages"] = f"{stem}.stages.jsonl"
                files[kind] = entry
                counts[kind] += len(vectors)
            manifest_units.append(
                {
                    "a_format": unit.a_format,
                    "b_format": unit.b_format,
                    "block_size": unit.block_size,
                    "dot_length": unit.dot_length,
                    "out_format": unit.out_format,
                    "scaled": unit.scaled,
                    "scale_format": unit.scale_format,
                    "c_format": unit.c_format,
                    "layout": {
                        "word_bits": layout.word_bits,
                        "hex_digits": layout.hex_digits,
                        "fields": [f.as_dict() for f in layout.fields],
                    },
                    "files": files,
                }
            )
    finally:
        bar.close()
    manifest = {
        "format": "mxsim-golden",
        "format_version": FILE_FORMAT_VERSION,
        "mxsim_version": __version__,
        "config": {"name": units[0].config_name, "sha256": units[0].config_hash},
        "seed": int(seed),
        "cases": int(cases),
        "kinds": chosen_kinds,
        "expected": expected_name,
        "counts": counts,
        "units": manifest_units,
    }
    write_atomic(out / MANIFEST_NAME, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
