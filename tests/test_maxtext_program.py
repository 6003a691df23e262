"""`maxtext:MODEL`: MaxText's own training step planned from MaxText's own code (the installed `maxtext`).

The ground truth is MaxText itself: its checked-in sharding goldens (and the dumps of other cases made with
MaxText's unmodified dump script, `tests/data/maxtext/`), each reproduced from its own command line; and the
NNX variables' own logical axes. Needs Python 3.12 (MaxText's floor) with `shardscope[maxtext]` (MaxText 0.2.4)
or `shardscope[maxtext025]` (0.2.5) installed: on an older Python the module is skipped, on 3.12 a missing
MaxText fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import pytest
from typer.testing import CliRunner

if sys.version_info < (3, 12):
    pytest.skip("maxtext: models need Python 3.12 or newer (MaxText's floor)", allow_module_level=True)

import maxtext  # on 3.12 the route's tests need MaxText: installed by `scripts/test.sh`

import shardscope
from shardscope.case.maxtext_model import (
    MaxTextError,
    find_tree,
    resolve_maxtext_model,
    translate_renamed_keys,
)
from shardscope.case.maxtext_releases import RELEASES, SUPPORTED_VERSIONS
from shardscope.case.maxtext_run import parse_maxtext_args
from shardscope.case.topology import get_topology
from shardscope.cli import app
from shardscope.extract.maxtext_dump import dump_to_plan, parse_dump_path

# The quick lane (`-m "not slow"`) leaves these out: MaxText's own programs built and compiled.
pytestmark = pytest.mark.slow

# The fake CPU pool of the session (8 devices, conftest) starts before a TPU case would size it to 1: the CPU
# route plans on a pool of exactly its topology's devices, as MaxText sizes its batch by the device count.
jax.devices()

# The installed MaxText release (`shardscope[maxtext]`: 0.2.4; `shardscope[maxtext025]`: 0.2.5).
RELEASE = find_tree(None).release
DATA = Path(__file__).parent / "data" / "maxtext" / "sharding_info"
# MaxText's goldens here are 0.2.4's (e591f30), dumped from its Linen model: a release's program is compared
# with the goldens of that release. 0.2.5's are in neither its wheel nor a stored checkout of its source.
GOLDENS_RELEASE = "0.2.4"
# MaxText's own checked-in goldens (tests/utils/sharding_info/ of MaxText at the supported version): all of them,
# as MaxText's `sharding_dump.TEST_CASES` lists them.
MAXTEXT_GOLDENS = (
    "deepseek2-16b/tpu7x-16/slice_1/rule_default",
    "deepseek2-16b/tpu7x-16/slice_1/rule_pure-fsdp",
    "deepseek2-16b/v6e-16/slice_1/rule_default_ici_fsdp_parallelism=-1_ici_expert_parallelism=4",
    "deepseek2-16b/v6e-16/slice_1/rule_pipeline-large-moe_ici_fsdp_parallelism=-1_ici_expert_parallelism=4"
    "_use_ring_of_experts=true",
    "deepseek2-16b/tpu7x-8/slice_1/rule_ep-as-cp_ici_fsdp_parallelism=-1_ici_expert_parallelism=2",
    "deepseek2-16b/tpu7x-8/slice_1/rule_cp-as-ep_ici_fsdp_parallelism=-1_ici_context_parallelism=2"
    "_ici_expert_parallelism=2",
    "deepseek2-16b/tpu7x-16/slice_1/rule_ep-as-dp_ici_fsdp_parallelism=-1_ici_expert_parallelism=2"
    "_use_ring_of_experts=true",
    "deepseek2-16b/tpu7x-8/slice_1/rule_shard-exp-on-fsdp_ici_fsdp_parallelism=-1_ici_expert_parallelism=2",
    "qwen3-0.6b/tpu7x-16/slice_1/rule_default",
    "gpt-oss-20b/tpu7x-16/slice_1/rule_default",
    "gpt-oss-20b/tpu7x-16/slice_1/rule_default_ici_fsdp_parallelism=-1_ici_expert_parallelism=2",
)
# Every other case in tests/data dumped by MaxText's own unmodified dump script under MaxText's rule files
# (pipelines, Explicit axes, ZeRO-1, two slices, the real DeepSeek-V3, Mixtral and Llama shapes); dumps under
# a rule file of a user's (`tp-heads`) are not MaxText's to build.
OTHER_DUMPS = tuple(
    sorted(
        str(p.parent.relative_to(DATA))
        for p in DATA.glob("*/*/*/*/named_shardings.json")
        if str(p.parent.relative_to(DATA)) not in MAXTEXT_GOLDENS and "rule_tp-heads" not in str(p)
    )
)
# A small step that compiles in seconds on the fake CPU devices: two of Qwen3-0.6B's layers, short sequences.
SMALL = "override_model_config=true base_num_decoder_layers=2 per_device_batch_size=1 max_target_length=128"


def dump_command_line(directory: Path) -> tuple[str, str, list[str]]:
    """The case of a MaxText dump directory as MaxText's `run_sharding_dump` runs it: model, topology, and the
    command line (float32 weights, the rule file, the overrides in the directory's name, Linen)."""
    case = parse_dump_path(directory)
    words = ["weight_dtype=float32"]
    if case.rule != "default":
        words.append(f"custom_mesh_and_rule={case.rule}")
    words += [f"{key}={value}" for key, value in case.overrides]
    words += ["pure_nnx=False", "enable_nnx=False", "pure_nnx_decoder=False"]
    return case.model, case.topology, words


def state_and_activations(plan):
    return {path: t for path, t in plan.tensors if t.kind in ("param", "opt_state", "activation")}


def test_every_maxtext_golden_case_is_here():
    assert all((DATA / golden / "named_shardings.json").is_file() for golden in MAXTEXT_GOLDENS)


@pytest.mark.skipif(RELEASE.version != GOLDENS_RELEASE, reason=f"MaxText's goldens here are {GOLDENS_RELEASE}'s")
@pytest.mark.parametrize("golden", MAXTEXT_GOLDENS + OTHER_DUMPS)
def test_maxtext_plan_reproduces_maxtexts_own_golden(golden):
    """Every parameter, Adam moment and count (path, shape, logical axes, spec) and every activation constraint
    (name, shape, dtype, logical axes, spec): entry for entry, from the case's own command line."""
    directory = DATA / golden
    model, topology, words = dump_command_line(directory)
    case = parse_dump_path(directory)
    topology = topology if case.slices == 1 else f"{case.slices}x{topology}"
    plan = shardscope.plan_case(f"maxtext:{model}", topology=topology, maxtext=words, tensors_only=True)
    expected = dump_to_plan(directory)
    assert plan.case.mesh == expected.case.mesh
    ours, theirs = state_and_activations(plan), state_and_activations(expected)
    assert sorted(ours) == sorted(theirs)
    assert {p: t for p, t in ours.items() if t != theirs[p]} == {}


@pytest.fixture(scope="module")
def qwen_plans():
    """Qwen3-0.6B (two layers) compiled on cpu-8 under MaxText's default NNX model and (a release that has one)
    under Linen."""
    nnx = shardscope.plan_case("maxtext:qwen3-0.6b", maxtext=SMALL)
    if not RELEASE.linen:
        return nnx, None
    linen = shardscope.plan_case("maxtext:qwen3-0.6b", maxtext=f"{SMALL} pure_nnx=False enable_nnx=False")
    return nnx, linen


def test_nnx_state_is_planned_with_the_logical_axes_of_maxtexts_variables(qwen_plans):
    nnx, _ = qwen_plans
    import jax
    from flax import nnx as flax_nnx

    from shardscope.stages.maxtext_program import build_maxtext_step

    case = resolve_maxtext_model("maxtext:qwen3-0.6b", get_topology("cpu-8"), parse_maxtext_args(SMALL))
    assert case.tree == find_tree(None)
    step = build_maxtext_step(case, lower=False, compile_step=False)
    variables = jax.tree_util.tree_flatten_with_path(step.state, is_leaf=lambda x: isinstance(x, flax_nnx.Param))[0]
    params = {
        "/".join(str(k.key) for k in path): v
        for path, v in variables
        if isinstance(v, flax_nnx.Param) and str(path[0].key) == "model"
    }
    assert params, "MaxText's NNX state holds its parameters under model/"
    for name, variable in params.items():
        record = nnx.tensor_map["params/" + name.removeprefix("model/")]
        assert record.kind == "param"
        assert record.logical == tuple(variable.get_metadata()["out_sharding"])
        assert record.shape == tuple(variable.get_value().shape)


@pytest.mark.skipif(not RELEASE.linen, reason=f"MaxText {RELEASE.version} has no Linen model")
def test_linen_and_nnx_programs_place_every_weight_and_moment_alike(qwen_plans):
    nnx, linen = qwen_plans
    weights = lambda plan: {p: t for p, t in plan.tensors if t.kind in ("param", "opt_state") and "rngs" not in p}  # noqa: E731
    assert weights(nnx) == weights(linen)
    assert len(weights(nnx)) > 30


def test_compiled_plan_has_passes_causes_in_maxtexts_lines_and_hbm_by_role(qwen_plans):
    nnx, _ = qwen_plans
    assert nnx.collectives, "a step on 8 devices under FSDP moves data"
    traffic = {p: sum(r.traffic or 0 for r in nnx.collectives if r.pass_ == p) for p in ("forward", "backward")}
    assert traffic["forward"] > 0 and traffic["backward"] > 0
    lines = [r.cause.line for r in nnx.collectives if r.cause is not None and r.cause.line]
    assert lines and all(line.startswith("maxtext/") for line in lines)
    # Each weight gathered over fsdp is named, with the rule that put its dimension there.
    gathered = [r for r in nnx.collectives if r.op == "all-gather" and r.cause is not None]
    assert any(t.startswith("params/") for r in gathered for t in r.cause.tensors)
    assert any(rule.logical == "embed" for r in gathered for rule in r.cause.rules)
    kinds = {t.kind for _, t in nnx.tensors}
    assert {"param", "opt_state", "input", "activation", "output"} <= kinds
    assert nnx.holds("memory") and nnx.work and nnx.compute


def test_priced_maxtext_plan_says_its_route_and_counts_state_in_hbm(qwen_plans):
    from shardscope.cost.price import price_plan

    priced = price_plan(qwen_plans[0], "v5p", None)
    estimate = priced.estimate
    assert estimate is not None and "CPU compile priced as v5p" in estimate.route
    hbm = dict(estimate.memory.categories)
    params = sum(t.bytes_per_device for _, t in qwen_plans[0].tensors if t.kind == "param")
    assert hbm["params"] == params > 0 and hbm["optimizer_state"] > 0
    assert estimate.expected is not None
    assert estimate.step_full_overlap <= estimate.expected <= estimate.step_no_overlap


runner = CliRunner()


def cli(*args: str):
    return runner.invoke(app, list(args))


def test_dump_writes_a_maxtext_plan_and_diff_of_two_command_lines_shows_the_move(tmp_path):
    fsdp, tensor = tmp_path / "fsdp.json", tmp_path / "tensor.json"
    assert cli("dump", "maxtext:qwen3-0.6b", "--tensors-only", "-o", str(fsdp)).exit_code == 0
    result = cli(
        "dump", "maxtext:qwen3-0.6b", "--tensors-only", "--maxtext", "ici_tensor_parallelism=2", "-o", str(tensor)
    )
    assert result.exit_code == 0, result.output
    assert json.loads(fsdp.read_text())["case"]["model"] == "maxtext:qwen3-0.6b"
    result = cli("diff", str(fsdp), str(tensor), "--json")
    assert result.exit_code == 1, result.output
    changes = json.loads(result.output)
    moved = {c["path"] for c in changes["tensors"]} if isinstance(changes.get("tensors"), list) else set()
    assert any("self_attention/query" in path for path in moved) or "query" in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["maxtext:qwen3-0.6", "--tensors-only"], "did you mean maxtext:qwen3-0.6b"),
        (["maxtext:qwen3-0.6b", "--maxtext-path", "/nonexistent"], "not a MaxText tree"),
        (["maxtext:qwen3-0.6b", "--maxtext", "per_device_batch_size=abc", "--tensors-only"], "per_device_batch_size"),
        (["maxtext:qwen3-0.6b", "--preset", "ep-as-cp"], "--preset does not apply"),
        (["deepseek-tiny", "--maxtext-path", "/tmp"], "--maxtext-path plans a maxtext:MODEL"),
        (["maxtext:qwen3-0.6b", "--maxtext", "model_name=llama2-7b"], "the model is maxtext:NAME"),
        (["maxtext:qwen3-0.6b", "--maxtext", "no_such_key=1", "--tensors-only"], "has no key 'no_such_key'"),
    ],
)
def test_wrong_maxtext_input_is_one_line_and_exit_2(args, expected):
    result = cli("dump", *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.output


def test_a_maxtext_version_this_route_does_not_know_is_refused_by_name(tmp_path):
    tree = tmp_path / "src" / "maxtext"
    (tree / "configs" / "models").mkdir(parents=True)
    (tree / "configs" / "base.yml").write_text("model_name: default\n")
    (tree / "version.py").write_text('__version__ = "9.9.9"\n')
    result = cli("dump", "maxtext:qwen3-0.6b", "--maxtext-path", str(tmp_path))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "9.9.9" in result.output
    assert all(f"{r.version} (JAX {r.jax})" in result.output for r in RELEASES.values())


def test_a_supported_maxtext_release_on_another_jax_is_refused_naming_the_jax_and_its_install(tmp_path):
    """The other supported release's tree, in this environment, whose JAX is the installed release's: refused in
    one line with the JAX it needs and the extra that installs it, before anything imports it."""
    other = next(r for r in RELEASES.values() if r.version != RELEASE.version)
    tree = tmp_path / "src" / "maxtext"
    (tree / "configs" / "models").mkdir(parents=True)
    (tree / "configs" / "base.yml").write_text("model_name: default\n")
    (tree / "version.py").write_text(f'__version__ = "{other.version}"\n')
    result = cli("dump", "maxtext:qwen3-0.6b", "--maxtext-path", str(tmp_path))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"MaxText {other.version} needs JAX {other.jax}" in result.output
    assert f"this environment has JAX {jax.__version__}" in result.output and other.extra in result.output


def test_maxtext_not_importable_names_the_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "maxtext" else real(name, *a))
    result = cli("dump", "maxtext:qwen3-0.6b")
    assert result.exit_code == 2 and "pip install 'shardscope[maxtext]'" in result.output


def test_ragged_all_to_all_on_the_cpu_route_is_one_line_naming_the_tpu_route():
    moe = f"{SMALL.replace('qwen3', '')} ici_expert_parallelism=4"
    result = cli("dump", "maxtext:qwen3-30b-a3b", "--maxtext", moe)
    assert result.exit_code == 2, result.output
    assert "ragged all-to-all" in result.output and "TPU topology" in result.output
    assert "sparse_matmul=false" in result.output


def test_a_key_maxtext_renamed_is_planned_under_the_trees_name_and_said_so(tmp_path):
    """Ironwood's published command lines say `fsdp_shard_on_exp`, which MaxText 0.2.4 calls `shard_exp_on_fsdp`:
    planned as the new name (the experts' weights sharded over fsdp, not left at the key's default), with a
    warning line and the translation in the plan's provenance."""
    moe = f"{SMALL} ici_fsdp_parallelism=-1"
    plans = {}
    for name, extra in (("old", "fsdp_shard_on_exp=true"), ("new", "shard_exp_on_fsdp=true"), ("default", "")):
        path = tmp_path / f"{name}.json"
        result = cli("dump", "maxtext:qwen3-30b-a3b", "--tensors-only", "--maxtext", f"{moe} {extra}", "-o", str(path))
        assert result.exit_code == 0, result.output
        warned = f"fsdp_shard_on_exp: MaxText {RELEASE.version} names this key shard_exp_on_fsdp" in result.output
        assert warned == (name == "old"), result.output
        plans[name] = shardscope.load_plan(path)
    experts = [path for path in plans["new"].tensor_map if path.endswith("/moe_block/wi_0")]
    assert experts
    spec = {name: plan.tensor_map[experts[0]].spec for name, plan in plans.items()}
    assert spec["old"] == spec["new"] != spec["default"]
    assert dict(plans["old"].case.overrides)["shard_exp_on_fsdp"] == "true"
    assert dict(plans["old"].provenance)["maxtext_renamed"] == "fsdp_shard_on_exp -> shard_exp_on_fsdp"
    assert "maxtext_renamed" not in dict(plans["new"].provenance)


def test_a_renamed_key_is_translated_only_where_the_tree_knows_the_new_name_alone():
    given = (("fsdp_shard_on_exp", "true"), ("steps", "5"))
    renamed = (("fsdp_shard_on_exp", "shard_exp_on_fsdp"),)
    assert translate_renamed_keys(given, frozenset({"shard_exp_on_fsdp", "steps"})) == (
        (("shard_exp_on_fsdp", "true"), ("steps", "5")),
        renamed,
    )
    # An earlier tree that still has the old name is planned as written.
    assert translate_renamed_keys(given, frozenset({"fsdp_shard_on_exp", "steps"})) == (given, ())
    with pytest.raises(MaxTextError, match="earlier name of shard_exp_on_fsdp"):
        translate_renamed_keys((*given, ("shard_exp_on_fsdp", "false")), frozenset({"shard_exp_on_fsdp"}))


def test_tokamax_grouped_matmul_builds_for_a_tpu_and_counts_as_grouped_work():
    """`use_tokamax_gmm=True` picks tokamax's kernel by the default device (this host's CPU, which it refuses):
    for a TPU topology it is traced as on the TPU, its Mosaic grouped matmuls counted as grouped work from their
    shapes; what the build changed for tokamax is restored after it."""
    from absl import flags
    from jax._src.pallas.mosaic import tpu_info
    from jax.extend import backend
    from tokamax._src.ops import op

    parsed, kind = flags.FLAGS.is_parsed(), tpu_info.get_device_kind
    moe = "override_model_config=true base_num_decoder_layers=1 per_device_batch_size=1 max_target_length=256"
    plan = shardscope.plan_case(
        "maxtext:qwen3-30b-a3b",
        topology="tpu7x-8",
        maxtext=f"{moe} sparse_matmul=true megablox=false use_tokamax_gmm=true",
    )
    grouped = {w.pass_: w.flops for w in plan.work if w.kind == "grouped"}
    # Qwen3-30B-A3B: 256 tokens a device, each to 8 experts of 2048 → 768 (wi_0, wi_1) and 768 → 2048 (wo).
    rows, embed, mlp = 256 * 8, 2048, 768
    assert grouped["forward"] == 3 * 2 * rows * embed * mlp
    # Under MaxText's default full remat the backward pass recomputes the forward one, then both gradients.
    assert grouped["backward"] == 3 * grouped["forward"]
    assert op.backend is backend and tpu_info.get_device_kind is kind and flags.FLAGS.is_parsed() == parsed


def test_planning_leaves_the_process_compilation_cache_alone(qwen_plans):
    """MaxText's config would point JAX's persistent compilation cache at ~/jax_cache; a plan compiles afresh
    (a cached program carries another tree's source lines) and leaves the process's cache setting as it was."""
    assert qwen_plans[0].collectives
    assert jax.config.jax_compilation_cache_dir in (None, "")


def test_the_same_maxtext_case_gives_byte_identical_plan_json(tmp_path):
    runs = [tmp_path / f"run{i}.json" for i in range(2)]
    for path in runs:
        result = cli("dump", "maxtext:qwen3-0.6b", "--maxtext", SMALL, "-o", str(path))
        assert result.exit_code == 0, result.output
    first, second = (json.loads(p.read_text()) for p in runs)
    first.pop("provenance"), second.pop("provenance")
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def test_check_guards_a_maxtext_golden_and_fails_a_change_to_maxtexts_model_code(tmp_path):
    """A `maxtext:` case in cases.yaml is a golden like any other; the same case built from a MaxText tree whose
    MLP output weight lost its `embed` axis (a one-word edit of layers/linears.py) fails `check`, and the report
    names the weight that moved."""
    import shutil

    import yaml

    golden, edited = tmp_path / "golden", tmp_path / "edited"
    golden.mkdir()
    shutil.copytree(
        Path(maxtext.__file__).parent,
        edited / "src" / "maxtext",
        ignore=shutil.ignore_patterns("assets", "__pycache__"),
    )
    linears = edited / "src" / "maxtext" / "layers" / "linears.py"
    source = linears.read_text()
    assert source.count('kernel_axes=("mlp", "embed")') == 1
    linears.write_text(source.replace('kernel_axes=("mlp", "embed")', 'kernel_axes=("mlp", None)'))
    case = {"model": "maxtext:qwen3-0.6b", "maxtext": SMALL, "name": "small"}
    (golden / "cases.yaml").write_text(yaml.safe_dump({"cases": [case]}))
    result = cli("update", "--golden", str(golden))
    assert result.exit_code == 0, result.output
    assert (golden / "maxtext" / "qwen3-0.6b" / "cpu-8" / "small.json").is_file()
    assert cli("check", "--golden", str(golden)).exit_code == 0
    (golden / "cases.yaml").write_text(yaml.safe_dump({"cases": [{**case, "maxtext_path": "../edited"}]}))
    report = tmp_path / "report.md"
    result = cli("check", "--golden", str(golden), "--markdown", str(report))
    assert result.exit_code == 1, result.output
    assert "mlp/wo/kernel" in report.read_text()


def test_list_shows_maxtexts_own_models():
    listing = json.loads(cli("list", "--json").output)["maxtext"]
    models = sorted(p.stem for p in (Path(maxtext.__file__).parent / "configs" / "models").glob("*.yml"))
    assert listing["models"] == [f"maxtext:{m}" for m in models] and listing["version"] in SUPPORTED_VERSIONS


def test_lint_plans_maxtexts_program_and_names_an_unsharded_large_weight(tmp_path):
    """MaxText's default rules on qwen3-0.6b lint clean (the rule-file lints its shared rules would trip are
    silenced, and said so); the same program with MaxText's rules replaced, on its command line, by two that
    shard nothing leaves the 155M-parameter embedding replicated, which `large-replicated` names."""
    clean = cli("lint", "maxtext:qwen3-0.6b", "--no-compile", "--json")
    assert clean.exit_code == 0, clean.output
    assert json.loads(clean.output)["silenced"] == ["dead-rule", "shadowed-rule", "unit-axis-rule"]
    rules = "logical_axis_rules=[['vocab',[]],['embed_vocab',[]]]"
    flagged = cli("lint", "maxtext:qwen3-0.6b", "--no-compile", "--json", "--maxtext", rules)
    findings = json.loads(flagged.output)["findings"]
    assert flagged.exit_code == 1, flagged.output
    assert any(f["id"] == "large-replicated" and "token_embedder/embedding" in f["subject"] for f in findings)


def test_the_docs_maxtext_commands_run_as_written(tmp_path):
    """The `maxtext:` commands of the MaxText guide (and `why` of the plan one writes), in order, as a user
    types them."""
    import re
    import shlex
    import subprocess

    guide = (Path(__file__).resolve().parent.parent / "docs" / "how-to" / "maxtext-models.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", guide, flags=re.S)
    lines = [line.split("  #", 1)[0].strip() for block in blocks for line in block.splitlines()]
    commands = [c for c in lines if c.startswith("shardscope ") and ("maxtext:" in c or "qwen.json" in c)]
    assert len(commands) >= 4, commands
    program = Path(sys.executable).parent / "shardscope"  # this environment's console script, not PATH's
    assert program.is_file()
    for command in commands:
        result = subprocess.run([program, *shlex.split(command)[1:]], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        assert "Traceback" not in result.stderr
