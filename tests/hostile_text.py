"""A hostile-text corpus for every entry point (issue 54): real-world note text that broke runs.

Made here (synthetic): every character ``str.splitlines()`` treats as a line end (U+2028,
U+2029, U+0085, ``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, ``\\r``, CRLF), astral characters (emoji,
mathematical letters, CJK extension B: two UTF-16 units each), combining marks, ZWJ sequences,
right-to-left and left-to-right marks and overrides, NUL, a BOM at the start and in the middle,
and PHI spans placed right after, right before and around each of them. Offsets are code points
of the text (a Python ``str``'s index), as everywhere in dphub.

:data:`NOTES` is the corpus; :func:`notes` gives it as labelled :class:`~dphub.notes.Note`
objects; :data:`LONE_SURROGATE` is a text a Python ``str`` can hold and no UTF-8 file can.
"""

from __future__ import annotations

from dphub.notes import Note, Span

#: (name, character(s)) of the hostile pieces
ODD: tuple[tuple[str, str], ...] = (
    ("ls", "\u2028"), ("ps", "\u2029"), ("nel", "\u0085"), ("vt", "\x0b"), ("ff", "\x0c"),
    ("fs", "\x1c"), ("gs", "\x1d"), ("rs", "\x1e"), ("cr", "\r"), ("crlf", "\r\n"),
    ("emoji", "\U0001F600"), ("math", "\U0001D49C"), ("cjkb", "\U00020BB7"),
    ("comb", "e\u0301\u0327"), ("zwj", "\U0001F469\u200d\U0001F4BB"),
    ("family", "\U0001F468\u200d\U0001F469\u200d\U0001F467"), ("rlm", "\u200f"),
    ("lrm", "\u200e"), ("rlo", "\u202e"), ("lro", "\u202d"), ("pdf", "\u202c"),
    ("nul", "\x00"), ("bom", "\ufeff"),
)

#: a name and a phone number: the PHI of every note
NAME, PHONE = "Yolanda Brisbee", "555-0134"


def _text(odd: str) -> str:
    """PHI right after, right before and around ``odd``, and ``odd`` at both ends."""
    return (f"{odd}Call {NAME}{odd} at{odd}{PHONE} then{odd}Dr. {odd}Quinby{odd} "
            f"Marlowe re: {odd}{NAME}{odd}\nseen{odd}03/14/2026{odd}, 5 mg, aged 93{odd}end{odd}")


def _spans(text: str) -> list[Span]:
    out: list[Span] = []
    for phrase, label in ((NAME, "PATIENT"), (PHONE, "PHONE"), ("Quinby", "DOCTOR"),
                          ("Marlowe", "DOCTOR"), ("03/14/2026", "DATE"), ("93", "AGE")):
        i = text.find(phrase)
        while i >= 0:
            out.append(Span(i, i + len(phrase), label))
            i = text.find(phrase, i + len(phrase))
    return sorted(out, key=lambda s: (s.start, s.end))


#: note id -> text: one note per hostile piece, one with all of them, and a BOM first and inside
NOTES: dict[str, str] = {
    **{f"p{i}-{name}": _text(odd) for i, (name, odd) in enumerate(ODD)},
    "pall-all": "".join(_text(odd) for _, odd in ODD),
    "pbom-bom": "\ufeff" + _text("\ufeff"),
}

#: where a format cannot hold a note (reason in words); every other note must round-trip
#: exactly (text and span offsets)
XML_ILLEGAL = frozenset(n for n, t in NOTES.items()
                        if any(c in t for c in "\x00\x0b\x0c\x1c\x1d\x1e"))

#: a lone surrogate: a Python str holds it, UTF-8 cannot (JSON "\\ud800" escapes decode to it)
LONE_SURROGATE = "Call Yolanda Brisbee \ud800 at 555-0134"


def notes(*, patients: bool = True) -> list[Note]:
    """The corpus as labelled notes (ids ``P-N``: PhysioNet encodes the patient in the id)."""
    return [Note(id=k, text=t, patient_id=k.split("-")[0] if patients else None,
                 spans=_spans(t), labelled=True) for k, t in NOTES.items()]
