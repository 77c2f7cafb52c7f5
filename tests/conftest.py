"""Shared fixtures and helpers for the mxsim test suite."""

from __future__ import annotations

import importlib
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from mxsim.formats import FORMATS

settings.register_profile("default", max_examples=200, deadline=None)
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"

NARROW_FORMATS = [name for name, fmt in FORMATS.items() if fmt.bits <= 8]
SIXTEEN_BIT_OR_LESS = [name for name, fmt in FORMATS.items() if fmt.bits <= 16]


def same_float(a: float, b: float) -> bool:
    """Equal as values, with NaN equal to NaN and the sign of zero compared."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@pytest.fixture(scope="session")
def torch():
    """torch, or a skip with the install hint (a failure when CI is set: CI must test capture)."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("torch is required when CI is set: pip install 'mxsim[torch]' (torch==2.13.0)", pytrace=False)
        pytest.skip("torch is not installed (pip install 'mxsim[torch]')")


def require_module(name: str, extra: str):
    """Import ``name``, or skip with the install hint (a failure when CI is set: CI has every extra)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required when CI is set: pip install 'mxsim[{extra}]'", pytrace=False)
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
                if hasattr(self.model.config, "use_cache") and "Bert" not in type(self.model).__name__:
                    return self.model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False).logits
                return self.model(input_ids=x, attention_mask=torch.ones_like(x)).pooler_output

        return Wrapped().eval()


def tiny_transformer(torch, family: str, attn_implementation: str = "sdpa"):
    """(model, sample input) for a GPT-2, BERT, LLaMA or ViT built from a `transformers` config:
    2 layers, hidden size 32, 4 heads (LLaMA: 2 key/value heads), seeded weights, no hub."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = {"attn_implementation": attn_implementation}
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16,
                                         bos_token_id=0, eos_token_id=0, **common)
        model = transformers.GPT2LMHeadModel(config)
    elif family == "bert":
        config = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                         intermediate_size=64, vocab_size=64, max_position_embeddings=16, **common)
        model = transformers.BertModel(config)
    elif family == "llama":
        config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                                          max_position_embeddings=16, bos_token_id=0, eos_token_id=0, **common)
        model = transformers.LlamaForCausalLM(config)
    elif family == "vit":
        config = transformers.ViTConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                        intermediate_size=64, image_size=16, patch_size=4, num_channels=3, **common)
        model = transformers.ViTModel(config)
    else:
        raise ValueError(family)
    generator = torch.Generator().manual_seed(1)
    if family == "vit":
        sample = torch.randn(2, 3, 16, 16, generator=generator)
    else:
        sample = torch.randint(0, 64, (2, 8), generator=generator)
    return _TransformerOutput(torch, model.eval()), sample


TRANSFORMER_FAMILIES = ("gpt2", "bert", "llama", "vit")


def count_gemm_kernels(torch, model, sample) -> dict:
    """The GEMM kernels one forward pass runs, counted by torch.profiler (independently of any
    capture code): aten::mm/addmm/bmm/baddbmm/mv/dot/convolution calls, and two per fused
    scaled-dot-product-attention kernel (its Q.K^T and P.V)."""
    from torch.profiler import ProfilerActivity, profile

    single = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mv", "aten::addmv", "aten::dot",
              "aten::convolution")
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(sample)
    counts = {}
    for event in prof.events():
        if event.name in single:
            counts[event.name] = counts.get(event.name, 0) + 1
        elif event.name == "aten::_scaled_dot_product_flash_attention_for_cpu":
            counts[event.name] = counts.get(event.name, 0) + 2
    return counts
@pytest.fixture(scope="session")
def dask_runner():
    """A 2-worker Dask LocalCluster (processes), shared by the tests that need one; skipped
    without the dask extra (a failure when CI is set)."""
    try:
        importlib.import_module("distributed")
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("dask.distributed is required when CI is set: pip install 'mxsim[dask]'", pytrace=False)
        pytest.skip("dask.distributed is not installed (pip install 'mxsim[dask]')")
    from mxsim.parallel import DaskRunner

    # Small tiles so that the CI-sized sample's GEMMs are split across tasks too.
    runner = DaskRunner(workers=2, timeout=300, tile_macs=1 << 16)
    yield runner
    runner.close()
