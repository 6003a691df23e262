"""The MaxText releases the `maxtext:` route plans, each with the JAX it needs and how its `train_compile`
builds the step where releases differ.

A release is planned only with the JAX it was tested with: MaxText imports JAX's newest API as it is released
(0.2.5 imports JAX 0.11's `must_fuse_call`), and a JAX it was not built against either fails to import it or
compiles another program. The check reads installed package versions only, so it runs before JAX starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata


@dataclass(frozen=True)
class MaxTextRelease:
    """One supported MaxText release.

    Attributes:
      version: MaxText's `__version__`.
      jax_from, jax_before: the JAX releases it plans with (`jax_from` ≤ JAX < `jax_before`).
      extra: shardscope's pip extra that installs it with that JAX (Python 3.12 or newer).
      mesh_context_always: `train_compile` jits the step inside the mesh's legacy context (`with mesh:`) as well
        as `jax.set_mesh`; 0.2.5 enters it only for DiLoCo (drjax reads the legacy context).
      linen: the release still has its Linen model (`pure_nnx=False`); 0.2.5 builds NNX models only.
    """

    version: str
    jax_from: tuple[int, ...]
    jax_before: tuple[int, ...]
    extra: str
    mesh_context_always: bool
    linen: bool

    @property
    def jax(self) -> str:
        """The JAX it needs, as pip writes it."""
        return f">={_dotted(self.jax_from)},<{_dotted(self.jax_before)}"

    @property
    def install(self) -> str:
        """The command that installs it."""
        return f"pip install 'shardscope[{self.extra}]' (Python 3.12 or newer)"


# 0.2.4: the PyPI release of August 2026 (also MaxText's main at e591f30), on the JAX of shardscope's goldens.
# 0.2.5: the next PyPI release; it needs JAX 0.11 (and so Python 3.12), and has no Linen model left.
RELEASES = {
    "0.2.4": MaxTextRelease("0.2.4", (0, 10, 2), (0, 11), "maxtext", mesh_context_always=True, linen=True),
    "0.2.5": MaxTextRelease("0.2.5", (0, 11, 1), (0, 12), "maxtext025", mesh_context_always=False, linen=False),
}
SUPPORTED_VERSIONS = tuple(RELEASES)


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in release)


def _release_of(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def supported_list() -> str:
    """The supported releases and the JAX each needs, for an error message."""
    return ", ".join(f"{r.version} (JAX {r.jax})" for r in RELEASES.values())


def installed_jax() -> str | None:
    """The installed JAX's version (None: not installed), read without importing it."""
    try:
        return metadata.version("jax")
    except metadata.PackageNotFoundError:
        return None


def jax_mismatch(release: MaxTextRelease, jax_version: str | None) -> str | None:
    """Why this JAX cannot plan this release, or None if it can."""
    if jax_version is not None and release.jax_from <= _release_of(jax_version) < release.jax_before:
        return None
    return (
        f"MaxText {release.version} needs JAX {release.jax}, and this environment has JAX {jax_version}: "
        f"{release.install}"
    )
