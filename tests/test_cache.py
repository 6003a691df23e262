"""The plan cache: every input of a plan is in its key (each change is a miss), entries are whole, a hit
compiles nothing, and after one preset changes only the cases that use it are compiled again."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import shardscope.golden.cache as cache
from shardscope.case import resolve_case
from shardscope.case.presets import PRESET_DIR
from shardscope.golden.cases import GoldenCase

ROOT = Path(__file__).resolve().parent.parent


def key(model="deepseek-tiny", preset="ep-as-cp", topology="cpu-8", mesh=None, settings=None, tensors_only=False):
    return cache.case_key(resolve_case(model, preset, topology, mesh or {}, settings or {}), tensors_only)


def test_every_input_is_in_the_key(tmp_path, monkeypatch):
    base = key()
    assert key() == base  # deterministic
    rules = tmp_path / "ep-as-cp.yaml"
    shutil.copy(PRESET_DIR / "ep-as-cp.yaml", rules)
    same_rules = key(preset=str(rules))
    assert key(preset=str(rules)) == same_rules  # the same file: the same plan
    rules.write_text(rules.read_text().replace("['activation_length', ['expert']],", "['activation_length', []],"))
    changed = {
        "model": key(model="mixtral-tiny"),
        "model setting": key(settings={"model.seq_len": "64"}),
        "preset": key(preset="default"),
        "preset file content": key(preset=str(rules)),
        "preset setting": key(settings={"moe": "ring"}),
        "topology": key(topology="cpu-16", mesh={"fsdp": -1, "expert": 2}),
        "mesh": key(mesh={"fsdp": 2, "expert": 4}),
        "tensors only": key(tensors_only=True),
    }
    # The same rules from a file are another plan: it names the file its preset came from (`preset_source`).
    assert same_rules != base
    monkeypatch.setattr(cache, "source_digest", lambda: "edited")
    changed["sources"] = key()
    monkeypatch.undo()
    versions = cache.package_versions() | {"jax": "0.0.1"}
    monkeypatch.setattr(cache, "package_versions", lambda: versions)
    changed["versions"] = key()
    monkeypatch.undo()
    monkeypatch.setattr(cache, "compiler_options_for", lambda case: {"xla_backend_optimization_level": 3})
    changed["compiler options"] = key()
    monkeypatch.undo()
    assert key() == base
    assert len({base, *changed.values()}) == len(changed) + 1, changed


def test_a_source_edit_changes_the_digest(tmp_path):
    shutil.copytree(ROOT / "reference_models", tmp_path / "reference_models")
    before = cache.source_digest((tmp_path / "reference_models",))
    layer = tmp_path / "reference_models" / "moe.py"
    layer.write_text(layer.read_text() + "\n# an edit\n")
    assert cache.source_digest((tmp_path / "reference_models",)) != before


def test_store_and_load_and_a_damaged_entry_is_a_miss(tmp_path):
    text = (ROOT / "golden" / "deepseek-tiny" / "cpu-8" / "default.json").read_text()
    assert cache.load_plan_text("ab" * 32, tmp_path) is None
    cache.store("ab" * 32, text, tmp_path)
    assert cache.load_plan_text("ab" * 32, tmp_path) == text
    entry = tmp_path / "plans" / "ab" / f"{'ab' * 32}.json"
    entry.write_text(text[: len(text) // 2])
    assert cache.load_plan_text("ab" * 32, tmp_path) is None


def _store_many(args):
    key_, text, root = args
    for _ in range(20):
        cache.store(key_, text, Path(root))
    return cache.load_plan_text(key_, Path(root))


def test_concurrent_writers_leave_a_whole_entry(tmp_path):
    text = (ROOT / "golden" / "deepseek-tiny" / "cpu-8" / "default.json").read_text()
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        seen = pool.map(_store_many, [("cd" * 32, text, str(tmp_path))] * 4)
    assert all(s in (None, text) for s in seen)
    assert cache.load_plan_text("cd" * 32, tmp_path) == text
    assert not list((tmp_path / "plans").rglob("*.tmp"))


@pytest.mark.slow
def test_a_hit_starts_no_jax_and_gives_the_same_plan(tmp_path):
    env = dict(os.environ, SHARDSCOPE_CACHE_DIR=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="2")
    first = tmp_path / "first.json"
    command = ["dump", "mixtral-tiny", "--preset", "ep-as-cp", "-o"]
    subprocess.run([sys.executable, "-m", "shardscope.cli", *command, str(first)], check=True, env=env, cwd=tmp_path)
    second = tmp_path / "second.json"
    probe = (
        "import sys; from shardscope.cli import main; sys.argv = ['shardscope', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "assert 'jax' not in sys.modules, 'a cache hit imported jax'\n"
    )
    subprocess.run([sys.executable, "-c", probe, *command, str(second)], check=True, env=env, cwd=tmp_path)
    assert second.read_text() == first.read_text()


@pytest.mark.slow
def test_after_editing_one_preset_only_its_cases_compile(tmp_path, monkeypatch):
    import shardscope.golden.runner as runner

    for name in ("ep-as-cp", "ep-tp"):
        shutil.copy(PRESET_DIR / f"{name}.yaml", tmp_path / f"{name}-copy.yaml")
    cases = [
        GoldenCase("mixtral-tiny", str(tmp_path / "ep-as-cp-copy.yaml"), name="a"),
        GoldenCase("mixtral-tiny", str(tmp_path / "ep-tp-copy.yaml"), name="b"),
    ]
    compiled: list[list[str]] = []
    real = runner._compile_cases

    def spy(golden_cases, resolved, jobs, ray):
        compiled.append([c.name for c in golden_cases])
        return real(golden_cases, resolved, jobs, ray)

    monkeypatch.setattr(runner, "_compile_cases", spy)
    first = {r.case.name: r.plan_json for r in runner.dump_cases(cases, jobs=1)}
    assert compiled == [["a", "b"]]
    assert {r.case.name: r.plan_json for r in runner.dump_cases(cases, jobs=1)} == first
    assert compiled[-1] == []  # nothing changed: no compile at all
    edited = tmp_path / "ep-tp-copy.yaml"
    edited.write_text(edited.read_text().replace("['activation_heads', ['expert']],", "['activation_heads', []],"))
    again = {r.case.name: r.plan_json for r in runner.dump_cases(cases, jobs=1)}
    assert compiled[-1] == ["b"]
    assert again["a"] == first["a"] and again["b"] != first["b"]
    # Without the cache everything compiles.
    list(runner.dump_cases(cases, jobs=1, use_cache=False))
    assert compiled[-1] == ["a", "b"]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDSCOPE_CACHE_DIR", str(tmp_path / "session-cache"))


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SHARDSCOPE_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("SHARDSCOPE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "shardscope"


@pytest.mark.parametrize(
    ("jaxlib", "options"),
    [
        ("0.10.2", {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}),
        # JAX 0.11's CPU compiler has only its fusion emitters, and refuses the option that chose the others.
        ("0.11.2", {"xla_backend_optimization_level": 0}),
    ],
)
def test_the_cpu_compile_options_are_those_the_installed_jaxlib_has(monkeypatch, jaxlib, options):
    from importlib import metadata

    from shardscope.case.cpu_options import cpu_compiler_options

    monkeypatch.setattr(metadata, "version", lambda name: jaxlib if name == "jaxlib" else "0")
    cpu_compiler_options.cache_clear()
    try:
        assert cpu_compiler_options() == options
    finally:
        cpu_compiler_options.cache_clear()
