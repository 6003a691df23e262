"""Every instruction of the computations a module runs, and how many times each computation runs per step.

The collectives reader keeps only the instructions that matter to it; a count of FLOPs or bytes accessed
needs all of them. `Program` reads a computation's every instruction on demand (once, then kept), and walks
the call graph from the entry to give each computation that runs its executions per step:

  entry                 1
  while body            trips x the while's executions; its condition trips + 1 times that
  conditional branch    the conditional's executions, for every branch (as if each branch always ran:
                        the convention of the collectives table)
  call (`to_apply`)     the call's executions
  fusion (`calls`)      the fusion's executions: a fused computation runs as one unit per fusion
  async wrapper         the `…-start`'s executions (`calls=`); its `-done` names it again and adds nothing

Computations applied per element (the `to_apply` of reduce, all-reduce, sort, map, scatter, …) and those a
custom-call names do not run as a unit: they are not in the result, and their work belongs to the
instruction that applies them. A sum over callers with one unknown trip count is unknown (None), never a
guess. When the text ends before the entry (a truncated file), every computation no read computation calls
is a root run an unknown number of times.

Example (FLOPs of every dot of a step, `flops_of` being the caller's):

    program = Program(read_module(text))
    for name, runs in program.executions_per_step().items():
        shapes = program.shapes(name)
        for i in program.instructions(name):
            if i.opcode == "dot":
                work = flops_of(i.shape, [shapes[o] for o in i.operands], i.attribute("lhs_contracting_dims"))
"""

from __future__ import annotations

from collections.abc import Mapping

from shardscope.hlo.grammar import read_computation, read_instruction
from shardscope.hlo.lines import read_line
from shardscope.hlo.module import read_module
from shardscope.hlo.records import ASYNC_ENDS, Instruction, Module
from shardscope.hlo.trips import LoopTrips

__all__ = ["Program", "computation_instructions", "executions_per_step"]

# How a computation named by an instruction runs, by (opcode, attribute); None: it is applied per element.
_UNIT_CALLS = {("call", "to_apply"), ("fusion", "calls"), ("conditional", "branch_computations")}
_UNIT_CALLS |= {("conditional", "true_computation"), ("conditional", "false_computation")}


def computation_instructions(module: Module, name: str) -> tuple[Instruction, ...]:
    """Every instruction of computation `name`, in text order (parameters and the ROOT included).

    An instruction that does not parse is left out (`collectives_of` reports those). Unknown names give ().
    Read once per module, then kept (`Module.instruction_tables`).
    """
    tables = module.instruction_tables
    found = tables.get(name)
    if found is None:
        found = tables[name] = _read_instructions(module, name)
    return found


def _read_instructions(module: Module, name: str) -> tuple[Instruction, ...]:
    comp = module.by_name.get(name)
    if comp is None:
        return ()
    text = module.text
    if comp.printed is None:
        full = read_computation(text, comp.start)
        return full.instructions if full is not None else ()
    # XLA's printed form: one instruction a line, but for those printed over several (`spanning`).
    spanning = {start: (end, instruction) for start, end, instruction in comp.spanning}
    out: list[Instruction] = []
    pos, body_end = comp.printed
    while pos < body_end:
        if pos in spanning:
            end, instruction = spanning[pos]
            out.append(instruction)
            pos = end + 1
            continue
        end = text.find("\n", pos, body_end)
        end = body_end if end < 0 else end
        read = read_line(text, pos, end)
        if read is None:
            whole = read_instruction(text, pos, end)
            read = whole[0] if whole is not None else None
        if read is not None:
            out.append(read)
        pos = end + 1
    return tuple(out)


class Program:
    """A read module's computations that run, each with every instruction and its executions per step.

    Instruction tables are read when first asked for and kept; `executions_per_step` reads those of every
    computation reachable from the entry (a full read, unlike the collectives' fast path).
    """

    def __init__(self, module: Module) -> None:
        self.module = module
        self._trips = LoopTrips(module)
        self._executions: dict[str, int | None] | None = None

    def instructions(self, computation: str) -> tuple[Instruction, ...]:
        """Every instruction of `computation`, in text order (see `computation_instructions`)."""
        return computation_instructions(self.module, computation)

    def fused(self, fusion: Instruction) -> tuple[Instruction, ...]:
        """The instructions of the computation a fusion calls (none when it names none)."""
        called = [callee for attribute, callee in fusion.callees() if attribute == "calls"]
        return self.instructions(called[0]) if called else ()

    def shapes(self, computation: str) -> dict[str, str]:
        """Result shape text by instruction name: the shapes of an instruction's operands, looked up."""
        return {i.name: i.shape for i in self.instructions(computation)}

    def trips(self, computation: str, loop: Instruction) -> int | None:
        """Iterations of the `while` instruction `loop` of `computation`, or None if unknown."""
        return self._trips.trips(computation, loop)

    def _runs(self, computation: str) -> list[tuple[str, int | None]]:
        """(callee, runs per run of `computation`) of every unit call the computation makes."""
        runs: list[tuple[str, int | None]] = []
        for i in self.instructions(computation):
            if i.opcode.endswith(ASYNC_ENDS):
                continue
            for attribute, callee in i.callees():
                if i.opcode == "while" and attribute in ("body", "condition"):
                    n = self.trips(computation, i)
                    runs.append((callee, None if n is None else n + (attribute == "condition")))
                elif (i.opcode, attribute) in _UNIT_CALLS or (i.opcode.endswith("-start") and attribute == "calls"):
                    runs.append((callee, 1))
        return runs

    def calls(self, computation: str) -> list[tuple[str, int | None]]:
        """(callee, runs per run of `computation`) of every computation it runs: a loop body its trips."""
        return self._runs(computation)

    def executions_per_step(self) -> dict[str, int | None]:
        """Executions per step of every computation that runs, in the module's order (see the module doc)."""
        if self._executions is None:
            self._executions = self._count_executions()
        return dict(self._executions)

    def _count_executions(self) -> dict[str, int | None]:
        module = self.module
        known = module.by_name
        roots = [module.entry] if module.entry is not None else []
        if module.truncation is not None:
            called = {callee for comp in module.computations for _, callee in _all_callees(self, comp.name)}
            roots += [c.name for c in module.computations if c.name not in called and c.name != module.entry]
        # The computations reached, and each one's callers, by a walk with an explicit stack (chains of
        # calls run thousands deep).
        edges: dict[str, list[tuple[str, int | None]]] = {}
        stack = [r for r in roots if r in known]
        while stack:
            name = stack.pop()
            if name in edges:
                continue
            edges[name] = [(callee, n) for callee, n in self._runs(name) if callee in known]
            stack += [callee for callee, _ in edges[name] if callee not in edges]
        callers: dict[str, int] = {name: 0 for name in edges}
        for calls in edges.values():
            for callee, _ in calls:
                callers[callee] += 1
        runs: dict[str, int | None] = {name: 0 for name in edges}
        for root in roots:
            if root in runs:
                runs[root] = 1 if root == module.entry else None
        # Callers before callees (Kahn's order); a computation on a call cycle (invalid HLO) stays unknown.
        ready = [name for name, n in callers.items() if n == 0]
        done: set[str] = set()
        while ready:
            name = ready.pop()
            done.add(name)
            for callee, n in edges[name]:
                runs[callee] = _add(runs[callee], _times(runs[name], n))
                callers[callee] -= 1
                if callers[callee] == 0:
                    ready.append(callee)
        for name in edges:
            if name not in done:
                runs[name] = None
        order = {c.name: k for k, c in enumerate(module.computations)}
        return {name: runs[name] for name in sorted(runs, key=order.__getitem__)}


def _all_callees(program: Program, computation: str) -> list[tuple[str, str]]:
    """(attribute, callee) of every computation named by an instruction of `computation`."""
    return [pair for i in program.instructions(computation) for pair in i.callees()]


def _times(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a * b


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def executions_per_step(module: Module | str | bytes) -> Mapping[str, int | None]:
    """Executions per step of every computation of `module` (read or HLO text) that runs as a unit.

    See `Program` for every instruction of each; the module docstring for how executions are counted.
    """
    return Program(module if isinstance(module, Module) else read_module(module)).executions_per_step()
