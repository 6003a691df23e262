"""Presets: every YAML loads strictly, MaxText rule files load unchanged, and specs resolve exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shardscope.case.presets import absent_rule_axes, builtin_preset_names, get_preset, load_preset_file
from shardscope.case.rules import drop_unit_axes, resolve_logical
from shardscope.case.topology import parse_mesh_arg, resolve_mesh
from shardscope.errors import MeshError, PresetError, UnknownNameError

DATA = Path(__file__).parent / "data"


MAXTEXT = DATA / "maxtext"
MAXTEXT_RULE_FILES = sorted((MAXTEXT / "custom_mesh_and_rule").glob("*.yml"))


def as_rules(raw: list) -> tuple:
    """Rules as written in a YAML file, in the form presets hold them: (logical, (mesh axes…))."""
    return tuple((logical, (axes,) if isinstance(axes, str) else tuple(axes)) for logical, axes in raw)


@pytest.mark.parametrize("name", builtin_preset_names())
def test_every_builtin_preset_loads(name):
    preset = get_preset(name)
    assert preset.name == name
    assert preset.description
    assert preset.logical_axis_rules
    sizes = dict(resolve_mesh(preset, 8, {}))
    assert sizes.get("expert", 1) == (1 if name == "pure-fsdp" else 2)


def test_builtins_include_the_seeds_and_maxtexts_rule_files():
    assert set(builtin_preset_names()) == {
        "default",
        "ep-as-cp",
        "ep-tp",
        "shard-exp-on-fsdp",
        "explicit-pipeline",
        *(path.stem for path in MAXTEXT_RULE_FILES),
    }


@pytest.mark.parametrize("path", MAXTEXT_RULE_FILES, ids=lambda p: p.stem)
def test_maxtext_rule_files_load_unchanged_and_builtins_carry_them(path):
    preset = load_preset_file(path)
    raw = yaml.safe_load(path.read_text())
    assert preset.mesh_axes == tuple(raw["mesh_axes"])
    assert preset.logical_axis_rules == as_rules(raw["logical_axis_rules"])
    # The built-in of the same name is MaxText's file plus shardscope's own keys, and says where it is from.
    builtin = get_preset(path.stem)
    assert builtin.origin.startswith(f"MaxText custom_mesh_and_rule/{path.name}")
    assert (builtin.mesh_axes, builtin.logical_axis_rules, builtin.data_sharding) == (
        preset.mesh_axes,
        preset.logical_axis_rules,
        preset.data_sharding,
    )


def test_default_is_maxtexts_base_yml():
    base = yaml.safe_load((MAXTEXT / "base.yml").read_text())
    preset = get_preset("default")
    assert preset.origin.startswith("MaxText base.yml")
    assert preset.mesh_axes == tuple(base["mesh_axes"])
    assert preset.logical_axis_rules == as_rules(base["logical_axis_rules"])
    assert preset.data_sharding == tuple(tuple(group) for group in base["data_sharding"])
    assert preset.input_data_sharding_logical_axes == tuple(base["input_data_sharding_logical_axes"])
    assert preset.context_sharding == base["context_sharding"]


def test_rules_may_name_axes_the_mesh_lacks_which_are_size_one():
    preset = get_preset("ep-as-dp")
    assert absent_rule_axes(preset) == ("context", "tensor", "tensor_transpose")
    sizes = dict(resolve_mesh(preset, 16, parse_mesh_arg("fsdp=-1,expert=2")))
    assert sizes == {"data": 1, "fsdp": 8, "fsdp_transpose": 1, "expert": 2}
    # `activation_q_length` is on `context`, which this mesh lacks: the sequence is not split.
    spec = resolve_logical(("activation_batch_attn", "activation_q_length"), preset.logical_axis_rules)
    assert spec == (("data", "fsdp", "fsdp_transpose", "expert"), "context")
    assert drop_unit_axes(spec, sizes) == (("fsdp", "expert"), None)


@pytest.mark.parametrize(
    ("name", "axis"),
    [("default", "context"), ("ep-as-cp", "expert"), ("cp-as-ep", "context"), ("ep-as-dp", None), ("pure-fsdp", None)],
)
def test_context_axis_is_inferred_from_activation_length_as_maxtext_does(name, axis):
    assert get_preset(name).context_sharding == axis


def test_maxtext_style_rule_file_loads_unchanged():
    preset = load_preset_file(DATA / "maxtext_style_rules.yml")
    assert preset.name == "maxtext_style_rules"
    assert preset.mesh_axes == ("data", "fsdp", "context", "expert")
    assert preset.context_sharding == "context"
    assert preset.logical_axis_rules[5] == ("embed_moe", ("fsdp",))
    assert preset.logical_axis_rules[6] == ("exp", ("expert",))
    # No `mesh` key: FSDP takes every device.
    assert resolve_mesh(preset, 8, {}) == (("data", 1), ("fsdp", 8), ("context", 1), ("expert", 1))
    # The repeated `embed` rule: the first one whose axes are free wins, the empty one is a fallback.
    assert resolve_logical(("embed", "mlp"), preset.logical_axis_rules) == (("fsdp", "expert"), None)
    assert resolve_logical(("activation_batch", "embed"), preset.logical_axis_rules) == (
        ("data", "fsdp", "expert"),
        None,
    )


# Expected specs written from the rule files by hand: the meaning of each preset.
EXPECTED = {
    "default": {
        # base.yml: mlp_moe's rule comes before embed_moe's and takes fsdp_transpose, so embed_moe's first
        # rule (which names fsdp_transpose too) cannot apply and its second one does.
        ("exp", "layers", "embed_moe", "mlp_moe"): (
            "expert",
            "stage",
            ("fsdp", "context", "context_usp_ulysses"),
            ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive"),
        ),
        ("activation_batch", "activation_norm_length", "activation_embed"): (
            ("data", "fsdp", "fsdp_transpose", "expert"),
            ("tensor_sequence", "context", "context_usp_ulysses"),
            "tensor",
        ),
        ("vocab", "embed_vocab"): (
            ("tensor", "tensor_sequence", "autoregressive"),
            ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert"),
        ),
        ("embed", "moe_layers", "mlp"): (
            ("fsdp", "context", "context_usp_ulysses", "expert"),
            None,
            ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive"),
        ),
    },
    "ep-as-cp": {
        ("exp", "moe_layers", "embed_moe", "mlp_moe"): ("expert", None, "fsdp", None),
        ("activation_batch_attn", "activation_length", "activation_heads", "activation_kv"): (
            ("data", "fsdp"),
            "expert",
            None,
            None,
        ),
        ("activation_kv_batch", "activation_kv_length", "activation_kv_heads", "activation_kv_head_dim"): (
            ("data", "fsdp"),
            None,
            None,
            None,
        ),
        # kv_lora's rule comes first and takes fsdp, so embed's [fsdp, expert] cannot apply.
        ("embed", "moe_layers", "kv_lora"): (None, None, "fsdp"),
    },
    "shard-exp-on-fsdp": {
        ("exp", "moe_layers", "embed_moe", "mlp_moe"): (("expert", "fsdp"), None, "context", "fsdp_transpose"),
        ("embed", "moe_layers", "mlp"): (("fsdp", "context", "expert"), None, "fsdp_transpose"),
    },
}


@pytest.mark.parametrize("preset_name", sorted(EXPECTED))
def test_resolved_specs_are_exact(preset_name):
    preset = get_preset(preset_name)
    for logical, spec in EXPECTED[preset_name].items():
        assert resolve_logical(logical, preset.logical_axis_rules) == spec, logical


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "preset.yaml"
    path.write_text(text)
    return path


def test_malformed_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "mesh_axes: ['fsdp'\nlogical_axis_rules: []\n")
    with pytest.raises(PresetError, match=r"malformed YAML at line \d+"):
        load_preset_file(path)


def test_unknown_key_is_an_error_with_a_suggestion(tmp_path):
    path = write(tmp_path, "mesh_axes: ['fsdp']\nlogical_axis_rule: []\n")
    with pytest.raises(PresetError, match="did you mean 'logical_axis_rules'"):
        load_preset_file(path)


def test_mesh_sizes_naming_a_missing_mesh_axis(tmp_path):
    path = write(tmp_path, "mesh_axes: ['fsdp', 'expert']\nmesh: {fsdp: -1, tensor: 2}\n")
    with pytest.raises(PresetError, match=r"mesh names a missing mesh axis: unknown mesh axis 'tensor'"):
        load_preset_file(path)


def test_bad_rule_shape_and_bad_choice(tmp_path):
    with pytest.raises(PresetError, match=r"logical_axis_rules\[0\] must be"):
        load_preset_file(write(tmp_path, "mesh_axes: ['fsdp']\nlogical_axis_rules: [['embed']]\n"))
    with pytest.raises(PresetError, match="moe must be one of all_to_all, ring"):
        load_preset_file(write(tmp_path, "mesh_axes: ['fsdp']\nmoe: ragged\n"))
    with pytest.raises(PresetError, match="expected a YAML mapping"):
        load_preset_file(write(tmp_path, "- just\n- a list\n"))


def test_unknown_preset_name_suggests():
    with pytest.raises(UnknownNameError, match="did you mean 'ep-as-cp'"):
        get_preset("ep-as-cpp")


def test_mesh_overrides_and_fill():
    preset = get_preset("ep-as-cp")
    assert resolve_mesh(preset, 8, {}) == (("data", 1), ("stage", 1), ("fsdp", 4), ("expert", 2))
    assert resolve_mesh(preset, 256, parse_mesh_arg("fsdp=32,expert=8")) == (
        ("data", 1),
        ("stage", 1),
        ("fsdp", 32),
        ("expert", 8),
    )
    assert resolve_mesh(preset, 16, parse_mesh_arg("expert=-1,fsdp=2"))[2:] == (("fsdp", 2), ("expert", 8))


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("fsdp=3,expert=2", "uses 6 devices but the topology has 8"),
        ("fsdp=-1,expert=3", "does not fit 8 devices"),
        ("tensr=2", "missing mesh axis: unknown axis 'tensr'"),
        ("fsdp=-1,expert=-1", "only one axis may be -1"),
    ],
)
def test_mesh_that_does_not_fit(arg, message):
    with pytest.raises(MeshError, match=message):
        resolve_mesh(get_preset("default"), 8, parse_mesh_arg(arg))


def test_mesh_argument_grammar():
    with pytest.raises(MeshError, match="expected axis=size pairs"):
        parse_mesh_arg("fsdp:4")
    with pytest.raises(MeshError, match="must be positive or -1"):
        parse_mesh_arg("fsdp=0")
