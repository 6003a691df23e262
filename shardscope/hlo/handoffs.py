"""Collectives that hand one loop iteration's result to the next: they cannot be hidden behind compute.

A pipeline stage sends what it computed to the next stage at the end of every iteration (a
collective-permute), and the next iteration's matrix work starts from what it receives: the transfer sits
between the two iterations' compute, whatever the scheduler does. A collective is such a hand-off when, in a
loop body,
- its operand depends on matrix work of the same iteration (a dot, a convolution, a kernel, or a fusion,
  call or inner loop holding one), and
- its result reaches the body's result tuple without further matrix work, at an element that
  the next iteration feeds to matrix work (through anything but matrix work).
A weight gathered from the loop's invariant parameters fails the first test (it can be fetched ahead of
its use); a gradient reduced and stored in an accumulator fails the last (no next iteration's matrix work
waits for it). Collectives moving the loop state a pipeline only reads iterations later (MaxText's
`state_io` and circular storage) move values of the previous iteration and fail the first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from shardscope.hlo.executions import computation_instructions
from shardscope.hlo.loops import loop_bodies
from shardscope.hlo.records import (
    ASYNC_ENDS,
    COLLECTIVE_OPS,
    Instruction,
    Module,
    base_opcode,
    parameter_index,
    tuple_index,
)

__all__ = ["Handoffs"]

_MATRIX_OPS = frozenset({"dot", "convolution"})
_KERNEL_TARGET = "tpu_custom_call"  # a Pallas kernel of a TPU program (attention, grouped matmul)
# Matrix work in a computation's text (an opcode is followed by its operands' parenthesis; a name is not).
_MATRIX_TEXT = re.compile(rf' (?:dot|convolution)\(|custom_call_target="{_KERNEL_TARGET}"')
# The computations a computation's instructions call (a reducer, `to_apply`, is no matrix work).
_CALLED_TEXT = re.compile(
    r"\b(?:calls|body|condition|true_computation|false_computation|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)"
)
_COMPUTATION_NAME = re.compile(r"%?([A-Za-z_][\w.\-]*)")


class Handoffs:
    """Answers, per loop body of a module, which of its collective instructions are hand-offs (see the
    module doc); bodies are read once."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self._matrix: dict[str, bool] = {}
        self._bodies = loop_bodies(module)
        self._found: dict[str, frozenset[str]] = {}
        self._output_table: dict[str, list[tuple[frozenset[int], bool]] | None] = {}

    def of(self, computation: str) -> frozenset[str]:
        """Names of the hand-off collectives of `computation` (their start, for an async pair); empty for a
        computation that is no loop body."""
        if computation not in self._bodies:
            return frozenset()
        if computation not in self._found:
            self._found[computation] = self._handoffs(computation_instructions(self.module, computation))
        return self._found[computation]

    def _has_matrix(self, computation: str) -> bool:
        """Whether a computation (or one it calls) holds matrix work, read from its text: a fused computation
        is seldom worth reading instruction by instruction (most of a module's text is theirs)."""
        if computation not in self._matrix:
            self._matrix[computation] = False  # a call cycle (invalid HLO) reads as none
            found = self.module.by_name.get(computation)
            text = self.module.text[found.start : found.end] if found is not None else ""
            self._matrix[computation] = _MATRIX_TEXT.search(text) is not None or any(
                self._has_matrix(callee)
                for match in _CALLED_TEXT.finditer(text)
                for callee in _COMPUTATION_NAME.findall(match.group(1))
            )
        return self._matrix[computation]

    def _is_matrix(self, instruction: Instruction) -> bool:
        if instruction.opcode in _MATRIX_OPS:
            return True
        if instruction.opcode == "custom-call":
            return _KERNEL_TARGET in (instruction.attribute("custom_call_target") or "")
        return any(self._has_matrix(callee) for attribute, callee in instruction.callees() if attribute != "to_apply")

    def _outputs(self, instruction: Instruction) -> list[tuple[frozenset[int], bool]] | None:
        """For a fusion or call whose result is a tuple: each element's operand indices and whether matrix
        work makes it; None otherwise (its result then depends on all of it)."""
        callees = [c for attribute, c in instruction.callees() if attribute in ("calls", "to_apply")]
        if instruction.opcode not in ("fusion", "call") or len(callees) != 1:
            return None
        key = callees[0]
        if key not in self._output_table:
            body = computation_instructions(self.module, key)
            params: dict[str, frozenset[int]] = {}
            matrix: dict[str, bool] = {}
            for i in body:
                if i.opcode == "parameter":
                    params[i.name], matrix[i.name] = frozenset({parameter_index(i)}), False
                    continue
                params[i.name] = frozenset().union(*(params.get(o, frozenset()) for o in i.operands))
                matrix[i.name] = self._is_matrix(i) or any(matrix.get(o, False) for o in i.operands)
            root = next((i for i in body if i.is_root), body[-1] if body else None)
            self._output_table[key] = (
                [(params.get(o, frozenset()), matrix.get(o, False)) for o in root.operands]
                if root is not None and root.opcode == "tuple"
                else None
            )
        return self._output_table[key]

    def _handoffs(self, instructions: Sequence[Instruction]) -> frozenset[str]:
        if not instructions:
            return frozenset()
        by_name = {i.name: i for i in instructions}
        root = next((i for i in instructions if i.is_root), instructions[-1])
        parameter = next((i for i in instructions if i.opcode == "parameter"), None)
        # Each value's sources (the values it is computed from) and whether matrix work makes it; an element
        # of a fusion's tuple result depends on the operands its own element of the fused body reads.
        sources: dict[str, tuple[str, ...]] = {}
        own: dict[str, bool] = {}
        element: dict[str, int] = {}  # loop state element a `get-tuple-element` of the parameter reads
        for i in instructions:
            producer = by_name.get(i.operands[0]) if i.opcode == "get-tuple-element" and i.operands else None
            index = tuple_index(i)
            if producer is not None and producer is parameter and index is not None:
                sources[i.name], own[i.name], element[i.name] = (), False, index
                continue
            outputs = self._outputs(producer) if producer is not None else None
            if producer is not None and outputs is not None and index is not None and index < len(outputs):
                read, made = outputs[index]
                sources[i.name] = tuple(producer.operands[j] for j in sorted(read) if j < len(producer.operands))
                own[i.name] = made
                continue
            sources[i.name] = i.operands
            own[i.name] = i is not root and i.opcode != "parameter" and self._is_matrix(i)
        dependents: dict[str, list[str]] = {}
        for name, names in sources.items():
            for source in dict.fromkeys(names):
                dependents.setdefault(source, []).append(name)
        # In text order every operand comes before its user.
        after_matrix: set[str] = set()
        carried: dict[str, frozenset[int]] = {}
        for i in instructions:
            inputs = sources[i.name]
            if own[i.name] or any(r in after_matrix for r in inputs):
                after_matrix.add(i.name)
            if i.name in element:
                carried[i.name] = frozenset({element[i.name]})
            elif not own[i.name]:
                carried[i.name] = frozenset().union(*(carried.get(r, frozenset()) for r in inputs))

        matrix_work = {name for name, made in own.items() if made}

        def elements_reached(value: str) -> set[int]:
            """The result tuple's elements `value` reaches without matrix work."""
            indices: set[int] = set()
            seen, pending = {value}, [value]
            while pending:
                name = pending.pop()
                for user in dependents.get(name, []):
                    if user == root.name:
                        indices |= {k for k, o in enumerate(root.operands) if o == name}
                    elif not own[user] and user not in seen:
                        seen.add(user)
                        pending.append(user)
            return indices

        def waits_for(value: str) -> bool:
            """Whether all of the iteration's matrix work depends on `value`: nothing could hide its arrival."""
            seen, pending = {value}, [value]
            while pending:
                for user in dependents.get(pending.pop(), []):
                    if user not in seen and user != root.name:
                        seen.add(user)
                        pending.append(user)
            return bool(matrix_work) and matrix_work <= seen

        fed = {k for name, k in element.items() if waits_for(name)}
        produced = {k for k, o in enumerate(root.operands) if o in after_matrix} if root.opcode == "tuple" else set()
        starts = {i.operands[0]: i.name for i in instructions if i.opcode.endswith(ASYNC_ENDS) and i.operands}
        handoffs = set()
        for i in instructions:
            if base_opcode(i.opcode) not in COLLECTIVE_OPS or i.opcode.endswith(ASYNC_ENDS):
                continue
            result = i.name
            while result in starts:  # an async pair: the value arrives at its done
                result = starts[result]
            # At the end of the iteration: what its matrix work made, which all of the next iteration's waits
            # for; or at the start: what the last iteration's matrix work made, which all of this one's waits for.
            at_end = any(r in after_matrix for r in sources[i.name]) and bool(elements_reached(result) & fed)
            at_start = any(carried.get(r, frozenset()) & produced for r in sources[i.name]) and waits_for(result)
            if at_end or at_start:
                handoffs.add(i.name)
        return frozenset(handoffs)
