"""The safe vocabulary: words the inverse rule may let back into a de-identified note.

The inverse rule (:mod:`dphub.ensemble.inverse`) hides every word unless it is *known to be
safe*; a word is known safe only if it is in this vocabulary (and no member flags it, and every
model is confident it is no PHI). The shipped list (``dphub/resources/safe_vocab/safe_words.txt``,
built offline from public word lists, never from notes) has ``#`` header lines saying where it
came from, then one lower-case NFC word per line, letters only (a line that is not one run of
letters, such as ``x-ray``, could never match a word of a note and is skipped); numbers are
never safe words (a number comes back only in a measurement context,
:mod:`dphub.ensemble.measures`).

A data owner may add its own safe words (``--safe-words FILE``, one word per line, ``#``
comments allowed): every word added is a word that is released whenever the models are
confident, so a surname that is also a common word (``Rose``, ``Hall``) added here leaks exactly
when the models miss it (docs/recall_first.md).

Lookups are case-insensitive and read words as the members do (:func:`dphub.textnorm.normalized_text`:
invisible and look-alike characters normalised), so ``Јohn`` with a Cyrillic ``Ј`` is the same
word as ``john``. The :attr:`SafeVocabulary.digest` names exactly which words were used: a
resumed run refuses another vocabulary, and every audit record carries the digest.

Errors never quote the file's content (an owner's file may hold anything): a bad line is
reported by its number only.

*Context words* (``context_words.txt``, shipped beside the list, issue 36) are ordinary words
that are also a first name, surname or place in an English-language list ("will", "art",
"ward", "good"): not safe words, but words the inverse rule may release where the words around
them show they are no name (:func:`dphub.ensemble.inverse.context_safe`).

*Site-local safe words* (issue 54, :data:`SITE_FORMAT`): words a reviewer said were no PHI where
a run hid them (``dphub review`` records them, :mod:`dphub.review.safe_words`), kept in their
own JSON file beside the ensemble manifest (0600, never published) and given with the same
``--safe-words FILE``. They are *not* added to :attr:`SafeVocabulary.words`: they sit in
:attr:`SafeVocabulary.site` and the inverse rule releases one only under a guard
(:func:`dphub.ensemble.inverse.site_released`), and only a word with at least
:data:`MIN_REJECTIONS` independent rejections and never labelled PHI at the site counts
(:func:`site_words`).

The shipped files are checked against their documented SHA-256 (:data:`SHIPPED_SHA256`,
docs/safe_vocab.md) at every load: a changed file is refused, never silently used, and a
vocabulary without a single word is refused too (it would hide every word without saying why).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError
from dphub.io import os_error_message, read_small_file
from dphub.textnorm import normalized_text

#: a safe word: one run of letters, as the words of a note are cut (letter/digit runs, no digits)
_LETTERS = re.compile(r"[^\W\d_]+")

#: the largest vocabulary file read (the shipped one is a few MB at most)
MAX_BYTES = 64 << 20

#: the ``format`` of a site-local safe words file (JSON; :mod:`dphub.review.safe_words` writes
#: it); ``--safe-words`` reads a file that starts with ``{`` as one
SITE_FORMAT = "dphub-site-safe-words"
SITE_VERSION = 1
#: independent rejections (different patients; a note without a patient id is its own) a site
#: word needs before it counts: one reviewer's slip on one patient's nickname is not enough
MIN_REJECTIONS = 2

#: the documented SHA-256 of each shipped file (``scripts/build_safe_vocab.py`` prints them;
#: docs/safe_vocab.md lists them): a file that differs is refused at load
SHIPPED_SHA256 = {
    "safe_words.txt": "bb8846fe9e53420b7835b010859d859c44f2db20b6fe5521f465f90e4b757d8c",
    "context_words.txt": "996e1d2b2660cad4b5685fd234e885da9819da1e98e66a50dc5574138fe227db",
    "weekdays.txt": "42977458f2c7b24ba5955a48de436c084310c8f9aa5492d26146b6aaaf632e9f",
}

#: shipped lists an owner adds by name as a ``--safe-words`` value: the annotation guideline's
#: choices (issue 57). ``builtin:weekdays``: weekday names are no PHI under your guideline (the
#: PhysioNet deid gold's); without it they stay hidden (HIPAA Safe Harbor: every element of a
#: date but the year). Matched on the path's last part, so a path resolved against a working
#: directory (the Ray engine's) still names it; a file of that name is never read instead.
BUILTIN_LISTS = {"builtin:weekdays": "weekdays.txt"}


def _builtin(path: str | os.PathLike[str]) -> str | None:
    """The shipped file a ``--safe-words`` value names (``builtin:weekdays``), or None."""
    return BUILTIN_LISTS.get(Path(path).name)


def normalize_word(word: str) -> str:
    """The form a word is looked up in: normalised as members read it, NFC, lower case.

    Printable ASCII is its own normal form (:func:`dphub.textnorm.normalize` changes nothing
    there, nor does NFC), so it is only lower-cased: the inverse rule looks up each word of a
    note about a dozen times, and the full path was a fifth of its time (issue 55).
    """
    if word.isascii() and word.isprintable():
        return word.lower()
    return unicodedata.normalize("NFC", normalized_text(word)).lower()


@dataclass(frozen=True)
class SafeVocabulary:
    """A set of safe words, with the digest of the files it came from and the shipped header."""

    words: frozenset[str]
    digest: str
    #: the shipped file's ``#`` header lines (its sources and their versions)
    sources: tuple[str, ...] = ()
    files: tuple[str, ...] = field(default=(), compare=False)
    #: words that are also names or places: released only in a context that is no name's
    context: frozenset[str] = frozenset()
    #: site-local safe words (issue 54, :func:`site_words`): released only under the inverse
    #: rule's guard for them, never as vocabulary words
    site: frozenset[str] = frozenset()

    @property
    def size(self) -> int:
        return len(self.words)

    def contains(self, word: str) -> bool:
        """Whether ``word`` (any case, any Unicode form) is a safe word."""
        return normalize_word(word) in self.words

    __contains__ = contains

    def is_context(self, word: str) -> bool:
        """Whether ``word`` is a context word (also a name or place; not a safe word)."""
        return normalize_word(word) in self.context

    def is_site(self, word: str) -> bool:
        """Whether ``word`` is a site-local safe word (before the inverse rule's guard)."""
        return normalize_word(word) in self.site

    @classmethod
    def from_words(cls, words: Iterable[str], sources: Sequence[str] = (),
                   context: Iterable[str] = ()) -> SafeVocabulary:
        """A vocabulary from words in memory (tests); its digest is over the sorted words (and
        the context words, when there are any)."""
        ws = frozenset(normalize_word(w) for w in words if w.strip())
        cw = frozenset(normalize_word(w) for w in context if w.strip()) - ws
        data = "\n".join(sorted(ws)).encode("utf-8")
        if cw:
            data += b"\n#context\n" + "\n".join(sorted(cw)).encode("utf-8")
        return cls(ws, hashlib.sha256(data).hexdigest(), tuple(sources), context=cw)


def _resource(name: str) -> bytes:
    """The bytes of a shipped file of ``dphub/resources/safe_vocab/`` (unchecked)."""
    ref = resources.files("dphub").joinpath("resources", "safe_vocab", name)
    try:
        return ref.read_bytes()
    except OSError:
        raise ConfigError(f"the shipped safe vocabulary (dphub/resources/safe_vocab/{name}) is "
                          "missing: reinstall dphub") from None


def _verified(name: str) -> bytes:
    """A shipped file, refused unless its SHA-256 is the documented one (a tampered or
    truncated vocabulary would release or hide words nobody chose)."""
    data = _resource(name)
    if hashlib.sha256(data).hexdigest() != SHIPPED_SHA256[name]:
        raise ConfigError(f"the shipped safe vocabulary (dphub/resources/safe_vocab/{name}) does "
                          "not match its documented sha256 (docs/safe_vocab.md): it was changed "
                          "after the build; reinstall dphub or rebuild it with "
                          "scripts/build_safe_vocab.py")
    return data


def _shipped_bytes() -> bytes:
    return _verified("safe_words.txt")


def _shipped_context_bytes() -> bytes:
    return _verified("context_words.txt")


def _parse(data: bytes, where: str, *, shipped: bool) -> tuple[set[str], list[str]]:
    """Words and ``#`` lines of one file; a bad line is one ConfigError naming its number."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: safe words file is not UTF-8 text") from None
    words: set[str] = set()
    header: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if shipped:
                header.append(line.lstrip("#").strip())
            continue
        w = normalize_word(line)
        if not _LETTERS.fullmatch(w):
            if shipped:
                continue  # a built list's "x-ray" could never match a word of a note
            raise ConfigError(f"{where}: line {n} is not one word of letters (safe words hold "
                              "one word per line: letters only, no digits, spaces or "
                              "punctuation)")
        words.add(w)
    return words, header


def load(path: str | os.PathLike[str] | None = None,
         extra: Sequence[str | os.PathLike[str]] = ()) -> SafeVocabulary:
    """The vocabulary of ``path`` (default: the shipped file) plus the owner's ``extra`` files.

    The digest is the SHA-256 over the SHA-256 of each file's bytes, in order, so it changes
    with any byte of any file (and with the order and number of owner files).
    """
    blobs: list[tuple[bytes, str, bool]] = []
    if path is None:
        blobs.append((_shipped_bytes(), "the shipped safe vocabulary", True))
    else:
        blobs.append((_read(path), str(path), True))
    for p in extra:
        name = _builtin(p)
        blobs.append((_read(p) if name is None else _verified(name), str(p), False))
    words: set[str] = set()
    site: set[str] = set()
    header: list[str] = []
    outer = hashlib.sha256()
    for data, where, base in blobs:
        outer.update(hashlib.sha256(data).digest())
        if not base and data.lstrip()[:1] == b"{":
            site |= site_words(data, where)
            continue
        w, h = _parse(data, where, shipped=base)
        if base and not w:
            raise ConfigError(f"{where} holds no words: the inverse rule would hide every word "
                              "(reinstall dphub, or give a vocabulary file with words)")
        words |= w
        header.extend(h)
    context: set[str] = set()
    if path is None:
        data = _shipped_context_bytes()
        context, _ = _parse(data, "the shipped context words", shipped=True)
        outer.update(hashlib.sha256(data).digest())
    # an owner's safe word is the owner's choice: it is safe, not a context word
    return SafeVocabulary(frozenset(words), outer.hexdigest(), tuple(header),
                          tuple(str(p) for p in ((path,) if path is not None else ()) + tuple(extra)),
                          context=frozenset(context - words), site=frozenset(site - words))


def is_site_word(word: str) -> bool:
    """The shape a site-local safe word must have, in the file and in the note: two or more
    letters, all lower case (a single letter is an initial's shape; a capital may start a name;
    digits and signs are where dates, IDs and phones hide), already in its looked-up form."""
    return (len(word) >= 2 and word.isalpha() and word.islower()
            and normalize_word(word) == word)


def site_entry_key(key: bytes, value: str) -> str:
    """The keyed digest a site file stores for a patient, a note or a word labelled PHI: the
    file names none of them (HMAC-SHA256 under the file's own random key, first 32 hex)."""
    return hmac.new(key, value.encode("utf-8", "surrogateescape"), "sha256").hexdigest()[:32]


def parse_site_file(data: bytes, where: str) -> dict[str, Any]:
    """A site-local safe words file, checked: ``{"format", "version", "key", "words": {word:
    [{"run", "source", "date"}, ...]}, "refused": [digest, ...]}``. Errors name the file and
    the entry's number, never a word."""
    bad = f"{where}: not a site-local safe words file ({SITE_FORMAT})"
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ConfigError(f"{bad}: not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != SITE_FORMAT:
        raise ConfigError(bad)
    if doc.get("version") != SITE_VERSION:
        raise ConfigError(f"{where}: site-local safe words of version {doc.get('version')!r}; "
                          f"this dphub reads version {SITE_VERSION}")
    key, words, refused = doc.get("key"), doc.get("words"), doc.get("refused")
    if not (isinstance(key, str) and re.fullmatch(r"[0-9a-f]{64}", key)
            and isinstance(words, dict) and isinstance(refused, list)
            and all(isinstance(r, str) for r in refused)):
        raise ConfigError(f"{bad}: it needs a key, words and refused")
    for n, (w, recs) in enumerate(words.items(), 1):
        if not (isinstance(w, str) and is_site_word(w)):
            raise ConfigError(f"{where}: word {n} is not a lower-case word of letters (site "
                              "safe words are never capitalised, numbers or shapes)")
        if not isinstance(recs, list) or not all(
                isinstance(r, dict) and all(isinstance(r.get(k), str)
                                            for k in ("run", "source", "date")) for r in recs):
            raise ConfigError(f"{where}: word {n}: each rejection is {{run, source, date}}")
    return doc


def site_words(data: bytes, where: str) -> set[str]:
    """The words of a site file that count: at least :data:`MIN_REJECTIONS` different sources
    (patients) and never labelled PHI at the site (their digest is not in ``refused``)."""
    return counted_site_words(parse_site_file(data, where))


def counted_site_words(doc: dict[str, Any]) -> set[str]:
    """The words of a checked site file (:func:`parse_site_file`) that count."""
    key = bytes.fromhex(doc["key"])
    refused = set(doc["refused"])
    return {w for w, recs in doc["words"].items()
            if len({r["source"] for r in recs}) >= MIN_REJECTIONS
            and site_entry_key(key, w) not in refused}


def _read(path: str | os.PathLike[str]) -> bytes:
    try:
        return read_small_file(path, MAX_BYTES, what="a safe words file")
    except FileNotFoundError:
        raise ConfigError(f"{Path(path)}: safe words file not found") from None
    except OSError as e:
        raise ConfigError(os_error_message(e, path)) from None
