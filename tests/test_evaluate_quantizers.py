"""mxsim.evaluate.quantizers and evaluate_hf(..., quantizer=...): a model quantized by the
library itself, then run as the library computes it and with each unit in the loop.

The flow is checked against AMD Quark run live by the test's own code: the test quantizes the
same model with Quark's ModelQuantizer, runs it, pools and compares it itself; the report's
figures for the library's model must be those, and the exact unit computing the layers Quark
quantized from Quark's operands must reproduce Quark's model output at >= 100 dB (float32).
"""

from __future__ import annotations

import math
import os
import re
import sys
import warnings

import numpy as np
import pytest
from conftest import REPO, import_or_skip, require_module, sqnr_db, tiny_hf_dir

import mxsim.evaluate.run as evaluate_run
from mxsim.errors import MxsimError
from mxsim.evaluate import evaluate_hf, format_report, minilm_model_dir
from mxsim.evaluate.quantizers import QUANTIZERS, check_units_take, parse_quantizer

OCP = str(REPO / "hwconfigs/ocp-exact.yaml")
H100 = str(REPO / "hwconfigs/h100-fp8.yaml")
B200 = str(REPO / "hwconfigs/b200-tcgen05-mxf8f6f4.yaml")
TEXTS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the man plays guitar",
    "a woman sings a song today",
]
os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")  # as mxsim sets it: no minutes of compiling


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    torch = require_module("torch", "torch")
    root = tmp_path_factory.mktemp("hf")
    return {"embedding": tiny_hf_dir(torch, root / "embedding", "embedding")}


@pytest.fixture
def no_forward(monkeypatch):
    def forward(*args, **kwargs):
        raise AssertionError("a model ran before the request was checked")

    monkeypatch.setattr(evaluate_run, "_forward", forward)


@pytest.mark.parametrize(
    "text, message",
    [
        ("quark", "quantizer: expected LIBRARY:SPEC (quark, torchao; e.g. quark:mxfp8_e4m3), got"),
        ("quark:mx:fp8", "quantizer: expected LIBRARY:SPEC"),
        (7, "quantizer: expected LIBRARY:SPEC (quark, torchao; e.g. quark:mxfp8_e4m3), got '7'"),
        ("x" * 500, "got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'"),
        ("brevitas:mxfp8_e4m3", "quantizer: unknown library 'brevitas'; accepted: quark, torchao"),
        ("quark:mxfp9", "quantizer: quark has no spec 'mxfp9'; accepted: quark:mxfp8_e4m3,"),
        ("torchao:mxint8", "quantizer: torchao has no spec 'mxint8'; accepted: torchao:mxfp8_e4m3"),
        ("Quark:mxfp4", "unknown library 'Quark'"),
    ],
)
def test_unknown_quantizers_are_refused_naming_what_is_accepted(text, message):
    with pytest.raises(MxsimError, match=re.escape(message)):
        parse_quantizer(text)


def test_every_spec_names_an_element_format_of_the_exact_unit():
    from mxsim import load_hwconfig

    check_units_take(parse_quantizer("quark:mxfp4"), [load_hwconfig(OCP)])
    for quantizer in QUANTIZERS.values():
        check_units_take(quantizer, [load_hwconfig(OCP)])  # every element format, blocks of 32


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"hw": [OCP, H100]},
            "unit h100-fp8 cannot take quark:mxfp8_e4m3's operands (fp8_e4m3 in blocks of 32 "
            "with E8M0 scales): it has no block scales",
        ),
        (
            {"hw": [B200], "quantizer": "quark:mxint8"},
            "unit b200-tcgen05-mxf8f6f4 cannot take quark:mxint8's operands (int8 in blocks of 32 "
            "with E8M0 scales): it takes fp8_e4m3, fp8_e5m2, fp6_e3m2, fp6_e2m3, fp4_e2m1 for "
            "both operands, not int8",
        ),
        ({"hw": []}, "expected at least one unit"),
        ({"formats": "fp8_e4m3"}, "formats: a quantizer (quark:mxfp8_e4m3) gives the operands'"),
        ({"scaling": "tensor"}, "scaling: with a quantizer (quark:mxfp8_e4m3) the unit takes"),
        ({"quantizer": "quark:fp8"}, "quantizer: quark has no spec 'fp8'"),
        ({"quantizer": None, "formats": None}, "expected at least one unit and one format"),
    ],
)
def test_requests_that_cannot_be_met_fail_before_any_model_runs(
    tiny_dirs, no_forward, change, message
):
    args = {"hw": OCP, "formats": None, "quantizer": "quark:mxfp8_e4m3", "scaling": "auto"}
    args.update(change)
    with pytest.raises(MxsimError, match=re.escape(message)):
        evaluate_hf(
            tiny_dirs["embedding"],
            args["hw"],
            args["formats"],
            "embedding",
            TEXTS,
            scaling=args["scaling"],
            quantizer=args["quantizer"],
        )


def test_a_library_not_installed_is_one_error_before_work(tiny_dirs, no_forward, monkeypatch):
    monkeypatch.setitem(sys.modules, "quark", None)
    with pytest.raises(
        MxsimError, match=re.escape("quantizer quark:mxfp4: AMD Quark is not installed")
    ):
        evaluate_hf(tiny_dirs["embedding"], OCP, None, "embedding", TEXTS, quantizer="quark:mxfp4")
    monkeypatch.setitem(sys.modules, "torchao", None)
    with pytest.raises(
        MxsimError, match=re.escape("pip install 'mxsim[oracles]' (or pip install torchao)")
    ):
        evaluate_hf(
            tiny_dirs["embedding"], OCP, None, "embedding", TEXTS, quantizer="torchao:mxfp4"
        )


@pytest.fixture(scope="module")
def quark(torch):
    import_or_skip("quark.torch", "oracles")
    from quark.torch import ModelQuantizer
    from quark.torch.quantization.config import config

    return ModelQuantizer, config


@pytest.mark.oracle
@pytest.mark.slow
def test_a_model_the_library_cannot_run_is_one_error_naming_the_module(tiny_dirs):
    """torchao's MX kernels refuse a non-contiguous activation: BERT's pooler takes the first
    token's state, a strided view."""
    import_or_skip("torchao.prototype.mx_formats.inference_workflow", "oracles")
    with pytest.raises(MxsimError) as error:
        evaluate_hf(
            tiny_dirs["embedding"], OCP, None, "embedding", TEXTS, quantizer="torchao:mxfp8_e4m3"
        )
    message = str(error.value)
    assert "\n" not in message and message.startswith(str(tiny_dirs["embedding"]))
    assert "the model quantized by torchao:mxfp8_e4m3 failed on the inputs in module" in message
    assert "'pooler.dense': AssertionError" in message


def quark_model(torch, quark, model_dir):
    """The embedding model of ``model_dir`` quantized by Quark here (not by mxsim), and the
    tokenized TEXTS, and the model's float32 last hidden state."""
    import transformers

    ModelQuantizer, config = quark
    model = transformers.AutoModel.from_pretrained(str(model_dir)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    batch = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
    with torch.no_grad():
        hidden = model(**batch)[0].numpy()
    spec = config.OCP_MXFP8E4M3Spec(ch_axis=-1).to_quantization_spec()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ModelQuantizer(
            config.QConfig(global_quant_config=config.QLayerConfig(weight=spec, input_tensors=spec))
        ).quantize_model(model, None)
    return model, batch, hidden


def mean_pooled(hidden, mask):
    mask = mask[..., None].astype(np.float64)
    return (hidden.astype(np.float64) * mask).sum(axis=1) / mask.sum(axis=1)


def cosines(a, b):
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.oracle
@pytest.mark.slow
def test_quark_flow_reports_quarks_own_model_and_the_unit_reproduces_it(torch, quark, tiny_dirs):
    from mxsim.inloop import torch_unit

    report = evaluate_hf(
        tiny_dirs["embedding"], OCP, None, "embedding", TEXTS, quantizer="quark:mxfp8_e4m3"
    )
    model, batch, hidden = quark_model(torch, quark, tiny_dirs["embedding"])
    with torch.no_grad():
        quark_hidden = model(**batch)[0].numpy()
    mask = batch["attention_mask"].numpy()
    want = cosines(mean_pooled(hidden, mask), mean_pooled(quark_hidden, mask))
    library = report["library"]
    assert library["library"].startswith("amd-quark ") and library["layers"] == 13  # 2 x 6 + pooler
    assert library["cosine_min"] == pytest.approx(want.min(), abs=1e-12)
    assert library["cosine_mean"] == pytest.approx(want.mean(), abs=1e-12)
    assert want.min() < 1 - 1e-7  # Quark's quantization is visible in the figures
    (run,) = report["runs"]
    # the 13 layers Quark quantized on the unit, from Quark's operands; attention's 2 x 2 in torch
    assert (run["layers"], run["in_torch"], run["not_read"], run["skipped"]) == (13, 4, [], 0)
    assert run["layer_sqnr_min_db"] >= 100 and run["library_sqnr_db"] >= 100
    assert run["vs_library"]["cosine_min"] > 1 - 1e-12
    # the same, computed here: the exact unit with Quark's operands against Quark's own model
    with torch_unit(model, OCP, quantized_only=True) as loop:
        with torch.no_grad():
            unit_hidden = model(**batch)[0].numpy()
    assert len(loop.computed_layers) == 13 and len(loop.in_torch) == 4
    assert min(db for _, db in loop.library_sqnr_db) >= 100
    assert sqnr_db(quark_hidden, unit_hidden) >= 100
    text = format_report(report).splitlines()
    assert text[1].startswith("quantizer quark:mxfp8_e4m3 (amd-quark ")
    assert text[3].startswith("amd-quark  quark:mxfp8_e4m3") and text[4].startswith("ocp-exact ")


@pytest.mark.oracle
@pytest.mark.slow
def test_torchao_flow_reports_torchaos_own_bf16_model(torch, tmp_path):
    """A LLaMA (nn.Linear projections) quantized by torchao in bf16: the report's figures for
    torchao's model are the perplexity computed here from torchao's own logits; the exact unit
    with torchao's operands stays at bf16 precision of torchao's model."""
    import_or_skip("torchao.prototype.mx_formats.inference_workflow", "oracles")
    import transformers
    from torchao.prototype.mx_formats import inference_workflow
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    model_dir = tiny_hf_dir(torch, tmp_path / "llama", "causal-lm", llama=True)
    report = evaluate_hf(model_dir, OCP, None, "causal-lm", TEXTS, quantizer="torchao:mxfp8_e4m3")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    batch = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
    model = model.to(torch.bfloat16)
    quantize_(
        model,
        inference_workflow.MXDynamicActivationMXWeightConfig(
            activation_dtype=torch.float8_e4m3fn,
            weight_dtype=torch.float8_e4m3fn,
            kernel_preference=KernelPreference.EMULATED,
        ),
    )
    with torch.no_grad():
        logits = model(**batch).logits.double()
    mask = batch["attention_mask"].bool()
    keep = mask[:, :-1] & mask[:, 1:]
    nll = -torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch["input_ids"][:, 1:, None])
    want = float(torch.exp(nll[..., 0][keep].mean()))
    library = report["library"]
    assert library["library"].startswith("torchao ") and library["layers"] == 15  # 2 x 7 + head
    assert library["perplexity"] == pytest.approx(want, rel=1e-12)
    (run,) = report["runs"]
    assert (run["layers"], run["in_torch"], run["not_read"]) == (15, 4, [])
    assert run["vs_library"]["top1_agreement"] == 1.0 and run["library_sqnr_db"] >= 40


@pytest.mark.oracle
@pytest.mark.model
@pytest.mark.slow
def test_minilm_with_quark_mxfp8_on_the_exact_unit(torch):
    """The real model on the 24 sentences of docs/accuracy.md's row, Quark MXFP8 E4M3, ocp-exact:
    every layer is Quark's to float32 rounding; end to end, such last-bit differences spread
    through six layers of re-quantization (37.8 dB against Quark's model in docs/accuracy.md).
    Both models run torch's own float ops between the layers, whose kernels round differently
    on different processors, so the lowest cosine with float of each is held to what the
    cosines between the two models' embeddings allow, not to a figure of one processor: for
    unit vectors u (float), a (Quark's model), b (the unit), cos(u, b) - cos(u, a) = (u - a) .
    (b - a) + (cos(a, b) - 1), at most |u - a| |b - a| + 1 - cos(a, b) in size, with
    |x - y| = sqrt(2 (1 - cos(x, y))), and the minima over sentences differ by at most the
    largest such bound."""
    require_module("all_minilm_l6_v2", "minilm")
    import_or_skip("quark.torch", "oracles")
    report = evaluate_hf(
        minilm_model_dir(),
        OCP,
        None,
        "embedding",
        REPO / "examples/minilm/sentences.txt",
        quantizer="quark:mxfp8_e4m3",
    )
    (run,) = report["runs"]
    library = report["library"]
    assert library["layers"] == 37 and 0.99 < library["cosine_min"] < 0.9999
    assert (run["layers"], run["in_torch"], run["not_read"]) == (37, 12, [])
    assert run["layer_sqnr_min_db"] >= 100 and 30 <= run["library_sqnr_db"] <= 45
    assert run["neighbour_agreement"] == 1.0
    apart = 1 - run["vs_library"]["cosine_min"]  # the two models' least cosine, per sentence
    assert 0 < apart < 2e-3
    bound = math.sqrt(2 * (1 - library["cosine_min"])) * math.sqrt(2 * apart) + apart
    assert abs(run["cosine_min"] - library["cosine_min"]) <= bound
