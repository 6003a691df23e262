#!/usr/bin/env bash
# The test command: installs what the tests need (the TPU extra too: TPU goldens are checked; the cluster
# extra: a test starts a local Ray cluster), then lint, type check and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet --disable-pip-version-check -e ".[dev,tpu,cluster]"

# The HTML report is checked in a real headless browser (Debian's chromium) when one can be installed.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "note: chromium could not be installed; browser tests will be skipped"
fi

python -m ruff check .
python -m ruff format --check .
python -m mypy shardscope reference_models
lint-imports
# Two processes (a file's tests in one, so its module fixtures are built once); `-p no:benchmark`: an
# installed pytest-benchmark would refuse to run beside xdist.
python -m pytest -n auto --dist loadfile -p no:benchmark "$@"
