"""What a plan's tensors are to the prediction, read from their kinds, logical axes, shapes and placements.

Never from the names in their paths: any program is priced alike, whatever it calls its modules and
parameters. Paths are read for their structure only: the activations an attention or MoE block records
lie in the module of its weights (`activations/<module>/…` beside `params/<module>/…`), and a layer's in
the first two parts of the module path (the stack's). A program may record its activations apart from its
weights, in modules of no weight's path (MaxText's are named after its layers' classes, one module for
every layer of a class: `activations/moe/…` for `params/decoder/…/MoeBlock_0/…`); such a module is paired
with a block by what it records (`paired_module`), and its activations run in the layers whose weights
their shapes match (`sharing_blocks`).

- the token ids: the integer input whose logical axes are (batch, length) (`token_ids`);
- the lookup table: the parameter [vocab, model width] (`plan.records.is_lookup_table`);
- an attention block: the module of the weights with head dimensions (`q_heads`, `kv_heads`, `heads`),
  whose query [batch, length, query heads, query head size], key [… key heads, query head size] and value
  [… key heads, value head size] are the activations laid out on the key/value heads (`activation_kv_heads`)
  with the head counts and sizes its weights give: the query projection's heads and head size, the key
  projection's heads, the output projection's head size;
- a block's input: the activation [batch, length, model width] it records;
- an expert weight's layout in the MoE body: the activation of the weight's own per-layer shape, recorded in
  its module (or in a module of no weight's path), that splits each dimension on axes the stored weight
  splits it on too; the MoE block's other activations lie beside it;
- the residual stream entering a layer: its activations on `activation_embed`;
- a sequence-parallel axis: a token axis that also splits the features of the layers' activations
  (`sequence_parallel_axes`): inside the layers it splits the weights, not the tokens;
- the name a projection's output carries for the remat policies, by its logical axes (`CHECKPOINTS`).

Where several tensors fit a role they have the same logical axes and shape, so the same placement, and any
of them gives the same numbers: the one chosen is the least by its record, then the first in the plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shardscope.case.rules import SpecEntry, entry_axes
from shardscope.plan.document import Plan
from shardscope.plan.records import TensorRecord, is_lookup_table, is_routed_expert, is_stack_name, model_width

Named = tuple[str, TensorRecord]

# The names MaxText's layers give a projection's output (`checkpoint_name`), which the remat policies keep
# or recompute, by the projection's logical axes (stack dimensions left out). Where a block has several
# projections of the same axes (the key and value projections, an MLP's two input projections), they are
# the same matmul on the same input, and each takes the next name.
CHECKPOINTS: dict[tuple[str | None, ...], tuple[str, ...]] = {
    ("embed", "q_heads", "kv"): ("query_proj",),
    ("embed", "kv_heads", "kv_head_dim"): ("key_proj", "value_proj"),
    ("heads", "kv", "embed"): ("out_proj",),
    ("embed", "mlp"): ("mlpwi_0", "mlpwi_1"),
    ("mlp", "embed"): ("mlpwo",),
    ("embed", "q_lora_up_proj"): ("query_wa_proj",),
    ("embed", "kv_lora_up_proj"): ("kv_wa_proj",),
}
_HEADS = ("q_heads", "kv_heads", "heads")
_RESIDUAL = "activation_embed"  # the residual stream's width (MaxText's rule for it)

# The activations by module of the last plan read (a prediction reads them once per weight), and the
# modules paired with weight modules (`paired_module`).
_INDEX: list[tuple[tuple[Named, ...], dict[str, list[Named]]]] = []
_PAIRS: list[tuple[tuple[Named, ...], dict[str, str]]] = []


def layer_logical(record: TensorRecord) -> tuple[str | None, ...]:
    """The record's logical axes without its stack dimensions (() without logical axes)."""
    return tuple(name for name in record.logical or () if not is_stack_name(name))


def module_of(path: str) -> str:
    """The module a tensor lies in: its path without its kind (the first part) and its leaf."""
    return path.split("/", 1)[-1].rsplit("/", 1)[0]


def _index(plan: Plan) -> dict[str, list[Named]]:
    """Activation module → its activations, in the plan's order (the last plan's, kept)."""
    if not _INDEX or _INDEX[0][0] is not plan.tensors:
        index: dict[str, list[Named]] = {}
        for path, record in plan.tensors:
            if record.kind == "activation":
                index.setdefault(module_of(path), []).append((path, record))
        _INDEX[:] = [(plan.tensors, index)]
    return _INDEX[0][1]


def recorded_in(plan: Plan, module: str) -> list[Named]:
    """The activations recorded in `module` itself (not in its submodules), in the plan's order; for a
    module that records none, those of the module of no weight's path paired with it (`paired_module`)."""
    found = _index(plan).get(module, [])
    if found:
        return found
    paired = paired_module(plan, module)
    return _index(plan).get(paired, []) if paired is not None else []


def unplaced_modules(plan: Plan) -> tuple[str, ...]:
    """The activation modules that lie on no weight's path (neither a weight's module, nor above or below
    one), sorted: a program that records its activations apart from its weights."""
    weights = {module_of(path) for path, record in plan.tensors if record.kind == "param"}

    def related(module: str) -> bool:
        return any(w == module or w.startswith(module + "/") or module.startswith(w + "/") for w in weights)

    return tuple(sorted(module for module in _index(plan) if not related(module)))


def paired_module(plan: Plan, module: str) -> str | None:
    """The module of no weight's path that records the activations of weight module `module`: of an
    attention block, the one that records its query, key and value (`attention_blocks`); of an expert
    weight's, the one that records the weight's layout in the MoE body (`expert_layout`). None: neither."""
    return _pairs_of(plan).get(module)


def sharing_blocks(plan: Plan, path: str, record: TensorRecord) -> tuple[str, ...]:
    """The weight modules in whose layers an activation of a module of no weight's path (`unplaced_modules`)
    runs, once per layer of each: those paired with its module (`paired_module`); else, by its dimensions
    besides batch and length (its features): with only the model's width, the residual stream's, every
    attention block (one per layer); with others, every block (a weight module's parent) with a weight
    whose per-layer shape holds them in a row; without features (the loss's per-token values), none."""
    module = module_of(path)
    paired = tuple(sorted(weights for weights, found in _pairs_of(plan).items() if found == module))
    if paired:
        return paired
    features = tuple(
        size
        for size, name in zip(record.shape, record.logical or (), strict=False)
        if not any(word in (name or "") for word in ("batch", "length"))
    )
    params = [(p, r) for p, r in plan.tensors if r.kind == "param"]
    if not features or record.logical is None:
        return ()
    if features == (model_width(params),):
        return tuple(sorted(attention_modules(params)))
    blocks = set()
    for weight_path, weight in params:
        shape = tuple(size for size, _, name in _dims(weight) if not is_stack_name(name))
        runs = {shape[i : i + len(features)] for i in range(len(shape) - len(features) + 1)}
        if len(shape) > 1 and not is_lookup_table(weight) and features in runs:
            blocks.add(module_of(weight_path).rsplit("/", 1)[0])
    return tuple(sorted(blocks))


def _pairs_of(plan: Plan) -> dict[str, str]:
    if not _PAIRS or _PAIRS[0][0] is not plan.tensors:
        _PAIRS[:] = [(plan.tensors, _pairs(plan))]
    return _PAIRS[0][1]


def _pairs(plan: Plan) -> dict[str, str]:
    pairs: dict[str, str] = {}
    unplaced = unplaced_modules(plan)
    if not unplaced:
        return pairs
    params = [(path, r) for path, r in plan.tensors if r.kind == "param"]
    for module in sorted(attention_modules(params)):
        shapes = _attention_shapes([r for path, r in params if module_of(path).startswith(module + "/")])
        found = next((m for m in unplaced if shapes is not None and _attention_in(_laid(plan, m), shapes)), None)
        if found is not None:
            pairs[module] = found
    for path, record in params:
        if is_routed_expert(path, record) and module_of(path) not in pairs:
            found = next((m for m in unplaced if _layout_in(_index(plan)[m], record) is not None), None)
            if found is not None:
                pairs[module_of(path)] = found
    return pairs


def chosen(candidates: Iterable[Named]) -> Named | None:
    """One of tensors that fit a role: the least by record (dtype, placement, logical axes), then the first."""
    found = list(candidates)
    if not found:
        return None
    return min(found, key=lambda named: (named[1].dtype, repr(named[1].spec), repr(named[1].logical)))


def token_ids(plan: Plan) -> TensorRecord | None:
    """The token ids: the integer input [batch, length] (the targets, when the plan records them too, are
    placed alike)."""
    found = chosen(
        (path, record)
        for path, record in plan.tensors
        if record.kind == "input"
        and record.dtype.startswith(("int", "uint"))
        and record.logical is not None
        and len(record.logical) == 2
        and "batch" in (record.logical[0] or "")
        and "length" in (record.logical[1] or "")
    )
    return found[1] if found is not None else None


def sequence_parallel_axes(plan: Plan, tokens: tuple[str, ...]) -> tuple[str, ...]:
    """The token axes (`token_axes`) that also split the features of the layers' activations [batch, length,
    …] (their heads, head sizes or hidden features; experts aside), in mesh order: MaxText's
    `tensor_sequence` splits the residual stream's length and, inside the layers, their heads and MLP
    features. The layers run on the tokens gathered over such an axis, with their weights kept split on it
    (tensor parallelism): their matmuls' partial outputs are summed over it, their weights neither gathered
    nor their gradients summed over it."""
    found: set[str] = set()
    for _, record in plan.tensors:
        if record.kind != "activation" or record.logical is None or len(record.shape) < 3:
            continue
        if not tokens_first(record):
            continue
        for name, entry in list(zip(record.logical, record.spec, strict=False))[2:]:
            if name is not None and "exp" not in name:
                found.update(entry_axes(entry))
    return tuple(axis for axis in tokens if axis in found)


def layer_tokens(plan: Plan, tokens: int, sequence_parallel: tuple[str, ...]) -> int:
    """Tokens a device holds inside the layers: the token ids' shard, gathered over the sequence-parallel
    axes that split the ids (`sequence_parallel_axes`)."""
    ids = token_ids(plan)
    split = {axis for entry in (ids.spec if ids is not None else ()) for axis in entry_axes(entry)}
    return tokens * math.prod(size for axis, size in plan.case.mesh if axis in sequence_parallel and axis in split)


def lookup_table(plan: Plan) -> Named | None:
    """The token embedding's table [vocab, model width], the first in the plan."""
    return next(((path, record) for path, record in plan.tensors if is_lookup_table(record)), None)


def tokens_first(record: TensorRecord) -> bool:
    """Whether an activation's first two dimensions are its batch and length."""
    logical = record.logical or ()
    return len(logical) >= 2 and "batch" in (logical[0] or "") and "length" in (logical[1] or "")


def block_input(plan: Plan, module: str, width: int) -> Named | None:
    """A block's input as it records it: an activation [batch, length, `width`] in `module`."""
    return chosen(
        (path, record)
        for path, record in recorded_in(plan, module)
        if len(record.shape) == 3 and tokens_first(record) and record.shape[-1] == width
    )


def residual_stream(plan: Plan, stack: str) -> TensorRecord | None:
    """The residual stream of the layers of `stack` (the first two parts of their modules' paths): an
    activation [batch, length, model width] it records on `activation_embed`; where the stack records none
    and the program records its activations apart from its weights, one of those (every layer's residual
    stream is placed alike)."""

    def fitting(recorded: Iterable[Named]) -> Named | None:
        return chosen(
            (path, record)
            for path, record in recorded
            if len(record.shape) == 3 and tokens_first(record) and (record.logical or ())[-1] == _RESIDUAL
        )

    found = fitting(recorded_in(plan, stack))
    if found is None:
        found = fitting(named for module in unplaced_modules(plan) for named in _index(plan)[module])
    return found[1] if found is not None else None


def embed_width(record: TensorRecord) -> int | None:
    """The size of a weight's model-width dimension (its logical name contains `embed`)."""
    for name, size in zip(record.logical or (), record.shape, strict=False):
        if name is not None and "embed" in name:
            return size
    return None


def expert_layout(plan: Plan, module: str, record: TensorRecord) -> TensorRecord | None:
    """The layout the MoE body uses an expert weight (of `module`) in: an activation of the weight's
    per-layer shape recorded in its module (the body's constraint on it, no logical axes), whose spec splits
    each dimension on axes the stored weight splits it on too."""
    found = _layout_in(recorded_in(plan, module), record)
    return found[1] if found is not None else None


def _layout_in(recorded: Sequence[Named], record: TensorRecord) -> Named | None:
    """The expert weight's layout among `recorded` (see `expert_layout`)."""
    per_layer = [(size, entry) for size, entry, name in _dims(record) if not is_stack_name(name)]
    shape = tuple(size for size, _ in per_layer)

    def fits(placed: TensorRecord) -> bool:
        return placed.shape == shape and all(
            set(entry_axes(entry)) <= set(entry_axes(stored))
            for entry, (_, stored) in zip(placed.spec, per_layer, strict=False)
        )

    return chosen((path, placed) for path, placed in recorded if placed.logical is None and fits(placed))


def _dims(record: TensorRecord) -> list[tuple[int, SpecEntry, str | None]]:
    logical: Sequence[str | None] = record.logical or (None,) * len(record.shape)
    return list(zip(record.shape, record.spec, logical, strict=False))


def checkpoint_names(weights: Sequence[Named]) -> dict[str, str]:
    """Parameter path → the name its matmul's output carries for the remat policies (`CHECKPOINTS`), for
    the projections of `weights` (the routed experts' left out: named inside the MoE body, not here)."""
    names: dict[str, str] = {}
    taken: dict[tuple[str, tuple[str | None, ...]], int] = {}
    for path, record in weights:
        logical = layer_logical(record)
        candidates = CHECKPOINTS.get(logical)
        if candidates is None:
            continue
        # The projection's module's parent: the block whose projections share the names.
        key = (module_of(path).rsplit("/", 1)[0], logical)
        index = taken.get(key, 0)
        taken[key] = index + 1
        if index < len(candidates):
            names[path] = candidates[index]
    return names


def attention_modules(weights: Sequence[Named]) -> set[str]:
    """The modules of the attention blocks: those of the weights with head dimensions (a block's
    projections lie in its submodules, `<block>/<projection>/kernel`)."""
    return {
        module_of(path).rsplit("/", 1)[0]
        for path, record in weights
        if record.kind == "param" and any(name in _HEADS for name in layer_logical(record))
    }


@dataclass(frozen=True)
class Attention:
    """One attention block's activations, as its weights' head counts and sizes pick them."""

    module: str
    query: Named
    key: Named
    value: Named
    inputs: Named | None  # its input [batch, length, model width] where it records it


def _size_after(record: TensorRecord, name: str, offset: int) -> int | None:
    """The size of the layer dimension `offset` after the one named `name` (None without one)."""
    layer = [(size, logical) for size, _, logical in _dims(record) if not is_stack_name(logical)]
    names = [logical for _, logical in layer]
    if name not in names or names.index(name) + offset >= len(layer):
        return None
    return layer[names.index(name) + offset][0]


def _shaped(laid: list[Named], heads: tuple[int | None, int | None], *taken: Named | None) -> Named | None:
    """The activation of `laid` with these (heads, head size), another than those `taken` where several fit
    (the same numbers either way; the rows' causes name it)."""
    fitting = [named for named in laid if named[1].shape[2:] == heads]
    return chosen(named for named in fitting if named not in taken) or chosen(fitting)


def attention_blocks(plan: Plan, weights: Sequence[Named]) -> tuple[Attention, ...]:
    """Every attention block whose query, key and value the plan records (see the module doc), in module
    order."""
    blocks = []
    for module in sorted(attention_modules(weights)):
        inside = [record for path, record in weights if module_of(path).startswith(module + "/")]
        shapes = _attention_shapes(inside)
        found = _attention_in(_laid(plan, module, recorded_in(plan, module)), shapes) if shapes else None
        if shapes is None or found is None:
            continue
        width = embed_width(shapes.output)
        inputs = block_input(plan, module, width) if width is not None else None
        blocks.append(Attention(module, *found, inputs))
    return tuple(blocks)


@dataclass(frozen=True)
class _Shapes:
    """An attention block's (heads, head size) of its query, key and value, as its weights give them."""

    query: tuple[int | None, int | None]
    key: tuple[int | None, int | None]
    value: tuple[int | None, int | None]
    output: TensorRecord  # the output projection


def _attention_shapes(inside: Sequence[TensorRecord]) -> _Shapes | None:
    """The head counts and sizes of a block's weights `inside` (None: not all three projections)."""
    query_heads = next((r for r in inside if "q_heads" in (r.logical or ())), None)
    key_heads = next((r for r in inside if "kv_heads" in (r.logical or ())), None)
    output = next((r for r in inside if "heads" in (r.logical or ())), None)
    if query_heads is None or key_heads is None or output is None:
        return None
    heads, head_size = _size_after(query_heads, "q_heads", 0), _size_after(query_heads, "q_heads", 1)
    kv_heads, value_size = _size_after(key_heads, "kv_heads", 0), _size_after(output, "heads", 1)
    return _Shapes((heads, head_size), (kv_heads, head_size), (kv_heads, value_size), output)


def _laid(plan: Plan, module: str, recorded: Sequence[Named] | None = None) -> list[Named]:
    """The activations of `module` laid out on the key/value heads ([batch, length, heads, head size])."""
    return [
        (path, record)
        for path, record in (_index(plan).get(module, []) if recorded is None else recorded)
        if len(record.shape) == 4 and (record.logical or (None,))[2:3] == ("activation_kv_heads",)
    ]


def _attention_in(laid: list[Named], shapes: _Shapes) -> tuple[Named, Named, Named] | None:
    """The (query, key, value) of `shapes` among `laid`, None where one is missing."""
    key = _shaped(laid, shapes.key)
    query = _shaped(laid, shapes.query, key)
    value = _shaped(laid, shapes.value, key, query)
    return None if query is None or key is None or value is None else (query, key, value)
