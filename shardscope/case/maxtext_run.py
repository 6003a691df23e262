"""MaxText's command line (`--maxtext 'k=v k=v …'`) as a shardscope case: its keys, checked as MaxText checks
them, and translated into the preset, mesh and settings shardscope plans.

MaxText's defaults are its own files, shipped in `case/maxtext/` (`base.yml` and the model ymls of the
models shardscope has, at the commit the built-in presets carry). A key that is not in `base.yml` is refused
as MaxText refuses it; a value of the wrong type for the key's default, or outside the values MaxText
accepts, is refused naming the key. A key MaxText accepts that changes the step but that shardscope does not
model is reported by name (never dropped silently); keys that only steer a run (data, checkpoints,
logging, learning rate) change no sharding and no memory and are accepted quietly.

What MaxText leaves to its defaults: how the step runs takes base.yml's values (`attention`, `dtype`,
`remat_policy`: the TPU attention kernel, bfloat16 activations, full remat), on every model; the model's
shape and batch stay as the flavor has them (the flavors of MaxText's models carry MaxText's model yml and
its default batch of 12 × 2048; shardscope's small flavors are its own). Where a default is not modelled
(MaxText's dropless sparse-matmul MoE), a warning says so.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from reference_models.config import SPLASH_BLOCKS
from shardscope.case.maxtext_keys import CHOICES, CUSTOM_REMAT_KEYS, RENAMED_KEYS, RUN_ONLY_KEYS
from shardscope.case.topology import DCN_AXIS, DCN_SETTING
from shardscope.errors import ShardscopeError

_PARALLELISM = re.compile(r"(ici|dcn)_(\w+)_parallelism")
# MaxText names the pipeline's mesh axis `stage` but its parallelism key `pipeline`.
_AXIS_OF_KEY = {"pipeline": "stage"}


@dataclass(frozen=True)
class MaxTextRun:
    """A MaxText command line translated into the inputs of a shardscope case.

    Attributes:
      given: the pairs as written, in order.
      preset: the built-in preset named by `custom_mesh_and_rule`, or None (the caller's choice stands).
      mesh: every mesh axis of the preset sized as MaxText sizes it (ICI × DCN).
      settings: shardscope `--set` settings the keys stand for.
      topology: the topology `compile_topology` (and `compile_topology_num_slices`) names, or None.
      warnings: one line each: keys MaxText accepts that shardscope does not model, and where MaxText's
        defaults differ from what is planned.
      defaulted: the settings that come from MaxText's defaults, not the command line (`--set` may change
        them without contradicting it).
    """

    given: tuple[tuple[str, str], ...]
    preset: str | None
    mesh: tuple[tuple[str, int], ...]
    settings: tuple[tuple[str, str], ...]
    topology: str | None
    warnings: tuple[str, ...]
    defaulted: tuple[str, ...] = ()


@functools.cache
def maxtext_defaults() -> dict[str, Any]:
    """MaxText's base.yml: every key MaxText accepts, with its default."""
    return yaml.safe_load(resources.files("shardscope.case").joinpath("maxtext", "base.yml").read_text())


@functools.cache
def maxtext_model_config(model_name: str) -> dict[str, Any]:
    """The MaxText model yml of a model shardscope has ({} for shardscope's own small flavors)."""
    path = resources.files("shardscope.case").joinpath("maxtext", f"{model_name}.yml")
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def parse_maxtext_args(text: str | Sequence[str]) -> tuple[tuple[str, str], ...]:
    """`k=v k=v …` (one string as typed, or already split) into pairs; each key once.

    Raises:
      ShardscopeError: a word that is not key=value, or a key given twice.
    """
    try:
        words = shlex.split(text) if isinstance(text, str) else [w for part in text for w in shlex.split(part)]
    except ValueError as err:
        raise ShardscopeError(f"--maxtext {text!r}: {err}") from None
    pairs: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_]\w*", key):
            raise ShardscopeError(f"--maxtext: expected key=value (as on MaxText's command line), found {word!r}")
        if key in pairs:
            raise ShardscopeError(f"--maxtext: {key} is given twice ({key}={pairs[key]}, {key}={value})")
        pairs[key] = value
    return tuple(pairs.items())


def check_maxtext_value(key: str, text: str) -> Any:
    """The typed value of one MaxText key, as MaxText's config would read it.

    Raises:
      ShardscopeError: a key MaxText does not know (with "did you mean"), or a value it would reject.
    """
    defaults = maxtext_defaults()
    if key not in defaults:
        close = difflib.get_close_matches(key, defaults, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ShardscopeError(f"--maxtext {key}={text}: MaxText has no key {key!r} (not in its base.yml){hint}")
    default = defaults[key]
    value: Any
    if isinstance(default, bool):
        if text.lower() not in ("true", "false"):
            raise ShardscopeError(f"--maxtext {key}={text}: expected true or false")
        value = text.lower() == "true"
    elif isinstance(default, int):
        if not re.fullmatch(r"-?\d+", text.replace("_", "")):
            raise ShardscopeError(f"--maxtext {key}={text}: expected an integer")
        value = int(text.replace("_", ""))
    elif isinstance(default, float):
        try:
            value = float(text)
        except ValueError:
            raise ShardscopeError(f"--maxtext {key}={text}: expected a number") from None
    elif isinstance(default, list | dict):
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = None
        if not isinstance(value, type(default)):
            raise ShardscopeError(f"--maxtext {key}={text}: expected a {type(default).__name__} (YAML)")
    else:
        value = text.strip("'\"")
    if key in CHOICES and value not in CHOICES[key]:
        raise ShardscopeError(f"--maxtext {key}={text}: expected one of {', '.join(CHOICES[key])}")
    return value


def maxtext_run(
    text: str | Sequence[str],
    model_name: str,
    mesh_axes: Sequence[str],
    devices_per_slice: int,
    slices: int,
    moe: bool,
) -> MaxTextRun:
    """Checks a MaxText command line and translates it for a model under a preset's mesh axes.

    Args:
      text: the `k=v` pairs.
      model_name: the model planned (a `model_name=` key must agree with it).
      mesh_axes: the mesh axes of the preset the run uses (its `custom_mesh_and_rule`, or the caller's).
      devices_per_slice: devices of one slice of the topology (MaxText sizes ICI axes within a slice).
      slices: slices of the topology (the DCN axes' product).
      moe: whether the model has MoE layers (MoE-only keys are only worth a warning then).

    Raises:
      ShardscopeError: malformed or unknown input, or a mesh MaxText would refuse on this topology.
    """
    given = parse_maxtext_args(text)
    values = {key: check_maxtext_value(key, value) for key, value in _current_names(given)}
    if "model_name" in values and values["model_name"] != model_name:
        raise ShardscopeError(
            f"--maxtext model_name={values['model_name']}: the model planned is {model_name}; name the same model"
        )
    if "compile_topology_num_slices" in values and values["compile_topology_num_slices"] > 0:
        slices = values["compile_topology_num_slices"]
    mesh, across = _mesh(values, tuple(mesh_axes), devices_per_slice, slices)
    settings, warnings, defaulted = _settings(values, model_name, moe, dict(mesh))
    if across != DCN_AXIS:
        settings[DCN_SETTING] = across
    topology = values.get("compile_topology") or None
    if topology and slices > 1:
        topology = f"{slices}x{topology}"
    return MaxTextRun(
        given=given,
        preset=values.get("custom_mesh_and_rule") or None,
        mesh=mesh,
        settings=tuple(settings.items()),
        topology=topology,
        warnings=tuple(warnings),
        defaulted=tuple(sorted(defaulted)),
    )


def _current_names(given: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The pairs under the names MaxText's base.yml has now (`RENAMED_KEYS`).

    Raises:
      ShardscopeError: a key given under both its names.
    """
    keys = {key for key, _ in given}
    for old, new in RENAMED_KEYS.items():
        if old in keys and new in keys:
            raise ShardscopeError(f"--maxtext: {old} is MaxText's earlier name of {new}; give one of them")
    return [(RENAMED_KEYS.get(key, key), value) for key, value in given]


def _mesh(
    values: Mapping[str, Any], mesh_axes: tuple[str, ...], per_slice: int, slices: int
) -> tuple[tuple[tuple[str, int], ...], str]:
    """Every mesh axis sized as MaxText sizes it: ICI sizes within a slice (one -1 fills the slice), DCN sizes
    across slices (one -1 fills them), the axis = ICI × DCN; and the axes that span the slices (those
    whose DCN size is above 1: `data` by MaxText's default, `fsdp` with `dcn_fsdp_parallelism`; `_across_slices`)."""
    defaults = maxtext_defaults()
    sizes: dict[str, dict[str, int]] = {"ici": {}, "dcn": {}}
    for key in defaults:
        match = _PARALLELISM.fullmatch(key)
        if match is None:
            continue
        net, axis = match.group(1), _AXIS_OF_KEY.get(match.group(2), match.group(2))
        size = int(values.get(key, defaults[key]))
        if axis not in mesh_axes:
            if key in values and size != 1:
                raise ShardscopeError(
                    f"--maxtext {key}={size}: the rules' mesh_axes ({', '.join(mesh_axes)}) have no {axis!r} axis"
                )
            continue
        sizes[net][axis] = size
    result = {axis: 1 for axis in mesh_axes}
    for net, count in (("ici", per_slice), ("dcn", slices)):
        chosen = sizes[net]
        fill = [axis for axis, size in chosen.items() if size == -1]
        if len(fill) > 1:
            raise ShardscopeError(
                f"--maxtext: only one {net}_*_parallelism may be -1, found {', '.join(_key(net, a) for a in fill)}"
            )
        bad = [axis for axis, size in chosen.items() if size == 0 or size < -1]
        if bad:
            raise ShardscopeError(f"--maxtext {_key(net, bad[0])}={chosen[bad[0]]}: expected a positive size or -1")
        fixed = math.prod(size for size in chosen.values() if size != -1)
        if fill:
            if count % fixed:
                of = f"the {count} devices of a slice" if net == "ici" else f"the {count} slices"
                raise ShardscopeError(f"--maxtext: the {net} axes set use {fixed}, which does not divide {of}")
            chosen[fill[0]] = count // fixed
        elif fixed != count:
            has = f"a slice has {count} devices" if net == "ici" else f"the topology has {count} slices"
            raise ShardscopeError(
                f"--maxtext: the {net}_*_parallelism sizes multiply to {fixed}, but {has}; set one to -1 or change them"
            )
        for axis, size in chosen.items():
            result[axis] *= size
    return tuple((axis, result[axis]) for axis in mesh_axes), _across_slices(sizes["dcn"], mesh_axes)


def _across_slices(dcn: Mapping[str, int], mesh_axes: tuple[str, ...]) -> str:
    """The `dcn_axis` setting for the axes whose DCN size is above 1: the one axis (`data` on a single slice),
    or, where several are, each with its size in mesh order (`data:2,fsdp:16`: a GPU cluster's hosts laid over
    both, as `create_hybrid_device_mesh` lays them; TPU slices are joined over one axis, `_check_dcn_axis`)."""
    spanning = [axis for axis in mesh_axes if dcn.get(axis, 1) > 1]
    if len(spanning) > 1:
        return ",".join(f"{axis}:{dcn[axis]}" for axis in spanning)
    return spanning[0] if spanning else DCN_AXIS


def _key(net: str, axis: str) -> str:
    name = {v: k for k, v in _AXIS_OF_KEY.items()}.get(axis, axis)
    return f"{net}_{name}_parallelism"


def _settings(
    values: Mapping[str, Any], model_name: str, moe: bool, mesh: Mapping[str, int]
) -> tuple[dict[str, str], list[str], set[str]]:
    """shardscope settings for the modelled keys, and a warning for each key that changes the step but is not
    modelled (and for MaxText defaults the plan departs from)."""
    settings: dict[str, str] = {}
    unmodelled: list[str] = []
    for key, value in values.items():
        if key in RUN_ONLY_KEYS or _PARALLELISM.fullmatch(key) or key in _HANDLED_ELSEWHERE:
            continue
        translate = _MODEL_KEYS.get(key)
        if translate is not None:
            setting = translate(value)
            if setting is not None:
                settings.update(setting)
                continue
        if key in _SAME_AS_PLANNED and value == _SAME_AS_PLANNED[key]:
            continue
        unmodelled.append(f"{key}={_text(value)}")
    warnings = []
    if unmodelled:
        warnings.append(
            f"MaxText keys that change the step but are not modelled, planned without them: {', '.join(unmodelled)}"
        )
    blocks = [f"{name}:{values[key]}" for key, name in _SPLASH_BLOCK_KEYS.items() if key in values]
    if blocks:
        settings["model.attention_blocks"] = ",".join(blocks)
    if values.get("remat_policy") == "custom":
        defaults = maxtext_defaults()
        places = {key: values.get(key, defaults[key]) for key in CUSTOM_REMAT_KEYS}
        settings["model.remat_custom"] = ",".join(f"{k}:{v}" for k, v in places.items() if v != "remat")
    defaulted: set[str] = set()
    stages = mesh.get("stage", 1)
    if stages > 1:
        microbatches = values.get("num_pipeline_microbatches", -1)
        settings["pipeline.microbatches"] = str(stages if microbatches == -1 else microbatches)
        if "num_pipeline_microbatches" not in values:
            defaulted.add("pipeline.microbatches")
        settings["pipeline.repeats"] = str(_pipeline_repeats(values, model_name, stages))
        if "num_pipeline_repeats" not in values and "num_layers_per_pipeline_stage" not in values:
            defaulted.add("pipeline.repeats")
        if values.get("pipeline_fsdp_ag_once"):
            settings["pipeline.fsdp_gather_once"] = "true"
    # How the step runs: base.yml's defaults where the command line is silent.
    defaults = maxtext_defaults()
    for key in _RUN_DEFAULTS:
        if key not in values:
            default = _MODEL_KEYS[key](defaults[key]) or {}
            settings.update(default)
            defaulted.update(default)
    sparse = values.get("sparse_matmul", defaults["sparse_matmul"])
    if moe and sparse:
        # MaxText's sparse_matmul runs the experts as one grouped-matmul kernel (megablox on TPU; ragged_dot
        # without megablox, priced the same): planned on the same slots, priced as the kernel runs.
        settings["model.expert_matmul"] = "grouped"
        if "sparse_matmul" not in values:
            defaulted.add("model.expert_matmul")
    if moe and sparse and "capacity_factor" not in values:
        # Dropless, every routed token is computed once: tokens × k rows in all, the FLOPs of exactly
        # k·tokens/experts slots per expert, i.e. capacity factor 1 (at balanced routing; a capacity-padded
        # MoE at the flavor's 1.25 would plan a quarter more expert work than MaxText runs).
        settings["model.capacity_factor"] = "1"
        defaulted.add("model.capacity_factor")
        warnings.append(
            "MaxText's dropless sparse_matmul MoE is planned as capacity factor 1 (each routed token computed "
            "once: its expert FLOPs at balanced routing, priced as the grouped-matmul kernel; set "
            "capacity_factor=… to choose another)"
        )
    return settings, warnings, defaulted


def _pipeline_repeats(values: Mapping[str, Any], model_name: str, stages: int) -> int:
    """How many times MaxText's schedule visits each stage: `num_pipeline_repeats`, or (-1, its default) the
    decoder layers over stages × `num_layers_per_pipeline_stage` (default 1: a circular schedule that runs
    one layer per visit)."""
    defaults = maxtext_defaults()
    repeats = values.get("num_pipeline_repeats", defaults["num_pipeline_repeats"])
    if repeats > 0:
        return int(repeats)
    per_stage = values.get("num_layers_per_pipeline_stage", defaults["num_layers_per_pipeline_stage"])
    layers = values.get("base_num_decoder_layers") or maxtext_model_config(model_name).get(
        "base_num_decoder_layers", defaults["base_num_decoder_layers"]
    )
    return max(int(layers) // (stages * int(per_stage)), 1)


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _capacity(value: float) -> dict[str, str]:
    return {"model.capacity_factor": "none" if value < 0 else f"{value:g}"}


def _remat(value: str) -> dict[str, str]:
    # MaxText runs `none` as `full` (no policy: nn.remat saves nothing but the layer's input).
    return {"model.remat": "full" if value == "none" else value}


# MaxText keys with a shardscope setting: key → its setting(s), or None when this value is not modelled.
_MODEL_KEYS: dict[str, Any] = {
    "per_device_batch_size": lambda v: {"model.per_device_batch": f"{v:g}", "model.global_batch": "0"},
    "max_target_length": lambda v: {"model.seq_len": str(v)},
    "base_num_decoder_layers": lambda v: {"model.num_layers": str(v)},
    "first_num_dense_layers": lambda v: {"model.first_dense_layers": str(v)},
    "dtype": lambda v: {"model.dtype": v} if v != "float16" else None,
    "weight_dtype": lambda v: {"model.weight_dtype": v} if v != "float16" else None,
    "grad_dtype": lambda v: {"model.grad_dtype": v} if v != "float16" else None,
    "mu_dtype": lambda v: ({"model.mu_dtype": v} if v else {}) if v != "float16" else None,
    "capacity_factor": _capacity,
    "remat_policy": _remat,
    "attention": lambda v: {"model.attention_kernel": v} if v in ("dot_product", "flash", "autoselected") else None,
    "use_ring_of_experts": lambda v: {"moe": "ring"} if v else {"moe": "all_to_all"},
    "shard_mode": lambda v: {"shard_mode": v},
    "shard_optimizer_over_data": lambda v: {"shard_optimizer_over": "data"} if v else {},
    # The expert matmuls' kernel: set from sparse_matmul in `_settings` (megablox only picks its TPU kernel).
    "sparse_matmul": lambda v: {},
    "shard_exp_on_fsdp": lambda v: {"model.shard_experts_on_fsdp": _text(v)},
    "use_2d_fsdp_sharding": lambda v: {"model.experts_2d_fsdp": _text(v)},
    "use_iota_embed": lambda v: {"model.iota_embed": _text(v)},
    "num_vocab_tiling": lambda v: {"model.vocab_tiles": str(v)},
    "megablox": lambda v: {},
    # The TPU attention kernel's tiles (the query block is also the CPU stand-in's; the others are read in
    # `_settings`) and its backward kernel.
    "sa_block_q": lambda v: {"model.attention_block": str(v)},
    "sa_use_fused_bwd_kernel": lambda v: {"model.attention_fused_backward": str(v).lower()},
}
# MaxText's other splash-kernel block sizes: key → the kernel's name for the block.
_SPLASH_BLOCK_KEYS = {f"sa_block_{name}": name for name in SPLASH_BLOCKS}
# Keys whose base.yml default applies when the command line does not give them (how the step runs).
_RUN_DEFAULTS = ("attention", "dtype", "remat_policy")
# Keys read by `maxtext_run` itself (the mesh, the preset, the topology, the model's name, the pipeline).
_HANDLED_ELSEWHERE = frozenset(
    {
        "model_name",
        "custom_mesh_and_rule",
        "compile_topology",
        "compile_topology_num_slices",
        "num_slices",
        "num_pipeline_microbatches",
        "num_pipeline_repeats",
        "num_layers_per_pipeline_stage",
        "pipeline_fsdp_ag_once",
        "mesh_axes",
        *_SPLASH_BLOCK_KEYS,
        *CUSTOM_REMAT_KEYS,
    }
)
# Keys whose value here is what shardscope plans anyway (AdamW,
# layers scanned on axis 1, MaxText's custom remat locations at their defaults).
_SAME_AS_PLANNED: dict[str, Any] = {
    "opt_type": "adamw",
    "scan_layers": True,
    "param_scan_axis": 1,
    "decoder_layer_input": "device",
    "enable_dropout": False,
    "gradient_accumulation_steps": 1,
    "optimizer_memory_host_offload": False,
    "parameter_memory_host_offload": False,
}
