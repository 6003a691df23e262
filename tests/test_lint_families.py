"""MaxText rule files as users have them: shared by every model family, and without mesh sizes.

The table of the names each family uses is regenerated here from the tiny models (a stale table fails), and
`lint`/`dump` are run on MaxText's own ep-as-cp.yml as a user would run them.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from shardscope.case.presets import get_preset
from shardscope.cli import app
from shardscope.lint.family_names import FAMILY_NAMES

ROOT = Path(__file__).resolve().parent.parent
EP_AS_CP = ROOT / "tests" / "data" / "maxtext" / "custom_mesh_and_rule" / "ep-as-cp.yml"
NOTE = (
    "note: ep-as-cp.yml sets no mesh sizes: planned on fsdp=8; its rules over data, stage, expert shard nothing "
    "here — size them with --mesh, e.g. --mesh expert=2 (MaxText: ici_expert_parallelism=2)"
)
runner = CliRunner()


def _script():
    spec = importlib.util.spec_from_file_location("family_names_script", ROOT / "scripts" / "family_names.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_family_table_is_what_the_tiny_models_use():
    script = _script()
    table = script.family_names()  # a tensors-only trace of each tiny model, in both shard modes
    assert table == FAMILY_NAMES, "stale: run `python scripts/family_names.py`"
    assert script.TABLE.read_text() == script.render(table)
    assert set(table) == {"deepseek", "mixtral", "llama"}


def lint_json(*args: str):
    result = runner.invoke(app, ["lint", "deepseek-tiny", "--no-compile", "--json", *args])
    return result, json.loads(result.stdout)


def other_family_rules(path: Path) -> list[str]:
    """`[index] name` of the file's rules for names deepseek-tiny does not use but another family does."""
    rules = yaml.safe_load(path.read_text())["logical_axis_rules"]
    deepseek = set(FAMILY_NAMES["deepseek"])
    others = {name for family, names in FAMILY_NAMES.items() if family != "deepseek" for name in names}
    return [f"[{i}] {name}" for i, (name, _) in enumerate(rules) if name in others - deepseek]


def maxtext_model_rules(path: Path) -> list[str]:
    """`[index] name` of the file's rules for names no family here uses but MaxText's shared rules (base.yml,
    the built-in default preset) name: rules for MaxText's other models."""
    rules = yaml.safe_load(path.read_text())["logical_axis_rules"]
    shared = {name for name, _ in get_preset("default").logical_axis_rules}
    families = {name for names in FAMILY_NAMES.values() for name in names}
    return [f"[{i}] {name}" for i, (name, _) in enumerate(rules) if name in shared - families]


def test_maxtexts_shared_file_on_deepseek_as_a_user_runs_it():
    result, payload = lint_json("--preset", str(EP_AS_CP))
    findings = payload["findings"]
    # Every rule the model does not use serves another model (a family here, or one of MaxText's others whose
    # names its shared rules carry): a summary, no warning, exit 0.
    assert result.exit_code == 0 and payload["counts"].get("warning", 0) == 0, result.stdout
    (summary,) = [f for f in findings if f["id"] == "rules-for-other-models"]
    expected = other_family_rules(EP_AS_CP)
    assert expected == ["[7] activation_length_attn", "[10] activation_embed_attn", "[35] layers"]
    assert summary["message"].endswith(f"llama, mixtral: {', '.join(expected)}")
    assert f"MaxText's other models: {', '.join(maxtext_model_rules(EP_AS_CP))};" in summary["message"]
    assert len(maxtext_model_rules(EP_AS_CP)) == 7
    assert not any("[layers," in f["subject"] for f in findings if f["id"] == "dead-rule")
    assert "moe_layers'" not in json.dumps([f["fix"] for f in findings]) and "may be meant" not in result.stdout
    # No mesh sizes in the file: one note, and no unit-axis-rule finding per rule.
    assert not [f for f in findings if f["id"] == "unit-axis-rule"]
    assert result.stderr.count(NOTE) == 1 and result.stderr.count("note:") == 1
    assert payload["notes"] == [NOTE.removeprefix("note: ")]


def test_rules_for_other_models_alone_do_not_fail_the_run(tmp_path):
    # The file with only the rules some family uses: what is left for deepseek is the summary, an info.
    raw = yaml.safe_load(EP_AS_CP.read_text())
    used = {name for names in FAMILY_NAMES.values() for name in names}
    raw["logical_axis_rules"] = [rule for rule in raw["logical_axis_rules"] if rule[0] in used]
    path = tmp_path / "shared.yml"
    path.write_text(yaml.safe_dump(raw))
    result, payload = lint_json("--preset", str(path))
    assert result.exit_code == 0, result.stdout
    assert [f["id"] for f in payload["findings"] if f["severity"] != "info"] == []
    assert [f["id"] for f in payload["findings"]].count("rules-for-other-models") == 1


def test_a_file_with_mesh_sizes_keeps_its_per_rule_unit_axis_findings(tmp_path):
    path = tmp_path / "sized.yml"
    path.write_text(EP_AS_CP.read_text() + "mesh: {fsdp: -1, expert: 2}\n")
    result, payload = lint_json("--preset", str(path))
    unit = [f["subject"] for f in payload["findings"] if f["id"] == "unit-axis-rule"]
    assert len(unit) >= 2 and all(s.startswith("logical_axis_rules[") for s in unit)
    assert "note:" not in result.stderr and payload["notes"] == []
    # Sized on the command line instead: no note either.
    result, _ = lint_json("--preset", str(EP_AS_CP), "--mesh", "expert=2")
    assert "note:" not in result.stderr


def test_dump_prints_the_same_note_once():
    result = runner.invoke(app, ["dump", "deepseek-tiny", "--preset", str(EP_AS_CP), "--tensors-only"])
    assert result.exit_code == 0, result.output
    assert result.stderr.count(NOTE) == 1 and NOTE not in result.stdout
