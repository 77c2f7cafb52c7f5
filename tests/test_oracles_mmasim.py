"""MMA-Sim run live against the NVIDIA tensor-core and AMD matrix-core configs, bit for bit.

MMA-Sim (``mmasim``, Xie et al., "MMA-Sim: Bit-Accurate Reference Model of Tensor Cores and
Matrix Cores", arXiv 2511.10909) models each NVIDIA architecture's ``mma``, ``wgmma`` and
``tcgen05.mma`` instructions and each AMD CDNA architecture's ``v_mfma`` instructions in
PyTorch, validated by its authors on the GPUs. Every family below (architecture x
instruction x input types x output type; every AMD one but f64) runs the same element codes
and c through MMA-Sim's ``dpa`` (one instruction: K = the shape's k) and through
``mxsim.dot`` with the family's config, and the output bits must agree (any NaN equals any
NaN: MMA-Sim's NaN payload 0x7FFFFFFF is not modelled). A sample also runs through the
Fraction twin (``mxsim.datapath.reference``).

Inputs: mostly realistic rows (normal values of one random magnitude per row, c of the sum's
size), a quarter corner rows (zeros of both signs, exact cancellation, subnormal elements and
c, tiny products below the zero-term exponent, near-overflow, uniformly random codes, Inf and
NaN). The fp64 families (NVIDIA mma .f64, AMD f64 MFMA: MMA-Sim's FMA chain) and those whose c
has another format than d (Volta's m8n8k4 with f16 c) run the same way.
The FMA chains (fp64 mma and MFMA, AMD fp32 MFMA) also run rows made to meet exact zeros of
both signs step after step (``output.zero_sign: ieee_steps``).
``MXSIM_MMASIM_ROWS`` sets the rows per family (default 192; docs/gpu-oracles.md reports a run of 1024).
Needs the ``oracles`` extra; skipped without it, failed instead when CI is set.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from conftest import REPO, import_or_skip

from mxsim import get_format
from mxsim.datapath import dot, load_hwconfig
from mxsim.datapath.reference import dot_reference

ROWS = int(os.environ.get("MXSIM_MMASIM_ROWS", "192"))
TWIN_ROWS = 6  # rows of each family also run through the Fraction twin
PTX_FORMATS = {
    "f16": "fp16",
    "bf16": "bf16",
    "tf32": "tf32",
    "e4m3": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "e3m2": "fp6_e3m2",
    "e2m3": "fp6_e2m3",
    "e2m1": "fp4_e2m1",
    "f32": "fp32",
    "f64": "fp64",
}
F8F6F4 = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
FP8 = ("e4m3", "e5m2")


def _mma(shape: str, d: str, a: str, b: str, c: str, kind: str = "") -> str:
    kind = f".kind::{kind}" if kind else ""
    return f"{shape}{kind}.{d}.{a}.{b}.{c}"


def _families():
    """(arch, instruction class, PTX shape and types, config, a format, b format, output)."""
    out = []

    def add(arch, op, ptx, config, a, b, d):
        out.append((arch, op, ptx, config, PTX_FORMATS[a], PTX_FORMATS[b], PTX_FORMATS[d]))

    def sm80(arch, config):  # the Ampere shapes every later architecture keeps
        for d in ("f32", "f16"):
            add(arch, "MMA", _mma("m16n8k16", d, "f16", "f16", d), config, "f16", "f16", d)
            add(arch, "MMA", _mma("m16n8k8", d, "f16", "f16", d), config, "f16", "f16", d)
        for shape in ("m16n8k16", "m16n8k8"):
            add(
                arch,
                "MMA",
                _mma(shape, "f32", "bf16", "bf16", "f32"),
                config,
                "bf16",
                "bf16",
                "f32",
            )
        for shape in ("m16n8k8", "m16n8k4"):
            add(
                arch,
                "MMA",
                _mma(shape, "f32", "tf32", "tf32", "f32"),
                config,
                "tf32",
                "tf32",
                "f32",
            )

    def fp8_pairs(arch, op, shape, config, types=FP8, kind=""):
        for d in ("f32", "f16"):
            for a in types:
                for b in types:
                    # mma names C's type last; wgmma and tcgen05 take C in D's type
                    ptx = (
                        _mma(shape, d, a, b, d, kind)
                        if op == "MMA"
                        else _mma(shape, d, a, b, "", kind)[:-1]
                    )
                    add(arch, op, ptx, config, a, b, d)

    for d in ("f32", "f16"):
        add("Volta", "MMA", _mma("m8n8k4", d, "f16", "f16", d), "v100", "f16", "f16", d)
        add("Turing", "MMA", _mma("m16n8k8", d, "f16", "f16", d), "t4", "f16", "f16", d)
        add(
            "Turing", "MMA", _mma("m8n8k4", d, "f16", "f16", d), "v100", "f16", "f16", d
        )  # Volta's path
    for arch in ("Volta", "Turing"):  # c in f16 beside an f32 d: inputs.c_format fp16
        add(arch, "MMA", _mma("m8n8k4", "f32", "f16", "f16", "f16"), "v100", "f16", "f16", "f32")
    sm80("Ampere", "a100")
    sm80("Ada Lovelace", "ada")
    for shape in ("m16n8k32", "m16n8k16"):
        fp8_pairs("Ada Lovelace", "MMA", shape, "ada")
    sm80("Hopper", "h100")
    for d in ("f32", "f16"):
        add("Hopper", "WGMMA", f"m64n8k16.{d}.f16.f16", "h100-wgmma", "f16", "f16", d)
    add("Hopper", "WGMMA", "m64n8k16.f32.bf16.bf16", "h100-wgmma", "bf16", "bf16", "f32")
    add("Hopper", "WGMMA", "m64n8k8.f32.tf32.tf32", "h100-wgmma", "tf32", "tf32", "f32")
    fp8_pairs("Hopper", "WGMMA", "m64n8k32", "h100-wgmma")
    sm80("Blackwell", "b200")
    add(
        "Blackwell",
        "TCGen05MMA",
        "m64n8k8.kind::tf32.f32.tf32.tf32",
        "b200-tcgen05",
        "tf32",
        "tf32",
        "f32",
    )
    for ab in ("f16", "bf16"):
        add(
            "Blackwell",
            "TCGen05MMA",
            f"m64n8k16.kind::f16.f32.{ab}.{ab}",
            "b200-tcgen05",
            ab,
            ab,
            "f32",
        )
    add(
        "Blackwell",
        "TCGen05MMA",
        "m64n8k16.kind::f16.f16.f16.f16",
        "b200-tcgen05",
        "f16",
        "f16",
        "f16",
    )
    fp8_pairs("Blackwell", "TCGen05MMA", "m64n8k32", "b200-tcgen05", F8F6F4, "f8f6f4")
    sm80("RTX Blackwell", "rtx50")
    for shape in ("m16n8k32", "m16n8k16"):
        fp8_pairs("RTX Blackwell", "MMA", shape, "rtx50")
    fp8_pairs("RTX Blackwell", "MMA", "m16n8k32", "rtx50", F8F6F4, "f8f6f4")
    return out


FAMILIES = _families()

# AMD v_mfma_f32_* instructions as MMA-Sim names them (mmasim/amd/isa_mfma.py), by input type.
CDNA1_MFMA = {
    "fp32": (
        "f32_32x32x2f32",
        "f32_32x32x1f32",
        "f32_16x16x4f32",
        "f32_16x16x1f32",
        "f32_4x4x1f32",
    ),
    "fp16": (
        "f32_32x32x8f16",
        "f32_32x32x4f16",
        "f32_16x16x16f16",
        "f32_16x16x4f16",
        "f32_4x4x4f16",
    ),
    "bf16": (
        "f32_32x32x4bf16",
        "f32_32x32x2bf16",
        "f32_16x16x8bf16",
        "f32_16x16x2bf16",
        "f32_4x4x2bf16",
    ),
}
CDNA2_BF16_1K = (
    "f32_32x32x8bf16_1k",
    "f32_32x32x4bf16_1k",
    "f32_16x16x16bf16_1k",
    "f32_16x16x4bf16_1k",
    "f32_4x4x4bf16_1k",
)
CDNA3_MFMA = {
    "fp32": (
        "f32_32x32x1_2b_f32",
        "f32_16x16x1_4b_f32",
        "f32_4x4x1_16b_f32",
        "f32_32x32x2_f32",
        "f32_16x16x4_f32",
    ),
    "tf32": ("f32_16x16x8_xf32", "f32_32x32x4_xf32"),
    "fp16": (
        "f32_32x32x4_2b_f16",
        "f32_16x16x4_4b_f16",
        "f32_4x4x4_16b_f16",
        "f32_32x32x8_f16",
        "f32_16x16x16_f16",
    ),
    "bf16": (
        "f32_32x32x4_2b_bf16",
        "f32_16x16x4_4b_bf16",
        "f32_4x4x4_16b_bf16",
        "f32_32x32x8_bf16",
        "f32_16x16x16_bf16",
    ),
}
AMD_FP8 = {"fp8": "fp8_e4m3fnuz", "bf8": "fp8_e5m2fnuz"}


def _amd_families():
    """(arch, instruction suffix, config, a format, b format); every output is fp32."""
    out = []
    for fmt, suffixes in CDNA1_MFMA.items():
        out += [("CDNA1", suffix, "mi100", fmt, fmt) for suffix in suffixes]
    cdna2 = {
        "fp32": "mi250-fp32",
        "fp16": "mi250",
        "bf16": "mi250-bf16-legacy",
    }  # bf16 without _1k: 2 per add
    for fmt, suffixes in CDNA1_MFMA.items():
        out += [("CDNA2", suffix, cdna2[fmt], fmt, fmt) for suffix in suffixes]
    out += [("CDNA2", suffix, "mi250", "bf16", "bf16") for suffix in CDNA2_BF16_1K]
    for fmt, suffixes in CDNA3_MFMA.items():
        out += [("CDNA3", suffix, "mi300", fmt, fmt) for suffix in suffixes]
    for shape in ("16x16x32", "32x32x16"):
        out += [
            ("CDNA3", f"f32_{shape}_{a}_{b}", "mi300", AMD_FP8[a], AMD_FP8[b])
            for a in AMD_FP8
            for b in AMD_FP8
        ]
    return out


AMD_FAMILIES = _amd_families()


def family_id(family) -> str:
    arch, op, ptx, config, *_ = family
    return f"{config}-{op.lower()}-{ptx}"


def c_format_of(family) -> str:
    """The format of c: mma names its type last (Volta's m8n8k4 takes f16 c beside an f32
    d); wgmma and tcgen05 take c in d's type."""
    _, op, ptx, _, _, _, out_name = family
    return PTX_FORMATS[ptx.split(".")[-1]] if op == "MMA" else out_name


@pytest.fixture(scope="module")
def nv_ptx():
    import_or_skip("torch", "oracles")
    return import_or_skip("mmasim.nv_ptx", "oracles")


# --- inputs -------------------------------------------------------------------------------------


def random_finite_codes(rng, fmt, n: int) -> np.ndarray:
    """``n`` codes drawn uniformly from the format's finite codes (every exponent alike)."""
    dtype = np.uint64 if fmt.bits == 64 else np.int64
    codes = np.zeros(0, dtype=dtype)
    while codes.size < n:
        draw = rng.integers(0, 1 << fmt.field_bits, 2 * n + 8, dtype=dtype) << dtype(
            fmt.padding_bits
        )
        codes = np.concatenate([codes, draw[np.isfinite(fmt.decode(draw))]])
    return codes[:n]


def _encode(fmt, values) -> np.ndarray:
    """Codes as int64 (uint64 for 64-bit formats, whose codes reach 2^64)."""
    return fmt.encode(np.asarray(values, dtype=np.float64)).astype(
        np.uint64 if fmt.bits == 64 else np.int64
    )


def _special_codes(fmt) -> np.ndarray:
    values = [np.inf, -np.inf, np.nan] if fmt.has_inf else [np.nan] if fmt.has_nan else []
    return (
        _encode(fmt, values)
        if values
        else np.zeros(0, dtype=np.uint64 if fmt.bits == 64 else np.int64)
    )


def make_inputs(
    seed: int, rows: int, k: int, a_name: str, b_name: str, out_name: str, c_name: str | None = None
):
    """(A codes, B codes, c): realistic rows, a quarter of them corners (see the module
    docstring), every row a valid input of the formats: c a value of ``c_name`` (default:
    the output format) and of the output format, as float32 (float64 for fp64)."""
    rng = np.random.default_rng(seed)
    fa, fb, out = get_format(a_name), get_format(b_name), get_format(out_name)
    magnitude = rng.integers(-6, 7, (rows, 1)).astype(np.float64)
    a = _encode(fa, rng.standard_normal((rows, k)) * 2.0**magnitude)
    b = _encode(
        fb,
        rng.standard_normal((rows, k)) * 2.0 ** -rng.integers(-2, 3, (rows, 1)).astype(np.float64),
    )
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.sum(fa.decode(a) * fb.decode(b), axis=1)
        c = rng.standard_normal(rows) * (np.abs(total) + 2.0 ** magnitude[:, 0])
    kinds = ("zeros", "cancel", "subnormal", "tiny", "overflow", "codes", "special", "c_far")
    for row in range(3, rows, 4):
        kind = kinds[(row // 4) % len(kinds)]
        if kind == "zeros":  # signed zeros; some rows all zero
            zeros = _encode(fa, np.where(rng.random(k) < 0.5, -0.0, 0.0))
            pick = rng.random(k) < (0.5 if rng.random() < 0.5 else 1.0)
            a[row, pick] = zeros[pick]
            c[row] = -0.0 if rng.random() < 0.5 else (0.0 if rng.random() < 0.5 else c[row])
        elif kind == "cancel":  # the second half negates the first: an exact zero sum
            half = k // 2
            a[row, half : 2 * half] = a[row, :half]
            b[row, half : 2 * half] = _encode(fb, -fb.decode(b[row, :half]))
            if k % 2:  # odd K (K = 1 included): the last product is zero
                a[row, -1] = _encode(fa, [0.0])[0]
            c[row] = (-0.0 if rng.random() < 0.5 else 0.0) if rng.random() < 0.7 else c[row]
        elif kind == "subnormal":  # subnormal elements and a subnormal (or tiny) c
            for fmt, codes in ((fa, a), (fb, b)):
                tiny = rng.random(k) * fmt.min_normal * np.where(rng.random(k) < 0.5, -1, 1)
                pick = rng.random(k) < 0.6
                codes[row, pick] = _encode(fmt, tiny)[pick]
            c_fmt = get_format(
                c_name or out_name
            )  # a subnormal of c's own format (fp16 c beside fp32 d)
            c[row] = (
                rng.random()
                * c_fmt.min_normal
                * (1 if rng.random() < 0.5 else -1)
                * 2.0 ** -float(rng.integers(0, 8))
            )
        elif kind == "tiny":  # products far below c's zero: the zero-term exponent decides
            target = out.min_normal * 2.0 ** -float(rng.integers(0, 30))
            a[row] = _encode(fa, rng.standard_normal(k) * np.sqrt(target))
            b[row] = _encode(fb, rng.standard_normal(k) * np.sqrt(target))
            c[row] = 0.0 if rng.random() < 0.6 else target * rng.standard_normal()
        elif kind == "overflow":  # near the largest values, one sign
            sign = 1.0 if rng.random() < 0.5 else -1.0
            with np.errstate(over="ignore"):
                largest = fa.max_finite * fb.max_finite * k
            shrink = min(
                1.0,
                4 * out.max_finite / largest
                if np.isfinite(largest)  # fp64: beyond float64
                else 4 * out.max_finite / fa.max_finite / fb.max_finite / k,
            )
            a[row] = _encode(fa, sign * fa.max_finite * rng.uniform(0.5, 1.0, k))
            b[row] = _encode(fb, fb.max_finite * rng.uniform(0.5, 1.0, k) * shrink)
            c[row] = sign * out.max_finite * rng.uniform(0.0, 1.0)
        elif kind == "codes":  # uniformly random finite codes: every exponent
            a[row] = random_finite_codes(rng, fa, k)
            b[row] = random_finite_codes(rng, fb, k)
            c[row] = out.decode(random_finite_codes(rng, out, 1))[0]
        elif kind == "special":  # an Inf or NaN element, or c
            specials = _special_codes(fa)
            if specials.size and rng.random() < 0.7:
                a[row, rng.integers(k)] = rng.choice(specials)
            else:
                c[row] = rng.choice([np.inf, -np.inf, np.nan])
        else:  # c far above or below the products
            c[row] = total[row] * 2.0 ** float(rng.choice([-40, -25, 25, 40])) + (
                2.0**-20 if total[row] == 0 else 0.0
            )
    for fmt in (get_format(c_name or out_name), out):
        c = fmt.decode(fmt.encode(c, overflow="inf_nan" if fmt.has_inf else "saturate"))
    return a, b, c.astype(np.float64 if out.bits == 64 else np.float32)


# --- the two sides ------------------------------------------------------------------------------


def _torch_operand(torch, codes: np.ndarray, ptx: str):
    """Element codes as the tensor MMA-Sim reads: the format's dtype over the same bits; FP6
    in bits 5:0 and FP4 in bits 5:2 of a uint8."""
    if ptx in ("e3m2", "e2m3"):
        return torch.from_numpy(codes.astype(np.uint8))
    if ptx == "e2m1":
        return torch.from_numpy((codes << 2).astype(np.uint8))
    dtype = {
        "f16": torch.float16,
        "bf16": torch.bfloat16,
        "tf32": torch.float32,
        "e4m3": torch.float8_e4m3fn,
        "e5m2": torch.float8_e5m2,
        "f64": torch.float64,
    }[ptx]
    return _torch_view(torch, codes, dtype)


def _ptx_types(ptx: str) -> tuple[str, str, str]:
    """(d, a, b) PTX type names of a shape-and-type string."""
    fields = [f for f in ptx.split(".") if not f.startswith("m") and not f.startswith("kind::")]
    return fields[0], fields[1], fields[2]


def mmasim_bits(nv_ptx, family, a, b, c) -> np.ndarray:
    import torch

    arch, op_name, ptx, _, _, _, out_name = family
    op = getattr(nv_ptx, op_name)(arch, ptx)
    _, ta, tb = _ptx_types(ptx)
    return mmasim_dpa(
        op,
        _torch_operand(torch, a, ta),
        _torch_operand(torch, b, tb),
        c,
        c_format_of(family),
        out_name,
    )


TORCH_FLOATS = {"fp16": "float16", "fp32": "float32", "fp64": "float64"}


def mmasim_dpa(op, a_tensor, b_tensor, c: np.ndarray, c_name: str, out_name: str) -> np.ndarray:
    """MMA-Sim's output bits (as uint64) of one instruction, c given in its own type."""
    import torch

    c_tensor = torch.from_numpy(c.astype(TORCH_FLOATS[c_name]))
    result = op.dpa(a_tensor, b_tensor, c_tensor)
    return result.numpy().view(get_format(out_name).code_dtype).astype(np.uint64)


def _torch_view(torch, codes: np.ndarray, dtype):
    """Codes as a tensor of ``dtype`` over the same bits."""
    storage = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[dtype.itemsize]
    return torch.from_numpy(codes.astype(storage)).view(dtype)


def same_bits(x: np.ndarray, y: np.ndarray, out_name: str) -> np.ndarray:
    fmt = get_format(out_name)
    return (x == y) | (np.isnan(fmt.decode(x)) & np.isnan(fmt.decode(y)))


def _k_of(ptx: str) -> int:
    return int(ptx.split(".")[0].split("k")[1])


@pytest.mark.parametrize("family", FAMILIES, ids=family_id)
def test_family_matches_mmasim(nv_ptx, family):
    arch, op_name, ptx, config, a_name, b_name, out_name = family
    hw = load_hwconfig(REPO / "hwconfigs" / f"{config}.yaml")
    a, b, c = make_inputs(
        FAMILIES.index(family), ROWS, _k_of(ptx), a_name, b_name, out_name, c_format_of(family)
    )
    want = mmasim_bits(nv_ptx, family, a, b, c)
    check_against(hw, a_name, b_name, out_name, c_format_of(family), a, b, c, want)


def check_against(hw, a_name, b_name, out_name, c_name, a, b, c, want) -> None:
    """mxsim.dot's bits equal ``want`` on every row, and the Fraction twin's on TWIN_ROWS."""
    got = dot(
        hw, a, b, a_format=a_name, b_format=b_name, c=c, out_format=out_name, c_format=c_name
    ).astype(np.uint64)
    bad = np.flatnonzero(~same_bits(got, want, out_name))
    assert bad.size == 0, f"{bad.size}/{len(want)} mismatches, rows {bad[:8].tolist()}"
    params = hw.params(a_name, b_name, out_name, c_name)
    fmt = get_format(out_name)
    for row in range(TWIN_ROWS):
        value = dot_reference(params, a[row].tolist(), b[row].tolist(), c=float(c[row]))
        twin = fmt.encode(np.array([value]), overflow="inf_nan")[0]
        assert same_bits(np.array([twin], np.uint64), want[row : row + 1], out_name)[0], (
            f"twin, row {row}"
        )


# --- AMD matrix cores ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def amd_mfma():
    import_or_skip("torch", "oracles")
    return import_or_skip("mmasim.amd", "oracles")


def amd_family_id(family) -> str:
    arch, suffix, config, *_ = family
    return f"{config}-{arch.lower()}-mfma-{suffix}"


def _mfma_k(suffix: str) -> int:
    return int(re.search(r"\d+x\d+x(\d+)", suffix).group(1))


@pytest.mark.parametrize("family", AMD_FAMILIES, ids=amd_family_id)
def test_amd_family_matches_mmasim(amd_mfma, family):
    import torch

    arch, suffix, config, a_name, b_name = family
    # MMA-Sim reads xf32 operands from fp32 tensors (and drops their low 13 bits, as tf32 codes have them zero).
    dtypes = {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
        "fp8_e4m3fnuz": torch.float8_e4m3fnuz,
        "fp8_e5m2fnuz": torch.float8_e5m2fnuz,
    }
    hw = load_hwconfig(REPO / "hwconfigs" / f"{config}.yaml")
    a, b, c = make_inputs(
        1000 + AMD_FAMILIES.index(family), ROWS, _mfma_k(suffix), a_name, b_name, "fp32"
    )
    op = amd_mfma.MFMA(arch, suffix)
    want = mmasim_dpa(
        op,
        _torch_view(torch, a, dtypes[a_name]),
        _torch_view(torch, b, dtypes[b_name]),
        c,
        "fp32",
        "fp32",
    )
    check_against(hw, a_name, b_name, "fp32", "fp32", a, b, c, want)


# --- fp64: the FMA chain of FP64 tensor cores (NVIDIA DMMA) and matrix cores (AMD f64 MFMA) ------

# MMA-Sim runs every fp64 instruction as MMA_FMA: d = fma(a_k, b_k, d) for k = 0..K-1, each
# an IEEE binary64 fused multiply-add (its C++ fma on the CPU). NVIDIA: m8n8k4.f64 on every
# architecture from Ampere (sm_80), m16n8k4/k8/k16.f64 on Hopper (sm_90); AMD: the CDNA2 and
# CDNA3 f64 MFMA instructions.
FP64_FAMILIES = [
    *[
        ("nv_ptx", arch, "m8n8k4.f64.f64.f64.f64", config, 4)
        for arch, config in (
            ("Ampere", "a100-dmma"),
            ("Ada Lovelace", "ada-dmma"),
            ("Hopper", "h100-dmma"),
            ("Blackwell", "b200-dmma"),
            ("RTX Blackwell", "rtx50-dmma"),
        )
    ],
    *[("nv_ptx", "Hopper", f"m16n8k{k}.f64.f64.f64.f64", "h100-dmma", k) for k in (4, 8, 16)],
    ("amd", "CDNA2", "f64_16x16x4f64", "mi250-f64", 4),
    ("amd", "CDNA2", "f64_4x4x4f64", "mi250-f64", 4),
    ("amd", "CDNA3", "f64_16x16x4_f64", "mi300-f64", 4),
    ("amd", "CDNA3", "f64_4x4x4_4b_f64", "mi300-f64", 4),
]


@pytest.mark.parametrize("family", FP64_FAMILIES, ids=lambda family: f"{family[3]}-{family[2]}")
def test_fp64_family_matches_mmasim(family):
    torch = import_or_skip("torch", "oracles")
    vendor, arch, instruction, config, k = family
    module = import_or_skip(f"mmasim.{vendor}", "oracles")
    op = module.MMA(arch, instruction) if vendor == "nv_ptx" else module.MFMA(arch, instruction)
    hw = load_hwconfig(REPO / "hwconfigs" / f"{config}.yaml")
    a, b, c = make_inputs(1000 + FP64_FAMILIES.index(family), ROWS, k, "fp64", "fp64", "fp64")
    want = mmasim_dpa(
        op, _torch_operand(torch, a, "f64"), _torch_operand(torch, b, "f64"), c, "fp64", "fp64"
    )
    check_against(hw, "fp64", "fp64", "fp64", "fp64", a, b, c, want)


# --- zero signs along an FMA chain ----------------------------------------------------------------

# The AMD fp32 MFMA instructions that MMA-Sim runs as the same FMA chain (CDNA1, CDNA2, CDNA3).
FP32_FMA_FAMILIES = [
    ("CDNA1", "f32_16x16x4f32", "mi100"),
    ("CDNA2", "f32_16x16x4f32", "mi250-fp32"),
    ("CDNA3", "f32_16x16x4_f32", "mi300"),
]


def zero_chain_inputs(seed: int, rows: int, k: int, name: str):
    """(A codes, B codes, c) whose FMA steps meet exact zeros of both signs: products of the
    smallest subnormal and 1/8 (they round to a zero of their sign), signed zeros, a product
    and its negation, c of ±0, ±the smallest subnormal or ±1."""
    rng = np.random.default_rng(seed)
    fmt = get_format(name)
    tiny = fmt.min_subnormal
    a = rng.choice([0.0, -0.0, tiny, -tiny, 1.0, -1.0], (rows, k))
    b = rng.choice([0.0, -0.0, 0.125, -0.125, 1.0], (rows, k))
    for row in range(0, rows, 3):  # an exact cancellation in the first two steps
        a[row, 1], b[row, 1] = -a[row, 0], b[row, 0]
    c = rng.choice([0.0, -0.0, tiny, -tiny, 1.0, -1.0], rows)
    return _encode(fmt, a), _encode(fmt, b), c.astype(np.float64 if fmt.bits == 64 else np.float32)


@pytest.mark.parametrize(
    "family",
    [*[("fp64", *f) for f in FP64_FAMILIES], *[("fp32", "amd", *f, 4) for f in FP32_FMA_FAMILIES]],
    ids=lambda family: f"{family[4]}-{family[3]}",
)
def test_fma_chain_zero_signs_match_mmasim(family):
    # output.zero_sign: ieee_steps: a zero that an early step leaves (-0 from an underflow)
    # stays -0 through later -0 products, as IEEE FMAs leave it.
    torch = import_or_skip("torch", "oracles")
    name, vendor, arch, instruction, config, k = family
    module = import_or_skip(f"mmasim.{vendor}", "oracles")
    op = module.MMA(arch, instruction) if vendor == "nv_ptx" else module.MFMA(arch, instruction)
    hw = load_hwconfig(REPO / "hwconfigs" / f"{config}.yaml")
    a, b, c = zero_chain_inputs(77, 96, k, name)
    dtype = {"fp64": torch.float64, "fp32": torch.float32}[name]
    want = mmasim_dpa(op, _torch_view(torch, a, dtype), _torch_view(torch, b, dtype), c, name, name)
    assert np.signbit(
        get_format(name).decode(want)[get_format(name).decode(want) == 0]
    ).any()  # the corner is met
    check_against(hw, name, name, name, name, a, b, c, want)


# --- CDNA3 FP8: a NaN or Inf accumulator at the second alignment ---------------------------------

#: MMA-Sim's CDNA3 FP8 MFMA families (mi300's FP8 override, adder.special_accumulator_exponent).
CDNA3_FP8_FAMILIES = [
    family for family in AMD_FAMILIES if family[0] == "CDNA3" and family[3] in AMD_FP8.values()
]


def special_accumulator_inputs(seed: int, rows: int, k: int, a_name: str, b_name: str):
    """(A codes, B codes, c) where a NaN or ±Inf accumulator meets later products: half the
    rows uniformly random codes (the NaN code among them); the rest realistic rows with one
    product 2^(ea+eb) (ea+eb from 20 up to the formats' largest, so across the 2^25 that
    drops a special accumulator) in the last tree, and a NaN or ±Inf c, a NaN element in an
    earlier tree or the same one, or a c near the fp32 maximum that overflows first."""
    rng = np.random.default_rng(seed)
    fa, fb = get_format(a_name), get_format(b_name)
    a = rng.integers(0, 1 << fa.bits, (rows, k))
    b = rng.integers(0, 1 << fb.bits, (rows, k))
    c = rng.standard_normal(rows) * 2.0 ** rng.integers(-10, 30, rows)
    emax_a, emax_b = (int(np.floor(np.log2(fmt.max_finite))) for fmt in (fa, fb))
    kinds = ("c_special", "nan_earlier", "nan_same", "c_overflow")
    for row in range(rows // 2, rows):
        a[row] = _encode(fa, rng.standard_normal(k))
        b[row] = _encode(fb, rng.standard_normal(k))
        position = rng.integers(max(k - 16, 0), k)  # in the last tree (16 products)
        exponent_a = int(rng.integers(min(10, emax_a), emax_a + 1))
        exponent_b = int(
            np.clip(
                rng.integers(min(20, emax_a + emax_b), emax_a + emax_b + 1) - exponent_a, 0, emax_b
            )
        )
        a[row, position] = _encode(fa, [2.0**exponent_a])[0]
        b[row, position] = _encode(fb, [(-1.0) ** rng.integers(2) * 2.0**exponent_b])[0]
        kind = kinds[row % len(kinds)]
        if kind == "c_special":
            c[row] = rng.choice([np.nan, np.inf, -np.inf])
        elif kind == "nan_earlier" and k > 16:
            a[row, rng.integers(0, k - 16)] = _special_codes(fa)[0]
        elif kind == "nan_same":
            b[row, (position + 1 + rng.integers(15)) % k] = _special_codes(fb)[0]
        else:  # the first tree overflows the accumulator to ±Inf
            c[row] = np.float32(3.4e38) * (-1.0) ** rng.integers(2)
            b[row, 0] = _encode(fb, [np.sign(c[row]) * 2.0**emax_b])[0]
            a[row, 0] = _encode(fa, [2.0**emax_a])[0]
    return a, b, c.astype(np.float32)


@pytest.mark.parametrize("family", CDNA3_FP8_FAMILIES, ids=amd_family_id)
def test_cdna3_fp8_special_accumulators_match_mmasim(amd_mfma, family):
    # MMA-Sim aligns a NaN or Inf c (or running sum) at exponent -1, so products from 2^25 up
    # drop it (adder.special_accumulator_exponent: -1); NaN elements of the tree itself stay NaN.
    import torch

    arch, suffix, config, a_name, b_name = family
    hw = load_hwconfig(REPO / "hwconfigs" / f"{config}.yaml")
    # the crafted rows first: the twin runs the first TWIN_ROWS
    a, b, c = (
        x[::-1].copy() for x in special_accumulator_inputs(31, 128, _mfma_k(suffix), a_name, b_name)
    )
    dtypes = {name: getattr(torch, f"float8_{name[4:]}") for name in AMD_FP8.values()}
    op = amd_mfma.MFMA(arch, suffix)
    want = mmasim_dpa(
        op,
        _torch_view(torch, a, dtypes[a_name]),
        _torch_view(torch, b, dtypes[b_name]),
        c,
        "fp32",
        "fp32",
    )
    has_special = (
        (~np.isfinite(c))
        | (a == _special_codes(get_format(a_name))[0]).any(axis=1)
        | (b == _special_codes(get_format(b_name))[0]).any(axis=1)
    )
    dropped = has_special & np.isfinite(get_format("fp32").decode(want))
    # the corner is met where products reach 2^25: bf8 x bf8 alone
    assert dropped.any() == (a_name == b_name == "fp8_e5m2fnuz"), int(dropped.sum())
    check_against(hw, a_name, b_name, "fp32", "fp32", a, b, c, want)
