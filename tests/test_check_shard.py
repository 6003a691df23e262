"""`check --shard K/N`: a golden set split for CI matrices, each case in exactly one shard."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shardscope.cli import main
from shardscope.errors import ShardscopeError
from shardscope.golden.cases import load_manifest, parse_shard, shard_cases

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("count", [1, 2, 3, 5, 22, 40])
def test_the_shards_partition_the_golden_set(count):
    cases = load_manifest(ROOT / "golden")
    shards = [shard_cases(cases, index, count) for index in range(1, count + 1)]
    ids = [case.case_id for shard in shards for case in shard]
    assert sorted(ids) == sorted(case.case_id for case in cases)  # every case …
    assert len(ids) == len(set(ids))  # … in exactly one shard
    assert max(map(len, shards)) - min(map(len, shards)) <= 1  # and the shards are even
    assert shards == [shard_cases(cases, index, count) for index in range(1, count + 1)]  # deterministic


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("0/3", "counted from 1"),
        ("4/3", "out of range"),
        ("1/0", "expected K/N"),
        ("x/3", "expected K/N"),
        ("3", "K/N"),
    ],
)
def test_a_wrong_shard_is_refused(text, fragment):
    with pytest.raises(ShardscopeError, match=fragment):
        parse_shard(text)


def test_the_last_shard_is_n_of_n():
    assert parse_shard("3/3") == (3, 3) and parse_shard(" 1 / 1 ") == (1, 1)


def test_each_shard_checks_its_cases_and_only_the_first_reports_orphans(tmp_path, monkeypatch, capsys):
    # Goldens missing (nothing to compile) and one orphan: what each shard says is decided before compiling.
    golden = tmp_path / "golden"
    (golden / "gone" / "cpu-8").mkdir(parents=True)
    (golden / "gone" / "cpu-8" / "default.json").write_text("{}")
    cases = "".join(f"  - {{model: deepseek-tiny, preset: {p}}}\n" for p in ("default", "ep-as-cp", "ep-tp"))
    (golden / "cases.yaml").write_text("cases:\n" + cases)
    seen = {}
    for index in (1, 2):
        monkeypatch.setattr(
            sys, "argv", ["shardscope", "check", "--golden", str(golden), "--shard", f"{index}/2", "--json"]
        )
        with pytest.raises(SystemExit) as exit_info:
            main()
        assert exit_info.value.code == 1
        seen[index] = {c["case"]: c["status"] for c in json.loads(capsys.readouterr().out)["cases"]}
    assert seen[1] == {
        "deepseek-tiny/cpu-8/default": "missing",
        "deepseek-tiny/cpu-8/ep-tp": "missing",
        "gone/cpu-8/default.json": "orphan",
    }
    assert seen[2] == {"deepseek-tiny/cpu-8/ep-as-cp": "missing"}
