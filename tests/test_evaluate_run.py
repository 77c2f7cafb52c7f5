"""evaluate_hf: checks before work, each task's figures, no lost work, and the MiniLM sample."""

from __future__ import annotations

import math
import re
import sys

import numpy as np
import pytest

import mxsim.evaluate.run as evaluate_run
from conftest import REPO, require_module, tiny_hf_dir
from mxsim.datapath import load_hwconfig
from mxsim.errors import MxsimError
from mxsim.evaluate import evaluate_hf, format_report, minilm_model_dir
from mxsim.evaluate.models import MAX_INPUT_BYTES

OCP = str(REPO / "hwconfigs/ocp-exact.yaml")
H100 = str(REPO / "hwconfigs/h100-fp8.yaml")
TEXTS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the man plays guitar",
    "a woman sings a song today",
]


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    torch = require_module("torch", "torch")
    root = tmp_path_factory.mktemp("hf")
    return {
        task: tiny_hf_dir(torch, root / task, task)
        for task in ("embedding", "causal-lm", "classification")
    }


@pytest.fixture
def no_forward(monkeypatch):
    """Fails the test if any model runs."""

    def forward(*args, **kwargs):
        raise AssertionError("a model ran before the request was checked")

    monkeypatch.setattr(evaluate_run, "_forward", forward)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"formats": ["fp8_e4m3", "fp4_e2m1"], "hw": [OCP, H100]},
            "unit h100-fp8 does not take fp4_e2m1 for both operands; it takes fp8_e4m3, fp8_e5m2",
        ),
        ({"formats": "fp9"}, "unknown format 'fp9'"),
        ({"hw": []}, "expected at least one unit and one format"),
        ({"task": "ner"}, "unknown task 'ner'"),
        ({"inputs": ["", " "]}, "no inputs (every line is blank)"),
        ({"inputs": ["just one"]}, "give 2..512 inputs, not 1"),
        ({"inputs": ["x"] * 513}, "give 2..512 inputs, not 513"),
        ({"inputs": "{tmp}/big.txt"}, f"an inputs file is limited to {MAX_INPUT_BYTES} bytes"),
        ({"inputs": "{tmp}/missing.txt"}, "no such file"),
        ({"model_dir": "{tmp}"}, "no config.json"),
        ({"max_length": 1}, "max_length: expected an integer 2..65536, got 1"),
        ({"scaling": "row"}, "scaling must be one of auto, block, tensor, got 'row'"),
        (
            {"scaling": "block", "hw": [OCP, H100]},
            "unit h100-fp8 has no block scales; its operands take scaling auto",
        ),
        ({"batch_size": 0}, "batch_size: expected an integer 1..65536, got 0"),
        (
            {"task": "classification", "inputs": ["happy\tthe cat", "pos\ta dog"]},
            "label 'happy' is neither a class index 0..2 nor one of neg, neu, pos",
        ),
        (
            {"task": "classification", "inputs": ["3\tthe cat", "pos\ta dog"]},
            "label '3' is neither",
        ),
        (
            {"task": "classification", "inputs": ["--1\tthe cat", "pos\ta dog"]},
            "label '--1' is neither",
        ),
        (
            {"task": "classification", "inputs": ["\u00b2\tthe cat", "pos\ta dog"]},
            "label '\u00b2' is neither",
        ),
        (
            {"task": "classification", "inputs": ["x" * 500_000 + "\tthe cat", "pos\ta dog"]},
            "label 'xxxxxxxx",
        ),
    ],
)
def test_requests_that_cannot_be_met_fail_before_any_model_runs(
    tiny_dirs, no_forward, tmp_path, change, message
):
    (tmp_path / "big.txt").write_text("a\n" * (MAX_INPUT_BYTES // 2 + 1))
    args = {
        "model_dir": tiny_dirs["embedding"],
        "hw": OCP,
        "formats": "fp8_e4m3",
        "task": "embedding",
        "inputs": TEXTS,
        **change,
    }
    if args["task"] == "classification":
        args["model_dir"] = tiny_dirs["classification"]
    args = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in args.items()}
    options = {k: args.pop(k) for k in ("max_length", "batch_size", "scaling") if k in args}
    with pytest.raises(MxsimError, match=re.escape(message)):
        evaluate_hf(
            args["model_dir"], args["hw"], args["formats"], args["task"], args["inputs"], **options
        )


def test_missing_torch_fails_before_work(tiny_dirs, no_forward, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MxsimError, match=re.escape("pip install 'mxsim[torch]'")):
        evaluate_hf(tiny_dirs["embedding"], OCP, "fp8_e4m3", "embedding", TEXTS)


def test_causal_lm_perplexity_matches_the_models_own_loss(torch, tiny_dirs):
    """The float perplexity against Hugging Face's loss (labels = inputs, padding -100)."""
    report = evaluate_hf(tiny_dirs["causal-lm"], OCP, "fp8_e4m3", "causal-lm", TEXTS)
    from mxsim.evaluate.models import load_hf, tokenize

    model, tokenizer = load_hf(tiny_dirs["causal-lm"], "causal-lm")
    losses, counts = [], []
    for text in TEXTS:  # one at a time: no padding at all
        batch = tokenize(tokenizer, [text], 128)
        with torch.no_grad():
            losses.append(float(model(**batch, labels=batch["input_ids"]).loss))
        counts.append(batch["input_ids"].shape[1] - 1)
    want = math.exp(np.dot(losses, counts) / sum(counts))
    assert report["float"]["perplexity"] == pytest.approx(want, rel=1e-6)
    assert report["float"]["predicted_tokens"] == sum(counts)
    (run,) = report["runs"]
    assert (
        run["unit"] == "ocp-exact" and run["layers"] == 13 and run["skipped"] == 0
    )  # 2 x (qkv, 2 attn, proj, 2 mlp) + head
    assert 0.9 < run["perplexity"] / want < 1.1 and 0.5 <= run["top1_agreement"] <= 1.0


def test_classification_with_labels(tiny_dirs):
    labels = ["pos", "0", "neu", "2"]
    report = evaluate_hf(
        tiny_dirs["classification"],
        [OCP, H100],
        ["fp8_e4m3"],
        "classification",
        [f"{label}\t{text}" for label, text in zip(labels, TEXTS)],
        batch_size=3,
    )
    assert [(run["unit"], run["format"]) for run in report["runs"]] == [
        ("ocp-exact", "fp8_e4m3"),
        ("h100-fp8", "fp8_e4m3"),
    ]
    assert report["float"]["accuracy"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    for run in report["runs"]:
        assert (
            run["layers"] == 18
            and 0 < run["logit_max_abs_diff"] < 0.1
            and run["top1_agreement"] >= 0.75
        )
    table = format_report(report)
    assert "accuracy" in table.splitlines()[2] and "h100-fp8" in table


def test_a_failed_run_keeps_its_row_and_the_others(tiny_dirs, monkeypatch):
    real = evaluate_run.torch_unit

    def torch_unit(model, hw, **options):
        if hw.name == "h100-fp8":
            raise MxsimError("h100-fp8 broke")
        return real(model, hw, **options)

    monkeypatch.setattr(evaluate_run, "torch_unit", torch_unit)
    report = evaluate_hf(tiny_dirs["embedding"], [H100, OCP], "fp8_e4m3", "embedding", TEXTS)
    assert report["runs"][0]["error"] == "h100-fp8 broke" and report["runs"][1]["cosine_min"] > 0.99
    assert "h100-fp8   fp8_e4m3  error: h100-fp8 broke" in format_report(report)


def test_progress_is_a_log_line_per_run_when_not_a_terminal(tiny_dirs, capsys):
    evaluate_hf(tiny_dirs["embedding"], OCP, "fp8_e4m3", "embedding", TEXTS, progress=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("mxsim evaluate: float run: ") and lines[1].startswith(
        "mxsim evaluate: ocp-exact fp8_e4m3: "
    )


@pytest.mark.model
@pytest.mark.slow
def test_minilm_in_the_loop_keeps_the_paraphrase_neighbours(torch):
    """The real model as a sample: 4 sentences (two paraphrase pairs) on ocp-exact in FP8."""
    require_module("all_minilm_l6_v2", "minilm")
    sentences = (REPO / "examples/minilm/sentences.txt").read_text().splitlines()[:4]
    report = evaluate_hf(minilm_model_dir(), OCP, "fp8_e4m3", "embedding", sentences)
    (run,) = report["runs"]
    assert (
        report["pooling"] == "mean" and run["layers"] == 49 and run["skipped"] == 0
    )  # 6 x 8 + pooler
    assert 0.98 < run["cosine_min"] < 1.0 and run["neighbour_agreement"] == 1.0


@pytest.mark.model
@pytest.mark.slow
def test_minilm_on_an_nvfp4_unit_keeps_more_than_on_an_mxfp4_unit(torch):
    """The real model on B200 FP4 units, 4 sentences: NVFP4 (UE4M3 scales per 16 and a tensor
    scale, replay's quantization of every operand) stays closer to float than MXFP4 (E8M0 per
    32) on the same tensor-core family, both keeping the paraphrase neighbours."""
    require_module("all_minilm_l6_v2", "minilm")
    sentences = (REPO / "examples/minilm/sentences.txt").read_text().splitlines()[:4]
    runs = {
        name: evaluate_hf(
            minilm_model_dir(),
            load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml"),
            "fp4_e2m1",
            "embedding",
            sentences,
        )["runs"][0]
        for name in ("b200-nvfp4", "b200-tcgen05-mxf4")
    }
    nvfp4, mxfp4 = runs["b200-nvfp4"], runs["b200-tcgen05-mxf4"]
    assert nvfp4["layers"] == 49 and nvfp4["skipped"] == 0
    assert 0.92 < nvfp4["cosine_min"] < 1.0 and nvfp4["cosine_min"] > mxfp4["cosine_min"] + 0.03
    assert nvfp4["neighbour_agreement"] == mxfp4["neighbour_agreement"] == 1.0


def test_a_model_failing_on_its_inputs_is_one_error(tiny_dirs, monkeypatch):
    def failing(*args, **kwargs):
        raise IndexError("index out of range in self")

    monkeypatch.setattr(evaluate_run.metrics, "pool", failing)
    with pytest.raises(
        MxsimError,
        match="the model failed on the inputs in float32: IndexError: index out of range",
    ):
        evaluate_hf(tiny_dirs["embedding"], OCP, "fp8_e4m3", "embedding", TEXTS)


def test_a_long_label_is_echoed_cut_short(tiny_dirs):
    with pytest.raises(MxsimError) as caught:
        evaluate_hf(
            tiny_dirs["classification"],
            OCP,
            "fp8_e4m3",
            "classification",
            ["x" * 500_000 + "\ta", "pos\tb"],
        )
    assert len(str(caught.value)) < 300
