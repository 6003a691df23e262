"""The MaxText releases the `maxtext:` route plans: the table, the JAX check, and the pip extras that install
each release with its JAX (read from pyproject.toml, so the table and the extras cannot drift apart)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from shardscope.case.maxtext_releases import RELEASES, jax_mismatch, supported_list

PYPROJECT = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def requirement(extra: str, name: str) -> str:
    """The one requirement of an extra on a package (`name` or `name[…]`), its marker dropped."""
    found = [r.split(";")[0].strip() for r in EXTRAS[extra] if re.match(rf"{re.escape(name)}(\[|[=<>!~]|$)", r)]
    assert len(found) == 1, (extra, name, found)
    return found[0]


@pytest.mark.parametrize("version", list(RELEASES))
def test_each_release_has_an_extra_that_installs_it_with_the_jax_it_needs(version):
    release = RELEASES[version]
    assert requirement(release.extra, "maxtext") == f"maxtext=={version}"
    jax = re.sub(r"^jax(\[\w+\])?", "", requirement(release.extra, "jax"))
    assert jax == release.jax
    assert all("python_version >= '3.12'" in r for r in EXTRAS[release.extra])


def test_the_default_install_holds_jax_at_the_goldens_release_below_python_3_12():
    core = [r for r in PYPROJECT["project"]["dependencies"] if r.startswith("jax")]
    assert "jax[cpu]>=0.10.2,<0.11; python_version < '3.12'" in core
    # The extras that compile with the goldens' JAX hold it there on Python 3.12 too.
    assert requirement("tpu", "jax") == "jax[tpu]>=0.10.2,<0.11"
    assert requirement("gpu", "jax") == "jax[cpu]>=0.10.2,<0.11"


@pytest.mark.parametrize(
    ("version", "jax", "refused"),
    [
        ("0.2.4", "0.10.2", False),
        ("0.2.4", "0.11.2", True),
        ("0.2.5", "0.11.1", False),
        ("0.2.5", "0.11.2", False),
        ("0.2.5", "0.11.0", True),
        ("0.2.5", "0.10.2", True),
        ("0.2.5", "0.12.0", True),
        ("0.2.5", None, True),
    ],
)
def test_a_release_plans_only_under_the_jax_it_needs(version, jax, refused):
    why = jax_mismatch(RELEASES[version], jax)
    assert (why is not None) == refused
    if why is not None:
        assert f"MaxText {version} needs JAX {RELEASES[version].jax}" in why and RELEASES[version].extra in why
        assert "\n" not in why


def test_the_supported_list_names_each_release_and_its_jax():
    assert supported_list() == "0.2.4 (JAX >=0.10.2,<0.11), 0.2.5 (JAX >=0.11.1,<0.12)"
