"""Per-device HBM need of a plan, by category, against the generation's capacity.

A TPU compile's memory analysis is exact: the compiler's peak of live HBM (arguments, outputs that do not
reuse an argument's buffer, and the temporaries alive at that peak), with its padding and scheduling in it
(plans made before the peak was recorded, and plans with host offload, whose compiler peak counts host
buffers: arguments + outputs − aliased outputs + all temporaries, which over-states it); its categories are
the tensors the shardings give (params, optimizer state, inputs), what the compiler adds to the arguments
(padding to TPU tiles), outputs that do not reuse an argument's buffer, and temp (gradients, activations,
scratch). A CPU compiler's figures say nothing about a TPU (its temp buffers follow another schedule), so
there the need is estimated from the tensors: params, optimizer state, inputs, gradients (≈ the params'
bytes: one gradient per parameter, same dtype and sharding), and the activations alive when the backward
pass peaks (under the step's remat policy, see `activation_bytes`). Intermediates no sharding constraint
names (attention scores, MoE dispatch buffers, f32 copies, the compiler's scratch) are not in it, so it
understates the need: treat it as a floor, and compile for the TPU topology for the exact figure.
"""

from __future__ import annotations

import math
from collections import defaultdict

from shardscope.case.hardware import Hardware
from shardscope.plan.document import Plan
from shardscope.plan.estimate import ESTIMATED, EXACT, MemoryEstimate
from shardscope.plan.records import is_stack_name


def _kind_bytes(plan: Plan) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for _, tensor in plan.tensors:
        totals[tensor.kind] += tensor.bytes_per_device
    return totals


def layer_trips(plan: Plan) -> dict[str, int]:
    """Module path → layers of the scanned block it names (`decoder/moe_layers` → 58, say).

    A scanned block stacks its parameters along a dimension whose logical name is a layers axis (MaxText:
    `layers`, `dense_layers`, `moe_layers`); its size is the scan's trip count. The block is where the
    parameters of one such axis sit: the longest path prefix they share (read from the paths' structure,
    not from any module's name).
    """
    stacks: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
    for path, tensor in plan.tensors:
        if tensor.kind != "param" or not tensor.logical:
            continue
        # A pipelined stack (MaxText's layout: [circular_repeats, layers (stages), …]) stacks its layers over
        # both leading dimensions.
        names = [axis for axis in tensor.logical if axis is not None and is_stack_name(axis)]
        if names:
            stacked = math.prod(size for size, axis in zip(tensor.shape, tensor.logical, strict=False) if axis in names)
            stacks[names[-1]].append((path.split("/")[1:-1], stacked))
    trips: dict[str, int] = {}
    for members in stacks.values():
        prefix = members[0][0]
        for parts, _ in members[1:]:
            n = 0
            while n < min(len(prefix), len(parts)) and prefix[n] == parts[n]:
                n += 1
            prefix = prefix[:n]
        if prefix:
            block = "/".join(prefix)
            trips[block] = max(trips.get(block, 1), *(stacked for _, stacked in members))
    return trips


def _block_of(path: str, trips: dict[str, int]) -> str | None:
    """The scanned block an activation (`activations/decoder/moe_layers/x`) sits in, if any."""
    module = path.split("/", 1)[1].split("#", 1)[0]
    prefixes = [p for p in trips if module == p or module.startswith(p + "/")]
    return max(prefixes, key=len) if prefixes else None


def _layer_input(plan: Plan, block: str) -> int:
    """Bytes of a scanned block's layer input, as full remat keeps it: the residual stream entering the layer,
    an activation of the block itself (not of a module inside it) of the block's [batch, length, model width]
    (the largest such where they differ)."""
    found = 0
    for path, tensor in plan.tensors:
        module = path.split("/", 1)[1].split("#", 1)[0].rsplit("/", 1)[0] if "/" in path else ""
        if tensor.kind == "activation" and module == block and len(tensor.shape) == 3:
            found = max(found, tensor.bytes_per_device)
    return found


def remat_policy(plan: Plan) -> str:
    """How the step keeps activations for the backward pass: the reference models rematerialise each
    layer in full (MaxText's default `remat_policy`) unless the case sets `model.remat=none`."""
    return dict(plan.case.overrides).get("model.remat", "full")


def _layer_input_offloaded(plan: Plan) -> bool:
    overrides = dict(plan.case.overrides)
    custom = overrides.get("model.remat_custom", "").split(",")
    return overrides.get("model.remat") == "custom" and "decoder_layer_input:offload" in custom


def activation_bytes(plan: Plan) -> int:
    """Bytes of constrained activations alive per device at the peak of the backward pass.

    Without remat every layer keeps every activation: each one times the layers of its block. With full
    remat a layer keeps only its input (`<block>/inputs`) and recomputes the rest when its backward pass
    runs, so the peak is every layer's input plus one layer's activations (the largest block's). A custom
    policy that offloads the layer input (`decoder_layer_input=offload`) keeps it in host memory instead.
    """
    trips = layer_trips(plan)
    per_block: dict[str | None, int] = defaultdict(int)
    for path, tensor in plan.tensors:
        if tensor.kind != "activation":
            continue
        per_block[_block_of(path, trips)] += tensor.bytes_per_device
    kept_inputs = sum(_layer_input(plan, block) * trips[block] for block in per_block if block is not None)
    outside = per_block.pop(None, 0)
    if _layer_input_offloaded(plan):
        kept_inputs = 0
    if remat_policy(plan) == "none":
        return outside + sum(size * trips[block] for block, size in per_block.items() if block is not None)
    return outside + kept_inputs + max(per_block.values(), default=0)


def hbm_peak_bytes(memory: dict[str, int]) -> int | None:
    """The TPU compiler's peak of live HBM, when its figure is one.

    With host offload (`host_temp_bytes` recorded) the compiler's peak counts pinned-host buffers too: on
    every offloading plan compiled here it exceeds the chip's HBM although the compile was accepted (Mixtral
    8x22B on v6e: 78.5 GB against 34.4 GB, of which 75.2 GB host). There the HBM need is the static sum
    (arguments + outputs − aliased + temporaries, all HBM), which over-states the peak; None says so.
    """
    if memory.get("host_temp_bytes"):
        return None
    return memory.get("peak_bytes")


def memory_need(plan: Plan, hardware: Hardware, exact: bool = True) -> MemoryEstimate:
    """Per-device HBM need of a plan on `hardware`: exact from a TPU compile for it (unless `exact` is
    False: the compile was for another generation), else estimated from the tensors."""
    kinds = _kind_bytes(plan)
    memory = dict(plan.memory)
    backend = dict(plan.provenance).get("backend")
    capacity = hardware.hbm_bytes_per_device
    tensors = [
        ("params", kinds.get("param", 0)),
        ("optimizer_state", kinds.get("opt_state", 0)),
        ("inputs", kinds.get("input", 0)),
    ]
    if exact and backend == "tpu" and {"argument_bytes", "temp_bytes"} <= set(memory):
        arguments = memory["argument_bytes"]
        outputs = memory.get("output_bytes", 0) - memory.get("alias_bytes", 0)
        # With the compiler's peak, temporaries are what is alive beside the arguments and outputs at that
        # peak; without it (plans made before it was recorded), the whole temporaries figure.
        peak = hbm_peak_bytes(memory)
        temp = memory["temp_bytes"] if peak is None else max(0, peak - arguments - outputs)
        categories = [
            *tensors,
            ("argument_padding", arguments - sum(size for _, size in tensors)),
            ("outputs_not_aliased", outputs),
            ("compiler_temp" if peak is None else "temp_at_peak", temp),
        ]
        return MemoryEstimate(tuple(categories), capacity, EXACT)
    categories = [*tensors, ("gradients", kinds.get("param", 0)), ("activations", activation_bytes(plan))]
    return MemoryEstimate(tuple(categories), capacity, ESTIMATED)
