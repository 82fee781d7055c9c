#!/usr/bin/env bash
# README's first command: set up ./.venv (idempotent), then run the end-to-end demo
# (examples/demo.sh) on synthetic notes. Outputs go to ./demo-out of the repository, or to the
# directory given as the first argument. Sizes: DEMO_* environment variables (see examples/demo.sh).
set -euo pipefail
OUT=${1:-}
if [ -n "$OUT" ] && [ "${OUT#/}" = "$OUT" ]; then
  OUT="$PWD/$OUT"  # relative to where the user ran us, not to the repository
fi
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/demo-out}
# the demo refuses a non-empty OUT: say so now, not after the set-up
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "demo: $OUT exists and is not empty; remove it or pass another directory" >&2
  exit 2
fi
START=$SECONDS
bash scripts/setup.sh
. .venv/bin/activate
echo "set-up took $(( SECONDS - START )) s"
bash examples/demo.sh "$OUT"
echo "scripts/demo.sh: $(( SECONDS - START )) s in total, set-up included"
