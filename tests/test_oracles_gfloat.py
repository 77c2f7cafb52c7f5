"""gfloat's MX block quantizer run live against mxsim's ``gfloat`` profile.

``gfloat.block.quantize_block`` with ``compute_scale_amax`` (its OCP MX recipe: floor of a
float log2 of amax, scale clipped to 2^-127..2^127, elements rounded ties-to-even with
saturation) for every OCP element format, one block per call as gfloat works, compared bit
for bit (float64 values) with ``mxsim.fake_quantize(profile="gfloat")`` on corner and
realistic rows. gfloat raises on NaN for formats without NaN, so those get finite inputs.
Needs the ``oracles`` extra; skipped without it, failed instead when CI is set.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import bit_mismatches, import_or_skip, oracle_inputs

import mxsim

BLOCK = 32
GFLOAT_FORMATS = {
    "fp8_e4m3": "format_info_ocp_e4m3",
    "fp8_e5m2": "format_info_ocp_e5m2",
    "fp6_e3m2": "format_info_ocp_e3m2",
    "fp6_e2m3": "format_info_ocp_e2m3",
    "fp4_e2m1": "format_info_ocp_e2m1",
    "int8": "format_info_ocp_int8",
}


@pytest.fixture(scope="module")
def gfloat_quantize():
    formats = import_or_skip("gfloat.formats", "oracles")
    block = import_or_skip("gfloat.block", "oracles")

    def run(x: np.ndarray, element: str) -> np.ndarray:
        info = block.BlockFormatInfo(
            element, getattr(formats, GFLOAT_FORMATS[element]), BLOCK, formats.format_info_ocp_e8m0
        )
        blocks = x.reshape(-1, BLOCK)
        out = np.stack(
            [block.quantize_block(info, row, block.compute_scale_amax) for row in blocks]
        )
        return out.reshape(x.shape)

    return run


@pytest.mark.parametrize("element", list(GFLOAT_FORMATS))
def test_quantize_block_matches_profile(gfloat_quantize, element):
    has_nan = mxsim.formats.get_format(element).has_nan
    x = oracle_inputs(seed=60, rows=48, cols=64, nonfinite=has_nan)
    if not has_nan:  # Inf is fine (scale 2^127, the Inf element saturates); NaN raises in gfloat
        x[::7, 3] = np.inf
    got = gfloat_quantize(x, element)
    want = mxsim.fake_quantize(x, element, axis=1, block_size=BLOCK, profile="gfloat")
    mismatches, examples = bit_mismatches(want, got)
    assert mismatches == 0, (element, mismatches, examples)
