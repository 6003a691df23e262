"""`advise`: the search space, pruning against compiling everything, ranking, resuming, and its outputs."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import sys
import time
from importlib import resources

import pytest
import yaml

from shardscope.advise.advice import SweepProgress
from shardscope.advise.export import CSV_COLUMNS, advice_to_csv, advice_to_json
from shardscope.advise.prune import INDIVISIBLE, MEMORY
from shardscope.advise.rank import compiled_candidates
from shardscope.advise.space import count_factorizations, divisors, factorizations
from shardscope.advise.sweep import SweepRequest, advise, enumerate_candidates
from shardscope.case.hardware import TABLE_ENV
from shardscope.case.presets import get_preset
from shardscope.case.topology import parse_mesh_arg, resolve_mesh
from shardscope.cli import main

# The quick lane (`-m "not slow"`) leaves these out: each sweep compiles tens of candidate plans.
pytestmark = pytest.mark.slow

# One preset per tiny model, every mesh of 8 devices over the axes it can use (20 candidates each, one of
# deepseek-tiny's indivisible): the search the exhaustive test repeats by compiling every candidate.
SEARCHES = (("deepseek-tiny", "ep-tp"), ("mixtral-tiny", "ep-as-cp"))


def request_for(model: str, preset: str, **fields) -> SweepRequest:
    return SweepRequest(model, "cpu-8", (preset,), hardware="v5p", **fields)


def figures(advice):
    """What a ranking says, row by row."""
    return [
        (e.rank, e.candidate.key, e.step_no_overlap, e.step_full_overlap, e.hbm_need, e.reason, e.command)
        for e in advice.ranking
    ]


def test_factorizations_are_every_ordered_product():
    for devices in (1, 8, 12, 128):
        for axes in range(4):
            listed = list(factorizations(devices, ["a"] * axes))
            assert len(listed) == len(set(listed)) == count_factorizations(devices, axes)
            for sizes in listed:
                product = 1
                for size in sizes:
                    product *= size
                assert product == devices
    assert divisors(12) == (1, 2, 3, 4, 6, 12)
    # By brute force: every tuple over the divisors whose product is 8, three axes.
    brute = [(a, b, c) for a in divisors(8) for b in divisors(8) for c in divisors(8) if a * b * c == 8]
    assert sorted(brute) == list(factorizations(8, ["x", "y", "z"]))


@pytest.fixture(scope="module")
def exhaustive():
    """Every valid candidate of each search compiled and ranked on the real v5p table (fills the plan cache)."""
    return {model: advise(request_for(model, preset, exhaustive=True), jobs=2) for model, preset in SEARCHES}


def _small_hbm_table(tmp_path, capacity: int):
    built_in = yaml.safe_load(resources.files("shardscope.case").joinpath("hardware.yaml").read_text())
    v5p = dict(built_in["generations"]["v5p"], hbm_bytes=capacity)
    path = tmp_path / "small-hbm.yaml"
    path.write_text(yaml.safe_dump({"generations": {"v5p": v5p}}))
    return path


@pytest.mark.parametrize(("model", "preset"), SEARCHES)
def test_the_pruned_search_ranks_as_compiling_every_candidate(model, preset, exhaustive, tmp_path, monkeypatch):
    everything = exhaustive[model]
    assert everything.enumerated == 20 and len(everything.ranking) >= 10
    # An HBM between the candidates' needs (each v5p device is one chip), so that memory prunes some of them.
    needs = sorted(e.hbm_need for e in compiled_candidates(everything))
    capacity = needs[len(needs) // 2]
    monkeypatch.setenv(TABLE_ENV, str(_small_hbm_table(tmp_path, capacity)))

    full = advise(request_for(model, preset, exhaustive=True), jobs=2)
    pruned = advise(request_for(model, preset), jobs=2)

    # Both read what the fixture compiled (a refused compile is not cached: it is tried again).
    assert full.compiled == len(full.failed) and pruned.compiled == len(pruned.failed) == 0
    assert pruned.pruned_by(MEMORY) >= 3, "the capacity must make the memory bound prune something"
    assert len(full.over_capacity) >= pruned.pruned_by(MEMORY)
    assert figures(pruned) == figures(full)
    refused = {c.key for c, _ in full.failed}
    over = {e.candidate.key for e in full.over_capacity}
    for screening in pruned.pruned:
        key = screening.candidate.key
        if screening.verdict == MEMORY:
            assert key in over, f"{key} was pruned for memory but fits when compiled"
        elif screening.verdict == INDIVISIBLE:
            assert key in refused, f"{key} was pruned as indivisible but compiles"
    assert {e.candidate.key for e in pruned.over_capacity} <= over
    # Every candidate is accounted for exactly once.
    ranked = {e.candidate.key for e in compiled_candidates(pruned)} | {c.key for c, _ in pruned.failed}
    assert len(ranked) + len(pruned.pruned) == pruned.enumerated


def test_the_ranking_is_ordered_and_each_row_says_why(exhaustive):
    advice = exhaustive["deepseek-tiny"]
    steps = [e.step_expected for e in advice.ranking]
    assert steps == sorted(steps)
    assert [e.rank for e in advice.ranking] == list(range(1, len(advice.ranking) + 1))
    best = advice.ranking[0]
    assert best.reason.startswith("best: largest collective")
    axes, op, _ = best.dominant
    assert f"{op} over {axes}" in best.reason
    for entry in advice.ranking[1:]:
        assert "over #1" in entry.reason or entry.reason.startswith("ties #1"), entry.reason


def test_plans_equal_up_to_rounding_are_said_to_tie(exhaustive):
    from shardscope.advise.rank import rank

    best = exhaustive["deepseek-tiny"].ranking[0]
    twin = dataclasses.replace(
        best,
        candidate=dataclasses.replace(best.candidate, index=best.candidate.index + 100),
        program="another program",
        step_expected=best.step_expected * (1 + 1e-15),
        step_no_overlap=best.step_no_overlap * (1 - 1e-15),
    )
    slower = dataclasses.replace(twin, program="a third program", step_no_overlap=best.step_no_overlap * 1.5)
    ranked, over = rank([slower, twin, best])
    assert [e.candidate.index for e in ranked] == [best.candidate.index, twin.candidate.index, slower.candidate.index]
    assert ranked[1].reason == "same estimate as #1 (listed after it in search order)"
    assert ranked[2].reason.startswith("ties #1 expected;") and " 0 s " not in ranked[2].reason
    assert over == ()


def test_presets_that_compile_to_one_program_are_one_row(exhaustive):
    from shardscope.advise.rank import rank

    best = exhaustive["deepseek-tiny"].ranking[0]
    alias = dataclasses.replace(
        best,
        candidate=dataclasses.replace(
            best.candidate, index=best.candidate.index + 100, preset="pure-fsdp", preset_label="pure-fsdp"
        ),
    )
    ranked, _ = rank([alias, best])
    assert len(ranked) == 1 and ranked[0].candidate.index == best.candidate.index
    assert ranked[0].same_program == ("pure-fsdp",)


def test_each_command_reproduces_its_mesh(exhaustive):
    """The printed `dump` command resolves to exactly the candidate's mesh (what `dump` would compile)."""
    for advice in exhaustive.values():
        for entry in compiled_candidates(advice):
            words = entry.command.split()
            preset = get_preset(words[words.index("--preset") + 1])
            mesh = parse_mesh_arg(words[words.index("--mesh") + 1])
            assert resolve_mesh(preset, 8, mesh) == entry.candidate.mesh, entry.command
            assert words[words.index("--hardware") + 1] == "v5p"


def test_json_and_csv_say_the_same(exhaustive):
    advice = exhaustive["mixtral-tiny"]
    data = advice_to_json(advice)
    assert data["counts"]["enumerated"] == 20
    assert [r["mesh"] for r in data["ranking"]] == [e.candidate.mesh_text for e in advice.ranking]
    rows = list(csv.DictReader(io.StringIO(advice_to_csv(advice))))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == len(compiled_candidates(advice))
    assert [float(r["step_no_overlap_s"]) for r in rows[: len(advice.ranking)]] == [
        e.step_no_overlap for e in advice.ranking
    ]


def test_the_library_gives_the_ranking_as_a_table(exhaustive):
    import shardscope

    advice = shardscope.rank_shardings("mixtral-tiny", presets=["ep-as-cp"], hardware="v5p", jobs=2)
    assert figures(advice) == figures(exhaustive["mixtral-tiny"])
    frame = advice.frame()
    assert tuple(frame.columns) == CSV_COLUMNS
    assert frame["rank"].tolist() == [e.rank for e in compiled_candidates(advice)]
    assert frame.loc[frame["rank"] == 1, "mesh"].item() == advice.ranking[0].candidate.mesh_text


def test_an_interrupted_sweep_continues_from_what_it_has(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    request = request_for("mixtral-tiny", "ep-as-cp", pinned=(("data", 1), ("stage", 1)))
    seen = []

    def stop_after_two(state):
        seen.append(state)
        if state.done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        advise(request, jobs=1, progress=stop_after_two)
    assert [s.done for s in seen] == [1, 2] and seen[-1].total == 4
    resumed = advise(request, jobs=1)
    assert (resumed.cached, resumed.compiled) == (2, 2)
    again = advise(request, jobs=1)
    assert (again.cached, again.compiled) == (4, 0)
    assert figures(again) == figures(resumed)
    # Progress reports the best plan so far, which after the last candidate is the winner.
    states = []
    final = advise(request, jobs=1, progress=states.append)
    assert states[-1].done == states[-1].total == 4
    assert states[-1].best is not None and states[-1].best.candidate == final.ranking[0].candidate


def test_held_axes_limit_the_search(tmp_path):
    from shardscope.advise.template import load_template, template_case
    from shardscope.case.topology import get_topology

    request = request_for("mixtral-tiny", "ep-as-cp", pinned=(("data", 1), ("stage", 1)))
    template = load_template(template_case("mixtral-tiny", "ep-as-cp", "cpu-8", {}), get_topology("cpu-8"))
    candidates = enumerate_candidates(request, {"ep-as-cp": template})
    assert [dict(c.mesh)["fsdp"] * dict(c.mesh)["expert"] for c in candidates] == [8, 8, 8, 8]
    assert all(dict(c.mesh)["data"] == dict(c.mesh)["stage"] == 1 for c in candidates)


def test_the_command_prints_a_ranked_table_and_writes_every_format(exhaustive, tmp_path, monkeypatch, capsys):
    html, table = tmp_path / "advice.html", tmp_path / "advice.csv"
    # --confirm 0: compile every candidate screening passes, as the exhaustive search it is held against.
    argv = ["shardscope", "advise", "deepseek-tiny", "-p", "ep-tp", "--hardware", "v5p", "--top", "3", "--confirm", "0"]
    monkeypatch.setattr(sys, "argv", [*argv, "--html", str(html), "--csv", str(table)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    best = exhaustive["deepseek-tiny"].ranking[0]
    assert "20 candidates, 1 pruned without compiling (1 indivisible)" in out
    assert f"#1 {best.reason}" in out and f"   {best.command}" in out and "#4 " not in out
    page = html.read_text()
    assert "Shardings ranked" in page and "<svg" in page and best.command.replace("'", "&#39;") in page
    assert table.read_text().startswith(",".join(CSV_COLUMNS))
    monkeypatch.setattr(sys, "argv", [*argv, "--json"])
    with pytest.raises(SystemExit):
        main()
    data = json.loads(capsys.readouterr().out)
    assert data["ranking"][0]["command"] == best.command
    assert dataclasses.asdict(best.candidate)["preset"] == "ep-tp"


# Held so that ep-as-cp searches only fsdp=8, where it places every tensor as pure-fsdp does (expert=1).
ONLY_FSDP = (("data", 1), ("stage", 1), ("expert", 1))


def test_presets_that_place_alike_are_compiled_once(tmp_path, monkeypatch):
    from shardscope.golden import runner

    monkeypatch.setenv("SHARDSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    compiled = []
    compile_one = runner.dump_one

    def counting(case):
        compiled.append(case.preset)
        return compile_one(case)

    monkeypatch.setattr(runner, "dump_one", counting)
    request = SweepRequest("mixtral-tiny", "cpu-8", ("pure-fsdp", "ep-as-cp"), pinned=ONLY_FSDP, hardware="v5p")
    both = advise(request, jobs=1)
    assert compiled == ["pure-fsdp"]
    assert (both.enumerated, both.compiled, both.cached, both.same_program) == (2, 1, 0, 1)
    (row,) = both.ranking
    assert row.candidate.preset == "pure-fsdp" and row.same_program == ("ep-as-cp",)
    # What it shares is what compiling ep-as-cp on its own gives.
    (own,) = advise(request_for("mixtral-tiny", "ep-as-cp", pinned=ONLY_FSDP), jobs=1).ranking
    assert compiled == ["pure-fsdp", "ep-as-cp"]
    assert row.step_expected == pytest.approx(own.step_expected, rel=1e-9) and row.hbm_need == own.hbm_need
    assert [(a, o) for a, o, _ in row.by_collective] == [(a, o) for a, o, _ in own.by_collective]
    # Run again, the group comes from the cache as a whole.
    again = advise(request, jobs=1)
    assert len(compiled) == 2 and (again.compiled, again.cached, again.same_program) == (0, 1, 1)
    assert figures(again) == figures(both)


def test_the_same_placement_under_other_settings_is_another_program():
    """Everything the compile reads besides placement keeps candidates apart, even where every tensor is
    placed alike; a preset that differs only in what the compile never reads does not."""
    from shardscope.advise.programs import program_key
    from shardscope.advise.template import load_template, template_case
    from shardscope.case.resolve import resolve_case
    from shardscope.case.topology import get_topology

    def placed_and_key(preset: str, settings: dict[str, str]):
        template = load_template(template_case("mixtral-tiny", preset, "cpu-8", {}), get_topology("cpu-8"))
        mesh = {axis: 8 if axis == "fsdp" else 1 for axis in get_preset(preset).mesh_axes}
        case = resolve_case("mixtral-tiny", preset, "cpu-8", mesh, settings)
        placed = template.place(case.mesh, pipelined=False)
        return [(path, t.spec) for path, t in placed.tensors], program_key(case, template, placed)

    specs, key = placed_and_key("ep-as-cp", {})
    assert placed_and_key("pure-fsdp", {}) == (specs, key)
    others = [
        ("ep-as-cp", {"model.remat": "none"}),
        ("ep-as-cp", {"moe": "ring"}),
        ("ep-as-cp", {"shard_mode": "explicit"}),
        ("explicit-pipeline", {}),  # the same rules on this mesh, but explicit axes (its pipeline is off)
    ]
    for preset, settings in others:
        other_specs, other_key = placed_and_key(preset, settings)
        assert other_specs == specs, (preset, settings)
        assert other_key != key, (preset, settings)


def test_a_piped_advise_prints_a_line_per_tenth_of_its_plans(monkeypatch, capsys):
    argv = ["shardscope", "advise", "mixtral-tiny", "-p", "pure-fsdp", "-p", "ep-as-cp", "--mesh", "data=1,stage=1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--hardware", "v5p", "--confirm", "0"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 0
    captured = capsys.readouterr()
    # Five candidates, four programs (pure-fsdp and ep-as-cp are one on fsdp=8): a line per plan, nothing else.
    line = re.compile(r"advise: (\d+)% \((\d) of 4 plans done, (\d+ min )?\d+ s\)")
    lines = [line.fullmatch(text) for text in captured.err.splitlines()]
    assert all(lines), captured.err
    assert [(int(m[1]), int(m[2])) for m in lines if m] == [(25, 1), (50, 2), (75, 3), (100, 4)]
    assert "5 candidates" in captured.out and "the same compiled program under ep-as-cp" in captured.out


@pytest.mark.parametrize("total", [1, 3, 10, 19, 37, 1000])
def test_piped_progress_is_at_most_ten_lines(total, capsys):
    from shardscope.cli.advise import _piped_progress

    tick = _piped_progress(time.monotonic() - 75)
    for done in range(1, total + 1):
        tick(SweepProgress(done, total, 0, None, f"candidate {done}"))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == min(total, 10)
    assert lines[-1] == f"advise: 100% ({total} of {total} plans done, 1 min 15 s)"
    percents = [int(line.removeprefix("advise: ").split("%")[0]) for line in lines]
    assert percents == sorted(set(percents)) and all(p >= 10 for p in percents)


def test_advise_takes_maxtexts_command_line(tmp_path, monkeypatch):
    # MaxText's command line fixes how every candidate runs (its sequence, batch, dtype), the rules
    # (custom_mesh_and_rule) and the axes it sizes (ici_*); what it leaves to the defaults is searched.
    from typer.testing import CliRunner

    from shardscope.case.resolve import maxtext_search
    from shardscope.cli import app

    monkeypatch.setenv("SHARDSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    words = "custom_mesh_and_rule=ep-as-cp ici_expert_parallelism=2 ici_fsdp_parallelism=4 max_target_length=64"
    search = maxtext_search("mixtral-tiny", words, None)
    assert search.preset == "ep-as-cp" and dict(search.pins) == {"expert": 2, "fsdp": 4}
    assert dict(search.settings)["model.seq_len"] == "64"
    result = CliRunner().invoke(app, ["advise", "mixtral-tiny", "--maxtext", words, "--json", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ranking"] and all(row["preset"] == "ep-as-cp" for row in data["ranking"])
    for row in data["ranking"]:
        mesh = parse_mesh_arg(row["mesh"])
        assert mesh["expert"] == 2 and mesh["fsdp"] == 4
        assert "--set model.seq_len=64" in row["command"]
    for wrong, message in (
        (["--mesh", "data=1"], "--mesh with --maxtext"),
        (["--preset", "pure-fsdp"], "name other rules"),
    ):
        refused = CliRunner().invoke(app, ["advise", "mixtral-tiny", "--maxtext", words, *wrong])
        assert refused.exit_code == 2 and message in refused.output


def test_a_predicted_search_compiles_only_the_best_few_and_says_which_figures_are_which(exhaustive):
    request = request_for("deepseek-tiny", "ep-tp", confirm=2, margin=0.0)
    advice = advise(request, jobs=2)
    screened_in = sum(s.verdict == "compile" for s in advice.screenings)
    assert advice.predicted == screened_in == 19
    priced = compiled_candidates(advice)
    compiled = [e for e in priced if e.source == "compiled"]
    predicted = [e for e in priced if e.source == "predicted"]
    assert len(compiled) == 2 and len(predicted) == screened_in - 2
    # The compiled rows carry the exhaustive search's own figures for their candidates, and their prediction.
    full = {e.candidate.key: e for e in compiled_candidates(exhaustive["deepseek-tiny"])}
    for entry in compiled:
        assert entry.step_expected == full[entry.candidate.key].step_expected
        assert entry.predicted_step is not None and entry.predicted_step > 0
    # The two compiled are the two best predicted, and rank above every predicted-only row.
    by_prediction = sorted((e for e in priced if e.fits), key=lambda e: (e.predicted_step, e.candidate.index))
    assert {e.candidate.key for e in compiled} == {e.candidate.key for e in by_prediction[:2]}
    ranks = {e.candidate.key: e.rank for e in advice.ranking}
    assert max(ranks[e.candidate.key] for e in compiled) < min(ranks[e.candidate.key] for e in predicted if e.fits)
    rows = list(csv.DictReader(io.StringIO(advice_to_csv(advice))))
    assert {r["source"] for r in rows} == {"compiled", "predicted"}
    assert all(r["predicted_step_s"] for r in rows)


def test_predict_only_compiles_nothing_and_a_margin_compiles_the_close_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDSCOPE_CACHE_DIR", str(tmp_path))
    alone = advise(request_for("mixtral-tiny", "ep-as-cp", predict_only=True), jobs=1)
    assert alone.compiled == alone.cached == 0 and alone.predicted > 0
    assert all(e.source == "predicted" for e in compiled_candidates(alone))
    predicted = {e.candidate.key: e.step_expected for e in alone.ranking}
    steps = sorted(set(predicted.values()))
    # A margin that reaches the third-best predicted step compiles exactly those within it.
    margin = steps[2] / steps[0] - 1 + 1e-9
    close = advise(request_for("mixtral-tiny", "ep-as-cp", confirm=1, margin=margin), jobs=2)
    compiled = {e.candidate.key for e in compiled_candidates(close) if e.source == "compiled"}
    assert compiled == {key for key, step in predicted.items() if step <= steps[2]} and len(compiled) >= 3


def test_the_commands_defaults_are_the_librarys():
    from shardscope.advise import advice
    from shardscope.cli import advise as command

    assert (command.DEFAULT_CONFIRM, command.DEFAULT_MARGIN) == (advice.DEFAULT_CONFIRM, advice.DEFAULT_MARGIN)


def _maxtext_space(tmp_path, args, free, held, devices=8, experts=None):
    """A `maxtext:` search space over a stand-in MaxText tree (its model config only)."""
    from shardscope.advise.maxtext_sweep import MaxTextSpace
    from shardscope.case.maxtext_model import MaxTextCase, MaxTextTree
    from shardscope.case.topology import get_topology

    models = tmp_path / "maxtext" / "configs" / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / "m.yml").write_text("" if experts is None else f"num_experts: {experts}\n")
    tree = MaxTextTree(tmp_path / "maxtext", "0.2.4", checkout=False)
    case = MaxTextCase("m", get_topology(f"cpu-{devices}"), args, tree)
    return MaxTextSpace(case, " ".join(f"{k}={v}" for k, v in args), held, free, devices)


def test_maxtext_candidates_factor_the_slice_over_the_free_axes_holding_what_the_command_line_sizes(tmp_path):
    from shardscope.advise.maxtext_sweep import candidate_line, maxtext_candidates

    args = (("per_device_batch_size", "2"), ("ici_tensor_parallelism", "2"))
    space = _maxtext_space(tmp_path, args, ("data", "fsdp"), (("tensor", 2),))
    candidates = maxtext_candidates(space)
    assert [dict(c.mesh) for c in candidates] == [
        {"data": 1, "fsdp": 4, "tensor": 2},
        {"data": 2, "fsdp": 2, "tensor": 2},
        {"data": 4, "fsdp": 1, "tensor": 2},
    ]
    assert {c.preset_label for c in candidates} == {"default"}
    # The user's keys first, the candidate's sizes after them (MaxText takes a key's last value).
    assert candidate_line(space, candidates[1]) == (
        "per_device_batch_size=2 ici_tensor_parallelism=2 ici_data_parallelism=2 ici_fsdp_parallelism=2"
    )


def test_maxtext_space_searches_expert_parallelism_only_for_a_model_with_experts(tmp_path, monkeypatch):
    from shardscope.advise import maxtext_sweep
    from shardscope.errors import ShardscopeError

    for experts, free in ((None, ("data", "fsdp", "tensor")), (8, ("data", "fsdp", "tensor", "expert"))):
        stand_in = _maxtext_space(tmp_path, (), (), (), experts=experts).case
        monkeypatch.setattr(maxtext_sweep, "resolve_maxtext_model", lambda *_args, case=stand_in: case)
        assert maxtext_sweep.maxtext_space("maxtext:m", "cpu-8", "", None).free == free
    with pytest.raises(ShardscopeError, match="do not divide a slice's 8 devices"):
        stand_in = _maxtext_space(tmp_path, (("ici_tensor_parallelism", "3"),), (), ()).case
        monkeypatch.setattr(maxtext_sweep, "resolve_maxtext_model", lambda *_args, case=stand_in: case)
        maxtext_sweep.maxtext_space("maxtext:m", "cpu-8", "ici_tensor_parallelism=3", None)
