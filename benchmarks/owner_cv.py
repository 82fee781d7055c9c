"""Owner-side choices checked on the owner's own labels only: two folds of ``owner-train``.

Usage::

    python benchmarks/owner_cv.py --work REPRO_OUT/work [--out DIR] [--what distill,local,aggregate]
        [--deidpl-output deidpl-output-dev.phi --corpus-text CORPUS/id.text]

``REPRO_OUT`` is the output directory of ``examples/reproduce_framework.py`` (its ``work/data``
splits and ``work/models`` site models). ``owner-train``'s patients are split in two folds (sorted
patient ids, alternating); each variant trains on one fold and is scored on the other fold's gold
labels, token-binary, alone and with ``rules:default`` (``any``; its ``min_age`` is
``--rules-min-age``, else what the reproduction recorded in ``REPRO_OUT/tables.json``, else 90:
the PhysioNet corpus annotates ages of 90 and over only); the table shows the mean of the two
folds. ``owner-test`` is never read, so the choices made here can be reported on it after.

* ``distill``: students distilled from the three site models + rules (``any``) on the training
  fold's notes (their gold labels unused), with hard and with soft labels (``--soft-labels``), and
  with hard labels from a teacher in which the three site models must agree
  (``k-of-n:3+rules:default``);
* ``local``: the owner's local model on the training fold's gold labels (``ensemble train``),
  decoded (Viterbi) and thresholded at P(PHI) ≥ 0.3 and ≥ 0.1, with recall weight 10, and with
  encoder layers trained too (no DP, so nothing forces the frozen encoder): the top two layers
  (learning rate 1e-3, 8 epochs; recall weight 3, the default, and 1), or LoRA adapters (rank 8)
  on all six (8 epochs). These take 2-11 minutes each, the frozen-encoder ones 1-2.
* ``aggregate``: how to combine the three site models with the rules (Scenario A, no labels) and
  with the local model (Scenario B): ``any`` against a quorum among the site models while the
  rules and the local model count alone (``k-of-n:K+owner+rules:default``). Each member tags the
  fold once; every rule is applied to the same member spans. With ``--deidpl-output``, deid.pl's
  shipped output joins as a member: alone in the union, voting, or *confirmed* — its flag counts
  where the local model (or the quorum teacher's student) at a low threshold agrees, while the
  decoded model and the rules count alone (``k-of-n:2+owner+rules:default`` over the model, the
  same model at threshold t, deid.pl and the rules).

Each training is one local (non-DP) run of the dphub defaults on one CPU thread (about 1-2 minutes
each on this machine); models are kept under ``--out`` and reused by a re-run.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any


def _mean(rows: list[list[dict[str, Any]]], i: int) -> str:
    vals = [sum(r[i][k] for r in rows) / len(rows) * 100 for k in ("precision", "recall", "f1")]
    return " / ".join(f"{v:.1f}" for v in vals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="the reproduction's work directory")
    ap.add_argument("--out", type=Path, default=Path("owner-cv"), help="where models are kept")
    ap.add_argument("--what", default="distill,local,aggregate")
    ap.add_argument("--deidpl-output", type=Path,
                    help="deid.pl's output on the corpus (e.g. deidpl-output-dev.phi): adds the "
                         "aggregation rows with deid.pl as a member")
    ap.add_argument("--corpus-text", type=Path, help="the corpus's id.text (with --deidpl-output)")
    ap.add_argument("--rules-min-age", type=int, default=None,
                    help="the rule member's min_age (default: the reproduction's, else 90)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from dphub import formats
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.ensemble.evaluation import evaluate_ensemble
    from dphub.ensemble.members import ModelMember
    from dphub.owner.distill import distill, local_options, train_local
    from dphub.train import TrainOptions

    rules = rule_member(args.work, args.rules_min_age)
    data = args.work / "data" / "owner-train.jsonl"
    notes = list(formats.read(data, "jsonl"))
    patients = sorted({n.patient_id for n in notes})
    folds = [set(patients[0::2]), set(patients[1::2])]
    what = set(args.what.split(","))

    def opts(out: Path, **kw: Any) -> Any:
        return local_options(TrainOptions(data=data, out=out, seed=0, privacy_unit="patient",
                                          **kw), dp=False, explicit=set(kw))

    def scored(model_dir: Path, test: list[Any], threshold: float | None) -> list[dict[str, Any]]:
        member = ModelMember.load(model_dir, "owner")
        return evaluate_ensemble(Ensemble([Slot(member, threshold), Slot(rules)], "any"), test)

    variants: list[tuple[str, str, dict[str, Any], float | None]] = []
    if "distill" in what:
        variants += [("student, hard labels", "hard", {}, None),
                     ("student, soft labels", "soft", {"soft_labels": True}, None),
                     ("student, teacher 3 of 3 sites", "hard-q3", {}, None)]
    if "local" in what:
        variants += [("local model, decoded", "local", {}, None),
                     ("local model, P(PHI) >= 0.3", "local", {}, 0.3),
                     ("local model, P(PHI) >= 0.1", "local", {}, 0.1),
                     ("local model, recall weight 10", "local-rw10", {"recall_weight": 10.0},
                      None),
                     ("local, top 2 encoder layers", "local-tl2", TUNED, None),
                     ("local, top 2 layers, rw 1", "local-tl2rw1",
                      {**TUNED, "recall_weight": 1.0}, None),
                     ("local, LoRA r8 on 6 layers", "local-lora8",
                      {"train_layers": 6, "lora_rank": 8, "epochs": 8}, None)]
    teacher = None
    print(f"| {'variant':<30} | {'alone P / R / F1':<18} | {'+ rules P / R / F1':<18} |")
    print(f"|{'-' * 32}|{'-' * 20}|{'-' * 20}|")
    for label, key, kw, threshold in variants:
        rows = []
        for f, held in enumerate(folds):
            train = [n for n in notes if n.patient_id not in held]
            test = [n for n in notes if n.patient_id in held]
            model_dir = args.out / f"{key}-fold{f}"
            if not (model_dir / "model.safetensors").is_file():
                if key in ("hard", "soft", "hard-q3"):
                    if teacher is None:
                        teacher = [*(Slot(ModelMember.load(args.work / "models" / s, s),
                                          epsilon=8.0) for s in SITES), Slot(rules)]
                    rule = f"k-of-n:3+{RULES}" if key == "hard-q3" else "any"
                    unlabelled = [replace(n, spans=[], labelled=False) for n in train]
                    distill(Ensemble(teacher, rule), unlabelled, opts(model_dir, **kw),
                            batch_size=len(unlabelled))
                else:
                    train_local(train, opts(model_dir, **kw))
            rows.append(scored(model_dir, test, threshold))
        print(f"| {label:<30} | {_mean(rows, 0):<18} | {_mean(rows, -1):<18} |", flush=True)
    if "aggregate" in what:
        deidpl = None
        if args.deidpl_output is not None:
            from dphub.evaluate import read_predictions

            deidpl = read_predictions(args.deidpl_output, format="deidpl",
                                      text_path=args.corpus_text)
        aggregations(args.work, args.out, notes, folds, opts, rules, deidpl)


def rule_member(work: Path, min_age: int | None) -> Any:
    """``rules:default`` as the reproduction ran it: its recorded ``min_age`` unless given."""
    import json

    from dphub.rules.engine import RuleMember, RuleOptions

    if min_age is None:
        tables = work.parent / "tables.json"
        settings = json.loads(tables.read_text())["settings"] if tables.is_file() else {}
        min_age = int(settings.get("rules_min_age", 90))
    print(f"rules:default with min_age {min_age}")
    return RuleMember(RULES, RuleOptions(min_age=min_age))


SITES = ("site-1", "site-2", "site-3")
#: the local model with its top two encoder layers trained (``local`` variants)
TUNED: dict[str, Any] = {"train_layers": 2, "lr": 1e-3, "epochs": 8}
RULES = "rules:default"
#: (row, members, aggregation rule): Scenario A (sites + rules) and B (sites + local + rules)
AGGREGATIONS: list[tuple[str, tuple[str, ...], str]] = [
    ("A: sites + rules, any", (*SITES, RULES), "any"),
    ("A: sites + rules, 2 of 3 sites", (*SITES, RULES), f"k-of-n:2+{RULES}"),
    ("A: sites + rules, 3 of 3 sites", (*SITES, RULES), f"k-of-n:3+{RULES}"),
    ("B: local + rules, any", ("owner", RULES), "any"),
    ("B: sites + local + rules, any", (*SITES, "owner", RULES), "any"),
    ("B: sites + local + rules, 2 of 3 sites", (*SITES, "owner", RULES),
     f"k-of-n:2+owner+{RULES}"),
    ("B: sites + local + rules, 3 of 3 sites", (*SITES, "owner", RULES),
     f"k-of-n:3+owner+{RULES}"),
]
#: rows with deid.pl's output as a member (``--deidpl-output``): alone in the union, or voting
DEIDPL_AGGREGATIONS: list[tuple[str, tuple[str, ...], str]] = [
    ("A: deid.pl + rules, any", ("deid.pl", RULES), "any"),
    ("A: deid.pl + rules, both agree", ("deid.pl", RULES), "k-of-n:2"),
    ("A: sites + deid.pl + rules, 2 of 5", (*SITES, "deid.pl", RULES), "k-of-n:2"),
    ("B: local + deid.pl + rules, any", ("deid.pl", "owner", RULES), "any"),
    ("B: local + deid.pl + rules, local alone, 2 of 3", ("deid.pl", "owner", RULES),
     "k-of-n:2+owner"),
    ("B: sites + local + deid.pl + rules, local alone, 3 of 6", (*SITES, "deid.pl", "owner", RULES),
     "k-of-n:3+owner"),
]
#: thresholds at which a model, below its own decoding, may confirm deid.pl's flags
CONFIRM_THRESHOLDS = (0.1, 0.05, 0.02)
#: deid.pl confirmed by a model at a low threshold: the model (decoded) and the rules count alone,
#: deid.pl counts where the same model's P(PHI) >= t agrees (``MODEL@t`` is that model's slot at
#: threshold t). Scenario B with the local model, Scenario A+ with the student of the quorum
#: teacher (when ``--what distill`` has trained it).
CONFIRMED_AGGREGATIONS: list[tuple[str, tuple[str, ...], str]] = [
    *((f"B: local + rules + deid.pl confirmed by local@{t:g}",
       ("owner", f"owner@{t:g}", "deid.pl", RULES), f"k-of-n:2+owner+{RULES}")
      for t in CONFIRM_THRESHOLDS),
    *((f"A+: student q3 + rules + deid.pl confirmed by student@{t:g}",
       ("student", f"student@{t:g}", "deid.pl", RULES), f"k-of-n:2+student+{RULES}")
      for t in CONFIRM_THRESHOLDS),
]


def aggregations(work: Path, out: Path, notes: list[Any], folds: list[set[Any]],
                 opts: Any, rules: Any, deidpl: dict[str, Any] | None = None) -> None:
    """The :data:`AGGREGATIONS` table: member spans computed once per fold, every rule applied.

    ``deidpl``: deid.pl's spans per note id (its output file, read by ``dphub.evaluate``), as a
    member of the :data:`DEIDPL_AGGREGATIONS` and :data:`CONFIRMED_AGGREGATIONS` rows (the
    student rows only where the fold's ``hard-q3`` student exists). deid.pl's spans pass through
    the ensemble's whole-word snapping like every member's.
    """
    from dphub.ensemble.aggregate import aggregate
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.ensemble.members import FixedMember, ModelMember
    from dphub.evaluate import evaluate_spans
    from dphub.owner.distill import train_local

    table = AGGREGATIONS + (DEIDPL_AGGREGATIONS + CONFIRMED_AGGREGATIONS
                            if deidpl is not None else [])
    results: dict[str, list[list[dict[str, Any]]]] = {row: [] for row, _, _ in table}
    for f, held in enumerate(folds):
        train = [n for n in notes if n.patient_id not in held]
        test = [n for n in notes if n.patient_id in held]
        model_dir = out / f"local-fold{f}"
        if not (model_dir / "model.safetensors").is_file():
            train_local(train, opts(model_dir))
        slots = [*(Slot(ModelMember.load(work / "models" / s, s)) for s in SITES),
                 Slot(ModelMember.load(model_dir, "owner")), Slot(rules)]
        if deidpl is not None:
            student_dir = out / f"hard-q3-fold{f}"
            own = [("owner", model_dir)] + (
                [("student", student_dir)] if (student_dir / "model.safetensors").is_file() else [])
            slots += [Slot(FixedMember("deid.pl", deidpl))]
            for name, path in own:
                slots += [Slot(ModelMember.load(path, f"{name}@{t:g}"), t)
                          for t in CONFIRM_THRESHOLDS]
                if name == "student":
                    slots.append(Slot(ModelMember.load(path, name)))
        per_note = Ensemble(slots, "any").member_spans(test)
        present = {s.name for s in slots}
        for row, names, rule in table:
            if not present.issuperset(names):
                continue  # a student row without the fold's student
            pred = {n.id: [m.to_span() for m in aggregate({k: spans[k] for k in names}, rule)]
                    for n, spans in zip(test, per_note, strict=True)}
            results[row].append([evaluate_spans(test, pred).headline()])
    print(f"\n| {'members, aggregation':<56} | {'P / R / F1':<18} |")
    print(f"|{'-' * 58}|{'-' * 20}|")
    for row, _, _ in table:
        if results[row]:
            print(f"| {row:<56} | {_mean(results[row], 0):<18} |", flush=True)


if __name__ == "__main__":
    main()
