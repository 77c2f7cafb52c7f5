"""Replay a trace's layers through hardware datapaths and measure what they do to the numbers.

Per layer and per hardware config: the layer's GEMM view (``lowering``) is quantized as the
trace says (an MX spec along K with the unit's block size and a format the unit accepts),
or else with the unit's first accepted format under the OCP profile; units without block
scales (plain FP8 tensor cores) get one power-of-two scale per operand tensor, applied
outside the unit, as FP8 inference does. ``mxsim.matmul`` computes every output bit; the
bias is added in float64 afterwards. Metrics compare against the float reference (the
framework's own output) and the ideal MX result (the same quantized operands multiplied in
float64: exact products, sums rounded only at 2^-53 relative).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..cycles import GemmLayer, estimate_layer, storage_for_format
from ..datapath import HardwareConfig, matmul
from ..errors import MxsimError
from ..formats import get_format
from ..quantize import MXTensor, quantize, quantize_bfp, resolve_options
from .format import Layer, Trace
from .lowering import gemm_axis, gemm_shape, lift_output, lower_input, lower_weight
from .network import accuracy, layer_with_input, perplexity
from .quant import BFPQuant, MXQuant


@dataclass
class OperandChoice:
    """How one operand was quantized for one unit, and why."""

    format: str
    profile: str
    per_tensor_scale: bool
    note: str = ""


@dataclass
class LayerResult:
    """Numbers of one layer through one unit (see :func:`replay_layer`)."""

    layer: str
    hw: str
    macs: int
    input: OperandChoice
    weight: OperandChoice
    sqnr_vs_float_db: float
    max_abs_error_vs_float: float
    max_rel_error_vs_float: float
    sqnr_vs_ideal_db: float
    max_abs_error_vs_ideal: float
    max_ulp_error_vs_ideal: float
    mean_ulp_error_vs_ideal: float
    seconds: float
    cycles: dict | None = None
    bits: np.ndarray | None = field(default=None, repr=False)
    errors_vs_float: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("bits")
        out.pop("errors_vs_float")
        return out


def _sqnr_db(reference: np.ndarray, error: np.ndarray) -> float:
    noise = float(np.sum(np.square(error)))
    signal = float(np.sum(np.square(reference)))
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def _choose(layer: Layer, operand: str, hw: HardwareConfig, element_format: str | None = None,
            per_tensor_scale: bool | None = None) -> tuple[OperandChoice, MXQuant | BFPQuant | None]:
    """The quantization of ``operand`` on ``hw``: ``element_format`` if given (OCP profile),
    else the trace's MX spec if the unit can run it, else the unit's first format.
    ``per_tensor_scale``: None follows the unit (per-tensor when it has no block scales)."""
    accepted = hw.a_formats if operand == "input" else hw.b_formats
    block = hw.sections[("inputs", "block_size")]
    per_tensor = hw.sections[("inputs", "scales")] == "none"
    if per_tensor_scale is not None:
        if per_tensor and not per_tensor_scale:
            raise MxsimError(f"{hw.name} has no block scales: its operands need per-tensor scaling")
        per_tensor = per_tensor_scale
    if element_format is not None:
        name = get_format(element_format).name
        if name not in accepted:
            raise MxsimError(f"{hw.name} does not take {name} for the {operand}; it takes {', '.join(accepted)}")
        return OperandChoice(name, "ocp", per_tensor, "format chosen by the caller"), None
    spec = layer.quant.get(operand)
    note = ""
    if isinstance(spec, MXQuant):
        fmt = get_format(spec.format).name
        along_k = gemm_axis(layer, operand, spec.axis) == "K"
        if fmt in accepted and along_k and spec.block_size == block and not per_tensor:
            return OperandChoice(fmt, spec.profile, False), spec
        note = (f"trace spec {fmt}/block {spec.block_size} replaced: the unit takes "
                f"{', '.join(accepted)} with {'no block scales' if per_tensor else f'blocks of {block}'}")
    elif isinstance(spec, BFPQuant):
        m = spec.spec.mantissa_bits
        fmt = {2: "mx4", 4: "mx6", 7: "mx9"}.get(m) if spec.spec.has_microexponents else None
        along_k = gemm_axis(layer, operand, spec.axis) == "K"
        if fmt in accepted and along_k and spec.spec.sub_block_size == block and not per_tensor:
            return OperandChoice(fmt, "bfp", False), spec
        note = f"trace spec BFP (bit width {spec.spec.bit_width}) replaced: the unit takes {', '.join(accepted)}"
    elif spec is not None:
        note = f"trace spec {type(spec).__name__} is not an MX element format; replaced"
    return OperandChoice(accepted[0], "ocp", per_tensor, note), None


def _quantize_operand(matrix: np.ndarray, choice: OperandChoice, spec, block: int):
    """(MXTensor along axis 1 of ``matrix`` (rows, K), per-tensor scale exponent)."""
    matrix = np.ascontiguousarray(matrix)
    if matrix.dtype not in (np.float16, np.float32, np.float64):
        matrix = matrix.astype(np.float64)
    if isinstance(spec, BFPQuant):  # MX4/6/9: elements and sub-block scales (microexponents)
        return quantize_bfp(matrix, spec.spec, axis=1).as_mx_tensor(), 0
    if choice.per_tensor_scale:
        # One OCP floor-rule scale for the whole tensor; the elements are x * 2^-X rounded
        # (nearest even, saturating) into the format; every block scale of the unit is 1.
        whole = quantize(matrix.reshape(1, -1), choice.format, axis=1, block_size=max(matrix.size, 1), profile="ocp")
        if whole.scales[0, 0] == 255:
            raise MxsimError("an operand has NaN/Inf: no per-tensor scale exists")
        exponent = int(whole.scales[0, 0]) - 127
        fmt = get_format(choice.format)
        codes = fmt.encode(matrix.astype(np.float64) * 2.0 ** (-exponent))
        padding = -matrix.shape[1] % block
        codes = np.pad(codes, ((0, 0), (0, padding)))
        scales = np.full((matrix.shape[0], codes.shape[1] // block), 127, dtype=np.uint8)
        return MXTensor(fmt, codes, scales, matrix.shape, 1, block, padding, resolve_options("ocp")), exponent
    options = dict(spec.options) if spec is not None else {}
    return quantize(matrix, choice.format, axis=1, block_size=block, profile=choice.profile, **options), 0


def layer_gemm(layer: Layer, hw: HardwareConfig, x: np.ndarray | None = None, element_format: str | None = None,
               *, weight_format: str | None = None, per_tensor_scale: bool | None = None,
               out_format: str | None = None):
    """Run ``layer`` (its recorded input, or ``x``) through ``hw`` (operands in
    ``element_format`` if given; the weight in ``weight_format`` if given, else the same;
    ``per_tensor_scale`` as in :func:`_choose`; ``out_format`` passed to :func:`mxsim.matmul`).

    Returns (output in the layer's layout as float64, ideal MX output, output bits (G, M, N),
    the GEMM outputs and their ideal values before bias (G, M, N), input choice, weight choice).
    """
    at = layer if x is None else layer_with_input(layer, x)
    block = hw.sections[("inputs", "block_size")]
    input_choice, input_spec = _choose(at, "input", hw, element_format, per_tensor_scale)
    weight_choice, weight_spec = _choose(at, "weight", hw, weight_format or element_format, per_tensor_scale)
    a = lower_input(at)
    b = lower_weight(at)
    shape = gemm_shape(at)
    out = np.empty((shape.groups, shape.m, shape.n), dtype=np.float64)
    ideal = np.empty_like(out)
    bits = None
    for g in range(shape.groups):
        qa, ea = _quantize_operand(a[g], input_choice, input_spec, block)
        qb_rows, eb = _quantize_operand(b[g], weight_choice, weight_spec, block)
        # B as (K, N) quantized along axis 0 is the same MXTensor data as B (N, K) along axis 1.
        qb = dataclasses.replace(qb_rows, shape=(qb_rows.shape[1], qb_rows.shape[0]), axis=0)
        result = matmul(hw, qa, qb, out_format=out_format)
        if bits is None:
            bits = np.empty((shape.groups, shape.m, shape.n), dtype=result.bits.dtype)
        bits[g] = result.bits
        factor = 2.0 ** (ea + eb)
        out[g] = result.values * factor
        ideal[g] = (qa.dequantize() @ qb.dequantize()) * factor
    bias = None if at.bias is None else at.bias.astype(np.float64)
    return (lift_output(at, out, bias), lift_output(at, ideal, bias), bits, (out, ideal),
            input_choice, weight_choice)


def _ulp_errors(values: np.ndarray, ideal: np.ndarray, out_format: str) -> np.ndarray:
    """|value - ideal| in units of the output format's spacing at the ideal value (GEMM outputs,
    before bias; near-cancelling outputs have tiny spacings, so the maximum is heavy-tailed)."""
    fmt = get_format(out_format)
    magnitude = np.abs(ideal)
    exponent = np.floor(np.log2(np.maximum(magnitude, fmt.min_normal)))
    ulp = np.exp2(exponent - fmt.mantissa_bits)
    return np.abs(values - ideal) / ulp


def replay_layer(layer: Layer, hw: HardwareConfig, element_format: str | None = None) -> LayerResult:
    """One layer through one unit, with its metrics and (if the config has ``array:``) cycles."""
    import time

    start = time.perf_counter()
    values, ideal, bits, (gemm_values, gemm_ideal), input_choice, weight_choice = layer_gemm(
        layer, hw, element_format=element_format)
    seconds = time.perf_counter() - start
    reference = layer.output.astype(np.float64)
    error = values - reference
    finite = np.isfinite(values) & np.isfinite(reference)
    scale = np.maximum(np.abs(reference), np.finfo(np.float32).tiny)
    shape = gemm_shape(layer)
    out_format = hw.sections[("output", "format")]
    gemm_finite = np.isfinite(gemm_values) & np.isfinite(gemm_ideal)
    ulps = _ulp_errors(gemm_values[gemm_finite], gemm_ideal[gemm_finite], out_format)
    cycles = None
    if hw.array is not None:
        storage = {
            "a": storage_for_format(input_choice.format),
            "b": storage_for_format(weight_choice.format),
            "out": storage_for_format(out_format),
        }
        estimate = estimate_layer(hw.array, GemmLayer(layer.name, shape.m, shape.n * shape.groups, shape.k),
                                  storage["a"], storage["b"], storage["out"])
        cycles = {"total_cycles": estimate.total_cycles, "compute_cycles": estimate.compute_cycles,
                  "memory_cycles": estimate.memory_cycles, "utilisation": estimate.utilisation}
    return LayerResult(
        layer=layer.name, hw=hw.name, macs=shape.macs, input=input_choice, weight=weight_choice,
        sqnr_vs_float_db=_sqnr_db(reference[finite], error[finite]),
        max_abs_error_vs_float=float(np.max(np.abs(error[finite]), initial=0.0)),
        max_rel_error_vs_float=float(np.max(np.abs(error[finite]) / scale[finite], initial=0.0)),
        sqnr_vs_ideal_db=_sqnr_db(ideal[finite], (values - ideal)[finite]),
        max_abs_error_vs_ideal=float(np.max(np.abs(values - ideal)[finite], initial=0.0)),
        max_ulp_error_vs_ideal=float(np.max(ulps, initial=0.0)),
        mean_ulp_error_vs_ideal=float(np.mean(ulps)) if ulps.size else 0.0,
        seconds=seconds, cycles=cycles, bits=bits, errors_vs_float=error[finite],
    )


def _progress(total: int, enabled: bool):
    """A tqdm bar if tqdm is installed, else a plain counter on stderr; None when disabled."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="layer", file=sys.stderr)
    except ImportError:
        class Counter:
            done = 0

            def update(self, n=1):
                self.done += n
                print(f"\rreplay: {self.done}/{total} layer runs", end="", file=sys.stderr, flush=True)

            def close(self):
                print(file=sys.stderr)

        return Counter()


def replay(trace: Trace, units: Sequence[HardwareConfig], end_to_end: bool = False,
           progress: bool = False, on_layer: Callable[[LayerResult], None] | None = None,
           element_format: str | None = None) -> dict:
    """Replay every layer of ``trace`` through each unit; totals, pairwise bit agreement and,
    with ``end_to_end``, the task metric with every layer computed by each unit: accuracy for
    a network with labels, perplexity for one with targets (rebuilt, run in PyTorch). With
    ``element_format`` every operand is quantized to it (OCP profile) instead of the trace's specs."""
    if not units:
        raise MxsimError("replay needs at least one hardware config")
    names = [hw.name for hw in units]
    if len(set(names)) != len(names):
        raise MxsimError(f"hardware configs must have distinct names, got {names}")
    bar = _progress(len(trace.layers) * len(units), progress)
    results: dict[str, list[LayerResult]] = {hw.name: [] for hw in units}
    for layer in trace.layers:
        for hw in units:
            result = replay_layer(layer, hw, element_format)
            results[hw.name].append(result)
            if on_layer:
                on_layer(result)
            if bar:
                bar.update(1)
    if bar:
        bar.close()
    report = {"trace": trace.name, "units": names, "element_format": element_format, "layers": [], "totals": {},
              "agreement": [], "end_to_end": None}
    for index, layer in enumerate(trace.layers):
        report["layers"].append({"layer": layer.name, "op": layer.op,
                                 "results": [results[n][index].to_dict() for n in names]})
    for name in names:
        rows = results[name]
        errors = np.concatenate([r.errors_vs_float for r in rows]) if rows else np.zeros(0)
        report["totals"][name] = {
            "macs": int(sum(r.macs for r in rows)),
            "seconds": float(sum(r.seconds for r in rows)),
            "worst_layer_sqnr_vs_float_db": min((r.sqnr_vs_float_db for r in rows), default=math.inf),
            "max_abs_error_vs_float": float(np.max(np.abs(errors), initial=0.0)),
            "max_ulp_error_vs_ideal": max((r.max_ulp_error_vs_ideal for r in rows), default=0.0),
            "cycles": sum(r.cycles["total_cycles"] for r in rows) if all(r.cycles for r in rows) and rows else None,
        }
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            same = total = 0
            for a, b in zip(results[first], results[second]):
                if a.bits.dtype == b.bits.dtype:
                    same += int(np.sum(a.bits == b.bits))
                total += a.bits.size
            report["agreement"].append({"units": [first, second], "bit_identical_fraction": same / total if total else 1.0})
    if end_to_end and trace.network is not None and trace.network.targets is not None:  # a language model
        report["end_to_end"] = {"float_perplexity": perplexity(trace), "perplexity": {
            hw.name: perplexity(trace, hw, a_format=element_format) for hw in units}}
    elif end_to_end:
        float_accuracy = accuracy(trace)
        report["end_to_end"] = {"float_accuracy": float_accuracy, "accuracy": {}}
        for hw in units:
            report["end_to_end"]["accuracy"][hw.name] = accuracy(
                trace, layer_fn=lambda layer, x, hw=hw: layer_gemm(layer, hw, x, element_format)[0]
            )
    report["_results"] = results
    return report


def format_report(report: dict) -> str:
    """The replay report as a terminal table."""
    lines = [f"trace {report['trace']}: {len(report['layers'])} layers through {', '.join(report['units'])}"]
    header = f"{'layer':16s} {'unit':18s} {'MACs':>10s} {'SQNR/float dB':>13s} {'maxabs/float':>12s} " \
             f"{'SQNR/ideal dB':>13s} {'max ulp':>9s} {'cycles':>10s}"
    lines += [header, "-" * len(header)]
    for entry in report["layers"]:
        for r in entry["results"]:
            cycles = r["cycles"]["total_cycles"] if r["cycles"] else "-"
            lines.append(
                f"{entry['layer'][:16]:16s} {r['hw'][:18]:18s} {r['macs']:10d} {r['sqnr_vs_float_db']:13.2f} "
                f"{r['max_abs_error_vs_float']:12.4g} {r['sqnr_vs_ideal_db']:13.2f} {r['max_ulp_error_vs_ideal']:9.3g} {cycles!s:>10s}"
            )
    lines.append("")
    for name, total in report["totals"].items():
        cycles = f", {total['cycles']} cycles" if total["cycles"] is not None else ""
        lines.append(f"total {name}: {total['macs']} MACs in {total['seconds']:.2f} s, worst layer SQNR vs float "
                     f"{total['worst_layer_sqnr_vs_float_db']:.2f} dB, max ulp vs ideal {total['max_ulp_error_vs_ideal']:.3g}{cycles}")
    for pair in report["agreement"]:
        lines.append(f"bit-identical outputs {pair['units'][0]} vs {pair['units'][1]}: {100 * pair['bit_identical_fraction']:.2f}%")
    if report["end_to_end"]:
        e2e = report["end_to_end"]
        if "perplexity" in e2e:
            lines.append(f"end to end: float perplexity {e2e['float_perplexity']:.4f}")
            lines += [f"  {name}: perplexity {value:.4f}" for name, value in e2e["perplexity"].items()]
        else:
            lines.append(f"end to end: float accuracy {100 * e2e['float_accuracy']:.2f}%")
            for name, value in e2e["accuracy"].items():
                lines.append(f"  {name}: accuracy {100 * value:.2f}%")
    return "\n".join(lines)


def write_histograms(report: dict, directory) -> list[str]:
    """PNG histograms of output error vs float per layer and unit (needs matplotlib)."""
    from pathlib import Path

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MxsimError("--plots needs matplotlib: pip install 'mxsim[plots]'") from None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows in report["_results"].items():
        for r in rows:
            figure, axes = plt.subplots(figsize=(5, 3))
            errors = r.errors_vs_float
            axes.hist(errors, bins=60, color="tab:blue")
            axes.set_title(f"{r.layer} on {name}: output - float reference")
            axes.set_xlabel("error")
            axes.set_ylabel("outputs")
            figure.tight_layout()
            path = directory / f"{r.layer}__{name}.png"
            temporary = path.with_suffix(".png.tmp")
            figure.savefig(temporary, format="png")
            plt.close(figure)
            temporary.replace(path)
            written.append(str(path))
    return written
