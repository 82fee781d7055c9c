#!/usr/bin/env bash
# Create ./.venv (if needed) and install dphub with its test and ray extras, CPU-only torch first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The local CPU wheel; an unpinned torch would pull several GB of CUDA packages.
python -m pip install -q "torch==2.13.0"
# The editable install maps dphub.cli/dphub.cards onto cli/ and cards/ with a meta-path finder;
# setuptools then prints an informational "Editable installation" notice on every install.
# It is not a problem of ours to act on, so it is filtered (nothing else is).
PYTHONWARNINGS="ignore:Editable installation:UserWarning" python -m pip install -q -e ".[test,ray]"
