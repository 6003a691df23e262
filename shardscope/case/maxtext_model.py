"""`maxtext:MODEL`: MaxText's own training step as a case: which MaxText tree, which of its models, which
command line, on which topology.

Everything here is checked before JAX or MaxText is imported, so a wrong name fails in milliseconds: the tree
(the installed `maxtext` package, or a checkout given by `--maxtext-path`) is found on disk, its version read
from its `version.py`, and its models are the files of its `configs/models/`. Building the step is
`shardscope.stages.maxtext_program`.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from shardscope.case.gpu import GpuCluster
from shardscope.case.maxtext_keys import RENAMED_KEYS
from shardscope.case.maxtext_releases import (
    RELEASES,
    MaxTextRelease,
    installed_jax,
    jax_mismatch,
    supported_list,
)
from shardscope.case.topology import Topology
from shardscope.errors import ShardscopeError

PREFIX = "maxtext:"
# The MaxText releases this route plans, each with the JAX it needs (`maxtext_releases.RELEASES`). Another
# version may build its step differently (MaxText moves its train-step helpers between releases), so it is
# refused by name rather than planned wrongly.
INSTALL_HINT = (
    "pip install 'shardscope[maxtext]' (MaxText 0.2.4) or 'shardscope[maxtext025]' (MaxText 0.2.5), "
    "Python 3.12 or newer; or give a checkout with --maxtext-path"
)
_VERSION = re.compile(r"""__version__\s*=\s*["']([^"']+)["']""")


class MaxTextError(ShardscopeError):
    """A `maxtext:` case that cannot be planned as given: MaxText missing, unknown model, wrong tree."""


@dataclass(frozen=True)
class MaxTextTree:
    """A MaxText source tree: the directory that holds the `maxtext` package, and its version."""

    package_dir: Path  # …/maxtext (holds configs/base.yml)
    version: str
    checkout: bool  # given by --maxtext-path (put first on sys.path), not the installed package

    @property
    def release(self) -> MaxTextRelease:
        """The supported release the tree is (`find_tree` refuses any other)."""
        return RELEASES[self.version]

    @property
    def src(self) -> Path:
        """The directory to import `maxtext` from."""
        return self.package_dir.parent

    @property
    def base_config(self) -> Path:
        """MaxText's base.yml, the first word of its command line."""
        return self.package_dir / "configs" / "base.yml"

    def keys(self) -> frozenset[str]:
        """The keys the tree's command line knows: base.yml's."""
        return _base_keys(self.base_config)

    def models(self) -> tuple[str, ...]:
        """The models the tree has: one yml each under configs/models/."""
        return tuple(sorted(p.stem for p in (self.package_dir / "configs" / "models").glob("*.yml")))

    def model_config(self, model: str) -> Path:
        """A model's config file in the tree (configs/models/<model>.yml, one of `models`)."""
        return self.package_dir / "configs" / "models" / f"{model}.yml"


@dataclass(frozen=True)
class MaxTextCase:
    """One `maxtext:` case: MaxText's model on a topology under its own command line."""

    model: str  # MaxText's model_name
    topology: Topology
    args: tuple[tuple[str, str], ...]  # MaxText's command-line keys, in the order given (renamed ones translated)
    tree: MaxTextTree
    renamed: tuple[tuple[str, str], ...] = ()  # (the name given, the tree's name) of each key translated

    @property
    def notes(self) -> tuple[str, ...]:
        """What the case changed of its command line, one line each (a translated key's old and new name)."""
        return tuple(
            f"--maxtext {old}: MaxText {self.tree.version} names this key {new}; planned as {new}"
            for old, new in self.renamed
        )

    @property
    def name(self) -> str:
        """The model as the user named it."""
        return PREFIX + self.model

    @property
    def rule(self) -> str:
        """The rule file the command line names (`custom_mesh_and_rule`), or "default" (base.yml's rules)."""
        return dict(self.args).get("custom_mesh_and_rule") or "default"

    def argv(self) -> list[str]:
        """MaxText's argv, as `train_compile` takes it: base.yml, then key=value overrides."""
        words = [str(self.tree.base_config), f"model_name={self.model}"]
        if self.topology.tpu is not None:
            words += [
                f"compile_topology={self.topology.tpu.name}",
                f"compile_topology_num_slices={self.topology.slices}",
            ]
        elif self.topology.gpu is not None:
            words += gpu_words(self.topology.gpu)
        else:
            # No TPU to compile for: MaxText builds its mesh from the host's (fake CPU) devices.
            words += ["hardware=cpu"]
        words += ["skip_jax_distributed_system=true", "log_config=false", "debug_sharding=true"]
        if "jax_cache_dir" not in dict(self.args):
            # MaxText points the process's JAX compilation cache at ~/jax_cache by default: a plan would then read
            # a program compiled earlier (with another tree's file names in its stack frames), and every other
            # compile of the process would be cached there too. A plan compiles afresh unless asked otherwise.
            words.append("jax_cache_dir=")
        return words + [f"{key}={value}" for key, value in self.args]


@functools.cache
def _base_keys(base_config: Path) -> frozenset[str]:
    loaded = yaml.safe_load(base_config.read_text(encoding="utf-8"))
    return frozenset(loaded) if isinstance(loaded, dict) else frozenset()


def is_maxtext_model(name: str) -> bool:
    """Whether a model name asks for MaxText's own program."""
    return name.startswith(PREFIX)


def _read_version(package_dir: Path) -> str:
    match = _VERSION.search((package_dir / "version.py").read_text(encoding="utf-8"))
    return match.group(1) if match else "unknown"


def find_tree(path: Path | None) -> MaxTextTree:
    """The MaxText tree to plan: a checkout (`--maxtext-path`: its root or its `src/`) or the installed package.

    Raises:
      MaxTextError: MaxText is not installed, the path is not a MaxText tree, its version is not supported, or
        this environment's JAX is not the one that version needs.
    """
    if path is None:
        spec = importlib.util.find_spec("maxtext")
        if spec is None or not spec.submodule_search_locations:
            raise MaxTextError(f"maxtext: models need MaxText, which is not importable here: {INSTALL_HINT}")
        package_dir, checkout = Path(next(iter(spec.submodule_search_locations))), False
    else:
        candidates = [path / "src" / "maxtext", path / "maxtext", path]
        found = [c for c in candidates if (c / "configs" / "base.yml").is_file() and (c / "version.py").is_file()]
        if not found:
            raise MaxTextError(
                f"--maxtext-path {path}: not a MaxText tree (expected src/maxtext/configs/base.yml under it)"
            )
        package_dir, checkout = found[0].resolve(), True
    if not (package_dir / "configs" / "base.yml").is_file():
        raise MaxTextError(f"MaxText at {package_dir} has no configs/base.yml: not a MaxText tree")
    version = _read_version(package_dir)
    if version not in RELEASES:
        raise MaxTextError(
            f"MaxText {version} (at {package_dir}) is not a version this route supports; supported: {supported_list()}"
        )
    mismatch = jax_mismatch(RELEASES[version], installed_jax())
    if mismatch is not None:
        raise MaxTextError(mismatch)
    return MaxTextTree(package_dir=package_dir, version=version, checkout=checkout)


def check_model(tree: MaxTextTree, model: str) -> str:
    """MaxText's model name of `maxtext:NAME`.

    Raises:
      MaxTextError: the tree has no such model (with "did you mean").
    """
    name = model.removeprefix(PREFIX)
    known = tree.models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(PREFIX + c for c in close)}?" if close else ""
        raise MaxTextError(f"unknown MaxText model {name!r} (MaxText {tree.version} has {len(known)}){hint}")
    return name


def resolve_maxtext_model(
    model: str, topology: Topology, args: tuple[tuple[str, str], ...], path: Path | None = None
) -> MaxTextCase:
    """A `maxtext:MODEL` case, checked against the tree it will be built from.

    Raises:
      MaxTextError: see `find_tree` and `check_model`; a command line that names the model or the topology
        again (they are `maxtext:MODEL` and `--topology`).
    """
    tree = find_tree(path)
    name = check_model(tree, model)
    args = check_topology_keys(args, topology)
    check_transformer_engine(args, topology)
    args, renamed = translate_renamed_keys(args, tree.keys())
    return MaxTextCase(model=name, topology=topology, args=args, tree=tree, renamed=renamed)


# The keys that say what the step is built for: `maxtext:NAME` and `--topology` set them.
_TOPOLOGY_KEYS = ("model_name", "compile_topology", "compile_topology_num_slices", "hardware")
# The keys the GPU route sets to describe the cluster to MaxText (`gpu_words`).
_GPU_KEYS = ("num_slices", "internal_compile", "internal_compile_num_devices")


def gpu_words(gpu: GpuCluster) -> list[str]:
    """MaxText's command line for a GPU cluster, as a multi-host GPU run of MaxText sees it.

    `hardware=gpu`; a slice is an NVLink domain (MaxText's `num_slices`, from the devices' `slice_index` on a
    real cluster: a host of an HGX cluster, a GB200 rack), so its `ici_*` keys lay axes inside a domain and
    its `dcn_*` keys across domains. MaxText sizes its batch and its -1 axes by the target's device count,
    which it reads from `jax.devices()` on a GPU host; here the process has one CPU device, so the count is
    given as MaxText's ahead-of-time compile gives it (`internal_compile_num_devices`; `internal_compile`
    does nothing else on this path: the mesh is built by `stages.maxtext_program`, not `get_topology_mesh`).
    """
    return [
        "hardware=gpu",
        f"num_slices={gpu.domains}",
        "internal_compile=true",
        f"internal_compile_num_devices={gpu.num_devices}",
    ]


def check_topology_keys(args: tuple[tuple[str, str], ...], topology: Topology) -> tuple[tuple[str, str], ...]:
    """The command line less the keys `--topology` sets. A GPU run's own command line says `hardware=gpu`, which
    is what the GPU route sets: taken as given; any other of these keys is refused.

    Raises:
      MaxTextError: a key naming the model or the target, or (GPU) the cluster's slices or device count.
    """
    kept = []
    for key, value in args:
        if key == "hardware" and topology.gpu is not None:
            if value != "gpu":
                raise MaxTextError(
                    f"--maxtext hardware={value}: the GPU route builds MaxText's step as one program for every GPU "
                    "(hardware=gpu); drop the key"
                )
            continue
        if key in _TOPOLOGY_KEYS:
            raise MaxTextError(f"--maxtext {key}=…: the model is maxtext:NAME and the topology --topology")
        if key in _GPU_KEYS and topology.gpu is not None:
            raise MaxTextError(
                f"--maxtext {key}=…: on {topology.name} MaxText's slices are its {topology.gpu.domains} NVLink "
                "domains and its devices the cluster's GPUs (--topology sets them)"
            )
        kept.append((key, value))
    return tuple(kept)


def check_transformer_engine(args: tuple[tuple[str, str], ...], topology: Topology) -> None:
    """On a GPU cluster, `attention=cudnn_flash_te` (MaxText's GPU runs' attention) is NVIDIA Transformer Engine's
    cuDNN attention, which MaxText imports as it builds the step: where it is not installed, said before MaxText
    says something else of the same command line (its config's checks of TE's packing options).

    Raises:
      MaxTextError: the attention needs Transformer Engine and it is not importable.
    """
    if topology.gpu is None or dict(args).get("attention") != "cudnn_flash_te":
        return
    if importlib.util.find_spec("transformer_engine") is None:
        raise MaxTextError(
            "--maxtext attention=cudnn_flash_te: NVIDIA Transformer Engine's attention, and Transformer Engine "
            "(transformer_engine.jax) is not installed here; install it, or plan MaxText's attention in einsums "
            "with attention=dot_product (its scores through HBM, its causal mask skipping nothing)"
        )


def translate_renamed_keys(
    args: tuple[tuple[str, str], ...], known: frozenset[str]
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """The command line under the names the tree knows, and the (old, new) names translated.

    A published command line was written against the MaxText of its day (the Ironwood recipes against
    maxtext-tutorial-v1.5.0: `fsdp_shard_on_exp`); a later tree that renamed the key refuses the old name, and
    planning without it plans another program (the experts' weights sharded by the key's default). A key is
    translated (`RENAMED_KEYS`) only where the tree knows its new name and not its old one: a tree that still
    has the old name is planned as written.

    Raises:
      MaxTextError: a key given under both its names.
    """
    given = dict(args)
    renamed = {}
    for old, new in RENAMED_KEYS.items():
        if old not in given or old in known or new not in known:
            continue
        if new in given:
            raise MaxTextError(f"--maxtext: {old} is MaxText's earlier name of {new}; give one of them")
        renamed[old] = new
    return tuple((renamed.get(k, k), v) for k, v in args), tuple(renamed.items())


def installed_tree() -> MaxTextTree | None:
    """The installed MaxText, if importable here and of a supported version (for `shardscope list`)."""
    try:
        return find_tree(None)
    except MaxTextError:
        return None
