"""GEMM and conv layers: SCALE-Sim's conv-to-GEMM lowering and the lane grouping."""

import pytest

from mxsim.cycles.layers import ConvLayer, GemmLayer, OperandLayout
from mxsim.errors import MxsimError


def test_conv_lowering_matches_scalesim_formulas():
    # AlexNet conv1 in SCALE-Sim's sample topology: 224x224x3, 11x11 filters, 96 of them,
    # stride 4. Output side = ceil((224 - 11 + 4) / 4) = ceil(54.25) = 55.
    conv = ConvLayer("Conv1", 224, 224, 11, 11, 3, 96, 4, 4)
    assert (conv.ofmap_height, conv.ofmap_width) == (55, 55)
    assert conv.gemm() == GemmLayer("Conv1", M=55 * 55, N=96, K=11 * 11 * 3)
    assert (conv.M, conv.N, conv.K) == (3025, 96, 363)


def test_conv_output_size_with_stride_that_does_not_divide():
    # 12 - 3 + 2 = 11; ceil(11 / 2) = 6 (SCALE-Sim's formula, no padding)
    conv = ConvLayer("c", 12, 12, 3, 3, 3, 8, 2, 2)
    assert (conv.ofmap_height, conv.ofmap_width) == (6, 6)
    # rectangular: height (9 - 2 + 1) / 1 = 8, width (7 - 3 + 1) / 1 = 5
    conv = ConvLayer("r", 9, 7, 2, 3, 5, 6, 1, 1)
    assert (conv.ofmap_height, conv.ofmap_width) == (8, 5)


def test_gemm_reduction_steps_group_k_by_lanes():
    layer = GemmLayer("g", M=4, N=4, K=70)
    assert layer.reduction_steps(1) == 70
    assert layer.reduction_steps(32) == 3  # 32 + 32 + 6
    assert layer.reduction_steps(70) == 1


def test_conv_lanes_never_mix_filter_taps():
    # 3x3 filter over 3 channels: with 4 lanes each of the 9 taps takes one step (3 of 4
    # lanes busy), 9 steps in all -- not ceil(27 / 4) = 7
    conv = ConvLayer("c", 8, 8, 3, 3, 3, 16, 1, 1)
    assert conv.reduction_steps(1) == 27
    assert conv.reduction_steps(4) == 9
    # 40 channels, 32 lanes: 2 steps per tap (32 + 8), 18 steps
    conv = ConvLayer("d", 8, 8, 3, 3, 40, 16, 1, 1)
    assert conv.reduction_steps(32) == 18


def test_operand_layouts():
    gemm = GemmLayer("g", M=5, N=7, K=3)
    assert gemm.ifmap_layout == OperandLayout(5, 3)
    assert gemm.filter_layout == OperandLayout(7, 3)
    assert gemm.ofmap_layout == OperandLayout(5, 7)
    conv = ConvLayer("c", 12, 10, 3, 2, 4, 8, 1, 1)
    assert conv.ifmap_layout == OperandLayout(120, 4)  # pixels x channels, not im2col
    assert conv.filter_layout == OperandLayout(8 * 3 * 2, 4)  # filter taps x channels
    assert conv.ofmap_layout == OperandLayout(10 * 9, 8)


@pytest.mark.parametrize(
    "make",
    [
        lambda: GemmLayer("g", M=0, N=1, K=1),
        lambda: GemmLayer("g", M=1, N=2.5, K=1),
        lambda: ConvLayer("c", 4, 4, 5, 1, 1, 1, 1, 1),  # filter taller than ifmap
        lambda: ConvLayer("c", 4, 4, 1, 1, 1, 1, 0, 1),
    ],
)
def test_bad_dimensions_are_user_errors(make):
    with pytest.raises(MxsimError):
        make()
