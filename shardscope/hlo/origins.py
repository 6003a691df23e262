"""What a collective moves: its operand followed back to the step's argument or to the op that computed it.

A compiled step names its arguments after their pytree paths (an entry parameter's op_name is
`state['params']['decoder']...`), and every op after the jax op that made it. So the value a collective
moves is found by walking its operand back through what only moves or re-types values (bitcasts, copies,
converts, transposes, slices, other collectives, tuples, loop and call boundaries, fusions whose root is
such a view) until an entry parameter (the collective moves that argument) or an op that computes (the
collective moves its result; that op's own operands are followed one level, so a sum over a sharded
contraction can name the sharded operand).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardscope.hlo.executions import computation_instructions
from shardscope.hlo.metadata import op_name_in
from shardscope.hlo.records import Instruction, Module, tuple_index

__all__ = ["Origin", "Origins", "op_name_of"]

# Ops whose result holds (some of) the elements of their first operand, unchanged or only re-typed.
_VIEWS = frozenset(
    {"bitcast", "bitcast-convert", "copy", "copy-start", "copy-done", "reshape", "transpose", "convert"}
    | {"broadcast", "slice", "dynamic-slice", "pad", "reverse", "optimization-barrier"}
    | {"all-gather", "all-gather-start", "all-gather-done", "all-to-all", "ragged-all-to-all"}
    | {"collective-permute", "collective-permute-start", "collective-permute-done", "collective-broadcast"}
    | {"reduce-scatter", "all-reduce", "all-reduce-start", "all-reduce-done", "async-start", "async-done"}
)
_PASS_THROUGH_CALLS = frozenset({"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost"})
_PASS_THROUGH_CALLS |= {"MoveToDevice", "annotate_device_placement"}
_TARGET_RE = re.compile(r'"([^"]*)"')
_MAX_STEPS = 400  # a walk longer than this is given up (a cycle through a malformed module)


@dataclass(frozen=True)
class Origin:
    """Where a value comes from.

    Attributes:
      kind: "parameter" (an argument of the step) or "op" (an op computed it).
      name: the argument's pytree path as jax spells it (`state['params']['decoder']`), or the op's op_name.
      opcode: "parameter", or the computing op's opcode (a fusion's: its root's).
      inputs: for an op, the origins of its operands (one level deep; constants left out).
    """

    kind: str
    name: str
    opcode: str
    inputs: tuple[Origin, ...] = ()


def op_name_of(instruction: Instruction) -> str:
    """The instruction's metadata op_name, unescaped ("" without one)."""
    return re.sub(r"\\(.)", r"\1", op_name_in(instruction.attribute("metadata")))


class _Table:
    def __init__(self, instructions: tuple[Instruction, ...]) -> None:
        self.by_name = {i.name: i for i in instructions}
        self.root = next((i for i in instructions if i.is_root), instructions[-1] if instructions else None)


# A walk's position: computation, instruction name, the tuple element path still to pick, and the call
# sites entered on the way (a parameter of a computation entered from a site is that site's operand).
_Frame = tuple[str, Instruction]


class Origins:
    """Answers, per collective instruction of a module, the origin of the value it moves."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self._tables: dict[str, _Table] = {}
        self._callers: dict[str, tuple[str, str]] = {}
        for comp in module.computations:
            for call in comp.calls:
                self._callers.setdefault(call.callee, (comp.name, call.site))

    def _table(self, computation: str) -> _Table:
        if computation not in self._tables:
            self._tables[computation] = _Table(computation_instructions(self.module, computation))
        return self._tables[computation]

    def of(self, computation: str, collective: Instruction) -> tuple[Origin, ...]:
        """The origins of what `collective` (an instruction of `computation`) moves, one per operand (a
        combined collective has several), repeats left out; an operand whose walk is lost (a constant, a
        conditional's branch, a module cut short) has none."""
        found = (self._walk(computation, operand, (), (), with_inputs=True) for operand in collective.operands)
        return tuple(dict.fromkeys(o for o in found if o is not None))

    def _walk(
        self, comp: str, name: str, pick: tuple[int, ...], sites: tuple[_Frame, ...], with_inputs: bool
    ) -> Origin | None:
        for _ in range(_MAX_STEPS):
            inst = self._table(comp).by_name.get(name)
            if inst is None:
                return None
            op = inst.opcode
            if op == "parameter":
                number = int(inst.operands[0]) if inst.operands and inst.operands[0].isdigit() else -1
                if sites:
                    (comp, site), sites = sites[-1], sites[:-1]
                    if site.opcode == "while":
                        number = 0  # a loop's body and condition take the loop's one (tuple) operand
                    if number >= len(site.operands):
                        return None
                    name = site.operands[number]
                    continue
                if comp == self.module.entry:
                    return None if pick else Origin("parameter", op_name_of(inst), "parameter")
                caller = self._callers.get(comp)
                if caller is None:
                    return None
                comp, site_name = caller
                site_inst = self._table(comp).by_name.get(site_name)
                if site_inst is None or site_inst.opcode == "conditional":
                    return None  # a branch takes the operand of its own index: not known from here
                if site_inst.opcode == "while":
                    number = 0
                if not 0 <= number < len(site_inst.operands):
                    return None
                name = site_inst.operands[number]
                continue
            if op == "get-tuple-element":
                index = tuple_index(inst)
                if not inst.operands or index is None:
                    return None
                name, pick = inst.operands[0], (index, *pick)
                continue
            if op == "tuple":
                if not pick or pick[0] >= len(inst.operands):
                    return None
                name, pick = inst.operands[pick[0]], pick[1:]
                continue
            if op in ("while", "call", "fusion") and (op != "fusion" or self._is_view_fusion(inst, pick)):
                callee = self._callee(inst, "body" if op == "while" else ("to_apply" if op == "call" else "calls"))
                root = self._table(callee).root if callee else None
                if root is None:
                    return None
                sites = (*sites, (comp, inst))
                comp, name = callee, root.name  # type: ignore[assignment]  # callee is set when root is
                continue
            if op in _VIEWS or (op == "custom-call" and self._passes_through(inst)):
                if not inst.operands:
                    return None
                name = inst.operands[0]
                continue
            if op == "constant" or op == "iota":
                return None
            return self._computed(comp, inst, sites, with_inputs)
        return None

    def _computed(self, comp: str, inst: Instruction, sites: tuple[_Frame, ...], with_inputs: bool) -> Origin:
        """An op that computes: its opcode and op_name (a fusion's root's), and its operands' origins."""
        where, op, operands = comp, inst, inst.operands
        inner_sites = sites
        if inst.opcode == "fusion":
            callee = self._callee(inst, "calls")
            root = self._table(callee).root if callee else None
            if root is not None and callee is not None:
                # Past the views at the fusion's root, to the op that computes.
                while root.opcode in _VIEWS and root.operands:
                    nxt = self._table(callee).by_name.get(root.operands[0])
                    if nxt is None or nxt.opcode == "parameter":
                        break
                    root = nxt
                where, op, operands = callee, root, root.operands
                inner_sites = (*sites, (comp, inst))
        name = op_name_of(op) or op_name_of(inst)
        inputs: tuple[Origin, ...] = ()
        if with_inputs:
            found = (self._walk(where, operand, (), inner_sites, with_inputs=False) for operand in operands)
            inputs = tuple(o for o in found if o is not None)
        return Origin("op", name, op.opcode, inputs)

    def _is_view_fusion(self, fusion: Instruction, pick: tuple[int, ...]) -> bool:
        """Whether the fusion's (picked) result is a view of one of its parameters."""
        callee = self._callee(fusion, "calls")
        table = self._table(callee) if callee else None
        node = table.root if table else None
        while node is not None and table is not None:
            if node.opcode == "parameter":
                return True
            if node.opcode == "tuple" and pick:
                if pick[0] >= len(node.operands):
                    return False
                node, pick = table.by_name.get(node.operands[pick[0]]), pick[1:]
                continue
            if node.opcode not in _VIEWS or not node.operands:
                return False
            node = table.by_name.get(node.operands[0])
        return False

    @staticmethod
    def _callee(inst: Instruction, attribute: str) -> str | None:
        return next((name for key, name in inst.callees() if key == attribute), None)

    @staticmethod
    def _passes_through(inst: Instruction) -> bool:
        target = _TARGET_RE.search(inst.attribute("custom_call_target") or "")
        return target is not None and target.group(1) in _PASS_THROUGH_CALLS
