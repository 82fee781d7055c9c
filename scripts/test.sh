#!/usr/bin/env bash
# Set up (idempotent) and run the lint and the test suite. No network beyond the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# No HF_HUB_OFFLINE here: the olah tests talk HTTP to 127.0.0.1, which offline mode forbids.
# Nothing in the suite loads from a remote hub (models are local directories).
export TOKENIZERS_PARALLELISM=false
# the test hub server runs from its own environment (scripts/setup.sh)
export DPHUB_OLAH_PYTHON="$PWD/.venv-olah/bin/python"
ruff check .
# the import contracts of pyproject.toml ([tool.importlinter]; docs/architecture.md)
lint-imports
# one environment: dphub federate's tests (tests/test_federate*.py) run here with the rest.
# Two workers by default (pytest-xdist; CI has two cores: 14 instead of 24 minutes);
# DPHUB_TEST_WORKERS=0 runs in one process, as does `-n 0` among the arguments.
python -m pytest -q -n "${DPHUB_TEST_WORKERS:-2}" "$@"
