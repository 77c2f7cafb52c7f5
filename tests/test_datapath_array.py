"""The ``array:`` config section: parsing, defaults and error messages."""

import pytest
import yaml

from mxsim.datapath.array import ARRAY_KEYS, ArrayConfig, parse_array_config
from mxsim.errors import ConfigError


def test_minimal_mapping_takes_documented_defaults():
    config = parse_array_config({"rows": 32, "columns": 16}, "hw.yaml")
    assert (config.rows, config.columns) == (32, 16)
    assert config.lanes_per_unit == 1
    assert config.pipeline_latency == 1
    assert config.dataflow == "os"
    assert config.ifmap_buffer_kib == config.filter_buffer_kib == config.ofmap_buffer_kib == 64
    assert config.offchip_bytes_per_cycle == 10
    assert config.accumulator_bits == 32
    assert config.clock_mhz == 1000.0


def test_every_key_from_yaml():
    text = """
    array:
      rows: 8
      columns: 4
      lanes_per_unit: 32
      pipeline_latency: 3
      clock_mhz: 1500
      dataflow: ws
      ifmap_buffer_kib: 128
      filter_buffer_kib: 0.5
      ofmap_buffer_kib: 32
      offchip_bytes_per_cycle: 25.6
      accumulator_bits: 24
    """
    config = parse_array_config(yaml.safe_load(text)["array"], "hw.yaml")
    assert config == ArrayConfig(
        rows=8,
        columns=4,
        lanes_per_unit=32,
        pipeline_latency=3,
        clock_mhz=1500,
        dataflow="ws",
        ifmap_buffer_kib=128,
        filter_buffer_kib=0.5,
        ofmap_buffer_kib=32,
        offchip_bytes_per_cycle=25.6,
        accumulator_bits=24,
    )
    assert config.units == 32
    assert config.buffer_bytes("filter") == 512


def test_dataclass_defaults_agree_with_key_table():
    config = ArrayConfig(rows=1, columns=1)
    for key, spec in ARRAY_KEYS.items():
        if spec.default is not None:
            assert getattr(config, key) == spec.default, key


def test_missing_required_key_names_it():
    with pytest.raises(ConfigError) as caught:
        parse_array_config({"columns": 4}, "hw.yaml")
    assert caught.value.key_path == "array.rows"
    assert str(caught.value).startswith("hw.yaml: array.rows: required")


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError) as caught:
        parse_array_config({"rows": 4, "columns": 4, "lanes": 8}, "hw.yaml")
    assert caught.value.key_path == "array.lanes"
    message = str(caught.value)
    for key in ARRAY_KEYS:
        assert key in message


@pytest.mark.parametrize(
    "key, value, accepted",
    [
        ("rows", 0, "an integer >= 1"),
        ("rows", 4.0, "an integer >= 1"),
        ("rows", True, "an integer >= 1"),
        ("columns", "8", "an integer >= 1"),
        ("lanes_per_unit", -2, "an integer >= 1"),
        ("pipeline_latency", 0, "an integer >= 1"),
        ("dataflow", "rs", "one of os, ws, is"),
        ("ifmap_buffer_kib", 0, "a number > 0"),
        ("offchip_bytes_per_cycle", float("inf"), "a number > 0"),
        ("offchip_bytes_per_cycle", -1, "a number > 0"),
        ("clock_mhz", None, "a number > 0"),
        ("accumulator_bits", 0, "an integer >= 1"),
    ],
)
def test_bad_value_says_what_is_accepted(key, value, accepted):
    mapping = {"rows": 4, "columns": 4, key: value}
    with pytest.raises(ConfigError) as caught:
        parse_array_config(mapping, "hw.yaml")
    assert caught.value.key_path == f"array.{key}"
    assert accepted in str(caught.value)


def test_section_must_be_a_mapping():
    with pytest.raises(ConfigError) as caught:
        parse_array_config([4, 4], "hw.yaml")
    assert caught.value.key_path == "array"


def test_direct_construction_is_validated_too():
    with pytest.raises(ConfigError):
        ArrayConfig(rows=4, columns=4, dataflow="xs")
    with pytest.raises(ValueError):  # ConfigError is a ValueError for programmatic callers
        ArrayConfig(rows=-1, columns=4)
