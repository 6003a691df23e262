"""Expected collectives of an HLO module, derived with XLA's own parser, independently of shardscope's reader.

XLA's parser (bundled with jaxlib: `xla_client.hlo.hlo_module_from_text`) decides what the computations and
instructions are, each instruction's opcode and operands, and prints each one in its canonical one-line
form (`to_string()`); everything here is read from those objects and lines, with numpy for device groups.
Nothing is imported from `shardscope.hlo`.

What it counts, per collective instruction instance reachable from the entry (a computation called from
two sites counts twice; a while body runs trip-count times, its condition once more; every conditional
branch counts): op, mesh axes (or the canonical spelling of groups that no axes induce), permute shift,
bytes per device (result; reduce-scatter: operand; an async start: its done's result; tuples summed) and
loop trips. Trip counts: the compiler's `known_trip_count`, else (jax loops count 0, 1, … to a bound)
the single integer constant bound in the condition minus the single integer constant start in the init
tuple; an oracle that cannot tell raises rather than guesses.

A truncated file (`truncated=True`, see `truncated_text`): with no entry read, every computation no other
calls is a root whose loop trips are unknown.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from typing import Any

import numpy as np

OPS = {
    "kAllGather": "all-gather",
    "kAllReduce": "all-reduce",
    "kReduceScatter": "reduce-scatter",
    "kAllToAll": "all-to-all",
    "kRaggedAllToAll": "ragged-all-to-all",
    "kCollectivePermute": "collective-permute",
    "kCollectiveBroadcast": "collective-broadcast",
    "kAllGatherStart": "all-gather",
    "kAllReduceStart": "all-reduce",
    "kCollectivePermuteStart": "collective-permute",
}
DONES = {"kAllGatherDone", "kAllReduceDone", "kCollectivePermuteDone", "kAsyncDone", "kAsyncUpdate"}
UNKNOWN = {"kSend": "send", "kRecv": "recv"}
BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4}
BYTES |= {"s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5}
_NAMED = re.compile(r"\b(calls|to_apply|condition|body|true_computation|false_computation|select|scatter)=%([\w.\-]+)")
_LISTED = re.compile(r"\b(branch_computations|called_computations)=\{([^}]*)\}")
_SHAPE = re.compile(r"^(?:ROOT )?%[\w.\-]+ = (.*?) [a-z][a-z0-9\-]*\(")
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_GROUPS = re.compile(
    r"replica_groups=(\{(?:\{[\d,]*\},?)*\}|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?"
    r"|mesh\[[^\]]*\](?:, device_ids=\((?:[^()]|\([^()]*\))*\))? \{[^}]*\})"
)
_PAIRS = re.compile(r"source_target_pairs=(\{(?:\{\d+,\d+\},?)*\})")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _parse(text: str) -> Any:
    from jax._src.lib import xla_client

    return xla_client.hlo.hlo_module_from_text(text)


def _iota(dims: list[int], perm: list[int] | None) -> np.ndarray:
    values = np.arange(int(np.prod(dims))).reshape(dims)
    return values.transpose(perm).reshape(-1) if perm else values.reshape(-1)


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def device_groups(spec: str) -> list[list[int]]:
    """Device groups of a replica-group spelling, expanded with numpy."""
    if spec.startswith("{"):
        return [_ints(g) for g in re.findall(r"\{([\d,]*)\}", spec[1:-1])]
    if spec.startswith("["):
        m = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", spec)
        assert m, spec
        shape = _ints(m.group(1))
        return _iota(_ints(m.group(2)), _ints(m.group(3)) if m.group(3) else None).reshape(shape).tolist()
    m = re.fullmatch(r"mesh\[([^\]]*)\](?:, device_ids=\((.*)\))? \{([^}]*)\}", spec)
    assert m, spec
    axes = [(name, int(size)) for name, size in re.findall(r"'([^']+)'=(\d+)", m.group(1))]
    sizes = [s for _, s in axes]
    if m.group(2):
        order = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", m.group(2))
        assert order, spec
        devices = _iota(_ints(order.group(1)), _ints(order.group(2)) if order.group(2) else None)
    else:
        devices = np.arange(int(np.prod(sizes)))
    grouped = [[n for n, _ in axes].index(name) for name in re.findall(r"'([^']+)'", m.group(3))]
    others = [i for i in range(len(axes)) if i not in grouped]
    size = int(np.prod([sizes[i] for i in grouped])) if grouped else 1
    return devices.reshape(sizes).transpose(others + grouped).reshape(-1, size).tolist()


def _partition(mesh: list[tuple[str, int]], axes: tuple[int, ...]) -> set[frozenset[int]]:
    ids = np.arange(int(np.prod([s for _, s in mesh]))).reshape([s for _, s in mesh])
    others = [i for i in range(len(mesh)) if i not in axes]
    size = int(np.prod([mesh[i][1] for i in axes])) if axes else 1
    return {frozenset(g) for g in ids.transpose(others + list(axes)).reshape(-1, size).tolist()}


def mesh_axes(groups: list[list[int]], mesh: list[tuple[str, int]]) -> tuple[str, ...] | None:
    """The fewest mesh axes whose variation induces exactly these groups ([] = all devices); None if none."""
    n = int(np.prod([s for _, s in mesh]))
    groups = groups or [list(range(n))]
    wanted = {frozenset(g) for g in groups}
    for k in range(len(mesh) + 1):
        for axes in itertools.combinations(range(len(mesh)), k):
            if _partition(mesh, axes) == wanted:
                return tuple(mesh[i][0] for i in axes if mesh[i][1] > 1)
    return None


def permute_shift(pairs: list[tuple[int, int]], mesh: list[tuple[str, int]]) -> tuple[tuple[str, ...], int] | None:
    """(axis, shift) of pairs that all move the same distance along one mesh axis; None otherwise."""
    shape = [s for _, s in mesh]
    moved = [(np.unravel_index(s, shape), np.unravel_index(t, shape)) for s, t in pairs if s != t]
    if not moved:
        return (), 0
    axes = {i for a, b in moved for i in range(len(shape)) if a[i] != b[i]}
    if len(axes) != 1 or len(moved) != len(pairs):
        return None
    (axis,) = axes
    shifts = {int(b[axis] - a[axis]) % shape[axis] for a, b in moved}
    if len(shifts) != 1:
        return None
    shift = shifts.pop()
    return (mesh[axis][0],), shift - shape[axis] if shift > shape[axis] // 2 else shift


def shape_bytes(line: str) -> int:
    m = _SHAPE.match(line)
    assert m, line
    shape = re.sub(r"/\*.*?\*/", "", m.group(1))
    total = 0.0
    for dtype, dims in _ARRAY.findall(shape):
        if dtype in ("token", "opaque"):
            continue
        total += BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
    return int(total)


def _callees(line: str) -> list[tuple[str, str]]:
    out = [(key, name) for key, name in _NAMED.findall(line)]
    for key, names in _LISTED.findall(line):
        out += [(key, n.strip().lstrip("%")) for n in names.split(",") if n.strip()]
    return out


def _trips(comps: dict[str, Any], computation: Any, loop: Any) -> int:
    line = loop.to_string()
    known = _TRIPS.search(line)
    if known:
        return int(known.group(1))
    condition = dict(_callees(line))["condition"]

    def constants(comp_name: str) -> list[int]:
        out = []
        for i in comps[comp_name].instructions():
            s = i.to_string()
            m = re.match(r"%[\w.\-]+ = [su]32\[\](?:\{[^}]*\})? constant\((-?\d+)\)", s)
            out += [int(m.group(1))] if m else []
            out += [c for _, callee in _callees(s) for c in constants(callee)]
        return out

    bounds = constants(condition)
    # The induction variable: the loop-state element the condition reads.
    read = {
        int(re.search(r"index=(\d+)", i.to_string()).group(1))
        for i in comps[condition].instructions()
        if str(i.opcode).endswith("kGetTupleElement")
    }
    init = loop.operands()[0]
    while str(init.opcode).endswith(("kCopy", "kBitcast")):
        init = init.operands()[0]
    if len(set(bounds)) != 1 or len(read) != 1 or not str(init.opcode).endswith("kTuple"):
        raise ValueError(f"trip count of {loop.name} is not plain: bounds {bounds}, elements read {read}")
    element = init.operands()[read.pop()]
    while str(element.opcode).endswith(("kCopy", "kConvert")):
        element = element.operands()[0]
    start = re.match(r"%[\w.\-]+ = [su]32\[\](?:\{[^}]*\})? constant\((-?\d+)\)", element.to_string())
    if start is None:
        raise ValueError(f"trip count of {loop.name} is not plain: the start is not a constant")
    return bounds[0] - int(start.group(1))


def truncated_text(text: str) -> str:
    """A truncated dump made parsable: its header reduced to name and devices (its aliases name outputs
    of an entry the text no longer has), and its unfinished last computation left out (XLA cannot parse
    half a computation). If that one holds no collective itself, the counts are unchanged: what it calls
    then is a root of its own, with unknown trips too."""
    header, _, rest = text.partition("\n")
    devices = re.search(r"num_partitions=\d+", header)
    last = max(m.start() for m in re.finditer(r"^(?:ENTRY )?%[\w.\-]+ .*\{$", rest, re.M))
    if re.search(r" (?:all-|reduce-scatter|collective-|ragged-)[a-z\-]*\(", rest[last:]):
        raise ValueError("the unfinished computation holds a collective: count it by hand")
    return f"HloModule truncated{', ' + devices.group() if devices else ''}\n" + rest[:last]


def expected(text: str, mesh: list[tuple[str, int]], truncated: bool = False) -> dict[str, Any]:
    """The expected collectives of a module: aggregated rows and per-op instance counts (see module doc)."""
    module = _parse(truncated_text(text) if truncated else text)
    comps = {c.name: c for c in module.computations()}
    entry = None if truncated else re.search(r"^ENTRY %([\w.\-]+)", module.to_string(), re.M).group(1)
    own: dict[str, list[dict[str, Any]]] = {}
    unknown: Counter[str] = Counter()
    calls: dict[str, list[tuple[str, int | None]]] = {}
    owner = {i.name: c.name for c in comps.values() for i in c.instructions()}
    for name, comp in comps.items():
        rows, edges = [], []
        instructions = list(comp.instructions())
        for i in instructions:
            opcode = str(i.opcode).split(".")[-1]
            line = i.to_string()
            if opcode in OPS:
                rows.append(_row(OPS[opcode], i, line, instructions, mesh))
            elif opcode in UNKNOWN:
                unknown[UNKNOWN[opcode]] += 1
            if opcode in DONES:
                continue
            if opcode == "kAsyncStart":  # XLA may print it as `<op>-start(…)`, without its `calls=`
                edges.append((owner[i.async_wrapped_root().name], 1))
                continue
            for key, callee in _callees(line):
                if opcode == "kWhile" and key in ("body", "condition"):
                    n = _trips(comps, comp, i)
                    edges.append((callee, n + (key == "condition")))
                else:
                    edges.append((callee, 1))
        own[name], calls[name] = rows, edges
    counted: Counter[tuple[Any, ...]] = Counter()

    def walk(name: str, trips: int | None) -> None:
        stack = [(name, trips)]
        while stack:
            comp, trips = stack.pop()
            for row in own[comp]:
                counted[(*row.values(), trips)] += 1
            stack += [(callee, None if trips is None else trips * n) for callee, n in calls[comp]]

    if entry is not None:
        walk(entry, 1)
    else:
        called = {callee for edges in calls.values() for callee, _ in edges}
        for name in comps:
            if name not in called:
                walk(name, None)
    rows = [
        {"op": op, "axes": None if axes is None else list(axes), "groups": groups, "shift": shift, "bytes": nbytes}
        | {"loop_trips": trips, "count": n}
        for (op, axes, groups, shift, nbytes, trips), n in counted.items()
    ]
    rows.sort(
        key=lambda r: (r["op"], str(r["axes"]), r["groups"] or "", r["shift"] or 0, r["bytes"], str(r["loop_trips"]))
    )
    per_op: Counter[str] = Counter()
    for r in rows:
        per_op[r["op"]] += r["count"]
    return {"rows": rows, "instances": dict(sorted(per_op.items())), "unknown": dict(sorted(unknown.items()))}


def _row(op: str, i: Any, line: str, instructions: list[Any], mesh: list[tuple[str, int]]) -> dict[str, Any]:
    done = next(
        (d for d in instructions if d.operands() and d.operands()[0].name == i.name and str(d.opcode).endswith("Done")),
        None,
    )
    nbytes = shape_bytes(done.to_string() if done is not None else line)
    axes: tuple[str, ...] | None
    shift = groups_text = None
    if op == "collective-permute":
        pairs = [tuple(_ints(p)) for p in re.findall(r"\{(\d+,\d+)\}", _PAIRS.search(line).group(1))]
        found = permute_shift(pairs, mesh)
        axes, shift = found if found else (None, None)
        if found is None:
            groups_text = "{" + ",".join(f"{s}->{t}" for s, t in sorted(pairs)) + "}"
    else:
        m = _GROUPS.search(line)
        groups = device_groups(m.group(1)) if m else []
        size = len(groups[0]) if groups else int(np.prod([s for _, s in mesh]))
        nbytes *= size if op == "reduce-scatter" else 1
        axes = mesh_axes(groups, mesh)
        if axes is None:
            groups_text = (
                "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in sorted(sorted(g) for g in groups)) + "}"
            )
    return {"op": op, "axes": axes, "groups": groups_text, "shift": shift, "bytes": nbytes}
