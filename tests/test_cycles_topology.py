"""Reading SCALE-Sim topology CSVs as users have them."""

from pathlib import Path

import pytest

from mxsim.cycles.layers import ConvLayer, GemmLayer
from mxsim.cycles.topology import read_scalesim_topology
from mxsim.errors import MxsimError

DATA = Path(__file__).parent / "data" / "scalesim"


def write(tmp_path, text, name="topology.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_sample_conv_file_with_trailing_commas_and_depthwise_split():
    layers = read_scalesim_topology(DATA / "conv_small.csv")
    names = [layer.name for layer in layers]
    # DPConv3 has 4 channels: SCALE-Sim runs it as 4 single-channel layers
    assert names == [
        "Conv1",
        "Conv2",
        "DPConv3Channel_0",
        "DPConv3Channel_1",
        "DPConv3Channel_2",
        "DPConv3Channel_3",
        "Conv4",
        "FC5",
    ]
    assert layers[0] == ConvLayer("Conv1", 12, 12, 3, 3, 3, 8, 2, 2)
    assert layers[2] == ConvLayer("DPConv3Channel_0", 6, 6, 3, 3, 1, 1, 1, 1)


def test_sample_gemm_file():
    layers = read_scalesim_topology(DATA / "gemm_small.csv")
    assert layers[0] == GemmLayer("G1", M=5, N=7, K=3)
    assert layers[-1] == GemmLayer("G5", M=70, N=50, K=130)


def test_rows_without_trailing_comma_and_with_comments(tmp_path):
    # as in SCALE-Sim's mobilnet_paper.csv: a blank line, '#dw' after the comma, a row
    # without the trailing comma, and a tab-indented row
    path = write(
        tmp_path,
        "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,\n"
        "\n"
        "Conv2_dw, 112, 112, 3, 3, 1, 1, 1,#dw\n"
        "Conv11,28,28,1,1,256,256,1\n"
        "\tConv14_dw_0,14,14,3,3,1,1,1,\n",
    )
    layers = read_scalesim_topology(path)
    assert [layer.name for layer in layers] == ["Conv2_dw", "Conv11", "Conv14_dw_0"]
    assert layers[1] == ConvLayer("Conv11", 28, 28, 1, 1, 256, 256, 1, 1)


def test_gemm_without_trailing_comma_and_with_sparsity_column(tmp_path):
    # SCALE-Sim's GEMM_mnk/gpt2.csv has no trailing commas; sparsity/gemm.csv has a ratio
    path = write(tmp_path, "Layer,M,N,K\nQKT,1024,1024,64\n")
    assert read_scalesim_topology(path) == [GemmLayer("QKT", M=1024, N=1024, K=64)]
    path = write(tmp_path, "Layer Name, M, N, K, Sparsity,\nGEMM_1, 3, 5, 16, 3:4,\n")
    assert read_scalesim_topology(path) == [GemmLayer("GEMM_1", M=3, N=5, K=16)]


def test_kind_can_be_forced_when_the_header_is_unusual(tmp_path):
    path = write(tmp_path, "name,rows,cols,depth\nx,2,3,4,\n")
    with pytest.raises(MxsimError, match="cannot tell conv from GEMM"):
        read_scalesim_topology(path)
    assert read_scalesim_topology(path, kind="gemm") == [GemmLayer("x", M=2, N=3, K=4)]


def test_bad_integer_names_file_line_and_column(tmp_path):
    path = write(tmp_path, "Layer, M, N, K,\nA, 1, 2, 3,\nB, 4, five, 6,\n")
    with pytest.raises(MxsimError) as caught:
        read_scalesim_topology(path)
    assert str(caught.value) == f"{path}:3: column 3 (N): expected an integer, got 'five'"


def test_missing_field_names_the_column(tmp_path):
    path = write(
        tmp_path,
        "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,\n"
        "C1, 8, 8, 3, 3, 4,\n",
    )
    with pytest.raises(MxsimError, match=r":2: column 7 \(Num Filter\): missing"):
        read_scalesim_topology(path)


def test_extra_field_is_refused(tmp_path):
    path = write(tmp_path, "Layer, M, N, K,\nA, 1, 2, 3, 4,\n")
    with pytest.raises(MxsimError, match=r":2: column 5: expected an N:M sparsity ratio"):
        read_scalesim_topology(path)


def test_bad_layer_shape_is_located(tmp_path):
    path = write(
        tmp_path,
        "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,\n"
        "C1, 2, 8, 3, 3, 4, 8, 1,\n",
    )
    with pytest.raises(MxsimError, match=r":2: layer 'C1': filter 3x3 is larger than ifmap 2x8"):
        read_scalesim_topology(path)


def test_empty_and_header_only_files(tmp_path):
    with pytest.raises(MxsimError, match="empty topology file"):
        read_scalesim_topology(write(tmp_path, ""))
    with pytest.raises(MxsimError, match="no layers"):
        read_scalesim_topology(write(tmp_path, "Layer, M, N, K,\n\n"))
    with pytest.raises(MxsimError, match="cannot read"):
        read_scalesim_topology(tmp_path / "absent.csv")


def test_non_utf8_file_is_a_clear_error(tmp_path):
    path = tmp_path / "topology.csv"
    path.write_bytes("Layer, M, N, K,\ncaf\u00e9, 1, 2, 3,\n".encode("latin-1"))
    with pytest.raises(
        MxsimError, match=r"cannot read topology file: not UTF-8 text \(byte 0xe9 at offset 19\)"
    ):
        read_scalesim_topology(path)


def test_depthwise_layer_count_is_bounded(tmp_path):
    path = write(
        tmp_path,
        "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, "
        "Strides,\nDPconv, 8, 8, 3, 3, 1000000000, 1, 1,\n",
    )
    with pytest.raises(
        MxsimError,
        match=":2: a depthwise layer of 1000000000 channels would make more than 1000000",
    ):
        read_scalesim_topology(path)


@pytest.mark.parametrize(
    "value, message",
    [
        ("1_000", "expected an integer, got '1_000'"),
        ("\u0661\u0662", "expected an integer, got"),  # Arabic-Indic digits: int() would read 12
        ("1e400", "expected an integer, got '1e400'"),
        ("99999999999999999999", "expected at most 4294967296, got '99999999999999999999'"),
        ("9" * 5000, "expected at most 4294967296, got '9999"),
    ],
)
def test_hostile_dimensions_are_refused_with_a_short_message(tmp_path, value, message):
    path = write(tmp_path, f"Layer, M, N, K,\nfc, {value}, 2, 3,\n")
    with pytest.raises(MxsimError, match=message.replace("(", r"\(")) as caught:
        read_scalesim_topology(path)
    assert len(str(caught.value)) < len(str(path)) + 150
