"""What a CPU program writes out that the TPU's matmuls do inside themselves.

XLA's CPU compiler runs a bfloat16 matmul in float32 and in the layout its matmul library wants: before it,
the operands are converted (and transposed, copied, broadcast) into new buffers; after it, the result is
converted back and laid out for its users, each step an op of its own that writes its whole result to
memory. The TPU compiler fuses such conversions and relayouts into the matmul: the matrix unit reads the
bfloat16 operand where it lies and writes the result in the type and layout asked for. On TPU compiles
of the same small steps these ops move 0-3 GB where the CPU program's move 45-97 GB (Llama 2 7B, DeepSeek2
16B, Mixtral 8x7B, two layers each); they are what `conversions_into_matmuls` finds.

The TPU compiler also computes an elementwise op that only feeds matmuls (a gated MLP's `silu(x) · y`
and its gradient) inside the matmul's fusion, as it reads the operand: `producers_into_matmuls` finds
those. With both, and the values narrowed to the bytes the TPU holds (`shardscope.hlo.narrowing`), a
TPU compile's bytes of ops without matrix work are 0.53-0.83 of the CPU compile's on the published Mixtral
runs and 0.82-1.01 on the DeepSeek ones (0.16-0.27 and 0.40-0.56 with conversions left out only).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from shardscope.hlo.executions import Program
from shardscope.hlo.kinds import WorkKind
from shardscope.hlo.records import Instruction

__all__ = ["conversions_into_matmuls", "fused_opcodes"]

# What an op may do and still only convert or lay out its data: the TPU's matmul does it as it reads or
# writes. A fusion is such an op when every op it runs is one of these (its parameters and tuples aside).
_CONVERSION_OPS = frozenset({"convert", "copy", "transpose", "bitcast", "reshape", "broadcast", "bitcast-convert"})
_PLUMBING = frozenset({"parameter", "constant", "tuple", "get-tuple-element"})
# Ops that only name another value (a view of it, an element of a tuple): seen through.
_VIEWS = frozenset({"bitcast", "get-tuple-element"})
# Kinds of op (`shardscope.hlo.profile`) whose inputs and results a TPU converts and lays out itself. (A
# scatter the CPU compiler expanded into a loop is a `while`: never a conversion.)
_MATRIX_KINDS = frozenset({WorkKind.MATMUL, WorkKind.GROUPED, WorkKind.KERNEL})
# Kinds of op that are XLA's own matmuls in a compiled reference model (the grouped experts' too: the
# reference models run them as dots, named for the kernel's pricing), which a TPU fuses producers into.
_XLA_MATMULS = frozenset({WorkKind.MATMUL, WorkKind.GROUPED})


def fused_opcodes(program: Program, instruction: Instruction) -> set[str]:
    """The ops an instruction runs: itself, or every op of a fusion's computations."""
    if instruction.opcode != "fusion":
        return {instruction.opcode}
    opcodes: set[str] = set()
    pending = [callee for attribute, callee in instruction.callees() if attribute == "calls"]
    while pending:
        for inner in program.instructions(pending.pop()):
            opcodes.add(inner.opcode)
            pending += [callee for attribute, callee in inner.callees() if attribute == "calls"]
    return opcodes - _PLUMBING


def _through_views(
    instructions: Sequence[Instruction],
) -> tuple[Callable[[str], str], Mapping[str, set[str]]]:
    """(source, readers) of one computation's values: the value a name is a view of (itself unless a
    bitcast or a tuple's element), and each value's readers other than views, seen through them."""
    by_name = {i.name: i for i in instructions}

    def source(value: str) -> str:
        for _ in range(64):
            producer = by_name.get(value)
            if producer is None or producer.opcode not in _VIEWS or not producer.operands:
                break
            value = producer.operands[0]
        return value

    readers: dict[str, set[str]] = defaultdict(set)
    for instruction in instructions:
        if instruction.opcode not in _VIEWS:
            for operand in instruction.operands:
                readers[source(operand)].add(instruction.name)
    return source, readers


def conversions_into_matmuls(
    program: Program, instructions: Sequence[Instruction], kinds: Mapping[str, WorkKind]
) -> set[str]:
    """The ops of one computation (`kinds`: each op's kind by name) that only convert or lay out data and
    either read a matrix op's result (directly or through other such ops) or are read by matrix ops only:
    a TPU compile has none of them."""
    by_name = {i.name: i for i in instructions}
    source, users = _through_views(instructions)
    candidates = {
        i.name
        for i in instructions
        if kinds.get(i.name) == WorkKind.MEMORY and (ops := fused_opcodes(program, i)) and ops <= _CONVERSION_OPS
    }
    matrix = {name for name, kind in kinds.items() if kind in _MATRIX_KINDS}
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name in candidates - found:
            reads_matrix = any(source(o) in matrix or source(o) in found for o in by_name[name].operands)
            read_by_matrix = bool(users[name]) and all(u in matrix or u in found for u in users[name])
            if reads_matrix or read_by_matrix:
                found.add(name)
                changed = True
    return found


_ELEMENTWISE_OPS = _CONVERSION_OPS | frozenset(
    {
        "add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs", "sign", "exponential",
        "exponential-minus-one", "log", "log-plus-one", "logistic", "tanh", "rsqrt", "sqrt", "power", "select",
        "compare", "and", "or", "not", "xor", "clamp", "iota", "sine", "cosine",
    }
)  # fmt: skip


def producers_into_matmuls(
    program: Program, instructions: Sequence[Instruction], kinds: Mapping[str, WorkKind], conversions: set[str]
) -> set[str]:
    """The elementwise ops of one computation that only feed XLA matmuls (`_XLA_MATMULS`), directly or through
    conversions into them (`conversions`: `conversions_into_matmuls`) or other such ops: the TPU computes
    them as the matmul reads its operand, writing none of their results (a kernel, a custom call, cannot
    take an op into itself)."""
    _, readers = _through_views(instructions)
    candidates = {
        i.name: readers[i.name]
        for i in instructions
        if kinds.get(i.name) == WorkKind.MEMORY
        and i.name not in conversions
        and (ops := fused_opcodes(program, i))
        and ops <= _ELEMENTWISE_OPS
    }
    into = {name for name, kind in kinds.items() if kind in _XLA_MATMULS} | conversions
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name in candidates.keys() - found:
            if candidates[name] and candidates[name] <= into | found:
                found.add(name)
                changed = True
    return found
