"""Evaluation: from a model to a verdict in one call (``mxsim[torch]``, ``mxsim[models]``).

:func:`evaluate_hf` runs a Hugging Face model directory in float32 and with each unit x
element format in the loop (:func:`mxsim.inloop.torch_unit`) and reports the metric that fits
the task (:mod:`.metrics`): embeddings (cosine vs float, similarity-ranking agreement), causal
language models (perplexity, top-1 agreement) and classifiers (accuracy, top-1 agreement).
:mod:`.models` loads models (offline) and inputs and makes the checks before work;
:func:`minilm_model_dir` gives the all-MiniLM-L6-v2 sample (``mxsim[minilm]``).
:func:`evaluate_onnx` (:mod:`.onnx`) gives an ONNX image classifier's top-1 / top-5 in float,
in its own runtime and with each unit in the loop (:func:`mxsim.inloop.run_onnx_on_unit`).

This package consumes inloop (and capture for ``mxsim capture torch`` and ONNX graphs);
nothing imports it but the CLI. Importing it needs neither torch nor transformers.
"""

from .metrics import causal_lm_metrics, classification_metrics, embedding_metrics
from .models import TASKS, load_factory, load_hf, minilm_model_dir, read_inputs
from .onnx import evaluate_onnx, format_onnx_report
from .run import evaluate_hf, format_report

__all__ = [
    "TASKS",
    "causal_lm_metrics",
    "classification_metrics",
    "embedding_metrics",
    "evaluate_hf",
    "evaluate_onnx",
    "format_onnx_report",
    "format_report",
    "load_factory",
    "load_hf",
    "minilm_model_dir",
    "read_inputs",
]
