#!/usr/bin/env bash
# The test command: installs what the tests need (the TPU extra too: TPU goldens are checked; the cluster
# extra: a test starts a local Ray cluster; the docs extra), then lint, type check, the docs build (warnings
# are errors) and the test suite; then the GPU lane (the GPU extra) and the maxtext: lanes
# (MaxText's own programs, which need Python 3.12 or newer: 0.2.4, and 0.2.5 on JAX 0.11) in virtual
# environments of their own.
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet --disable-pip-version-check -e ".[dev,docs,tpu,cluster]"

# The HTML report is checked in a real headless browser (Debian's chromium) when one can be installed.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "note: chromium could not be installed; browser tests will be skipped"
fi

python -m ruff check .
python -m ruff format --check .
python -m mypy shardscope reference_models
lint-imports
# The docs site, strict: a broken link, a missing page or an unreadable docstring fails the build. Built into
# a temporary directory, so the run leaves nothing behind.
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet --site-dir "$SITE"
# Two processes (a file's tests in one, so its module fixtures are built once); `-p no:benchmark`: an
# installed pytest-benchmark would refuse to run beside xdist.
python -m pytest -n auto --dist loadfile -p no:benchmark "$@"

# The GPU lane: JAX's CUDA plugin and ptxas (the GPU extra, about 215 MB) in a virtual environment of its own over
# this one's packages, so the suite above runs without the plugin (whose tests skip there) and these compile for
# H100 hosts without a GPU.
GPU_VENV=${SHARDSCOPE_GPU_VENV:-.venv-gpu}
[ -x "$GPU_VENV/bin/python" ] || python -m venv --system-site-packages "$GPU_VENV"
"$GPU_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[gpu]"
"$GPU_VENV/bin/python" -m pytest -p no:benchmark tests/test_gpu.py

# The maxtext: lane. A Python 3.12: $PY312, else the one on PATH, else pyenv's (the CI image has one).
if [ -z "${PY312:-}" ]; then
  for candidate in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      PY312=$candidate
      break
    fi
  done
fi
if [ -z "${PY312:-}" ]; then
  if [ "${CI:-}" = true ]; then echo "error: the maxtext: lane needs a Python 3.12 (set PY312)" >&2; exit 1; fi
  echo "note: no Python 3.12 found, so the maxtext: lane (tests/test_maxtext_*.py) did not run; set PY312"
  exit 0
fi
VENV=${SHARDSCOPE_MAXTEXT_VENV:-.venv-maxtext}
[ -x "$VENV/bin/python" ] || "$PY312" -m venv "$VENV"
# The GPU extra too: `maxtext:` on GPU clusters (tests/test_maxtext_gpu.py) compiles for them without a GPU.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[dev,tpu,maxtext,gpu]"
# `-p no:anyio`: MaxText's dependencies bring anyio, whose pytest plugin warns on this pytest (warnings fail).
"$VENV/bin/python" -m pytest -n auto --dist loadfile -p no:benchmark -p no:anyio tests/test_maxtext_program.py \
  tests/test_maxtext_verify.py tests/test_maxtext_gpu.py tests/test_maxtext_frontends.py

# MaxText 0.2.5 (the PyPI release), which needs JAX 0.11: the `maxtext025` extra (MaxText, JAX 0.11 and its libtpu)
# in a third environment. The tests that prove it plans: its NNX state and logical axes, a CPU compile with its
# causes, a renamed key, the refusals naming the supported versions, and a TPU compile of tokamax's kernels;
# and verify's reading of programs under JAX 0.11 (about three minutes in all, the install included).
VENV025=${SHARDSCOPE_MAXTEXT025_VENV:-.venv-maxtext025}
[ -x "$VENV025/bin/python" ] || "$PY312" -m venv "$VENV025"
"$VENV025/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[dev,maxtext025]"
LANE025="nnx_state_is_planned or compiled_plan_has_passes or key_maxtext_renamed or version_this_route"
LANE025="$LANE025 or release_on_another_jax or tokamax_grouped_matmul"
"$VENV025/bin/python" -m pytest -p no:benchmark -p no:anyio tests/test_maxtext_program.py -k "$LANE025"
"$VENV025/bin/python" -m pytest -p no:benchmark -p no:anyio tests/test_verify_tolerance.py
