"""Build the shipped trace of a real model: PP-OCR's text-direction classifier from PyPI.

    python examples/ppocr_cls_trace.py         # writes traces/ppocr-cls/ and tests/data/trace/ppocr_cls/

The model is ``ch_ppocr_mobile_v2.0_cls_infer.onnx`` (PaddleOCR's MobileNetV3-small
text-line classifier, 0 vs 180 degrees, Apache-2.0), as shipped inside the PyPI wheel
``rapidocr_onnxruntime==1.4.4``. Its weights are stored as Constant nodes, not initializers.
The script downloads the wheel with ``pip download`` (or takes ``--wheel``), checks both the
wheel's and the model's SHA-256, copies the model (585 kB) into tests/data/trace/ppocr_cls/,
renders two realistic text lines with Pillow's bundled font (one upright, one rotated by 180
degrees), preprocesses them exactly as RapidOCR's ``TextClassifier.resize_norm_img`` does
(resize to height 48 keeping the aspect ratio, width capped at 192, BGR, ``(x/255 - 0.5) /
0.5``, zero-padded to 3x48x192), runs :func:`mxsim.capture.onnx.capture_onnx` and saves a
selection of layers (all 54 would be ~8 MB) to traces/ppocr-cls/.

Needs ``mxsim[onnx]`` and Pillow.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
WHEEL = "rapidocr_onnxruntime==1.4.4"
WHEEL_SHA256 = "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"
MODEL_MEMBER = "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
MODEL_SHA256 = "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"
LABELS = ["0", "180"]  # RapidOCR config.yaml Cls.label_list
TEXTS = [("Invoice 2024-0117, due 30 days", 0), ("Keep refrigerated below 5 C", 180)]
# One layer of each kind: stem 3x3/2, pointwise 1x1, depthwise 3x3 stride (2, 1), squeeze-excite
# 1x1 pair, depthwise 5x5, wide pointwise 32->200, and the classifier MatMul (+ fused bias).
SELECTED = [
    "Conv@0",
    "Conv@1",
    "Conv@2",
    "Conv@3",
    "Conv@4",
    "Conv@13",
    "Conv@44",
    "Conv@45",
    "Conv@52",
    "MatMul@0",
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_model(wheel: Path | None, destination: Path) -> Path:
    with tempfile.TemporaryDirectory() as scratch:
        if wheel is None:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    WHEEL,
                    "--no-deps",
                    "--only-binary=:all:",
                    "-d",
                    scratch,
                ],
                check=True,
            )
            wheel = next(Path(scratch).glob("*.whl"))
        if sha256(wheel) != WHEEL_SHA256:
            raise SystemExit(f"{wheel}: SHA-256 differs from {WHEEL}'s ({WHEEL_SHA256})")
        destination.parent.mkdir(parents=True, exist_ok=True)
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(MODEL_MEMBER) as source,
            open(destination, "wb") as out,
        ):
            shutil.copyfileobj(source, out)
    if sha256(destination) != MODEL_SHA256:
        raise SystemExit(f"{destination}: SHA-256 differs from the expected model's")
    return destination


def render_line(text: str, degrees: int):
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=30)
    left, top, right, bottom = font.getbbox(text)
    image = Image.new("RGB", (right - left + 16, bottom - top + 12), (245, 243, 238))
    ImageDraw.Draw(image).text((8 - left, 6 - top), text, font=font, fill=(20, 20, 30))
    return image.rotate(degrees) if degrees else image


def preprocess(image) -> np.ndarray:
    """RapidOCR TextClassifier.resize_norm_img with cls_image_shape [3, 48, 192] (PIL resize)."""
    from PIL import Image

    width, height = image.size
    resized_width = min(192, math.ceil(48 * width / height))
    pixels = np.asarray(image.resize((resized_width, 48), Image.BILINEAR), dtype=np.float32)[
        :, :, ::-1
    ]
    normalised = (pixels.transpose(2, 0, 1) / 255 - 0.5) / 0.5
    padded = np.zeros((3, 48, 192), np.float32)
    padded[:, :, :resized_width] = normalised
    return padded


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--wheel", type=Path, help="a local copy of the wheel (default: pip download it)"
    )
    parser.add_argument(
        "--model-dir", type=Path, default=REPO / "tests" / "data" / "trace" / "ppocr_cls"
    )
    parser.add_argument("--trace", type=Path, default=REPO / "traces" / "ppocr-cls")
    args = parser.parse_args(argv)

    import onnxruntime as ort

    from mxsim.trace import save_trace
    from mxsim.capture.onnx import capture_onnx

    model = fetch_model(args.wheel, args.model_dir / Path(MODEL_MEMBER).name)
    batch = np.stack([preprocess(render_line(text, degrees)) for text, degrees in TEXTS])
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    probabilities = session.run(None, {"x": batch})[0]
    predicted = [LABELS[i] for i in probabilities.argmax(axis=1)]
    expected = [str(degrees) for _, degrees in TEXTS]
    print(f"predicted orientation {predicted}, expected {expected}")
    trace = capture_onnx(
        model,
        {"x": batch},
        name="ppocr-cls",
        layers=SELECTED,
        metadata={
            "model_origin": f"PyPI wheel {WHEEL} ({MODEL_MEMBER}); PaddleOCR ch_ppocr_mobile_v2.0_cls; Apache-2.0",
            "texts": [text for text, _ in TEXTS],
            "rotation_degrees": [degrees for _, degrees in TEXTS],
            "labels": LABELS,
            "onnxruntime_probabilities": probabilities.tolist(),
            "predicted": predicted,
            "preprocessing": "RapidOCR TextClassifier.resize_norm_img, cls_image_shape [3, 48, 192], "
            "Pillow default font size 30, PIL bilinear resize",
        },
    )
    save_trace(trace, args.trace, overwrite=True)
    print(f"model: {model}\ntrace: {args.trace} ({len(trace.layers)} layers)")
    return 0 if predicted == expected else 1


if __name__ == "__main__":
    raise SystemExit(main())
