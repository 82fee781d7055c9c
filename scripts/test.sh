#!/usr/bin/env bash
# Set up (idempotent) and run the lint and the test suite. No network beyond the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# No HF_HUB_OFFLINE here: the olah tests talk HTTP to 127.0.0.1, which offline mode forbids.
# Nothing in the suite loads from a remote hub (models are local directories).
export TOKENIZERS_PARALLELISM=false
ruff check .
# the import contracts of pyproject.toml ([tool.importlinter]; docs/architecture.md)
lint-imports
python -m pytest -q "$@"
# dphub federate's tests need Flower, which cannot share ./.venv (scripts/setup_federate.sh says
# why): they run again in ./.venv-federate, where they are not skipped
if [ $# -eq 0 ]; then
  bash scripts/setup_federate.sh
  .venv-federate/bin/python -m pytest -q tests/test_federate.py
fi
