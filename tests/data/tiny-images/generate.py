"""Writes the tiny image-classification set of the ``mxsim evaluate onnx`` tests: 8 classes x 5
RGB PNGs of 20..28 x 20..28 pixels, drawn from a seeded numpy stream (run from this folder:
``python generate.py``; needs Pillow). The images are synthetic patterns, one kind per class."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = (
    "checker",
    "disc-blue",
    "disc-green",
    "disc-red",
    "gradient",
    "noise-dark",
    "stripes-horizontal",
    "stripes-vertical",
)
PER_CLASS = 5


def draw(kind: str, rng: np.random.Generator) -> np.ndarray:
    """One (height, width, 3) uint8 image of the class ``kind``."""
    height, width = (int(v) for v in rng.integers(20, 29, size=2))
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    image = rng.uniform(0.3, 0.6, size=(height, width, 3))
    period = rng.uniform(3.0, 6.0)
    phase = rng.uniform(0, 2 * np.pi)
    if kind.startswith("disc-"):
        channel = ("red", "green", "blue").index(kind[5:])
        cy, cx, radius = rng.uniform(8, height - 8), rng.uniform(8, width - 8), rng.uniform(4, 7)
        inside = (y - cy) ** 2 + (x - cx) ** 2 <= radius**2
        image[inside] = 0.15
        image[inside, channel] = 0.95
    elif kind == "stripes-horizontal":
        image *= 0.6 + 0.5 * (np.sin(2 * np.pi * y / period + phase) > 0)[..., None]
    elif kind == "stripes-vertical":
        image *= 0.6 + 0.5 * (np.sin(2 * np.pi * x / period + phase) > 0)[..., None]
    elif kind == "checker":
        cells = (np.floor(y / period * 2) + np.floor(x / period * 2)) % 2
        image *= 0.6 + 0.5 * cells[..., None]
    elif kind == "gradient":
        image = 0.5 * image + 0.5 * (x / width)[..., None] * rng.uniform(0.6, 1.0, size=3)
    elif kind == "noise-dark":
        image *= 0.35
    image += rng.normal(0, 0.04, size=image.shape)
    return np.clip(np.round(image * 255), 0, 255).astype(np.uint8)


def main(folder: Path = Path(__file__).parent / "images") -> None:
    rng = np.random.default_rng(20260)
    for kind in CLASSES:
        (folder / kind).mkdir(parents=True, exist_ok=True)
        for index in range(PER_CLASS):
            Image.fromarray(draw(kind, rng)).save(
                folder / kind / f"{kind}-{index}.png", optimize=True
            )


if __name__ == "__main__":
    main()
