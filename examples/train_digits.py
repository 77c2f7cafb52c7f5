"""Train a small CNN on scikit-learn's bundled digits, export it to ONNX, and capture its trace.

    python examples/train_digits.py            # writes traces/digits-cnn/ and tests/data/trace/digits_cnn.onnx

Needs ``mxsim[torch,onnx]`` and scikit-learn. Seeded and single-process: about 10 s on 2 cores.
The data: 1797 8x8 grey images of handwritten digits (values 0..16, scaled to [0, 1]),
split 80/20 stratified with a fixed seed; the test split (360 images) and its labels are
stored in the trace's dataset so that replay can measure end-to-end accuracy. The float
model's test accuracy is recorded in the manifest's metadata (``float_accuracy``).

Network (an nn.Sequential, so the trace also records its end-to-end recipe):
conv 1->8 3x3 pad 1, ReLU, conv 8->16 3x3 stride 2 pad 1, ReLU, flatten, linear 256->32,
ReLU, linear 32->10.
"""

from __future__ import annotations

import argparse
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SEED = 2026
ONNX_INPUT = "image"


def load_data():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]  # (1797, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    return train_test_split(images, labels, test_size=0.2, stratify=labels, random_state=SEED)


def build_model(torch):
    nn = torch.nn
    return nn.Sequential(
        OrderedDict(
            [
                ("conv1", nn.Conv2d(1, 8, 3, padding=1)),
                ("relu1", nn.ReLU()),
                ("conv2", nn.Conv2d(8, 16, 3, stride=2, padding=1)),
                ("relu2", nn.ReLU()),
                ("flatten", nn.Flatten()),
                ("fc1", nn.Linear(256, 32)),
                ("relu3", nn.ReLU()),
                ("fc2", nn.Linear(32, 10)),
            ]
        )
    )


def train(torch, model, x_train, y_train, epochs: int):
    torch.manual_seed(SEED)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.from_numpy(x_train)
    y = torch.from_numpy(y_train)
    generator = torch.Generator().manual_seed(SEED)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), 64):
            batch = order[start : start + 64]
            optimizer.zero_grad()
            loss_fn(model(x[batch]), y[batch]).backward()
            optimizer.step()
    model.eval()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=REPO / "traces" / "digits-cnn")
    parser.add_argument(
        "--onnx", type=Path, default=REPO / "tests" / "data" / "trace" / "digits_cnn.onnx"
    )
    parser.add_argument(
        "--inputs",
        type=Path,
        default=REPO / "tests" / "data" / "trace" / "digits_inputs.npz",
        help="a few test images under the ONNX input name, for `mxsim capture onnx --inputs`",
    )
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args(argv)

    import torch

    from mxsim.trace import save_trace
    from mxsim.capture.torch import capture_torch

    torch.set_num_threads(1)  # deterministic kernels and reproducible timing
    torch.manual_seed(SEED)
    x_train, x_test, y_train, y_test = load_data()
    model = build_model(torch)
    train(torch, model, x_train, y_train, args.epochs)
    with torch.no_grad():
        logits = model(torch.from_numpy(x_test)).numpy()
    accuracy = float(np.mean(logits.argmax(axis=1) == y_test))
    print(
        f"float test accuracy: {accuracy:.4f} ({int(round(accuracy * len(y_test)))}/{len(y_test)})"
    )

    trace = capture_torch(
        model,
        torch.from_numpy(x_test),
        name="digits-cnn",
        source={
            "model": "DigitsCNN (examples/train_digits.py)",
            "dataset": "scikit-learn load_digits, 20% stratified test split, seed 2026",
        },
        metadata={
            "float_accuracy": accuracy,
            "test_samples": int(len(y_test)),
            "train_samples": int(len(y_train)),
            "epochs": args.epochs,
            "seed": SEED,
            "classes": list(range(10)),
            "input_scaling": "pixel / 16",
        },
        dataset={"inputs": x_test, "labels": y_test},
        network=True,
    )
    save_trace(trace, args.trace, overwrite=True)
    print(f"trace: {args.trace}")

    args.onnx.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            model,
            (torch.from_numpy(x_test[:1]),),
            str(args.onnx),
            dynamo=False,
            input_names=[ONNX_INPUT],
            output_names=["logits"],
            dynamic_axes={ONNX_INPUT: {0: "batch"}, "logits": {0: "batch"}},
            opset_version=17,
        )
    print(f"onnx: {args.onnx}")
    np.savez(args.inputs, **{ONNX_INPUT: x_test[:16]})
    print(f"inputs: {args.inputs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
