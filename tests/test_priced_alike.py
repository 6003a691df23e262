"""Any program is priced alike: a reference model's compiled step and the same step with every module, scope
and parameter name changed give the same work profile and the same estimate. Only the program's ops,
shapes, dtypes, loops, custom calls and the kernel markers it declares (`shardscope.kernels`) are read."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import pytest

from shardscope.hlo.markers import MARKERS, is_marker

# Scopes that jax's transforms push on the name stack (and the transforms' own names): the program's
# structure, not its names.
_KEPT = frozenset(
    {"while", "body", "cond", "closed_call", "core_call", "shard_map", "checkpoint", "remat", "rematted_computation"}
    | {"scan", "pjit", "jit", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "branch", "switch"}
    | {"jvp", "transpose", "vmap", "pmap", "xla_call", "xla_pmap", "remat2", "checkpoint2"}
)
_IDENTIFIER = re.compile(r"[A-Za-z_][\w\-]*")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')


def _renamed(name: str) -> str:
    """A deterministic new name for a module, scope or parameter name (markers and transforms kept)."""
    if name in _KEPT or is_marker(name):
        return name
    return "n" + hashlib.sha1(name.encode()).hexdigest()[:10]


_TOKEN = re.compile(r"shardscope\.kernel\.\w+|\[\\?'[^'\\]*\\?'\]|[A-Za-z_]\w*")


def _renamed_op_name(op_name: str) -> str:
    """An op_name with every name on its stack changed: every scope (a name followed by `/`), a method's
    scope (`moe._routed`), a transform's argument (`jvp(layer)`) and a pytree path's keys (`['params']`);
    the primitives that end each op's name (`…/dot_general`, in merged names `…/(a/dot:b/add)` too) and
    the transforms kept."""

    def renamed(match: re.Match[str]) -> str:
        token, start, end = match.group(), match.start(), match.end()
        if token.startswith("["):  # a key, its quotes escaped as the HLO text writes them or not
            quote = "\\'" if token.startswith("[\\") else "'"
            return f"[{quote}{_renamed(token[len(quote) + 1 : -len(quote) - 1])}{quote}]"
        before = op_name[start - 1] if start else ""
        after = op_name[end] if end < len(op_name) else ""
        if after in ("/", ".") or (before == "(" and after == ")"):
            return _renamed(token)
        return token

    return _TOKEN.sub(renamed, op_name)


def renamed_hlo(text: str) -> str:
    """The compiled module's text with every module, scope and parameter name in its metadata changed."""
    return _OP_NAME.sub(lambda m: f'op_name="{_renamed_op_name(m.group(1))}"', text)


def _renamed_path(path: str) -> str:
    """A tensor's path with every name in it changed, but its first part (the plan's kind of tensor)."""
    first, *rest = path.split("/")
    return "/".join([first, *(_renamed(part) for part in rest)])


def _unnamed(row):
    """A collective row without the names it carries (where it comes from, what it moves)."""
    return dataclasses.replace(row, source="", cause=None)


def renamed_plan(plan, order):
    """The plan with every tensor path renamed and its collectives in the order of `order`'s (a plan of the
    same program: the rows are listed by their sources' names, and an estimate's sums run in that order)."""
    tensors = tuple((_renamed_path(path), record) for path, record in plan.tensors)
    rows = sorted(plan.collectives, key=lambda row: repr(_unnamed(row)))
    keys = [repr(_unnamed(row)) for row in rows]
    collectives = []
    for row in order.collectives:
        index = keys.index(repr(_unnamed(row)))
        collectives.append(rows.pop(index))
        keys.pop(index)
    return dataclasses.replace(plan, tensors=tensors, collectives=tuple(collectives))


def test_renaming_changes_every_name_but_the_markers_and_transforms():
    op_name = "jit(step)/jvp(Model)/decoder/layers/self_attention/shardscope.kernel.attention/moe._routed/dot_general"
    renamed = _renamed_op_name(op_name)
    assert renamed.startswith("jit(n") and "/jvp(n" in renamed
    for name in ("step", "Model", "decoder", "layers", "self_attention", "moe", "_routed"):
        assert f"/{name}/" not in renamed and f"({name})" not in renamed and f".{name}/" not in renamed
    assert "/shardscope.kernel.attention/" in renamed and renamed.endswith("/dot_general")
    assert _renamed_op_name(renamed) != renamed and len(set(MARKERS)) == 3


def test_a_marker_names_no_module():
    from shardscope.hlo.metadata import module_path

    op_name = "jit(step)/jvp(layer)/decoder/layers/attn/shardscope.kernel.attention/shard_map/all_gather"
    assert module_path(op_name) == "decoder/layers/attn"
    assert module_path("jit(step)/decoder/moe/shardscope.kernel.grouped_matmul/expert/dot_general") == (
        "decoder/moe/expert"
    )


@pytest.mark.parametrize(
    ("model", "preset", "settings"),
    [
        ("llama-tiny", "default", {"model.attention_kernel": "flash"}),
        ("deepseek-tiny", "default", {"model.attention_kernel": "flash", "model.expert_matmul": "grouped"}),
    ],
)
def test_a_renamed_program_has_the_same_work_profile_and_estimate(compiled_cases, model, preset, settings):
    from shardscope.cost.price import price_plan
    from shardscope.extract.plans import extract_plan
    from shardscope.hlo.kinds import WorkKind

    step = compiled_cases(model, preset, **settings)
    text = step.compiled.as_text()
    renamed_text = renamed_hlo(text)
    assert renamed_text != text and "self_attention" in text and "self_attention" not in renamed_text
    plan = extract_plan(step, text)
    renamed_program = extract_plan(step, renamed_text)
    # The same collectives, moving the same bytes over the same axes as often; only their names differ.
    assert sorted(repr(_unnamed(row)) for row in renamed_program.collectives) == sorted(
        repr(_unnamed(row)) for row in plan.collectives
    )
    renamed = renamed_plan(renamed_program, plan)
    assert not {path for path, _ in plan.tensors} & {path for path, _ in renamed.tensors if "/" in path}
    # The kernels' stand-ins are priced as kernels, under any names.
    kinds = {entry.kind for entry in plan.work}
    assert WorkKind.KERNEL in kinds
    if "model.expert_matmul" in settings:
        assert WorkKind.GROUPED in kinds
    assert renamed.work == plan.work
    priced, priced_renamed = price_plan(plan, "v5p"), price_plan(renamed, "v5p")
    assert priced.estimate is not None and priced.estimate.expected is not None
    assert priced_renamed.estimate == priced.estimate


# The prediction reads a plan's tensors only: their logical axes, kinds, shapes, dtypes and specs, never
# their paths' names. The goldens (every preset of the tiny MoE models), and stored plans of the reference
# models covering MLA and grouped-query attention, remat policies that keep some projections, context and
# tensor parallelism, expert parallelism, the dense MoE dispatch and an Explicit pipeline.
_ROOT = Path(__file__).resolve().parent.parent
_STORED = (
    "deepseek2-16b_v5p-8_doc",
    "deepseek3-671b_tpu7x-256_4k_iw",
    "llama2-70b_v5p-1024_tiering",
    "llama3.1-70b_tpu7x-512_128k_iw",
    "llama3.1-405b_2xv6e-256_2024-10",
    "mixtral-8x22b_v6e-256_tr",
    "mixtral-8x7b_v6e-256_tiering",
    "seed003-fsdp-pp-explicit",
)
# MaxText's own programs record their activations apart from their weights, in modules named after their
# layers' classes (`activations/moe/…`): paired with their blocks by what they record, under any names.
_MAXTEXT = (
    "deepseek2-16b_v5p-8_doc.maxtext",
    "llama3.1-8b_v6e-8_tr014.maxtext",
    "llama4-17b-128e_v5p-256_tr.tpu",
    "qwen3-235b-a22b_tpu7x-512_4k_iw.tpu",
)
_PREDICTED_PLANS = (
    *sorted(path.relative_to(_ROOT).as_posix() for path in _ROOT.glob("golden/*/cpu-8/*.json")),
    *(f"benchmarks/plans/{stem}.tpu.json" for stem in _STORED),
    *(f"benchmarks/plans/{stem}.json" for stem in _MAXTEXT),
)


def _renamed_tensors(plan):
    """The plan with every tensor path renamed (tensor records unchanged), listed in the new paths' order."""
    return dataclasses.replace(plan, tensors=tuple(sorted((_renamed_path(path), r) for path, r in plan.tensors)))


@pytest.mark.parametrize("name", _PREDICTED_PLANS)
def test_a_renamed_plan_has_the_same_prediction(name):
    from shardscope.cost.price import price_plan
    from shardscope.plan.json import plan_from_json
    from shardscope.predict.plan import predicted_plan

    plan = plan_from_json((_ROOT / name).read_text(), name)
    renamed = _renamed_tensors(plan)
    names = {part for path, _ in plan.tensors for part in path.split("/")[1:]}
    assert not names & {part for path, _ in renamed.tensors for part in path.split("/")[1:]}
    predicted, predicted_renamed = predicted_plan(plan), predicted_plan(renamed)
    assert predicted.collectives and predicted.work
    # The same work bins and collectives (op, mesh axes, shape, dtype, bytes, count, loop trips, pass); only
    # the names of what they come from differ, and so the order the rows are listed in (by their sources).
    assert sorted(map(repr, predicted_renamed.work)) == sorted(map(repr, predicted.work))
    assert predicted_renamed.compute == predicted.compute
    assert sorted(repr(_unnamed(row)) for row in predicted_renamed.collectives) == sorted(
        repr(_unnamed(row)) for row in predicted.collectives
    )
    expected = price_plan(predicted, "v5p").estimate
    assert expected is not None and expected.expected
    assert price_plan(predicted_renamed, "v5p").estimate.expected == pytest.approx(expected.expected, rel=1e-12)
