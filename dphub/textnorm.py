"""What ensemble members read: the note with invisible and look-alike characters normalised.

Why: a zero-width space inside a name (``Jo<U+200B>hn``), a soft hyphen, a byte-order mark, an
ANSI colour code, a Cyrillic ``о`` in ``John`` or fullwidth digits (``５５５-１２３-４５６７``)
look the same to a reader but split or disguise the word for every pattern, dictionary and
tokenizer, so the PHI came through untouched (issue 31.9). Members therefore read a normalised
copy of the note, and their spans are mapped back to the original offsets, so that the output
hides the original characters and evaluation against gold stays in the note's own coordinates.

The normalisation (:func:`normalize`):

* removes Unicode format characters (category Cf: zero-width space/joiners, word joiner, soft
  hyphen, BOM, bidirectional controls, tag characters), the Hangul filler letters (invisible
  letters), variation selectors, and control characters other than tab, newline, vertical tab,
  form feed, carriage return, NEL and the information separators ``\x1c``-``\x1f``;
* reads vertical tab, form feed, NEL and ``\x1c``-``\x1e`` as a newline and ``\x1f`` as a
  space, one for one (tokenizers drop them as control characters, which glued the words on
  either side into one);
* reads a symbol outside the Basic Multilingual Plane (an emoji, a skin tone, a ZWJ sequence:
  category S) as one space, none after a space (a tokenizer read ``Brisbee<emoji>`` as one
  unknown word, the rules lost the title of ``Dr. <emoji>Quinby``); symbols of the BMP
  (``™``, ``✓``) are kept as written;
* removes terminal escape sequences (CSI such as ``ESC[31m``, two-character escapes) but never
  a letter or digit a reader sees as part of a word (``ESC[John``, ``ESC5551234567``), and
  keeps the text of an OSC string (a title, a hyperlink): see :func:`_escape_text`;
* applies NFKC to each character together with its combining marks (fullwidth and mathematical
  letters and digits become ASCII, ``ﬁ`` becomes ``fi``), then drops combining marks that NFKC
  could not compose into a letter (``J̵ohn``); symbols (``™``), fractions (``½``), the micro
  sign and superscripts after a letter, or after a digit before ``/`` (``m²``, ``10³/µL``) are
  kept as written, so ordinary clinical text reads as before (a superscript run elsewhere in a
  number, ``5⁵⁵-¹²³-⁴⁵⁶⁷``, reads as digits); decimal digits of other scripts become ASCII
  digits;
* maps Cyrillic, Greek and Armenian letters that look like Latin ones to those Latin letters, in
  words made only of Latin letters and such look-alikes (``Јоhn``, an all-Cyrillic ``ТОМ``), so
  a word really written in another script (``Иван``) is left alone.

Why a table and not a library: the Unicode confusables data (TR39, shipped e.g. by
``confusable-homoglyphs``, not a dependency of dphub) also maps digits and Latin letters among
themselves (``1`` -> ``l``, ``0`` -> ``O``) and many loose look-alikes, so it would have to be
filtered to "non-Latin letter -> the Latin letter it is drawn like" anyway; that filter is the
short table :data:`CONFUSABLES` below, which can be read and reviewed in full.

Offsets: every normalised character remembers the original characters it came from; a span
``[a, b)`` of the normalised text maps to ``[start of a's source, end of (b-1)'s source)``, so it
covers removed characters inside it and the whole of a character that NFKC expanded. A note that
is printable ASCII (the common case) is not copied at all (:func:`normalize` returns None).
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from dphub.notes import Span

#: Letters of other scripts drawn like a Latin letter (upper and lower case kept apart).
CONFUSABLES: dict[str, str] = {
    # Cyrillic
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
    "Т": "T", "У": "Y", "Х": "X", "Ѕ": "S", "І": "I", "Ј": "J", "Ԛ": "Q", "Ԝ": "W", "Ү": "Y",
    "Ӏ": "I", "Һ": "H", "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x",
    "ѕ": "s", "і": "i", "ј": "j", "ԛ": "q", "ԝ": "w", "һ": "h", "ӏ": "l", "ԁ": "d", "ү": "y",
    # Greek
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
    "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X", "α": "a", "ι": "i", "κ": "k", "ν": "v",
    "ο": "o", "ρ": "p", "υ": "u", "χ": "x",
    # Armenian
    "օ": "o", "հ": "h", "ո": "n", "ս": "u", "ց": "g",
    # Latin letters outside ASCII that NFKC keeps: dotless i, script g
    "ı": "i", "ɡ": "g",
}
_CONFUSABLE_TABLE = str.maketrans(CONFUSABLES)

#: combining marks dropped after NFKC (diacritics that did not compose), variation selectors
_MARKS = "\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f\ufe00-\ufe0f"
_MARK_RE = re.compile(f"[{_MARKS}\U000e0100-\U000e01ef]")
#: letters that render as nothing (Hangul fillers)
_INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")
#: control characters that are whitespace a reader sees (kept)
_KEPT_CONTROLS = frozenset("\t\n\x0b\x0c\r\x85\x1c\x1d\x1e\x1f")
#: line-separating controls read as the line break they are (one for one: offsets do not
#: move): tokenizers drop ``\v``, ``\f``, NEL and the information separators as control
#: characters (BERT's ``clean_text``), which glued ``Brisbee<NEL>at`` into one word and a title
#: to the word before it (``then<FS>Dr.``); the unit separator reads as a space (issue 54)
_SEPARATORS = str.maketrans({"\x0b": "\n", "\x0c": "\n", "\x85": "\n", "\x1c": "\n",
                             "\x1d": "\n", "\x1e": "\n", "\x1f": " "})
_SEPARATOR_RE = re.compile("[\x0b\x0c\x85\x1c-\x1f]")

#: a note with none of these and only ASCII needs no normalisation (the fast path)
_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: what the slow path looks at: escape sequences, and any character outside printable ASCII
#: with the combining marks after it (everything between matches is copied as it is; marks
#: after an ASCII letter are joined to it in :func:`normalize`). Every branch starts with a
#: character outside printable ASCII, so the scan skips plain text quickly.
_UNIT = re.compile(
    # CSI (ESC[31m, 8-bit CSI): parameters are short numbers (a phone number is no parameter),
    # then intermediates and one final byte; see :func:`_escape_text` for what is kept
    r"(?:\x1b\[|\x9b)[<=>?]?(?:[0-9]{1,4}(?![0-9])|[;:])*[ -/]*[@-~]"
    r"|\x1b[ -/]*[0-~]"  # other escapes (ESC(B, ESC=, ESC], ST ESC\, ESC[ alone)
    f"|[^\\t\\n\\x0b\\x0c\\r\\x20-\\x7e][{_MARKS}\U000e0100-\U000e01ef]*"
)
#: what opens and closes an OSC string (window titles, hyperlinks): its text stays readable
_OSC_OPEN = frozenset(("\x1b]", "\x9d"))
_OSC_CLOSE = frozenset(("\x07", "\x1b\\", "\x9c"))
_LOOKALIKE = re.compile(f"[{''.join(CONFUSABLES)}]")
#: a letter run that holds a look-alike letter
_LOOKALIKE_WORD = re.compile(f"[^\\W\\d_]*[{''.join(CONFUSABLES)}][^\\W\\d_]*")


def _latin_or_lookalike(word: str) -> bool:
    for c in word:
        if c in CONFUSABLES or c.isascii():
            continue
        if not unicodedata.name(c, "").startswith("LATIN "):
            return False
    return True


def _dropped(c: str) -> bool:
    if c in _INVISIBLE_LETTERS or _MARK_RE.match(c):
        return True
    cat = unicodedata.category(c)
    return cat == "Cf" or (cat == "Cc" and c not in _KEPT_CONTROLS)


def _kept_as_written(c: str, as_unit: bool) -> bool:
    """Characters NFKC would change that keep their meaning as written: symbols ("™" is no
    "TM" glued to the word before it), fractions ("½"), the micro sign (NFKC makes it Greek),
    and superscripts or subscripts where they read as an exponent or index (``as_unit``, see
    :func:`_super_reads_as_unit`); elsewhere a run of superscript digits is read as digits (a
    disguised phone number)."""
    if c == "\u00b5" or unicodedata.category(c)[0] == "S":
        return True
    tag = unicodedata.decomposition(c)
    return tag.startswith("<fraction>") or (as_unit and tag.startswith(("<super>", "<sub>")))


def _is_super(c: str) -> bool:
    return unicodedata.decomposition(c).startswith(("<super>", "<sub>"))


def _super_reads_as_unit(text: str, pos: int, last: str) -> bool:
    """Whether the run of superscripts or subscripts at ``pos``, after the character ``last``
    read just before it, is an exponent or index kept as written: right after a letter
    (``m²``, ``CO₂``), or after a digit when a ``/`` follows the run (``10³/µL``). A run
    after a digit that goes on otherwise (``5⁵⁵-¹²³-⁴⁵⁶⁷``, ``555-12³-4567``) is read as
    digits: in a number it disguises digits far more often than it writes a power."""
    if not last.isascii() or not last.isalnum():
        return False
    if last.isalpha():
        return True
    while pos < len(text) and (_is_super(text[pos]) or _MARK_RE.match(text, pos)):
        pos += 1
    return text.startswith("/", pos)


def _escape_text(unit: str, nxt: str) -> str:
    """What members read of an escape sequence ``unit``: never a letter or digit that a reader
    of the note sees as part of a word (issue 31.9, review).

    A terminal would swallow the byte after ``ESC`` or the final byte of a CSI, but a note is
    read in a viewer, where ``ESC[John`` shows ``[John`` and ``ESC5551234567`` the whole
    number; dropping that character would hide the name or leave the first digit unmasked.
    So:

    * ``ESC`` + a letter or digit (``ESCJohn``; also the real ``ESC7``, ``ESCc``): only ``ESC``
      goes; with intermediates (``ESC(B``) the sequence goes whole unless its final letter or
      digit begins a word (``ESC(John)`` keeps ``(John``). ``nxt`` is the next character read;
    * a CSI goes whole when it has the standard shape with short numeric parameters
      (``ESC[31m``, ``ESC[2K``, ``ESC[?25l``, also ``ESC[0m`` inside a word); one with no
      numeric parameter, or with intermediates, whose final byte is a letter beginning a word
      (``ESC[John``, 8-bit ``CSI John``) loses only its introducer, except the colour reset
      ``ESC[m`` (the commonest sequence, often glued to the next word), which goes whole. The
      cost: a real parameterless sequence glued to a word (``ESC[KDone``) leaves its letter
      (``KDone``), and ``ESC[mary`` reads ``ary``. A ``[`` not followed by such a sequence
      (``ESC[555-123-4567``: a phone number is no parameter) loses only ``ESC[``;
    * an OSC string (a window title, a hyperlink) keeps its text: only its introducer and its
      BEL or ST terminator go, each read as a space so that the text does not glue to the
      words around it.
    """
    csi = unit[0] == "\x9b" or (unit.startswith("\x1b[") and len(unit) > 2)
    body = unit[2:] if csi and unit[0] == "\x1b" else unit[1:]
    final = body[-1:]
    if not (final.isascii() and final.isalnum()):
        return ""
    if not csi:  # ESC + letter or digit; after intermediates, only where it begins a word
        return body if len(body) == 1 or nxt.isalnum() else ""
    params = body[:-1]  # a CSI's final byte is never a digit
    if body == "m":  # ESC[m: the colour reset, the commonest sequence of all, goes whole
        return ""
    if nxt.isalpha() and (not any(c.isdigit() for c in params)
                          or any(" " <= c <= "/" for c in params)):
        return body
    return ""


def _next_read(text: str, pos: int) -> str:
    """The first character from ``pos`` that is not dropped ("" at the end)."""
    while pos < len(text) and _dropped(text[pos]):
        pos += 1
    return text[pos : pos + 1]


@lru_cache(maxsize=4096)
def _unit_text(unit: str, as_unit: bool) -> str:
    text = unit if _kept_as_written(unit[0], as_unit) else unicodedata.normalize("NFKC", unit)
    # decimal digits of any script ("٥٥٥", "५५५") read as ASCII digits
    return "".join(str(unicodedata.digit(c)) if c.isdecimal() and not c.isascii() else c
                   for c in text if not _dropped(c))


@dataclass(frozen=True)
class NormalizedText:
    """A normalised note text and the way back to the original's offsets.

    ``pieces`` lists, in order, the places where lengths differ: ``(normalised start, normalised
    length, original start, original end)``; every normalised character of a piece came from
    the whole original range. Between pieces characters correspond one to one.
    """

    text: str
    original_length: int
    pieces: tuple[tuple[int, int, int, int], ...]
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _original_starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", tuple(p[0] for p in self.pieces))
        object.__setattr__(self, "_original_starts", tuple(p[2] for p in self.pieces))

    def _locate(self, pos: int) -> tuple[int, int]:
        """Original ``[start, end)`` of normalised character ``pos``."""
        k = bisect.bisect_right(self._starts, pos) - 1
        if k < 0:
            return pos, pos + 1
        n0, length, a, b = self.pieces[k]
        if pos < n0 + length:
            return a, b
        o = b + (pos - n0 - length)
        return o, o + 1

    def to_original(self, start: int, end: int) -> tuple[int, int]:
        """The original range covered by normalised ``[start, end)`` (``start < end``)."""
        return self._locate(start)[0], self._locate(end - 1)[1]

    def from_original(self, start: int, end: int) -> tuple[int, int]:
        """The normalised range that original ``[start, end)`` reads as (``start < end``); a
        piece cut by a boundary counts whole. Where the renderer looks at a span's neighbours
        as members read them (``1<U+200B>20/80``: the span ``20`` is part of a measurement)."""
        return self._from_original(start, at_end=False), self._from_original(end, at_end=True)

    def _from_original(self, pos: int, *, at_end: bool) -> int:
        c = pos - 1 if at_end else pos  # the original character this boundary belongs to
        k = bisect.bisect_right(self._original_starts, c) - 1
        if k < 0:
            return pos
        n0, length, a, b = self.pieces[k]
        if c < b:  # inside piece k
            return n0 + length if at_end else n0
        return n0 + length + (pos - b)

    def spans_to_original(self, spans: Sequence[Span]) -> list[Span]:
        """``spans`` (on :attr:`text`) in original offsets; invalid spans are left unchanged
        (the renderer reports them, naming offsets only)."""
        n = len(self.text)
        out = []
        for s in spans:
            if 0 <= s.start < s.end <= n:
                a, b = self.to_original(s.start, s.end)
                out.append(s if (a, b) == (s.start, s.end) else replace(s, start=a, end=b))
            else:
                out.append(s)
        return out


def normalize(text: str) -> NormalizedText | None:
    """``text`` as members should read it, or None when that is ``text`` itself."""
    if text.isascii() and _ASCII_CONTROL.search(text) is None:
        return None
    parts: list[str] = []
    pieces: list[tuple[int, int, int, int]] = []
    pos = 0  # original position copied up to
    npos = 0  # length of the normalised text so far
    run_end, run_kept = -1, False  # the superscript run the next character may continue
    osc_open = False  # inside an OSC string: its BEL or ST terminator reads as a space
    for m in _UNIT.finditer(text):
        a, b = m.span()
        if a > pos and _MARK_RE.match(text, a):
            a -= 1  # combining marks after a plain letter: NFKC them together ("e" + acute)
        if a > pos:
            parts.append(text[pos:a])
            npos += a - pos
        if a == run_end:  # a run of superscripts is read one way: "⁵⁵⁵" as "555", "10²³" kept
            as_unit = run_kept
        elif _is_super(text[a]):
            last = parts[-1][-1] if parts else ""  # the character read just before this one
            as_unit = _super_reads_as_unit(text, a, last)
        else:
            as_unit = False
        unit = text[a:b]
        if unit[0] in "\x1b\x9b" and len(unit) > 1 and not _MARK_RE.match(unit[1]):
            out = " " if unit in _OSC_OPEN or (osc_open and unit in _OSC_CLOSE) else \
                _escape_text(unit, _next_read(text, b))
        elif unit in _OSC_OPEN or (osc_open and unit in _OSC_CLOSE):
            out = " "  # a title or link text and the text around it stay apart
        elif ord(unit[0]) > 0xFFFF and unicodedata.category(unit[0])[0] == "S":
            # an emoji (a skin tone, a ZWJ sequence) reads as one space, none after a space or
            # at the start: a tokenizer kept ``Brisbee<emoji>`` as one unknown word and the
            # rules lost the title of ``Dr. <emoji>Quinby``, so the name leaked (issue 54)
            last = parts[-1][-1:] if parts else ""
            out = " " if last and not last.isspace() else ""
        else:
            out = _unit_text(unit, as_unit)
        if unit in _OSC_OPEN:
            osc_open = True
        elif unit in _OSC_CLOSE:
            osc_open = False
        if _is_super(text[a]):
            run_end, run_kept = b, as_unit
        if out:
            parts.append(out)
        if len(out) != b - a:
            pieces.append((npos, len(out), a, b))
        npos += len(out)
        pos = b
    parts.append(text[pos:])
    norm = "".join(parts)
    if not norm.isascii() and _LOOKALIKE.search(norm):  # one for one: offsets do not move
        norm = _LOOKALIKE_WORD.sub(
            lambda w: w.group(0).translate(_CONFUSABLE_TABLE)
            if _latin_or_lookalike(w.group(0)) else w.group(0), norm)
    if _SEPARATOR_RE.search(norm):  # one for one: offsets do not move
        norm = norm.translate(_SEPARATORS)
    if norm == text:
        return None
    return NormalizedText(norm, len(text), tuple(pieces))


def normalized_text(text: str) -> str:
    """``text`` as members read it (the text itself when nothing changes)."""
    n = normalize(text)
    return text if n is None else n.text
