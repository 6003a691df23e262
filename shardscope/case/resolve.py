"""A case: which model, under which preset, on which topology and mesh, with which overrides.

Everything here is validated before JAX starts, so a wrong name or mesh fails in milliseconds.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reference_models import MODELS, DecoderConfig
from shardscope.case.cpu_options import cpu_compiler_options
from shardscope.case.maxtext_run import MaxTextRun, maxtext_run, parse_maxtext_args
from shardscope.case.presets import (
    PRESET_SETTABLE,
    Preset,
    apply_preset_overrides,
    as_maxtext_pipelines,
    get_preset,
    with_model_rules,
)
from shardscope.case.rules import drop_unit_axes, entry_axes, resolve_logical
from shardscope.case.settings import MODEL_SETTABLE, apply_model_settings, check_model
from shardscope.case.topology import (
    DCN_SETTING,
    DEFAULT_TOPOLOGY,
    Topology,
    check_spans_parts,
    dcn_axis_of,
    dcn_parts,
    get_topology,
    resolve_mesh,
)
from shardscope.errors import MeshError, ShardscopeError, unknown_name


@dataclass(frozen=True)
class Case:
    """A fully resolved case: the unit a plan and a golden describe."""

    model_name: str
    model: DecoderConfig
    preset: Preset
    topology: Topology
    mesh: tuple[tuple[str, int], ...]
    overrides: tuple[tuple[str, str], ...] = ()

    @property
    def mesh_sizes(self) -> dict[str, int]:
        """Axis name → size."""
        return dict(self.mesh)

    @property
    def num_devices(self) -> int:
        """Devices the mesh uses."""
        count = 1
        for _, size in self.mesh:
            count *= size
        return count

    @property
    def axis_types(self) -> str:
        """ "explicit" or "auto": the type of every mesh axis (the preset's shard mode)."""
        return "explicit" if self.preset.shard_mode == "explicit" else "auto"

    @property
    def dcn_axis(self) -> str:
        """The mesh axis that spans the topology's slices (`data` unless `--set dcn_axis=` names another)."""
        return dcn_axis_of(self.overrides)

    @property
    def dcn_parts(self) -> tuple[tuple[str, int], ...]:
        """Each mesh axis that spans the topology's slices, with how many it spans (several on a GPU cluster
        whose hosts MaxText lays over several `dcn_*_parallelism` axes)."""
        return dcn_parts(self.dcn_axis, self.topology.slices)

    @property
    def global_batch(self) -> int:
        """Sequences per step: the flavor's (or --set) global batch, else its per-device batch × devices."""
        return self.model.batch_for(self.num_devices)


def get_model(name: str) -> DecoderConfig:
    """A model flavor by name, with a "did you mean" for typos."""
    if name not in MODELS:
        raise unknown_name("model", name, MODELS)
    return MODELS[name]


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """`--set key=value` pairs into a dict (keys: preset settings and `model.<field>`)."""
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ShardscopeError(f"--set {pair!r}: expected key=value, e.g. --set moe=ring")
        result[key.strip()] = value.strip()
    return result


def _split_settings(overrides: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(model fields without the `model.` prefix, preset settings); an unknown key fails with the known ones."""
    known = [f"model.{f}" for f in MODEL_SETTABLE] + list(PRESET_SETTABLE) + [DCN_SETTING]
    model: dict[str, str] = {}
    preset: dict[str, str] = {}
    for key, value in overrides.items():
        if key.startswith(XLA_PREFIX):
            if not _XLA_FLAG.fullmatch(key.removeprefix(XLA_PREFIX)):
                raise ShardscopeError(f"--set {key}={value}: expected xla.<flag name> (as in LIBTPU_INIT_ARGS)")
            continue  # a compiler option: `compiler_options_for`
        if key == DCN_SETTING:
            continue  # checked against the mesh axes once the preset is known: `_check_dcn_axis`
        if key.startswith("model."):
            if key.removeprefix("model.") not in MODEL_SETTABLE:
                raise unknown_name("setting", key, known)
            model[key.removeprefix("model.")] = value
        elif key in PRESET_SETTABLE:
            preset[key] = value
        else:
            raise unknown_name("setting", key, known)
    return model, preset


def resolve_case(
    model_name: str,
    preset: str,
    topology: str = DEFAULT_TOPOLOGY,
    mesh: Mapping[str, int] | None = None,
    overrides: Mapping[str, str] | None = None,
    compiling: bool = True,
) -> Case:
    """Validates every user input of a case and resolves it (no JAX); `compiling=False` resolves a case that
    will not be compiled here (a stored plan's), without the TPU or GPU extra its topology compiles with.

    Raises:
      ShardscopeError: any unknown name, malformed preset, bad override or mesh that does not fit.
    """
    overrides = dict(overrides or {})
    model = get_model(model_name)
    resolved_preset = get_preset(preset)
    topo = get_topology(topology, compiling)
    model_settings, preset_settings = _split_settings(overrides)
    if xla_flags(overrides) and topo.platform == "cpu":
        flag = next(iter(xla_flags(overrides)))
        raise ShardscopeError(
            f"--set xla.{flag}: XLA flags are options of the TPU compiler; give a TPU --topology to use them"
        )
    model = apply_model_settings(model, model_settings)
    # MaxText's defaults take the model's own rules (llama2-7b's `norm`); a rule file replaces them.
    resolved_preset = apply_preset_overrides(resolved_preset, preset_settings)
    resolved_preset = with_model_rules(resolved_preset, model.logical_axis_rules)
    sizes = resolve_mesh(resolved_preset, topo.num_devices, mesh or {})
    resolved_preset, sizes = as_maxtext_pipelines(resolved_preset, sizes)
    model = pipelined_model(model, resolved_preset, dict(sizes))
    check_model(model_name, model, math.prod(size for _, size in sizes))
    case = Case(
        model_name=model_name,
        model=model,
        preset=resolved_preset,
        topology=topo,
        mesh=sizes,
        overrides=tuple(sorted(overrides.items())),
    )
    _check_dcn_axis(case)
    _check_pipeline(case)
    _check_2d_expert_weights(case)
    _check_vocab_tiles(case)
    return case


def resolve_maxtext_case(
    model_name: str,
    preset: str | None,
    topology: str | None,
    maxtext: str | Sequence[str],
    overrides: Mapping[str, str] | None = None,
    compiling: bool = True,
) -> tuple[Case, MaxTextRun]:
    """A case from MaxText's command line: `custom_mesh_and_rule` picks the preset, `ici_*`/`dcn_*_parallelism`
    size every mesh axis (MaxText's defaults for the rest: FSDP fills a slice, data fills the slices),
    `compile_topology` the topology; the other keys become settings (see `case.maxtext_run`).

    Returns:
      The case, and the translated run (its `warnings` name what is not modelled).

    Raises:
      ShardscopeError: bad MaxText input, or a preset, topology or `--set` that contradicts it.
    """
    model = get_model(model_name)
    given = dict(parse_maxtext_args(maxtext))
    rule = given.get("custom_mesh_and_rule") or None
    if preset is not None and rule is not None and preset != rule:
        raise ShardscopeError(f"--preset {preset} and --maxtext custom_mesh_and_rule={rule} name different rules")
    preset_name = preset or rule or "default"
    chosen_preset = get_preset(preset_name)
    compile_topology = given.get("compile_topology") or None
    if topology is not None and compile_topology is not None and topology.split("x")[-1] != compile_topology:
        raise ShardscopeError(f"--topology {topology} and --maxtext compile_topology={compile_topology} disagree")
    slices = given.get("compile_topology_num_slices", "1")
    chosen_topology = topology or (
        f"{slices}x{compile_topology}" if compile_topology and slices not in ("1", "-1") else compile_topology
    )
    chosen_topology = chosen_topology or DEFAULT_TOPOLOGY
    topo = get_topology(chosen_topology, compiling)
    run = maxtext_run(
        maxtext,
        model_name,
        chosen_preset.mesh_axes,
        topo.num_devices // topo.slices,
        topo.slices,
        model.num_experts > 0,
    )
    settings = dict(run.settings)
    for key, value in (overrides or {}).items():
        if key in settings and settings[key] != value and key not in run.defaulted:
            raise ShardscopeError(f"--set {key}={value} contradicts --maxtext (which sets {key}={settings[key]})")
        settings[key] = value
    case = resolve_case(
        model_name,
        chosen_preset.name if preset is None and rule is None else (preset or rule or "default"),
        chosen_topology,
        dict(run.mesh),
        settings,
        compiling,
    )
    return case, run


def pipelined_model(model: DecoderConfig, preset: Preset, sizes: dict[str, int]) -> DecoderConfig:
    """The model with its main stack laid out for the preset's pipeline (its stages and repeats), when the
    stage axis is in use: MaxText's pipeline keeps those parameters in a layout of their own."""
    pipeline = preset.pipeline
    stages = sizes.get(pipeline.stage_axis, 1) if pipeline is not None else 1
    if pipeline is None or stages <= 1:
        return model
    return dataclasses.replace(model, pipeline_stages=stages, pipeline_repeats=pipeline.repeats)


def _check_dcn_axis(case: Case) -> None:
    """The axes that span slices are the preset's and divide among them (a single slice: any axis); several
    only on a GPU cluster (TPU slices are joined over one axis)."""
    parts, slices = case.dcn_parts, case.topology.slices
    named = DCN_SETTING in dict(case.overrides)
    for axis, _ in parts:
        if axis not in case.preset.mesh_axes and (named or slices > 1):
            raise MeshError(f"--set {DCN_SETTING}: {unknown_name('mesh axis', axis, case.preset.mesh_axes).args[0]}")
    if len(parts) > 1 and case.topology.gpu is None:
        raise MeshError(
            f"{DCN_SETTING}={case.dcn_axis} (--set, or MaxText's dcn_*_parallelism): TPU slices are joined over "
            "one mesh axis here (several: GPU clusters only); keep one above 1"
        )
    check_spans_parts(case.mesh_sizes, parts)


def _check_pipeline(case: Case) -> None:
    """A pipeline over more than one stage must split the main layer stack and the batch evenly."""
    pipeline = case.preset.pipeline
    if pipeline is None:
        return
    stages = case.mesh_sizes.get(pipeline.stage_axis, 1)
    if stages == 1:
        return
    where = f"preset {case.preset.name}: pipeline over {pipeline.stage_axis}={stages}"
    layers = case.model.main_stack_layers
    if layers % stages:
        raise ShardscopeError(
            f"{where}: the main layer stack of {case.model_name} has {layers} layers, which {stages} stages do not "
            f"divide; change --mesh {pipeline.stage_axis}=… or --set model.num_layers=…"
        )
    if pipeline.repeats < 1 or layers % (stages * pipeline.repeats):
        raise ShardscopeError(
            f"{where}: {pipeline.repeats} repeats do not split the {layers // stages} layers of a stage evenly; "
            f"change --set pipeline.repeats=… (a divisor of {layers // stages})"
        )
    if pipeline.microbatches < 1 or pipeline.microbatches % stages:
        # MaxText's pipeline keeps microbatches / stages of them in each stage's slice of its loop state.
        raise ShardscopeError(
            f"{where}: {pipeline.microbatches} microbatches do not split over {stages} stages (the pipeline holds "
            f"microbatches / stages of them in each stage); change --set pipeline.microbatches=… (a multiple of "
            f"{stages})"
        )
    if case.global_batch % pipeline.microbatches:
        raise ShardscopeError(
            f"{where}: a batch of {case.global_batch} does not split into {pipeline.microbatches} microbatches; "
            f"change --set pipeline.microbatches=… or model.global_batch=…"
        )
    # Inside a stage each microbatch is split like the residual stream's batch (`activation_batch`).
    micro = case.global_batch // pipeline.microbatches
    spec = drop_unit_axes(resolve_logical(("activation_batch",), case.preset.logical_axis_rules), case.mesh_sizes)
    axes = entry_axes(spec[0])
    ways = math.prod(case.mesh_sizes[axis] for axis in axes)
    if micro % ways:
        raise ShardscopeError(
            f"{where}: a microbatch of {micro} sequences ({case.global_batch} / {pipeline.microbatches}) does not "
            f"split over {'×'.join(axes)} = {ways} devices; change --set pipeline.microbatches=… or "
            "model.global_batch=…"
        )


def _check_2d_expert_weights(case: Case) -> None:
    """MaxText's `use_2d_fsdp_sharding` places the expert weights on (-, mlp_no_fsdp, -) for the expert
    matmuls: the tokens' model dimension for `wi`, so an axis there that splits nothing else would leave each
    device a slice of the matmul's contracted dimension, which the expert body does not model."""
    if not case.model.experts_2d_fsdp or case.model.shard_experts_on_fsdp:
        return
    spec = drop_unit_axes(resolve_logical(("mlp_no_fsdp",), case.preset.logical_axis_rules), case.mesh_sizes)
    axes = entry_axes(spec[0])
    if axes:
        sizes = ", ".join(f"{axis}={case.mesh_sizes[axis]}" for axis in axes)
        raise ShardscopeError(
            f"model.experts_2d_fsdp (MaxText's use_2d_fsdp_sharding) with mlp_no_fsdp on {sizes} is not "
            "modelled: the expert weights' model dimension would be split for the expert matmuls; use it "
            "without tensor parallelism"
        )


def _check_vocab_tiles(case: Case) -> None:
    """The loss's chunks must split the batch's tokens evenly (MaxText refuses the run otherwise)."""
    tiles, tokens = case.model.vocab_tiles, case.global_batch * case.model.seq_len
    if tokens % tiles:
        raise ShardscopeError(
            f"model.vocab_tiles={tiles} (MaxText's num_vocab_tiling) does not divide the batch's {tokens} tokens "
            f"({case.global_batch} sequences of {case.model.seq_len}); choose a divisor"
        )


# `--set xla.<flag>=<value>`: an option of the TPU compiler, as MaxText's runs give them in LIBTPU_INIT_ARGS
# (`--xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000`); the compiler rejects one it does not have.
XLA_PREFIX = "xla."
_XLA_FLAG = re.compile(r"[A-Za-z0-9_]+")


def xla_flags(overrides: Mapping[str, str] | Sequence[tuple[str, str]]) -> dict[str, str]:
    """The TPU compiler options among a case's settings (flag name → value)."""
    pairs = overrides.items() if isinstance(overrides, Mapping) else overrides
    return {key.removeprefix(XLA_PREFIX): value for key, value in pairs if key.startswith(XLA_PREFIX)}


def compiler_options_for(case: Case) -> dict[str, Any]:
    """CPU options that leave the partitioned program (shardings, collectives) unchanged and compile faster.

    LLVM optimisation level 0 and XLA's classic loop emitters instead of its newer fusion emitters change
    only how fused loops become machine code; together they cut a tiny model's compile to about a third.
    The one thing they move is the temp buffer size, by well under the diff's temp tolerance (0.3% on
    deepseek-tiny); the options are recorded in each plan's provenance.
    """
    if case.topology.platform == "gpu":
        # The GPU compiler reads a boolean option as True/False only: `--set xla.…=false` reads as MaxText's
        # GPU runs write it (XLA_FLAGS=--xla_gpu_enable_triton_gemm=false).
        bools = {"true": True, "false": False}
        return {key: bools.get(value.lower(), value) for key, value in xla_flags(case.overrides).items()}
    if case.topology.platform != "cpu":
        return xla_flags(case.overrides)
    return dict(cpu_compiler_options())


@dataclass(frozen=True)
class MaxTextSearch:
    """A MaxText command line as the inputs of a search over meshes and presets (`advise --maxtext`).

    Attributes:
      preset: the rules `custom_mesh_and_rule` names (None: every built-in preset is searched).
      topology: the topology `compile_topology` names, or None.
      pins: the mesh axes the command line sizes itself (`ici_<axis>_parallelism` other than -1): held at
        those sizes, the others searched.
      settings: the settings the run's keys stand for (and MaxText's defaults where it is silent).
      warnings: what the run holds that is not modelled (as for `dump --maxtext`).
    """

    preset: str | None
    topology: str | None
    pins: tuple[tuple[str, int], ...]
    settings: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...]

    def settings_with(self, overrides: Mapping[str, str]) -> list[str]:
        """The run's settings with `--set` overrides, as `k=v` words; an override may change what MaxText's
        defaults chose, not what the command line says.

        Raises:
          ShardscopeError: an override that contradicts the command line.
        """
        settings = dict(self.settings)
        for key, value in overrides.items():
            if key in settings and settings[key] != value and key not in self.defaulted:
                raise ShardscopeError(f"--set {key}={value} contradicts --maxtext (which sets {key}={settings[key]})")
            settings[key] = value
        return [f"{key}={value}" for key, value in settings.items()]

    defaulted: tuple[str, ...] = ()


def maxtext_search(model_name: str, maxtext: str | Sequence[str], topology: str | None) -> MaxTextSearch:
    """What a MaxText command line fixes of a search: the rules, the topology, the axes it sizes and how the
    step runs; the axes it leaves to MaxText's defaults are the search's.

    Raises:
      ShardscopeError: bad MaxText input, or a topology that contradicts it.
    """
    model = get_model(model_name)
    given = dict(parse_maxtext_args(maxtext))
    rule = given.get("custom_mesh_and_rule") or None
    compile_topology = given.get("compile_topology") or None
    if topology is not None and compile_topology is not None and topology.split("x")[-1] != compile_topology:
        raise ShardscopeError(f"--topology {topology} and --maxtext compile_topology={compile_topology} disagree")
    topo = get_topology(topology or compile_topology or DEFAULT_TOPOLOGY)
    preset = get_preset(rule or "default")
    run = maxtext_run(
        maxtext, model_name, preset.mesh_axes, topo.num_devices // topo.slices, topo.slices, model.num_experts > 0
    )
    sized = dict(run.mesh)
    pins = []
    for key, value in given.items():
        match = re.fullmatch(r"ici_(\w+)_parallelism", key)
        if match and int(value) != -1:
            axis = "stage" if match.group(1) == "pipeline" else match.group(1)
            if axis in sized:
                pins.append((axis, sized[axis]))
    return MaxTextSearch(rule, compile_topology, tuple(pins), run.settings, run.warnings, run.defaulted)
