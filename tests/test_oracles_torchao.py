"""torchao's ``to_mx`` and NVFP4 (prototype mx_formats, eager on CPU) run live against mxsim.

FLOOR against ``torchao``, RCEIL against ``torchao-rceil``, CEIL and EVEN against ``torchao``
with that ``scale_rule`` (the readings of :mod:`mxsim.capture.torch_torchao`): the E8M0 scale byte of every
block, the element codes of every block whose scale is not NaN, and the float32 values of
torchao's own ``to_dtype`` against ``MXTensor.dequantize(np.float32)``, bit for bit, on
corner and realistic rows (``oracle_inputs`` in conftest). NVFP4 (``NVFP4Tensor.to_nvfp4``,
single-level and with the per-tensor scale) against ``mxsim.quantize.nvfp4``: UE4M3 scale
bytes, E2M1 codes and torchao's float32 ``dequantize``, bit for bit. Needs the ``oracles`` extra;
skipped without it, failed instead when the CI environment variable is set.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import bit_mismatches, import_or_skip, oracle_inputs

import mxsim
from mxsim.capture.torch_torchao import SCALE_MODE_PROFILES
from mxsim.quantize.nvfp4 import quantize_nvfp4, tensor_scale_from_amax

X = oracle_inputs(seed=50, rows=128, cols=96)
ELEMENTS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1"]  # torchao has no MXINT8


@pytest.fixture(scope="module")
def torchao_mx(torch):
    mx_tensor = import_or_skip("torchao.prototype.mx_formats.mx_tensor", "oracles")
    config = import_or_skip("torchao.prototype.mx_formats.config", "oracles")
    kernels = import_or_skip("torchao.prototype.mx_formats.kernels", "oracles")
    dtypes = {
        "fp8_e4m3": torch.float8_e4m3fn,
        "fp8_e5m2": torch.float8_e5m2,
        "fp6_e3m2": "fp6_e3m2",
        "fp6_e2m3": "fp6_e2m3",
        "fp4_e2m1": torch.float4_e2m1fn_x2,
    }

    def run(x: np.ndarray, element: str, block_size: int, mode: str):
        """(scale bytes, element codes, dequantized float32) from torchao."""
        elem_dtype = dtypes[element]
        scale, data = mx_tensor.to_mx(
            torch.from_numpy(x), elem_dtype, block_size, config.ScaleCalculationMode(mode)
        )
        values = mx_tensor.to_dtype(data, scale, elem_dtype, block_size, torch.float32).numpy()
        codes = data.view(torch.uint8)
        if element == "fp4_e2m1":
            codes = kernels.unpack_uint4(codes)
        return (
            scale.view(torch.uint8).numpy().reshape(x.shape[0], -1),
            codes.numpy().reshape(x.shape),
            values,
        )

    return run


@pytest.mark.parametrize("block_size", [32, 16])
@pytest.mark.parametrize("mode", list(SCALE_MODE_PROFILES))
@pytest.mark.parametrize("element", ELEMENTS)
def test_to_mx_matches_profile(torchao_mx, element, mode, block_size):
    """Each torchao scaling mode against the profile and options capture reads it as."""
    profile, options = SCALE_MODE_PROFILES[mode]
    scales, codes, values = torchao_mx(X, element, block_size, mode)
    tensor = mxsim.quantize_mx(
        X, element, axis=1, block_size=block_size, profile=profile, **options
    )
    got_scales = tensor.scales.reshape(scales.shape)
    assert int((got_scales != scales).sum()) == 0, np.argwhere(got_scales != scales)[:5]
    finite_scale = np.repeat(scales != 0xFF, block_size, axis=1)  # a NaN block's codes are free
    code_mismatches = (tensor.codes.reshape(codes.shape) != codes) & finite_scale
    assert int(code_mismatches.sum()) == 0, np.argwhere(code_mismatches)[:5]
    with np.errstate(over="ignore"):
        mismatches, examples = bit_mismatches(tensor.dequantize(np.float32), values)
    assert mismatches == 0, (element, mode, mismatches, examples)


def test_inputs_reach_the_corners_this_test_needs(torchao_mx):
    # Scale code 0 (quantized against 2^-126 or unscaled), Inf blocks, NaN blocks, and
    # blocks at float32's top binade must all be present for the comparison to mean much.
    scales, _, _ = torchao_mx(X, "fp8_e4m3", 32, "floor")
    assert {0, 0xFF, 247}.issubset(set(np.unique(scales).tolist()))  # 247: Inf read as 2^128
    assert (scales == 254 - 8).any()  # amax in float32's largest binade: X = 127 - 8


# --- NVFP4 ------------------------------------------------------------------------------------

X_NVFP4 = oracle_inputs(seed=51, rows=128, cols=96)
X_NVFP4[np.isnan(X_NVFP4)] = 1.5  # NaN has no NVFP4 code (refused by mxsim, garbage in torchao)
X_NVFP4[:16, :16] = 0.0  # all-zero blocks of both signs
X_NVFP4[16:32, :16] = -0.0


@pytest.fixture(scope="module")
def torchao_nvfp4(torch):
    nvfp4 = import_or_skip("torchao.prototype.mx_formats.nvfp4_tensor", "oracles")
    kernels = import_or_skip("torchao.prototype.mx_formats.kernels", "oracles")

    def run(x: np.ndarray, tensor_scale: float | None):
        """(UE4M3 scale bytes, E2M1 codes, dequantized float32) from torchao."""
        t = None if tensor_scale is None else torch.tensor(tensor_scale, dtype=torch.float32)
        tensor = nvfp4.NVFP4Tensor.to_nvfp4(torch.from_numpy(x), per_tensor_scale=t)
        codes = (
            kernels.unpack_uint4(tensor.qdata.contiguous().view(torch.uint8))
            .numpy()
            .reshape(x.shape)
        )
        return (
            tensor.scale.view(torch.uint8).numpy(),
            codes,
            tensor.dequantize(torch.float32).numpy(),
        )

    return run


@pytest.mark.parametrize("two_level", [False, True])
def test_nvfp4_matches_torchao(torchao_nvfp4, two_level):
    finite = np.abs(X_NVFP4[np.isfinite(X_NVFP4)])
    tensor_scale = None
    if (
        two_level
    ):  # the recipe's scale, and one chosen from the realistic rows' amax (corners clamp)
        tensor_scale = tensor_scale_from_amax(finite.max())
    rows = [X_NVFP4, X_NVFP4[128:]] if two_level else [X_NVFP4]
    scales_per = (
        [tensor_scale, tensor_scale_from_amax(np.abs(X_NVFP4[128:]).max())] if two_level else [None]
    )
    compared = 0
    for x, t in zip(rows, scales_per):
        scales, codes, values = torchao_nvfp4(x, t)
        tensor = quantize_nvfp4(x, t)
        assert int((tensor.scales != scales.reshape(tensor.scales.shape)).sum()) == 0
        assert int((tensor.codes != codes).sum()) == 0, np.argwhere(tensor.codes != codes)[:5]
        mismatches, examples = bit_mismatches(tensor.dequantize(), values)
        assert mismatches == 0, (two_level, mismatches, examples)
        compared += x.size
    assert compared >= X_NVFP4.size


def test_nvfp4_inputs_reach_the_corners(torchao_nvfp4):
    # clamped-low scales (2^-6; the recipe never makes a subnormal scale), saturated scales
    # (448, from Inf or large amax), many scales under the tensor scale, and saturated
    # elements must all occur.
    scales, codes, _ = torchao_nvfp4(X_NVFP4, None)
    assert {0x08, 0x7E}.issubset(set(np.unique(scales).tolist()))
    t = tensor_scale_from_amax(np.abs(X_NVFP4[128:]).max())
    scales, _, _ = torchao_nvfp4(X_NVFP4[128:], t)
    assert len(np.unique(scales)) > 40
    assert ((codes & 0x7) == 7).any()  # elements at ±6
