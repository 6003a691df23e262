"""The hardware table: every generation loads with every figure, names are checked, broken entries fail."""

from __future__ import annotations

import pytest
import yaml

from shardscope.case import hardware
from shardscope.case.hardware import FIGURES, HardwareError, hardware_from_dict, known_hardware, load_hardware
from shardscope.errors import ShardscopeError

GENERATIONS = ("tpu7x", "v4", "v5e", "v5p", "v6e")


def test_the_table_covers_the_tpu_generations_shardscope_compiles_for():
    from shardscope.case.tpu import GENERATIONS as COMPILED

    assert tuple(known_hardware()) == GENERATIONS
    assert set(COMPILED) == set(GENERATIONS)


@pytest.mark.parametrize("name", GENERATIONS)
def test_every_generation_has_every_figure(name):
    hw = load_hardware(name)
    for figure in FIGURES:
        assert getattr(hw, figure) is not None
    assert hw.ici_links == 2 * hw.torus_dims  # two links per torus dimension
    assert 0 < hw.efficiency <= 1
    assert hw.hbm_bytes_per_device * hw.devices_per_chip == hw.hbm_bytes


def test_published_figures_as_the_sources_state_them():
    """Spot checks against the sources cited in hardware.yaml (per chip)."""
    v5p, v5e, tpu7x = load_hardware("v5p"), load_hardware("v5e"), load_hardware("tpu7x")
    assert v5p.peak_bf16_flops == 459e12 and v5p.hbm_bytes == 95 * 2**30 and v5p.dcn_bandwidth == 50e9 / 8
    assert v5e.ici_link_bandwidth == 4.5e10 and v5e.dcn_bandwidth == 2 * 100e9 / 8 / 8  # 2x100 Gb/s per 8 chips
    assert tpu7x.ici_link_bandwidth == 1200e9 / 6 / 2 and tpu7x.devices_per_chip == 2
    assert tpu7x.flops_per_device == 2307e12 / 2 and tpu7x.hbm_bytes_per_device == 96 * 2**30


def test_a_topology_name_prices_as_its_generation():
    assert load_hardware("v5p-16") == load_hardware("v5p")


def test_unknown_name_says_did_you_mean():
    with pytest.raises(ShardscopeError) as err:
        load_hardware("v5")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("unknown hardware 'v5'; did you mean 'v5p'?")
    assert "tpu7x, v4, v5e, v5p, v6e" in message


def test_an_entry_missing_a_figure_is_one_clear_line():
    entry = dict(hardware._table()["generations"]["v5p"])
    del entry["dcn_bandwidth"]
    expected = r"^hardware table hardware.yaml: entry 'v5p' is missing dcn_bandwidth; add the figure"
    with pytest.raises(HardwareError, match=expected):
        hardware_from_dict("v5p", entry, 0.82)


def test_a_two_device_chip_needs_its_on_chip_link():
    entry = dict(hardware._table()["generations"]["tpu7x"])
    del entry["chip_link_bandwidth"]
    with pytest.raises(HardwareError, match="missing chip_link_bandwidth"):
        hardware_from_dict("tpu7x", entry, 0.82)


@pytest.mark.parametrize(("key", "value"), [("hbm_bandwidth", "fast"), ("ici_links", 0), ("wrap_needs_full_cube", 1)])
def test_mistyped_figures_are_refused(key, value):
    entry = dict(hardware._table()["generations"]["v4"], **{key: value})
    with pytest.raises(HardwareError, match=f"v4.{key}"):
        hardware_from_dict("v4", entry, 0.82)


def test_a_missing_entry_in_the_file_fails_at_load(monkeypatch):
    broken = yaml.safe_load(yaml.safe_dump(hardware._table()))
    del broken["generations"]["v6e"]["hbm_bytes"]
    monkeypatch.setattr(hardware, "_table", lambda: broken)
    with pytest.raises(HardwareError, match="entry 'v6e' is missing hbm_bytes"):
        load_hardware("v6e")


@pytest.mark.parametrize("value", [0, 1.5, "high", True])
def test_a_calibration_outside_zero_to_one_is_refused(monkeypatch, value):
    table = yaml.safe_load(yaml.safe_dump(hardware._table()))
    table["calibration"]["mxu_efficiency"] = value
    monkeypatch.setattr(hardware, "_table", lambda: table)
    with pytest.raises(HardwareError, match=r"calibration\.mxu_efficiency must be in"):
        load_hardware("v4")  # a generation without constants of its own takes the shared ones


@pytest.mark.parametrize("value", [0, -0.5, "high", True])
def test_a_gather_bytes_factor_that_is_not_a_positive_number_is_refused(monkeypatch, value):
    table = yaml.safe_load(yaml.safe_dump(hardware._table()))
    table["calibration"]["cpu_gather_bytes_factor"] = value
    monkeypatch.setattr(hardware, "_table", lambda: table)
    with pytest.raises(HardwareError, match=r"calibration\.cpu_gather_bytes_factor must be a positive number"):
        load_hardware("v5p")


def test_a_generation_takes_its_own_fitted_constants_else_the_shared_ones():
    calibration = hardware._table()["calibration"]
    own = calibration["generations"]
    assert own, "the table fits some generations' constants of their own"
    for name in hardware.known_hardware():
        entry = load_hardware(name)
        fitted = {**calibration, **own.get(name, {})}
        assert (entry.mxu_efficiency, entry.hbm_efficiency) == (fitted["mxu_efficiency"], fitted["hbm_efficiency"])
    assert any(load_hardware(name).mxu_efficiency != calibration["mxu_efficiency"] for name in own)


@pytest.mark.parametrize(
    ("generations", "message"),
    [
        ({"v5p": 0.8}, "must map generations to fitted constants"),
        ({"v5p": {"mxu": 0.8}}, "unknown constants mxu"),
        ({"v5p": {"mxu_efficiency": 1.2}}, r"calibration\.mxu_efficiency must be in"),
    ],
)
def test_a_wrong_generation_calibration_is_refused(monkeypatch, generations, message):
    table = yaml.safe_load(yaml.safe_dump(hardware._table()))
    table["calibration"]["generations"] = generations
    monkeypatch.setattr(hardware, "_table", lambda: table)
    with pytest.raises(HardwareError, match=message):
        load_hardware("v5p")


def test_every_figure_in_the_file_has_a_source_nearby():
    """Each figure line carries a source comment, or the comment block right above it does."""
    text = (hardware.resources.files("shardscope.case") / hardware.TABLE).read_text()
    lines = text.splitlines()
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped.split(":")[0] in (*FIGURES, *hardware.OPTIONAL_FIGURES):
            assert "#" in line or lines[index - 1].strip().startswith("#"), line


@pytest.mark.parametrize(
    ("name", "shape", "wraps"),
    [
        ("v5p", (2, 2, 4), (False, False, False)),  # "a 2x2x4 won't have any wraparounds"
        ("v5p", (4, 4, 4), (True, True, True)),  # a full cube
        ("v4", (4, 4, 8), (True, True, True)),
        ("v5e", (8, 16), (False, True)),  # "an 8x16 has a wraparound on the long axis"
        ("v6e", (4, 4), (False, False)),
        ("v6e", (16, 16), (True, True)),
    ],
)
def test_wraparound_rules_as_published(name, shape, wraps):
    assert load_hardware(name).wraps(shape) == wraps


def test_the_cost_package_imports_no_jax():
    import subprocess
    import sys

    code = "import sys, shardscope.cost; print(any(m == 'jax' or m.startswith('jax.') for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
