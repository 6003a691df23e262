"""The published JSON Schemas: generated from the records, shipped current, and every stored plan valid."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from shardscope.errors import PlanError
from shardscope.plan.json import plan_from_dict, plan_from_json, plan_to_json
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
