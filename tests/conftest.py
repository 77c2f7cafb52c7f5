"""Shared fixtures and helpers for the mxsim test suite."""

from __future__ import annotations

import fnmatch
import importlib
import math
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import settings

from mxsim.formats import FORMATS

settings.register_profile("default", max_examples=200, deadline=None)
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")

REPO = Path(__file__).resolve().parent.parent

NARROW_FORMATS = [name for name, fmt in FORMATS.items() if fmt.bits <= 8]
SIXTEEN_BIT_OR_LESS = [name for name, fmt in FORMATS.items() if fmt.bits <= 16]
#: Where tests/test_fuzz.py leaves its outcome counts for the terminal summary.
FUZZ_OUTCOMES = pytest.StashKey[dict]()


def any_pair(name: str):
    """The shipped config ``name`` taking every (A, B) pair of its formats (``format_groups``
    null): its datapath on pairs no instruction takes, for tests of rows that need them."""
    import dataclasses

    from mxsim.datapath import load_hwconfig

    config = load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
    return dataclasses.replace(
        config,
        name=f"{name}-any-pair",
        sections={**config.sections, ("inputs", "format_groups"): None},
    )


def arrays_in(obj) -> list[np.ndarray]:
    """Every numpy array held by ``obj``: itself, or (recursively) a dataclass's fields, a
    list's, tuple's or dict's items (an MXTensor's codes and scales, a kept ``b_memo``)."""
    import dataclasses

    if isinstance(obj, np.ndarray):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = [getattr(obj, field.name) for field in dataclasses.fields(obj)]
    elif isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [array for item in obj for array in arrays_in(item)]
    return []


def byte_copies(obj) -> list[tuple]:
    """(dtype, shape, bytes) of every array of :func:`arrays_in`: compared before and after
    a call, whether it wrote into any of them (a -0 or NaN payload included)."""
    return [(a.dtype, a.shape, a.tobytes()) for a in arrays_in(obj)]


def same_float(a: float, b: float) -> bool:
    """Equal as values, with NaN equal to NaN and the sign of zero compared."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def import_or_skip(module: str, extra: str):
    """``module``, or a skip naming the extra that installs it (a failure when CI is set: CI
    installs every extra the README's test command names)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        message = f"{module} is not installed ({error}): pip install 'mxsim[{extra}]'"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; it is required when CI is set", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def torch():
    """torch, or a skip with the install hint (a failure when CI is set: CI must test capture)."""
    return import_or_skip("torch", "torch")


# --- inputs for the live-oracle tests (tests/test_oracles_*.py) ------------------------------

#: float32 corners: +-0, subnormals (smallest, largest, 2^-127), smallest normals, +-max, then
#: Inf/NaN (last four; ``nonfinite=False`` leaves them out).
CORNER_BITS = np.array(
    [
        0x00000000,
        0x80000000,
        0x00000001,
        0x807FFFFF,
        0x00400000,
        0x00800000,
        0x80800000,
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0xFFC00001,
    ],
    np.uint32,
)


def corner_float32(
    rng: np.random.Generator, rows: int, cols: int, nonfinite: bool = True
) -> np.ndarray:
    """float32 (rows, cols) that hit rounding corners of any block quantizer along axis 1.

    Each row clusters its exponents just below a random top exponent (an eighth of the rows
    near the subnormal range, an eighth at float32's largest binade), so blocks share scales
    and elements fall at every distance below them. Fractions are cut to a random number of
    leading bits, then get exactly the next half bit (ties at every precision), all ones below
    it (carries, the largest mantissa), or the half bit plus one unit (just above a tie). About
    3 % of the elements are CORNER_BITS (zeros, subnormals, extremes, Inf/NaN).
    """
    top = rng.integers(1, 255, size=(rows, 1))
    top[: rows // 8] = rng.integers(1, 6, size=(rows // 8, 1))
    top[rows // 8 : rows // 4] = 254
    exponent = np.clip(top - rng.geometric(0.35, size=(rows, cols)) + 1, 0, 254)
    low = (1 << (23 - rng.integers(0, 24, size=(rows, cols)))) - 1  # fraction bits cut off
    fraction = rng.integers(0, 2**23, size=(rows, cols)) & ~low
    half = (low + 1) >> 1
    kind = rng.integers(0, 4, size=(rows, cols))
    fraction |= np.select([kind == 1, kind == 2, kind == 3], [half, low, half + (half > 1)], 0)
    bits = (rng.integers(0, 2, size=(rows, cols)) << 31) | (exponent << 23) | fraction
    corners = CORNER_BITS if nonfinite else CORNER_BITS[:-4]
    bits = np.where(rng.random((rows, cols)) < 0.03, rng.choice(corners, size=(rows, cols)), bits)
    return bits.astype(np.uint32).view(np.float32)


def realistic_float32(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """float32 (rows, cols): Gaussian and heavy-tailed (Student t, 3 dof) rows, each scaled by
    its own power of two in 2^-30 .. 2^30, as activations and weights of real layers look."""
    scale = np.exp2(rng.integers(-30, 31, size=(rows, 1)).astype(np.float64))
    values = rng.standard_normal((rows, cols))
    values[::3] = rng.standard_t(3, size=values[::3].shape)
    return (values * scale).astype(np.float32)


def oracle_inputs(seed: int, rows: int = 96, cols: int = 96, nonfinite: bool = True) -> np.ndarray:
    """Corner rows stacked on realistic rows (2 * rows, cols), float32."""
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [corner_float32(rng, rows, cols, nonfinite), realistic_float32(rng, rows, cols)]
    )


def bit_mismatches(got, want, where=None) -> tuple[int, list]:
    """(count, first few) of elements whose float bits differ; any NaN equals any NaN (the
    libraries' NaN payloads are not modelled). ``where`` restricts the comparison."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (
        got.shape,
        got.dtype,
        want.shape,
        want.dtype,
    )
    unsigned = {4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    differ = (got.view(unsigned) != want.view(unsigned)) & ~(np.isnan(got) & np.isnan(want))
    if where is not None:
        differ &= where
    examples = [
        (tuple(int(i) for i in index), got[tuple(index)], want[tuple(index)])
        for index in np.argwhere(differ)[:5]
    ]
    return int(differ.sum()), examples


# --- models quantized by a library, for tests/test_capture_torch_*.py -------------------------


def trained_like(torch, layers, seed: int = 0) -> None:
    """Student-t weights scaled 1/sqrt(K) (as trained layers are) and small biases, in place."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for layer in layers:
            n, k = layer.weight.shape
            layer.weight.copy_(
                torch.from_numpy((rng.standard_t(4, (n, k)) / np.sqrt(k)).astype(np.float32))
            )
            layer.bias.copy_(torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 0.1))


def outlier_activations(torch, seed: int = 1):
    """(2, 6, 64) float32: heavy-tailed tokens, three outlier channels 30-80x the rest (as in LLMs)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_t(5, (2, 6, 64))
    x[..., [3, 17, 40]] *= [30.0, -80.0, 45.0]
    return torch.from_numpy(x.astype(np.float32))


def sqnr_db(want: np.ndarray, got: np.ndarray) -> float:
    error = np.asarray(got, np.float64) - want
    return float(
        10 * np.log10(np.sum(want.astype(np.float64) ** 2) / max(np.sum(error**2), 1e-300))
    )


def require_module(name: str, extra: str):
    """Import ``name``, or skip with the install hint (a failure when CI is set: CI has every extra)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(
                f"{name} is required when CI is set: pip install 'mxsim[{extra}]'", pytrace=False
            )
        pytest.skip(f"{name} is not installed (pip install 'mxsim[{extra}]')")


@pytest.fixture(params=NARROW_FORMATS)
def narrow_format(request):
    return FORMATS[request.param]


def as_float64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


class _TransformerOutput:
    """Wraps a `transformers` model so that it takes one tensor and returns one tensor (for
    capture and ONNX export): token ids with an all-ones attention mask, or pixel values;
    the pooled output where the model has a pooler (so every matmul feeds the result)."""

    def __new__(cls, torch, model):
        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, x):
                if x.is_floating_point():
                    return self.model(pixel_values=x).pooler_output
                if (
                    hasattr(self.model.config, "use_cache")
                    and "Bert" not in type(self.model).__name__
                ):
                    return self.model(
                        input_ids=x, attention_mask=torch.ones_like(x), use_cache=False
                    ).logits
                return self.model(input_ids=x, attention_mask=torch.ones_like(x)).pooler_output

        return Wrapped().eval()


def tiny_transformer(torch, family: str, attn_implementation: str = "sdpa"):
    """(model, sample input) for a GPT-2, BERT, LLaMA or ViT built from a `transformers` config:
    2 layers, hidden size 32, 4 heads (LLaMA: 2 key/value heads), seeded weights, no hub."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = {"attn_implementation": attn_implementation}
    if family == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=4,
            vocab_size=64,
            n_positions=16,
            bos_token_id=0,
            eos_token_id=0,
            **common,
        )
        model = transformers.GPT2LMHeadModel(config)
    elif family == "bert":
        config = transformers.BertConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            intermediate_size=64,
            vocab_size=64,
            max_position_embeddings=16,
            **common,
        )
        model = transformers.BertModel(config)
    elif family == "llama":
        config = transformers.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            vocab_size=64,
            max_position_embeddings=16,
            bos_token_id=0,
            eos_token_id=0,
            **common,
        )
        model = transformers.LlamaForCausalLM(config)
    elif family == "vit":
        config = transformers.ViTConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=16,
            patch_size=4,
            num_channels=3,
            **common,
        )
        model = transformers.ViTModel(config)
    else:
        raise ValueError(family)
    generator = torch.Generator().manual_seed(1)
    if family == "vit":
        sample = torch.randn(2, 3, 16, 16, generator=generator)
    else:
        sample = torch.randint(0, 64, (2, 8), generator=generator)
    return _TransformerOutput(torch, model.eval()), sample


#: The words of :func:`tiny_hf_dir`'s tokenizer (ids 2..; 0 is padding, 1 unknown).
TINY_WORDS = (
    "the a cat dog sat ran on in mat park sun rain big small red blue man woman plays sings guitar song "
    "market fell rose today cooks dinner train leaves early late"
).split()


def tiny_hf_dir(torch, path: Path, task: str, llama: bool = False) -> Path:
    """A Hugging Face model directory (``save_pretrained``) of a seeded 2-layer model for
    ``task`` (embedding: BERT; classification: BERT with 3 labels; causal-lm: GPT-2, or LLaMA
    with ``llama``: its projections are ``nn.Linear``) and a word-level tokenizer over
    TINY_WORDS; no hub."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    torch.manual_seed(0)
    vocab = {"[PAD]": 0, "[UNK]": 1, **{word: i + 2 for i, word in enumerate(TINY_WORDS)}}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]"
    )
    if task == "causal-lm" and llama:
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                num_hidden_layers=2,
                hidden_size=32,
                intermediate_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=64,
                max_position_embeddings=32,
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=0,
            )
        )
    elif task == "causal-lm":
        model = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                n_layer=2,
                n_embd=32,
                n_head=4,
                vocab_size=64,
                n_positions=32,
                bos_token_id=0,
                eos_token_id=0,
            )
        )
    else:
        config = transformers.BertConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            intermediate_size=64,
            vocab_size=64,
            max_position_embeddings=32,
            num_labels=3,
            id2label={0: "neg", 1: "neu", 2: "pos"},
            label2id={"neg": 0, "neu": 1, "pos": 2},
        )
        model = (
            transformers.BertForSequenceClassification
            if task == "classification"
            else transformers.BertModel
        )(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


TRANSFORMER_FAMILIES = ("gpt2", "bert", "llama", "vit")


def count_gemm_kernels(torch, model, sample) -> dict:
    """The GEMM kernels one forward pass runs, counted by torch.profiler (independently of any
    capture code): aten::mm/addmm/bmm/baddbmm/mv/dot/convolution calls, and two per fused
    scaled-dot-product-attention kernel (its Q.K^T and P.V)."""
    from torch.profiler import ProfilerActivity, profile

    single = (
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::mv",
        "aten::addmv",
        "aten::dot",
        "aten::convolution",
    )
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(sample)
    counts = {}
    for event in prof.events():
        if event.name in single:
            counts[event.name] = counts.get(event.name, 0) + 1
        elif event.name == "aten::_scaled_dot_product_flash_attention_for_cpu":
            counts[event.name] = counts.get(event.name, 0) + 2
    return counts


@pytest.fixture(scope="module")
def dask_runner():
    """A 2-worker Dask LocalCluster (processes), shared by a module's tests that need one;
    skipped without the dask extra (a failure when CI is set). Closed after the module: an
    idle cluster costs about a sixth of a core (heartbeats), more than starting another."""
    try:
        importlib.import_module("distributed")
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(
                "dask.distributed is required when CI is set: pip install 'mxsim[dask]'",
                pytrace=False,
            )
        pytest.skip("dask.distributed is not installed (pip install 'mxsim[dask]')")
    from mxsim.parallel import DaskRunner

    # Small tiles so that the CI-sized sample's GEMMs are split across tasks too.
    runner = DaskRunner(workers=2, timeout=300, tile_macs=1 << 16)
    yield runner
    runner.close()


# --- a sample trace on disk and its error checks (tests/test_trace_*.py) ----------------------


def sample_trace():
    """conv -> relu -> flatten -> linear (a network over the dataset), plus a batched matmul."""
    from mxsim.trace import BFPQuant, Layer, MXQuant, Network, QDQQuant, Trace
    from mxsim.trace.conv import conv2d_direct, conv_transpose2d_direct

    rng = np.random.default_rng(11)
    images = rng.standard_normal((4, 1, 5, 5)).astype(np.float32)
    conv_w = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    conv_b = rng.standard_normal(2).astype(np.float32)
    conv = Layer(
        "conv",
        "conv2d",
        {"input": images, "weight": conv_w, "bias": conv_b, "output": np.zeros(1)},
        {"stride": [1, 1], "padding": [[1, 1], [1, 1]], "dilation": [1, 1], "groups": 1},
        {"input": MXQuant("fp8_e4m3", 1, 32), "weight": BFPQuant("MX6", 1)},
        {"module": "conv"},
    )
    conv.tensors["output"] = conv2d_direct(images, conv_w, conv_b, conv.conv_geometry()).astype(
        np.float32
    )
    hidden = np.maximum(conv.output, 0).reshape(4, -1)
    fc_w = rng.standard_normal((3, 50)).astype(np.float32)
    fc_in_q = QDQQuant("int8", np.array(0.05, np.float32), np.array(0, np.int8))
    fc_w_q = QDQQuant("int8", np.full(3, 0.02, np.float32), np.zeros(3, np.int8), axis=0)
    fc = Layer(
        "fc",
        "linear",
        {
            "input": hidden,
            "weight": fc_w,
            "output": hidden @ fc_w.T,
            "input_quantized": fc_in_q.fake_quantize(hidden),
            "weight_quantized": fc_w_q.fake_quantize(fc_w),
        },
        {},
        {"input": fc_in_q, "weight": fc_w_q, "bias": None},
    )
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((2, 4, 5)).astype(np.float32)
    bmm = Layer(
        "attention scores",
        "matmul",
        {"input": a, "weight": b, "output": a @ b},
        quant={"input": MXQuant("int8", 2, 4, "quark-onnx", {"element_rounding": "nearest_even"})},
    )
    up_x = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    up_w = rng.standard_normal((4, 1, 3, 2)).astype(np.float32)
    up = Layer(
        "up",
        "conv_transpose2d",
        {"input": up_x, "weight": up_w, "output": np.zeros(1)},
        {
            "stride": [2, 2],
            "padding": [[1, 0], [0, 1]],
            "dilation": [1, 1],
            "groups": 2,
            "output_padding": [1, 0],
        },
        {"weight": MXQuant("fp8_e5m2", 0, 2)},
    )
    up.tensors["output"] = conv_transpose2d_direct(up_x, up_w, None, up.conv_geometry()).astype(
        np.float32
    )
    dataset = {"inputs": images, "labels": np.array([0, 1, 2, 1], np.int64)}
    network = Network(
        "inputs",
        ({"layer": "conv"}, {"op": "relu"}, {"op": "flatten", "start_dim": 1}, {"layer": "fc"}),
        "labels",
    )
    return Trace(
        "sample",
        [conv, fc, bmm, up],
        {"framework": "test"},
        {"note": "hand-made", "accuracy": 0.5},
        dataset,
        network,
    )


@pytest.fixture
def saved_trace(tmp_path) -> Path:
    """:func:`sample_trace` saved in a temporary directory in format version 1 (one NPZ per
    layer: the error checks of its files; version 2 has its own tests)."""
    from mxsim.trace import save_trace

    return save_trace(sample_trace(), tmp_path / "trace", version=1)


def without_compile_notice(err: str) -> str:
    """Standard error less the compile notice, which a process whose kernel cache is cold
    prints before anything else; error checks count the lines after it."""
    from mxsim import _compile

    notice = _compile._message()
    return "".join(line for line in err.splitlines(True) if not line.startswith(notice))


def fail_replay_of_layer(monkeypatch, name: str, message: str) -> None:
    """Make replay's task for the layer ``name`` raise MxsimError(message); the others run."""
    from mxsim.errors import MxsimError
    from mxsim.replay import run as run_module

    real = run_module.replay_layer_on_units

    def failing(layer, *args):
        if layer.name == name:
            raise MxsimError(message)
        return real(layer, *args)

    monkeypatch.setattr(run_module, "replay_layer_on_units", failing)


def mx_linear_layer(rng, spec_format="fp8_e4m3"):
    """A 6x70 by 70x5 linear layer "fc" with both operands under ``spec_format`` blocks of 32 along K."""
    from mxsim.trace import Layer, MXQuant

    x = rng.standard_normal((6, 70)).astype(np.float32)
    w = rng.standard_normal((5, 70)).astype(np.float32)
    tensors = {
        "input": x,
        "weight": w,
        "output": (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32),
    }
    quant = {
        "input": MXQuant(spec_format, axis=1, block_size=32),
        "weight": MXQuant(spec_format, axis=1, block_size=32),
        "bias": None,
    }
    return Layer("fc", "linear", tensors, {}, quant, {})


@pytest.fixture
def counted_quantizations(monkeypatch) -> list:
    """The shapes of the operands replay quantizes itself (one entry per quantization, as the
    calls come; the unit in the loop keeps weights' quantizations)."""
    from mxsim.replay import layer

    shapes, requantize = [], layer._requantize
    monkeypatch.setattr(
        layer,
        "_requantize",
        lambda values, *args: shapes.append(values.shape) or requantize(values, *args),
    )
    return shapes


def edit_manifest(path: Path, change) -> None:
    manifest = yaml.safe_load((path / "manifest.yaml").read_text())
    change(manifest)
    (path / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))


def layer_file(path: Path, layer_name: str) -> Path:
    manifest = yaml.safe_load((path / "manifest.yaml").read_text())
    return path / next(e["file"] for e in manifest["layers"] if e["name"] == layer_name)


def assert_trace_error(path: Path, layer: str | None, field: str | None, message: str):
    """Loading ``path`` raises a TraceError naming the trace, ``layer`` and ``field``, with ``message``."""
    from mxsim.errors import TraceError
    from mxsim.trace import load_trace

    with pytest.raises(TraceError) as caught:
        load_trace(path)
    error = caught.value
    text = str(error)
    assert text.startswith(f"trace {path}"), text
    assert (error.layer, error.field) == (layer, field), text
    if layer is not None:
        assert f"layer {layer!r}" in text
    if field is not None:
        assert f"field {field!r}" in text
    assert message in text, text
    return text


# --- ONNX models for the capture tests (tests/test_capture_onnx*.py) ----------------------------

ONNX_IR_VERSION = 10  # onnxruntime 1.2x reads IR <= 10/11; onnx.helper would stamp a newer one
ONNX_RNG = np.random.default_rng(5)


@pytest.fixture(scope="module")
def onnx():
    import_or_skip("onnxruntime", "onnx")
    return import_or_skip("onnx", "onnx")


@pytest.fixture(scope="module")
def ort(onnx):
    return import_or_skip("onnxruntime", "onnx")


@pytest.fixture(scope="module")
def capture(onnx):
    """:func:`mxsim.capture.onnx.capture_onnx` (the test is skipped without onnx)."""
    from mxsim.capture.onnx import capture_onnx

    return capture_onnx


def f32(*shape, scale=1.0):
    """Gaussian float32 test data from the ONNX tests' seeded stream."""
    return (ONNX_RNG.standard_normal(shape) * scale).astype(np.float32)


def make_onnx_model(onnx, nodes, inputs, outputs, initializers=(), opset=17, extra_domains=()):
    """A model of ``nodes`` with float inputs ``[(name, shape)]``, outputs by name and initializers ``[(name, array)]``."""
    helper = onnx.helper
    graph = helper.make_graph(
        nodes,
        "test",
        [
            helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)
            for name, shape in inputs
        ],
        [onnx.ValueInfoProto(name=name) for name in outputs],
        initializer=[onnx.numpy_helper.from_array(array, name) for name, array in initializers],
    )
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in extra_domains]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ONNX_IR_VERSION)


def onnx_reference_values(onnx, ort, model, names, feeds, quark_ops: bool = False):
    """The named tensors from one onnxruntime session (default optimisations) over the whole
    model; with ``quark_ops``, Quark's own custom-op library (amd-quark) computes its nodes."""
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    existing = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in existing)
    options = ort.SessionOptions()
    if quark_ops:
        options.register_custom_ops_library(
            pytest.importorskip("quark.onnx").get_library_path("CPU")
        )
    session = ort.InferenceSession(
        probe.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return dict(zip(names, session.run(list(names), feeds)))


def assert_close_to(actual, expected, rtol=1e-5):
    """Equal to within ``rtol`` of the largest magnitude of ``expected``."""
    scale = max(float(np.abs(expected).max()), 1e-30)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=rtol * scale)


def layer_node_outputs(model, trace):
    """Each layer's ONNX output tensor name (a fused bias Add's output for a MatMul with bias)."""
    produced = {node.name: node.output[0] for node in model.graph.node}
    return {
        layer.name: produced[layer.source.get("fused_add") or layer.source["node"]]
        for layer in trace.layers
    }


def pytest_addoption(parser):
    parser.addoption(
        "--fuzz",
        action="store_true",
        default=False,
        help="run the long fuzz campaign of tests/test_fuzz.py (release checks)",
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The fuzz outcomes per family (cases, failures by kind, seconds), when fuzz tests ran."""
    outcomes = config.stash.get(FUZZ_OUTCOMES, None)
    if not outcomes:
        return
    terminalreporter.section("fuzz outcomes")
    kinds = (
        "cases",
        "ok",
        "traceback",
        "timeout",
        "memory",
        "wrong",
        "escape",
        "disclosure",
        "code",
        "echo",
        "seconds",
        "max_seconds",
    )
    terminalreporter.write_line("family      " + "".join(f"{k:>11}" for k in kinds))
    for family, counts in outcomes.items():
        terminalreporter.write_line(
            f"{family:12s}" + "".join(f"{counts.get(k, 0):>11}" for k in kinds)
        )


#: Test tiers (markers registered in pyproject.toml; CONTRIBUTING.md gives each tier's size
#: and how to time it).
#: A module's markers are set here by its name, so the quick run, ``pytest -m "not slow"``,
#: is defined in one place; a heavy test in an otherwise quick module carries
#: ``@pytest.mark.slow`` itself. ``oracle``: compares against third-party libraries run
#: live; ``rtl``: runs a Verilog simulator; ``model``: runs transformer models; ``slow``:
#: left out of the quick run (compiles many kernels or runs long campaigns).
MODULE_TIERS = {
    "test_oracles_*": ("oracle", "slow"),
    "test_probe_mmasim": ("oracle", "slow"),
    "test_capture_onnx_quark": ("oracle", "slow"),
    "test_golden_rtl": ("rtl", "slow"),
    "test_probe_rtl": ("rtl", "slow"),
    "test_probe_*": ("slow",),
    "test_fuzz": ("slow",),
    "test_hwconfigs_gpu": ("slow",),
    "test_inloop_network": ("slow",),
    "test_evaluate_onnx": ("oracle", "slow"),
    "test_capture_torch_quark": ("oracle", "slow"),
    "test_capture_torch_torchao": ("oracle", "slow"),
    "test_capture_torch_brevitas": ("oracle", "slow"),
    "test_rtl_simulate": ("rtl", "slow"),
    "test_rtl_synth": ("rtl", "slow"),
    "test_cmodel_rtl": ("rtl", "slow"),
    "test_cmodel_check": ("slow",),
}
#: Markers for the tests that use a fixture, whatever their module.
FIXTURE_TIERS = {
    "dask_runner": ("slow",),  # starts a local Dask cluster
    "minilm_dir": ("model",),  # all-MiniLM-L6-v2, loaded and run in float
    "minilm_operands": ("model",),  # its first layer's GEMM operands, captured in float
}


#: The warm-up process and its stderr (controller of an xdist run only), waited for before
#: any test runs.
WARMING = pytest.StashKey[tuple]()


def warm_kernel_cache() -> None:
    """Compile the kernels every xdist worker needs at its first tests (the generic datapath
    kernel and the window route on fp8 codes with float32 c, MX quantization) into the shared
    kernel cache, once, before the workers run tests: otherwise each worker compiles its own
    copy of them at the same moment. With a warm cache this only loads them."""
    from mxsim.datapath import dot, load_hwconfig
    from mxsim.quantize import quantize

    fp8 = FORMATS["fp8_e4m3"]
    codes = fp8.encode(np.array([[1.0, -2.0, 0.5, np.nan]] * 2))  # a NaN: the generic kernel too
    c = np.zeros(2, np.float32)
    for name, method in (("h100-fp8", "auto"), ("mxdotp", "kernel")):
        unit = load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
        dot(unit, codes, codes, a_format="fp8_e4m3", b_format="fp8_e4m3", c=c, method=method)
    quantize(np.ones((2, 32), np.float32), "fp8_e4m3")


def _start_warming(config) -> None:
    """:func:`warm_kernel_cache` in a process of its own, beside the workers' start and
    collection, instead of before them with one core idle;
    :func:`pytest_xdist_node_collection_finished` waits for it."""
    import subprocess
    import sys
    import tempfile

    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import conftest; conftest.warm_kernel_cache()"
    )
    errors = tempfile.TemporaryFile()
    command = [sys.executable, "-c", code, str(Path(__file__).parent)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
    config.stash[WARMING] = (process, errors)


def pytest_configure(config):
    """On an xdist worker, Numba's parallel kernels use the worker's share of the cores: the
    workers already fill them, and a kernel waiting for threads another worker's process holds
    only spins (tests/test_threads.py runs the kernels on two threads itself). In the
    controller of an xdist run, as the workers start: :func:`_start_warming`."""
    # The suite's workers fill the cores: replay's second compile process would only add work
    # (tests/test_replay_warmup.py turns it on where it is tested).
    os.environ.setdefault("MXSIM_PARALLEL_COMPILE", "0")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        xdist = getattr(config.option, "numprocesses", None) and config.option.dist != "no"
        if xdist and not config.option.collectonly:
            _start_warming(config)
        return
    import numba

    workers = int(workerinput.get("workercount", 1))
    numba.set_num_threads(max(1, min(numba.get_num_threads(), (os.cpu_count() or 1) // workers)))


def pytest_xdist_node_collection_finished(node, ids):
    """The controller sends no test before the kernel warm-up has ended (with a traceback of
    its own, if it failed)."""
    warming = node.config.stash.get(WARMING, None)
    if warming is None:  # no warm-up, or already waited for (one call per worker)
        return
    del node.config.stash[WARMING]
    process, errors = warming
    with errors:
        if process.wait():
            errors.seek(0)
            raise RuntimeError(f"the kernel warm-up failed:\n{errors.read().decode()}")


#: Modules of long, independent tests that the xdist workers share out one test at a time
#: (their module fixtures, if any, are cheap beside the tests), in the order they start: the
#: longest tests first. Every other module runs whole on one worker, so its module fixtures are
#: built once.
SPREAD_MODULES = (
    "test_probe_rtl",
    "test_probe_mmasim",
    "test_probe_core",
    "test_probe_modes",
    "test_datapath_api",
    "test_oracles_mmasim",
)
#: Modules run on one worker together, one after another, as one unit: each imports
#: quark.torch, whose import alone takes some 30 s of CPU (it parses every transformers model
#: file), once per worker process.
MODULE_UNITS = {
    module: "quark.torch"
    for module in (
        "test_capture_torch_checkpoint",
        "test_capture_torch_quark",
        "test_evaluate_quantizers",
        "test_oracles_quark",
    )
}


def _unit(module: str) -> str:
    """The unit of work a module's tests are scheduled in (other than the spread modules')."""
    return MODULE_UNITS.get(module, module)


def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadgroup``: the spread modules' tests shared out one at a time, every
    other module whole (with the others of its MODULE_UNITS), in the collection order. xdist
    groups by ``xdist_group`` marks written into the node ids, which pytest 9.2's structured
    node ids no longer take: every module was spread over both workers and built its module
    fixtures (RTL benches, Quark's extension) twice. This scheduler groups by the node ids'
    module instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = Path(nodeid.split("::", 1)[0]).stem
            return nodeid if module in SPREAD_MODULES else _unit(module)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Mark each test with its tier from MODULE_TIERS and FIXTURE_TIERS, and order the run for
    the xdist workers (:func:`pytest_xdist_make_scheduler`): the spread modules' tests first,
    one at a time, then the other modules whole (or in their MODULE_UNITS), larger units first,
    so that no long test is left to run alone at the end."""
    sizes: dict[str, int] = {}
    for item in items:
        sizes[_unit(item.path.stem)] = sizes.get(_unit(item.path.stem), 0) + 1
    for item in items:
        module = item.path.stem
        marks = {
            m
            for pattern, tier in MODULE_TIERS.items()
            if fnmatch.fnmatchcase(module, pattern)
            for m in tier
        }
        marks.update(
            m
            for name, tier in FIXTURE_TIERS.items()
            if name in getattr(item, "fixturenames", ())
            for m in tier
        )
        for mark in sorted(marks):
            item.add_marker(mark)
    spread = {module: rank for rank, module in enumerate(SPREAD_MODULES)}
    items.sort(
        key=lambda item: (
            spread.get(item.path.stem, len(spread)),
            -sizes[_unit(item.path.stem)],
            _unit(item.path.stem),
        )
    )


def shipped_pairs_taking(applies) -> list[tuple[str, str, str, str]]:
    """(config, A format, B format, output format) of every shipped config's format pair and
    wide output format whose params ``applies`` (a route's admission) accepts, sorted."""
    from mxsim.datapath import load_hwconfig
    from mxsim.datapath.schema import WIDE_FORMATS

    taken = []
    for path in sorted((REPO / "hwconfigs").glob("*.yaml")):
        config = load_hwconfig(path)
        for a_name, b_name in config.format_pairs:
            for out_name in WIDE_FORMATS:
                if applies(config.params(a_name, b_name, out_name)):
                    taken.append((path.stem, a_name, b_name, out_name))
    return sorted(taken)


def assert_kept_b_gives_the_generic_bits(hw, a, b, kw: dict, key: str) -> None:
    """``matmul_batched`` of a and b, with and without a ``b_memo`` (its first and a later
    call), gives the generic kernel's bits, and the route's kept array ``key`` is read-only."""
    from mxsim.datapath import matmul_batched

    want = matmul_batched(hw, a, b, method="kernel", **kw).bits
    memo: dict = {}
    first = matmul_batched(hw, a, b, b_memo=memo, **kw).bits
    (kept,) = memo.values()  # (one unit and format pair)
    assert not kept["route"][key].flags.writeable
    again = matmul_batched(hw, a, b, b_memo=memo, **kw).bits
    assert np.array_equal(first, want) and np.array_equal(again, want)


def assert_route_equals_generic_on_minilm(hw, operands: dict, fmt: str) -> None:
    """A unit's fast route gives the generic kernel's bits on :func:`minilm_operands`: the
    query projection (activations times weight) and the attention heads (q @ k^T, softmax
    probabilities @ v), every operand cast to ``fmt`` (one scale per tensor)."""
    from mxsim.datapath import matmul, matmul_batched

    kw = dict(a_format=fmt, b_format=fmt, per_tensor_scale=True)
    linear = (operands["x"], operands["weight"])
    assert np.array_equal(
        matmul(hw, *linear, **kw).bits, matmul(hw, *linear, method="kernel", **kw).bits
    )
    for heads in ((operands["q"], operands["k_t"]), (operands["p"], operands["v"])):
        got = matmul_batched(hw, *heads, **kw).bits
        assert np.array_equal(got, matmul_batched(hw, *heads, method="kernel", **kw).bits)


@pytest.fixture(scope="session")
def minilm_operands() -> dict:
    """Real GEMM operands of all-MiniLM-L6-v2's first encoder layer on two sentences of the
    examples (float32, 2 x 14 tokens): ``x`` (28, 384), the query projection's input (the
    embeddings' LayerNorm output); ``weight`` (384, 384), that projection's weight as W^T
    (K, N); per head (12 heads of 32, the first sentence): ``q``, ``k_t``, ``v``, and ``p``
    (12, 14, 14), the softmax probabilities of q k^T / sqrt(32) (tiny probabilities among
    them)."""
    torch = import_or_skip("torch", "torch")
    require_module("all_minilm_l6_v2", "minilm")
    transformers = import_or_skip("transformers", "minilm")
    from mxsim.evaluate.models import minilm_model_dir

    directory = minilm_model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModel.from_pretrained(directory).eval()
    sentences = (REPO / "examples/minilm/sentences.txt").read_text().splitlines()[:2]
    batch = tokenizer(
        sentences, padding="max_length", max_length=14, truncation=True, return_tensors="pt"
    )
    attention = model.encoder.layer[0].attention.self
    seen = {}
    hook = attention.query.register_forward_hook(lambda m, i, o: seen.update(x=i[0]))
    with torch.no_grad():
        model(**batch)
        hook.remove()
        x = seen["x"][0]  # the first sentence's tokens
        heads = lambda t: t.reshape(14, 12, 32).permute(1, 0, 2)  # noqa: E731
        q, k, v = (heads(layer(x)) for layer in (attention.query, attention.key, attention.value))
        p = torch.softmax(q @ k.transpose(1, 2) / 32**0.5, dim=-1)
    return {
        "x": seen["x"].reshape(-1, 384).numpy().copy(),
        "weight": attention.query.weight.detach().numpy().T.copy(),
        "q": q.numpy().copy(),
        "k_t": k.transpose(1, 2).numpy().copy(),
        "v": v.numpy().copy(),
        "p": p.numpy().copy(),
    }
