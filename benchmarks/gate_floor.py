"""The probe's public floor (issue 53 item 4): the public warm starts' figures, and who passes.

    python benchmarks/gate_floor.py                      # recompute the shipped figures
    python benchmarks/gate_floor.py --models m1 m2       # and probe trained models against them
    python benchmarks/gate_floor.py --attacks            # and the emulated attacks on each

For each public warm start of :data:`dphub.card.probe_floor.PUBLIC_WARM_STARTS` (``dphub train``'s
default, rule features on, and ``--no-rule-features``) it builds the warm start (cached; minutes
the first time), runs the probe on it and prints its recall per category and the share of
non-PHI words it leaves unflagged; it exits 1 when they differ from the shipped figures by more
than 0.005 (another torch, Faker or dphub gives other notes or other weights: measure again).

``--models`` probes trained model directories (honest DP models: ``dphub train``, ``federate``)
and prints, per model, its figures, the old gate's verdict (half its own recall, at least 0.02)
and the new one. ``--attacks`` edits each warm start (and each ``--models`` model) in memory:

* ``push-o`` at several strengths: every bias, start/end and into-tag transition and rule weight
  moved towards "O" and away from each PHI tag, the direction of the rogue site of
  ``benchmarks/federated_dev_corpus.py --what rogue`` (what a federated average with a rogue
  update does to the head, at the strength that reaches it);
* ``only-<CATEGORY>``: a model that flags only the rule member's hits of one category (head's
  own emissions cut, O favoured, one rule feature to PHI);
* ``everything``: a model that flags every word (O's emission far down).

Prints one JSON object per line; the probe's wall time is given for each model.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch


def _figures(tagger: Any) -> dict[str, Any]:
    from dphub.card.probe import run_category_probe, run_probe

    t0 = time.perf_counter()
    r = run_probe(tagger)
    t1 = time.perf_counter()
    sparse = run_category_probe(tagger)
    return {"recall": round(r.recall, 4), "kept": round(r.kept, 4),
            "per_category": {c: round(v, 4) for c, v in r.category_recall().items()},
            "counts": r.per_category, "probe_s": round(t1 - t0, 2),
            "category_probe": {c: round(h / n, 4) for c, (h, n) in sparse.items()
                               if c in ("AGE", "PROFESSION") and n},
            "category_counts": {c: sparse[c] for c in ("AGE", "PROFESSION") if c in sparse},
            "category_probe_s": round(time.perf_counter() - t1, 2), "_result": r}


def _verdicts(model: Any, meta: dict[str, Any], fig: dict[str, Any],
              tagger: Any = None) -> dict[str, Any]:
    from dphub.card.probe import floor_for
    from dphub.hub.gate_probe import public_floor_problems

    r = fig.pop("_result")
    old_ok = r.recall >= floor_for(r.recall)  # a card written from this model: its own floor
    new = public_floor_problems(model, meta, r, tagger=tagger)
    return {**fig, "old_gate": "pass" if old_ok else "refused",
            "new_gate": "pass" if not new and old_ok else "refused",
            "why": new[0].split(": ", 1)[-1] if new else None}


def _push_o(model: Any, strength: float) -> None:
    """The rogue's direction (federated_dev_corpus.py): O up, every PHI tag down."""
    o = model.tags.index("O")
    sign = -torch.ones(len(model.tags))
    sign[o] = 1.0
    with torch.no_grad():
        model.classifier.bias += strength * sign
        if getattr(model, "crf", None) is not None:
            model.crf.start_transitions += strength * sign
            model.crf.end_transitions += strength * sign
            model.crf.transitions += strength * sign.expand(len(model.tags), -1)
        if model.rule_proj is not None:
            model.rule_proj.weight += strength * sign[:, None]


CATEGORIES = ("name", "date", "age", "contact", "id", "location", "profession")


def _flag(model: Any, categories: list[str]) -> None:
    """Flag only the rule member's hits of ``categories``."""
    from dphub.rule_features import FEATURE_NAMES

    o = model.tags.index("O")
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.zero_()
        model.classifier.bias[o] = 10.0
        model.rule_proj.weight.zero_()
        model.rule_proj.bias.zero_()
        for c in categories:
            model.rule_proj.weight[:, FEATURE_NAMES.index(f"rule_{c.lower()}")] = 20.0
        model.rule_proj.weight[o, :] = 0.0


def _only(model: Any, category: str) -> None:
    """Flag only the rule member's hits of ``category``."""
    _flag(model, [category])


def _all_but(model: Any, category: str) -> None:
    """Flag the rule member's hits of every category but ``category`` (a model that drops one
    category and keeps the rest)."""
    _flag(model, [c for c in CATEGORIES if c != category.lower()])


def _everything(model: Any) -> None:
    with torch.no_grad():
        model.classifier.bias[model.tags.index("O")] -= 1e3


def _attacks(tagger: Any, meta: dict[str, Any], name: str) -> None:
    from dphub.card.probe_floor import MIN_CATEGORY_TOKENS

    base = tagger.model
    cats = [c for c, (_, n) in _figures(tagger)["counts"].items() if n >= MIN_CATEGORY_TOKENS]
    edits: list[tuple[str, Any]] = [(f"push-o {s:g}", lambda m, s=s: _push_o(m, s))
                                    for s in (0.1, 0.2, 0.3, 0.4, 0.5, 1.0)]
    if base.rule_proj is not None:
        edits += [(f"only-{c}", lambda m, c=c: _only(m, c)) for c in cats]
        edits += [(f"all-but-{c}", lambda m, c=c: _all_but(m, c))
                  for c in ("NONE", "AGE", "PROFESSION")]
    edits.append(("everything", _everything))
    for label, edit in edits:
        tagger.model = copy.deepcopy(base)
        edit(tagger.model)
        tagger.model.eval()
        fig = _figures(tagger)
        print(json.dumps({"model": name, "attack": label,
                          **_verdicts(tagger.model, meta, fig, tagger)}), flush=True)
    tagger.model = base


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=[], type=Path)
    ap.add_argument("--attacks", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from dphub.card import load_card
    from dphub.card.probe_floor import PUBLIC_WARM_STARTS
    from dphub.encoders import DEFAULT_BASE_MODEL_ID
    from dphub.tagger import Tagger
    from dphub.train.options import TrainOptions
    from dphub.train.sources import warm_start_dir

    stale = False
    for rule_features in (True, False):
        wdir, _ = warm_start_dir(TrainOptions(rule_features=rule_features))
        tagger = Tagger.load(wdir)
        meta = {"base_model": DEFAULT_BASE_MODEL_ID}
        fig = _figures(tagger)
        fig.pop("_result")
        cfg = tagger.model.encoder.config
        shipped = next((e for e in PUBLIC_WARM_STARTS if e.matches(
            DEFAULT_BASE_MODEL_ID, tagger.model.schema, tagger.model.head, rule_features,
            cfg.hidden_size, cfg.num_hidden_layers)), None)
        same = shipped is not None and abs(shipped.kept - fig["kept"]) <= 0.005 and all(
            abs(shipped.recall.get(c, -1) - v) <= 0.005 for c, v in fig["per_category"].items()
        ) and all(abs(shipped.sparse_recall.get(c, -1) - v) <= 0.005
                  for c, v in fig["category_probe"].items())
        stale |= not same
        name = f"warm-start rule_features={rule_features}"
        print(json.dumps({"model": name, "hidden_size": cfg.hidden_size,
                          "num_hidden_layers": cfg.num_hidden_layers, **fig,
                          "matches_shipped": same}), flush=True)
        if args.attacks:
            _attacks(tagger, meta, name)
    for mdir in args.models:
        tagger = Tagger.load(mdir)
        meta = load_card(mdir).meta
        fig = _figures(tagger)
        print(json.dumps({"model": str(mdir), "card_floor": meta.get("gate_probe"),
                          **_verdicts(tagger.model, meta, fig, tagger)}), flush=True)
        if args.attacks:
            _attacks(tagger, meta, str(mdir))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
