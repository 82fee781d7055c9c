#!/usr/bin/env bash
# The dphub loop end to end, with the CLI only, on synthetic nursing notes:
#
#   data synth -> data split (by patient) -> train two sites with DP -> publish to a local hub
#   (and a public student of one site: post-processing, the site's epsilon)
#   -> search -> pull -> ensemble add (+ rules:default) -> ensemble deid (Scenario A)
#   -> train the owner's own DP model -> ensemble deid --owner-model (Scenario B)
#   -> ensemble evaluate (members and ensemble side by side)
#
# Usage: bash examples/demo.sh [OUT_DIR]        (default ./demo-out; needs `dphub` on PATH)
#
# Everything, including the hub, the registry of pulled models and the ensemble manifest, lives
# under OUT_DIR (DPHUB_HOME and DPHUB_HUB point inside it), so the demo never touches the user's
# own hub or registry. The only thing shared with other runs is the warm-start cache
# (public synthetic-note pre-training, no patient data; $DPHUB_CACHE_DIR or the user cache),
# which makes a second run much faster.
#
# Sizes come from environment variables, so CI can run it tiny:
#   DEMO_NOTES        synthetic notes in total                      (default 160)
#   DEMO_PATIENTS     patients they belong to                       (default DEMO_NOTES / 4)
#   DEMO_EPOCHS       DP epochs per training                        (default 2)
#   DEMO_BATCH        expected patients per DP step                 (default 4)
#   DEMO_TRAIN_LAYERS encoder layers trained under DP on top of the warm start (default 0: the
#                     emission layer and CRF only, over cached encoder outputs; the cheap path)
#   DEMO_EPSILON      target patient-level epsilon per model        (default 8)
#   DEMO_BASE_MODEL   base encoder: "default" (embedded all-MiniLM-L6-v2) or a model directory
#                     (a directory's name must also resolve offline, e.g. in the Hugging Face
#                     cache, because publishing checks the tokenizer against the public base)
#   DEMO_WARM_START   synth | none (public warm start on synthetic notes)   (default synth)
#   DEMO_SEED         seed of the notes, the split and the trainings        (default 0)
#   DEMO_STUDENT_NOTES public synthetic notes site-a's public student learns  (default 40)
set -euo pipefail

OUT=${1:-./demo-out}
NOTES=${DEMO_NOTES:-160}
PATIENTS=${DEMO_PATIENTS:-$(( NOTES / 4 > 4 ? NOTES / 4 : 4 ))}
EPOCHS=${DEMO_EPOCHS:-2}
BATCH=${DEMO_BATCH:-4}
TRAIN_LAYERS=${DEMO_TRAIN_LAYERS:-0}
EPSILON=${DEMO_EPSILON:-8}
BASE_MODEL=${DEMO_BASE_MODEL:-default}
WARM_START=${DEMO_WARM_START:-synth}
SEED=${DEMO_SEED:-0}
STUDENT_NOTES=${DEMO_STUDENT_NOTES:-40}

command -v dphub >/dev/null || { echo "demo: dphub is not on PATH (run scripts/setup.sh and activate .venv)" >&2; exit 2; }
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "demo: $OUT exists and is not empty; remove it or pass another directory" >&2
  exit 2
fi
case "$BASE_MODEL" in
  default) ;;
  *) BASE_MODEL=$(cd "$BASE_MODEL" && pwd) ;;  # absolute: the commands below run inside OUT
esac
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$OUT"  # relative paths below are inside OUT; a dphub.toml elsewhere is not picked up

export DPHUB_HOME="$OUT/home" DPHUB_HUB="$OUT/hub"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export COLUMNS=${COLUMNS:-140}  # wide enough for the result tables when output is not a terminal
START=$SECONDS
step() { printf '\n== [%4ds] %s\n' $(( SECONDS - START )) "$*"; }

TRAIN_OPTS=(--base-model "$BASE_MODEL" --target-epsilon "$EPSILON" --privacy-unit patient
            --epochs "$EPOCHS" --batch-size "$BATCH" --train-layers "$TRAIN_LAYERS"
            --warm-start "$WARM_START" --seed "$SEED")

step "1. synthetic nursing notes ($NOTES notes, $PATIENTS patients)"
dphub data synth --kind nursing --n "$NOTES" --patients "$PATIENTS" --seed "$SEED" \
  --out data/notes.jsonl

step "2. patient-disjoint split: two sites, the owner's training and test notes"
dphub data split data/notes.jsonl --by patient --ratios 0.3,0.3,0.2,0.2 --seed "$SEED" \
  --names site-a,site-b,owner-train,owner-test --out data

step "3. each site trains a DP tagger (patient-level epsilon $EPSILON)"
for site in site-a site-b; do
  dphub train "data/$site.jsonl" --out "models/$site" "${TRAIN_OPTS[@]}"
done

step "4. publish both to the local hub ($OUT/hub); the gate checks card, files and tokenizer"
for site in site-a site-b; do
  dphub publish "models/$site" --repo "demo/$site" --hub hub
done
# a public student of site-a: site-a's model (+ rules) labels public synthetic notes and a student
# learns them without noise; post-processing of a DP model, so it publishes with site-a's epsilon
# (on another base, e.g. --base-model minilm-l3, this is how a site gets a faster model for free)
dphub ensemble distill-public models/site-a --out models/site-a-student --notes "$STUDENT_NOTES" \
  --epochs "$EPOCHS" --base-model "$BASE_MODEL" --train-layers "$TRAIN_LAYERS" \
  --warm-start "$WARM_START" --seed "$SEED"
dphub publish models/site-a-student --repo demo/site-a-student --hub hub

step "5. the owner searches the hub for patient-level models"
dphub search --hub hub --unit patient --max-epsilon "$EPSILON"

step "6. pull (verifies hashes, card and policy) and build the ensemble"
for site in site-a site-b; do
  dphub pull "demo/$site" --hub hub --require-unit patient --max-epsilon "$EPSILON"
  dphub ensemble add "demo/$site"
done
dphub ensemble add rules:default
dphub ensemble list

step "7. Scenario A: de-identify the owner's notes with the pulled models + rules"
dphub ensemble deid data/owner-test.jsonl --mode tag --out deid-a

step "8. Scenario B: the owner trains its own DP model and adds it"
dphub train data/owner-train.jsonl --out models/owner "${TRAIN_OPTS[@]}"
python -c "import secrets; print(secrets.token_hex(32))" > surrogate.key
chmod 600 surrogate.key
dphub ensemble deid data/owner-test.jsonl --owner-model models/owner \
  --mode surrogate --key-file surrogate.key --out deid-b

step "9. evaluation on the owner's test notes (token-binary %, phrase recall %)"
dphub ensemble evaluate data/owner-test.jsonl --json > eval-a.json
dphub ensemble evaluate data/owner-test.jsonl --owner-model models/owner --json > eval-b.json
# recall first (docs/recall_first.md): the same members under the inverse rule, which hides every
# word no member vouches for as safe; "kept" is the share of non-PHI words left readable
dphub ensemble evaluate data/owner-test.jsonl --aggregate inverse --json > eval-inv.json
# one table per scenario, then what the owner's model changed (the aggregate is "any": a
# character is PHI if any member flags it, so the owner's model can only add what the pulled
# models and the rules missed; when it adds nothing, the two ensemble rows are equal)
python - eval-a.json eval-b.json eval-inv.json <<'PY'
import json, sys
a, b, inv = (json.load(open(p)) for p in sys.argv[1:4])
cols = ("precision", "recall", "f1", "phrase_recall_any", "phrase_recall_full",
        "non_phi_tokens_kept")
def table(title, rows):
    print(title)
    print(f"  {'member':<28} {'ε':>6} {'unit':<8} {'P':>6} {'R':>6} {'F1':>6} "
          f"{'phrase R any':>13} {'phrase R full':>13} {'kept':>6}")
    for r in rows:
        eps = "-" if r["epsilon"] is None else f"{r['epsilon']:.3g}"
        print(f"  {r['name']:<28} {eps:>6} {(r['unit'] or '-'):<8} "
              + " ".join(f"{100 * r[k]:>{13 if k.startswith('phrase') else 6}.1f}" for k in cols))
table("Scenario A (pulled models + rules):", a)
table("Scenario B (pulled models + rules + the owner's model):", b)
ea, eb = a[-1], b[-1]
owner = b[-2]
if all(round(ea[k], 4) == round(eb[k], 4) for k in cols):
    print(f"\nScenario B's ensemble row equals Scenario A's: the owner's model ({owner['name']}) "
          f"flags nothing the pulled models and the rules do not flag already (alone: recall "
          f"{100 * owner['recall']:.1f}%). At the demo's size (a few dozen notes, a few DP epochs) "
          "it is weak; with more of the owner's notes or epochs it adds what the others miss.")
else:
    print(f"\nThe owner's model changes the ensemble: recall {100 * ea['recall']:.1f}% -> "
          f"{100 * eb['recall']:.1f}%, precision {100 * ea['precision']:.1f}% -> "
          f"{100 * eb['precision']:.1f}%.")
ei = inv[-1]
print("\nRecall first (Scenario A's members under --aggregate inverse, next to any):")
for label, r in (("any", ea), ("inverse", ei)):
    print(f"  {label:<8} token recall {100 * r['recall']:5.1f}%  full-cover phrase recall "
          f"{100 * r['phrase_recall_full']:5.1f}%  non-PHI words kept "
          f"{100 * r['non_phi_tokens_kept']:5.1f}%")
print("  The demo's DP models are trained on a few dozen notes: they vouch for few words, so the "
      "inverse rule hides more here than with the default model (docs/recall_first.md).")
PY

step "done in $(( SECONDS - START )) s; outputs under $OUT"
cat <<EOF
  data/                     synthetic notes and the patient-disjoint split (JSONL)
  models/site-a, site-b     the sites' DP models (safetensors + model card README.md)
  models/site-a-student     site-a's public student (public notes only; site-a's epsilon)
  models/owner              the owner's own DP model (Scenario B)
  hub/                      the local hub the sites published to (one git repo per model)
  home/                     the owner's registry of pulled, verified models
  dphub-ensemble.toml       the ensemble manifest (members pinned to pulled revisions)
  deid-a/owner-test.jsonl   Scenario A output, PHI replaced by [**CATEGORY**] tags
  deid-b/owner-test.jsonl   Scenario B output, PHI replaced by consistent surrogates
  deid-*/audit.jsonl        what was removed where (offsets, labels, voting members; no text)
  eval-a.json, eval-b.json  the step 9 evaluations (members and ensemble, both scenarios)
  eval-inv.json             Scenario A's members under the inverse rule (recall first)
EOF
