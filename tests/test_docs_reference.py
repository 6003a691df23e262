"""The docs' generated reference (docs/hooks.py) holds every command and option of the command line, every
built-in preset and rule, every lint and every hardware generation, and the reference pages ask for it."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import typer.main

from shardscope.case.hardware import known_hardware, load_hardware
from shardscope.case.lints import LINTS
from shardscope.case.presets import builtin_preset_names, get_preset
from shardscope.cli import app

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("shardscope_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_holds_every_command_and_option(hooks):
    reference = hooks.render_cli()
    group = typer.main.get_command(app)
    context = typer.Context(group, info_name="shardscope")
    names = group.list_commands(context)
    assert len(names) >= 14
    for name in names:
        command = group.get_command(context, name)
        assert f"### `{name}` {{#{name}}}" in reference, name
        section = reference.split(f"### `{name}` {{#{name}}}", 1)[1].split("\n### ", 1)[0]
        assert f"shardscope {name} " in section, name
        for parameter in command.params:
            if parameter.param_type_name == "option" and not parameter.hidden:
                for flag in [*parameter.opts, *parameter.secondary_opts]:
                    assert re.search(rf"`[^`]*{re.escape(flag)}\b", section), f"{name} {flag}"
                assert " ".join((parameter.help or "").split()) in section.replace("\\|", "|"), (
                    f"{name} {parameter.name}"
                )
            elif parameter.param_type_name == "argument":
                label = (parameter.metavar or parameter.name).lower()
                assert re.search(rf"^\| `[^`]*{re.escape(label)}", section.lower(), flags=re.M), f"{name} {label}"
                assert " ".join((parameter.help or "").split()) in section, f"{name} {parameter.name}"


def test_the_cli_reference_shows_defaults_as_help_does(hooks):
    dump = hooks.render_cli().split("### `dump` {#dump}", 1)[1].split("\n### ", 1)[0]
    assert "| `-t, --topology <str>` | cpu-N (N fake CPU devices). [default: cpu-8] |" in dump


def test_the_presets_reference_lists_every_preset_and_rule_in_order(hooks):
    reference = hooks.render_presets()
    for name in builtin_preset_names():
        section = reference.split(f"## `{name}` {{#{name}}}", 1)[1].split("\n## ", 1)[0]
        rows = re.findall(r"^\| (\d+) \| `([^`]+)` \|", section, flags=re.M)
        rules = get_preset(name).logical_axis_rules
        assert [(int(i), logical) for i, logical in rows] == [(i, rule[0]) for i, rule in enumerate(rules)], name


def test_the_lints_reference_explains_every_lint(hooks):
    reference = hooks.render_lints()
    for lint in LINTS.values():
        assert f"## `{lint.id}` {{#{lint.id}}}" in reference
        assert lint.explanation in reference


def test_the_hardware_reference_has_every_generation_and_ignores_a_table_of_ones_own(hooks, monkeypatch, tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text("generations: {v5p: {peak_bf16_flops: 1.0}}\n")
    monkeypatch.setenv("SHARDSCOPE_HARDWARE_TABLE", str(own))
    reference = hooks.render_hardware()
    header = reference.splitlines()[0]
    assert [g.strip(" `") for g in header.split("|")[2:-1]] == known_hardware()
    monkeypatch.delenv("SHARDSCOPE_HARDWARE_TABLE")
    peak = f"{load_hardware('v5p').peak_bf16_flops / 1e12:,.0f}"
    assert re.search(rf"^\| peak bf16 TFLOP/s \|.*\| {peak} \|", reference, flags=re.M)


def test_reference_pages_ask_for_the_generated_sections(hooks):
    for name in hooks.RENDERERS:
        page = DOCS / "reference" / f"{name}.md"
        assert f"<!-- generated: {name} -->" in page.read_text(encoding="utf-8"), page
    rendered = hooks.on_page_markdown("# Lints\n\n<!-- generated: lints -->\n")
    assert "<!-- generated" not in rendered and "`dead-rule`" in rendered
    with pytest.raises(ValueError, match="unknown generated section 'nope'"):
        hooks.on_page_markdown("<!-- generated: nope -->")


def test_the_reference_renders_without_jax_in_a_fresh_process():
    """The docs build stays light: the registries and the command line load without JAX."""
    import subprocess

    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('h', {str(DOCS / 'hooks.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "for render in m.RENDERERS.values(): render()\n"
        "print('jax' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_code_cites_only_documents_in_the_repository():
    """Comments and docstrings point at ARCHITECTURE.md and docs pages that exist, never at a design document
    the repository does not have."""
    root = DOCS.parent
    cited: set[str] = set()
    for folder in ("shardscope", "reference_models", "benchmarks", "scripts"):
        for path in (root / folder).rglob("*"):
            if path.suffix not in (".py", ".yaml", ".yml", ".j2") or not path.is_file():
                continue
            if "maxtext" in path.relative_to(root).parts[:3]:
                continue  # MaxText's own config files, as MaxText ships them (citing MaxText's docs)
            text = path.read_text(encoding="utf-8")
            assert not re.search(r"DESIGN(\.md)? ?§", text), f"{path} cites a document the repository lacks"
            if path.suffix == ".py":  # data files cite other projects' docs (MaxText's sources of a run)
                cited |= set(re.findall(r"\b(ARCHITECTURE\.md|docs/[\w/.-]+\.md)", text))
    assert "ARCHITECTURE.md" in cited
    assert all((root / document).is_file() for document in cited), sorted(cited)
