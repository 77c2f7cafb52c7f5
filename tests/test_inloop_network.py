"""mxsim.inloop.network: a trace's language model rebuilt in PyTorch, its perplexity in float and on units."""

from __future__ import annotations

from pathlib import Path

import pytest

from mxsim.errors import MxsimError
from mxsim.inloop.network import perplexity
from mxsim.replay import replay
from mxsim.trace import Trace, load_trace

REPO = Path(__file__).resolve().parents[1]


CHAR_LM = REPO / "traces" / "char-lm"


def _first_sequences(trace, count):
    dataset = dict(trace.dataset)
    for key in (trace.network.input, trace.network.targets):
        dataset[key] = dataset[key][:count]
    return Trace(trace.name, trace.layers, trace.source, trace.metadata, dataset, trace.network)


def test_char_lm_float_perplexity_matches_the_recorded_one(torch):
    trace = load_trace(CHAR_LM)
    assert trace.network.model["architecture"] == "char-transformer"
    value = perplexity(trace)
    assert (
        abs(value - trace.metadata["float_perplexity"]) <= 1e-6 * value
    )  # float32 sums may differ by thread count
    assert value < 0.5 * len(trace.metadata["vocabulary"])  # trained: far better than uniform


@pytest.mark.parametrize("unit", ["ocp-exact", "mxdotp", "h100-fp8"])
def test_char_lm_perplexity_with_every_matmul_on_a_unit(torch, unit):
    from mxsim.datapath import load_hwconfig

    trace = _first_sequences(load_trace(CHAR_LM), 2)
    reference = perplexity(trace)
    value = perplexity(
        trace, load_hwconfig(REPO / "hwconfigs" / f"{unit}.yaml"), a_format="fp8_e4m3"
    )
    assert value != reference  # the unit computed the matmuls
    assert abs(value - reference) < 0.2 * reference


def test_replay_end_to_end_of_a_language_model_needs_the_perplexity_runner_before_any_work():
    from mxsim.datapath import load_hwconfig

    trace = load_trace(CHAR_LM)
    calls = []
    with pytest.raises(
        MxsimError, match=r"language model.*perplexity_fn=mxsim.inloop.network.perplexity"
    ):
        replay(
            trace,
            [load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")],
            end_to_end=True,
            on_layer=calls.append,
        )
    assert calls == []  # refused before any layer ran


def test_replay_end_to_end_of_a_language_model_through_the_perplexity_runner(torch):
    from mxsim.datapath import load_hwconfig

    trace = _first_sequences(load_trace(CHAR_LM), 1)
    hw = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")
    report = replay(
        trace, [hw], end_to_end=True, element_format="fp8_e4m3", perplexity_fn=perplexity
    )
    assert report["end_to_end"]["float_perplexity"] == perplexity(trace)
    assert report["end_to_end"]["perplexity"][hw.name] == perplexity(trace, hw, a_format="fp8_e4m3")
