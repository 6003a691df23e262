"""The rows of a plan: where one tensor lives, one distinct collective, the case header; schema constants.

No JAX objects live here; `shardscope.plan.json` writes and reads them (canonical JSON).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardscope.case.resolve import Case
from shardscope.case.rules import Spec, shard_shape

SCHEMA = "shardscope.plan/1"
SCHEMA_FAMILY = "shardscope.plan/"
SCHEMA_VERSION = 1
TENSOR_KINDS = ("param", "opt_state", "input", "activation", "output")
PASSES = ("forward", "backward", "optimizer", "other")
# What a plan can hold. A plan made without compiling (`dump --tensors-only`) holds tensors only; the JSON
# lists its parts only when they are not all of them, so full plans read and write as before.
PARTS = ("tensors", "collectives", "memory")
TENSORS_ONLY = ("tensors",)
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class TensorRecord:
    """Where one tensor lives: its logical axes, physical spec and per-device footprint."""

    kind: str
    shape: tuple[int, ...]
    dtype: str
    logical: tuple[str | None, ...] | None
    spec: Spec
    shard_shape: tuple[int, ...]
    bytes_per_device: int


@dataclass(frozen=True)
class RuleCause:
    """A rule that put a dimension of a tensor on (some of) a collective's mesh axes."""

    logical: str  # the logical axis name of the dimension, as the rule names it
    axes: tuple[str, ...]  # the mesh axes the rule gave that dimension
    rule: int  # the rule's index in the preset's logical_axis_rules (as `explain` numbers them)
    tensor: str  # the plan tensor whose dimension it is


@dataclass(frozen=True)
class Cause:
    """Why a collective runs: what it moves, the op that needs it in the other layout, and the rules that put
    the moved (or summed) dimensions on its mesh axes.

    `tensors` are plan tensor paths (`params/...`, `activations/...`, `inputs/...`), `grads/<param path>` for
    a parameter's gradient, or `ops/<module>/<primitive>` for the result of an op that is no plan tensor.
    No rules means the compiler chose the layout (propagation): no rule puts a dimension of the moved
    tensor, nor of what it is computed from, on the collective's axes.
    """

    tensors: tuple[str, ...]
    consumer: str  # "<module path>/<primitive>" of the op the collective reshards for
    line: str | None  # "reference_models/layers.py:68": the model line that made that op
    rules: tuple[RuleCause, ...] = ()

    @property
    def compilers_choice(self) -> bool:
        """No rule explains the collective: the compiler chose the layout it reshards from or to."""
        return not self.rules

    @property
    def rules_text(self) -> str:
        """`embed_moe → fsdp; mlp → tensor`, or "compiler's choice"."""
        return "; ".join(rule_text(r) for r in self.rules) or COMPILERS_CHOICE


COMPILERS_CHOICE = "compiler's choice"


def rule_text(rule: RuleCause) -> str:
    """`embed_moe → fsdp` (several axes joined by "+")."""
    return f"{rule.logical} → {'+'.join(rule.axes)}"


@dataclass(frozen=True)
class CollectiveRow:
    """One distinct collective of the compiled step; total traffic = bytes × count × loop_trips."""

    op: str
    axes: tuple[str, ...] | None  # None: the device groups match no set of mesh axes (see `groups`)
    dtype: str
    shape: tuple[int, ...]
    bytes: int  # per device per execution
    count: int
    loop_trips: int | None  # None: an enclosing loop's trip count is unknown
    pass_: str
    source: str
    groups: str | None = None
    shift: int | None = None
    # A CPU program's row: `bytes` with its float32 values of bfloat16 precision in bfloat16, as a TPU moves
    # them (what pricing a CPU plan as a TPU uses); None when nothing narrows, and in TPU plans.
    tpu_bytes: int | None = None
    # It hands a loop iteration's result to the next iteration, whose matrix work all waits for it (a pipeline
    # stage's output to the next stage, `shardscope.hlo.handoffs`): no compute can hide it.
    handoff: bool = False
    # A CPU program's all-reduce that its loop only accumulates, which the TPU compiler moves out of the loop
    # (a program of Auto axes, `shardscope.hlo.accumulation`): the bytes it then sums once, after the loop,
    # as a TPU holds them; None otherwise, and in TPU plans.
    tpu_moved_out: int | None = None
    # Why it runs (`shardscope.extract.causes`); None in plans made before causes, imports and bare HLO.
    cause: Cause | None = None
    # On a GPU cluster: whether its groups stay inside one NVLink domain ("nvlink") or cross the network
    # between domains ("network"); None elsewhere, and for groups that match no mesh axes.
    link: str | None = None

    @property
    def traffic(self) -> int | None:
        """bytes × count × loop_trips (None when a trip count is unknown)."""
        return None if self.loop_trips is None else self.bytes * self.count * self.loop_trips


@dataclass(frozen=True)
class CaseRecord:
    """What was planned: the case header of a plan."""

    model: str
    preset: str
    topology: str
    mesh: tuple[tuple[str, int], ...]
    axis_types: str
    overrides: tuple[tuple[str, str], ...] = ()
    preset_source: str = ""  # the preset file's path as given; "" for a built-in preset


# A routed expert weight is known by its logical axes, MaxText's vocabulary, never by its name: three
# dimensions besides any stack dimensions, [experts, model width, hidden] or [experts, hidden, model width],
# one of them an expert axis (`exp`) or of the experts' own (`embed_moe`, `mlp_moe`). Its first dimension
# after the stack dimensions is the experts' (`expert_dim`), whatever its logical name (`exp`, or `embed_moe`
# under MaxText's `shard_exp_on_fsdp`); its hidden dimension is the one named for the MLP (`mlp_moe`).
_EXPERT_AXIS = "exp"
_EXPERT_SUFFIX = "_moe"


def _layer_logical(record: TensorRecord) -> list[str | None]:
    """The record's logical names without its stack dimensions (None for each, where it has none)."""
    return [name for name in (record.logical or (None,) * len(record.shape)) if not is_stack_name(name)]


def is_routed_expert(path: str, record: TensorRecord) -> bool:
    """Whether a tensor is a routed expert weight (by its logical axes, see above; `path` is not read): its
    experts are dimension `expert_dim(record)`."""
    del path
    logical = _layer_logical(record)
    return (
        record.kind == "param"
        and len(logical) == 3
        and any(name is not None and (name == _EXPERT_AXIS or name.endswith(_EXPERT_SUFFIX)) for name in logical)
    )


def is_lookup_table(record: TensorRecord) -> bool:
    """Whether a parameter is a lookup table [vocab, model width] (its first dimension, besides any stack
    dimensions, is the vocabulary's: the token embedding), read by rows, not multiplied whole."""
    logical = _layer_logical(record)
    return record.kind == "param" and len(logical) == 2 and logical[0] == "vocab"


def model_width(tensors: Sequence[tuple[str, TensorRecord]]) -> int | None:
    """The model's width (its embedding dimension): the lookup table's last dimension; None without one."""
    return next((r.shape[-1] for _, r in tensors if is_lookup_table(r)), None)


def expert_hidden_width(record: TensorRecord, width: int | None) -> int:
    """The hidden width of a routed expert weight [experts, model width, hidden] or [experts, hidden, model
    width]: the dimension after the experts' that is not the model's `width` (its last where both are)."""
    layer = [size for size, name in zip(record.shape, record.logical or (), strict=False) if not is_stack_name(name)]
    first, last = layer[-2], layer[-1]
    return first if last == width and first != width else last


def is_stack_name(name: str | None) -> bool:
    """A logical dimension that stacks layers: a scan's (`layers`, `moe_layers`, …) or a pipeline's repeats
    (`circular_repeats`: MaxText's pipelined layout is [repeats, stages, …])."""
    return name is not None and (name in ("layers", "circular_repeats") or name.endswith("_layers"))


def expert_dim(record: TensorRecord) -> int:
    """The experts' dimension of a routed expert weight: its first (a scanned stack's [experts, layers, …]),
    after the leading stack dimensions of MaxText's pipelined layout ([repeats, stages, experts, …])."""
    logical = record.logical or ()
    leading = 0
    while leading < len(logical) and is_stack_name(logical[leading]):
        leading += 1
    return leading


def tensor_record(
    kind: str, shape: Sequence[int], dtype: Any, logical: Sequence[str | None] | None, spec: Spec, mesh: dict[str, int]
) -> TensorRecord:
    """A tensor's record, with its per-device shard shape and bytes (ceil division: XLA pads uneven shards)."""
    local = shard_shape(shape, spec, mesh)
    name, itemsize = dtype_name_and_size(dtype)
    return TensorRecord(
        kind=kind,
        shape=tuple(int(d) for d in shape),
        dtype=name,
        logical=tuple(logical) if logical is not None else None,
        spec=spec,
        shard_shape=local,
        bytes_per_device=math.prod(local) * itemsize,
    )


def dtype_name_and_size(dtype: Any) -> tuple[str, int]:
    """A dtype's name and bytes per element, numpy's or JAX's extended ones (a typed PRNG key, `key<fry>`,
    which a train state holding its own RNG carries: numpy does not know it, JAX gives its size)."""
    import ml_dtypes  # noqa: F401  # lazy: registers bfloat16 and the float8 types with numpy
    import numpy as np

    try:
        numpy_dtype = np.dtype(dtype)
    except TypeError:
        return str(dtype), int(dtype.itemsize)
    return str(numpy_dtype), numpy_dtype.itemsize


def case_record(case: Case) -> CaseRecord:
    """The case header a plan of a resolved case carries."""
    return CaseRecord(
        model=case.model_name,
        preset=case.preset.name,
        topology=case.topology.name,
        mesh=case.mesh,
        axis_types=case.axis_types,
        overrides=case.overrides,
        preset_source=case.preset.source,
    )


def axes_label(row: CollectiveRow) -> str:
    """ "fsdp+expert", "(single device)" for singleton groups, or a summary of device groups that match no
    mesh axes (the whole list, which can run to thousands of characters, stays in the plan JSON)."""
    if row.axes is None:
        return groups_summary(row.groups) if row.groups else "(unmatched)"
    return "+".join(row.axes) if row.axes else "(single device)"


def axes_with_marks(row: CollectiveRow) -> str:
    """`axes_label` with what a table of rows says beside it: a permute's shift, a hand-off (nothing hides
    it, see the expected step), a CPU program's all-reduce the TPU sums once after its loop, and on a GPU
    cluster whether it stays in an NVLink domain or crosses the network."""
    marks = f" shift {row.shift:+d}" if row.shift is not None else ""
    marks += " (hand-off)" if row.handoff else ""
    marks += " (TPU: once, after the loop)" if row.tpu_moved_out is not None else ""
    marks += {"nvlink": " (NVLink)", "network": " (network)"}.get(row.link or "", "")
    return axes_label(row) + marks


def groups_summary(groups: str) -> str:
    """A short description of device groups that match no mesh axes.

    "{{0,1},{2,3}}" → "groups: 2 × 2 devices"; "{0->1,1->2,2->0}" → "groups: 3 pairs, shift +1, -2" (the
    commonest shifts; a ring's wrap-around pair is the second).
    """
    if "->" in groups:
        pairs = [tuple(int(n) for n in _NUMBER.findall(pair)) for pair in groups.strip("{}").split(",") if pair]
        shifts = Counter(target - source for source, target in pairs if len((source, target)) == 2)
        common = ", ".join(f"{shift:+d}" for shift, _ in shifts.most_common(2))
        more = f" and {len(shifts) - 2} more" if len(shifts) > 2 else ""
        return f"groups: {len(pairs)} pairs, shift {common}{more}"
    members = [len(_NUMBER.findall(group)) for group in re.findall(r"\{([^{}]*)\}", groups)]
    sizes = Counter(members)
    if len(sizes) == 1:
        (size, count), *_ = sizes.items()
        return f"groups: {count} × {size} devices"
    return f"groups: {len(members)} of {min(members)}–{max(members)} devices"
