"""How much of a corpus the safe vocabulary keeps, and how much PHI it would let back in.

Usage (from the repository root; real notes stay on this machine, nothing prints note text)::

    python benchmarks/safe_vocab_coverage.py ../shared/corpora/physionet-deid-dev            # inner-train
    python benchmarks/safe_vocab_coverage.py CORPUS --part inner-dev
    python benchmarks/safe_vocab_coverage.py CORPUS --vocab a.txt --vocab b.txt   # one row each

Word tokens are the token-binary metric's (:data:`dphub.evaluate.TOKEN_RE`, letter/digit runs,
the same words the ensemble snaps to), compared lower-cased and NFC-normalised. A token is PHI
when a gold span overlaps it (its category is that span's). Printed, as one JSON object per
vocabulary (numbers only, never a word):

- ``non_phi_alpha_in_vocab``: share of non-PHI tokens made only of letters that are in the
  vocabulary; ``non_phi_numeric``: share of non-PHI tokens with a digit (never in the vocabulary:
  numbers come back only through measurement contexts); ``non_phi_in_vocab``: share of all
  non-PHI tokens in the vocabulary (the ceiling of ``non_phi_tokens_kept`` for the inverse rule
  before measurement contexts);
- ``phi_in_vocab``: share of PHI tokens in the vocabulary (each one is a leak unless a member
  flags it), overall and ``by_category`` as ``[in_vocab, total]`` counts.

Parts (tuning never looks at the 36 held-out test patients): ``inner-train`` / ``inner-dev`` =
80/20 of the 95 training patients (seed 1), ``train`` = the 95 training patients.
"""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_dev_corpus import CORPUS, _split  # noqa: E402

from dphub.evaluate import TOKEN_RE  # noqa: E402
from dphub.labels import category_of  # noqa: E402

#: the shipped vocabulary (the default ``--vocab``)
SHIPPED = Path(__file__).resolve().parents[1] / "dphub" / "resources" / "safe_vocab" / "safe_words.txt"


def read_vocab(path: Path) -> frozenset[str]:
    """The words of a vocabulary file (``#`` lines are its header)."""
    words = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            words.add(line)
    return frozenset(words)


def token_counts(notes) -> Counter:
    """``(word, category or None) -> count`` over every word token of ``notes``."""
    counts: Counter = Counter()
    for note in notes:
        text = note.text
        spans = sorted((s.start, s.end, category_of(s.label)) for s in note.spans)
        for m in TOKEN_RE.finditer(text):
            cat = None
            for s, e, c in spans:
                if s >= m.end():
                    break
                if e > m.start():
                    cat = c
                    break
            word = unicodedata.normalize("NFC", m.group()).lower()
            counts[(word, cat)] += 1
    return counts


def coverage(counts: Counter, vocab: frozenset[str]) -> dict:
    """The figures described in the module docstring, for one vocabulary."""
    alpha = [0, 0]
    numeric = 0
    non_phi = 0
    phi = [0, 0]
    by_cat: dict[str, list[int]] = {}
    for (word, cat), n in counts.items():
        hit = word in vocab
        if cat is None:
            non_phi += n
            if any(ch.isdigit() for ch in word):
                numeric += n
            else:
                alpha[1] += n
                alpha[0] += n * hit
        else:
            phi[1] += n
            phi[0] += n * hit
            row = by_cat.setdefault(cat, [0, 0])
            row[0] += n * hit
            row[1] += n
    return {
        "vocab_words": len(vocab),
        "non_phi_tokens": non_phi,
        "non_phi_alpha_in_vocab": round(alpha[0] / max(alpha[1], 1), 4),
        "non_phi_numeric": round(numeric / max(non_phi, 1), 4),
        "non_phi_in_vocab": round(alpha[0] / max(non_phi, 1), 4),
        "phi_tokens": phi[1],
        "phi_in_vocab": round(phi[0] / max(phi[1], 1), 4),
        "by_category": dict(sorted(by_cat.items())),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus", nargs="?", type=Path, default=CORPUS)
    ap.add_argument("--vocab", type=Path, action="append",
                    help="vocabulary file (repeat for several rows; default: the shipped one)")
    ap.add_argument("--part", choices=("inner-train", "inner-dev", "train"), default="inner-train")
    args = ap.parse_args(argv)
    if args.part == "train":
        notes, _test = _split(0, args.corpus)  # the held-out test part is never read further
    else:
        inner_train, inner_dev = _split(0, args.corpus, inner=True)
        notes = inner_train if args.part == "inner-train" else inner_dev
    counts = token_counts(notes)
    for path in args.vocab or [SHIPPED]:
        row = {"vocab": path.name, "part": args.part, "notes": len(notes)}
        row.update(coverage(counts, read_vocab(path)))
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
