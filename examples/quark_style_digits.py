"""Make a Quark-style quantized copy of the digits CNN: MX/BFP custom ops on every layer's operands.

    python examples/quark_style_digits.py      # writes tests/data/trace/digits_cnn_quark.onnx

AMD Quark's ONNX quantizer inserts ``com.amd.quark`` ``MXQuantizeDequantize`` /
``BFPQuantizeDequantize`` nodes in front of each quantized operand. Quark itself is not needed
(nor installable here): this script inserts the same nodes with onnx.helper into the float
model exported by ``examples/train_digits.py``, using the attribute sets of Quark's
documentation tables (rounding_mode 2):

* activations entering each Conv/Gemm: MXFP8 E4M3, axis 1 (channels / features), block 32;
* Conv weights: MX6 (to_bfp_prime, bit_width 13, block 16, sub-block 2, 1 shift bit), axis 1;
* Gemm weights (stored (N, K), transB=1): MXINT8, axis 1 (K), block 32.

onnxruntime cannot run the result without Quark's library; ``capture_onnx`` can (it evaluates
the custom nodes with mxsim), and records each operand's format from these nodes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUARK = "com.amd.quark"
ACTIVATION = {"element_dtype": "fp8_e4m3", "axis": 1, "block_size": 32, "rounding_mode": 2}
CONV_WEIGHT = {
    "bfp_method": "to_bfp_prime",
    "bit_width": 13,
    "block_size": 16,
    "sub_block_size": 2,
    "sub_block_shift_bits": 1,
    "rounding_mode": 2,
    "axis": 1,
}
GEMM_WEIGHT = {"element_dtype": "int8", "axis": 1, "block_size": 32, "rounding_mode": 2}


def quantize_model(model):
    import onnx

    helper = onnx.helper
    graph = model.graph
    nodes = []
    for node in graph.node:
        if node.op_type in ("Conv", "Gemm"):
            base = node.name.strip("/").replace("/", "_")
            activation, weight = node.input[0], node.input[1]
            nodes.append(
                helper.make_node(
                    "MXQuantizeDequantize",
                    [activation],
                    [f"{activation}_mx"],
                    name=f"{base}_input_mx",
                    domain=QUARK,
                    **ACTIVATION,
                )
            )
            if node.op_type == "Conv":
                nodes.append(
                    helper.make_node(
                        "BFPQuantizeDequantize",
                        [weight],
                        [f"{weight}_mx6"],
                        name=f"{base}_weight_mx6",
                        domain=QUARK,
                        **CONV_WEIGHT,
                    )
                )
                quantized_weight = f"{weight}_mx6"
            else:
                nodes.append(
                    helper.make_node(
                        "MXQuantizeDequantize",
                        [weight],
                        [f"{weight}_mxint8"],
                        name=f"{base}_weight_mxint8",
                        domain=QUARK,
                        **GEMM_WEIGHT,
                    )
                )
                quantized_weight = f"{weight}_mxint8"
            node.input[0] = f"{activation}_mx"
            node.input[1] = quantized_weight
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    model.opset_import.append(helper.make_opsetid(QUARK, 1))
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--float-model", type=Path, default=REPO / "tests" / "data" / "trace" / "digits_cnn.onnx"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "tests" / "data" / "trace" / "digits_cnn_quark.onnx"
    )
    args = parser.parse_args(argv)
    import onnx

    model = quantize_model(onnx.load(str(args.float_model)))
    onnx.save(model, str(args.out))
    print(f"quark-style model: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
