"""Signs of a name (issue 36 item 2): which PHI words a model is wrongly sure of, and what the
inverse rule's signs of a name catch, on cross-fitted tuning parts of the PhysioNet dev corpus.

Usage (from the repository root; real data stays on this machine, nothing prints note text)::

    python benchmarks/train_dev_corpus.py --out /tmp/in --inner --target-epsilon 8
    python benchmarks/train_dev_corpus.py --out /tmp/f0 --fold 0 --target-epsilon 8
    python benchmarks/train_dev_corpus.py --out /tmp/f1 --fold 1 --target-epsilon 8
    python benchmarks/name_signs.py --part inner=/tmp/in --part fold0=/tmp/f0 --part fold1=/tmp/f1

Each ``--part NAME=MODEL`` scores one tuning part (``inner``, ``fold0``, ``fold1``:
``train_dev_corpus._split``) with the model that did not see it; together the three cover the 95
training patients. The held-out test patients are never read. Prints JSON lines, numbers only:

* per part and pooled: the PHI letter words that nothing vouches for and no member flags, with
  the model's P(PHI) below ``--sure`` (the words a model would let back), and how many of them
  show a sign of a name (:func:`dphub.ensemble.inverse.name_signs`); the share of non-PHI tokens
  that are unvouched words with such a sign (what the sign costs);
* for ``--rule`` (default ``inverse:0.001,0.01,0.002``): token recall and non-PHI kept on each
  part and pooled, with the shipped signs and with two candidate signs added: a word in the
  rule member's place lists, a word flagged or signed elsewhere in the same note.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from recall_first import _tables  # noqa: E402
from train_dev_corpus import CORPUS, _split  # noqa: E402

from dphub.ensemble.core import Ensemble, Slot  # noqa: E402
from dphub.ensemble.inverse import InverseRule, WordTable  # noqa: E402
from dphub.ensemble.inverse_calibrate import _gold_flags  # noqa: E402
from dphub.ensemble.members import ModelMember  # noqa: E402
from dphub.ensemble.words import WORD_RE  # noqa: E402
from dphub.notes import Note  # noqa: E402
from dphub.rules.engine import RULES_DEFAULT, RuleMember, RuleOptions  # noqa: E402
from dphub.rules.lexicon import dictionaries  # noqa: E402
from dphub.safe_vocab import load, normalize_word  # noqa: E402


def _extra_signs(notes: list[Note], tables: list[WordTable]) -> dict[str, list[np.ndarray]]:
    """Per note, the two candidate signs: a word in the place lists, a word flagged or signed
    elsewhere in the same note."""
    d = dictionaries()
    places = set(d.place_words) | set(d.states) | {c for c in (*d.cities, *d.countries)
                                                   if " " not in c}
    out: dict[str, list[np.ndarray]] = {"+place": [], "+marked": []}
    for note, t in zip(notes, tables, strict=True):
        words = [normalize_word(m.group()) for m in WORD_RE.finditer(note.text)]
        marked = {w for w, f, s in zip(words, t.flagged, t.named, strict=True) if f or s}
        out["+place"].append(np.array([w in places for w in words], dtype=bool) & t.letters)
        out["+marked"].append(np.array([w in marked for w in words], dtype=bool))
    return out


def _report(name: str, notes: list[Note], tables: list[WordTable], rule: InverseRule,
            sure: float) -> None:
    gold = [_gold_flags(n, t) for n, t in zip(notes, tables, strict=True)]
    phi = np.concatenate(gold)
    non = ~phi
    cat = np.concatenate
    unvouched = cat([t.letters & ~t.safe & ~t.flagged & ~t.blocked for t in tables])
    signed = cat([t.named for t in tables])
    p = cat([t.p for t in tables])
    wrongly_sure = phi & unvouched & (p < sure)
    row: dict = {
        "part": name, "phi_tokens": int(phi.sum()), "non_phi_tokens": int(non.sum()),
        "phi_unvouched_sure": int(wrongly_sure.sum()),
        "of_which_signed": int((wrongly_sure & signed).sum()),
        "non_phi_unvouched_signed_share": round(float((non & unvouched & signed).sum())
                                                / max(1, int(non.sum())), 4),
        "rule": str(rule),
    }
    extra = _extra_signs(notes, tables)
    for label, more in (("shipped", None), ("+place", extra["+place"]),
                        ("+marked", extra["+marked"])):
        # the product's decision, with the candidate signs added to the table's own
        keep = cat([(t if more is None else replace(t, named=t.named | more[i]))
                    .kept(rule.low, rule.high, rule.named, rule.sure)
                    for i, t in enumerate(tables)])
        row[label] = {"token_recall": round(1 - float((keep & phi).sum()) / max(1, int(phi.sum())),
                                            4),
                      "non_phi_kept": round(float((keep & non).sum()) / max(1, int(non.sum())),
                                            4)}
    print(json.dumps(row))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", action="append", required=True,
                    help="NAME=MODEL: inner, fold0 or fold1 and the model that did not see it")
    ap.add_argument("--rule", default="inverse:0.001,0.01,0.002")
    ap.add_argument("--sure", type=float, default=0.05,
                    help="P(PHI) below which a model counts as sure a word is not PHI")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    a = ap.parse_args(argv)
    rule = InverseRule.parse(a.rule)
    vocab = load()
    rules = Slot(RuleMember(RULES_DEFAULT, RuleOptions()), None, 0.0)
    pooled: tuple[list[Note], list[WordTable]] = ([], [])
    for spec in a.part:
        name, _, model = spec.partition("=")
        if name not in ("inner", "fold0", "fold1") or not model:
            ap.error(f"--part {spec!r}: use inner=MODEL, fold0=MODEL or fold1=MODEL")
        fold = int(name[4:]) if name.startswith("fold") else None
        _, notes = _split(0, a.corpus, inner=name == "inner", fold=fold)
        member = Slot(ModelMember.load(Path(model), Path(model).name), None)
        tables = _tables(Ensemble([rules, member], rule, safe_vocab=vocab), notes, rule)
        _report(name, notes, tables, rule, a.sure)
        pooled[0].extend(notes)
        pooled[1].extend(tables)
    if len(a.part) > 1:
        _report("pooled", *pooled, rule, a.sure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
