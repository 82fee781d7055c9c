"""deid.pl and Presidio as ensemble members, beside ``rules:default``, on the dev corpus.

Usage (from the repository root; real data stays on this machine, nothing prints note text)::

    nice -n 5 python benchmarks/peer_members.py --deidpl ../shared/peers/physionet-deid --threads 1
    ... --no-presidio            # without the presidio extra
    ... --tune-presidio          # also a Presidio member restricted to the entity types chosen
                                 # on an inner split of the training patients

Scores, token-binary, on the 36 held-out test patients of
``split_notes(notes, [0.8, 0.2], by="patient", seed=0)``: each member alone and the ``any``
unions rules+deid.pl, rules+Presidio (and all three). Every member's spans go through the
ensemble's own path (:meth:`dphub.ensemble.Ensemble.member_spans`: whole-word snapping), so the
figures are what ``dphub ensemble evaluate`` prints. ``--tune-presidio`` chooses which Presidio
entity types to keep (backward elimination, maximising token F1 of rules+Presidio) on an inner
patient split of the 95 training patients (``split_notes(train, [0.8, 0.2], by="patient",
seed=1)``, its 20 % part) and adds that member (``presidio-tuned``, the manifest option
``entities``) to the test rows. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import combinations
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpora" / "physionet-deid-dev"


def _member_spans(slots, notes, chunk: int = 64) -> tuple[list[dict], dict[str, float]]:
    """Each member's snapped spans per note, and each member's seconds (run one at a time)."""
    from dphub.ensemble import Ensemble

    per_note: list[dict] = [{} for _ in notes]
    seconds: dict[str, float] = {}
    for slot in slots:
        ens = Ensemble([slot])
        t0 = time.monotonic()
        for i in range(0, len(notes), chunk):
            for j, spans in enumerate(ens.member_spans(notes[i : i + chunk])):
                per_note[i + j].update(spans)
        seconds[slot.name] = round(time.monotonic() - t0, 1)
    return per_note, seconds


def _score(notes, per_note, names, threshold: dict[str, float | None] | None = None, *,
           counts: bool = False) -> dict:
    from dphub.ensemble.aggregate import AggregateRule, aggregate
    from dphub.evaluate import evaluate_spans

    rule = AggregateRule.parse("any")
    threshold = threshold or {}
    pred = {}
    for n, spans in zip(notes, per_note, strict=True):
        chosen = {}
        for m in names:
            t = threshold.get(m)
            chosen[m] = [s for s in spans[m] if t is None or (s.score or 0.0) >= t]
        pred[n.id] = [x.to_span() for x in aggregate(chosen, rule)]
    res = evaluate_spans(notes, pred)
    h = {k: round(v, 4) for k, v in res.headline().items()}
    if counts:
        h.update({k: int(res.token[k]) for k in ("tp", "fp", "fn")})
    return h


def _tune_presidio(train, slots, out: dict) -> list[str]:
    """Presidio entity types kept: backward elimination on the inner split, maximising F1 of
    rules+Presidio (one Presidio pass; subsets are filters of its raw results)."""
    from dphub.ensemble.words import snap_to_words
    from dphub.splits import split_notes

    _, inner = split_notes(train, [0.8, 0.2], by="patient", seed=1)
    rules = next(s for s in slots if s.name == "rules")
    presidio = next(s.member for s in slots if s.name == "presidio")
    rule_spans, _ = _member_spans([rules], inner)
    raw = presidio.results(inner)

    def score(types: set[str]) -> dict:
        per_note = [
            {"rules": r["rules"],
             "presidio": snap_to_words(n.text, presidio.spans_from(n, found, None, types))}
            for n, r, found in zip(inner, rule_spans, raw, strict=True)
        ]
        return _score(inner, per_note, ["rules", "presidio"], counts=True)

    def f1(types: set[str]) -> float:
        return score(types)["f1"]

    kept = {e for found in raw for e, *_ in found}
    base = score(set())
    # what each entity type alone adds to the rules: true and false PHI tokens
    added = {e: {"tp": (x := score({e}))["tp"] - base["tp"], "fp": x["fp"] - base["fp"]}
             for e in sorted(kept)}
    steps = [{"kept": sorted(kept), "f1": f1(kept)}]
    while kept:
        best = max(sorted(kept), key=lambda e: f1(kept - {e}))
        after = f1(kept - {best})
        if after <= steps[-1]["f1"]:
            break
        kept = kept - {best}
        steps.append({"dropped": best, "f1": after})
    out["presidio_tuning"] = {"inner_notes": len(inner),
                              "inner_patients": len({n.effective_patient_id for n in inner}),
                              "criterion": "token F1 of rules+presidio (backward elimination)",
                              "rules_alone": base, "added_to_rules_by_type": added,
                              "steps": steps, "chosen_entities": sorted(kept)}
    return sorted(kept)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deidpl", type=Path, help="deid.pl directory (omit: no deid.pl rows)")
    ap.add_argument("--renumber-patients", action="store_true",
                    help="deid.pl without the corpus's PID -> patient-name list")
    ap.add_argument("--no-presidio", action="store_true")
    ap.add_argument("--tune-presidio", action="store_true")
    ap.add_argument("--min-age", type=int, default=90, help="rules:default min_age (docs: 90)")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--limit", type=int, default=0, help="first N test notes only (smoke runs)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from dphub import formats
    from dphub.ensemble import Slot
    from dphub.rules.engine import RuleMember, RuleOptions
    from dphub.splits import split_notes

    notes = list(formats.read(args.corpus, "physionet"))
    train, test = split_notes(notes, [0.8, 0.2], by="patient", seed=0)
    if args.limit:
        test = test[: args.limit]
    slots = [Slot(RuleMember("rules", RuleOptions(min_age=args.min_age)), None, 0.0)]
    if args.deidpl:
        from dphub.ensemble.peers import DeidPlMember

        slots.append(Slot(DeidPlMember("deid.pl", args.deidpl,
                                       renumber_patients=args.renumber_patients)))
    if not args.no_presidio:
        from dphub.ensemble.peers import PresidioMember

        slots.append(Slot(PresidioMember("presidio")))
    for s in slots:  # load models before timing (Presidio's spaCy load is ~15 s)
        if hasattr(s.member, "analyzer"):
            _ = s.member.analyzer
    names = [s.name for s in slots]
    out: dict = {"test_notes": len(test),
                 "test_patients": len({n.effective_patient_id for n in test}),
                 "rules_min_age": args.min_age}

    if args.tune_presidio and "presidio" in names:
        entities = _tune_presidio(train, slots, out)
        shared = next(s.member for s in slots if s.name == "presidio").analyzer
        slots.append(Slot(PresidioMember("presidio-tuned", entities=entities, analyzer=shared)))
        names.append("presidio-tuned")

    per_note, seconds = _member_spans(slots, test)
    out["seconds"] = seconds
    out["notes_per_second"] = {k: round(len(test) / v, 1) if v else None
                               for k, v in seconds.items()}
    rows = {}
    for k in range(1, len(names) + 1):
        for combo in combinations(names, k):
            if not ("presidio" in combo and "presidio-tuned" in combo):
                rows["+".join(combo)] = _score(test, per_note, list(combo))
    out["rows"] = rows
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
