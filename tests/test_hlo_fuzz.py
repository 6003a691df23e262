"""No input gives a traceback: the corpus modules cut short, with lines deleted or swapped, attributes and
brackets garbled, bytes that are not UTF-8, computations defined twice, call chains and brackets thousands
deep. Each either reads (collectives, notices, executions per step) or is refused with one line
(`HloParseError`, exit 2 from the CLI). Mutations are seeded: a failure is reproducible by its test id."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.hlo import HloParseError, MeshLayout, Program, parse_collectives, read_module

SAMPLES = Path(__file__).parent / "hlo_samples"
CORPUS = {e["file"]: e for e in json.loads((SAMPLES / "corpus.json").read_text())["modules"]}
# The compiler-written modules a test can cut anywhere in a few milliseconds.
COMPILED = sorted(f for f in CORPUS if f.endswith(".hlo.txt"))
GARBAGE = ["{", "}", "(", ")", "[", "]", "=", ",", "%", '"', "'", "/*", "*/", "//", "\n", " ", "x", "0", "<=", "T("]
_ATTRIBUTE = re.compile(rb", ([a-z_]+)=")
_HEADER = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{$", re.M)


def layout(file: str) -> MeshLayout:
    mesh = CORPUS[file]["mesh"]
    return MeshLayout(tuple(a for a, _ in mesh), tuple(s for _, s in mesh))


def read_or_refuse(data: bytes, mesh: MeshLayout | None) -> tuple[str, ...] | None:
    """The notices of a read, or None if the text is refused; anything else raised fails the test."""
    try:
        parsed = parse_collectives(data, mesh)
        module = read_module(data)
    except HloParseError as err:
        assert "\n" not in str(err) and str(err)
        return None
    Program(module).executions_per_step()  # the full read of every instruction, too
    return parsed.notices


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One random damage of the kinds a real file suffers (or a person makes)."""
    kind = rng.randrange(7)
    lines = data.split(b"\n")
    if kind == 0:  # delete a few lines
        for _ in range(rng.randint(1, 5)):
            del lines[rng.randrange(len(lines))]
        return b"\n".join(lines)
    if kind == 1:  # swap two lines
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return b"\n".join(lines)
    if kind == 2:  # garble an attribute's value
        found = list(_ATTRIBUTE.finditer(data))
        if found:
            at = rng.choice(found).end()
            junk = "".join(rng.choice(GARBAGE) for _ in range(rng.randint(1, 8))).encode()
            return data[:at] + junk + data[at + rng.randint(0, 40) :]
    if kind == 3:  # bytes that are not UTF-8
        at = rng.randrange(len(data))
        return data[:at] + bytes(rng.choice([0xFF, 0xFE, 0xC3, 0x80, 0x00]) for _ in range(3)) + data[at:]
    if kind == 4:  # a bracket or quote gone
        spots = [m.start() for m in re.finditer(rb"[{}()\[\]\"]", data)]
        if spots:
            at = rng.choice(spots)
            return data[:at] + data[at + 1 :]
    if kind == 5:  # the file twice (`cat a.hlo a.hlo`), or one computation twice
        if rng.random() < 0.5:
            return data + b"\n" + data
        start = data.find(b"\n%")
        end = data.find(b"\n}\n", start)
        if start >= 0 and end >= 0:
            return data[: end + 3] + data[start + 1 : end + 3] + data[end + 3 :]
    return data[: rng.randrange(len(data))]  # cut short


@pytest.mark.slow
@pytest.mark.parametrize("file", sorted(CORPUS))
def test_damaged_corpus_modules_read_or_are_refused_in_one_line(file: str) -> None:
    data = (SAMPLES / file).read_bytes()
    rng = random.Random(file)
    mesh = layout(file)
    for _ in range(40 if len(data) < 200_000 else 8):
        damaged = mutate(data, rng)
        for _ in range(rng.randrange(3)):  # some get several kinds of damage
            damaged = mutate(damaged, rng) if damaged else damaged
        read_or_refuse(damaged, mesh)
        read_or_refuse(damaged, None)


@pytest.mark.parametrize("file", COMPILED)
def test_a_module_cut_inside_a_computation_says_which(file: str) -> None:
    # Where each computation's body is, from its header line and its closing `}` line (the printer's form).
    text = (SAMPLES / file).read_text()
    bodies = [(m.group(1), m.end() + 1, text.index("\n}", m.end())) for m in _HEADER.finditer(text)]
    rng = random.Random(file)
    for name, start, end in rng.sample(bodies, min(6, len(bodies))):
        cut = rng.randrange(start, end + 1)
        notices = read_or_refuse(text[:cut].encode(), layout(file))
        assert notices is not None
        assert notices[0].startswith(f"the text ends inside computation {name!r}"), notices


def test_text_that_is_not_utf8_or_not_text_at_all() -> None:
    data = (SAMPLES / "cpu_scan_collectives.hlo.txt").read_bytes()
    mesh = layout("cpu_scan_collectives.hlo.txt")
    clean = parse_collectives(data, mesh)
    # Latin-1 inside metadata strings (a user's name in an op_name): the same collectives, nothing left out.
    latin1 = data.replace(b'op_name="', 'op_name="josé/'.encode("latin-1"))
    assert latin1 != data and read_or_refuse(latin1, mesh) == ()
    assert parse_collectives(latin1, mesh).collectives == clean.collectives
    # In the module's name: that line is no header any more, and the reader says so.
    renamed = data.replace(b"HloModule jit_", "HloModule jit_ñ".encode("latin-1"), 1)
    assert read_or_refuse(renamed, mesh) == ("text between computations that is not HLO was skipped (lines 1)",)
    assert read_or_refuse(bytes(range(256)) * 40, None) is None
    assert read_or_refuse(b"\x00" * 1000, None) is None


def test_computations_defined_twice_are_refused_as_xla_refuses_them() -> None:
    data = (SAMPLES / "hand_conditional.hlo").read_text()
    with pytest.raises(HloParseError, match="'HloModule'"):
        read_module(data + "\n" + data)
    body = data[data.index("add {") : data.index("}\n", data.index("add {")) + 2]
    with pytest.raises(HloParseError, match="'add' is defined twice"):
        read_module(data.replace(body, body + "\n" + body))


@pytest.mark.slow
@pytest.mark.parametrize("percent", ["%", ""])
def test_call_chains_and_brackets_thousands_deep(percent: str) -> None:
    p = percent
    add = (
        f"{p}add {{\n  {p}a = f32[] parameter(0)\n  {p}b = f32[] parameter(1)\n  ROOT {p}s = f32[] add({p}a, {p}b)\n}}"
    )
    chain = [add, f"{p}c0 {{\n  {p}x = f32[8] parameter(0)\n  ROOT {p}r = f32[8] all-reduce({p}x), to_apply={p}add\n}}"]
    chain += [
        f"{p}c{k} {{\n  {p}x = f32[8] parameter(0)\n  ROOT {p}r = f32[8] call({p}x), to_apply={p}c{k - 1}\n}}"
        for k in range(1, 3000)
    ]
    entry = f"ENTRY {p}main {{\n  {p}x = f32[8] parameter(0)\n  ROOT {p}r = f32[8] call({p}x), to_apply={p}c2999\n}}"
    text = "HloModule deep, num_partitions=2\n\n" + "\n\n".join([*chain, entry]) + "\n"
    (row,) = parse_collectives(text, MeshLayout(("data",), (2,))).collectives
    assert (row.op, row.axes, row.count) == ("all-reduce", ("data",), 1)
    assert executions_per_step_of(text)["c0"] == 1
    deep = "HloModule m\nENTRY e {\n  x = f32[8] parameter(0), frontend_attributes={a=" + "{" * 50_000 + "\n}\n"
    assert read_or_refuse(deep.encode(), None) is not None
    nested = deep.replace("\n}\n", "}" * 50_000 + "}\n}\n")
    assert read_or_refuse(nested.encode(), None) == ()


def executions_per_step_of(text: str) -> dict[str, int | None]:
    return Program(read_module(text)).executions_per_step()


def test_damaged_files_through_the_cli_exit_0_or_2_without_a_traceback(tmp_path: Path) -> None:
    runner = CliRunner()
    rng = random.Random(7)
    data = (SAMPLES / "tpu7x-8_scan_collectives.hlo.txt").read_bytes()
    for k in range(12):
        path = tmp_path / f"damaged{k}.txt"
        path.write_bytes(mutate(data, rng))
        result = runner.invoke(app, ["collectives", str(path), "--mesh", "fsdp=4,expert=2"])
        assert result.exit_code in (0, 2), result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        if result.exit_code == 2:
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr
