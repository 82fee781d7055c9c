#!/usr/bin/env bash
# Set up (idempotent) and run the lint and the test suite. No network beyond the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ruff check .
python -m pytest -q "$@"
