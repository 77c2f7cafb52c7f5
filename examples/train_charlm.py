"""Train the tiny character-level transformer of traces/char-lm and write the trace.

Text: the licence file that ships with the Python distribution (LICENSE.txt in the standard
library directory), no download. Characters -> ids (sorted vocabulary); the last 10% is held
out: the trace's dataset is 16 held-out windows of 64 tokens and their next-token targets.
Fixed seeds; a few minutes on 2 CPU cores. Run from the repository root:

    python examples/train_charlm.py [--steps N] [--out traces/char-lm]
"""

import argparse
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

from mxsim.inloop.charlm import build_char_transformer, perplexity
from mxsim.trace import Network, save_trace
from mxsim.capture.torch import capture_torch

CONFIG = {"d_model": 64, "layers": 2, "heads": 4, "context": 64}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--out", default="traces/char-lm")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    text = (Path(sysconfig.get_path("stdlib")) / "LICENSE.txt").read_text(encoding="utf-8")
    vocab = sorted(set(text))
    ids = np.array([vocab.index(c) for c in text], dtype=np.int64)
    split = int(0.9 * len(ids))
    train, held_out = ids[:split], ids[split:]
    config = {"vocab_size": len(vocab), **CONFIG}
    model = build_char_transformer(config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=3e-3, total_steps=args.steps)
    rng = np.random.default_rng(0)
    context = config["context"]
    start = time.perf_counter()
    for step in range(args.steps):
        offsets = rng.integers(0, len(train) - context - 1, size=32)
        x = torch.from_numpy(np.stack([train[o : o + context] for o in offsets]))
        y = torch.from_numpy(np.stack([train[o + 1 : o + context + 1] for o in offsets]))
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, len(vocab)), y.reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        if step % 250 == 0:
            print(f"step {step}: loss {loss.item():.3f} ({time.perf_counter() - start:.0f} s)")
    model.eval()
    windows = np.arange(16) * ((len(held_out) - context - 1) // 16)
    tokens = np.stack([held_out[o : o + context] for o in windows])
    targets = np.stack([held_out[o + 1 : o + context + 1] for o in windows])
    float_perplexity = perplexity(model, tokens, targets)
    print(f"held-out perplexity (float32): {float_perplexity:.3f}")
    state = {f"state.{k}": v.detach().numpy().copy() for k, v in model.state_dict().items()}
    trace = capture_torch(
        model,
        torch.from_numpy(tokens[:2]),
        name="char-lm",
        source={"model": "char-transformer", "text": "Python LICENSE.txt"},
        metadata={"float_perplexity": float_perplexity, "vocabulary": "".join(vocab)},
        dataset={"tokens": tokens, "targets": targets, **state},
        network=False,
    )
    trace.network = Network(
        "tokens",
        (),
        targets="targets",
        model={"architecture": "char-transformer", "config": config, "state": "state."},
    )
    save_trace(trace, args.out)
    print(f"wrote {args.out}: {len(trace.layers)} layers")


if __name__ == "__main__":
    main()
