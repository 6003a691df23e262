"""The published JSON Schemas: generated from the records, shipped current, and every stored plan valid."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from shardscope.cli import app
from shardscope.diff import CHANGE_KINDS, COLLECTIVE_CHANGE_KINDS, changes_from_json, diff_plans, diff_to_json
from shardscope.diff.schema import diff_json_schema
from shardscope.errors import PlanError
from shardscope.plan.json import load_plan, plan_from_dict, plan_from_json, plan_to_json
from shardscope.plan.schema import plan_json_schema, schema_text, shipped_schema

ROOT = Path(__file__).resolve().parent.parent
# Every plan the repository stores: the goldens and the benchmark's plans.
STORED = sorted(
    str(p.relative_to(ROOT)) for pattern in ("golden/**/*.json", "benchmarks/plans/*.json") for p in ROOT.glob(pattern)
)


def test_the_stored_plans_are_found():
    assert len(STORED) > 50
    assert any(p.startswith("golden/") for p in STORED) and any(p.startswith("benchmarks/plans/") for p in STORED)


def test_the_shipped_plan_schema_is_the_records():
    assert shipped_schema() == schema_text(plan_json_schema()), (
        "shardscope/plan/plan.schema.json is stale: regenerate it with `shardscope schema plan > "
        "shardscope/plan/plan.schema.json`"
    )


@pytest.fixture(scope="module")
def plan_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(shipped_schema())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", STORED)
def test_every_stored_plan_validates_and_round_trips(path, plan_validator):
    text = (ROOT / path).read_text(encoding="utf-8")
    data = json.loads(text)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in plan_validator.iter_errors(data)]
    assert errors == []
    assert plan_to_json(plan_from_json(text, path)) == text


def _golden() -> dict:
    return json.loads((ROOT / "golden/deepseek-tiny/cpu-8/default.json").read_text(encoding="utf-8"))


def test_the_schema_rejects_what_the_reader_rejects(plan_validator):
    data = _golden()
    data["collectives"][0]["bytes"] = "many"
    assert not plan_validator.is_valid(data)
    with pytest.raises(PlanError, match=r"corrupt plan \(collectives\.0\.bytes: .*integer.*found 'many'"):
        plan_from_dict(data, "edited.json")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("tensors"), r"tensors: Field required"),
        (lambda d: d["findings"].append({"id": "x", "severity": "fatal"}), r"findings\.\d+\.severity"),
        (lambda d: d["case"].update(mesh_axes=["fsdp", "nowhere"]), r"case.mesh_axes names \['nowhere'\]"),
        (lambda d: d.update(parts=["collectives"]), r"parts \['collectives'\]"),
    ],
)
def test_a_corrupt_plan_names_its_field(edit, message):
    data = _golden()
    data.setdefault("findings", [])
    edit(data)
    with pytest.raises(PlanError, match=message):
        plan_from_dict(data, "edited.json")


def test_unknown_fields_are_kept_at_the_top_and_ignored_in_rows(plan_validator):
    data = _golden()
    data["reviewer"] = {"note": "kept"}
    path = next(iter(data["tensors"]))
    data["tensors"][path]["compiled_spec"] = ["fsdp"]
    assert plan_validator.is_valid(data)
    plan = plan_from_dict(data)
    assert dict(plan.extra) == {"reviewer": {"note": "kept"}}
    assert "compiled_spec" not in plan_to_json(plan)


# --- the diff JSON ------------------------------------------------------------------------------------------

PAIRS = [
    ("golden/deepseek-tiny/cpu-8/default.json", "golden/deepseek-tiny/cpu-8/ep-as-cp.json"),
    ("golden/mixtral-tiny/cpu-8/default.json", "golden/mixtral-tiny/cpu-8/ep-tp.json"),
    ("golden/deepseek-tiny/cpu-8/ep-as-cp.json", "golden/deepseek-tiny/tpu7x-8/ep-as-cp.json"),
    ("benchmarks/plans/deepseek2-16b_v5p-8_doc.maxtext.json", "benchmarks/plans/deepseek2-16b_v5p-8_doc.tpu.json"),
]


def test_the_shipped_diff_schema_is_the_records():
    assert shipped_schema("shardscope.diff", "diff.schema.json") == schema_text(diff_json_schema()), (
        "shardscope/diff/diff.schema.json is stale: regenerate it with `shardscope schema diff > "
        "shardscope/diff/diff.schema.json`"
    )


def test_the_diff_schema_knows_every_kind_of_change():
    schema = json.loads(shipped_schema("shardscope.diff", "diff.schema.json"))
    kinds = [
        k
        for name, d in schema["$defs"].items()
        if name.endswith("ChangeDocument")
        for k in d["properties"]["kind"]["enum"]
    ]
    assert sorted(kinds) == sorted(CHANGE_KINDS)


@pytest.mark.parametrize(("old", "new"), PAIRS)
def test_diff_json_validates_and_reads_back_into_the_records(old, new):
    diff = diff_plans(load_plan(ROOT / old), load_plan(ROOT / new))
    data = json.loads(json.dumps(diff_to_json(diff)))
    validator = jsonschema.Draft202012Validator(json.loads(shipped_schema("shardscope.diff", "diff.schema.json")))
    assert [e.message for e in validator.iter_errors(data)] == []
    # Records on both sides read back as records: tensors, collectives, findings, and plain values.
    assert any(c.kind in COLLECTIVE_CHANGE_KINDS for c in diff.changes)
    assert changes_from_json(data) == diff.changes


def test_a_corrupt_diff_names_its_field():
    diff = diff_plans(load_plan(ROOT / PAIRS[0][0]), load_plan(ROOT / PAIRS[0][1]))
    data = json.loads(json.dumps(diff_to_json(diff)))
    spec_change = next(i for i, c in enumerate(data["changes"]) if c["kind"] == "spec_changed")
    data["changes"][spec_change]["after"]["shape"] = "wide"
    with pytest.raises(PlanError, match=rf"corrupt diff changes \({spec_change}\.spec_changed\.after\.shape: .*tuple"):
        changes_from_json(data, "review.json")


# --- the command ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "shipped"), [((), "plan.schema.json"), (("plan",), "plan.schema.json"), (("diff",), "diff.schema.json")]
)
def test_schema_prints_the_shipped_schema(args, shipped):
    result = CliRunner().invoke(app, ["schema", *args])
    assert result.exit_code == 0
    package = "shardscope.diff" if shipped.startswith("diff") else "shardscope.plan"
    assert result.stdout == shipped_schema(package, shipped)


def test_schema_of_an_unknown_format_is_one_line_and_exit_2():
    result = CliRunner().invoke(app, ["schema", "plna"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "shardscope: error: unknown schema 'plna'; did you mean 'plan'? (known: diff, plan)"
    ]
