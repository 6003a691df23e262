"""The HLO reader against a corpus of real and hand-written modules, each with its collectives derived by
XLA's own parser (tests/hlo_samples/oracle.py), not by the reader: compiled on fake CPU devices and for TPU
topologies, MaxText's reference TPU dumps (cut at 2,000 lines), XLA's own test HLO, modules written in
XLA's test style. See tests/hlo_samples/README.md for where each comes from."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import PRESETS, TINY_MODELS
from shardscope.hlo import HloCollectives, MeshLayout, parse_collectives, read_module
from shardscope.hlo.grammar import read_instruction
from shardscope.hlo.lines import read_line

SAMPLES = Path(__file__).parent / "hlo_samples"
CORPUS = json.loads((SAMPLES / "corpus.json").read_text())["modules"]
sys.path.insert(0, str(SAMPLES))


def layout(mesh: list[list[Any]]) -> MeshLayout:
    return MeshLayout(tuple(a for a, _ in mesh), tuple(s for _, s in mesh))


def reader_counts(parsed: HloCollectives) -> Counter[tuple[Any, ...]]:
    """Instances per (op, axes, groups, shift, bytes, loop trips): what the oracle counts."""
    counts: Counter[tuple[Any, ...]] = Counter()
    for r in parsed.collectives:
        groups = r.groups if r.axes is None else None
        counts[(r.op, r.axes, groups, r.shift, r.bytes, r.loop_trips)] += r.count
    return counts


def oracle_counts(found: dict[str, Any]) -> Counter[tuple[Any, ...]]:
    counts: Counter[tuple[Any, ...]] = Counter()
    for r in found["rows"]:
        axes = None if r["axes"] is None else tuple(r["axes"])
        counts[(r["op"], axes, r["groups"], r["shift"], r["bytes"], r["loop_trips"])] += r["count"]
    return counts


@pytest.mark.parametrize("entry", CORPUS, ids=[e["file"] for e in CORPUS])
def test_every_corpus_module_reads_as_xla_reads_it(entry: dict[str, Any]) -> None:
    text = (SAMPLES / entry["file"]).read_text()
    found = json.loads((SAMPLES / "expected" / f"{entry['file']}.json").read_text())
    parsed = parse_collectives(text, layout(entry["mesh"]))
    assert reader_counts(parsed) == oracle_counts(found)
    per_op = Counter({r.op: 0 for r in parsed.collectives})
    for r in parsed.collectives:
        per_op[r.op] += r.count
    assert dict(per_op) == found["instances"]
    assert dict(Counter(u.op for u in parsed.unknown)) == found["unknown"]
    if entry.get("truncated"):
        (notice,) = parsed.notices
        assert notice.startswith("the text ends inside computation") and "loop trips unknown" in notice
    else:
        assert parsed.notices == ()


@pytest.mark.parametrize("entry", CORPUS, ids=[e["file"] for e in CORPUS])
def test_expected_counts_are_what_xlas_parser_says(entry: dict[str, Any]) -> None:
    from oracle import expected

    text = (SAMPLES / entry["file"]).read_text()
    stored = json.loads((SAMPLES / "expected" / f"{entry['file']}.json").read_text())
    assert expected(text, [tuple(a) for a in entry["mesh"]], entry.get("truncated", False)) == stored


@pytest.mark.parametrize("entry", CORPUS, ids=[e["file"] for e in CORPUS])
def test_printed_lines_read_by_regex_as_the_grammar_reads_them(entry: dict[str, Any]) -> None:
    text = (SAMPLES / entry["file"]).read_text()
    pos = 0
    while (end := text.find("\n", pos)) >= 0:
        if text.startswith(("  %", "  ROOT %"), pos) and (fast := read_line(text, pos, end)) is not None:
            grammar = read_instruction(text, pos, end)
            assert grammar is not None and fast == grammar[0], text[pos:end]
        pos = end + 1


@pytest.mark.parametrize("entry", CORPUS, ids=[e["file"] for e in CORPUS])
def test_token_by_token_reading_gives_the_same_collectives(entry: dict[str, Any]) -> None:
    # One more space before every line: the same module for XLA, but not in the printer's form, so every
    # computation is read by the grammar instead of the line scans.
    text = (SAMPLES / entry["file"]).read_text()
    indented = "\n".join(" " + line if line else line for line in text.split("\n"))
    mesh = layout(entry["mesh"])
    fast, tokens = parse_collectives(text, mesh), parse_collectives(indented, mesh)
    assert tokens.collectives == fast.collectives
    assert tokens.unknown == fast.unknown
    assert len(tokens.notices) == len(fast.notices)


def test_maxtext_references_read_past_a_pallas_kernel_printed_over_several_lines() -> None:
    text = (SAMPLES / "maxtext_reference_hlo_deepseek3.txt").read_text()
    module = read_module(text)
    body = module.by_name["wide.region_1.8_spmd.sunk.clone.clone.clone.sunk"]
    assert body.complete and len(body.spanning) == 2  # the kernel_metadata={…} lines, ending `}}, metadata=…`
    assert sum(i.opcode == "all-gather" for i in body.instructions) == 10
    assert module.truncation is not None and module.truncation.computation == "called_computation.6"
    assert module.entry is None


def _agree_with_xla(text: str, mesh: tuple[tuple[str, int], ...]) -> None:
    from oracle import expected

    found = expected(text, [list(a) for a in mesh])
    parsed = parse_collectives(text, layout([list(a) for a in mesh]))
    assert reader_counts(parsed) == oracle_counts(found)
    assert parsed.unknown == () and parsed.notices == ()


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("model", TINY_MODELS)
def test_every_tiny_case_agrees_with_xla(model: str, preset: str, compiled_cases) -> None:
    step = compiled_cases(model, preset)
    _agree_with_xla(step.compiled.as_text(), step.case.mesh)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deepseek-tiny/tpu7x-8/ep-as-cp", "deepseek-tiny/v5p-16/ep-as-cp"])
def test_tpu_golden_cases_agree_with_xla(name: str, compile_cached) -> None:
    from shardscope.extract.plans import slice_mesh
    from shardscope.golden.cases import load_manifest
    from shardscope.golden.worker import resolve_golden_case

    (case,) = [c for c in load_manifest(Path(__file__).parent.parent / "golden") if c.case_id == name]
    step = compile_cached(resolve_golden_case(case))
    _agree_with_xla(step.compiled.as_text(), slice_mesh(step.case))


# Lines at the edge of the simple form the line reader tries first (`_simple_parts`), each with whether that
# form takes it: every line the reader accepts, by either form, must read as the grammar reads it.
EDGE_LINES = [
    ('  %m = f32[8]{0} multiply(%a, %b), metadata={op_name="jit(f)/mul" source_file="/x.py" source_line=3}', True),
    ("  ROOT %t = (f32[8]{0}, s32[]) tuple(%a, %b)", True),
    ('  %c = f32[] constant(-inf), metadata={op_name="a<b"}', True),
    ("  %s = f32[1,32]{1,0} slice(%x), slice={[0:1], [0:32]}", True),
    ("  %p = f32[2,16]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}", False),
    ('  %d = f32[8]{0} add(%a, %b), frontend_attributes={x="s", y=a<b}', False),
    ("  %g = f32[8]{0} all-gather(%x), replica_groups={{0,1},{2,3}}, dimensions={0}", False),
    ("  %g = f32[8]{0} all-gather(%x), replica_groups=[2,2]<=[4], dimensions={0}", False),
    ("  %g = f32[8]{0} all-gather(%x), channel_id=1, replica_groups={{0,1}}, device_ids={0,1}, dimensions={0}", False),
    ('  %k = f32[8]{0} custom-call(%x), custom_call_target="Sharding", backend_config="{\\"a\\":1}"', False),
    ("  %f = f32[8]{0} fusion(%a, /*index=1*/%b), kind=kLoop, calls=%fused_computation", False),
    ("  %f = f32[8]{0} fusion(%a, %b), kind=kLoop, calls=%fused_computation  ", False),
    ("  %b = f32[8]{0} broadcast(f32[] %x), dimensions={}", False),
    ("  %e = f32[8]{0} exponential(%x), metadata={}, ", False),
]


@pytest.mark.parametrize(("line", "simple_form"), EDGE_LINES)
def test_edge_lines_read_by_regex_as_the_grammar_reads_them(line: str, simple_form: bool) -> None:
    from shardscope.hlo.lines import HEAD, _simple_parts

    head = HEAD.match(line)
    assert head is not None
    assert (_simple_parts(line, len(line), head) is not None) == simple_form
    fast = read_line(line, 0, len(line))
    grammar = read_instruction(line, 0, len(line))
    if fast is not None:
        assert grammar is not None and fast == grammar[0]
