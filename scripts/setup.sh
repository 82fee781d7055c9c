#!/usr/bin/env bash
# Create ./.venv (if needed) and install dphub with its test, ray, federate, presidio and spacy
# extras (one environment: Flower's pins, the ray extra and Presidio/spaCy agree), CPU-only torch
# first; and ./.venv-olah,
# the test hub server's own environment (olah needs a newer fastapi than Flower allows).
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
# olah no longer belongs here (an older ./.venv may hold it, with fastapi pins Flower refuses)
if python -m pip show -q olah >/dev/null 2>&1; then
  python -m pip uninstall -q -y olah
fi
# The editable install maps dphub.cards onto cards/ with a meta-path finder;
# setuptools then prints an informational "Editable installation" notice on every install.
# It is not a problem of ours to act on, so it is filtered (nothing else is).
PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
  python -m pip install -q -e ".[test,ray,federate,presidio,spacy]"
deactivate
# the test hub server (tests/test_hub_hf.py, test_hub_hostile.py) in its own environment; the
# tests find it through $DPHUB_OLAH_PYTHON (tests/conftest.py sets it to ./.venv-olah)
if [ ! -x .venv-olah/bin/python ]; then
  "$PY" -m venv .venv-olah
fi
.venv-olah/bin/python -m pip install -q "olah>=0.5"
