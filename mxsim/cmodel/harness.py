"""Compile an exported C model with the system C compiler and run it on arrays of codes
(the equality tests and the benchmark use this; docs/cmodel.md).

The harness reads vectors from a binary file (per vector: k A codes, k B codes, the scale
codes of A and of B, c: all little-endian uint64) and writes one uint64 result per vector;
with a repeat count it times the model's loop with the C clock and prints dot products per
second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..errors import MxsimError

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "{name}.h"
int main(int argc, char **argv) {{
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    long n = atol(argv[3]), repeat = argc > 4 ? atol(argv[4]) : 0, i, r;
    int k = {k}, blocks = {blocks}, j;
    size_t per = (size_t)(2 * k + 2 * blocks + 1);
    uint64_t *v = malloc(per * (size_t)n * 8 + 8), *res = malloc((size_t)n * 8 + 8);
    uint32_t sa[{blocks} + 1], sb[{blocks} + 1];
    if (!in || !out || !v || !res || fread(v, 8, per * (size_t)n, in) != per * (size_t)n) return 2;
    for (r = 0; r <= repeat; r++) {{
        clock_t start = clock();
        for (i = 0; i < n; i++) {{
            uint64_t *x = v + per * (size_t)i;
            int error = 0;
            for (j = 0; j < blocks; j++) {{ sa[j] = (uint32_t)x[2 * k + j]; sb[j] = (uint32_t)x[2 * k + blocks + j]; }}
            res[i] = {name}_dot(x, x + k, sa, sb, x[2 * k + 2 * blocks], k, NULL, &error);
            if (error) return 3;
        }}
        if (repeat && r > 0) printf("%.6g\n", (double)n / ((double)(clock() - start) / CLOCKS_PER_SEC));
    }}
    fwrite(res, 8, (size_t)n, out);
    return 0;
}}
"""


def compiler() -> str | None:
    """The system C compiler (``$CC``, else cc or gcc), or None."""
    for candidate in (os.environ.get("CC"), "cc", "gcc"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


class CModel:
    """An exported model compiled into a harness executable in ``build`` (a directory)."""

    def __init__(self, model_dir: Path, manifest: dict, build: Path):
        cc = compiler()
        if cc is None:
            raise MxsimError("no C compiler found (set CC, or install gcc)")
        name = manifest["c_function"][: -len("_dot")]
        self.k = manifest["k"]
        self.blocks = -(-self.k // manifest["block_size"]) if manifest["scaled"] else 0
        self.scale_blocks = -(
            -self.k // manifest["block_size"]
        )  # the C API reads one code per block
        main = build / "harness.c"
        main.write_text(
            HARNESS.format(name=name, k=self.k, blocks=self.scale_blocks), encoding="utf-8"
        )
        self.exe = build / "harness"
        subprocess.run(
            [
                cc,
                "-std=c99",
                "-O2",
                "-Wall",
                "-Werror",
                "-I",
                str(model_dir),
                "-o",
                str(self.exe),
                str(main),
                str(model_dir / f"{name}.c"),
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.build = build

    def run(self, a, b, scale_a, scale_b, c, repeat: int = 0) -> tuple[np.ndarray, list[float]]:
        """(results as uint64, dot products per second of each timed repeat) for rows of codes."""
        n = a.shape[0]
        if scale_a is None:
            scale_a = scale_b = np.zeros((n, self.scale_blocks), dtype=np.uint64)
        rows = np.concatenate(
            [np.asarray(x, dtype=np.uint64).reshape(n, -1) for x in (a, b, scale_a, scale_b, c)],
            axis=1,
        )
        with tempfile.TemporaryDirectory(dir=self.build) as tmp:
            source, target = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
            rows.astype("<u8").tofile(source)
            done = subprocess.run(
                [str(self.exe), str(source), str(target), str(n), str(repeat)],
                capture_output=True,
                text=True,
                timeout=3600,
            )
            if done.returncode:
                raise MxsimError(
                    f"C model harness failed (exit {done.returncode}): {done.stderr.strip()[:200]}"
                )
            rates = [float(line) for line in done.stdout.split()]
            return np.fromfile(target, dtype="<u8"), rates
