"""mxsim.capture.torch_checkpoint: quantized checkpoints saved by AMD Quark's exporter and by
torchao, read by mxsim and checked live against the library.

Quark: a 2-layer BERT (trained-like weights, LayerNorm gains that make outlier channels) is
quantized by Quark's ``ModelQuantizer`` and written by ``export_safetensors``; the library's
own reading of that directory is transformers' Quark loader (``AutoModel.from_pretrained``,
its ``QParamsLinear`` modules). torchao: the same BERT in bf16, ``quantize_`` with
``MXDynamicActivationMXWeightConfig``, its state dict written by torchao's
``flatten_tensor_state_dict`` into ``model.safetensors``; the library's reference is the
quantized model itself. Per quantized Linear: mxsim's element codes and scale codes are the
library's (its stored tensors, and the values Quark computed before the export); the layer
captured from mxsim's model and replayed on an exact unit (the model's operands: status
"model") is the library's layer output at >= 100 dB (Quark, float32); for torchao (bf16) the
model mxsim builds computes torchao's model bit for bit, the replay is the recorded operands'
product at >= 100 dB and, rounded once to bf16, equals torchao's bf16 layer output (torchao's
emulated GEMM is a float32-accumulated bf16 ``addmm`` of its dequantized operands, rounded
once);
``mxsim capture torch`` and ``mxsim evaluate hf`` take the directory as it is. The live tests
import Quark and torchao (minutes on a loaded machine): slow. The refusals are quick.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import warnings

import numpy as np
import pytest
from conftest import REPO, TINY_WORDS, import_or_skip, sqnr_db, tiny_hf_dir, trained_like

from mxsim import load_hwconfig
from mxsim.errors import MxsimError
from mxsim.quantize.packing import pack_codes
from mxsim.replay.layer import run_layer
from mxsim.trace import load_trace

os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
OCP = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")
TEXTS = [
    "the cat sat on the mat",
    "a man plays guitar in the park",
    "market fell today",
    "the big red dog ran early",
]
QUARK_SPECS = {  # name -> weight spec, its format, input spec, its format, export weight_format
    "mxfp4 weights, mxfp8 inputs": (
        "OCP_MXFP4Spec",
        "fp4_e2m1",
        "OCP_MXFP8E4M3Spec",
        "fp8_e4m3",
        "real_quantized",
    ),
    # Quark 0.13 exports MXFP8 weights only as fake_quantized (float weights, float scales)
    "mxfp8 weights and inputs": (
        "OCP_MXFP8E4M3Spec",
        "fp8_e4m3",
        "OCP_MXFP8E4M3Spec",
        "fp8_e4m3",
        "fake_quantized",
    ),
}


def realistic_bert(torch, transformers, folder):
    """tiny_hf_dir's BERT with trained-like Linear weights and three outlier channels (its
    embedding LayerNorm gains 30-80x), saved back to ``folder``."""
    model = transformers.AutoModel.from_pretrained(str(folder)).eval()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    trained_like(torch, linears)
    with torch.no_grad():
        model.embeddings.LayerNorm.weight[[3, 17, 25]] *= torch.tensor([30.0, -80.0, 45.0])
    return model


def library_outputs(torch, model, batch) -> dict:
    """Linear module name -> its output (float64 numpy), by forward hooks; and the model's output."""
    seen, handles = {}, []
    for name, module in model.named_modules():
        if "Linear" in type(module).__name__:

            def hook(_module, _inputs, output, name=name):
                seen[name] = output.detach().double().numpy()

            handles.append(module.register_forward_hook(hook))
    with torch.no_grad():
        out = model(**batch).last_hidden_state.detach().double().numpy()
    for handle in handles:
        handle.remove()
    return seen, out


def mxsim_read(torch, folder):
    from mxsim.capture.torch import capture_torch
    from mxsim.evaluate.models import load_hf, tokenize

    model, tokenizer = load_hf(folder, "embedding")
    batch = tokenize(tokenizer, TEXTS, 16, model)
    trace = capture_torch(model, batch)
    with torch.no_grad():
        out = model(**batch).last_hidden_state.detach().double().numpy()
    return batch, trace, out


def quantized_layers(trace):
    return [layer for layer in trace.layers if "quantizers" in layer.source]


@pytest.fixture(scope="module")
def quark_dirs(torch, tmp_path_factory):
    """name -> (checkpoint directory, Quark's quantized model before the export)."""
    import_or_skip("quark.torch", "oracles")
    transformers = pytest.importorskip("transformers")
    from quark.torch import ModelQuantizer, export_safetensors
    from quark.torch.quantization.config import config

    base = tiny_hf_dir(torch, tmp_path_factory.mktemp("bert"), "embedding")
    made = {}
    for name, (weight, _, inputs, _, weight_format) in QUARK_SPECS.items():
        model = realistic_bert(torch, transformers, base)
        layer = config.QLayerConfig(
            weight=getattr(config, weight)(ch_axis=-1, is_dynamic=False).to_quantization_spec(),
            input_tensors=getattr(config, inputs)(
                ch_axis=-1, is_dynamic=True
            ).to_quantization_spec(),
        )
        calibration = [{"input_ids": torch.randint(2, 30, (2, 8))}]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantized = ModelQuantizer(config.QConfig(global_quant_config=layer)).quantize_model(
                model, calibration
            )
            reference = copy.deepcopy(quantized)  # the export converts the model's modules
            folder = tmp_path_factory.mktemp("quark")
            export_safetensors(quantized, folder, custom_mode="quark", weight_format=weight_format)
        for file in base.iterdir():  # the tokenizer beside the export
            if (
                file.name.startswith(("tokenizer", "special_tokens"))
                and not (folder / file.name).exists()
            ):
                shutil.copy(file, folder / file.name)
        made[name] = (folder, reference)
    return made


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("name", list(QUARK_SPECS))
def test_a_quark_export_loads_with_quarks_codes_scales_and_layer_outputs(torch, quark_dirs, name):
    """Against Quark's model before the export (its quantizers' scales and values, its layer
    outputs) and, for real_quantized, the stored tensors as Quark's own loader
    (transformers' Quark integration) holds them."""
    transformers = pytest.importorskip("transformers")
    folder, quantized = quark_dirs[name]
    _, weight_format, _, input_format, export = QUARK_SPECS[name]
    batch, trace, ours = mxsim_read(torch, folder)
    want, out = library_outputs(torch, quantized, batch)
    before = dict(quantized.named_modules())
    loaded = (
        dict(transformers.AutoModel.from_pretrained(str(folder)).named_modules())
        if export == "real_quantized"
        else None
    )
    layers = quantized_layers(trace)
    assert len(layers) == 13  # q, k, v, attention output, intermediate, output x 2; pooler
    worst = np.inf
    for layer in layers:
        weight, inputs = layer.quant["weight"], layer.quant["input"]
        assert (weight.format, inputs.format) == (weight_format, input_format)
        assert weight.profile == inputs.profile == "quark"
        module = before[layer.name]
        scale = module._weight_quantizer.scale.detach().double().numpy()
        assert np.array_equal(weight.scales, (np.log2(scale) + 127).astype(np.uint8))
        quark_weight = module._weight_quantizer(module.weight).detach().numpy()
        assert np.array_equal(layer.weight, quark_weight)
        codes = weight.quantize(layer.weight).codes
        if loaded is not None:  # the stored tensors
            stored = loaded[layer.name].weight.detach().view(torch.uint8).numpy()
            packed = (
                pack_codes(codes, 4).reshape(stored.shape) if weight.format == "fp4_e2m1" else codes
            )
            assert np.array_equal(packed, stored)
            scales = loaded[layer.name].weight_quantizer.scale.detach().view(torch.uint8).numpy()
            assert np.array_equal(weight.scales, scales)
        run = run_layer(layer, OCP)
        assert run.input.status == run.weight.status == "model"
        worst = min(worst, sqnr_db(want[layer.name], run.values))
    print(f"{name}: worst layer {worst:.1f} dB, model output {sqnr_db(out, ours):.1f} dB")
    assert worst >= 100, worst
    assert sqnr_db(out, ours) >= 100


@pytest.mark.slow
@pytest.mark.oracle
def test_the_cli_captures_and_evaluates_a_quark_export(torch, quark_dirs, tmp_path, capsys):
    from mxsim.cli import main

    folder, _ = quark_dirs["mxfp4 weights, mxfp8 inputs"]
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "trace"
    assert main(["capture", "torch", str(folder), "--inputs", str(texts), "--out", str(out)]) == 0
    trace = load_trace(out)
    layer = trace.layer("encoder.layer.0.attention.self.query")
    assert layer.quant["weight"].scales is not None and layer.quant["weight"].format == "fp4_e2m1"
    assert "quark checkpoint model.safetensors" in layer.source["quantizers"]["weight"].lower()
    capsys.readouterr()
    hw = str(REPO / "hwconfigs" / "ocp-exact.yaml")
    args = [
        "evaluate",
        "hf",
        str(folder),
        "--hw",
        hw,
        "--format",
        "fp8_e4m3",
        "--task",
        "embedding",
    ]
    assert main([*args, "--inputs", str(texts), "--quiet", "--json", str(tmp_path / "r.json")]) == 0
    run = json.loads((tmp_path / "r.json").read_text())["runs"][0]
    assert run["layers"] >= 13 and run["cosine_min"] > 0.99


# ---------------------------------------------------------------------------- torchao


TORCHAO_CONFIGS = {  # name -> (element dtype, mxsim format, scaling mode, mxsim profile)
    "mxfp8 rceil": ("float8_e4m3fn", "fp8_e4m3", "RCEIL", "torchao-rceil"),
    "mxfp4 floor": ("float4_e2m1fn_x2", "fp4_e2m1", "FLOOR", "torchao"),
}


def save_torchao_dir(model, base, folder):
    """``model``'s state dict saved as torchao saves one (``flatten_tensor_state_dict`` into
    ``model.safetensors``), beside its config and ``base``'s tokenizer files."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

    tensors, metadata = flatten_tensor_state_dict(model.state_dict())
    safetensors_torch.save_file(tensors, str(folder / "model.safetensors"), metadata=metadata)
    model.config.save_pretrained(folder)
    for file in base.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(file, folder / file.name)
    return folder


def pickled_copy(torch, model, folder):
    """A copy of the checkpoint ``folder`` with ``model``'s state dict pickled
    (``torch.save`` into ``pytorch_model.bin``) in place of its safetensors."""
    pickled = folder.parent / f"{folder.name}-pickled"
    shutil.copytree(folder, pickled)
    (pickled / "model.safetensors").unlink()
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    return pickled


@pytest.fixture(scope="module")
def torchao_dirs(torch, tmp_path_factory):
    """name -> (checkpoint directory, torchao's quantized bf16 model)."""
    import_or_skip("torchao.prototype.mx_formats", "oracles")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors.torch")
    from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    base = tiny_hf_dir(torch, tmp_path_factory.mktemp("bert"), "embedding")
    made = {}
    for name, (dtype, _, mode, _) in TORCHAO_CONFIGS.items():
        model = realistic_bert(torch, transformers, base).to(torch.bfloat16)
        element = getattr(torch, dtype)
        quantize_(  # torchao's emulated kernels: its CPU path
            model,
            MXDynamicActivationMXWeightConfig(
                activation_dtype=element,
                weight_dtype=element,
                scaling_mode=getattr(ScaleCalculationMode, mode),
                kernel_preference=KernelPreference.EMULATED,
            ),
            # torchao's CPU kernels refuse the pooler's input (a strided slice of the states)
            filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and "pooler" not in fqn,
        )
        folder = save_torchao_dir(model, base, tmp_path_factory.mktemp("torchao"))
        made[name] = (folder, model.eval())
    return made


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("name", list(TORCHAO_CONFIGS))
def test_a_torchao_state_dict_loads_with_torchaos_codes_scales_and_layer_outputs(
    torch, torchao_dirs, name
):
    from mxsim.capture.torch_checkpoint import unblock_scales
    from mxsim.evaluate.models import load_hf
    from torchao.prototype.mx_formats.utils import from_blocked, to_blocked

    folder, library = torchao_dirs[name]
    _, fmt, _, profile = TORCHAO_CONFIGS[name]
    batch, trace, ours = mxsim_read(torch, folder)
    want, out = library_outputs(torch, library, batch)
    modules = dict(library.named_modules())
    layers = quantized_layers(trace)
    assert len(layers) == 12  # the pooler left float
    worst = np.inf
    for layer in layers:
        weight = modules[layer.name].weight
        assert layer.quant["weight"].format == layer.quant["input"].format == fmt
        assert layer.quant["weight"].profile == layer.quant["input"].profile == profile
        rows, cols = weight.shape
        scale = weight.scale
        if weight.is_swizzled_scales:
            scale = from_blocked(scale, rows, cols // weight.block_size)
        assert np.array_equal(layer.quant["weight"].scales, scale.view(torch.uint8).numpy())
        codes = layer.quant["weight"].quantize(layer.weight).codes
        stored = weight.qdata.view(torch.uint8).numpy()
        packed = pack_codes(codes, 4).reshape(stored.shape) if fmt == "fp4_e2m1" else codes
        assert np.array_equal(packed, stored)
        run = run_layer(layer, OCP)
        assert run.input.status == run.weight.status == "model"
        # the replay against the operands the capture recorded (torchao's, as the model
        # computes them: the model's output is torchao's, asserted below)
        recorded = layer.quantized("input").astype(np.float64) @ layer.weight.astype(np.float64).T
        recorded += layer.tensors["bias"].astype(np.float64)
        worst = min(worst, sqnr_db(recorded, run.values))
        got = torch.from_numpy(run.values).to(torch.bfloat16).double().numpy()
        assert np.array_equal(got, want[layer.name]), layer.name  # torchao's bf16 output
    assert worst >= 100, worst
    assert np.array_equal(out, ours)  # the model mxsim built computes torchao's model
    # the same state dict pickled (torch.save), as torchao's own docs save it: refused
    with pytest.raises(MxsimError, match="holds MXTensor tensors .* not read from a pickled"):
        load_hf(pickled_copy(torch, library, folder), "embedding")
    # the blocked scale layout (torchao's default off CPU) read as torchao writes it
    codes = np.random.default_rng(0).integers(0, 255, (130, 6), dtype=np.uint8)
    blocked = to_blocked(torch.from_numpy(codes)).numpy()
    assert np.array_equal(unblock_scales(blocked, 130, 6), codes)


@pytest.mark.slow
@pytest.mark.oracle
def test_a_torchao_nvfp4_state_dict_loads_with_torchaos_codes_scales_and_outputs(
    torch, tmp_path_factory
):
    """torchao's weight-only NVFP4 (bf16 model, tensor scale on) saved with
    ``flatten_tensor_state_dict``: mxsim reads torchao's FP4 codes, UE4M3 scale codes and
    tensor scale exactly, the model it builds computes torchao's model bit for bit, and each
    layer on a bf16 unit (B200's bf16 datapath) is the recorded operands' product at
    >= 100 dB; rounded once to bf16 it equals torchao's bf16 layer output in most elements
    (torch's CPU bf16 GEMM accumulates differently). Pickled
    (``torch.save``), the same state dict is refused in one line."""
    import_or_skip("torchao.prototype.mx_formats", "oracles")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors.torch")
    from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig
    from torchao.prototype.mx_formats.kernels import unpack_uint4
    from torchao.prototype.mx_formats.utils import from_blocked
    from torchao.quantization import quantize_

    from mxsim.evaluate.models import load_hf
    from mxsim.trace import NVFP4Quant

    base = tiny_hf_dir(torch, tmp_path_factory.mktemp("bert"), "embedding")
    library = realistic_bert(torch, transformers, base).to(torch.bfloat16).eval()
    quantize_(library, NVFP4WeightOnlyConfig(use_dynamic_per_tensor_scale=True))
    folder = save_torchao_dir(library, base, tmp_path_factory.mktemp("torchao-nvfp4"))
    batch, trace, ours = mxsim_read(torch, folder)
    want, out = library_outputs(torch, library, batch)
    modules = dict(library.named_modules())
    layers = quantized_layers(trace)
    assert len(layers) == 13
    b200 = load_hwconfig(REPO / "hwconfigs" / "b200.yaml")
    worst, equal, total = np.inf, 0, 0
    for layer in layers:
        weight, spec = modules[layer.name].weight, layer.quant["weight"]
        assert isinstance(spec, NVFP4Quant) and layer.quant["input"] is None
        rows, cols = weight.shape
        scales = (
            from_blocked(weight.scale, rows, cols // 16)
            if weight.is_swizzled_scales
            else weight.scale
        )
        assert np.array_equal(spec.scales, scales.view(torch.uint8).numpy().reshape(rows, -1))
        assert spec.tensor_scale == float(weight.per_tensor_scale)
        codes = unpack_uint4(weight.qdata.view(torch.uint8)).numpy().reshape(rows, cols)
        assert np.array_equal(spec.quantize(layer.weight).codes, codes)
        run = run_layer(layer, b200, element_format="bf16")
        assert layer.quantized("weight").dtype == np.float32  # torchao's bf16 dequantization
        recorded = layer.input.astype(np.float64) @ layer.quantized("weight").astype(np.float64).T
        recorded += layer.tensors["bias"].astype(np.float64)
        worst = min(worst, sqnr_db(recorded, run.values))
        got = torch.from_numpy(run.values).to(torch.bfloat16).double().numpy()
        equal += int((got == want[layer.name]).sum())
        total += got.size
    assert worst >= 100, worst
    assert equal / total > 0.9, equal / total  # torch's CPU bf16 GEMM rounds some differently
    assert np.array_equal(out, ours)  # the model mxsim built computes torchao's model
    with pytest.raises(MxsimError, match="holds NVFP4Tensor tensors .* not read from a pickled"):
        load_hf(pickled_copy(torch, library, folder), "embedding")


# ---------------------------------------------------------------------------- refusals


def _checkpoint_dir(torch, folder, quantization=None, tensors=None, metadata=None):
    """tiny_hf_dir's BERT with its config's quantization_config and weights replaced."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tiny_hf_dir(torch, folder, "embedding")
    config = json.loads((folder / "config.json").read_text())
    if quantization is not None:
        config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        safetensors_torch.save_file(tensors, str(folder / "model.safetensors"), metadata=metadata)
    return folder


QUARK_WEIGHT = {
    "dtype": "fp8_e4m3",
    "qscheme": "per_group",
    "scale_format": "e8m0",
    "ch_axis": -1,
    "group_size": 32,
    "scale_calculation_mode": "even",
    "is_dynamic": False,
    "mx_element_dtype": None,
}


def quark_config(**changes):
    weight = {**QUARK_WEIGHT, **changes.pop("weight", {})}
    config = {
        "quant_method": "quark",
        "export": {"weight_format": "real_quantized"},
        "global_quant_config": {"weight": weight, "input_tensors": None},
    }
    config.update(changes)
    return config


HOSTILE = {  # name -> (quantization_config or None, tensors factory or None, expected message)
    "unknown quant_method": ({"quant_method": "gptq"}, None, "quant_method 'gptq' is not read"),
    "an unknown export format": (
        quark_config(export={"weight_format": "packed"}),
        None,
        "weight_format 'packed' is not read",
    ),
    "fake-quantized scales that are no powers of two": (
        quark_config(export={"weight_format": "fake_quantized"}),
        lambda t: {"x.weight": t.zeros(4, 64), "x.weight_scale": t.full((4, 2), 0.3)},
        "'x.weight_scale': scales are not powers of two",
    ),
    "int4 weights": (quark_config(weight={"dtype": "int4"}), None, "dtype 'int4' is not read"),
    "fp8 scales": (
        quark_config(weight={"scale_format": "float"}),
        None,
        "scale_format 'float' is not read; accepted: e8m0",
    ),
    "per-layer configs": (
        quark_config(layer_quant_config={"*query": {}}),
        None,
        "layer_quant_config is not read",
    ),
    "a static input scale": (
        quark_config(),
        lambda t: {"x.weight": t.zeros(4, 32, dtype=t.float8_e4m3fn), "x.input_scale": t.ones(1)},
        "'x.input_scale' is not read",
    ),
    "scales of the wrong shape": (
        quark_config(),
        lambda t: {
            "x.weight": t.zeros(4, 64).to(t.float8_e4m3fn),
            "x.weight_scale": t.zeros(4, 3, dtype=t.uint8),
        },
        "'x.weight_scale' is U8 [4, 3]",
    ),
    "weights of the wrong dtype": (
        quark_config(),
        lambda t: {"x.weight": t.zeros(4, 64), "x.weight_scale": t.zeros(4, 2, dtype=t.uint8)},
        "'x.weight' is F32 [4, 64]; a Quark fp8_e4m3 weight is a 2-d F8_E4M3 tensor",
    ),
    "no quantized weight": (
        quark_config(),
        lambda t: {"x.weight": t.zeros(4, 64)},
        "nothing is quantized",
    ),
    "a weight that is no Linear": (
        quark_config(),
        lambda t: {
            "nowhere.weight": t.zeros(4, 64).to(t.float8_e4m3fn),
            "nowhere.weight_scale": t.full((4, 2), 127, dtype=t.uint8),
        },
        "'nowhere.weight' is no Linear of the model",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_checkpoints_are_one_line_errors_naming_the_file(torch, tmp_path, name):
    pytest.importorskip("transformers")
    from mxsim.evaluate.models import load_hf

    quantization, tensors, message = HOSTILE[name]
    folder = _checkpoint_dir(
        torch, tmp_path / "m", quantization, None if tensors is None else tensors(torch)
    )
    with pytest.raises(MxsimError) as error:
        load_hf(folder, "embedding")
    text = str(error.value)
    assert "\n" not in text and message in text, text
    assert str(folder) in text


def test_a_quantized_checkpoint_without_safetensors_is_refused(torch, tmp_path):
    pytest.importorskip("transformers")
    from mxsim.evaluate.models import load_hf

    folder = _checkpoint_dir(torch, tmp_path / "m", quark_config())
    (folder / "model.safetensors").rename(folder / "unused")
    torch.save({"x.weight": torch.zeros(2)}, folder / "pytorch_model.bin")
    with pytest.raises(MxsimError, match="read from model.safetensors; this directory has none"):
        load_hf(folder, "embedding")


def test_torchao_metadata_of_other_tensor_types_is_refused(torch, tmp_path):
    pytest.importorskip("transformers")
    from mxsim.evaluate.models import load_hf

    metadata = {
        "tensor_names": json.dumps(["x.weight"]),
        "x.weight": json.dumps({"_type": "Int4Tensor", "_data": {}}),
    }
    folder = _checkpoint_dir(
        torch,
        tmp_path / "m",
        None,
        {"x._weight_qdata": torch.zeros(2, dtype=torch.uint8)},
        metadata,
    )
    with pytest.raises(MxsimError, match="a torchao 'Int4Tensor' is not read; accepted: MXTensor"):
        load_hf(folder, "embedding")


NVFP4_DATA = {
    "is_swizzled_scales": False,
    "act_quant_kwargs": None,
    "block_size": 16,
    "orig_dtype": {"_type": "torch.dtype", "_data": "bfloat16"},
}
NVFP4_HOSTILE = {  # name -> (metadata changes, tensors changes, the error's words)
    "activation quantization": (
        {"act_quant_kwargs": {"_type": "QuantizeTensorToNVFP4Kwargs", "_data": {}}},
        {},
        "an NVFP4Tensor with activation quantization is not read; accepted: weight-only",
    ),
    "block size": (
        {"block_size": 32},
        {},
        "NVFP4 block size 32, orig_dtype 'bfloat16' is not read",
    ),
    "orig dtype": (
        {"orig_dtype": {"_type": "torch.dtype", "_data": "float16"}},
        {},
        "orig_dtype 'float16' is not read; accepted: block size 16, orig_dtype bfloat16, float32",
    ),
    "scale dtype": ({}, {"scale": "uint8"}, "are UE4M3 codes (F8_E4M3) of shape [64, 2]"),
    "missing scales": (
        {},
        {"scale": None},
        "'encoder.layer.0.intermediate.dense._weight_scale' is missing",
    ),
    "tensor scale shape": ({}, {"per_tensor_scale": "pair"}, "is not one F32 value"),
    "nan scale": ({}, {"scale": "nan"}, "_weight_qdata': quantize_nvfp4_at_scales: x has NaN"),
}


@pytest.mark.parametrize("name", list(NVFP4_HOSTILE))
def test_hostile_torchao_nvfp4_weights_are_refused_in_one_line(torch, tmp_path, name):
    """A torchao NVFP4Tensor weight mxsim does not read, or whose stored tensors are wrong, is
    refused naming the file, the key and what is accepted (no torchao needed)."""
    pytest.importorskip("transformers")
    from mxsim.evaluate.models import load_hf

    data_changes, tensor_changes, words = NVFP4_HOSTILE[name]
    key = "encoder.layer.0.intermediate.dense"  # tiny_hf_dir's BERT: (64, 32)
    tensors = {
        f"{key}._weight_qdata": torch.full((64, 16), 0x21, dtype=torch.uint8),
        f"{key}._weight_scale": torch.full((32, 2), 0x38, dtype=torch.uint8)
        .view(torch.float8_e4m3fn)
        .repeat(2, 1),
        f"{key}._weight_per_tensor_scale": torch.tensor(0.5),
    }
    for part, change in tensor_changes.items():
        name_ = f"{key}._weight_{part}"
        if change is None:
            del tensors[name_]
        elif change == "uint8":
            tensors[name_] = tensors[name_].view(torch.uint8)
        elif change == "nan":
            tensors[name_] = torch.full((64, 2), 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
        else:
            tensors[name_] = torch.tensor([0.5, 0.5])
    entry = {
        "_type": "NVFP4Tensor",
        "_data": dict(NVFP4_DATA, **data_changes),
        "_tensor_data_names": ["per_tensor_scale", "qdata", "scale"],
    }
    metadata = {"tensor_names": json.dumps([f"{key}.weight"]), f"{key}.weight": json.dumps(entry)}
    folder = _checkpoint_dir(torch, tmp_path / "m", None, tensors, metadata)
    with pytest.raises(MxsimError, match="model.safetensors") as raised:
        load_hf(folder, "embedding")
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_the_cli_refuses_a_hostile_checkpoint_in_one_line(torch, tmp_path, capsys):
    pytest.importorskip("transformers")
    from mxsim.cli import main

    folder = _checkpoint_dir(torch, tmp_path / "m", {"quant_method": "awq"})
    texts = tmp_path / "t.txt"
    texts.write_text(" ".join(TINY_WORDS[:5]) + "\n")
    code = main(
        ["capture", "torch", str(folder), "--inputs", str(texts), "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err.strip()
    assert (
        code == 2
        and "\n" not in err
        and "quant_method 'awq' is not read; accepted: quark, torchao" in err
    )


def test_unblock_scales_inverts_the_cublas_tile_layout():
    """A (130, 6) matrix (two row tiles, two column tiles, padded) laid out by hand as the
    layout's definition says, then read back."""
    from mxsim.capture.torch_checkpoint import unblock_scales

    rows, cols = 130, 6
    matrix = (np.arange(rows * cols) % 251).astype(np.uint8).reshape(rows, cols)
    blocked = np.zeros(2 * 2 * 512, np.uint8)
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * 2 + c // 4
            within = r % 128
            blocked[tile * 512 + (within % 32) * 16 + (within // 32) * 4 + c % 4] = matrix[r, c]
    assert np.array_equal(unblock_scales(blocked, rows, cols), matrix)
