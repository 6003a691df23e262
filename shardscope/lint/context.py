"""What the checks read: the preset, the plan, what the trace and the compiler said, and the target hardware.

A check is a pure function `LintContext → findings`; everything it may look at is here, as plain values.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardscope.case.presets import Preset
from shardscope.case.rules import Indivisible, Rule
from shardscope.plan.document import Plan
from shardscope.plan.records import TensorRecord

if TYPE_CHECKING:
    from shardscope.case.gpu import GpuCluster, GpuHardware
    from shardscope.case.hardware import Hardware

# A logical-axes tuple, one name (or None) per dimension.
LogicalAxes = tuple[str | None, ...]
# Modules whose tensors are "inside the MoE block": a path component naming a MoE block. Layer stacks
# (`moe_layers`) hold attention too, so they do not count.
_STACK_SUFFIX = "_layers"


@dataclass(frozen=True)
class LintContext:
    """Everything a lint may read about one case.

    Attributes:
      preset: the preset planned (its rules, mesh axes and lint settings).
      plan: the plan (tensors; collectives and memory when compiled).
      resolved: every logical-axes tuple the model asked the rules for while tracing, recorded on a tensor
        or not.
      indivisible: tensors whose mesh axes do not divide them (from a lenient trace; empty otherwise).
      compiler_log: what the compiler wrote to stderr while compiling; None when not compiled, or when its
        warnings could not be captured in this process.
      hardware: the TPU generation to check memory against, if any.
      slices: TPU slices joined over DCN (`data` spans them unless the case names another axis); on a GPU
        cluster, its NVLink domains.
      cluster: the GPU cluster planned for (None elsewhere).
      gpu: its GPUs' published figures, to check memory against (None elsewhere).
    """

    preset: Preset
    plan: Plan
    resolved: frozenset[LogicalAxes] = frozenset()
    indivisible: tuple[Indivisible, ...] = ()
    compiler_log: str | None = None
    hardware: Hardware | None = None
    slices: int = 1
    notes: tuple[str, ...] = field(default=())
    cluster: GpuCluster | None = None
    gpu: GpuHardware | None = None

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The preset's rules, in priority order."""
        return self.preset.logical_axis_rules

    @functools.cached_property
    def mesh_sizes(self) -> dict[str, int]:
        """Axis → size on this mesh; axes the rules name but `mesh_axes` lacks are size 1 (as MaxText)."""
        named = {axis for _, axes in self.rules for axis in axes}
        return {axis: 1 for axis in named} | dict(self.plan.case.mesh)

    def size(self, axis: str) -> int:
        """An axis's size on this mesh (1 when the mesh lacks it)."""
        return self.mesh_sizes.get(axis, 1)

    @functools.cached_property
    def tensors(self) -> dict[str, TensorRecord]:
        """Path → tensor record."""
        return self.plan.tensor_map

    def tensors_of(self, *kinds: str) -> Iterator[tuple[str, TensorRecord]]:
        """(path, record) of the given kinds, in path order."""
        return ((path, t) for path, t in self.plan.tensors if t.kind in kinds)

    @functools.cached_property
    def used(self) -> frozenset[LogicalAxes]:
        """Every logical-axes tuple the model uses: what it resolved and what its tensors carry."""
        carried = {t.logical for _, t in self.plan.tensors if t.logical}
        return frozenset(self.resolved | carried)

    @functools.cached_property
    def used_names(self) -> frozenset[str]:
        """Every logical name the model uses."""
        return frozenset(name for axes in self.used for name in axes if name is not None)


def in_moe_block(path: str, expert_modules: frozenset[str] = frozenset()) -> bool:
    """Whether a tensor path lies inside a MoE block: a component named so (`MoeBlock_0`, `DeepSeekMoeBlock_0`,
    `moe`; a layer stack named `moe_layers` does not count), or a module that holds expert weights
    (`expert_modules`: whatever a model calls its MoE, e.g. gpt-oss's `GptOssMlp`)."""
    parts = path.split("/")[1:]
    if any("moe" in part.lower() and not part.endswith(_STACK_SUFFIX) for part in parts):
        return True
    module = "/".join(parts)
    return any(module == m or module.startswith(m + "/") for m in expert_modules)


def expert_modules(tensors: Iterable[tuple[str, TensorRecord]]) -> frozenset[str]:
    """The modules that hold a weight with an experts dimension (logical `exp`): a MoE block by what it holds,
    not by its name. Paths without their root (`decoder/layers/GptOssMlp`)."""
    return frozenset(
        "/".join(path.split("/")[1:-1])
        for path, tensor in tensors
        if tensor.kind == "param" and tensor.logical is not None and "exp" in tensor.logical
    )


def rule_subject(index: int, rule: Rule) -> str:
    """How findings name a rule: `logical_axis_rules[12] [activation_q_length, ['context']]`."""
    logical, axes = rule
    return f"logical_axis_rules[{index}] [{logical}, {list(axes)}]"


def axes_text(axes: tuple[str, ...]) -> str:
    """ "fsdp×expert", or "(none)"."""
    return "×".join(axes) if axes else "(none)"
