"""Which numbers the inverse rule lets back (issue 26): digit tokens by PHI, release and shape.

Usage (from the repository root; prints counts and token *shapes* only, never note text)::

    python benchmarks/number_contexts.py /work/shared/corpora/physionet-deid-dev              # inner-train
    python benchmarks/number_contexts.py /work/shared/corpora/physionet-deid-dev --part inner-dev

Over the word tokens (:data:`dphub.ensemble.words.WORD_RE`) that contain a digit, counts the
non-PHI and the PHI ones (a token is PHI when a gold span overlaps it), whether
:func:`dphub.ensemble.measures.measurement_ranges` releases them, and for the released PHI ones
the category, split into those the rule member flags (they stay hidden under the inverse rule)
and the *leaks* (released, and no rule flags them). ``ceiling_letters_all_released``: the
token-binary recall, precision and non-PHI tokens kept of the inverse rule if every word without a
digit came back (``inverse:1,1``, given a model that gives every word P < 1) and only the rule
member's flags and the numbers hid words: the precision the numbers allow. ``--shapes N`` also prints the N most
frequent shapes (digits ``d``, letters ``a``, the token with one character of context either
side) of the non-PHI digit tokens that are not released (where the measurement contexts miss),
and the category and shape of every PHI digit token released (what to guard against).

Parts: ``inner-train`` (tune on it) and ``inner-dev`` (check once) of the dev split's 95 training
patients (``train_dev_corpus._split(0, inner=True)``). The 36 held-out test patients are never read.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_dev_corpus import _split  # noqa: E402

from dphub.ensemble.measures import measurement_ranges  # noqa: E402
from dphub.ensemble.words import WORD_RE  # noqa: E402
from dphub.labels import category_of  # noqa: E402
from dphub.rules.engine import RULES_DEFAULT, RuleMember, RuleOptions  # noqa: E402


def shape(s: str) -> str:
    """A token's shape: digits ``d``, letters ``a`` (runs of more than 3 letters as ``a+``)."""
    out = re.sub(r"\d", "d", re.sub(r"[^\W\d_]", "a", s))
    return re.sub(r"a{4,}", "a+", out)


def _inside(ranges: list[tuple[int, int]], starts: list[int], a: int, b: int) -> bool:
    k = bisect.bisect_right(starts, a) - 1
    return k >= 0 and ranges[k][0] <= a and b <= ranges[k][1]


def count(notes, n_shapes: int = 0) -> dict:
    rules = RuleMember(RULES_DEFAULT, RuleOptions())
    c: Counter = Counter()
    released_phi: Counter = Counter()
    leaked_phi: Counter = Counter()
    phi_digits: Counter = Counter()
    missed: Counter = Counter()
    phi_shapes: Counter = Counter()
    for note in notes:
        text = note.text
        ranges = measurement_ranges(text)
        starts = [a for a, _ in ranges]
        gold = sorted((s.start, s.end, category_of(s.label)) for s in note.spans)
        g_starts = [a for a, _, _ in gold]
        flags = sorted((s.start, s.end) for s in rules.spans(text))
        f_starts = [a for a, _ in flags]
        for m in WORD_RE.finditer(text):
            a, b = m.start(), m.end()
            k = bisect.bisect_left(g_starts, b) - 1
            cat = None
            while k >= 0 and gold[k][0] < b:
                if gold[k][1] > a:
                    cat = gold[k][2]
                    break
                k -= 1
            j = bisect.bisect_left(f_starts, b) - 1
            flagged = False
            while j >= 0 and flags[j][0] < b:
                if flags[j][1] > a:
                    flagged = True
                    break
                j -= 1
            digit = any(ch.isdigit() for ch in m.group())
            rel = _inside(ranges, starts, a, b) if digit else True
            # the ceiling: every letter word released, numbers as measures.py says, flags hide
            kept = rel and not flagged
            c["ceil_hidden"] += not kept
            c["ceil_hidden_phi"] += (not kept) and cat is not None
            c["ceil_phi"] += cat is not None
            c["ceil_non_phi_kept"] += kept and cat is None
            if not digit:
                c["letter_tokens"] += 1
                continue
            if cat is None:
                c["non_phi"] += 1
                c["non_phi_released"] += rel
                c["non_phi_released_not_flagged"] += kept
                if not rel and n_shapes:
                    missed[shape(text[max(0, a - 4):a] + "|" + m.group() + "|" + text[b:b + 4])] += 1
                continue
            c["phi"] += 1
            phi_digits[cat] += 1
            if rel:
                released_phi[cat] += 1
                if n_shapes:
                    phi_shapes[cat + " " + shape(text[max(0, a - 4):a] + "|" + m.group() + "|"
                                                 + text[b:b + 4])] += 1
                if not flagged:
                    leaked_phi[cat] += 1
    non_phi = c["non_phi"] + c["letter_tokens"] - (c["ceil_phi"] - c["phi"])
    out = {
        "digit_tokens_non_phi": c["non_phi"],
        "digit_share_of_non_phi_tokens": round(c["non_phi"] / max(1, non_phi), 4),
        "non_phi_released": c["non_phi_released"],
        "non_phi_released_pct": round(100 * c["non_phi_released"] / max(1, c["non_phi"]), 2),
        "non_phi_released_not_flagged_pct": round(100 * c["non_phi_released_not_flagged"]
                                                  / max(1, c["non_phi"]), 2),
        "digit_tokens_phi": dict(phi_digits.most_common()),
        "phi_released": dict(released_phi.most_common()),
        "phi_released_not_flagged_by_rules": dict(leaked_phi.most_common()),
    }
    out["ceiling_letters_all_released"] = {
        "token_recall": round(c["ceil_hidden_phi"] / max(1, c["ceil_phi"]), 4),
        "token_precision": round(c["ceil_hidden_phi"] / max(1, c["ceil_hidden"]), 4),
        "non_phi_tokens_kept": round(c["ceil_non_phi_kept"] / max(1, non_phi), 4),
    }
    if n_shapes:
        out["non_phi_missed_shapes"] = missed.most_common(n_shapes)
        out["phi_released_shapes"] = phi_shapes.most_common()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--part", choices=("inner-train", "inner-dev"), default="inner-train")
    ap.add_argument("--shapes", type=int, default=0, metavar="N",
                    help="print the N most frequent shapes of the non-PHI numbers not released")
    a = ap.parse_args(argv)
    train, dev = _split(0, a.corpus, inner=True)
    notes = train if a.part == "inner-train" else dev
    print(json.dumps({"part": a.part, "notes": len(notes),
                      "patients": len({n.effective_patient_id for n in notes}),
                      **count(notes, a.shapes)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
