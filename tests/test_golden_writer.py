"""Tests of mxsim.golden.writer (generate): files, manifest, determinism, atomic writes, progress, mxsim.dot."""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import mxsim
from conftest import REPO, import_or_skip, without_compile_notice
from mxsim import get_format
from mxsim.datapath import load_hwconfig
from mxsim.datapath.reference import dot_reference
from mxsim.errors import MxsimError
from mxsim.golden import (
    GoldenUnit,
    generate,
    make_cases,
    output_bits,
    read_vector_file,
    units_from_hwconfig,
)
from test_golden_model import ocp_exact_expected_fn

FP4 = GoldenUnit("ocp-exact", "c0ffee" * 10 + "abcd", "fp4_e2m1", "fp4_e2m1")
OCP_EXACT = REPO / "hwconfigs" / "ocp-exact.yaml"


def run(out, unit=FP4, **kw):
    kw.setdefault("cases", 50)
    kw.setdefault("seed", 7)
    return generate(unit, out, expected_fn=ocp_exact_expected_fn(unit), **kw)


def test_files_and_manifest(tmp_path):
    manifest = run(tmp_path, kinds=["random", "corners"], stage_dumps=True)
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    assert manifest["config"] == {"name": "ocp-exact", "sha256": FP4.config_hash}
    assert (
        manifest["seed"] == 7
        and manifest["cases"] == 50
        and manifest["kinds"] == ["random", "corners"]
    )
    assert manifest["mxsim_version"] == mxsim.__version__
    assert manifest["expected"] == "tests.test_golden_model.ocp_exact"
    (unit,) = manifest["units"]
    assert unit["layout"]["word_bits"] == 336
    assert [f["name"] for f in unit["layout"]["fields"]] == [
        "a",
        "b",
        "scale_a",
        "scale_b",
        "c",
        "d",
    ]
    assert manifest["counts"]["random"] == 50 == unit["files"]["random"]["count"]
    for kind, entry in unit["files"].items():
        text = (tmp_path / entry["vectors"]).read_text()
        assert hashlib.sha256(text.encode()).hexdigest() == entry["sha256"]
        assert sum(1 for line in text.splitlines() if not line.startswith("//")) == entry["count"]
        labels = (tmp_path / entry["labels"]).read_text().splitlines()
        assert len(labels) == entry["count"] and labels[0].startswith("0 ")
        stages = (tmp_path / entry["stages"]).read_text().splitlines()
        assert (
            len(stages) == entry["count"] and json.loads(stages[-1])["index"] == entry["count"] - 1
        )
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_written_expected_bits_are_the_models(tmp_path):
    """Reading the file back gives the inputs, and the model recomputed on them gives the file's d."""
    manifest = run(tmp_path, kinds=["corners"])
    entry = manifest["units"][0]["files"]["corners"]
    layout, vectors = read_vector_file(tmp_path / entry["vectors"])
    recomputed = ocp_exact_expected_fn(FP4)(
        vectors.a, vectors.b, vectors.scale_a, vectors.scale_b, vectors.c
    )
    assert np.array_equal(vectors.d, recomputed)
    original = make_cases(FP4, "corners", 50, 7)
    assert np.array_equal(vectors.a, original.a) and np.array_equal(vectors.c, original.c)


def test_same_arguments_give_byte_identical_files(tmp_path):
    run(tmp_path / "one", kinds=["random", "corners"], stage_dumps=True)
    run(tmp_path / "two", kinds=["random", "corners"], stage_dumps=True)
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir())
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), (
            name
        )
    run(tmp_path / "three", kinds=["random"], seed=8)
    random_name = "ocp-exact.fp4_e2m1xfp4_e2m1.random.hex"
    assert (tmp_path / "three" / random_name).read_bytes() != (
        tmp_path / "one" / random_name
    ).read_bytes()


def test_progress_callback_and_plain_counter(tmp_path, monkeypatch, capsys):
    calls = []
    manifest = run(
        tmp_path / "a",
        kinds=["random", "corners"],
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls[-1][0] == calls[-1][1] and all(d <= t for d, t in calls)
    # The total starts at what is known beforehand (the 50 random vectors) and grows by the
    # corner list when it is made.
    assert calls[0][1] == 50 and calls[-1][1] == 50 + manifest["counts"]["corners"]
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import fails: plain counter on stderr
    run(tmp_path / "b", kinds=["random"], progress=True)
    assert "mxsim golden: 50/50 vectors" in capsys.readouterr().err
    run(tmp_path / "c", kinds=["random"], progress=False)
    assert without_compile_notice(capsys.readouterr().err) == ""


def test_too_large_exhaustive_spaces_are_refused_before_writing(tmp_path):
    units = [FP4, GoldenUnit("ocp-exact", FP4.config_hash, "fp8_e4m3", "bf16")]
    with pytest.raises(
        MxsimError, match="exhaustive needs at most 65536 code pairs; fp8_e4m3xbf16 has 16777216"
    ):
        generate(
            units,
            tmp_path / "out",
            kinds=["random", "exhaustive"],
            expected_factory=ocp_exact_expected_fn,
        )
    assert not (tmp_path / "out").exists()


def test_stage_dumps_stream_in_chunks_and_have_a_size_limit(tmp_path, monkeypatch):
    import mxsim.golden.writer as writer

    calls = []

    def stage_fn(vectors):
        calls.append(len(vectors))
        return [{"label": label} for label in vectors.labels]

    monkeypatch.setattr(writer, "CHUNK", 16)
    manifest = run(tmp_path / "a", cases=40, kinds="random", stage_dumps=True, stage_fn=stage_fn)
    assert calls == [16, 16, 8]  # consecutive slices
    records = [
        json.loads(line)
        for line in (tmp_path / "a" / manifest["units"][0]["files"]["random"]["stages"])
        .read_text()
        .splitlines()
    ]
    labels = (
        (tmp_path / "a" / manifest["units"][0]["files"]["random"]["labels"])
        .read_text()
        .splitlines()
    )
    assert [r["index"] for r in records] == list(range(40))  # positions in the whole file
    assert [f"{r['index']} {r['label']}" for r in records] == labels
    with pytest.raises(MxsimError, match="one dict per vector; got 15 records for 16 vectors"):
        run(
            tmp_path / "b",
            cases=40,
            kinds="random",
            stage_dumps=True,
            stage_fn=lambda v: stage_fn(v)[1:],
        )
    monkeypatch.setattr(writer, "MAX_STAGE_VECTORS", 39)
    with pytest.raises(
        MxsimError, match="stage dumps are limited to 39 vectors per file.*random has 40"
    ):
        run(tmp_path / "c", cases=40, kinds="random", stage_dumps=True, stage_fn=stage_fn)
    assert not (tmp_path / "c").exists()


def test_memory_holds_one_format_pair_at_a_time(tmp_path):
    """Each pair's vectors are written and dropped before the next pair's are made, so the
    peak does not grow with the number of pairs."""
    import tracemalloc

    formats = ["fp4_e2m1", "fp6_e2m3", "fp6_e3m2", "fp8_e4m3", "fp8_e5m2", "int8"]
    units = [
        GoldenUnit("pairs", FP4.config_hash, a_format, b_format)
        for a_format in ("fp8_e4m3", "fp8_e5m2")
        for b_format in formats
    ]
    peaks = []
    for chosen in (units, units[:1], units):  # the first run is a warm-up (imports, kernels)
        tracemalloc.start()
        generate(
            chosen,
            tmp_path / str(len(peaks)),
            cases=3000,
            kinds="random",
            expected_factory=lambda unit: (
                lambda a, b, scale_a, scale_b, c: np.zeros(len(c), np.uint32)
            ),
        )
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    del peaks[0]
    assert peaks[1] < 1.3 * peaks[0], peaks


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kinds=["fuzz"]), "unknown case kind"),
        (dict(kinds=[]), "no case kind"),
        (dict(cases=-1), "golden: cases: expected an integer >= 0, got -1"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(MxsimError, match=message):
        run(tmp_path, **kwargs)


def test_expected_function_contract(tmp_path):
    with pytest.raises(MxsimError, match="needs expected_fn"):
        generate(FP4, tmp_path, cases=5)
    with pytest.raises(MxsimError, match="returned shape"):
        generate(
            FP4,
            tmp_path,
            cases=5,
            kinds="random",
            expected_fn=lambda a, b, sa, sb, c: np.zeros(3, np.uint32),
        )
    other = GoldenUnit("ocp-exact", FP4.config_hash, "fp4_e2m1", "fp6_e2m3")
    with pytest.raises(MxsimError, match="serve one format pair"):
        generate([FP4, other], tmp_path, cases=5, expected_fn=ocp_exact_expected_fn(FP4))
    manifest = generate(
        [FP4, other], tmp_path, cases=5, kinds="random", expected_factory=ocp_exact_expected_fn
    )
    assert [u["b_format"] for u in manifest["units"]] == ["fp4_e2m1", "fp6_e2m3"]


def test_output_bits_views_and_checks():
    assert output_bits(np.array([1.0], np.float32), "fp32").tolist() == [0x3F800000]
    assert output_bits(np.array([0x3C00], np.uint16), "fp16").tolist() == [0x3C00]
    with pytest.raises(MxsimError):
        output_bits(np.array([1 << 16]), "bf16")
    with pytest.raises(MxsimError):
        output_bits(np.array([1.0]), "fp32")  # float64 values are not fp32 bits


# Against the datapath: the default expected function is mxsim.dot ---------------------
@pytest.fixture(scope="module")
def ocp_exact():
    return mxsim.load_hwconfig(OCP_EXACT)


@pytest.mark.parametrize(
    "pair, kinds",
    [
        (("fp4_e2m1", "fp4_e2m1"), ["random", "corners", "exhaustive"]),
        (("fp8_e4m3", "fp8_e5m2"), ["random", "corners"]),
        (("int8", "fp6_e3m2"), ["random", "corners"]),
    ],
)
def test_default_expected_fn_equals_the_exact_model(tmp_path, ocp_exact, pair, kinds):
    """mxsim.dot on ocp-exact gives, bit for bit, what the independent Fraction model gives."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN payloads cast inside the datapath
        manifest = generate(ocp_exact, tmp_path, cases=300, seed=11, kinds=kinds, pairs=[pair])
    assert manifest["expected"] == "mxsim.dot" and manifest["config"]["sha256"] == ocp_exact.digest
    unit_entry = manifest["units"][0]
    (unit,) = units_from_hwconfig(ocp_exact, pairs=[pair])
    model = ocp_exact_expected_fn(unit)
    differences = []
    for kind in kinds:
        entry = unit_entry["files"][kind]
        _, vectors = read_vector_file(tmp_path / entry["vectors"])
        labels = (tmp_path / entry["labels"]).read_text().split("\n")
        want = model(vectors.a, vectors.b, vectors.scale_a, vectors.scale_b, vectors.c)
        for i in np.flatnonzero(vectors.d != want):
            differences.append(
                f"{labels[i]}: mxsim.dot {int(vectors.d[i]):08x}, model {int(want[i]):08x}"
            )
    assert not differences, f"{len(differences)} differences:\n" + "\n".join(differences[:20])


def test_generate_from_a_config_path_with_explain_stages(tmp_path, ocp_exact):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        manifest = generate(
            OCP_EXACT,
            tmp_path,
            cases=20,
            seed=1,
            kinds="random",
            pairs=[("fp4_e2m1", "fp6_e2m3")],
            stage_dumps=True,
        )
    entry = manifest["units"][0]["files"]["random"]
    records = [json.loads(line) for line in (tmp_path / entry["stages"]).read_text().splitlines()]
    _, vectors = read_vector_file(tmp_path / entry["vectors"])
    assert [r["source"] for r in records] == ["mxsim.explain"] * 20
    assert [r["bits"] for r in records] == vectors.d.tolist()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"seed": -1}, "golden: seed: expected an integer 0..9223372036854775807, got -1"),
        ({"seed": 1.5}, "golden: seed: expected an integer"),
        ({"cases": -3}, "golden: cases: expected an integer >= 0, got -3"),
        ({"cases": 10**12}, "more than the memory budget"),
        ({"kinds": [["random"]]}, "golden: unknown case kind ['random']"),
        ({"kinds": 3}, "golden: kinds must be a case kind or a list of them"),
        ({"dot_length": 0}, "golden: dot_length: expected an integer 1..65536, got 0"),
    ],
)
def test_bad_arguments_are_refused_before_writing(tmp_path, kwargs, message):
    with pytest.raises(MxsimError) as caught:
        generate(REPO / "hwconfigs/ocp-exact.yaml", tmp_path / "out", **kwargs)
    assert message in str(caught.value) and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- hostile requests


@pytest.mark.parametrize(
    "pairs",
    [
        [("fp4_e2m1", "fp4_e2m1"), ("fp4_e2m1", "fp4_e2m1")],
        [("fp4_e2m1", "fp8_e4m3"), ("FP4_E2M1", "fp8_e4m3")],
    ],
)
def test_a_format_pair_given_twice_is_refused(tmp_path, pairs):
    if pairs[1][0] == "FP4_E2M1":
        pytest.importorskip("mxsim.formats").get_format(
            "FP4_E2M1"
        )  # an alias resolves to the same pair
    with pytest.raises(MxsimError, match=r"format pair fp4_e2m1,fp\w+ is given more than once"):
        generate(OCP_EXACT, tmp_path / "out", cases=1, kinds="random", pairs=pairs)
    with pytest.raises(MxsimError, match="is given more than once"):
        generate(
            [FP4, FP4],
            tmp_path / "out",
            cases=1,
            kinds="random",
            expected_factory=ocp_exact_expected_fn,
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("pairs", ["fp4_e2m1,fp4_e2m1", [("fp4_e2m1",)], [("fp4_e2m1", 3)], 7])
def test_malformed_pairs_are_argument_errors(tmp_path, pairs):
    with pytest.raises(MxsimError, match="pairs must be a list of"):
        generate(OCP_EXACT, tmp_path / "out", cases=1, kinds="random", pairs=pairs)


def test_an_exhaustive_set_beyond_the_budget_is_refused_before_work(tmp_path, capsys):
    from mxsim.cli import main

    hw = tmp_path / "wide.yaml"
    hw.write_text(
        "mxsim_hwconfig: 1\nname: wide\ninputs: {a_formats: [int8], b_formats: [int8], block_size: 4096}\n"
    )
    status = main(
        [
            "golden",
            "--hw",
            str(hw),
            "--pair",
            "int8,int8",
            "--kind",
            "exhaustive",
            "--out",
            str(tmp_path / "out"),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert (
        status == 2
        and "golden: exhaustive int8xint8, 65536 vectors of length 4096 needs 16 GiB, more than "
        "the memory budget"
        in err
    ), err
    assert not (tmp_path / "out").exists()


def test_an_output_directory_holding_other_files_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("not a golden file")
    with pytest.raises(MxsimError, match="is not empty and holds no earlier output of this kind"):
        run(tmp_path, kinds="random")
    assert (tmp_path / "mine.txt").read_text() == "not a golden file"
    (tmp_path / "file").write_text("")
    with pytest.raises(MxsimError, match="exists and is not a directory"):
        run(tmp_path / "file", kinds="random")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(MxsimError, match="is a symlink"):
        run(tmp_path / "link", kinds="random")


def test_a_rerun_replaces_the_whole_output(tmp_path):
    out = tmp_path / "out"
    run(out, kinds=["random", "corners"])
    first = sorted(p.name for p in out.iterdir())
    manifest = run(out, kinds=["random"], seed=8)  # fewer files: the corner files must go
    entry = manifest["units"][0]["files"]["random"]
    names = sorted(p.name for p in out.iterdir())
    assert names != first and names == sorted(["manifest.json", entry["vectors"], entry["labels"]])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_nvfp4_unit_vectors_carry_ue4m3_scales(tmp_path):
    """A unit with UE4M3 scales (hwconfigs/b200-nvfp4.yaml): scale fields hold UE4M3 codes
    (NaN 0x7F among the corners, none above it), d is mxsim.dot's output for the read-back
    inputs, and the stage dumps are the datapath's explain records (group stages included)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        manifest = generate(
            REPO / "hwconfigs" / "b200-nvfp4.yaml",
            tmp_path,
            cases=40,
            seed=3,
            kinds=["random", "corners"],
            dot_length=64,
            stage_dumps=True,
        )
    (unit,) = manifest["units"]
    assert unit["scale_format"] == "ue4m3" and unit["block_size"] == 16
    assert "UE4M3 scale codes" in unit["layout"]["fields"][2]["meaning"]
    for kind in ("random", "corners"):
        entry = unit["files"][kind]
        _, vectors = read_vector_file(tmp_path / entry["vectors"])
        assert vectors.scale_a.shape == (entry["count"], 4) and int(vectors.scale_a.max()) <= 0x7F
        bits = mxsim.dot(
            REPO / "hwconfigs" / "b200-nvfp4.yaml",
            vectors.a,
            vectors.b,
            a_format="fp4_e2m1",
            b_format="fp4_e2m1",
            scale_a=vectors.scale_a,
            scale_b=vectors.scale_b,
            c=vectors.c.view(np.float32),
        )
        assert np.array_equal(bits, vectors.d)
        records = [
            json.loads(line) for line in (tmp_path / entry["stages"]).read_text().splitlines()
        ]
        assert any(stage["stage"] == "group" for stage in records[0]["stages"])
    _, corners = read_vector_file(tmp_path / unit["files"]["corners"]["vectors"])
    assert (corners.scale_a == 0x7F).any() and entry["count"] > 50


# fp64 units: 64-bit codes, c and d -------------------------------------------------------
def _labels(path):
    return [line.split()[1] for line in path.read_text().splitlines()]


def test_fp64_vectors_read_back_equal_mmasim_and_the_twin(tmp_path):
    # a100-dmma's 32-step fp64 FMA chain (K = k = 32) as eight chained MMA-Sim m8n8k4.f64
    # instructions (each d the next c), and mi250-fp32's fp32 chain through the Fraction twin.
    torch = import_or_skip("torch", "oracles")
    nv_ptx = import_or_skip("mmasim.nv_ptx", "oracles")
    from test_oracles_mmasim import _torch_operand, mmasim_dpa

    generate(
        REPO / "hwconfigs" / "a100-dmma.yaml",
        tmp_path / "dmma",
        cases=40,
        seed=5,
        kinds=["random", "corners"],
    )
    op = nv_ptx.MMA("Ampere", "m8n8k4.f64.f64.f64.f64")
    fp64 = get_format("fp64")
    for kind in ("random", "corners"):
        stem = tmp_path / "dmma" / f"a100-dmma.fp64xfp64.{kind}"
        layout, vectors = read_vector_file(f"{stem}.hex")
        assert [layout.field(n).item_bits for n in ("a", "c", "d")] == [64, 64, 64]
        d = vectors.c.view(np.float64)
        for start in range(0, 32, 4):
            d = mmasim_dpa(
                op,
                _torch_operand(torch, vectors.a[:, start : start + 4], "f64"),
                _torch_operand(torch, vectors.b[:, start : start + 4], "f64"),
                d,
                "fp64",
                "fp64",
            ).view(np.float64)
        want = d.view(np.uint64)
        same = (want == vectors.d) | (
            np.isnan(fp64.decode(want)) & np.isnan(fp64.decode(vectors.d))
        )
        assert same.all(), [
            _labels(Path(f"{stem}.labels.txt"))[i] for i in np.flatnonzero(~same)[:5]
        ]
    labels = _labels(tmp_path / "dmma" / "a100-dmma.fp64xfp64.corners.labels.txt")
    d = fp64.decode(vectors.d)
    assert (
        np.signbit(d[labels.index("zero_underflow_then_neg")])
        and d[labels.index("zero_underflow_then_neg")] == 0
    )

    hw = load_hwconfig(REPO / "hwconfigs" / "mi250-fp32.yaml")
    generate(hw, tmp_path / "fp32", cases=12, seed=5, kinds=["random", "corners"])
    params = hw.params("fp32", "fp32")
    for kind in ("random", "corners"):
        layout, vectors = read_vector_file(tmp_path / "fp32" / f"mi250-fp32.fp32xfp32.{kind}.hex")
        assert (
            vectors.c.dtype == np.uint32
            and layout.field("c").meaning == "accumulator input, FP32 bits"
        )
        for i in range(len(vectors)):
            value = dot_reference(
                params,
                vectors.a[i].tolist(),
                vectors.b[i].tolist(),
                c=float(vectors.c[i : i + 1].view(np.float32)[0]),
            )
            want = int(get_format("fp32").encode(np.array([value]), overflow="inf_nan")[0])
            assert int(vectors.d[i]) == want, (kind, i)


def test_fp64_units_refuse_what_they_cannot_hold(tmp_path):
    dmma = load_hwconfig(REPO / "hwconfigs" / "a100-dmma.yaml")
    with pytest.raises(MxsimError, match="exhaustive needs at most 65536 code pairs"):
        generate(dmma, tmp_path / "x", kinds="exhaustive")
    (unit,) = units_from_hwconfig(dmma)
    with pytest.raises(MxsimError, match="exact stage records place an FP32 c on their grid"):
        generate(
            unit,
            tmp_path / "y",
            cases=2,
            kinds="random",
            stage_dumps=True,
            expected_fn=lambda a, b, sa, sb, c: np.zeros(len(c), np.uint64),
        )
    with pytest.raises(MxsimError, match="output bits as integers"):
        generate(
            unit,
            tmp_path / "z",
            cases=2,
            kinds="random",
            expected_fn=lambda a, b, sa, sb, c: np.zeros(len(c)),
        )
    narrow = GoldenUnit("x", "0" * 64, "fp8_e4m3", "fp8_e4m3", scaled=False, c_format="fp64")
    with pytest.raises(
        MxsimError, match="built around an FP32 c; x takes fp64 c: use the random kind"
    ):
        make_cases(narrow, "corners", 0, 0)
    assert make_cases(narrow, "random", 3, 0).c.dtype == np.uint64
    assert output_bits(np.array([-0.0]), "fp64").tolist() == [1 << 63]
    with pytest.raises(MxsimError, match="do not fit 32-bit fp32"):
        output_bits(np.array([1 << 40], np.uint64), "fp32")


@pytest.mark.parametrize("c_format", ["fp16", "bf16"])
def test_a_config_whose_c_is_fp16_or_bf16_gets_golden_vectors(tmp_path, c_format):
    """c is written as FP32 bits, each a value of the config's c format (the unit refuses
    others), and the expected outputs are the unit's for those c."""
    import yaml

    from mxsim.golden.vectors import read_vector_file

    raw = yaml.safe_load((REPO / "hwconfigs" / "ocp-exact.yaml").read_text())
    raw["inputs"]["c_format"] = c_format
    config = tmp_path / "narrow-c.yaml"
    config.write_text(yaml.safe_dump(raw))
    manifest = mxsim.golden.generate(
        config,
        tmp_path / "out",
        cases=16,
        kinds=["random", "corners"],
        pairs=[("fp8_e4m3", "fp8_e4m3")],
    )
    fmt = mxsim.get_format(c_format)
    for unit in manifest["units"]:
        for entry in unit["files"].values():
            _, vectors = read_vector_file(tmp_path / "out" / entry["vectors"])
            c = vectors.c.astype(np.uint32).view(np.float32).astype(np.float64)
            finite = np.isfinite(c)
            assert np.array_equal(fmt.round(c[finite]), c[finite])
            hw = mxsim.load_hwconfig(config)
            want = mxsim.dot(
                hw,
                vectors.a,
                vectors.b,
                a_format="fp8_e4m3",
                b_format="fp8_e4m3",
                scale_a=vectors.scale_a,
                scale_b=vectors.scale_b,
                c=c.astype(np.float32),
            )
            assert np.array_equal(want.astype(np.uint64), vectors.d.astype(np.uint64))
