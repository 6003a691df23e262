"""The guarded cases: `cases.yaml` of a golden directory read into `GoldenCase`s, chosen by name or shard.

A golden directory holds `cases.yaml` (the cases to guard) and one plan per case (`shardscope.golden.store`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from shardscope.case.maxtext_run import parse_maxtext_args
from shardscope.case.topology import DEFAULT_TOPOLOGY
from shardscope.errors import ShardscopeError, unknown_name
from shardscope.verify.records import AGAINST_ONE_DEVICE

DEFAULT_GOLDEN_DIR = Path("golden")
MANIFEST = "cases.yaml"
_CASE_KEYS = (
    "model",
    "preset",
    "topology",
    "mesh",
    "set",
    "name",
    "hardware",
    "efficiency",
    "maxtext",
    "maxtext_path",
    "step",
    "verify",
)
MAXTEXT_PREFIX = "maxtext:"
# What `verify:` takes besides another case's name: the case's own step on one device.
ONE_DEVICE = AGAINST_ONE_DEVICE
_NAME = re.compile(r"[A-Za-z0-9_.=,@+-]+")


@dataclass(frozen=True)
class GoldenCase:
    """One guarded case: what to dump, and under which name its golden lives."""

    model: str
    preset: str  # a built-in name, or a preset file (resolved against the golden directory)
    topology: str = DEFAULT_TOPOLOGY
    mesh: str = ""  # as --mesh takes it
    settings: tuple[str, ...] = ()  # as --set takes them
    name: str = ""  # file stem; the preset when empty
    hardware: str | None = None  # the TPU generation a cpu-N plan is priced on (TPU topologies: their own)
    efficiency: float | None = None  # fraction of link bandwidth collectives reach; None: the table's
    maxtext: str = ""  # MaxText's command-line keys, as --maxtext takes them
    step: str = ""  # a program of one's own (`module:function`, see shardscope.step); model is then its name
    maxtext_path: str = ""  # a `maxtext:` model's MaxText checkout ("": the installed package)
    # `check` also runs the case's steps for real against this: "one-device", or another case (its name or
    # model/topology/name) of the same model and topology; "" verifies nothing.
    verify: str = ""

    @property
    def is_maxtext(self) -> bool:
        """MaxText's own program (`maxtext:NAME`), configured by its command line alone."""
        return self.model.startswith(MAXTEXT_PREFIX)

    @property
    def folder(self) -> str:
        """The model's folder in the golden directory (`maxtext:qwen3-0.6b` lives under maxtext/qwen3-0.6b)."""
        return self.model.replace(":", "/", 1) if self.is_maxtext else self.model

    @property
    def stem(self) -> str:
        """File name (without .json) of this case's golden."""
        return self.name or self.preset

    @property
    def case_id(self) -> str:
        """How users name the case on the command line: model/topology/stem."""
        return f"{self.model}/{self.topology}/{self.stem}"


def load_manifest(root: Path) -> tuple[GoldenCase, ...]:
    """Reads `cases.yaml` of a golden directory.

    Raises:
      ShardscopeError: no manifest, malformed YAML, unknown keys, or two cases with one golden path.
    """
    path = root / MANIFEST
    if not path.is_file():
        raise ShardscopeError(f"no {MANIFEST} in golden directory {root} (it lists the cases to guard)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ShardscopeError(f"{path}: malformed YAML{where}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise ShardscopeError(f"{path}: expected a mapping with a 'cases' list")
    unknown = sorted(str(key) for key in data if key not in ("cases", "hardware"))
    if unknown:
        raise ShardscopeError(f"{path}: {unknown_name('key', unknown[0], ('cases', 'hardware')).args[0]}")
    default_hardware = data.get("hardware")
    if default_hardware is not None and not isinstance(default_hardware, str):
        raise ShardscopeError(f"{path}: 'hardware' must be a TPU generation name such as v5p")
    cases = tuple(_parse_case(item, path, index, default_hardware) for index, item in enumerate(data["cases"]))
    seen: dict[str, int] = {}
    for index, case in enumerate(cases):
        if case.case_id in seen:
            raise ShardscopeError(f"{path}: cases {seen[case.case_id]} and {index} share the golden {case.case_id}")
        seen[case.case_id] = index
    for index, case in enumerate(cases):
        if case.verify:
            verified_against(case, cases, f"{path}: cases[{index}]")
    return cases


def verified_against(case: GoldenCase, cases: Sequence[GoldenCase], where: str = "") -> GoldenCase | None:
    """The case `case.verify` names (None: one device).

    Raises:
      ShardscopeError: a name no case has, the case itself, a case of another model or topology (for a
        `maxtext:` case, see `_maxtext_against`), or a program of one's own verified against anything but one
        device.
    """
    where = f"{where}: " if where else ""
    if case.maxtext and not case.is_maxtext:
        # A reference model configured by MaxText's keys: verify runs a reference model from its preset only.
        raise ShardscopeError(f"{where}verify runs the reference models' steps, not MaxText's (drop 'verify')")
    if case.verify == ONE_DEVICE:
        return None
    if case.step:
        raise ShardscopeError(f"{where}a step case verifies against {ONE_DEVICE} only, not {case.verify!r}")
    alike = [other for other in cases if (other.model, other.topology) == (case.model, case.topology)]
    named = {other.case_id: other for other in cases} | {other.stem: other for other in alike}
    if case.verify not in named:
        raise ShardscopeError(
            f"{where}verify: {unknown_name('case', case.verify, [ONE_DEVICE, *sorted(named)]).args[0]}"
        )
    other = named[case.verify]
    if other is case or other.case_id == case.case_id:
        raise ShardscopeError(f"{where}verify: a case cannot be verified against itself")
    if case.is_maxtext:
        return _maxtext_against(case, other, where)
    if (other.model, other.topology) != (case.model, case.topology) or other.step or other.maxtext:
        raise ShardscopeError(
            f"{where}verify: {other.case_id} is not a case of {case.model} on {case.topology}; verify compares "
            "one model's step under two shardings"
        )
    return other


def _maxtext_against(case: GoldenCase, other: GoldenCase, where: str) -> GoldenCase:
    """The other side of a `maxtext:` case: a case of the same model, topology and MaxText whose command line,
    laid over this case's (as `verify --against 'k=v …'` does), is that case's own.

    Raises:
      ShardscopeError: another model, topology or MaxText tree, or a key this case sets and the other does not
        (the other side would keep this case's value, which is not the other case).
    """
    if (other.model, other.topology, other.maxtext_path) != (case.model, case.topology, case.maxtext_path):
        raise ShardscopeError(
            f"{where}verify: {other.case_id} is not a case of {case.model} on {case.topology} from the same "
            "MaxText; verify compares one model's step under two command lines"
        )
    keys = {key for key, _ in parse_maxtext_args(other.maxtext)}
    missing = [key for key, _ in parse_maxtext_args(case.maxtext) if key not in keys]
    if missing:
        raise ShardscopeError(
            f"{where}verify: {other.case_id} sets no {missing[0]}, which this case sets; its command line is laid "
            f"over this one's, so give it every key this one sets (such as {missing[0]}=…)"
        )
    return other


def _parse_case(item: Any, path: Path, index: int, default_hardware: str | None = None) -> GoldenCase:
    where = f"{path}: cases[{index}]"
    if not isinstance(item, dict):
        raise ShardscopeError(f"{where} must be a mapping like {{model: deepseek-tiny, preset: default}}")
    for key in item:
        if key not in _CASE_KEYS:
            raise ShardscopeError(f"{where}: {unknown_name('key', str(key), _CASE_KEYS).args[0]}")
    if "step" in item:
        return _parse_step_case(item, path, where, default_hardware)
    if str(item.get("model", "")).startswith(MAXTEXT_PREFIX):
        return _parse_maxtext_case(item, path, where, default_hardware)
    if "model" not in item or ("preset" not in item and "maxtext" not in item):
        raise ShardscopeError(f"{where}: needs 'model' and 'preset' or 'maxtext' (or 'step' and 'name')")
    settings = item.get("set", [])
    if isinstance(settings, str):
        settings = [settings]
    efficiency = item.get("efficiency")
    if efficiency is not None and (isinstance(efficiency, bool) or not isinstance(efficiency, int | float)):
        raise ShardscopeError(f"{where}: 'efficiency' must be a number in (0, 1], found {efficiency!r}")
    topology = str(item.get("topology", DEFAULT_TOPOLOGY))
    # The manifest's hardware prices the CPU cases; a TPU case prices as its own topology unless it names one.
    hardware = item.get("hardware", default_hardware if topology.startswith("cpu-") else None)
    case = GoldenCase(
        model=str(item["model"]),
        preset=str(item.get("preset", "")),
        topology=topology,
        mesh=str(item.get("mesh", "")),
        settings=tuple(str(s) for s in settings),
        name=str(item.get("name", "")),
        hardware=None if hardware is None else str(hardware),
        efficiency=None if efficiency is None else float(efficiency),
        maxtext=str(item.get("maxtext", "")),
        verify=str(item.get("verify", "")),
    )
    if not case.stem:
        raise ShardscopeError(f"{where}: a case without a preset needs a 'name' for its golden")
    if case.maxtext and case.mesh:
        raise ShardscopeError(f"{where}: 'mesh' with 'maxtext': size the mesh with MaxText's ici_*_parallelism keys")
    if case.preset.endswith((".yaml", ".yml")):
        # A project's own rule file, relative to the golden directory; its golden needs a name.
        if not case.name:
            raise ShardscopeError(f"{where}: a preset file needs a 'name' for its golden")
        preset_path = Path(case.preset)
        case = dataclasses.replace(
            case, preset=str(preset_path if preset_path.is_absolute() else path.parent / preset_path)
        )
    for part in (case.model, case.topology, case.stem):
        if not _NAME.fullmatch(part):
            raise ShardscopeError(f"{where}: {part!r} cannot be part of a golden path")
    return case


def _parse_step_case(item: dict[str, Any], path: Path, where: str, default_hardware: str | None) -> GoldenCase:
    """`{step: module:function, name: my-step}`: a program of one's own; its golden is <name>/<topology>/step.json.

    A step given as a file (`steps/train.py:make_step`) is found relative to the golden directory, as preset
    files are; a module (`my_pkg.steps:make_step`) is imported from the working directory.
    """
    extra = sorted(set(item) - {"step", "name", "topology", "hardware", "efficiency", "verify"})
    if extra:
        raise ShardscopeError(f"{where}: a step case brings its own mesh and shardings; {extra[0]!r} does not apply")
    if not item.get("name"):
        raise ShardscopeError(f"{where}: a step case needs a 'name' for its golden")
    step = str(item["step"])
    module, sep, function = step.rpartition(":")
    if sep and module.endswith(".py") and not Path(module).is_absolute():
        step = f"{path.parent / module}:{function}"
    topology = str(item.get("topology", DEFAULT_TOPOLOGY))
    hardware = item.get("hardware", default_hardware if topology.startswith("cpu-") else None)
    efficiency = item.get("efficiency")
    case = GoldenCase(
        model=str(item["name"]),
        preset="step",
        topology=topology,
        step=step,
        hardware=None if hardware is None else str(hardware),
        efficiency=None if efficiency is None else float(efficiency),
        verify=str(item.get("verify", "")),
    )
    for part in (case.model, case.topology):
        if not _NAME.fullmatch(part):
            raise ShardscopeError(f"{where}: {part!r} cannot be part of a golden path")
    return case


def _parse_maxtext_case(item: dict[str, Any], path: Path, where: str, default_hardware: str | None) -> GoldenCase:
    """`{model: maxtext:NAME, maxtext: 'k=v …', name: …}`: MaxText's own program, configured by its command line
    alone; its golden is maxtext/<NAME>/<topology>/<name, or "default">.json. A `maxtext_path` (a checkout) is
    found relative to the golden directory, as preset files are."""
    keys = {"model", "maxtext", "maxtext_path", "name", "topology", "hardware", "efficiency", "verify"}
    extra = sorted(set(item) - keys)
    if extra:
        raise ShardscopeError(
            f"{where}: {item['model']} is configured by MaxText's command line ('maxtext'); {extra[0]!r} does not apply"
        )
    topology = str(item.get("topology", DEFAULT_TOPOLOGY))
    hardware = item.get("hardware", default_hardware if topology.startswith("cpu-") else None)
    efficiency = item.get("efficiency")
    checkout = str(item.get("maxtext_path", ""))
    if checkout and not Path(checkout).is_absolute():
        checkout = str(path.parent / checkout)
    case = GoldenCase(
        model=str(item["model"]),
        preset="",
        topology=topology,
        name=str(item.get("name", "default")),
        hardware=None if hardware is None else str(hardware),
        efficiency=None if efficiency is None else float(efficiency),
        maxtext=str(item.get("maxtext", "")),
        maxtext_path=checkout,
        verify=str(item.get("verify", "")),
    )
    for part in (case.model.removeprefix(MAXTEXT_PREFIX), case.topology, case.stem):
        if not _NAME.fullmatch(part):
            raise ShardscopeError(f"{where}: {part!r} cannot be part of a golden path")
    return case


def select_cases(cases: Sequence[GoldenCase], wanted: Iterable[str]) -> tuple[GoldenCase, ...]:
    """The cases named on the command line (model/topology/name), all when none are named."""
    wanted = list(wanted)
    if not wanted:
        return tuple(cases)
    by_id = {case.case_id: case for case in cases}
    chosen = []
    for name in wanted:
        if name not in by_id:
            raise unknown_name("golden case", name, by_id)
        chosen.append(by_id[name])
    return tuple(chosen)


def parse_shard(text: str) -> tuple[int, int]:
    """`--shard K/N` → (K, N): shard K of N, counted from 1 as CI matrices number their jobs (1/3, 2/3, 3/3).

    Raises:
      ShardscopeError: not two positive integers K/N (0/3 is not a shard: shards count from 1), or K > N.
    """
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ShardscopeError(f"--shard {text!r}: expected K/N, shard K of N counted from 1 (e.g. --shard 1/3)")
    index, count = int(match.group(1)), int(match.group(2))
    if index > count:
        raise ShardscopeError(f"--shard {text}: out of range: {count} shards are 1/{count} … {count}/{count}")
    return index, count


def shard_cases(cases: Sequence[GoldenCase], index: int, count: int) -> tuple[GoldenCase, ...]:
    """Shard `index` of `count` (from 1): every count-th case of the manifest, starting at the index-th.

    Deterministic (the manifest's order alone decides), and the shards 1…count partition the set: each
    case is in exactly one. Round-robin keeps neighbouring cases (often the same model) apart, which
    spreads the expensive ones.
    """
    return tuple(case for position, case in enumerate(cases) if position % count == index - 1)
