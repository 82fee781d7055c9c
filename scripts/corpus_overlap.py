"""List text of a private development corpus that appears in the repository's code and docs.

The project rule: no text from the development corpus in code, docs, docstrings or tests (its
surrogate PHI and its phrasing would otherwise travel with every copy of the package). Run it
before committing examples written while looking at real notes::

    python scripts/corpus_overlap.py ../shared/corpora/physionet-deid-dev

It reports (a) every annotated PHI phrase of 6+ characters that occurs in a tracked text file,
and (b) every run of 4 consecutive corpus words (with at least one word of 4+ letters) that
occurs verbatim, case-insensitively. Common words make (a) noisy ("General", "Memorial"): read
the list, don't just count it. Prints file, match and count only; exits 1 when (b) finds
anything it does not accept.

What (b) accepts, listed under its own heading and not failing the check, is text that is not
the corpus's own: the PhysioNet record delimiters (``START_OF_RECORD=1||||1||||``, which the
format reader and its tests must spell), and the short generic phrases in :data:`ACCEPTED` —
English idioms and standard clinical shorthand that any note or docstring may contain. The
list is closed: a new match is a failure until someone reads it, rewords it (the synthetic
note templates in ``dphub/synth/`` were reworded so), or adds it here with its reason.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'/.-]*")

#: the PhysioNet format's record delimiters, as 4-word runs (``start of record 1``, ``of record 7
#: 2``, ``... end of record``): file syntax, not note text
_DELIMITER = re.compile(r"^(?:start )?of record(?: \d+)+$|(?:^| )end of record(?: |$)")

#: generic 4-word runs accepted, with why (not the corpus's own phrasing)
ACCEPTED: dict[str, str] = {
    "as long as the": "English idiom (docstrings)",
    "the rest of the": "English idiom (docstrings, docs)",
    "not be able to": "English idiom (docstrings)",
    "is worse than the": "English idiom (docs)",
    "not be expected to": "English idiom (docs)",
    "in the middle of": "English idiom (docs)",
    "that it is not": "English idiom (docstrings)",
    "most of the time": "English idiom (tests)",
    "which is what the": "English idiom (tests)",
    "abd soft nt nd": "standard exam shorthand (abdomen soft, non-tender, non-distended)",
    "pt seen by dr.": "generic clinical phrasing around a test's planted name",
    "general hospital medical center": "adjacent items of an institution-suffix word pool",
}


def accepted(gram: str) -> bool:
    """A 4-word run that is file syntax or a listed generic phrase (see the module docstring)."""
    return gram in ACCEPTED or _DELIMITER.search(gram) is not None


def _tracked_texts(root: Path) -> dict[str, str]:
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                           check=True).stdout.split()
    keep = (".py", ".md", ".sh", ".toml", ".json", ".txt", ".j2")
    out = {}
    for f in files:
        if f.endswith(keep) and "/resources/" not in f and not f.startswith("scripts/corpus"):
            out[f] = (root / f).read_text(encoding="utf-8", errors="replace")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", type=Path, help="directory with id.text and id-phi.phrase")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args()
    texts = _tracked_texts(args.root)
    lowered = {f: t.lower() for f, t in texts.items()}

    phrases = set()
    for line in (args.corpus / "id-phi.phrase").read_text(errors="replace").splitlines():
        parts = line.split(" ", 5)
        if len(parts) == 6 and len(parts[5].strip()) >= 6 and not parts[5].strip().isdigit():
            phrases.add(parts[5].strip())
    hits: Counter[tuple[str, str]] = Counter()
    for p in phrases:
        pat = re.compile(r"(?<![A-Za-z0-9])" + re.escape(p) + r"(?![A-Za-z0-9])", re.I)
        for f, t in texts.items():
            n = len(pat.findall(t))
            if n:
                hits[(f, p)] += n
    print("# annotated PHI phrases found in tracked files (review: common words are noise)")
    for (f, p), n in sorted(hits.items()):
        print(f"{f}\t{p!r}\t{n}")

    corpus = (args.corpus / "id.text").read_text(errors="replace").lower()
    words = _WORD.findall(corpus)
    grams = set()
    for i in range(len(words) - 3):
        g = words[i:i + 4]
        if any(len(w) >= 4 and w.isalpha() for w in g):
            grams.add(" ".join(g))
    found: Counter[tuple[str, str]] = Counter()
    for f, t in lowered.items():
        tw = _WORD.findall(t)
        for i in range(len(tw) - 3):
            g = " ".join(tw[i:i + 4])
            if g in grams:
                found[(f, g)] += 1
    failing = {k: n for k, n in found.items() if not accepted(k[1])}
    print("# 4-word runs of corpus text found verbatim in tracked files")
    for (f, g), n in sorted(failing.items()):
        print(f"{f}\t{g!r}\t{n}")
    print("# accepted 4-word runs (record delimiters, generic phrases: see ACCEPTED)")
    for (f, g), n in sorted(found.items()):
        if (f, g) not in failing:
            print(f"{f}\t{g!r}\t{n}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
