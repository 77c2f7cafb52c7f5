"""Measure a Hopper GPU's tensor-core dot products and GEMMs: the data in this folder.

Run on a machine with an NVIDIA Hopper GPU (H100, H200), CuPy, PyTorch, Triton and ml_dtypes:

    python3 tests/data/gpu-h200/measure.py OUTDIR [PART ...]

Each part writes ``OUTDIR/h200-PART.npz`` (split into ``-0``, ``-1``, ... past about 12 MB of
arrays), and the run ``OUTDIR/measure.log``. Parts (default: mma, tl, mm, which share one
random stream in that order; the others have streams of their own):

* ``mma``: one ``mma.sync`` instruction per tile (inline PTX through CuPy): FP8 m16n8k32 (four
  type pairs, fp32 and fp16 accumulate), fp16 / bf16 m16n8k16, tf32 m16n8k8. Arrays per set
  ``mma_*``: ``a`` (T, 16, K) and ``b`` (T, 8, K) element codes (B by columns), ``c``
  (T, 16, 8) and ``d`` (T, 16, 8) bits of the accumulator input and the result (fp32 bits, or
  fp16 bits for fp16 accumulate). Every output D[i, j] = c[i, j] + sum_k a[i, k] b[j, k] is
  one case. ``chain``: K / 32 chained FP8 instructions (``mma_*_k64_f32``, ``_k128_``).
* ``tl``: Triton's ``tl.dot`` on FP8 tiles of 64 x 64 (``wgmma`` on Hopper): ``a``
  (T, 64, K), ``b`` (T, 64, K) by columns, ``c``, ``d`` (T, 64, 64); ``ptx_tl_*`` holds the
  PTX that ran. ``tl16``: the same on fp16, bf16 and tf32 tiles.
* ``mm``: ``torch._scaled_mm`` (cuBLASLt) on E4M3 with unit scales, fp32 output, fast
  accumulation on and off: ``a`` (M, K), ``b`` (N, K), ``d`` (M, N) fp32 bits, ``kernels_*``
  the kernels that ran. ``mm16``: ``torch.mm`` in fp16, bf16 and fp32 with TF32 allowed
  (``mm_{f16,bf16,tf32}_*``: outputs in the inputs' format, fp32 for tf32) and
  ``torch._scaled_mm`` with bf16 and fp16 outputs (``mm_e4m3{bf16,f16}_*``). ``addmm``:
  ``torch.addmm`` and ``F.linear`` with a bias in fp16, bf16 and TF32 (``mm_{f16,bf16,tf32}
  {addmm,linear}_*``, ``c`` the codes of C or of the bias). ``linear``: ``F.linear`` with a
  bias at a transformer's shapes in fp16 and bf16; ``decode``: the same at 1 and 8 tokens.

Inputs are mostly realistic (normal values scaled per row, rounded to the format), a minority
corners (codes drawn over all exponents, every code including Inf/NaN, cancelling pairs,
subnormal and near-overflow values); each tile takes one kind, listed in ``kind_*``. tf32
codes are fp32 bit patterns with the low 13 bits zero.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import numpy as np

SEED = 20261130
KINDS = (
    "realistic",
    "realistic",
    "realistic",
    "realistic",
    "realistic",
    "realistic",
    "exponents",
    "codes",
    "cancelling",
    "extremes",
)

LOG: list[str] = []


def log(*parts) -> None:
    line = " ".join(str(p) for p in parts)
    LOG.append(line)
    print(line, flush=True)


def dtype_of(name: str):
    import ml_dtypes

    return {
        "e4m3": ml_dtypes.float8_e4m3fn,
        "e5m2": ml_dtypes.float8_e5m2,
        "f16": np.float16,
        "bf16": ml_dtypes.bfloat16,
    }[name]


def code_dtype(name: str):
    return np.uint32 if name == "tf32" else (np.uint8 if name in ("e4m3", "e5m2") else np.uint16)


def quantize(values: np.ndarray, name: str) -> np.ndarray:
    """Element codes nearest to values (values kept inside the format's range)."""
    if name == "tf32":
        bits = values.astype(np.float32).view(np.uint32)
        # nearest even on the 13 dropped bits
        bias = ((bits >> 13) & 1) + 0x0FFF
        return ((bits + bias) & ~np.uint32(0x1FFF)).astype(np.uint32)
    limit = {"e4m3": 448.0, "e5m2": 57344.0, "f16": 65504.0, "bf16": 3.0e38}[name]
    clipped = np.clip(values, -limit, limit)
    return clipped.astype(dtype_of(name)).view(code_dtype(name))


def all_codes(name: str) -> np.ndarray:
    if name == "tf32":
        raise ValueError
    return np.arange(1 << (8 * np.dtype(code_dtype(name)).itemsize)).astype(code_dtype(name))


def finite_codes(name: str) -> np.ndarray:
    codes = all_codes(name)
    return codes[np.isfinite(codes.view(dtype_of(name)).astype(np.float32))]


def draw_rows(rng, kind: str, rows: int, k: int, name: str) -> np.ndarray:
    """rows x k element codes of one kind."""
    if kind == "realistic":
        scale = 2.0 ** rng.uniform(-6, 4, size=(rows, 1))
        return quantize(rng.standard_normal((rows, k)) * scale, name)
    if name == "tf32":
        bits = rng.integers(0, 1 << 32, size=(rows, k), dtype=np.uint64).astype(np.uint32)
        bits &= ~np.uint32(0x1FFF)
        if kind == "codes":
            return bits
        exponent = rng.integers(1, 255, size=(rows, k)).astype(np.uint32)
        if kind == "extremes":
            exponent = rng.choice(
                np.array([0, 1, 2, 126, 127, 253, 254], np.uint32), size=(rows, k)
            )
        return (bits & ~np.uint32(0x7F800000)) | (exponent << 23)
    if kind == "codes":
        return rng.choice(all_codes(name), size=(rows, k))
    finite = finite_codes(name)
    if kind == "exponents" or kind == "cancelling":
        return rng.choice(finite, size=(rows, k))
    values = finite.view(dtype_of(name)).astype(np.float64)
    order = np.argsort(np.abs(values))
    extreme = np.concatenate([finite[order[:24]], finite[order[-24:]]])
    return rng.choice(extreme, size=(rows, k))


def negate(codes: np.ndarray, name: str) -> np.ndarray:
    bits = {"e4m3": 0x80, "e5m2": 0x80, "f16": 0x8000, "bf16": 0x8000, "tf32": 0x80000000}[name]
    return codes ^ code_dtype(name)(bits)


def draw_tiles(rng, tiles: int, rows: int, cols: int, k: int, a_name: str, b_name: str):
    """A (T, rows, k), B (T, cols, k), C (T, rows, cols) fp32, kinds (T,)."""
    a = np.empty((tiles, rows, k), code_dtype(a_name))
    b = np.empty((tiles, cols, k), code_dtype(b_name))
    c = np.empty((tiles, rows, cols), np.float32)
    kinds = []
    for t in range(tiles):
        kind = KINDS[rng.integers(len(KINDS))]
        kinds.append(kind)
        a[t] = draw_rows(rng, kind, rows, k, a_name)
        b[t] = draw_rows(rng, kind, cols, k, b_name)
        if kind == "cancelling" and a_name == b_name:
            # pairs x*y and (-x)*y: exact cancellation, the rest of the terms decide
            half = k // 2
            b[t, :, half:] = b[t, :, :half]
            a[t, :, half:] = negate(a[t, :, :half], a_name)
            a[t, :, half - 2 : half] = draw_rows(rng, "realistic", rows, 2, a_name)
        scale = 2.0 ** rng.uniform(-8, 8, size=(rows, cols))
        c[t] = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        special = rng.random((rows, cols))
        c[t][special < 0.08] = 0.0
        c[t][(special >= 0.08) & (special < 0.12)] = -0.0
        tiny = (special >= 0.12) & (special < 0.15)
        c[t][tiny] = np.float32(2.0**-140) * rng.integers(1, 1000, size=int(tiny.sum()))
        if kind == "codes":
            huge = special > 0.97
            c[t][huge] = rng.choice(
                np.array([np.inf, -np.inf, np.nan, 3.0e38], np.float32), int(huge.sum())
            )
    return a, b, c, np.array(kinds)


# ---- mma.sync through inline PTX ---------------------------------------------------------

MMA_SOURCE = r"""
extern "C" __global__ void mma_FP8(const unsigned char* A, const unsigned char* B,
                                   const float* C, float* D) {
  int t = blockIdx.x, lane = threadIdx.x, g = lane >> 2, q = lane & 3;
  const unsigned char* a = A + t * 16 * 32;
  const unsigned char* b = B + t * 8 * 32;
  unsigned a0 = *(const unsigned*)(a + g * 32 + 4 * q);
  unsigned a1 = *(const unsigned*)(a + (g + 8) * 32 + 4 * q);
  unsigned a2 = *(const unsigned*)(a + g * 32 + 16 + 4 * q);
  unsigned a3 = *(const unsigned*)(a + (g + 8) * 32 + 16 + 4 * q);
  unsigned b0 = *(const unsigned*)(b + g * 32 + 4 * q);
  unsigned b1 = *(const unsigned*)(b + g * 32 + 16 + 4 * q);
  const float* c = C + t * 128;
  float* d = D + t * 128;
  float c0 = c[g * 8 + 2 * q], c1 = c[g * 8 + 2 * q + 1];
  float c2 = c[(g + 8) * 8 + 2 * q], c3 = c[(g + 8) * 8 + 2 * q + 1];
  float d0, d1, d2, d3;
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.ATYPE.BTYPE.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
               : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1),
                 "f"(c0), "f"(c1), "f"(c2), "f"(c3));
  d[g * 8 + 2 * q] = d0; d[g * 8 + 2 * q + 1] = d1;
  d[(g + 8) * 8 + 2 * q] = d2; d[(g + 8) * 8 + 2 * q + 1] = d3;
}

extern "C" __global__ void mma_FP8_f16(const unsigned char* A, const unsigned char* B,
                                       const unsigned* C, unsigned* D) {
  int t = blockIdx.x, lane = threadIdx.x, g = lane >> 2, q = lane & 3;
  const unsigned char* a = A + t * 16 * 32;
  const unsigned char* b = B + t * 8 * 32;
  unsigned a0 = *(const unsigned*)(a + g * 32 + 4 * q);
  unsigned a1 = *(const unsigned*)(a + (g + 8) * 32 + 4 * q);
  unsigned a2 = *(const unsigned*)(a + g * 32 + 16 + 4 * q);
  unsigned a3 = *(const unsigned*)(a + (g + 8) * 32 + 16 + 4 * q);
  unsigned b0 = *(const unsigned*)(b + g * 32 + 4 * q);
  unsigned b1 = *(const unsigned*)(b + g * 32 + 16 + 4 * q);
  const unsigned* c = C + t * 64;  // (16, 4) pairs of fp16
  unsigned* d = D + t * 64;
  unsigned c0 = c[g * 4 + q], c1 = c[(g + 8) * 4 + q], d0, d1;
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f16.ATYPE.BTYPE.f16 {%0,%1}, "
               "{%2,%3,%4,%5}, {%6,%7}, {%8,%9};"
               : "=r"(d0), "=r"(d1)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c0), "r"(c1));
  d[g * 4 + q] = d0; d[(g + 8) * 4 + q] = d1;
}

extern "C" __global__ void mma_FP8_chain(const unsigned char* A, const unsigned char* B,
                                         const float* C, float* D, int steps) {
  int t = blockIdx.x, lane = threadIdx.x, g = lane >> 2, q = lane & 3, K = 32 * steps;
  const float* c = C + t * 128;
  float* d = D + t * 128;
  float d0 = c[g * 8 + 2 * q], d1 = c[g * 8 + 2 * q + 1];
  float d2 = c[(g + 8) * 8 + 2 * q], d3 = c[(g + 8) * 8 + 2 * q + 1];
  for (int s = 0; s < steps; ++s) {
    const unsigned char* a = A + t * 16 * K + 32 * s;
    const unsigned char* b = B + t * 8 * K + 32 * s;
    unsigned a0 = *(const unsigned*)(a + g * K + 4 * q);
    unsigned a1 = *(const unsigned*)(a + (g + 8) * K + 4 * q);
    unsigned a2 = *(const unsigned*)(a + g * K + 16 + 4 * q);
    unsigned a3 = *(const unsigned*)(a + (g + 8) * K + 16 + 4 * q);
    unsigned b0 = *(const unsigned*)(b + g * K + 4 * q);
    unsigned b1 = *(const unsigned*)(b + g * K + 16 + 4 * q);
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.ATYPE.BTYPE.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  d[g * 8 + 2 * q] = d0; d[g * 8 + 2 * q + 1] = d1;
  d[(g + 8) * 8 + 2 * q] = d2; d[(g + 8) * 8 + 2 * q + 1] = d3;
}

extern "C" __global__ void mma_H16(const unsigned short* A, const unsigned short* B,
                                   const float* C, float* D) {
  int t = blockIdx.x, lane = threadIdx.x, g = lane >> 2, q = lane & 3;
  const unsigned short* a = A + t * 16 * 16;
  const unsigned short* b = B + t * 8 * 16;
  unsigned a0 = *(const unsigned*)(a + g * 16 + 2 * q);
  unsigned a1 = *(const unsigned*)(a + (g + 8) * 16 + 2 * q);
  unsigned a2 = *(const unsigned*)(a + g * 16 + 8 + 2 * q);
  unsigned a3 = *(const unsigned*)(a + (g + 8) * 16 + 8 + 2 * q);
  unsigned b0 = *(const unsigned*)(b + g * 16 + 2 * q);
  unsigned b1 = *(const unsigned*)(b + g * 16 + 8 + 2 * q);
  const float* c = C + t * 128;
  float* d = D + t * 128;
  float c0 = c[g * 8 + 2 * q], c1 = c[g * 8 + 2 * q + 1];
  float c2 = c[(g + 8) * 8 + 2 * q], c3 = c[(g + 8) * 8 + 2 * q + 1];
  float d0, d1, d2, d3;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.HTYPE.HTYPE.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
               : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1),
                 "f"(c0), "f"(c1), "f"(c2), "f"(c3));
  d[g * 8 + 2 * q] = d0; d[g * 8 + 2 * q + 1] = d1;
  d[(g + 8) * 8 + 2 * q] = d2; d[(g + 8) * 8 + 2 * q + 1] = d3;
}

extern "C" __global__ void mma_tf32(const unsigned* A, const unsigned* B,
                                    const float* C, float* D) {
  int t = blockIdx.x, lane = threadIdx.x, g = lane >> 2, q = lane & 3;
  const unsigned* a = A + t * 16 * 8;
  const unsigned* b = B + t * 8 * 8;
  unsigned a0 = a[g * 8 + q], a1 = a[(g + 8) * 8 + q];
  unsigned a2 = a[g * 8 + q + 4], a3 = a[(g + 8) * 8 + q + 4];
  unsigned b0 = b[g * 8 + q], b1 = b[g * 8 + q + 4];
  const float* c = C + t * 128;
  float* d = D + t * 128;
  float c0 = c[g * 8 + 2 * q], c1 = c[g * 8 + 2 * q + 1];
  float c2 = c[(g + 8) * 8 + 2 * q], c3 = c[(g + 8) * 8 + 2 * q + 1];
  float d0, d1, d2, d3;
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
               : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1),
                 "f"(c0), "f"(c1), "f"(c2), "f"(c3));
  d[g * 8 + 2 * q] = d0; d[g * 8 + 2 * q + 1] = d1;
  d[(g + 8) * 8 + 2 * q] = d2; d[(g + 8) * 8 + 2 * q + 1] = d3;
}
"""

FP8 = ("e4m3", "e5m2")
STEP_K = {"e4m3": 32, "e5m2": 32, "f16": 16, "bf16": 16, "tf32": 8}


def mma_kernel(cupy, a_name: str, b_name: str, f16_out: bool):
    fp8 = a_name in FP8
    if fp8:
        name = "mma_FP8_f16" if f16_out else "mma_FP8"
    else:
        name = "mma_tf32" if a_name == "tf32" else "mma_H16"
    # every kernel of the module must assemble: the unused ones get types of their own
    source = (
        MMA_SOURCE.replace("ATYPE", a_name if fp8 else "e4m3")
        .replace("BTYPE", b_name if fp8 else "e4m3")
        .replace("HTYPE", a_name if a_name in ("f16", "bf16") else "f16")
    )
    if (source, name) not in KERNELS:
        module = cupy.RawModule(code=source, options=("-arch=sm_90a",))
        KERNELS[source, name] = module.get_function(name)
    return KERNELS[source, name]


def run_mma(cupy, a_name, b_name, a, b, c, f16_out=False):
    """Output bits (T, 16, 8): fp32 bits, or fp16 bits when f16_out."""
    tiles = a.shape[0]
    kernel = mma_kernel(cupy, a_name, b_name, f16_out)
    da, db = cupy.asarray(np.ascontiguousarray(a)), cupy.asarray(np.ascontiguousarray(b))
    if f16_out:
        c16 = c.astype(np.float16).view(np.uint16).reshape(tiles, 16, 4, 2).astype(np.uint32)
        packed = c16[..., 0] | (c16[..., 1] << 16)
        dc = cupy.asarray(np.ascontiguousarray(packed))
        dd = cupy.zeros((tiles, 16, 4), dtype=cupy.uint32)
        kernel((tiles,), (32,), (da, db, dc, dd))
        out = cupy.asnumpy(dd)
        halves = np.stack([out & 0xFFFF, out >> 16], axis=-1).reshape(tiles, 16, 8)
        return halves.astype(np.uint16)
    dc = cupy.asarray(np.ascontiguousarray(c))
    dd = cupy.zeros((tiles, 16, 8), dtype=cupy.float32)
    kernel((tiles,), (32,), (da, db, dc, dd))
    return cupy.asnumpy(dd).view(np.uint32)


def run_mma_chain(cupy, a_name, b_name, a, b, c):
    """fp32 output bits (T, 16, 8) of K / 32 chained mma.sync instructions, c the first D."""
    tiles, _, k = a.shape
    source = MMA_SOURCE.replace("ATYPE", a_name).replace("BTYPE", b_name).replace("HTYPE", "f16")
    if (source, "chain") not in KERNELS:
        module = cupy.RawModule(code=source, options=("-arch=sm_90a",))
        KERNELS[source, "chain"] = module.get_function("mma_FP8_chain")
    kernel = KERNELS[source, "chain"]
    da, db = cupy.asarray(np.ascontiguousarray(a)), cupy.asarray(np.ascontiguousarray(b))
    dc = cupy.asarray(np.ascontiguousarray(c))
    dd = cupy.zeros((tiles, 16, 8), dtype=cupy.float32)
    kernel((tiles,), (32,), (da, db, dc, dd, np.int32(k // 32)))
    return cupy.asnumpy(dd).view(np.uint32)


def measure_mma_chains(cupy, rng, results, tiles):
    for a_name, b_name in (("e4m3", "e4m3"), ("e5m2", "e4m3")):
        for k in (64, 128):
            label = f"mma_{a_name}_{b_name}_k{k}_f32"
            try:
                sa, sb, sc = small_integers(rng, 8, 16, 8, k, a_name, b_name)
                bad = layout_check(
                    sa, sb, sc, run_mma_chain(cupy, a_name, b_name, sa, sb, sc), a_name, b_name
                )
                a, b, c, kinds = draw_tiles(rng, tiles, 16, 8, k, a_name, b_name)
                d = run_mma_chain(cupy, a_name, b_name, a, b, c)
                results.update(
                    {
                        f"{label}_a": a,
                        f"{label}_b": b,
                        f"{label}_c": c.view(np.uint32),
                        f"{label}_d": d,
                        f"kind_{label}": kinds,
                    }
                )
                log(f"{label}: {d.size} outputs, layout check {bad} wrong of {sc.size}")
            except Exception:
                log(f"{label}: FAILED\n" + traceback.format_exc())


def small_integers(rng, tiles, rows, cols, k, a_name, b_name):
    """Inputs whose exact result is known: small integers, exact in every format."""
    a = quantize(rng.integers(-4, 5, size=(tiles, rows, k)).astype(np.float64), a_name)
    b = quantize(rng.integers(-4, 5, size=(tiles, cols, k)).astype(np.float64), b_name)
    c = rng.integers(-64, 65, size=(tiles, rows, cols)).astype(np.float32)
    return a, b, c


def values_of(codes, name):
    if name == "tf32":
        return codes.view(np.float32).astype(np.float64)
    return codes.view(dtype_of(name)).astype(np.float64)


def layout_check(a, b, c, d_bits, a_name, b_name, f16_out=False):
    expected = np.einsum("tik,tjk->tij", values_of(a, a_name), values_of(b, b_name)) + c
    got = d_bits.view(np.float16) if f16_out else d_bits.view(np.float32)
    return int((got.astype(np.float64) != expected).sum())


def measure_mma(cupy, rng, results, tiles):
    pairs = [(x, y) for x in FP8 for y in FP8] + [
        ("f16", "f16"),
        ("bf16", "bf16"),
        ("tf32", "tf32"),
    ]
    for a_name, b_name in pairs:
        k = STEP_K[a_name]
        outs = [False, True] if a_name in FP8 else [False]
        for f16_out in outs:
            label = f"mma_{a_name}_{b_name}_{'f16' if f16_out else 'f32'}"
            try:
                start = time.perf_counter()
                sa, sb, sc = small_integers(rng, 8, 16, 8, k, a_name, b_name)
                bad = layout_check(
                    sa,
                    sb,
                    sc,
                    run_mma(cupy, a_name, b_name, sa, sb, sc, f16_out),
                    a_name,
                    b_name,
                    f16_out,
                )
                a, b, c, kinds = draw_tiles(rng, tiles, 16, 8, k, a_name, b_name)
                d = run_mma(cupy, a_name, b_name, a, b, c, f16_out)
                if f16_out:
                    c = c.astype(np.float16).astype(np.float32)
                results.update(
                    {
                        f"{label}_a": a,
                        f"{label}_b": b,
                        f"{label}_c": c.view(np.uint32),
                        f"{label}_d": d,
                        f"kind_{label}": kinds,
                    }
                )
                log(
                    f"{label}: {d.size} outputs, layout check {bad} wrong of {sc.size},"
                    f" {time.perf_counter() - start:.1f} s"
                )
            except Exception:
                log(f"{label}: FAILED\n" + traceback.format_exc())


# ---- Triton tl.dot (wgmma) -----------------------------------------------------------------


def triton_tile_dot():
    """A Triton kernel: D[t] = C[t] + A[t] B[t]^T on 64 x 64 tiles (tl.dot: wgmma on Hopper)."""
    if "tile_dot" in KERNELS:
        return KERNELS["tile_dot"]
    import triton
    import triton.language as tl

    log("triton", triton.__version__)

    @triton.jit
    def tile_dot(A, B, C, D, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, F16: tl.constexpr):
        t = tl.program_id(0)
        rm = tl.arange(0, M)
        rn = tl.arange(0, N)
        rk = tl.arange(0, K)
        a = tl.load(A + t * M * K + rm[:, None] * K + rk[None, :])
        b = tl.load(B + t * N * K + rn[None, :] * K + rk[:, None])
        c = tl.load(C + t * M * N + rm[:, None] * N + rn[None, :])
        if F16:
            d = tl.dot(a, b, c, out_dtype=tl.float16)
        else:
            d = tl.dot(a, b, c, out_dtype=tl.float32)
        tl.store(D + t * M * N + rm[:, None] * N + rn[None, :], d)

    KERNELS["tile_dot"] = tile_dot
    return tile_dot


def torch_operand(torch, codes, name):
    """Element codes as a CUDA tensor of the format (a view: no rounding)."""
    torch_type = {
        "e4m3": torch.float8_e4m3fn,
        "e5m2": torch.float8_e5m2,
        "f16": torch.float16,
        "bf16": torch.bfloat16,
        "tf32": torch.float32,
    }[name]
    signed = {1: np.int8, 2: np.int16, 4: np.int32}[codes.dtype.itemsize]
    return torch.from_numpy(np.ascontiguousarray(codes).view(signed)).cuda().view(torch_type)


def run_tl(torch, a_name, b_name, a, b, c, f16_out):
    """(output bits (T, 64, 64), the PTX that ran) of tl.dot on A (T, 64, K), B (T, 64, K)."""
    tiles, _, k = a.shape
    ta, tb = torch_operand(torch, a, a_name), torch_operand(torch, b, b_name)
    tc = (
        torch.from_numpy(np.ascontiguousarray(c))
        .cuda()
        .to(torch.float16 if f16_out else torch.float32)
    )
    td = torch.empty_like(tc)
    compiled = triton_tile_dot()[(tiles,)](
        ta, tb, tc, td, M=64, N=64, K=k, F16=f16_out, num_warps=4
    )
    torch.cuda.synchronize()
    return td.cpu().numpy().view(np.uint16 if f16_out else np.uint32), compiled.asm.get("ptx", "")


FP8_TL_CASES = [(x, y, 32, False) for x in FP8 for y in FP8] + [
    ("e4m3", "e4m3", 32, True),
    ("e5m2", "e5m2", 32, True),
    ("e4m3", "e4m3", 128, False),
    ("e5m2", "e4m3", 128, False),
]
WIDE_TL_CASES = [
    ("f16", "f16", 16, False),
    ("f16", "f16", 64, False),
    ("f16", "f16", 16, True),
    ("bf16", "bf16", 16, False),
    ("bf16", "bf16", 64, False),
    ("tf32", "tf32", 16, False),
    ("tf32", "tf32", 64, False),
]


def measure_triton(torch, rng, results, tiles, cases=FP8_TL_CASES):
    for a_name, b_name, k, f16_out in cases:
        label = f"tl_{a_name}_{b_name}_k{k}_{'f16' if f16_out else 'f32'}"
        try:
            start = time.perf_counter()
            a, b, c, kinds = draw_tiles(rng, tiles, 64, 64, k, a_name, b_name)
            if f16_out:
                c = c.astype(np.float16).astype(np.float32)
            d, ptx = run_tl(torch, a_name, b_name, a, b, c, f16_out)
            results.update(
                {
                    f"{label}_a": a,
                    f"{label}_b": b,
                    f"{label}_c": c.view(np.uint32),
                    f"{label}_d": d,
                    f"kind_{label}": kinds,
                    f"ptx_{label}": np.frombuffer(ptx.encode(), np.uint8),
                }
            )
            wgmma = [line.strip() for line in ptx.splitlines() if "wgmma.mma_async" in line]
            log(
                f"{label}: {d.size} outputs, {len(wgmma)} wgmma lines, first: "
                f"{wgmma[0][:110] if wgmma else '-'}; {time.perf_counter() - start:.1f} s"
            )
        except Exception:
            log(f"{label}: FAILED\n" + traceback.format_exc())


# ---- torch._scaled_mm (cuBLASLt) -----------------------------------------------------------


def measure_scaled_mm(torch, rng, results):
    one = torch.ones((), dtype=torch.float32, device="cuda")
    shapes = [(64, 64, 32), (64, 64, 256), (128, 128, 4096), (1024, 1024, 1024)]
    for m, n, k in shapes:
        rows_a = np.concatenate(
            [
                draw_rows(rng, "realistic", m - m // 8, k, "e4m3"),
                draw_rows(rng, "exponents", m // 8, k, "e4m3"),
            ]
        )
        rows_b = draw_rows(rng, "realistic", n, k, "e4m3")
        a = torch.from_numpy(rows_a).cuda().view(torch.float8_e4m3fn)
        b = torch.from_numpy(rows_b).cuda().view(torch.float8_e4m3fn)
        for fast in (False, True):
            label = f"mm_e4m3_{m}x{n}x{k}_{'fast' if fast else 'exact'}"
            try:
                d = torch._scaled_mm(
                    a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast
                )
                bits = d.cpu().numpy().view(np.uint32)
                results.update({f"{label}_a": rows_a, f"{label}_b": rows_b, f"{label}_d": bits})
                names = kernel_names(
                    torch,
                    lambda: torch._scaled_mm(
                        a,
                        b.t(),
                        scale_a=one,
                        scale_b=one,
                        out_dtype=torch.float32,
                        use_fast_accum=fast,
                    ),
                )
                results[f"kernels_{label}"] = np.array(names)
                log(f"{label}: kernels {names}")
            except Exception:
                log(f"{label}: FAILED\n" + traceback.format_exc())


def measure_torch_mm(torch, rng, results):
    """torch.mm in fp16, bf16 (outputs of the inputs' format) and fp32 with TF32 allowed
    (fp32 output), and torch._scaled_mm with bf16 output: cuBLAS(Lt) GEMMs as models run
    them. Inputs are values of the format (TF32 values for the fp32 GEMMs)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    one = torch.ones((), dtype=torch.float32, device="cuda")
    out_bits = {"f16": np.uint16, "bf16": np.uint16, "tf32": np.uint32}
    for name in ("f16", "bf16", "tf32"):
        for m, n, k in ((64, 64, 256), (256, 256, 4096), (128, 128, 1024), (1024, 1024, 1024)):
            label = f"mm_{name}_{m}x{n}x{k}"
            try:
                rows_a = draw_rows(rng, "realistic", m, k, name)
                rows_b = draw_rows(rng, "realistic", n, k, name)
                a, b = torch_operand(torch, rows_a, name), torch_operand(torch, rows_b, name)
                d = torch.mm(a, b.t())
                bits = (
                    d.cpu()
                    .contiguous()
                    .view(torch.int16 if out_bits[name] is np.uint16 else torch.int32)
                )
                results.update(
                    {
                        f"{label}_a": rows_a,
                        f"{label}_b": rows_b,
                        f"{label}_d": bits.numpy().view(out_bits[name]),
                        f"kernels_{label}": np.array(
                            kernel_names(torch, lambda: torch.mm(a, b.t()))
                        ),
                    }
                )
                log(f"{label}: kernels {results[f'kernels_{label}']}")
            except Exception:
                log(f"{label}: FAILED\n" + traceback.format_exc())
    for m, n, k in ((64, 64, 256), (256, 256, 4096)):
        rows_a = draw_rows(rng, "realistic", m, k, "e4m3")
        rows_b = draw_rows(rng, "realistic", n, k, "e4m3")
        a, b = torch_operand(torch, rows_a, "e4m3"), torch_operand(torch, rows_b, "e4m3")
        for fast, out in ((False, "bf16"), (True, "bf16"), (False, "f16"), (True, "f16")):
            label = f"mm_e4m3{out}_{m}x{n}x{k}_{'fast' if fast else 'exact'}"
            try:

                def call():
                    return torch._scaled_mm(
                        a,
                        b.t(),
                        scale_a=one,
                        scale_b=one,
                        out_dtype=torch.bfloat16 if out == "bf16" else torch.float16,
                        use_fast_accum=fast,
                    )

                bits = call().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
                results.update(
                    {
                        f"{label}_a": rows_a,
                        f"{label}_b": rows_b,
                        f"{label}_d": bits,
                        f"kernels_{label}": np.array(kernel_names(torch, call)),
                    }
                )
                log(f"{label}: kernels {results[f'kernels_{label}']}")
            except Exception:
                log(f"{label}: FAILED\n" + traceback.format_exc())


def measure_linears(torch, rng, results):
    """F.linear with a bias at a transformer's shapes (224 tokens: MiniLM's hidden 384 and
    intermediate 1536, and a 4096-wide layer) in fp16 and bf16."""
    shapes = ((224, 1536, 384), (224, 384, 1536), (224, 384, 384), (512, 4096, 4096))
    for name in ("f16", "bf16"):
        for m, n, k in shapes:
            label = f"mm_{name}linear_{m}x{n}x{k}"
            try:
                rows_a = draw_rows(rng, "realistic", m, k, name)
                rows_b = draw_rows(rng, "realistic", n, k, name)
                codes_c = draw_rows(rng, "realistic", 1, n, name)
                a, b = torch_operand(torch, rows_a, name), torch_operand(torch, rows_b, name)
                c = torch_operand(torch, codes_c, name)

                def call():
                    return torch.nn.functional.linear(a, b, c[0])

                bits = call().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
                results.update(
                    {
                        f"{label}_a": rows_a,
                        f"{label}_b": rows_b,
                        f"{label}_c": codes_c,
                        f"{label}_d": bits,
                        f"kernels_{label}": np.array(kernel_names(torch, call)),
                    }
                )
                log(f"{label}: kernels {results[f'kernels_{label}']}")
            except Exception:
                log(f"{label}: FAILED\n" + traceback.format_exc())


def measure_decode_linears(torch, rng, results):
    """F.linear with a bias at decoding shapes (1 and 8 tokens, 4096 x 4096 weights) in fp16
    and bf16; the first 64 output columns kept (B's first 64 rows, the bias's first 64)."""
    for name in ("f16", "bf16"):
        for m, n, k in ((1, 4096, 4096), (8, 4096, 4096)):
            label = f"mm_{name}linear_{m}x{n}x{k}"
            try:
                rows_a = draw_rows(rng, "realistic", m, k, name)
                rows_b = draw_rows(rng, "realistic", n, k, name)
                codes_c = draw_rows(rng, "realistic", 1, n, name)
                a, b = torch_operand(torch, rows_a, name), torch_operand(torch, rows_b, name)
                c = torch_operand(torch, codes_c, name)

                def call():
                    return torch.nn.functional.linear(a, b, c[0])

                bits = call().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
                results.update(
                    {
                        f"{label}_a": rows_a,
                        f"{label}_b": rows_b[:64],
                        f"{label}_c": codes_c[:, :64],
                        f"{label}_d": bits[:, :64],
                        f"kernels_{label}": np.array(kernel_names(torch, call)),
                    }
                )
                log(f"{label}: kernels {results[f'kernels_{label}']}")
            except Exception:
                log(f"{label}: FAILED\n" + traceback.format_exc())


def measure_addmm(torch, rng, results):
    """torch.addmm (C + A B^T, C a matrix of the inputs' format) and F.linear with a bias
    (C a row broadcast down the columns) in fp16, bf16 and fp32 with TF32 allowed: where
    cuBLAS adds C. ``c`` holds C's codes ((M, N), or (N,) for a bias)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    out_bits = {
        "f16": (np.uint16, torch.int16),
        "bf16": (np.uint16, torch.int16),
        "tf32": (np.uint32, torch.int32),
    }
    for name in ("f16", "bf16", "tf32"):
        for m, n, k in ((64, 64, 256), (256, 256, 4096)):
            rows_a = draw_rows(rng, "realistic", m, k, name)
            rows_b = draw_rows(rng, "realistic", n, k, name)
            a, b = torch_operand(torch, rows_a, name), torch_operand(torch, rows_b, name)
            for kind in ("addmm", "linear"):
                label = f"mm_{name}{kind}_{m}x{n}x{k}"
                try:
                    shape = (m, n) if kind == "addmm" else (1, n)
                    codes_c = draw_rows(rng, "realistic", *shape, name)
                    c = torch_operand(torch, codes_c, name)

                    def call():
                        if kind == "addmm":
                            return torch.addmm(c, a, b.t())
                        return torch.nn.functional.linear(a, b, c[0])

                    dtype, view = out_bits[name]
                    bits = call().cpu().contiguous().view(view).numpy().view(dtype)
                    results.update(
                        {
                            f"{label}_a": rows_a,
                            f"{label}_b": rows_b,
                            f"{label}_c": codes_c,
                            f"{label}_d": bits,
                            f"kernels_{label}": np.array(kernel_names(torch, call)),
                        }
                    )
                    log(f"{label}: kernels {results[f'kernels_{label}']}")
                except Exception:
                    log(f"{label}: FAILED\n" + traceback.format_exc())


def kernel_names(torch, call) -> list[str]:
    """Names of the GPU kernels one call launches (the profiler's view; empty if it fails)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        return sorted({e.name for e in prof.events() if str(e.device_type).endswith("CUDA")})
    except Exception as error:
        return [f"profiler failed: {error!r}"]


KERNELS: dict = {}


def h200_mma_e4m3(a, b, scale_a, scale_b, c):
    """A probe unit (mxsim probe --unit): E4M3 x E4M3 -> fp32 through one mma.sync each, K = 32.

    Dot product r sits on the diagonal of a tile (row r % 8 of A, column r % 8 of B).
    """
    import cupy

    n, k = a.shape
    if k != 32:
        raise ValueError(f"K must be 32, got {k}")
    tiles = -(-n // 8)
    rows = np.arange(n)
    tile, lane = rows // 8, rows % 8
    a_tiles = np.zeros((tiles, 16, 32), np.uint8)
    b_tiles = np.zeros((tiles, 8, 32), np.uint8)
    c_tiles = np.zeros((tiles, 16, 8), np.float32)
    a_tiles[tile, lane] = a.astype(np.uint8)
    b_tiles[tile, lane] = b.astype(np.uint8)
    c_tiles[tile, lane, lane] = np.asarray(c, np.uint32).view(np.float32)
    d = run_mma(cupy, "e4m3", "e4m3", a_tiles, b_tiles, c_tiles)
    return d[tile, lane, lane].astype(np.uint64)


def h200_wgmma_e4m3(a, b, scale_a, scale_b, c):
    """A probe unit: E4M3 x E4M3 -> fp32 through Triton's tl.dot (one wgmma m64n64k32), K = 32.

    Dot product r sits on the diagonal of a 64 x 64 tile (row r % 64 of A and of B).
    """
    import torch

    n, k = a.shape
    if k != 32:
        raise ValueError(f"K must be 32, got {k}")
    tiles = -(-n // 64)
    rows = np.arange(n)
    tile, lane = rows // 64, rows % 64
    a_tiles = np.zeros((tiles, 64, 32), np.uint8)
    b_tiles = np.zeros((tiles, 64, 32), np.uint8)
    c_tiles = np.zeros((tiles, 64, 64), np.float32)
    a_tiles[tile, lane] = a.astype(np.uint8)
    b_tiles[tile, lane] = b.astype(np.uint8)
    c_tiles[tile, lane, lane] = np.asarray(c, np.uint32).view(np.float32)
    d, _ = run_tl(torch, "e4m3", "e4m3", a_tiles, b_tiles, c_tiles, False)
    return d[tile, lane, lane].astype(np.uint64)


def main(out_dir: str, parts: list[str]) -> int:
    import cupy
    import torch

    log("device:", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
    log("torch", torch.__version__, "cuda", torch.version.cuda, "cupy", cupy.__version__)
    rng = np.random.default_rng(SEED)  # one stream through mma, tl and mm, in that order
    steps = {
        "mma": lambda results: measure_mma(cupy, rng, results, tiles=512),
        "tl": lambda results: measure_triton(torch, rng, results, tiles=16),
        "mm": lambda results: measure_scaled_mm(torch, rng, results),
        "chain": lambda results: measure_mma_chains(
            cupy, np.random.default_rng(SEED + 1), results, tiles=256
        ),
        "tl16": lambda results: measure_triton(
            torch, np.random.default_rng(SEED + 2), results, tiles=8, cases=WIDE_TL_CASES
        ),
        "mm16": lambda results: measure_torch_mm(torch, np.random.default_rng(SEED + 3), results),
        "addmm": lambda results: measure_addmm(torch, np.random.default_rng(SEED + 4), results),
        "linear": lambda results: measure_linears(torch, np.random.default_rng(SEED + 5), results),
        "decode": lambda results: measure_decode_linears(
            torch, np.random.default_rng(SEED + 6), results
        ),
    }
    for part in parts:
        results: dict[str, np.ndarray] = {}
        try:
            steps[part](results)
        except Exception:
            log(f"{part}: FAILED\n" + traceback.format_exc())
        # files of at most about 12 MB of arrays (what a transfer takes back)
        chunks: list[dict] = [{}]
        for key, value in results.items():
            if chunks[-1] and sum(v.nbytes for v in chunks[-1].values()) + value.nbytes > 12e6:
                chunks.append({})
            chunks[-1][key] = value
        for index, chunk in enumerate(chunks):
            suffix = f"-{index}" if len(chunks) > 1 else ""
            np.savez_compressed(os.path.join(out_dir, f"h200-{part}{suffix}.npz"), **chunk)
    with open(os.path.join(out_dir, "measure.log"), "w") as handle:
        handle.write("\n".join(LOG) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".", sys.argv[2:] or ["mma", "tl", "mm"]))
