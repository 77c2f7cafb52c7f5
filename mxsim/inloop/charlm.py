"""A tiny character-level transformer language model, and its perplexity (``mxsim[torch]``).

The sample trace ``traces/char-lm`` is this model (``examples/train_charlm.py`` trains it).
The architecture is fixed here so that a trace can rebuild it from its config and state
arrays: token + learned position embeddings, ``layers`` pre-LayerNorm blocks (causal
multi-head attention through ``F.scaled_dot_product_attention``, a GELU MLP of width
``4 * d_model``), a final LayerNorm and an untied output projection.
"""

from __future__ import annotations

import math

import numpy as np

from .._optional import require
from ..errors import MxsimError

CONFIG_KEYS = ("vocab_size", "d_model", "layers", "heads", "context")


def build_char_transformer(config: dict):
    """An ``nn.Module`` mapping token ids (B, T) to logits (B, T, vocab_size), untrained."""
    torch = require("torch")
    nn, F = torch.nn, torch.nn.functional
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        raise MxsimError(
            f"char-transformer config needs {', '.join(CONFIG_KEYS)}; missing {', '.join(missing)}"
        )
    vocab, d, n_layers, heads, context = (int(config[k]) for k in CONFIG_KEYS)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class CharTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(vocab, d)
            self.positions = nn.Embedding(context, d)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab)

        def forward(self, ids):
            x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return CharTransformer()


ARCHITECTURES = {"char-transformer": build_char_transformer}


def build_model(architecture: str, config: dict, state: dict[str, np.ndarray]):
    """The named architecture built from ``config`` with parameters ``state`` (eval mode)."""
    torch = require("torch")
    if architecture not in ARCHITECTURES:
        raise MxsimError(
            f"unknown architecture {architecture!r}; known: {', '.join(ARCHITECTURES)}"
        )
    model = ARCHITECTURES[architecture](config)
    try:
        model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
    except RuntimeError as error:
        raise MxsimError(
            f"{architecture}: the state arrays do not fit the config: {error}"
        ) from None
    return model.eval()


def perplexity(model, tokens: np.ndarray, targets: np.ndarray) -> float:
    """exp(mean cross-entropy) of ``model``'s logits for ``tokens`` (B, T) against
    ``targets`` (B, T) (natural log, float64 mean over every position)."""
    torch = require("torch")
    with torch.no_grad():
        logits = model(torch.from_numpy(np.asarray(tokens, dtype=np.int64)))
        log_probs = torch.log_softmax(logits.to(torch.float64), dim=-1)
        picked = log_probs.gather(
            -1, torch.from_numpy(np.asarray(targets, dtype=np.int64))[..., None]
        )
    return math.exp(-float(picked.mean()))
