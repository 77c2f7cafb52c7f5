"""The probe on a live model: MMA-Sim's NVIDIA Volta mma (m8n8k4, fp16 in, fp32 out) through
the callable adapter must come out with the datapath hwconfigs/v100.yaml describes (from
Khattak & Mikaitis' measurements, an independent source), and the validation must report
what it measured: MMA-Sim gives +0 for some exact zeros where the IEEE rule (and mxsim) gives
-0, and non-canonical NaNs, so the count is small but not zero (docs/probe.md)."""

from __future__ import annotations

import numpy as np
import yaml

from conftest import REPO, import_or_skip
from mxsim.datapath import load_hwconfig, parse_hwconfig
from mxsim.probe import probe

DECIDED = ("fused_terms", "term_order", "align_fraction_bits", "below_window", "accumulator_format",
           "accumulator_rounding", "sum_significant_bits", "accumulator_in_tree", "c_entry", "scales",
           "input_subnormals", "product_fraction_bits")


def volta_unit():
    torch = import_or_skip("torch", "torch")
    sim = import_or_skip("mmasim.nv_ptx", "oracles")
    op = sim.MMA("Volta", "m8n8k4.f32.f16.f16.f32")

    def unit(a, b, scale_a, scale_b, c):
        def fp16(codes):
            return torch.from_numpy(codes.astype(np.uint16).view(np.int16)).view(torch.float16)
        d = op.dpa(fp16(a), fp16(b), torch.from_numpy(c.view(np.float32).copy()))
        return d.view(torch.int32).numpy().view(np.uint32)

    return unit


def test_mmasim_volta_is_the_v100_datapath():
    result = probe(volta_unit(), "fp16", "fp16", 16, validation_vectors=512, corner_vectors=256)
    probed = parse_hwconfig(yaml.safe_load(result.yaml), "<probed>").params("fp16", "fp16", "fp32")
    v100 = load_hwconfig(REPO / "hwconfigs" / "v100.yaml").params("fp16", "fp16", "fp32")
    assert {name: getattr(probed, name) for name in DECIDED} == {name: getattr(v100, name) for name in DECIDED}
    validation = result.validation
    assert validation.mismatches < 0.02 * validation.vectors
    for example in validation.examples:  # the zero-sign convention only
        assert {example["unit_output"], example["config_output"]} in ({"0x0", "0x80000000"},)
