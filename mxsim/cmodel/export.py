"""``mxsim export c``: one unit of a hardware config as a dependency-free C99 model.

The generated files (docs/cmodel.md):

- ``<name>.h``, ``<name>.c``: the plain C API, ``<name>_dot(a, b, scale_a, scale_b, c, k,
  stages)`` returning the output bits; the unit's parameters are written as ``CFG_<field>``
  macros, one per field of mxsim's kernel record (``datapath.schema.record_dtype``), and its
  formats as parameter vectors (the format table's data), above the engine (``engine.c``),
  which is the same text for every unit. No floating point: every value is an integer
  significand and exponent, every rounding an integer rounding into a format.
- ``<name>_dpi.c``: DPI-C entry points (``svdpi.h`` types) taking the packed buses of a golden
  vector (docs/golden.md: element i at bits [i*w +: w], scale j at [8j +: 8], c as FP32 or
  FP64 bits) and writing d; ``<name>_dpi.svh``: the matching ``import "DPI-C"`` lines.
- ``cmodel.json``: what was exported (config, digest, pair, K, layout, functions).
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

from ..datapath import load_hwconfig
from ..datapath.config import HardwareConfig
from ..datapath.schema import (
    NO_PRODUCT_OVERFLOW,
    NO_SPECIAL_ACCUMULATOR_EXPONENT,
    NO_ZERO_TERM_EXPONENT,
    kernel_record,
    keys,
    param_field,
    record_dtype,
)
from ..datapath.tables import products_fit_float64, sum_format
from ..errors import ArgumentError, ConfigError
from ..fileio import check_output_directory, json_text, staged_directory, write_atomic
from ..formats import E8M0_BIAS, E8M0_NAN, get_format

MANIFEST = "cmodel.json"
KIND = "mxsim C model"
#: Keys the kernel record does not hold that the export resolves itself: the scale and output
#: formats (written as format vectors) and same_format (decided when the pair is chosen).
RESOLVED_FIELDS = ("scale_format", "same_format", "output_format")
MAX_K = 4096  # the generated code keeps K codes per operand on the stack


def engine_text() -> str:
    """The engine's C text (the same for every unit)."""
    return resources.files(__package__).joinpath("engine.c").read_text(encoding="utf-8")


def c_name(*parts: str) -> str:
    """A C identifier from a config name and format names (``mxc_ocp_exact_fp4_e2m1_fp4_e2m1``)."""
    return "mxc_" + "_".join(
        re.sub(r"[^0-9A-Za-z]+", "_", part).strip("_").lower() for part in parts
    )


def uncovered(engine: str) -> list[str]:
    """Parameters the engine does not read: kernel-record fields without a ``CFG_`` macro in its
    text, and keys the record does not hold that are not a format the generator writes."""
    missing = [name for name in record_dtype().names if f"CFG_{name}" not in engine]
    for section, name, key in keys():
        field = param_field(name, key)
        if key.record is None and field is not None and field not in RESOLVED_FIELDS:
            missing.append(f"{section}.{name}")
    return missing


def _vector(name: str, fmt) -> str:
    values = ", ".join(str(int(v)) for v in fmt.kernel_params)
    return f"static const int64_t {name}[11] = {{{values}}};  /* {fmt.name} */"


def _unit(hw, a_format, b_format, k):
    """(config, params, a format, b format, K) after checking the arguments."""
    config = hw if isinstance(hw, HardwareConfig) else load_hwconfig(hw)
    pairs = list(config.format_pairs)
    if (a_format is None) != (b_format is None):
        raise ArgumentError("export c: give both --a-format and --b-format, or neither")
    if a_format is None:
        if len(pairs) != 1:
            listed = " ".join(f"{a},{b}" for a, b in pairs)
            raise ArgumentError(
                f"export c: the unit takes {len(pairs)} format pairs; choose one with --a-format and "
                f"--b-format among {listed}"
            )
        a_format, b_format = pairs[0]
    a_name, b_name = get_format(a_format).name, get_format(b_format).name
    if (a_name, b_name) not in pairs:
        raise ArgumentError(
            f"export c: {config.source}: the unit does not take {a_name} x {b_name}; accepted: "
            + " ".join(f"{a},{b}" for a, b in pairs)
        )
    params = config.params(a_name, b_name)
    if k is None:
        k = params.block_size
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ArgumentError(f"export c: --k must be an integer 1..{MAX_K}, got {k!r}")
    if params.scales != "none" and k % params.block_size:
        raise ArgumentError(
            f"export c: --k ({k}) must be a multiple of the unit's block size ({params.block_size}), "
            "as the golden vectors' layout is"
        )
    missing = uncovered(engine_text())
    if missing:
        raise ConfigError(
            config.source, missing[0], "this key is not covered by the C model (mxsim export c)"
        )
    return config, params, get_format(a_name), get_format(b_name), k


def _record_macros(params) -> list[str]:
    record = kernel_record(params)[0]
    lines = []
    for name in record_dtype().names:
        value = record[name]
        lines.append(f"#define CFG_{name} INT64_C({int(value)})")
    return lines


def generate(hw, a_format=None, b_format=None, k=None) -> dict[str, str]:
    """{file name: text} of the C model of one unit (see the module docstring)."""
    config, params, a_fmt, b_fmt, k = _unit(hw, a_format, b_format, k)
    name = c_name(config.name, a_fmt.name, b_fmt.name)
    up = name.upper()
    scaled = params.scales != "none"
    blocks = -(-k // params.block_size)
    c_container = get_format("fp64" if params.c_format == "fp64" else "fp32")
    out = get_format(params.output_format)
    acc = get_format("fp32" if params.accumulator_format == "exact" else params.accumulator_format)
    order = params.term_order or (0,)
    terms = params.fused_terms + 1  # a tree's terms and the accumulator
    header = f"""/* {name}.h: C model of the dot-product unit '{config.name}' ({a_fmt.name} x {b_fmt.name}), generated by
 * mxsim export c from {Path(config.source).name} (sha256 {config.digest}). Bit-exact with mxsim.dot; see docs/cmodel.md. */
#ifndef {up}_H
#define {up}_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {{  /* a simulator may build the model as C++ (Verilator does) */
#endif

#define {up}_K {k}                 /* elements per dot product (at most) */
#define {up}_BLOCK_SIZE {params.block_size}
#define {up}_SCALED {int(scaled)}             /* 1: the unit takes block scales ({params.scale_format} codes) */
#define {up}_A_BITS {a_fmt.bits}
#define {up}_B_BITS {b_fmt.bits}
#define {up}_C_BITS {c_container.bits}            /* c: {c_container.name} bits */
#define {up}_OUT_BITS {out.bits}          /* the result: {out.name} bits */
#define {up}_MAX_TREES 64

/* Stage values of one dot product (the first {up}_MAX_TREES trees). */
typedef struct {{
    int trees;                          /* trees the dot product ran */
    int64_t reference[{up}_MAX_TREES];   /* a windowed tree's alignment reference R (-2^40: none or exact tree) */
    int64_t sum_total[{up}_MAX_TREES];   /* a windowed tree's kept sum: sum_total * 2^sum_lsb */
    int64_t sum_lsb[{up}_MAX_TREES];
    uint64_t accumulator[{up}_MAX_TREES];/* the accumulator after the tree ({acc.name} bits; 0 for an exact accumulator) */
    int special;                        /* running NaN/Inf: 0 none, 1 +Inf, 2 -Inf, 3 NaN */
}} {name}_stages;

/* d = c + sum_i a[i] * b[i] through the unit, as the unit's output bits.
 * a, b: k element codes ({a_fmt.name}, {b_fmt.name}: stored codes, as mxsim.dot takes them);
 * scale_a, scale_b: ceil(k / {params.block_size}) block scale codes ({params.scale_format}; NULL: every scale 1;
 * read only by a unit with scales); c: the accumulator input as {c_container.name} bits (a value of {params.c_format});
 * k: 0..{up}_K (other k, or a code out of range: returns 0 and sets *error when error is not NULL);
 * stages: NULL, or a record the stage values are written to. Reentrant: no global state. */
uint64_t {name}_dot(const uint64_t *a, const uint64_t *b, const uint32_t *scale_a, const uint32_t *scale_b,
                    uint64_t c, int k, {name}_stages *stages, int *error);

#ifdef __cplusplus
}}
#endif
#endif
"""
    record = "\n".join(_record_macros(params))
    source = f"""/* {name}.c: generated by mxsim export c; the unit's parameters, then the engine. */
#include <stdint.h>
#include <string.h>
#include "{name}.h"

{record}
#define MXC_NO_ZERO_TERM INT64_C({NO_ZERO_TERM_EXPONENT})
#define MXC_NO_PRODUCT_OVERFLOW INT64_C({NO_PRODUCT_OVERFLOW})
#define MXC_NO_SPECIAL_ACCUMULATOR INT64_C({NO_SPECIAL_ACCUMULATOR_EXPONENT})
#define MXC_WIDE_PRODUCTS {int(not products_fit_float64(a_fmt, b_fmt))}
#define MXC_MAX_TREES {up}_MAX_TREES
#define MXC_MAX_TERMS {terms}
typedef {name}_stages mxc_stage_record;
static const int64_t MXC_TERM_ORDER[{len(order)}] = {{{", ".join(str(int(i)) for i in order)}}};
{_vector("MXF_A", a_fmt)}
{_vector("MXF_B", b_fmt)}
{_vector("MXF_ACC", acc)}
{_vector("MXF_SUM", sum_format(params.sum_significant_bits or 24))}
{_vector("MXF_OUT", out)}
{_vector("MXF_FP32", get_format("fp32"))}
{_vector("MXF_C", c_container)}
{_vector("MXF_SCALE", get_format(params.scale_format))}

{engine_text()}
uint64_t {name}_dot(const uint64_t *a, const uint64_t *b, const uint32_t *scale_a, const uint32_t *scale_b,
                    uint64_t c, int k, {name}_stages *stages, int *error) {{
    uint64_t fa[{k}] = {{0}}, fb[{k}] = {{0}};
    int64_t sa[{blocks}] = {{0}}, sb[{blocks}] = {{0}};
    mxv terms[MXC_MAX_TERMS];
    int64_t exps[MXC_MAX_TERMS];
    mxw w, tw, kw;
    mxc_dot d;
    int i, blocks = (k + {params.block_size} - 1) / {params.block_size};
    if (error) *error = 0;
    if (k < 0 || k > {k} || c >> ({c_container.bits} - 1) >> 1) {{ if (error) *error = 1; return 0; }}
    for (i = 0; i < k; i++) {{
        if (a[i] >> ({a_fmt.bits} - 1) >> 1 || b[i] >> ({b_fmt.bits} - 1) >> 1
            || a[i] & {(1 << a_fmt.padding_bits) - 1} || b[i] & {(1 << b_fmt.padding_bits) - 1}) {{ if (error) *error = 1; return 0; }}
        fa[i] = a[i] >> {a_fmt.padding_bits}; fb[i] = b[i] >> {b_fmt.padding_bits};
    }}
    for (i = 0; i < blocks; i++) {{
        uint32_t xa = scale_a ? scale_a[i] : {_scale_one(params)}, xb = scale_b ? scale_b[i] : {_scale_one(params)};
        if (xa >> {get_format(params.scale_format).bits} || xb >> {get_format(params.scale_format).bits}) {{ if (error) *error = 1; return 0; }}
        if (CFG_scales == 3) {{ sa[i] = xa; sb[i] = xb; }}
        else {{  /* E8M0: the exponent, or NaN */
            sa[i] = xa == {E8M0_NAN} ? SCALE_NAN_EXP : (int64_t)xa - {E8M0_BIAS};
            sb[i] = xb == {E8M0_NAN} ? SCALE_NAN_EXP : (int64_t)xb - {E8M0_BIAS};
        }}
    }}
    mxw_init(&w); mxw_init(&tw); mxw_init(&kw);
    d.a = fa; d.b = fb; d.sa = sa; d.sb = sb; d.n = k; d.terms = terms; d.exps = exps; d.w = &w; d.tw = &tw; d.kw = &kw;
    return mx_code_of(dot_one(&d, mx_decode(c, MXF_C), stages), MXF_OUT);
}}
"""
    dpi, svh = _dpi(name, params, a_fmt, b_fmt, k, blocks, c_container, out)
    manifest = {
        "kind": KIND,
        "config": config.name,
        "config_sha256": config.digest,
        "a_format": a_fmt.name,
        "b_format": b_fmt.name,
        "k": k,
        "block_size": params.block_size,
        "scaled": scaled,
        "scale_format": params.scale_format,
        "c_bits": c_container.name,
        "out_format": out.name,
        "c_function": f"{name}_dot",
        "dpi_functions": [f"{name}_dpi", f"{name}_dpi_print_stages"],
        "files": [f"{name}.h", f"{name}.c", f"{name}_dpi.c", f"{name}_dpi.svh"],
    }
    return {
        f"{name}.h": header,
        f"{name}.c": source,
        f"{name}_dpi.c": dpi,
        f"{name}_dpi.svh": svh,
        MANIFEST: json_text(manifest, indent=2) + "\n",
    }


def _scale_one(params) -> int:
    """The scale code of 1.0 (what NULL scales mean)."""
    return int(get_format(params.scale_format).encode([1.0])[0])


def _dpi(name, params, a_fmt, b_fmt, k, blocks, c_container, out) -> tuple[str, str]:
    """(the DPI-C source, the SystemVerilog import lines)."""
    scaled = params.scales != "none"
    ports = [("a", k * a_fmt.bits), ("b", k * b_fmt.bits)]
    if scaled:
        ports += [("scale_a", blocks * 8), ("scale_b", blocks * 8)]
    ports.append(("c", c_container.bits))
    c_args = ", ".join(f"const svBitVecVal *{port}" for port, _ in ports)
    sv_args = ", ".join(f"input bit [{bits - 1}:0] {port}" for port, bits in ports)
    unpack_scales = (
        f"""    for (i = 0; i < {blocks}; i++) {{ xa[i] = (uint32_t)field(scale_a, i * 8, 8); xb[i] = (uint32_t)field(scale_b, i * 8, 8); }}
"""
        if scaled
        else ""
    )
    scale_args = "xa, xb" if scaled else "NULL, NULL"
    unpack = f"""    uint64_t ea[{k}], eb[{k}], cc; uint32_t xa[{blocks}], xb[{blocks}]; int i;
    for (i = 0; i < {k}; i++) {{ ea[i] = field(a, i * {a_fmt.bits}, {a_fmt.bits}); eb[i] = field(b, i * {b_fmt.bits}, {b_fmt.bits}); }}
{unpack_scales}    cc = field(c, 0, {c_container.bits});
    (void)xa; (void)xb;
"""
    dpi = f"""/* {name}_dpi.c: DPI-C entry points of {name} (generated by mxsim export c). The buses are packed as
 * mxsim's golden vectors pack them (docs/golden.md); compile with the simulator's svdpi.h. */
#include <stdio.h>
#include "svdpi.h"
#include "{name}.h"
#ifdef __cplusplus
extern "C" {{
#endif
void {name}_dpi({c_args}, svBitVecVal *d);
void {name}_dpi_print_stages({c_args});
#ifdef __cplusplus
}}
#endif

static uint64_t field(const svBitVecVal *bus, int lsb, int bits) {{
    uint64_t value = 0; int i;
    for (i = 0; i < bits; i++) value |= (uint64_t)((bus[(lsb + i) / 32] >> ((lsb + i) % 32)) & 1u) << i;
    return value;
}}

/* d = the unit's result on the packed operands. */
void {name}_dpi({c_args}, svBitVecVal *d) {{
{unpack}    {{
        uint64_t result = {name}_dot(ea, eb, {scale_args}, cc, {k}, NULL, NULL);
        d[0] = (svBitVecVal)(result & 0xFFFFFFFFu);
        if ({out.bits} > 32) d[1] = (svBitVecVal)(result >> 16 >> 16);
    }}
}}

/* Prints the stage values of the dot product on the packed operands (a mismatch report). */
void {name}_dpi_print_stages({c_args}) {{
{unpack}    {{
        {name}_stages st; int t;
        uint64_t result = {name}_dot(ea, eb, {scale_args}, cc, {k}, &st, NULL);
        printf("{name}: %d trees, special %d, result 0x%llx\\n", st.trees, st.special, (unsigned long long)result);
        for (t = 0; t < st.trees && t < {name.upper()}_MAX_TREES; t++) {{
            if (st.reference[t] == -(INT64_C(1) << 40)) printf("  tree %d: exact sum", t);
            else printf("  tree %d: R %lld, window sum %lld * 2^%lld", t, (long long)st.reference[t],
                        (long long)st.sum_total[t], (long long)st.sum_lsb[t]);
            printf(", accumulator after it 0x%llx\\n", (unsigned long long)st.accumulator[t]);
        }}
    }}
}}
"""
    svh = f"""// {name}_dpi.svh: import "DPI-C" declarations of the C model {name} (generated by mxsim export c).
// Compile {name}.c and {name}_dpi.c with the simulator (Verilator: list them; Xcelium, VCS, Questa: as DPI
// sources or a shared library, docs/cmodel.md).
import "DPI-C" function void {name}_dpi({sv_args}, output bit [{out.bits - 1}:0] d);
import "DPI-C" function void {name}_dpi_print_stages({sv_args});
"""
    return dpi, svh


def _is_own(directory: Path) -> bool:
    manifest = directory / MANIFEST
    try:
        return manifest.is_file() and KIND in manifest.read_text(encoding="utf-8")[:4096]
    except (OSError, UnicodeDecodeError):
        return False


def export_c(hw, out, a_format=None, b_format=None, k=None) -> dict:
    """Write the C model of one unit of ``hw`` (a config or its YAML path) into the directory
    ``out``, replaced as a whole and atomically (absent, empty, or an earlier C model export).
    Returns the manifest: the generated files and functions."""
    target = check_output_directory(out, _is_own, "export c --out")
    files = generate(hw, a_format, b_format, k)
    with staged_directory(target) as staging:
        for file_name, text in files.items():
            write_atomic(staging / file_name, text)
    return json.loads(files[MANIFEST])
