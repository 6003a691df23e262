"""Every instruction of the computations that run, and how many times each runs per step
(`shardscope.hlo.Program`, `executions_per_step`): on compiled scans whose trip counts the program states,
the TPU compiler's loops (trips derived, not recorded) and hand-written modules of every calling form."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp

from shardscope.hlo import Program, computation_instructions, executions_per_step, read_module

SAMPLES = Path(__file__).parent / "hlo_samples"


def executed(program: Program, opcode: str) -> int:
    """Executions per step of every instruction of `opcode`, summed over the computations that run."""
    runs = program.executions_per_step()
    return sum(n or 0 for name, n in runs.items() for i in program.instructions(name) if i.opcode == opcode)


def test_a_compiled_scan_runs_its_dots_as_often_as_the_program_says() -> None:
    def step(x, w):
        inner = lambda c, _: (jnp.tanh(c @ w), None)  # noqa: E731
        outer = lambda c, _: (jax.lax.scan(inner, c, None, length=3)[0], None)  # noqa: E731
        y = jax.lax.scan(outer, x, None, length=2)[0]  # 2 x 3 dots
        z = jax.lax.scan(lambda c, _: (jnp.sin(c @ w), None), y, None, length=7)[0]  # 7 dots
        z = jax.lax.cond(z.sum() > 0, lambda a: a @ w, lambda a: a * 2.0, z)  # 1 dot, in one branch
        return z @ w  # 1 dot

    x = jnp.ones((8, 8))
    program = Program(read_module(jax.jit(step).lower(x, x).compile().as_text()))
    assert executed(program, "dot") == 2 * 3 + 7 + 1 + 1
    assert executed(program, "while") == 1 + 2 + 1  # the inner loop starts once per outer iteration
    assert executed(program, "conditional") == 1
    runs = program.executions_per_step()
    # Loop conditions run once more than their bodies: 2 x (3 + 1), 2 + 1, 7 + 1.
    conditions = Counter(
        runs[callee]
        for name in runs
        for i in program.instructions(name)
        if i.opcode == "while"
        for key, callee in i.callees()
        if key == "condition"
    )
    assert conditions == Counter({8: 2, 3: 1})
    entry = program.module.entry
    assert entry is not None and runs[entry] == 1


def test_operands_shapes_and_raw_attributes_are_at_hand() -> None:
    program = Program(
        read_module(jax.jit(lambda a, b: a @ b).lower(jnp.ones((4, 8)), jnp.ones((8, 2))).compile().as_text())
    )
    [(name, runs)] = [
        (n, r) for n, r in program.executions_per_step().items() if "dot" in {i.opcode for i in program.instructions(n)}
    ]
    (dot,) = [i for i in program.instructions(name) if i.opcode == "dot"]
    shapes = program.shapes(name)
    assert [shapes[o].split("{")[0] for o in dot.operands] == ["f32[4,8]", "f32[8,2]"]
    assert dot.shape.split("{")[0] == "f32[4,2]"
    assert dot.attribute("lhs_contracting_dims") == "{1}" and dot.attribute("rhs_contracting_dims") == "{0}"
    assert runs == 1


def test_the_tpu_compilers_loops_give_the_flax_steps_matmuls() -> None:
    # generate.py's Flax step: an embedding Dense, then nn.scan over 3 layers of a Dense and an expert
    # einsum; the TPU compiler writes each matmul as a convolution. Forward: 1 + 3 x 2; backward: 3 x (dW
    # and dx of both) + the embedding's dW. Its loops carry no known_trip_count: trips come from the loop.
    program = Program(read_module((SAMPLES / "v5p-8_flax_train_step.hlo.txt").read_bytes()))
    assert executed(program, "convolution") == (1 + 3 * 2) + (3 * 4 + 1)


HAND = """HloModule hand, num_partitions=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

fused {
  p = f32[8] parameter(0)
  ROOT n = f32[8] negate(p)
}

yes {
  p = f32[8] parameter(0)
  ROOT f = f32[8] fusion(p), kind=kLoop, calls=fused
}

no {
  ROOT p = f32[8] parameter(0)
}

wrapped {
  p = f32[8] parameter(0)
  ROOT ag = f32[16] all-gather(p), dimensions={0}, replica_groups={{0,1}}
}

helper {
  p = f32[8] parameter(0)
  ROOT c = f32[8] custom-call(p), custom_call_target="foo", called_computations={no}
}

body {
  t = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  x = f32[8] get-tuple-element(t), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  pred = pred[] constant(true)
  y = f32[8] conditional(pred, x, x), true_computation=yes, false_computation=no
  start = ((f32[8]), f32[16]) all-gather-start(y), calls=wrapped
  done = f32[16] all-gather-done(start), calls=wrapped
  z = f32[8] call(y), to_apply=helper
  r = f32[] reduce(z, constant.0), dimensions={0}, to_apply=add
  ROOT out = (s32[], f32[8]) tuple(j, z)
}

cond {
  t = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  x = f32[8] parameter(0)
  zero = s32[] constant(0)
  t = (s32[], f32[8]) tuple(zero, x)
  w = (s32[], f32[8]) while(t), condition=cond, body=body
  ROOT f = f32[8] fusion(x), kind=kLoop, calls=fused
}
"""


def test_every_calling_form_counts_as_it_runs() -> None:
    # A loop of 4 (from its condition and init); in its body a conditional (both branches counted), an
    # async all-gather (its done names the wrapper again), a call, and a reduce whose `add` runs per element.
    # `fused` runs from the entry once and from the true branch 4 times.
    assert executions_per_step(HAND) == {
        "fused": 1 + 4,
        "yes": 4,
        "no": 4,
        "wrapped": 4,
        "helper": 4,
        "body": 4,
        "cond": 5,
        "main": 1,
    }


def test_instructions_in_text_order_however_they_are_printed() -> None:
    module = read_module(HAND)
    assert [i.name for i in computation_instructions(module, "cond")] == ["t", "i", "n", "lt"]
    # The same module in XLA's printed form (`%` names, two-space indentation) reads alike, and so does an
    # instruction printed over two lines.
    printed = "\n".join(
        ("  ROOT %" + line[7:] if line.startswith("  ROOT ") else "  %" + line[2:]) if line.startswith("  ") else line
        for line in HAND.split("\n")
    )
    for name in ("cond", "add"):
        printed = printed.replace(f"={name}", f"=%{name}").replace(f"{name} {{", f"%{name} {{")
    printed = printed.replace("ENTRY main {", "ENTRY %main {").replace(", condition=", ",\n    condition=")
    read = read_module(printed)
    entry = read.by_name["main"]
    assert entry.printed is not None and len(entry.spanning) == 1  # the fast path, one spanning instruction
    assert [i.name for i in computation_instructions(read, "main")] == ["x", "zero", "t", "w", "f"]
    assert read.by_name["cond"].printed is not None  # read by the line scans too, its header no instruction
    assert [i.name for i in computation_instructions(read, "cond")] == ["t", "i", "n", "lt"]
    assert [i.opcode for i in computation_instructions(read, "body")] == [
        i.opcode for i in computation_instructions(module, "body")
    ]
    assert computation_instructions(read, "absent") == ()


def test_unknown_trips_and_truncated_text_are_unknown_never_guessed() -> None:
    unknown = HAND.replace("n = s32[] constant(4)", "n = s32[] parameter(1)")
    runs = executions_per_step(unknown)
    assert runs["main"] == 1 and runs["body"] is None and runs["fused"] is None  # 1 + unknown
    cut = HAND[: HAND.index("ENTRY main")] + "ENTRY main {\n  x = f32[8] parameter(0)\n"
    runs = executions_per_step(cut)
    # The entry runs once, cut short or not; what it would have called is read, its callers not.
    assert runs.pop("main") == 1
    assert set(runs) >= {"body", "cond", "fused"} and all(n is None for n in runs.values())


def test_a_call_chain_a_thousand_deep() -> None:
    chain = ["c0 {\n  p = f32[8] parameter(0)\n  ROOT n = f32[8] negate(p)\n}\n"]
    chain += [
        f"c{k} {{\n  p = f32[8] parameter(0)\n  ROOT c = f32[8] call(p), to_apply=c{k - 1}\n}}\n"
        for k in range(1, 1000)
    ]
    text = "\n".join([*chain, HAND[HAND.index("cond {") :].replace("calls=fused", "calls=c999")]).replace(
        "body=body", "body=c999"
    )
    runs = executions_per_step(text)
    assert runs["c0"] == runs["c999"] == 4 + 1


def test_a_modules_computations_are_read_once_for_every_reader() -> None:
    """Two readers of one module (two Programs, or a Program and a direct call) share one reading."""
    module = read_module((SAMPLES / "cpu_scan_collectives.hlo.txt").read_text())
    first = Program(module)
    for name in first.executions_per_step():
        assert Program(module).instructions(name) is first.instructions(name)
        assert computation_instructions(module, name) is first.instructions(name)


def test_the_cycle_collector_is_paused_for_the_block_and_then_as_it_was() -> None:
    import gc

    from shardscope.hlo.module import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller that turned it off keeps it off
    finally:
        gc.enable()
