"""The shipped NVIDIA GPU configs against the GPUs' own results (every case, every set)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO
from mxsim import get_format
from mxsim.datapath import as_float, dot, load_hwconfig, matmul
from mxsim.datapath.config import WIDE_FORMATS
from mxsim.datapath.reference import dot_reference
from mxsim.quantize import MXTensor, QuantOptions

TENSOR_CORES = REPO / "tests" / "data" / "gpu-tensor-cores"
FP8 = REPO / "tests" / "data" / "gpu-fp8"
ELEMENT = {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "E4M3": "fp8_e4m3", "E5M2": "fp8_e5m2"}

# (config, data file, input format as named in the data, outputs measured)
DATA_SETS = [
    ("v100", TENSOR_CORES / "V100_fp16.npz", "fp16", ("fp32", "fp16")),
    ("a100", TENSOR_CORES / "A100_fp16.npz", "fp16", ("fp32", "fp16")),
    ("a100", TENSOR_CORES / "A100_bf16.npz", "bf16", ("fp32",)),
    ("a100", TENSOR_CORES / "A100_tf32.npz", "tf32", ("fp32",)),
    ("ada", TENSOR_CORES / "Ada_fp16.npz", "fp16", ("fp32", "fp16")),
    ("ada", TENSOR_CORES / "Ada_bf16.npz", "bf16", ("fp32",)),
    ("ada", TENSOR_CORES / "Ada_tf32.npz", "tf32", ("fp32",)),
    ("ada", TENSOR_CORES / "Ada_E4M3.npz", "E4M3", ("fp32", "fp16")),
    ("h100", TENSOR_CORES / "H100_fp16.npz", "fp16", ("fp32", "fp16")),
    ("h100", TENSOR_CORES / "H100_bf16.npz", "bf16", ("fp32",)),
    ("h100", TENSOR_CORES / "H100_tf32.npz", "tf32", ("fp32",)),
    ("h100", FP8 / "H100_E4M3.npz", "E4M3", ("fp32", "fp16")),
    ("h100", FP8 / "H100_E5M2.npz", "E5M2", ("fp32", "fp16")),
    ("b200", TENSOR_CORES / "B200_fp16.npz", "fp16", ("fp32", "fp16")),
    ("b200", TENSOR_CORES / "B200_bf16.npz", "bf16", ("fp32",)),
    ("b200", TENSOR_CORES / "B200_tf32.npz", "tf32", ("fp32",)),
    ("b200", FP8 / "B200_E4M3.npz", "E4M3", ("fp32", "fp16")),
    ("b200", FP8 / "B200_E5M2.npz", "E5M2", ("fp32", "fp16")),
]
CASES = [(gpu, path, fmt, out) for gpu, path, fmt, outs in DATA_SETS for out in outs]
SIBLINGS = {"a2": "a100", "l40s": "ada", "h200-wgmma": "h100-wgmma"}


def hw(name: str):
    return load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")


def case_id(case) -> str:
    gpu, path, fmt, out = case
    return f"{gpu}-{fmt}-{out}"


def measured(path, fmt: str, out: str):
    """(A codes, B codes, c, expected output bits) of one data set and output."""
    data = np.load(path, allow_pickle=False)
    element = get_format(ELEMENT[fmt])
    a = element.encode(data["a"].view(np.float32))
    b = element.encode(data["b"].view(np.float32))
    # the inputs are exact values of the format: encoding them loses nothing
    assert (element.decode(a) == data["a"].view(np.float32)).all()
    assert (element.decode(b) == data["b"].view(np.float32)).all()
    c = data["c"].view(np.float32)
    if path.parent == FP8 and path.stem.startswith("H100") and out == "fp32":
        c = np.zeros_like(c)  # that measurement ran with c = 0 (the publishers' validation script)
    return a, b, c, data[f"d_{out}"]


def output_bits_as_fp32(bits: np.ndarray, out: str) -> np.ndarray:
    """The data stores fp16 results widened exactly to fp32."""
    return bits if out == "fp32" else as_float(bits, out).astype(np.float32).view(np.uint32)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_measured_case_bit_for_bit(case):
    gpu, path, fmt, out = case
    a, b, c, expected = measured(path, fmt, out)
    assert len(expected) == 5000
    result = dot(hw(gpu), a, b, a_format=ELEMENT[fmt], b_format=ELEMENT[fmt], c=c, out_format=out)
    mismatches = np.flatnonzero(output_bits_as_fp32(result, out) != expected)
    assert mismatches.size == 0, (
        f"{mismatches.size} mismatches, first cases {mismatches[:5].tolist()}"
    )


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_reference_twin_reproduces_a_sample(case):
    # The Fraction twin on every 125th case (40 per set), against the hardware itself.
    gpu, path, fmt, out = case
    a, b, c, expected = measured(path, fmt, out)
    params = hw(gpu).params(ELEMENT[fmt], ELEMENT[fmt], out)
    for row in range(0, len(expected), 125):
        value = dot_reference(params, a[row].tolist(), b[row].tolist(), c=float(c[row]))
        assert np.float32(value).view(np.uint32) == expected[row], f"case {row}"


@pytest.mark.parametrize("sibling, measured_gpu", SIBLINGS.items())
def test_siblings_resolve_to_the_measured_gpu_parameters(sibling, measured_gpu):
    ours, theirs = hw(sibling), hw(measured_gpu)
    assert ours.name == sibling and ours.format_pairs == theirs.format_pairs
    for a_format, b_format in ours.format_pairs:
        for out in WIDE_FORMATS:
            assert ours.params(a_format, b_format, out) == theirs.params(a_format, b_format, out)


@pytest.mark.parametrize("gpu", ["h100", "h200", "b200", "ada", "h100-wgmma"])
def test_fp8_names_are_the_gpu_configs_fp8_paths(gpu):
    fp8, full = hw(f"{gpu}-fp8"), hw(gpu)
    assert fp8.a_formats == fp8.b_formats == ("fp8_e4m3", "fp8_e5m2")
    for a_format in fp8.a_formats:
        for b_format in fp8.b_formats:
            for out in WIDE_FORMATS:
                assert fp8.params(a_format, b_format, out) == full.params(a_format, b_format, out)


@pytest.mark.parametrize("fmt, expected", [("tf32", 1.0), ("fp16", 1.0 + 2.0**-23)])
def test_a100_steps_are_four_tf32_terms_or_eight_fp16_terms(fmt, expected):
    # Only K = 4 was measured for tf32, so the step size rests on the publishers' bench: with
    # 4-term steps the first step's 1 + 2^-24 is rounded toward zero to 1 before the second
    # 2^-24 arrives; one 8-term step keeps both (1 + 2^-23 is an fp32 value).
    element = get_format(fmt)
    a = element.encode(np.array([[1.0, 2.0**-24, 0, 0, 2.0**-24, 0, 0, 0]], dtype=np.float32))
    b = element.encode(np.ones((1, 8), dtype=np.float32))
    assert as_float(dot(hw("a100"), a, b, a_format=fmt, b_format=fmt))[0] == expected


@pytest.mark.parametrize(
    "gpu, expected", [("a100", 1.0), ("h100", 1.0 + 2.0**-23), ("b200", 1.0 + 2.0**-23)]
)
def test_tf32_steps_are_four_terms_on_ampere_and_eight_on_hopper_and_blackwell(gpu, expected):
    # K = 8 tf32 (mma.sync m16n8k8): Ampere's two 4-term steps round 1 + 2^-24 toward zero to 1
    # before the second 2^-24 arrives; Hopper's and Blackwell's one 8-term step keeps both
    # (MMA-Sim's L_max: 32 bytes per step, 8 tf32 elements; tests/test_oracles_mmasim.py).
    element = get_format("tf32")
    a = element.encode(np.array([[1.0, 2.0**-24, 0, 0, 2.0**-24, 0, 0, 0]], dtype=np.float32))
    b = element.encode(np.ones((1, 8), dtype=np.float32))
    assert as_float(dot(hw(gpu), a, b, a_format="tf32", b_format="tf32"))[0] == expected


# --- H200, measured for this project (tests/data/gpu-h200/README.md) -------------------------

H200 = REPO / "tests" / "data" / "gpu-h200"
H200_ELEMENT = {
    "e4m3": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "f16": "fp16",
    "bf16": "bf16",
    "tf32": "tf32",
}
#: The NaN every NVIDIA tensor-core result here has (mxsim writes the canonical quiet NaN).
NVIDIA_NAN = {"fp32": 0x7FFFFFFF, "fp16": 0x7FFF, "bf16": 0x7FFF}


def h200_labels(file: str) -> list[str]:
    with np.load(H200 / file, allow_pickle=False) as data:
        return sorted(key[:-2] for key in data.files if key.endswith("_d"))


def h200_cases(file: str, label: str):
    """(A format, B format, output, A codes (n, K), B codes (n, K), c, output bits) of every
    output of a set's tiles: D[t, i, j] = c[t, i, j] + A[t, i] . B[t, j]."""
    _, a_name, b_name, *rest = label.split("_")
    out = "fp16" if rest[-1] == "f16" else "fp32"
    with np.load(H200 / file, allow_pickle=False) as data:
        a, b, d = data[f"{label}_a"], data[f"{label}_b"], data[f"{label}_d"]
        c = data[f"{label}_c"].view(np.float32)
    tiles, rows, k = a.shape
    cols = b.shape[1]
    a_rows = np.repeat(a[:, :, None, :], cols, axis=2).reshape(-1, k).astype(np.uint64)
    b_rows = np.repeat(b[:, None, :, :], rows, axis=1).reshape(-1, k).astype(np.uint64)
    return (
        H200_ELEMENT[a_name],
        H200_ELEMENT[b_name],
        out,
        a_rows,
        b_rows,
        c.reshape(-1),
        d.reshape(-1),
    )


def assert_gpu_bits(result: np.ndarray, expected: np.ndarray, out: str) -> None:
    """Every output equal, a NaN as NVIDIA writes it on the GPU's side (any NaN on ours)."""
    expected = expected.astype(np.uint64)
    nan = np.isnan(as_float(expected, out))
    assert nan.sum() < 0.5 * len(expected)  # mostly finite arithmetic
    assert (expected[nan] == NVIDIA_NAN[out]).all()
    assert np.isnan(as_float(result[nan], out)).all()
    mismatches = np.flatnonzero(result[~nan] != expected[~nan])
    assert mismatches.size == 0, f"{mismatches.size} of {(~nan).sum()} outputs differ"


H200_SETS = [("h200", "mma.npz", label) for label in h200_labels("mma.npz")] + [
    ("h200-wgmma", "wgmma.npz", label) for label in h200_labels("wgmma.npz")
]


@pytest.mark.parametrize("gpu, file, label", H200_SETS, ids=lambda value: str(value))
def test_h200_measured_outputs_bit_for_bit(gpu, file, label):
    a_format, b_format, out, a, b, c, expected = h200_cases(file, label)
    result = dot(hw(gpu), a, b, a_format=a_format, b_format=b_format, c=c, out_format=out)
    assert_gpu_bits(np.asarray(result).astype(np.uint64), expected, out)


@pytest.mark.parametrize("gpu, file, label", H200_SETS, ids=lambda value: str(value))
def test_h200_reference_twin_reproduces_a_sample(gpu, file, label):
    a_format, b_format, out, a, b, c, expected = h200_cases(file, label)
    params = hw(gpu).params(a_format, b_format, out)
    rows = range(0, len(expected), 331)
    values = [dot_reference(params, a[r].tolist(), b[r].tolist(), c=float(c[r])) for r in rows]
    bits = np.array(values, np.float32 if out == "fp32" else np.float16).view(
        np.uint32 if out == "fp32" else np.uint16
    )
    assert_gpu_bits(bits.astype(np.uint64), expected[list(rows)], out)


def test_h200_fp8_mma_sync_is_not_the_h100_datas_fp32_path():
    # CUDA 13.0 builds mma.sync FP8 on Hopper from fp16 HMMA steps (hwconfigs/h200.yaml): the
    # one 32-term tree in a 13-bit window that fits the H100 data misses most of its outputs.
    a_format, b_format, out, a, b, c, expected = h200_cases("mma.npz", "mma_e4m3_e4m3_f32")
    result = np.asarray(dot(hw("h100"), a, b, a_format=a_format, b_format=b_format, c=c))
    assert (result != expected).mean() > 0.5


def test_h200_is_the_h100_but_for_fp8_with_fp32_output():
    h200, h100 = hw("h200"), hw("h100")
    assert h200.format_pairs == h100.format_pairs
    for a_format, b_format in h200.format_pairs:
        for out in WIDE_FORMATS:
            same = h200.params(a_format, b_format, out) == h100.params(a_format, b_format, out)
            assert same == (a_format not in ("fp8_e4m3", "fp8_e5m2") or out != "fp32")


def gemm_operands(a_codes: np.ndarray, b_codes: np.ndarray, fmt: str = "fp8_e4m3"):
    """A (M, K) and B (K, N) as MXTensors of ``fmt`` with unit block scales (B given by
    columns, (N, K)); the data's codes are stored codes (tf32: fp32 patterns), an MXTensor's
    field codes."""
    element = get_format(fmt)

    def tensor(codes, shape, axis):
        codes = (codes >> element.padding_bits).astype(element.code_dtype)
        scales = np.full((codes.shape[0], codes.shape[1] // 32), 127, np.uint8)
        return MXTensor(element, codes, scales, shape, axis, 32, 0, QuantOptions())

    k = a_codes.shape[1]
    return tensor(a_codes, a_codes.shape, 1), tensor(b_codes, (k, b_codes.shape[0]), 0)


CUBLASLT_SHAPES = ["64x64x32", "64x64x256", "128x128x4096", "1024x1024x1024"]


@pytest.mark.parametrize("shape", CUBLASLT_SHAPES)
@pytest.mark.parametrize(
    "mode, gpu", [("exact", "h200-cublaslt-fp8"), ("fast", "h200-cublaslt-fp8-fast")]
)
def test_h200_cublaslt_gemms_bit_for_bit(shape, mode, gpu):
    # torch._scaled_mm (unit scales, fp32 output), whole GEMMs through mxsim's GEMM routes.
    with np.load(H200 / "cublaslt.npz", allow_pickle=False) as data:
        a, b, expected = data[f"{shape}_a"], data[f"{shape}_b"], data[f"{shape}_{mode}_d"]
    left, right = gemm_operands(a, b)
    result = matmul(hw(gpu), left, right, a_format="fp8_e4m3", b_format="fp8_e4m3")
    assert_gpu_bits(result.bits.astype(np.uint64).reshape(-1), expected.reshape(-1), "fp32")


@pytest.mark.parametrize("shape", CUBLASLT_SHAPES[1:])
def test_h200_cublaslt_default_needs_its_promotion(shape):
    # Without promotion (the fast path's datapath) most outputs of K > 128 differ.
    with np.load(H200 / "cublaslt.npz", allow_pickle=False) as data:
        a, b, expected = data[f"{shape}_a"], data[f"{shape}_b"], data[f"{shape}_exact_d"]
    left, right = gemm_operands(a, b)
    result = matmul(hw("h200-cublaslt-fp8-fast"), left, right)
    assert (result.bits != expected).mean() > 0.5


#: torch._scaled_mm with fp16 and bf16 outputs: (data set, config).
CUBLASLT_NARROW = [
    (f"mm_e4m3{out}_{shape}_{mode}", gpu)
    for out in ("bf16", "f16")
    for shape in ("64x64x256", "256x256x4096")
    for mode, gpu in (("exact", "h200-cublaslt-fp8"), ("fast", "h200-cublaslt-fp8-fast"))
]


@pytest.mark.parametrize("label, gpu", CUBLASLT_NARROW)
def test_h200_cublaslt_narrow_outputs_round_to_nearest_even(label, gpu):
    with np.load(H200 / "cublaslt.npz", allow_pickle=False) as data:
        a, b, expected = data[f"{label}_a"], data[f"{label}_b"], data[f"{label}_d"]
    out = "bf16" if label.startswith("mm_e4m3bf16") else "fp16"
    result = matmul(hw(gpu), *gemm_operands(a, b), out_format=out).bits
    assert_gpu_bits(result.astype(np.uint64).reshape(-1), expected.reshape(-1), out)


#: torch.mm's GEMMs whose K cuBLAS split (its splitK kernels): the length of each part.
CUBLAS_SPLITS = {
    "mm_f16_256x256x4096": 1408,
    "mm_bf16_256x256x4096": 1408,
    "mm_tf32_64x64x256": 32,
    "mm_tf32_128x128x1024": 64,
    "mm_tf32_256x256x4096": 256,
    # F.linear at decoding shapes (1 and 8 tokens): the bias after the parts' reduction
    "mm_f16_1x4096x4096": 1408,
    "mm_f16_8x4096x4096": 1408,
    "mm_bf16_1x4096x4096": 1408,
    "mm_bf16_8x4096x4096": 1408,
}
CUBLAS_OUT = {"f16": "fp16", "bf16": "bf16", "tf32": "fp32"}


def cublas_set(label: str):
    """(A, B, C or bias codes or None, output bits, whether cuBLAS split K) of a torch.mm,
    torch.addmm or F.linear set."""
    with np.load(H200 / "cublas.npz", allow_pickle=False) as data:
        c = data[f"{label}_c"] if f"{label}_c" in data.files else None
        split = any("splitK" in kernel for kernel in data[f"kernels_{label}"])
        return data[f"{label}_a"], data[f"{label}_b"], c, data[f"{label}_d"], split


def cublas_unit(label: str, tmp_path):
    """h200-cublas, or for a GEMM whose K cuBLAS split, the same with its parts as promotions
    (c, where there is one, then starts the outer accumulator)."""
    if label not in CUBLAS_SPLITS:
        return hw("h200-cublas")
    split = tmp_path / "split.yaml"
    split.write_text(
        f"mxsim_hwconfig: 1\nextends: {REPO / 'hwconfigs' / 'h200-cublas.yaml'}\n"
        f"name: split\naccumulator: {{promotion_interval: {CUBLAS_SPLITS[label]}}}\n"
        "overrides: [{accumulator: {c_entry: initial}}]\n"
    )
    return load_hwconfig(split)


def cublas_values(codes, name: str) -> np.ndarray:
    """fp32 values of fp16, bf16 or tf32 codes (exact)."""
    element = get_format(H200_ELEMENT[name])
    return element.decode(codes).astype(np.float32)


CUBLAS_LABELS = h200_labels("cublas.npz")


@pytest.mark.parametrize(
    "label", [label for label in CUBLAS_LABELS if label.split("_")[1] in CUBLAS_OUT]
)
def test_h200_cublas_gemms_bit_for_bit(label, tmp_path):
    # torch.mm in fp16, bf16 and fp32 with TF32 allowed: one accumulation, or cuBLAS's parts
    # of K as promotions (hwconfigs/h200-cublas.yaml)
    name = label.split("_")[1]
    a, b, _, expected, split = cublas_set(label)
    assert split == (label in CUBLAS_SPLITS)
    out = CUBLAS_OUT[name]
    unit = cublas_unit(label, tmp_path)
    result = matmul(unit, *gemm_operands(a, b, H200_ELEMENT[name]), out_format=out).bits
    assert_gpu_bits(result.astype(np.uint64).reshape(-1), expected.reshape(-1), out)


@pytest.mark.parametrize("label", [label for label in CUBLAS_LABELS if "linear" in label])
def test_h200_cublas_bias_is_one_fp32_add_after_the_sum(label, tmp_path):
    # F.linear with a bias: cuBLAS's bias epilogue adds it to the fp32 sum, nearest even
    # (c_entry: end); where cuBLAS split K, after the parts' reduction.
    name = label.split("_")[1].removesuffix("linear")
    a, b, bias, expected, split = cublas_set(label)
    out = CUBLAS_OUT[name]
    c = np.broadcast_to(cublas_values(bias[0], name), expected.shape).copy()
    operands = gemm_operands(a, b, H200_ELEMENT[name])
    if not split:
        result = matmul(hw("h200-cublas"), *operands, c=c, out_format=out).bits
    else:  # the split sum in fp32, then the bias: one add, then the output's rounding
        unit = cublas_unit(label.replace("linear", ""), tmp_path)
        total = matmul(unit, *operands, out_format="fp32").bits.view(np.float32) + c
        result = get_format(out).encode(total.astype(np.float64))
    assert_gpu_bits(result.astype(np.uint64).reshape(-1), expected.reshape(-1), out)


@pytest.mark.parametrize("label", [label for label in CUBLAS_LABELS if "addmm" in label])
def test_h200_cublas_addmm_adds_c_as_documented(label, tmp_path):
    # torch.addmm with a matrix C: without a split, cuBLAS's beta-add epilogue rounds the fp32
    # sum to the output format first and adds C there (two roundings; no config key says
    # this); after a split K, C joins the parts' fp32 reduction last, as the bias does.
    name = label.split("_")[1].removesuffix("addmm")
    a, b, c_codes, expected, split = cublas_set(label)
    out, element = CUBLAS_OUT[name], get_format(CUBLAS_OUT[name])
    c = cublas_values(c_codes, name).astype(np.float64)
    unit = cublas_unit(label.replace("addmm", ""), tmp_path)
    total = matmul(unit, *gemm_operands(a, b, H200_ELEMENT[name]), out_format="fp32").bits
    total = total.view(np.float32).astype(np.float64)
    if split:
        result = element.encode((total + c).astype(np.float32).astype(np.float64))
    else:
        result = element.encode(element.decode(element.encode(total)) + c)
    assert_gpu_bits(result.astype(np.uint64).reshape(-1), expected.reshape(-1), out)
