"""A trace's language model rebuilt in PyTorch and run end to end (``mxsim[torch]``).

:func:`perplexity` runs the model that ``trace.network.model`` describes on the trace's
dataset, in float32 or with every matmul on a unit through :func:`mxsim.inloop.torch_unit`;
:func:`mxsim.replay.replay` takes it as ``perplexity_fn`` for a language model's end to end.
"""

from __future__ import annotations

from ..errors import MxsimError
from ..trace.model import Trace
from .charlm import build_model
from .charlm import perplexity as model_perplexity
from .torch import torch_unit


def rebuild_model(trace: Trace):
    """The torch module that ``trace.network.model`` describes, with its state arrays."""
    network = trace.network
    if network is None or network.model is None:
        raise MxsimError(f"trace {trace.name!r} has no network.model to rebuild")
    prefix = network.model["state"]
    state = {
        name[len(prefix) :]: array
        for name, array in trace.dataset.items()
        if name.startswith(prefix)
    }
    return build_model(network.model["architecture"], network.model["config"], state)


def perplexity(trace: Trace, hw=None, **unit_options) -> float:
    """Perplexity of the rebuilt language model on its dataset (input token ids vs targets),
    in float32 PyTorch (``hw`` None) or with every matmul on ``hw`` (options of
    :func:`mxsim.inloop.torch_unit`)."""
    network = trace.network
    if network is None or network.targets is None:
        raise MxsimError(f"trace {trace.name!r} has no network with targets")
    model = rebuild_model(trace)
    tokens, targets = trace.dataset[network.input], trace.dataset[network.targets]
    if hw is None:
        return model_perplexity(model, tokens, targets)
    with torch_unit(model, hw, **unit_options):
        return model_perplexity(model, tokens, targets)
