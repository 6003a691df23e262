"""The compiler's "involuntary full rematerialization" warnings, read from its captured stderr.

XLA's SPMD partitioner writes, for a tensor it cannot move between two shardings with collectives:

    W… spmd_partitioner.cc:656] [SPMD] Involuntary full rematerialization. The compiler cannot go from
    sharding {devices=[1,1,8]<=[8]} to {devices=[4,2,1]<=[8]} efficiently for HLO operation %gather =
    f32[8,32,8]{2,1,0} gather(…), …, metadata={op_name="jit(train_step)/jvp(Transformer)/token_embedder/gather"
    stack_frame_id=14}. As the last resort, SPMD will replicate the tensor …

Each becomes a `RematWarning`: the instruction, its shape, the Flax module and pass (from `op_name`), and the
two shardings translated to mesh axes (`P(('fsdp', 'expert'), None)`), which is what the warning lacks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from shardscope.hlo.groups import MeshLayout, expand_iota_groups, groups_to_axes
from shardscope.hlo.metadata import matching_bracket, module_path, pass_of
from shardscope.lint.context import LintContext
from shardscope.plan.findings import Finding

_MARKER = "Involuntary full rematerialization"
_FROM = "cannot go from sharding "
_INSTRUCTION = re.compile(r"for HLO operation %([\w.\-]+) = ([a-z]\w*\[[\d,]*\]|\([^)]*\))[^ ]* ([\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TILES = re.compile(r"devices=\[([\d,]+)\]")


@dataclass(frozen=True)
class RematWarning:
    """One involuntary rematerialisation the compiler reported."""

    instruction: str  # HLO instruction name, e.g. "gather.3" (compiler-numbered: not for plans)
    opcode: str  # e.g. "gather", "parameter", "get-tuple-element"
    shape: str  # e.g. "f32[8,32,8]"
    source: str  # Flax module path from op_name ("" when the instruction has no metadata)
    pass_: str  # forward / backward / optimizer / other ("" without metadata)
    from_sharding: str  # as XLA spells it
    to_sharding: str


def _sharding_at(text: str, start: int) -> tuple[str, int]:
    end = matching_bracket(text, start)
    return text[start : end + 1], end + 1


def parse_remat_warnings(log: str) -> tuple[RematWarning, ...]:
    """Every involuntary-rematerialisation warning in a captured compiler log, in order, repeats dropped.

    The partitioner may report one tensor twice, once without metadata (from a helper computation) and
    once with: the one without is dropped when the other has its shape and both shardings.
    """
    found: dict[RematWarning, None] = {}
    for line in log.splitlines():
        if _MARKER not in line or _FROM not in line:
            continue
        start = line.index(_FROM) + len(_FROM)
        if line[start : start + 1] != "{":
            continue
        source_sharding, after = _sharding_at(line, start)
        target_at = line.find("{", after)
        if target_at < 0 or line[after:target_at].strip() != "to":
            continue
        target_sharding, after = _sharding_at(line, target_at)
        instruction = _INSTRUCTION.search(line, after)
        op_name = _OP_NAME.search(line, after)
        name = op_name.group(1) if op_name else ""
        warning = RematWarning(
            instruction=instruction.group(1) if instruction else "?",
            opcode=instruction.group(3) if instruction else "?",
            shape=instruction.group(2) if instruction else "?",
            source=module_path(name) if name else "",
            pass_=pass_of(name) if name else "",
            from_sharding=source_sharding,
            to_sharding=target_sharding,
        )
        found[warning] = None
    placed = {(w.shape, w.from_sharding, w.to_sharding) for w in found if w.source}
    return tuple(w for w in found if w.source or (w.shape, w.from_sharding, w.to_sharding) not in placed)


def _tile_devices(sharding: str) -> tuple[list[int], list[int]] | None:
    """(tile dimensions, device ids in row-major tile order) of a tiled HLO sharding, or None."""
    match = _TILES.search(sharding)
    if not match:
        return None
    dims = [int(d) for d in match.group(1).split(",")]
    rest = sharding[match.end() :].strip()
    count = 1
    for d in dims:
        count *= d
    if rest.startswith("<="):
        iota = rest[2:].split(" ", 1)[0].rstrip("}")
        groups = expand_iota_groups(f"[{count},1]<={iota}")
        return dims, [g[0] for g in groups]
    ids = [int(t) for t in re.findall(r"\d+", rest.split(" ", 1)[0].split("}", 1)[0])]
    return (dims, ids) if len(ids) == count else None


def sharding_spec(sharding: str, mesh: Sequence[tuple[str, int]], rank: int) -> str:
    """An HLO sharding in mesh axes, as PartitionSpecs read: "P(None, ('fsdp', 'expert'))".

    Falls back to XLA's own spelling when the tiles match no mesh axes.
    """
    text = sharding.strip()
    if text in ("{replicated}", "{}"):
        return "P(" + ", ".join(["None"] * rank) + ")" if rank else "P()"
    tiles = _tile_devices(text)
    if tiles is None:
        return text
    dims, devices = tiles
    subgroups = 1 if "last_tile_dim_replicate" in text else 0
    listed = re.search(r"last_tile_dims=\{([^}]*)\}", text)
    if listed:
        subgroups = len([t for t in listed.group(1).split(",") if t.strip()])
    data_dims = dims[: len(dims) - subgroups]
    layout = MeshLayout(tuple(a for a, _ in mesh), tuple(s for _, s in mesh))
    if len(devices) != layout.num_devices or len(data_dims) != rank:
        return text
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    entries = []
    for axis, count in enumerate(data_dims):
        if count == 1:
            entries.append("None")
            continue
        groups: dict[tuple[int, ...], list[int]] = {}
        for position, device in enumerate(devices):
            coords = tuple((position // strides[i]) % dims[i] for i in range(len(dims)) if i != axis)
            groups.setdefault(coords, []).append(device)
        axes = groups_to_axes(list(groups.values()), layout)
        if axes is None:
            return text
        entries.append(repr(axes[0]) if len(axes) == 1 else "(" + ", ".join(map(repr, axes)) + ")")
    return "P(" + ", ".join(entries) + ")"


def _rank(shape: str) -> int:
    match = re.match(r"^[a-z]\w*\[([\d,]*)\]$", shape)
    if not match:
        return -1
    return len([d for d in match.group(1).split(",") if d])


def check_remat(ctx: LintContext) -> Iterator[Finding]:
    """`involuntary-remat`: the compiler's involuntary full rematerialisations, tied to their module."""
    if not ctx.compiler_log:
        return
    mesh = ctx.plan.case.mesh
    for warning in parse_remat_warnings(ctx.compiler_log):
        rank = _rank(warning.shape)
        before = sharding_spec(warning.from_sharding, mesh, rank)
        after = sharding_spec(warning.to_sharding, mesh, rank)
        where = f"{warning.source} ({warning.pass_} pass)" if warning.source else "(no source metadata)"
        yield Finding(
            "involuntary-remat",
            "warning",
            f"{warning.opcode} {warning.shape} at {where}",
            f"the compiler replicates this {warning.opcode} and partitions it again: it cannot go from "
            f"{before} to {after} with collectives (XLA: {warning.from_sharding} → {warning.to_sharding})",
            "make the two shardings agree: the rules for the tensors on either side, or a constraint between them",
        )
