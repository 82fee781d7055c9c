"""Reproduce the framework experiment: DP models shared between sites, ensembled by a data owner.

Usage::

    python examples/reproduce_framework.py CORPUS --out results/ [--seed 0] [--epochs 32]
        [--base-model PATH] [--quick] [--format physionet] [--target-recall 0.99]

CORPUS is any corpus dphub reads (``dphub.formats``) whose notes carry patient ids, e.g. the
PhysioNet deid corpus (``id.text`` + ``id-phi.phrase``). Everything goes through the Python API,
the same calls the CLI makes:

1. the patients are split (seeded, patient-disjoint) into three *sites* and one *owner*, and the
   owner's patients again into ``owner-train`` and ``owner-test``;
2. each site trains a DP tagger at patient-level ε ≈ ``--target-epsilon`` (default 8) and publishes
   it to a fresh local hub; a *community* model is trained the same way on synthetic discharge
   summaries (``dphub.synth``, another domain) and published too;
3. the owner pulls every model (hashes, card and policy verified) into its own registry and
   evaluates on ``owner-test``:

   * **Scenario A** (Table 5.1) — no owner labels: each member alone, then the ensemble under the
     ``any`` rule (a token is PHI if any member flags it), without and with ``rules:default``.
     Without labels nothing can be calibrated, so ``any`` with decoded tags only.
   * **Scenario B** (Table 5.2) — the owner labels ``owner-train`` and trains its own DP model on
     it (variant: fine-tunes the pulled site-1 model on it with ``init_from``); ensembles of the
     pulled models plus the owner's model, without and with rules, under ``any`` and with
     per-member thresholds calibrated on ``owner-train`` for a target ensemble token recall.

Outputs: ``OUT/tables.md`` (tables laid out like the thesis's Tables 5.1 and 5.2, plus wall
times) and ``OUT/tables.json`` (every number). The tables hold counts and scores only, never note
text. Working state (the split as JSONL, models, hub, registry, cached predictions) lives in
``OUT/work/`` — it contains note text, so it gets a ``.gitignore`` and should never be shared.

Resumable: a training whose model directory exists with a valid card is skipped (an interrupted
one resumes from its checkpoint), published and pulled models are reused, and model predictions
are cached per (model weights, notes), so a re-run only redoes what is missing. ``--quick`` uses
tiny sizes (1 epoch, no warm start, at most 24 patients) for smoke tests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SITES = ("site-1", "site-2", "site-3")
COMMUNITY = "community"
#: hub repository of each published model
REPOS = {**{s: f"{s}/deid-tagger" for s in SITES}, COMMUNITY: "community/deid-discharge"}
QUICK_MAX_PATIENTS = 24
#: the site models must all agree; the rules (and the owner's local model) count alone. Chosen on
#: two folds of owner-train only (``benchmarks/owner_cv.py --what aggregate``), before owner-test
QUORUM = "k-of-n:3"
#: thresholds at which the owner's model confirms deid.pl's flags (``--deidpl-output`` rows):
#: 0.1, the lowest that kept precision >= 85 % on the folds of owner-train; 0.02, the most recall
#: there (``benchmarks/owner_cv.py --what aggregate --deidpl-output ...``; owner-test not read)
CONFIRM_THRESHOLDS = (0.1, 0.02)


# ------------------------------------------------------------------------------------ helpers
class Clock:
    """Wall-clock stages (seconds), printed as they finish and reported in the tables."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.stages: dict[str, float] = {}

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

    def record(self, stage: str, seconds: float) -> None:
        self.stages[stage] = round(self.stages.get(stage, 0.0) + seconds, 1)


class State:
    """``work/state.json``: what earlier runs did (training times, published revisions)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        if path.is_file():
            self.data = json.loads(path.read_text(encoding="utf-8"))

    def section(self, name: str) -> dict[str, Any]:
        return self.data.setdefault(name, {})

    def save(self) -> None:
        from dphub.io import atomic_write_text

        atomic_write_text(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n")


def load_corpus(path: Path, fmt: str | None) -> list[Any]:
    """Labelled notes of ``path``; patient-level privacy needs a patient id on every note."""
    from dphub import formats
    from dphub.errors import InputError

    notes = [n for n in formats.read(path, fmt) if n.labelled]
    if not notes:
        raise InputError(f"{path}: no labelled notes")
    missing = [n.id for n in notes if n.patient_id is None]
    if missing:
        raise InputError(f"{path}: {len(missing)} note(s) have no patient id (first: note "
                         f"{missing[0]}); the experiment splits and protects patients")
    return notes


def keep_patients(notes: Sequence[Any], max_patients: int, seed: int) -> list[Any]:
    """At most ``max_patients`` patients (a seeded choice), all their notes, in input order."""
    patients = sorted({n.patient_id for n in notes})
    if len(patients) <= max_patients:
        return list(notes)
    random.Random(f"reproduce-subsample:{seed}").shuffle(patients)
    keep = set(patients[:max_patients])
    return [n for n in notes if n.patient_id in keep]


def describe(notes: Sequence[Any]) -> dict[str, int]:
    """Counts only (never text): notes, patients, gold PHI spans."""
    return {"notes": len(notes), "patients": len({n.patient_id for n in notes}),
            "phi_spans": sum(len(n.spans) for n in notes)}


def write_jsonl(notes: Sequence[Any], path: Path) -> Path:
    """Write notes as JSONL (atomic); skipped when the same notes are already there."""
    from dphub import formats

    digest = hashlib.sha256("\n".join(
        f"{n.id}\t{len(n.text)}\t{len(n.spans)}" for n in notes).encode()).hexdigest()
    marker = path.with_name(f".{path.name}.sha256")
    if path.is_file() and marker.is_file() and marker.read_text().strip() == digest:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    formats.write(notes, path, "jsonl", overwrite=True)
    marker.write_text(digest + "\n")
    return path


def train_or_skip(
    name: str,
    opts: Any,
    state: State,
    clock: Clock,
    fit: Callable[[Any, Any], Any] | None = None,
) -> dict[str, Any]:
    """Train ``opts`` unless ``opts.out`` already holds a model with a valid card.

    An interrupted training (its checkpoint exists) is resumed. Returns the model's privacy
    summary and training seconds (from this run or the recorded earlier one). ``fit(opts,
    progress)`` replaces ``dphub.train.train`` (the owner's distillation or local training,
    :mod:`dphub.owner.distill`); it returns a ``TrainResult`` and starts afresh (its labels
    are made again: an interrupted one's checkpoint is dropped).
    """
    from dphub import checkpoint
    from dphub.card import dp_summary
    from dphub.errors import DphubError
    from dphub.hub.validate import validate_card
    from dphub.train import checkpoint_dir_for, train

    out = Path(opts.out)
    record = state.section("trainings")
    if out.exists():
        try:
            card = validate_card(out, require_private=not opts.no_dp)
        except DphubError as e:
            raise DphubError(f"{out}: exists but its card is not valid ({e.message}); remove "
                             "the directory to train it again") from None
        clock.log(f"{name}: trained earlier, reusing {out.name}")
    else:
        ckpt = checkpoint_dir_for(out, opts.checkpoint_dir)
        if fit is not None and checkpoint.exists(ckpt):
            import shutil

            shutil.rmtree(ckpt)
        opts.resume = checkpoint.exists(ckpt)
        clock.log(f"{name}: training{' (resuming)' if opts.resume else ''}")
        last = [time.monotonic()]

        def progress(p: Any) -> None:
            if time.monotonic() - last[0] >= 30 or p.step == p.total_steps:
                last[0] = time.monotonic()
                eps = "" if p.epsilon is None else f", ε so far {p.epsilon:.2f}"
                loss = "" if p.loss is None else f", loss {p.loss:.3f}"
                clock.log(f"  {name} {p.phase}: step {p.step}/{p.total_steps}{loss}{eps}")

        t0 = time.monotonic()
        res = train(opts, on_progress=progress) if fit is None else fit(opts, progress)
        # a fit's seconds include labelling the notes with the ensemble
        record[name] = {"seconds": round(res.seconds if fit is None else time.monotonic() - t0, 1),
                        "steps": res.steps}
        state.save()
        card = validate_card(out, require_private=not opts.no_dp)
    summary = dp_summary(card)
    seconds = record.get(name, {}).get("seconds")
    if seconds is not None:
        clock.record(f"train {name}", seconds)
    return {"epsilon": summary["epsilon"], "delta": summary["delta"], "unit": summary["unit"],
            "noise_multiplier": summary["noise_multiplier"], "steps": summary["steps"],
            "sample_rate": summary["sample_rate"], "patients": summary["patients"],
            "notes": summary["notes"], "train_seconds": seconds,
            "init_from": summary.get("init_from")}


# ------------------------------------------------------------------ cached model predictions
def _save_scores(path: Path, scores: Sequence[Any], seconds: float) -> None:
    """Token scores of many notes in one ``.npz`` (offsets and probabilities only, no text)."""
    import numpy as np

    from dphub.io import atomic_open

    labels = scores[0].labels if scores else ()
    decoded = [t for ts in scores for t in (ts.decoded or [])]
    has_decoded = all(ts.decoded is not None for ts in scores)
    with atomic_open(path, "wb", encoding=None) as fh:
        np.savez_compressed(
            fh,
            lengths=np.array([len(ts) for ts in scores], dtype=np.int64),
            offsets=np.concatenate([ts.offsets for ts in scores]) if scores
            else np.zeros((0, 2), dtype=np.int64),
            phi_prob=np.concatenate([ts.phi_prob for ts in scores]) if scores else np.zeros(0),
            label_probs=np.concatenate([ts.label_probs for ts in scores]) if scores
            else np.zeros((0, len(labels))),
            labels=np.array(labels, dtype=str),
            decoded=np.array(decoded if has_decoded else [], dtype=str),
            has_decoded=np.array(has_decoded),
            seconds=np.array(seconds),
        )


def _load_scores(path: Path) -> tuple[list[Any], float]:
    import numpy as np

    from dphub.scores import TokenScores

    with np.load(path, allow_pickle=False) as z:
        # every z[key] decompresses the whole array again: read each one once; the slices below
        # are views of these three arrays
        lengths = z["lengths"].tolist()
        labels = tuple(str(x) for x in z["labels"].tolist())
        decoded = [str(x) for x in z["decoded"].tolist()] if bool(z["has_decoded"]) else None
        offsets, phi_prob, label_probs = z["offsets"], z["phi_prob"], z["label_probs"]
        seconds = float(z["seconds"])
    out, pos = [], 0
    for n in lengths:
        out.append(TokenScores(
            offsets=offsets[pos:pos + n], phi_prob=phi_prob[pos:pos + n],
            label_probs=label_probs[pos:pos + n], labels=labels,
            decoded=decoded[pos:pos + n] if decoded is not None else None,
        ))
        pos += n
    return out, seconds


def cached_member_class() -> type:
    """``ModelMember`` whose ``token_scores`` are cached on disk per (weights, notes)."""
    from dphub.ensemble.members import ModelMember

    class CachedModelMember(ModelMember):
        """Runs the model once per note set; later runs (and calibration) read the cache."""

        def __init__(self, tagger: Any, name: str, *, weights: str, cache_dir: Path,
                     on_infer: Callable[[str, str, float], None] | None = None,
                     **meta: Any) -> None:
            super().__init__(tagger, name, **meta)
            self.weights = weights
            self.cache_dir = cache_dir
            self.on_infer = on_infer
            self._memory: dict[str, list[Any]] = {}

        def token_scores(self, notes: Sequence[Any]) -> list[Any]:
            h = hashlib.sha256(self.weights.encode())
            for n in notes:
                h.update(f"\n{n.id}\t{len(n.text)}".encode())
            key = h.hexdigest()[:20]
            if key in self._memory:
                return self._memory[key]
            safe = self.name.replace("/", "_").replace(":", "_")
            path = self.cache_dir / f"{safe}-{key}.npz"
            if path.is_file():
                scores, seconds = _load_scores(path)
            else:
                t = time.monotonic()
                scores = super().token_scores(notes)
                seconds = time.monotonic() - t
                self.cache_dir.mkdir(parents=True, exist_ok=True)
                _save_scores(path, scores, seconds)
            if self.on_infer is not None:
                self.on_infer(self.name, key, seconds)
            self._memory[key] = scores
            return scores

    return CachedModelMember


# ------------------------------------------------------------------------------- evaluation
@dataclass
class Row:
    """One line of a results table."""

    table: str
    name: str
    kind: str  # member | ensemble
    members: list[str]
    rules: bool
    aggregation: str  # decoded | any | calibrated
    epsilon: float | None
    unit: str | None
    scores: dict[str, float]
    thresholds: dict[str, float] = field(default_factory=dict)
    target_recall: float | None = None  # calibrated rows: the recall aimed for on owner-train
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "name": self.name, "kind": self.kind,
                "members": self.members, "rules": self.rules, "aggregation": self.aggregation,
                "epsilon": self.epsilon, "unit": self.unit, "thresholds": self.thresholds,
                "target_recall": self.target_recall, "note": self.note,
                **{k: round(v, 4) for k, v in self.scores.items()}}


def evaluate_slots(slots: Sequence[Any], notes: Sequence[Any],
                   rule: str = "any") -> tuple[list[dict], dict]:
    """Rows of each member alone and the ensemble under ``rule`` (``dphub.ensemble.evaluation``)."""
    from dphub.ensemble.core import Ensemble
    from dphub.ensemble.evaluation import evaluate_ensemble

    rows = evaluate_ensemble(Ensemble(list(slots), rule), list(notes))
    return rows[:-1], rows[-1]


def headline(row: dict[str, Any]) -> dict[str, float]:
    return {k: float(row[k]) for k in ("precision", "recall", "f1", "phrase_recall_any",
                                       "phrase_recall_full")}


# ------------------------------------------------------------------------------ the tables
def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _eps(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int = 1) -> str:
    """A GitHub markdown table: the first ``text_columns`` left-aligned, numbers right-aligned."""
    align = [":--" if i < text_columns else "--:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


SCORE_HEADER = ["P", "R", "F1", "phrase R (any)", "phrase R (full)"]


def _score_cells(s: dict[str, float]) -> list[str]:
    return [_pct(s["precision"]), _pct(s["recall"]), _pct(s["f1"]), _pct(s["phrase_recall_any"]),
            _pct(s["phrase_recall_full"])]


def render_markdown(result: dict[str, Any]) -> str:
    """``tables.md``: settings, splits, Table 5.1 (A), Table 5.2 (B), wall times."""
    s = result["settings"]
    lines = [
        "# Framework reproduction: DP de-identification models shared between sites",
        "",
        f"Corpus `{result['corpus']['name']}` ({result['corpus']['format']}): "
        f"{result['corpus']['notes']} labelled notes of {result['corpus']['patients']} patients"
        + (" (--quick: at most 24 patients)" if s["quick"] else "") + ". "
        f"Patient-disjoint split (seed {s['seed']}); every model is trained with DP-SGD at "
        f"patient-level target ε = {s['target_epsilon']:g} (PRV accountant), {s['epochs']:g} "
        f"epoch(s), base model `{s['base_model']}`, warm start `{s['warm_start']}`. "
        "Scores are token-binary precision/recall/F1 and phrase recall (any overlap / full "
        "cover), in %, on `owner-test`.",
        "",
        md_table(["part", "role", "patients", "notes", "PHI spans"], [
            [name, part["role"], str(part["patients"]), str(part["notes"]), str(part["phi_spans"])]
            for name, part in result["splits"].items()
        ], text_columns=2),
        "",
        "## Table 5.1 — Scenario A: pulled models, no owner labels",
        "",
        "Each member decodes on its own (CRF Viterbi); the ensemble flags a token if any member "
        "does. Without owner labels nothing is calibrated.",
        "",
    ]
    rows_a = [r for r in result["rows"] if r["table"] == "A"]
    lines.append(md_table(["model", "trained on", "ε", "unit", *SCORE_HEADER], [
        [r["name"], r["note"], _eps(r["epsilon"]), r["unit"] or "–", *_score_cells(r)]
        for r in rows_a
    ], text_columns=2))
    lines += [
        "",
        "## Table 5.2 — Scenario B: the owner adds its own model",
        "",
        "`owner` is trained with DP on `owner-train`; `owner-ft` fine-tunes the pulled site-1 "
        "model on `owner-train` (DP, `init_from`). *calibrated R≥t*: per-member thresholds on "
        "P(PHI) chosen on `owner-train` for ensemble token recall ≥ t (t ∈ "
        f"{{{', '.join(f'{t:g}' for t in s['target_recalls'])}}}; rules keep their own "
        "decisions), then scored on `owner-test`. ε of an ensemble is its largest member ε: "
        "each member protects different patients.",
        "",
    ]
    rows_b = [r for r in result["rows"] if r["table"] == "B"]
    lines.append(md_table(["model / ensemble", "members", "rules", "aggregation", "ε (max)",
                           "unit", *SCORE_HEADER], [
        [r["name"], ", ".join(m for m in r["members"] if not m.startswith("rules")) or "–",
         "yes" if r["rules"] else "no", r["aggregation"], _eps(r["epsilon"]), r["unit"] or "–",
         *_score_cells(r)]
        for r in rows_b
    ], text_columns=4))
    calibrated = [r for r in rows_b if r["aggregation"] == "calibrated"]
    if calibrated:
        lines += ["", "Calibrated thresholds (on `owner-train`):", ""]
        for r in calibrated:
            th = ", ".join(f"{k} {v:g}" for k, v in r["thresholds"].items())
            lines.append(f"* {r['name']}: {th} — {r['note']}")
    for table, title, text in (
        ("A+", "Scenario A+: a student distilled from the ensemble (no owner labels)",
         "`dphub ensemble distill`: the three site models + rules (`any`) label `owner-train`'s "
         "notes (its gold labels are not used); a student is trained on those hard labels (soft "
         "where marked: each span's score as the probability of its tag), without DP (local only: its card says it contains unprotected patient information and "
         "the publish gate refuses it) unless marked DP. Scored on `owner-test`; deid.pl's "
         "shipped output on the same notes beside them (with `--deidpl-output`)."),
        ("B local", "Scenario B local: the owner's model without DP",
         "`dphub ensemble train`: the owner's model on `owner-train`'s gold labels without DP "
         "(local only), from the warm start or from the pulled site-1 model (`--init-from`)."),
    ):
        rows_t = [r for r in result["rows"] if r["table"] == table]
        if not rows_t:
            continue
        lines += ["", f"## {title}", "", text, ""]
        lines.append(md_table(["model / ensemble", "how", "ε (max)", "unit", *SCORE_HEADER], [
            [r["name"], r["note"], _eps(r["epsilon"]), r["unit"] or "–", *_score_cells(r)]
            for r in rows_t], text_columns=2))
    lines += ["", "## Models", ""]
    lines.append(md_table(
        ["model", "data", "patients", "notes", "ε", "δ", "σ", "q", "steps", "train s"],
        [[name, m["data"], str(m["patients"]), str(m["notes"]), _eps(m["epsilon"]),
          f"{m['delta']:.1e}" if m["delta"] is not None else "–",
          f"{m['noise_multiplier']:.3g}" if m["noise_multiplier"] is not None else "–",
          f"{m['sample_rate']:.3g}", str(m["steps"]),
          "–" if m["train_seconds"] is None else f"{m['train_seconds']:.0f}"]
         for name, m in result["models"].items()], text_columns=2))
    lines += ["", "## Wall times (seconds)", ""]
    lines.append(md_table(["stage", "seconds"], [
        [k, f"{v:.1f}"] for k, v in result["wall_times"].items()
    ]))
    lines += ["", f"Run: `{result['command']}`; dphub {result['versions']['dphub']}, torch "
              f"{result['versions']['torch']}, opacus {result['versions']['opacus']}.", ""]
    return "\n".join(lines)

# ------------------------------------------------------------- the owner's own models (issue 14)
#: (row name, rounds, dp, soft labels, the teacher's rule) of the distilled students: teacher =
#: the three site models + rules. ``student-r2``: a second round, labelled by the teacher plus
#: the first round's student; ``student-soft``: soft labels (each span's score as its tag's
#: probability); ``student-q3``: the site models must agree (:data:`QUORUM`), the rules count alone.
STUDENTS = (("student", 1, False, False, "any"), ("student-r2", 2, False, False, "any"),
            ("student-soft", 1, False, True, "any"), ("student-dp", 1, True, False, "any"),
            ("student-q3", 1, False, False, f"{QUORUM}+rules:default"))


def owner_trainings(args: argparse.Namespace, work: Path, data: dict[str, list[Any]],
                    teacher: Any, site1_spec: str) -> list[tuple[str, Any, Any, str, str]]:
    """(name, TrainOptions, fit, table, how) of every owner model: B local first (no teacher
    needed), then the students distilled from ``teacher`` (None: B local only)."""
    from dataclasses import replace

    from dphub.ensemble.core import Ensemble
    from dphub.owner.distill import distill, local_options, train_local
    from dphub.train import TrainOptions

    train_notes = data["owner-train"]

    def opts(name: str, dp: bool, **kw: Any) -> Any:
        o = TrainOptions(data=work / "data" / "owner-train.jsonl", out=work / "models" / name,
                         base_model=args.base_model, target_epsilon=args.target_epsilon,
                         epochs=args.epochs, seed=args.seed, privacy_unit="patient",
                         warm_start=args.warm_start, **kw)
        if args.batch_size is not None and dp:
            o.batch_size = args.batch_size
        return local_options(o, dp=dp)

    def fit_local(o: Any, progress: Any) -> Any:
        return train_local(train_notes, o, on_progress=progress).train

    out: list[tuple[str, Any, Any, str, str]] = [
        ("owner-local", opts("owner-local", False), fit_local, "B local",
         "no DP, local only; owner-train's gold labels"),
        ("owner-local-ft", opts("owner-local-ft", False, init_from=site1_spec), fit_local,
         "B local", "no DP, local only; site-1 → owner-train's gold labels"),
    ]
    if teacher is None:
        return out
    unlabelled = [replace(n, spans=[], labelled=False) for n in train_notes]  # Scenario A
    names = ", ".join(s.name for s in teacher.slots)
    # the sites' models saw other patients than owner-train's (the reproduction splits the
    # corpus by site): declared, so a DP student's ε is not composed with theirs
    sites = [s.name for s in teacher.slots if s.epsilon]
    for name, rounds, dp, soft, rule in STUDENTS:
        def fit(o: Any, progress: Any, rounds: int = rounds, rule: str = rule) -> Any:
            return distill(Ensemble(teacher.slots, rule), unlabelled, o, rounds=rounds,
                           batch_size=len(unlabelled), on_progress=progress,
                           disjoint_teachers=sites if not o.no_dp else ()).train

        how = (f"{'DP' if dp else 'no DP, local only'}; labels: {names} ({rule}) on owner-train"
               + (f", {rounds} rounds" if rounds > 1 else "") + (", soft" if soft else ""))
        # a DP student is one more release on owner-train's patients, beside `owner` and
        # `owner-ft`: the privacy ledger composes all three (above the default policy of 10);
        # the table compares them, a real owner would keep one
        out.append((name, opts(name, dp, soft_labels=soft, allow_above_policy=dp), fit, "A+",
                    how))
    return out


def owner_rows(args: argparse.Namespace, work: Path, data: dict[str, list[Any]],
               models: dict[str, dict[str, Any]], sites: list[Any], rules: Any, site1_spec: str,
               state: State, clock: Clock, model_slot: Callable[..., Any]) -> list[Row]:
    """Scenario A+ (students distilled from the ensemble on ``owner-train``'s notes, their labels
    unused) and B local (the owner's no-DP model on its labels), scored on ``owner-test``.

    The teacher is the three site models + rules under ``any``: without labels nothing can be
    calibrated, and the community model's card says it was trained on another note type
    (synthetic discharge summaries), which an owner can see without labels.
    """
    from dphub.ensemble.core import Ensemble
    from dphub.ensemble.manifest import card_privacy, weights_digest

    test = data["owner-test"]
    teacher = Ensemble([*sites, rules], "any")
    rows: list[Row] = []
    deidpl = None
    if args.deidpl_output is not None:  # the reference beside the owner's models
        from dphub.ensemble.core import Slot
        from dphub.ensemble.members import FixedMember
        from dphub.evaluate import evaluate_spans, read_predictions

        text = args.corpus / "id.text" if args.corpus.is_dir() else args.corpus
        pred = read_predictions(args.deidpl_output, format="deidpl", text_path=text)
        ids = {n.id for n in test}
        res = evaluate_spans(test, {k: v for k, v in pred.items() if k in ids})
        rows.append(Row("A+", "deid.pl", "member", ["deid.pl"], False, "rules", None, None,
                        headline(res.headline()),
                        note="PhysioNet deid 1.1, its shipped output on the same notes"))
        # deid.pl as a member, as `dphub ensemble add deidpl:DIR` gives it
        deidpl = Slot(FixedMember("deid.pl", {k: v for k, v in pred.items() if k in ids}))

    def add(table: str, label: str, slots: list[Any], note: str, rule: str = "any") -> None:
        member_rows, ens = evaluate_slots(slots, test, rule)
        if len(slots) == 1:
            r = member_rows[0]
            rows.append(Row(table, label, "member", [r["name"]], False, "decoded", r["epsilon"],
                            r["unit"], headline(r), note=note))
            return
        names = [s.name for s in slots]
        rows.append(Row(table, label, "ensemble", names, "rules:default" in names, rule,
                        ens["epsilon"], ens["unit"], headline(ens), note=note))

    for name, opts, fit, table, how in owner_trainings(args, work, data, teacher, site1_spec):
        models[name] = {"data": "owner-train" + (" (ensemble labels)" if table == "A+" else ""),
                        **train_or_skip(name, opts, state, clock, fit=fit)}
        path = work / "models" / name
        priv = card_privacy(path)
        own = model_slot(name, path, priv.get("epsilon"), priv.get("privacy_unit"),
                         weights_digest(path), priv.get("delta"))
        add(table, name, [own], how)
        add(table, f"{name} + rules (any)", [own, rules], how)
        if name in ("owner-local", "owner-local-ft", "student"):
            add(table, f"sites + {name} + rules (any)", [*sites, own, rules], how)
        if name == "owner-local":
            add(table, f"sites (3 of 3) + {name} + rules", [*sites, own, rules],
                f"{how}; the sites must agree, {name} and the rules count alone",
                f"{QUORUM}+{name}+rules:default")
        if deidpl is not None and name in ("owner-local", "student-q3"):
            for t in CONFIRM_THRESHOLDS:
                add(table, f"{name} + rules + deid.pl confirmed by {name}@{t:g}",
                    [own, confirming(own, t), deidpl, rules],
                    f"{how}; {name} and the rules count alone, deid.pl where {name}'s "
                    f"P(PHI) >= {t:g} agrees", f"k-of-n:2+{name}+rules:default")
    return rows


def confirming(slot: Any, threshold: float) -> Any:
    """``slot``'s model as a second member ``NAME@T`` that flags P(PHI) >= ``threshold``: the
    vote that lets a recall-first tool's flag count (``k-of-n:2+NAME+rules:default``). The copy
    shares the model and its cached scores: no second inference."""
    import copy
    from dataclasses import replace

    member = copy.copy(slot.member)
    member.name = f"{slot.name}@{threshold:g}"
    return replace(slot, member=member, threshold=threshold)


# ----------------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Reproduce the framework experiment (thesis Tables 5.1/5.2) on a corpus.")
    p.add_argument("corpus", type=Path, help="Labelled corpus with patient ids (any dphub format).")
    p.add_argument("--out", type=Path, default=Path("results"), help="Output directory.")
    p.add_argument("--format", default=None, help="Corpus format (default: detect).")
    p.add_argument("--seed", type=int, default=0, help="Seed of the splits and the trainings.")
    p.add_argument("--epochs", type=float, default=None,
                   help="DP epochs (default: dphub train's, 32; quick: 1).")
    p.add_argument("--target-epsilon", type=float, default=8.0,
                   help="Patient-level ε of every trained model.")
    p.add_argument("--batch-size", type=int, default=None,
                   help="Expected patients per DP step (default: dphub's).")
    p.add_argument("--base-model", default=None,
                   help="Base encoder directory (default: the embedded all-MiniLM-L6-v2).")
    p.add_argument("--warm-start", choices=("synth", "none"), default=None,
                   help="Public warm start on synthetic notes (default synth; quick: none).")
    p.add_argument("--community-notes", type=int, default=None,
                   help="Synthetic discharge notes of the community model (default 200; quick: 8).")
    p.add_argument("--target-recall", default="0.9,0.95,0.99",
                   help="Ensemble token recall(s) the calibration aims for on owner-train "
                        "(Scenario B), comma-separated: one calibrated row per target.")
    p.add_argument("--rules-min-age", type=int, default=None,
                   help="Ages below this are not flagged by rules:default (default: 90 for "
                        "physionet, whose annotators follow Safe Harbor; else 0).")
    p.add_argument("--deidpl-output", type=Path, default=None,
                   help="deid.pl's output (.phi) on CORPUS: scored on owner-test beside the "
                        "owner's models (a PhysioNet corpus's id.text gives the note texts).")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads.")
    p.add_argument("--quick", action="store_true",
                   help="Tiny sizes for smoke tests (1 epoch, no warm start, <= 24 patients).")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args.target_recalls = [float(x) for x in args.target_recall.split(",") if x.strip()]
    except ValueError:
        p.error(f"--target-recall must be comma-separated numbers, got {args.target_recall!r}")
    if not args.target_recalls or any(not 0 < t <= 1 for t in args.target_recalls):
        p.error("--target-recall values must be in (0, 1]")
    if args.epochs is None:  # dphub train's default recipe, or a tiny smoke-test size
        from dphub.train import TrainOptions

        args.epochs = 1.0 if args.quick else TrainOptions.epochs
    if args.warm_start is None:
        args.warm_start = "none" if args.quick else "synth"
    if args.community_notes is None:
        args.community_notes = 8 if args.quick else 200
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / ".gitignore").write_text("# working state of reproduce_framework.py: contains note "
                                     "text; never commit or share\n*\n")
    # the owner's registry and every hub lookup stay inside the work directory
    os.environ["DPHUB_HOME"] = str((work / "home").resolve())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch

    torch.set_num_threads(args.threads)
    from dphub import __version__, formats, synth
    from dphub.encoders import resolve_base_model
    from dphub.ensemble.calibrate import calibrate
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.ensemble.manifest import card_privacy, weights_digest
    from dphub.errors import DphubError
    from dphub.hub import ops
    from dphub.registry import Registry
    from dphub.rules.engine import RuleMember, RuleOptions
    from dphub.splits import split_notes
    from dphub.tagger import Tagger
    from dphub.train import TrainOptions

    clock = Clock()
    state = State(work / "state.json")
    fmt = args.format or formats.detect_format(args.corpus)

    # ---- 1. data: three sites and the owner, patient-disjoint
    t = time.monotonic()
    notes = load_corpus(args.corpus, fmt)
    if args.quick:
        notes = keep_patients(notes, QUICK_MAX_PATIENTS, args.seed)
    parts = split_notes(notes, [0.25] * 4, by="patient", seed=args.seed)
    owner_train, owner_test = split_notes(parts[3], [0.5, 0.5], by="patient", seed=args.seed + 1)
    community = synth.generate(args.community_notes, kind="discharge", seed=args.seed + 1000)
    data = {**dict(zip(SITES, parts[:3], strict=True)), "owner-train": owner_train,
            "owner-test": owner_test, COMMUNITY: community}
    roles = {**{s: "site (publishes)" for s in SITES}, "owner-train": "owner (trains, calibrates)",
             "owner-test": "owner (evaluation)", COMMUNITY: "synthetic discharge (publishes)"}
    paths = {name: write_jsonl(ns, work / "data" / f"{name}.jsonl") for name, ns in data.items()}
    clock.record("data", time.monotonic() - t)
    clock.log("split: " + ", ".join(f"{k} {describe(v)['patients']} patients" for k, v in
                                   data.items()))

    def options(name: str, **kw: Any) -> TrainOptions:
        o = TrainOptions(data=paths.get(name), out=work / "models" / name,
                         base_model=args.base_model, target_epsilon=args.target_epsilon,
                         epochs=args.epochs, seed=args.seed, privacy_unit="patient",
                         warm_start=args.warm_start)
        if args.batch_size is not None:
            o.batch_size = args.batch_size
        for k, v in kw.items():
            setattr(o, k, v)
        return o

    # ---- 2. sites and the community train and publish
    models: dict[str, dict[str, Any]] = {}
    for name in (*SITES, COMMUNITY):
        models[name] = {"data": name, **train_or_skip(name, options(name), state, clock)}

    hub = (work / "hub").resolve()
    registry = Registry(work / "home")
    published = state.section("published")
    t = time.monotonic()
    entries = {}
    for name in (*SITES, COMMUNITY):
        repo = REPOS[name]
        weights = weights_digest(work / "models" / name)
        sha = (published.get(repo) or {}).get("sha")
        known: set[str] = set()
        if sha and published[repo].get("weights") == weights:
            try:
                known = {r.revision for r in ops.info(repo, hub=str(hub))}
            except DphubError:  # the hub or the repo is gone: publish again
                known = set()
        if sha not in known:
            sha, _ = ops.publish(work / "models" / name, repo, hub=str(hub))
            published[repo] = {"sha": sha, "weights": weights}
            state.save()
            clock.log(f"published {repo}@{sha[:12]}")
        try:
            entries[name] = registry.get(repo, sha)
        except DphubError:  # not pulled yet
            entries[name] = ops.pull(f"{repo}@{sha}", hub=str(hub), require_unit="patient",
                                     registry=registry)
            clock.log(f"pulled {repo}@{sha[:12]} (ε = {entries[name].epsilon})")
    clock.record("publish + pull", time.monotonic() - t)

    # ---- 3. the owner's models (Scenario B): own DP model, and a DP fine-tune of site-1
    models["owner"] = {"data": "owner-train",
                       **train_or_skip("owner", options("owner-train", out=work / "models" /
                                                         "owner"), state, clock)}
    site1 = entries[SITES[0]]
    models["owner-ft"] = {"data": "owner-train",
                          **train_or_skip("owner-ft", options(
                              "owner-train", out=work / "models" / "owner-ft",
                              init_from=f"{site1.name}@{site1.revision}",
                              # the split is by patient: site-1 saw none of owner-train's
                              # patients (the ledger refuses the claim if it knows otherwise)
                              disjoint_teacher=True,
                              # but `owner` was trained on the same owner-train patients: the
                              # privacy ledger composes the two (ε ≈ 12 for those patients at
                              # the default ε 8 each, above the default policy of 10). The
                              # paper's table compares both; a real owner keeps one of them
                              allow_above_policy=True), state, clock)}

    # ---- members, with cached predictions
    Cached = cached_member_class()
    infer: dict[str, dict[str, float]] = {}  # member -> note set -> seconds of its first run

    def on_infer(name: str, key: str, seconds: float) -> None:
        infer.setdefault(name, {})[key] = seconds

    def model_slot(name: str, path: Path, eps: float | None, unit: str | None,
                   revision: str, delta: float | None) -> Any:
        member = Cached(Tagger.load(path), name, weights=weights_digest(path),
                        cache_dir=work / "cache", on_infer=on_infer, epsilon=eps, unit=unit,
                        revision=revision)
        # δ too: a DP student's lineage records every teacher's (ε, δ), composed or declared
        return Slot(member, None, eps, unit, revision, delta=delta)

    pulled = [model_slot(n, e.path, e.epsilon, e.unit, e.revision,
                         e.delta) for n, e in entries.items()]
    own = {}
    for name in ("owner", "owner-ft"):
        path = work / "models" / name
        priv = card_privacy(path)
        own[name] = model_slot(name, path, priv.get("epsilon"), priv.get("privacy_unit"),
                               weights_digest(path), priv.get("delta"))
    min_age = args.rules_min_age if args.rules_min_age is not None else (
        90 if fmt == "physionet" else 0)
    rules = Slot(RuleMember("rules:default", RuleOptions(min_age=min_age)), None, 0.0, None, None)

    rows: list[Row] = []
    test = data["owner-test"]

    # ---- Scenario A (Table 5.1)
    t = time.monotonic()
    member_rows, ens_no_rules = evaluate_slots(pulled, test)
    trained_on = {**{s: f"{s} ({models[s]['patients']} patients)" for s in SITES},
                  COMMUNITY: f"synthetic discharge ({models[COMMUNITY]['notes']} notes)",
                  "rules:default": "– (no data)"}
    for r in member_rows:
        rows.append(Row("A", r["name"], "member", [r["name"]], False, "decoded", r["epsilon"],
                        r["unit"], headline(r), note=trained_on.get(r["name"], "")))
    rule_rows, ens_rules = evaluate_slots([*pulled, rules], test)
    r = rule_rows[-1]
    rows.append(Row("A", "rules:default", "member", ["rules:default"], True, "rules", 0.0, None,
                    headline(r), note=f"– (no data; min_age {min_age})"))
    names = [s.name for s in pulled]
    rows.append(Row("A", "ensemble (any)", "ensemble", names, False, "any",
                    ens_no_rules["epsilon"], ens_no_rules["unit"], headline(ens_no_rules),
                    note="all pulled models"))
    rows.append(Row("A", "ensemble (any) + rules", "ensemble", [*names, "rules:default"], True,
                    "any", ens_rules["epsilon"], ens_rules["unit"], headline(ens_rules),
                    note="all pulled models + rules"))
    # the same without the other-domain community model: what it costs in precision
    sites = [s for s in pulled if s.name in SITES]
    _, ens_sites = evaluate_slots([*sites, rules], test)
    rows.append(Row("A", "sites (any) + rules", "ensemble", [*SITES, "rules:default"], True,
                    "any", ens_sites["epsilon"], ens_sites["unit"], headline(ens_sites),
                    note="the three site models + rules (no community model)"))
    quorum = f"{QUORUM}+rules:default"
    _, ens_q = evaluate_slots([*sites, rules], test, quorum)
    rows.append(Row("A", "sites (3 of 3) + rules", "ensemble", [*SITES, "rules:default"], True,
                    quorum, ens_q["epsilon"], ens_q["unit"], headline(ens_q),
                    note="the three site models must agree; the rules count alone"))
    clock.record("scenario A evaluation", time.monotonic() - t)
    clock.log("Scenario A done")

    # ---- Scenario B (Table 5.2)
    t = time.monotonic()
    train_notes = data["owner-train"]
    for variant in ("owner", "owner-ft"):
        slot = own[variant]
        m_rows, ens = evaluate_slots([*pulled, slot], test)
        owner_row = m_rows[-1]
        rows.append(Row("B", variant, "member", [variant], False, "decoded",
                        owner_row["epsilon"], owner_row["unit"], headline(owner_row),
                        note="owner-train" if variant == "owner" else "site-1 → owner-train"))
        for with_rules in (False, True):
            slots = [*pulled, slot, *([rules] if with_rules else [])]
            label = f"pulled + {variant}" + (" + rules" if with_rules else "")
            if with_rules:
                _, ens = evaluate_slots(slots, test)
            rows.append(Row("B", f"{label} (any)", "ensemble", [s.name for s in slots],
                            with_rules, "any", ens["epsilon"], ens["unit"], headline(ens)))
            if with_rules:  # without the other-domain community model, as in Table 5.1
                site_slots = [*sites, slot, rules]
                _, ens_s = evaluate_slots(site_slots, test)
                rows.append(Row("B", f"sites + {variant} + rules (any)", "ensemble",
                                [s.name for s in site_slots], True, "any", ens_s["epsilon"],
                                ens_s["unit"], headline(ens_s), note="no community model"))
            for target in args.target_recalls:
                cal = calibrate(Ensemble(slots, "any"), train_notes, target)
                calibrated = cal.apply(slots)  # per (member, label) thresholds
                _, ens_c = evaluate_slots(calibrated, test)
                rows.append(Row(
                    "B", f"{label} (calibrated R≥{target:g})", "ensemble",
                    [s.name for s in slots], with_rules, "calibrated", ens_c["epsilon"],
                    ens_c["unit"], headline(ens_c), thresholds=dict(cal.thresholds),
                    target_recall=target,
                    note=(f"owner-train recall {100 * cal.recall:.1f} % (target "
                          f"{100 * cal.target_recall:g} %"
                          f"{'' if cal.reached else ', not reached'}), precision "
                          f"{100 * cal.precision:.1f} %"),
                ))
    clock.record("scenario B evaluation (calibration included)", time.monotonic() - t)
    clock.log("Scenario B done")

    # ---- Scenario A+ and B local (issue 14): the owner's own models, trained where the notes
    # are, without DP (local only) unless marked DP
    t = time.monotonic()
    rows += owner_rows(args, work, data, models, sites, rules, f"{site1.name}@{site1.revision}",
                       state, clock, model_slot)
    clock.record("scenario A+ / B local (trainings + evaluation)", time.monotonic() - t)
    clock.log("Scenario A+ / B local done")

    for name, per_set in infer.items():
        clock.record(f"inference {name} ({len(per_set)} note sets; cached after the first run)",
                     sum(per_set.values()))
    clock.record("this run, total", time.monotonic() - clock.t0)

    import opacus

    return {
        "corpus": {"name": Path(args.corpus).resolve().name, "format": fmt, **describe(notes)},
        "settings": {"seed": args.seed, "epochs": args.epochs,
                     "target_epsilon": args.target_epsilon, "batch_size": args.batch_size,
                     # the public id dphub records (a directory's name, never its path)
                     "base_model": resolve_base_model(args.base_model)[1],
                     "warm_start": args.warm_start, "community_notes": args.community_notes,
                     "target_recalls": args.target_recalls, "rules_min_age": min_age,
                     "quick": args.quick},
        "splits": {name: {"role": roles[name], **describe(ns)} for name, ns in data.items()},
        "models": models,
        "rows": [r.to_dict() for r in rows],
        "wall_times": dict(clock.stages),
        "command": "python examples/reproduce_framework.py " + " ".join(
            Path(a).name if Path(a).exists() else a for a in args.argv),
        "versions": {"dphub": __version__, "torch": torch.__version__,
                     "opacus": opacus.__version__},
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from dphub.errors import DphubError
    from dphub.io import atomic_write_text

    try:
        result = run(args)
    except DphubError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return e.exit_code
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "tables.json", json.dumps(result, indent=2) + "\n")
    md = render_markdown(result)
    atomic_write_text(args.out / "tables.md", md)
    print(md)
    print(f"wrote {args.out / 'tables.md'} and {args.out / 'tables.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
