#!/usr/bin/env bash
# Create ./.venv-federate for `dphub federate` and its tests (issue 27), layered on ./.venv.
#
# Flower 1.42 pins ray 2.55, protobuf < 7, typer < 0.21, rich < 15 and fastapi < 0.139, which the
# ray extra (ray >= 2.60) and olah (fastapi >= 0.141) of ./.venv cannot share: pip refuses the
# combination. So Flower gets its own environment that sees ./.venv's packages (torch, opacus,
# transformers, ...) through a .pth file and shadows only the versions Flower pins.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
MAIN_SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if [ ! -x .venv-federate/bin/python ]; then
  .venv/bin/python -m venv .venv-federate
fi
FED_SITE=$(.venv-federate/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$MAIN_SITE" > "$FED_SITE/zz-dphub-main-venv.pth"  # after Flower's own pins on sys.path
.venv-federate/bin/python -m pip install -q "flwr[simulation]==1.42.0" 2>&1 \
  | { grep -v -E "^WARNING: |Not uninstalling|Can't uninstall|outside environment|^ERROR: pip.s dependency resolver|^[A-Za-z0-9_.-]+ [0-9][^ ]* requires .*(incompatible|not installed)" || true; }
PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
  .venv-federate/bin/python -m pip install -q --no-deps -e . 2>&1 \
  | { grep -v -E "^WARNING: |^ERROR: pip.s dependency resolver|^dphub .* requires " || true; }
