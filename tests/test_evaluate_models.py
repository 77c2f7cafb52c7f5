"""Models and inputs for evaluation: every request that cannot be met is refused in one line,
and the MiniLM sample's float embeddings match sentence-transformers'."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from conftest import REPO, require_module
from mxsim.errors import ArgumentError, InputFileError, MxsimError
from mxsim.evaluate.models import (
    MAX_INPUT_BYTES,
    MAX_INPUTS,
    check_model_dir,
    check_task,
    load_factory,
    load_hf,
    minilm_model_dir,
    parse_inputs,
    read_inputs,
    read_pooling,
    tokenize,
)
from mxsim.evaluate.metrics import pool

SENTENCES = REPO / "examples/minilm/sentences.txt"


def test_inputs_are_non_blank_lines_with_optional_labels():
    got = parse_inputs(["a b\n", "   \n", "c\td\r\n"], "embedding", "x")
    assert got.texts == ["a b", "c\td"] and got.labels == [
        None,
        None,
    ]  # a tab is text outside classification
    got = parse_inputs(["pos\tgood", "0\tbad"], "classification", "x")
    assert got.texts == ["good", "bad"] and got.labels == ["pos", "0"]
    assert len(read_inputs(SENTENCES, "embedding").texts) == 24


@pytest.mark.parametrize(
    "lines, message",
    [
        (["", "  "], "no inputs (every line is blank)"),
        (["pos\ta", "b"], "some lines have a LABEL<TAB> prefix and some not"),
        (["x"] * (MAX_INPUTS + 1), f"at most {MAX_INPUTS} are taken"),
    ],
)
def test_bad_inputs_are_refused(lines, message):
    with pytest.raises(InputFileError, match=re.escape(message)):
        parse_inputs(lines, "classification", "x")


def test_bad_input_files_are_refused(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    (tmp_path / "big.txt").write_text("a\n" * (MAX_INPUT_BYTES // 2 + 1))
    for name, message in [
        ("empty.txt", "no inputs"),
        ("latin1.txt", "not UTF-8"),
        ("big.txt", "limited to"),
        ("missing.txt", "no such file"),
        ("", "no such file"),
    ]:
        with pytest.raises(InputFileError, match=message):
            read_inputs(tmp_path / name, "embedding")
    with pytest.raises(ArgumentError, match="expected a file path or a list of strings"):
        read_inputs(["a", 3], "embedding")
    with pytest.raises(
        ArgumentError, match="unknown task 'ner'; accepted: embedding, causal-lm, classification"
    ):
        check_task("ner")


def _pooling_dir(path, config, modules=None):
    path.mkdir()
    (path / "modules.json").write_text(
        json.dumps(
            modules
            or [
                {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ]
        )
    )
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling/config.json").write_text(json.dumps(config))
    return path


def test_pooling_is_read_and_unimplemented_ones_refused(tmp_path):
    assert read_pooling(tmp_path) == "mean"  # no sentence-transformers files: mean pooling
    assert (
        read_pooling(
            _pooling_dir(
                tmp_path / "mean",
                {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False},
            )
        )
        == "mean"
    )
    assert read_pooling(_pooling_dir(tmp_path / "cls", {"pooling_mode_cls_token": True})) == "cls"
    with pytest.raises(
        MxsimError, match="pooling mean_sqrt_len is not implemented; implemented: one of mean, cls"
    ):
        read_pooling(_pooling_dir(tmp_path / "sqrt", {"pooling_mode_mean_sqrt_len_tokens": True}))
    with pytest.raises(MxsimError, match="pooling mean \\+ max is not implemented"):
        read_pooling(
            _pooling_dir(
                tmp_path / "two",
                {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True},
            )
        )
    with pytest.raises(MxsimError, match="module 'Dense' is not implemented"):
        read_pooling(
            _pooling_dir(
                tmp_path / "dense",
                {"pooling_mode_mean_tokens": True},
                [{"path": "2_Dense", "type": "sentence_transformers.models.Dense"}],
            )
        )
    bad = _pooling_dir(tmp_path / "bad", {})
    (bad / "1_Pooling/config.json").write_text("{not json")
    with pytest.raises(InputFileError, match="the pooling config is not valid JSON"):
        read_pooling(bad)


def test_a_model_directory_needs_a_config_object(tmp_path):
    with pytest.raises(InputFileError, match="not a model directory"):
        check_model_dir(tmp_path / "missing")
    with pytest.raises(
        InputFileError, match="no config.json; expected a Hugging Face model directory"
    ):
        check_model_dir(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(InputFileError, match="config.json: expected a JSON object"):
        check_model_dir(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(MxsimError, match="no tokenizer files"):
        load_hf(tmp_path, "embedding")  # a config without weights or tokenizer
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    with pytest.raises(MxsimError, match="no weights"):
        load_hf(tmp_path, "embedding")


def test_missing_transformers_is_one_error(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(
        MxsimError, match=r"transformers is not installed .* pip install 'mxsim\[models\]'"
    ):
        load_hf(tmp_path, "embedding")


FACTORY = """
import torch

def model_and_inputs():
    return torch.nn.Sequential(torch.nn.Linear(4, 3)), torch.ones(2, 4)

def model_only():
    return torch.nn.Linear(4, 3)

def broken():
    raise ValueError("no weights here")

def not_a_model():
    return 42
"""


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nomodule", "expected a Hugging Face model directory or module:factory"),
        ("a b:c", "expected a Hugging Face model directory or module:factory"),
        ("mxsim_no_such_module:f", "cannot import mxsim_no_such_module: ModuleNotFoundError"),
        ("evaluate_factory_syntax:f", "cannot import evaluate_factory_syntax: SyntaxError"),
        ("evaluate_factory:missing", "evaluate_factory has no callable missing"),
        ("evaluate_factory:broken", "the factory raised ValueError: no weights here"),
        ("evaluate_factory:not_a_model", "the factory returned int; expected an nn.Module"),
    ],
)
def test_bad_factories_are_refused(torch, tmp_path, monkeypatch, spec, message):
    (tmp_path / "evaluate_factory.py").write_text(FACTORY)
    (tmp_path / "evaluate_factory_syntax.py").write_text("def f(:\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "evaluate_factory", raising=False)
    with pytest.raises(MxsimError, match=re.escape(message)):
        load_factory(spec)


def test_a_factory_gives_a_model_and_maybe_inputs(torch, tmp_path, monkeypatch):
    (tmp_path / "evaluate_factory.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "evaluate_factory", raising=False)
    model, example = load_factory("evaluate_factory:model_and_inputs")
    assert isinstance(model, torch.nn.Sequential) and example.shape == (2, 4)
    model, example = load_factory("evaluate_factory:model_only")
    assert isinstance(model, torch.nn.Linear) and example is None
    assert (
        str(tmp_path) not in sys.path
    )  # the current directory is on the path only while importing


@pytest.fixture(scope="module")
def minilm_dir():
    require_module("all_minilm_l6_v2", "minilm")
    return minilm_model_dir()


def test_minilm_dir_is_a_model_directory_and_keeps_stdout_clean(minilm_dir, capsys):
    assert minilm_model_dir() == minilm_dir and capsys.readouterr().out == ""
    assert check_model_dir(minilm_dir) == minilm_dir and read_pooling(minilm_dir) == "mean"


def test_minilm_float_embeddings_match_sentence_transformers(torch, minilm_dir):
    """The float reference of the embedding evaluation (offline load, tokenizer, mean pooling)
    against sentence-transformers' own encode of the same directory."""
    st = require_module("sentence_transformers", "minilm")
    texts = read_inputs(SENTENCES, "embedding").texts[:8]
    model, tokenizer = load_hf(minilm_dir, "embedding")
    batch = tokenize(tokenizer, texts, 128)
    with torch.no_grad():
        ours = pool(model(**batch)[0].numpy(), batch["attention_mask"].numpy(), "mean")
    want = st.SentenceTransformer(str(minilm_dir), device="cpu", local_files_only=True).encode(
        texts
    )
    ours = ours / np.linalg.norm(ours, axis=1, keepdims=True)  # the model's Normalize module
    assert np.abs(ours - want).max() < 1e-5


# ----------------------------------------------------------------------------- hostile model directories


def _hostile_dir(tmp_path, tiny, name, edit=None, files=None, remove=()):
    import shutil

    path = tmp_path / name
    shutil.copytree(tiny, path)
    if edit is not None:
        config = json.loads((path / "config.json").read_text())
        edit(config)
        (path / "config.json").write_text(json.dumps(config))
    for file, data in (files or {}).items():
        (path / file).write_bytes(data if isinstance(data, bytes) else data.encode())
    for file in remove:
        (path / file).unlink()
    return path


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    from conftest import tiny_hf_dir

    torch = require_module("torch", "torch")
    return tiny_hf_dir(torch, tmp_path_factory.mktemp("hf") / "classification", "classification")


HOSTILE_DIRS = {
    "auto_map": (
        {
            "edit": lambda c: c.update(
                auto_map={"AutoModelForSequenceClassification": "evil.Model"}
            ),
            "files": {"evil.py": "open('PWNED', 'w').close()\n"},
        },
        "config.json: auto_map names code",
    ),
    "tokenizer auto_map": (
        {
            "files": {
                "tokenizer_config.json": json.dumps(
                    {"auto_map": {"AutoTokenizer": ["evil.T", None]}}
                )
            }
        },
        "tokenizer_config.json: auto_map names code",
    ),
    "no tokenizer": ({"remove": ("tokenizer.json",)}, "no tokenizer files"),
    "garbled tokenizer": (
        {"files": {"tokenizer.json": "{garbage"}},
        "cannot load the tokenizer (tokenizer.json)",
    ),
    "size as a string": (
        {"edit": lambda c: c.update(hidden_size="32")},
        "hidden_size must be a positive integer",
    ),
    "dtype": ({"edit": lambda c: c.update(dtype="garbage")}, "dtype must be one of"),
    "torch_dtype": (
        {"edit": lambda c: c.update(torch_dtype="garbage")},
        "torch_dtype must be one of",
    ),
    "pad past the vocabulary": (
        {"edit": lambda c: c.update(pad_token_id=1000)},
        "pad_token_id must be a token id",
    ),
    "id2label": ({"edit": lambda c: c.update(id2label=["neg"] * 9000)}, "id2label must map"),
    "bitsandbytes": (
        {
            "edit": lambda c: c.update(
                quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True}
            )
        },
        "quant_method 'bitsandbytes' is not read; accepted: quark, torchao",
    ),
    "empty weights": (
        {"files": {"model.safetensors": b""}},
        "model.safetensors: unreadable safetensors weights",
    ),
    "garbled weights": (
        {"files": {"model.safetensors": bytes(range(256)) * 8}},
        "unreadable safetensors weights",
    ),
    "no weights": ({"remove": ("model.safetensors",)}, "no weights"),
    "heads": (
        {"edit": lambda c: c.update(num_attention_heads=5)},
        "cannot load the classification model",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_DIRS))
def test_hostile_model_directories_are_one_line_errors_naming_the_file(
    tmp_path, tiny_classifier, monkeypatch, case
):
    changes, message = HOSTILE_DIRS[case]
    path = _hostile_dir(tmp_path, tiny_classifier, "model", **changes)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MxsimError, match=re.escape(message)) as caught:
        load_hf(path, "classification")
    assert (
        "\n" not in str(caught.value)
        and len(str(caught.value)) < 600
        and str(path) in str(caught.value)
    )
    assert not (tmp_path / "PWNED").exists()


def test_truncated_weights_are_refused(tmp_path, tiny_classifier):
    data = (tiny_classifier / "model.safetensors").read_bytes()
    path = _hostile_dir(
        tmp_path, tiny_classifier, "model", files={"model.safetensors": data[: len(data) // 2]}
    )
    with pytest.raises(MxsimError, match="unreadable safetensors weights"):
        load_hf(path, "classification")


def test_a_pickled_checkpoint_is_refused_and_never_run(tmp_path, tiny_classifier):
    torch = require_module("torch", "torch")

    class Evil:
        def __reduce__(self):
            return (open, (str(tmp_path / "PWNED"), "w"))

    path = _hostile_dir(tmp_path, tiny_classifier, "model", remove=("model.safetensors",))
    torch.save({"weight": Evil()}, path / "pytorch_model.bin")
    with pytest.raises(
        MxsimError, match="pytorch_model.bin: not a weights-only torch checkpoint"
    ) as caught:
        load_hf(path, "classification")
    assert "\n" not in str(caught.value) and not (tmp_path / "PWNED").exists()


def test_no_prompt_reaches_stdin_during_a_load(tmp_path, tiny_classifier, monkeypatch):
    """A 'y' waiting on stdin is never read: stdin is empty while transformers loads."""
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    seen = []
    transformers = require_module("transformers", "models")
    original = transformers.AutoTokenizer.from_pretrained

    def spy(*args, **kwargs):
        seen.append((sys.stdin.read(), kwargs.get("trust_remote_code")))
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    load_hf(tiny_classifier, "classification")
    assert seen == [("", False)] and sys.stdin.read() == "y\n"


def test_a_factory_that_exits_is_an_error(tmp_path, monkeypatch):
    require_module("torch", "torch")
    (tmp_path / "exiting.py").write_text("import sys\ndef make():\n    sys.exit(0)\n")
    monkeypatch.chdir(tmp_path)
    for spec in ("exiting:make", "sys:exit"):
        with pytest.raises(MxsimError, match="the factory raised SystemExit"):
            load_factory(spec)


def test_token_ids_past_the_vocabulary_and_lengths_past_the_positions(tmp_path, tiny_classifier):
    torch = require_module("torch", "torch")
    tokenizer_json = json.loads((tiny_classifier / "tokenizer.json").read_text())
    tokenizer_json["model"]["vocab"]["cat"] = 100  # the model embeds 64 tokens
    path = _hostile_dir(
        tmp_path, tiny_classifier, "model", files={"tokenizer.json": json.dumps(tokenizer_json)}
    )
    model, tokenizer = load_hf(path, "classification")
    with pytest.raises(MxsimError, match="token id 100 but the model embeds 64"):
        tokenize(tokenizer, ["the cat"], 16, model)
    model, tokenizer = load_hf(tiny_classifier, "classification")  # 32 positions
    with pytest.warns(UserWarning, match="truncated to 32 tokens"):
        batch = tokenize(tokenizer, ["the cat " * 40], 128, model)
    assert batch["input_ids"].shape == (1, 32)
    with torch.no_grad():
        model(**batch)  # runs
