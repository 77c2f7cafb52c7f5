"""mxsim.evaluate.quantizers and evaluate_hf(..., quantizer=...): a model quantized by the
library itself, then run as the library computes it and with each unit in the loop.

The flow is checked against AMD Quark run live by the test's own code: the test quantizes the
same model with Quark's ModelQuantizer, runs it, pools and compares it itself; the report's
figures for the library's model must be those, and the exact unit computing the layers Quark
quantized from Quark's operands must reproduce Quark's model output at >= 100 dB (float32).
"""

from __future__ import annotations

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
    return {task: tiny_hf_dir(torch, root / task, task) for task in ("embedding", "causal-lm")}


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
def test_a_model_the_library_does_not_quantize_is_one_error(tiny_dirs, quark):
    """GPT-2's projections are transformers' Conv1D, which Quark leaves alone."""
    with pytest.raises(
        MxsimError,
        match=re.escape("AMD Quark quantized no layer of the model with quark:mxfp8_e4m3"),
    ):
        evaluate_hf(
            tiny_dirs["causal-lm"], OCP, None, "causal-lm", TEXTS, quantizer="quark:mxfp8_e4m3"
        )


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
    assert run["library_sqnr_db"] >= 100 and run["vs_library"]["cosine_min"] > 1 - 1e-12
    # the same, computed here: the exact unit with Quark's operands against Quark's own model
    with torch_unit(model, OCP, quantized_only=True) as loop:
        with torch.no_grad():
            unit_hidden = model(**batch)[0].numpy()
    assert len(loop.computed_layers) == 13 and len(loop.in_torch) == 4
    assert sqnr_db(quark_hidden, unit_hidden) >= 100
    text = format_report(report).splitlines()
    assert text[1].startswith("quantizer quark:mxfp8_e4m3 (amd-quark ")
    assert text[3].startswith("amd-quark  quark:mxfp8_e4m3") and text[4].startswith("ocp-exact ")


@pytest.mark.oracle
@pytest.mark.model
@pytest.mark.slow
def test_minilm_with_quark_mxfp8_on_the_exact_unit(torch):
    """The real model: 4 sentences (two paraphrase pairs), Quark MXFP8 E4M3, ocp-exact."""
    require_module("all_minilm_l6_v2", "minilm")
    import_or_skip("quark.torch", "oracles")
    sentences = (REPO / "examples/minilm/sentences.txt").read_text().splitlines()[:4]
    report = evaluate_hf(
        minilm_model_dir(), OCP, None, "embedding", sentences, quantizer="quark:mxfp8_e4m3"
    )
    (run,) = report["runs"]
    assert report["library"]["layers"] == 37 and 0.98 < report["library"]["cosine_min"] < 1.0
    assert (run["layers"], run["in_torch"], run["not_read"]) == (37, 12, [])
    assert run["library_sqnr_db"] >= 60 and run["neighbour_agreement"] == 1.0
