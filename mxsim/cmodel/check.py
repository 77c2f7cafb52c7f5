"""The proof of an exported C model: compiled with the system compiler, run on golden cases
(random, corners, exhaustive where small: ``mxsim.golden``'s generators) and compared bit for
bit with ``mxsim.dot`` on the same unit (docs/cmodel.md)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from ..datapath import dot, load_hwconfig
from ..formats import get_format
from .export import export_c
from .harness import CModel


def _padded_cases(params, k: int, count: int, rng) -> tuple:
    """Random vectors for a pair the golden vectors do not hold (tf32: padded codes): every code
    uniformly, and Gaussian values rounded into the formats; c a value of the c format."""
    rows = []
    for name in (params.a_format, params.b_format):
        fmt = get_format(name)
        uniform = rng.integers(
            0, 1 << fmt.field_bits, size=(count // 2, k), dtype=np.uint64
        ) << np.uint64(fmt.padding_bits)
        gaussian = fmt.encode(
            rng.standard_normal((count - count // 2, k))
            * 2.0 ** rng.integers(-20, 20, (count - count // 2, 1))
        )
        rows.append(np.concatenate([uniform, gaussian.astype(np.uint64)]))
    c_fmt = get_format(params.c_format)
    c = c_fmt.round(rng.standard_normal(count) * 2.0 ** rng.integers(-30, 30, count)).astype(
        np.float32
    )
    c[rng.random(count) < 0.2] = 0.0
    blocks = -(-k // params.block_size)
    scales = None
    if params.scales != "none":
        scales = [np.full((count, blocks), 127, dtype=np.uint8) for _ in range(2)]
    return rows[0], rows[1], scales, c.view(np.uint32)


def _cases(config, params, a_format, b_format, k, kinds, cases, seed):
    """(a, b, scale_a, scale_b, c bits, c values for mxsim.dot) of the chosen kinds."""
    from ..golden.layout import units_from_hwconfig
    from ..golden.writer import make_cases

    if get_format(a_format).padding_bits or get_format(b_format).padding_bits:
        a, b, scales, c_bits = _padded_cases(params, k, cases, np.random.default_rng(seed))
        return a, b, *(scales or (None, None)), c_bits, c_bits.view(np.float32)
    unit = units_from_hwconfig(config, pairs=[(a_format, b_format)], dot_length=k)[0]
    parts = [
        make_cases(unit, kind, cases, seed)
        for kind in kinds
        if kind != "exhaustive" or _small(unit)
    ]

    def joined(name):
        values = [getattr(p, name) for p in parts]
        return None if values[0] is None else np.concatenate(values)

    c_bits = joined("c")
    return (
        joined("a"),
        joined("b"),
        joined("scale_a"),
        joined("scale_b"),
        c_bits,
        unit.c_values(c_bits),
    )


def _small(unit) -> bool:
    from ..golden.cases import EXHAUSTIVE_LIMIT, exhaustive_count
    from ..errors import MxsimError

    try:
        return exhaustive_count(unit) <= EXHAUSTIVE_LIMIT
    except MxsimError:
        return False


def check_unit(
    hw,
    a_format: str,
    b_format: str,
    *,
    k: int | None = None,
    cases: int = 1000,
    seed: int = 0,
    kinds=("random", "corners", "exhaustive"),
    repeat: int = 0,
    build: Path | None = None,
) -> dict:
    """Export, compile and compare one unit: {vectors, mismatches, first mismatch, and with
    ``repeat`` the C model's and mxsim.dot's dot products per second, same run}."""
    config = load_hwconfig(hw) if not hasattr(hw, "params") else hw
    params = config.params(a_format, b_format)
    k = params.block_size if k is None else k
    with tempfile.TemporaryDirectory(dir=build) as tmp:
        model_dir = Path(tmp) / "model"
        manifest = export_c(config, model_dir, a_format, b_format, k)
        model = CModel(model_dir, manifest, Path(tmp))
        a, b, scale_a, scale_b, c_bits, c_values = _cases(
            config, params, a_format, b_format, k, kinds, cases, seed
        )
        expected = np.asarray(
            dot(
                config,
                a,
                b,
                a_format=a_format,
                b_format=b_format,
                scale_a=scale_a,
                scale_b=scale_b,
                c=c_values,
            ),
            dtype=np.uint64,
        )
        got, rates = model.run(a, b, scale_a, scale_b, c_bits, repeat=repeat)
    bad = np.flatnonzero(got != expected)
    result = {
        "config": config.name,
        "pair": f"{a_format}x{b_format}",
        "k": k,
        "vectors": int(len(expected)),
        "mismatches": int(bad.size),
    }
    if bad.size:
        i = int(bad[0])
        result["first"] = {
            "row": i,
            "got": hex(int(got[i])),
            "expected": hex(int(expected[i])),
            "a": [int(x) for x in a[i]],
            "b": [int(x) for x in b[i]],
            "scale_a": None if scale_a is None else [int(x) for x in scale_a[i]],
            "scale_b": None if scale_b is None else [int(x) for x in scale_b[i]],
            "c": hex(int(c_bits[i])),
        }
    if repeat:
        result["c_dots_per_s"] = max(rates)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            dot(
                config,
                a,
                b,
                a_format=a_format,
                b_format=b_format,
                scale_a=scale_a,
                scale_b=scale_b,
                c=c_values,
            )
            best = min(best, time.perf_counter() - start)
        result["mxsim_dots_per_s"] = len(expected) / best
    return result
