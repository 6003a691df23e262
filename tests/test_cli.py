"""The CLI: exit codes, one-line errors for every wrong input, explain and list output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import pytest
from typer.testing import CliRunner

from shardscope.cli import app

runner = CliRunner()
DATA = Path(__file__).parent / "data"


def run(*args: str):
    return runner.invoke(app, list(args))


def assert_user_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("shardscope: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("dump", "deepseek-tin"), ("unknown model 'deepseek-tin'", "did you mean 'deepseek-tiny'")),
        (("dump", "deepseek-tiny", "--preset", "ep-as-cpp"), ("unknown preset 'ep-as-cpp'", "did you mean 'ep-as-cp'")),
        (("dump", "deepseek-tiny", "--topology", "cpu8"), ("unknown topology 'cpu8'", "did you mean 'cpu-8'")),
        (("dump", "deepseek-tiny", "--mesh", "fsdp=3,expert=2"), ("uses 6 devices but the topology has 8",)),
        (("dump", "deepseek-tiny", "--preset", "ep-as-cp", "--mesh", "tensor=2"), ("missing mesh axis", "'tensor'")),
        (("dump", "deepseek-tiny", "--set", "model.seq_len=abc"), ("expected a positive integer",)),
        (("dump", "deepseek-tiny", "--set", "moe=ragged"), ("moe must be one of all_to_all, ring",)),
        (("dump", "deepseek-tiny", "--set", "mo=ring"), ("unknown setting 'mo'", "did you mean 'moe'")),
        (("explain", "--preset", "nope", "embed"), ("unknown preset 'nope'",)),
        (("explain", "--preset", "default", "--mesh", "fdsp=2", "embed"), ("'fdsp'", "did you mean 'fsdp'")),
        (("explain", "--preset", "default", "embed", "embed"), ("more than once",)),
    ],
)
def test_wrong_inputs_exit_2_with_one_line(args, fragments):
    assert_user_error(run(*args), *fragments)


def test_malformed_and_inconsistent_preset_files(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("mesh_axes: [fsdp\n")
    assert_user_error(run("dump", "deepseek-tiny", "--preset", str(bad_yaml)), "malformed YAML at line")
    missing_axis = tmp_path / "missing.yaml"
    missing_axis.write_text("mesh_axes: [fsdp]\nmesh: {fsdp: -1, expert: 2}\n")
    assert_user_error(run("explain", "--preset", str(missing_axis), "embed"), "missing mesh axis", "'expert'")
    # A rule may name an axis that mesh_axes lacks (MaxText accepts it as size 1); explain says so.
    absent_axis = tmp_path / "absent.yaml"
    absent_axis.write_text("mesh_axes: [fsdp]\nlogical_axis_rules: [[embed, [fsdp, expert]]]\n")
    result = run("explain", "--preset", str(absent_axis), "embed")
    assert result.exit_code == 0, result.output
    assert "'expert' is not in the preset's mesh_axes: size 1" in result.stdout
    assert_user_error(run("dump", "deepseek-tiny", "--preset", str(tmp_path / "nope.yaml")), "does not exist")


def test_dimension_that_the_mesh_does_not_divide():
    # The sequence (33) is sharded over expert=2 under ep-as-cp.
    result = run("dump", "mixtral-tiny", "--preset", "ep-as-cp", "--set", "model.seq_len=33")
    assert_user_error(result, "inputs/tokens: dimension 1 has size 33", "expert", "do not divide")


def test_mesh_larger_than_this_process_pool():
    # The test process has 8 devices; a 16-device mesh cannot be built in it.
    result = run("dump", "mixtral-tiny", "--topology", "cpu-16")
    assert_user_error(result, "needs 16 devices but this process has 8")


def test_unparsable_hlo_file(tmp_path):
    junk = tmp_path / "junk.txt"
    junk.write_text("this is not an HLO module\n")
    assert_user_error(run("collectives", str(junk)), str(junk))
    assert_user_error(run("collectives", str(tmp_path / "missing.txt")), "cannot read")


FOUR_DEVICES = """HloModule four, num_partitions=4

ENTRY main {
  p = f32[8] parameter(0)
  ROOT ag = f32[16] all-gather(p), dimensions={0}, replica_groups={{0,1},{2,3}}
}
"""


def test_collectives_mesh_with_a_size_filled_from_the_module(tmp_path):
    hlo = tmp_path / "four.hlo"
    hlo.write_text(FOUR_DEVICES)
    # data=2 x fsdp=(4 / 2): devices [[0, 1], [2, 3]], so {0,1} and {2,3} each vary along fsdp only.
    result = run("collectives", str(hlo), "--mesh", "data=2,fsdp=-1", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["collectives"]
    assert (row["op"], row["axes"], row["bytes"]) == ("all-gather", ["fsdp"], 64)
    # fsdp=-1 alone is fsdp=4: no subset of one axis of 4 splits devices in pairs; the groups are shown.
    result = run("collectives", str(hlo), "--mesh", "fsdp=-1", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["collectives"]
    assert row["axes"] is None and row["groups"] == "{{0,1},{2,3}}"


def test_collectives_of_a_truncated_file_say_what_was_read(tmp_path):
    hlo = tmp_path / "cut.hlo"
    hlo.write_text(FOUR_DEVICES[: FOUR_DEVICES.index("  ROOT")])
    result = run("collectives", str(hlo))
    assert result.exit_code == 0, result.output
    (warning,) = result.stderr.strip().splitlines()
    assert "ends inside computation 'main'" in warning and "read 0 computations in full" in warning


@pytest.mark.parametrize(
    ("preset", "axes"),
    [
        ("default", ["activation_batch", "activation_q_length", "activation_heads", "activation_kv"]),
        ("ep-as-cp", ["activation_batch", "activation_q_length", "None", "activation_kv"]),
        ("ep-as-cp", ["layers", "embed", "q_lora"]),
        ("shard-exp-on-fsdp", ["layers", "exp", "embed_moe", "mlp_moe"]),
        (str(DATA / "maxtext_style_rules.yml"), ["embed", "mlp"]),
    ],
)
def test_explain_json_reproduces_flax(preset, axes):
    from shardscope.case.presets import get_preset

    result = run("explain", "--preset", preset, "--json", *axes)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    rules = [(name, list(mesh_axes)) for name, mesh_axes in get_preset(preset).logical_axis_rules]
    logical = tuple(None if a == "None" else a for a in axes)
    flax_spec = nn.logical_to_mesh_axes(logical, rules)
    expected = []
    for entry in flax_spec:
        entry = list(entry) if isinstance(entry, (list, tuple)) else entry
        expected.append(None if entry == [] else entry[0] if isinstance(entry, list) and len(entry) == 1 else entry)
    assert payload["spec"] == expected
    assert len(payload["dims"]) == len(axes)


def test_explain_text_shows_rule_order():
    result = run("explain", "--preset", "ep-as-cp", "layers", "embed", "q_lora")
    assert result.exit_code == 0
    out = result.stdout
    assert "P('stage', None, 'fsdp')" in out
    assert "mesh axis 'fsdp' already used by dimension 2" in out
    assert "has size 1 on this mesh" in out  # stage=1 by default


def test_explain_json_skips_and_notes():
    result = run("explain", "--preset", "default", "--json", "embedd", "exp")
    payload = json.loads(result.stdout)
    assert payload["spec"] == [None, "expert"]
    assert payload["dims"][1]["rule"] is not None
    assert any("did you mean 'embed'" in note for note in payload["notes"])


def test_list_shows_every_registry():
    result = run("list")
    assert result.exit_code == 0
    for name in ("deepseek3-671b", "mixtral-8x22b", "ep-as-cp", "shard-exp-on-fsdp", "cpu-N"):
        assert name in result.stdout


def test_help_does_not_import_jax():
    code = "import sys; from shardscope.cli import app; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "deepseek-tiny" / "cpu-8"


def test_diff_exit_codes_and_reports(tmp_path):
    html, markdown = tmp_path / "r.html", tmp_path / "r.md"
    differ = run(
        "diff",
        str(GOLDEN / "default.json"),
        str(GOLDEN / "ep-as-cp.json"),
        "--html",
        str(html),
        "--markdown",
        str(markdown),
    )
    assert differ.exit_code == 1
    assert "self_attention/query" in differ.stdout  # the path, elided in the middle to fit 120 columns
    assert html.read_text().startswith("<!DOCTYPE html>")
    # A PR comment: the summary, the estimated-time table (goldens are priced) and the top changes, no more.
    assert len(markdown.read_text().splitlines()) < 80
    assert run("diff", str(GOLDEN / "default.json"), str(GOLDEN / "default.json")).exit_code == 0
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    assert_user_error(run("diff", str(corrupt), str(GOLDEN / "default.json")), "corrupt plan")
    assert_user_error(run("diff", str(tmp_path / "absent.json"), str(GOLDEN / "default.json")), "does not exist")


def test_check_and_update_input_errors(tmp_path):
    assert_user_error(run("check", "--golden", str(tmp_path)), "no cases.yaml")
    (tmp_path / "cases.yaml").write_text("cases:\n  - {model: deepseek-tiny, preset: default}\n")
    assert_user_error(run("update", "--golden", str(tmp_path), "deepseek-tiny/cpu-8/defualt"), "did you mean")
    (tmp_path / "cases.yaml").write_text("cases:\n  - {model: deepseek-tinny, preset: default}\n")
    assert_user_error(run("check", "--golden", str(tmp_path)), "unknown model 'deepseek-tinny'")


def test_h_is_help_and_version_is_the_package_version():
    from importlib import metadata

    assert run("-h").output == run("--help").output
    assert run("dump", "-h").output == run("dump", "--help").output
    result = run("--version")
    assert result.exit_code == 0 and result.output.strip() == f"shardscope {metadata.version('shardscope')}"


def test_every_command_that_prints_a_table_speaks_json(tmp_path):
    import shutil

    from reference_models import MODELS
    from shardscope.case.hardware import known_hardware
    from shardscope.case.presets import builtin_preset_names

    listing = json.loads(run("list", "--json").output)
    assert set(listing["models"]) == set(MODELS) and set(listing["presets"]) == set(builtin_preset_names())
    assert listing["hardware"] == known_hardware()
    golden = tmp_path / "golden"
    (golden / "deepseek-tiny" / "cpu-8").mkdir(parents=True)
    (golden / "cases.yaml").write_text("cases:\n  - {model: deepseek-tiny, preset: ep-as-cp}\n")
    shutil.copy(GOLDEN / "default.json", golden / "deepseek-tiny" / "cpu-8" / "ep-as-cp.json")
    checked = run("check", "--golden", str(golden), "--json", "--jobs", "1")
    data = json.loads(checked.output)
    assert checked.exit_code == 1 and data["failed"]
    (case,) = data["cases"]
    assert case["case"] == "deepseek-tiny/cpu-8/ep-as-cp" and case["status"] == "changed"
    assert {"kind": "case", "subject": "preset"}.items() <= next(
        c for c in case["diff"]["changes"] if c["subject"] == "preset"
    ).items()
    updated = json.loads(run("update", "--golden", str(golden), "--json", "--jobs", "1").output)
    assert [c["status"] for c in updated["cases"]] == ["updated"] and updated["orphans"] == []
    diffed = run("diff", str(GOLDEN / "default.json"), str(GOLDEN / "ep-as-cp.json"), "--json")
    assert diffed.exit_code == 1 and json.loads(diffed.output)["same"] is False
