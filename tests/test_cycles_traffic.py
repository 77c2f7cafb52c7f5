"""Off-chip bytes per operand, with passes and partial-sum spills, derived by hand.

Most cases use a 64 x 64 x 64 GEMM on an 8 x 8 array: 8 row folds and 8 column folds in
every dataflow. In MXFP8 an operand row of 64 elements is 64 element bytes + 2 scale bytes
(two blocks of 32), so A (64 rows of K) and B (64 rows of K) are each 4096 + 128 = 4224 bytes.
"""

import pytest

from mxsim.datapath.array import ArrayConfig
from mxsim.cycles.compute import fold_schedule
from mxsim.cycles.layers import ConvLayer, GemmLayer
from mxsim.cycles.storage import OperandStorage, StorageBytes, storage_for_format
from mxsim.cycles.traffic import offchip_traffic

GEMM = GemmLayer("g", M=64, N=64, K=64)
BF16 = storage_for_format("bf16")


def traffic(layer=GEMM, a="fp8_e4m3", b="fp8_e4m3", out=BF16, **array_keys):
    array = ArrayConfig(**{"rows": 8, "columns": 8, **array_keys})
    schedule = fold_schedule(array, layer.M, layer.N, layer.reduction_steps(array.lanes_per_unit))
    return offchip_traffic(
        array,
        layer,
        schedule,
        storage_for_format(a),
        storage_for_format(b),
        out if isinstance(out, OperandStorage) else storage_for_format(out),
    )


@pytest.mark.parametrize("dataflow", ["os", "ws", "is"])
def test_everything_fits_so_each_operand_moves_once(dataflow):
    # 64 KiB buffers leave 32 KiB for reuse; A and B (4224 B) fit in every dataflow
    moved = traffic(dataflow=dataflow)
    assert moved.ifmap == StorageBytes(4096, 128)
    assert moved.filter == StorageBytes(4096, 128)
    assert moved.ofmap == StorageBytes(64 * 64 * 2, 0)  # bf16 outputs, no scales
    assert (moved.ifmap_passes, moved.filter_passes, moved.partial_sum_bytes) == (1, 1, 0)
    assert moved.total_bytes == 4224 + 4224 + 8192


def test_scale_traffic_and_packing_per_format():
    fp8, fp4, mx9 = (
        traffic(a="fp8_e4m3", b="fp8_e4m3"),
        traffic(a="fp4_e2m1", b="fp4_e2m1"),
        traffic(a="mx9", b="mx9"),
    )
    # FP4: 64 x 4 bits = 32 element bytes per row, same 2 scale bytes
    assert fp4.ifmap == StorageBytes(64 * 32, 64 * 2)
    # MX9: 8-bit elements; 4 exponents of 8 bits + 32 one-bit microexponents = 8 bytes per row
    assert mx9.ifmap == StorageBytes(64 * 64, 64 * 8)
    assert (fp4.scale_bytes, fp8.scale_bytes, mx9.scale_bytes) == (256, 256, 1024)
    assert (fp4.element_bytes, fp8.element_bytes, mx9.element_bytes) == (12288, 16384, 16384)
    assert fp4.total_bytes < fp8.total_bytes < mx9.total_bytes


def test_os_rereads_a_per_column_fold_when_it_does_not_fit():
    # 4 KiB ifmap buffer leaves 2048 B < 4224 B: A streams again for each of 8 column folds
    moved = traffic(dataflow="os", ifmap_buffer_kib=4)
    assert moved.ifmap_passes == 8
    assert moved.ifmap == StorageBytes(8 * 4096, 8 * 128)


def test_os_rereads_b_per_row_fold_when_one_fold_of_filters_does_not_fit():
    # one column fold needs 8 filters x (64 + 2) B = 528 B
    assert traffic(dataflow="os", filter_buffer_kib=1.5).filter_passes == 1  # 768 B of room
    moved = traffic(dataflow="os", filter_buffer_kib=0.5)  # 256 B of room
    assert moved.filter_passes == 8
    assert moved.filter.total_bytes == 8 * 4224


def test_ws_reads_weights_once_and_streams_a_per_column_fold():
    moved = traffic(dataflow="ws", filter_buffer_kib=0.5, ifmap_buffer_kib=4)
    assert (moved.filter_passes, moved.ifmap_passes) == (1, 8)


def test_is_reads_inputs_once_and_streams_b_per_column_fold():
    # all of B (4224 B) must fit to be reused across the 8 column folds; 8 KiB leaves 4096 B
    moved = traffic(dataflow="is", filter_buffer_kib=8, ifmap_buffer_kib=0.5)
    assert (moved.ifmap_passes, moved.filter_passes) == (1, 8)


def test_ws_partial_sums_spill_when_one_column_fold_does_not_fit():
    # ws: one column fold accumulates M x columns = 64 x 8 partial sums of 4 bytes = 2048 B.
    # A 2 KiB ofmap buffer leaves 1024 B: the sums go out and back after each of the
    # 8 - 1 = 7 extra row folds: 2 x 7 x 64 x 64 x 4 = 229376 bytes.
    moved = traffic(dataflow="ws", ofmap_buffer_kib=2)
    assert moved.partial_sum_spills == 7
    assert moved.partial_sum_bytes == 229376
    assert moved.total_bytes == 4224 + 4224 + 8192 + 229376
    assert traffic(dataflow="ws", ofmap_buffer_kib=4).partial_sum_bytes == 0  # 2048 B of room
    assert traffic(dataflow="ws", ofmap_buffer_kib=2, accumulator_bits=16).partial_sum_bytes == 0
    # odd accumulator width: 2 x 7 x 4096 x 20 bits = 1146880 bits = 143360 bytes
    assert (
        traffic(dataflow="ws", ofmap_buffer_kib=2, accumulator_bits=20).partial_sum_bytes == 143360
    )


def test_is_partial_sums_and_no_spill_with_a_single_row_fold():
    # is: a column fold accumulates columns x N = 8 x 64 partial sums, 2048 B as in ws
    assert traffic(dataflow="is", ofmap_buffer_kib=2).partial_sum_spills == 7
    # K = 8 fits the 8 rows in one fold: nothing to spill however small the buffer
    small_k = GemmLayer("k8", M=64, N=64, K=8)
    assert traffic(small_k, dataflow="is", ofmap_buffer_kib=0.001).partial_sum_bytes == 0
    # os accumulates in place and never spills
    assert traffic(dataflow="os", ofmap_buffer_kib=0.001).partial_sum_bytes == 0


def test_conv_operands_are_stored_as_tensors_not_im2col():
    # 12x12 ifmap, 3 channels, 8 filters of 3x3, stride 2 -> 6x6 outputs.
    # MXFP4 A: 144 pixels x (3 x 4 bits -> 2 bytes, 1 scale byte)
    # MXFP4 B: 8 filters x 9 taps = 72 rows x (2 + 1) bytes
    # fp32 outputs: 36 pixels x 8 filters x 4 bytes
    conv = ConvLayer("c", 12, 12, 3, 3, 3, 8, 2, 2)
    moved = traffic(conv, a="fp4_e2m1", b="fp4_e2m1", out="fp32")
    assert moved.ifmap == StorageBytes(288, 144)
    assert moved.filter == StorageBytes(144, 72)
    assert moved.ofmap == StorageBytes(1152, 0)
