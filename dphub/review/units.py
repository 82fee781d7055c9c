"""The page boundary: offsets (code points in Python, UTF-16 units in the browser) and the shape
of what the page sends.

Why a module of its own (issue 54): dphub's offsets (audit, gold, corrections files, every
``Span``) count Unicode code points, a Python ``str``'s index. JavaScript strings, DOM text nodes
and selection ranges count UTF-16 code units, where a character outside the Basic Multilingual
Plane (an emoji, U+1F600) takes two. Sent as they were, one emoji shifted every later span of a
note on the page by one, and a correction made there was saved as a label on the wrong text.

So the conversion is explicit and happens here only: :func:`page_data` and
:func:`corrections_to_page` turn code points into UTF-16 units for the page (the page's data
says ``"units": "utf-16"``); :func:`corrections_from_page` turns the page's corrections back,
refusing a payload that does not declare ``"units": "utf-16"`` and any offset outside the note
or between the two halves of a surrogate pair. The page itself works in UTF-16 throughout
(``String.prototype.slice``, ``Range`` offsets), so it never converts. What the page sends is
checked against :data:`PAYLOAD_SCHEMA` first (jsonschema): a malformed body is one 400 naming
where it is wrong, never a 500, and never echoing a value (it could be note text).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema
import numpy as np
from jsonschema.exceptions import best_match

from dphub.errors import InputError

#: what the page's data and its corrections declare
PAGE_UNITS = "utf-16"

_OFFSET = {"type": "integer", "minimum": 0}
_SPAN = {"type": "object", "required": ["start", "end", "label"], "additionalProperties": False,
         "properties": {"start": _OFFSET, "end": _OFFSET, "label": {"type": "string"}}}
#: ``POST /corrections``: ``{"units": "utf-16", "revision", "notes": {key: corrections}}``
PAYLOAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["units", "revision", "notes"],
    "additionalProperties": False,
    "properties": {
        "units": {"const": PAGE_UNITS},
        "revision": {"type": "string", "maxLength": 64},
        "notes": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "reviewed": {"type": "boolean"},
                "rejected": {"type": "array", "items": {
                    "type": "array", "prefixItems": [_OFFSET, _OFFSET], "minItems": 2,
                    "items": False}},
                "retyped": {"type": "array", "items": _SPAN},
                "added": {"type": "array", "items": _SPAN},
            }}},
    },
}
_VALIDATOR = jsonschema.Draft202012Validator(PAYLOAD_SCHEMA)


def check_payload(payload: Any) -> None:
    """:class:`InputError` unless ``payload`` fits :data:`PAYLOAD_SCHEMA`; the message names the
    place and the rule broken, never the value (a wrong field could hold note text)."""
    err = best_match(_VALIDATOR.iter_errors(payload))
    if err is None:
        return
    if err.validator == "const" and list(err.path) == ["units"]:
        raise InputError("corrections: the page's offsets must be declared "
                         f"\"units\": \"{PAGE_UNITS}\" (reload the page)")
    if err.validator == "required":
        missing = [k for k in err.validator_value if not isinstance(err.instance, dict)
                   or k not in err.instance]
        raise InputError(f"corrections: {err.json_path} lacks {', '.join(missing)} (reload "
                         "the page)")
    rule = ("an unknown field" if err.validator == "additionalProperties"
            else f"{err.validator} {json.dumps(err.validator_value)[:60]}")
    raise InputError(f"corrections: {err.json_path} is not valid ({rule})")


class Utf16:
    """The code point <-> UTF-16 offset maps of one text (identity when it is all in the BMP)."""

    def __init__(self, text: str) -> None:
        self.n = len(text)
        wide = np.fromiter((ord(c) > 0xFFFF for c in text), dtype=bool, count=self.n)
        # cum[i]: UTF-16 units before code point i (cum[n]: the text's UTF-16 length)
        self.cum = None if not wide.any() else np.concatenate(
            ([0], np.cumsum(1 + wide.astype(np.int64))))
        self.units = self.n if self.cum is None else int(self.cum[-1])

    def to_units(self, cp: int) -> int:
        """The UTF-16 offset of code point offset ``cp`` (0 <= cp <= len(text))."""
        if not 0 <= cp <= self.n:
            raise InputError(f"offset {cp} is outside the note's {self.n} characters")
        return cp if self.cum is None else int(self.cum[cp])

    def to_code_points(self, u: int) -> int:
        """The code point offset of UTF-16 offset ``u``; refuses one inside a surrogate pair."""
        if not 0 <= u <= self.units:
            raise InputError(f"offset {u} is outside the note ({self.units} UTF-16 units)")
        if self.cum is None:
            return u
        i = int(np.searchsorted(self.cum, u))
        if self.cum[i] != u:
            raise InputError(f"offset {u} falls inside a character (between the two UTF-16 "
                             "units of one code point)")
        return i


def utf16(text: str) -> Utf16:
    """The maps of ``text`` (not cached: a module-level cache would keep note text alive)."""
    return Utf16(text)


def _span_to_page(s: Mapping[str, Any], m: Utf16) -> dict[str, Any]:
    return {**s, "start": m.to_units(s["start"]), "end": m.to_units(s["end"])}


def page_data(data: dict[str, Any], texts: Mapping[str, str]) -> dict[str, Any]:
    """``Review.to_dict()`` (code points) as the page reads it: every note's spans and misses
    in UTF-16 units, ``"units": "utf-16"`` at the top. ``texts``: note key -> text."""
    notes = []
    for n in data["notes"]:
        m = utf16(texts[n["key"]])
        notes.append({**n, "spans": [_span_to_page(s, m) for s in n["spans"]],
                      "misses": [_span_to_page(s, m) for s in n["misses"]]})
    return {**data, "units": PAGE_UNITS, "notes": notes}


def _pair(r: Any, where: str) -> tuple[int, int]:
    if not isinstance(r, list | tuple) or len(r) != 2:
        raise InputError(f"{where}: a rejected span is [start, end]")
    return _int(r[0], where), _int(r[1], where)


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"{where}: offsets must be integers")
    return v


def _convert(corr: Mapping[str, Any], conv: Callable[[int], int], where: str
             ) -> dict[str, Any]:
    """One note's corrections with every offset passed through ``conv`` (other fields kept)."""
    out: dict[str, Any] = dict(corr)
    try:
        if corr.get("rejected") is not None:
            if not isinstance(corr["rejected"], list):
                raise InputError(f"{where}: 'rejected' must be a list")
            out["rejected"] = [[conv(a), conv(b)] for a, b in
                               (_pair(r, where) for r in corr["rejected"])]
        for field in ("retyped", "added"):
            if corr.get(field) is None:
                continue
            if not isinstance(corr[field], list):
                raise InputError(f"{where}: '{field}' must be a list")
            rows = []
            for r in corr[field]:
                if not isinstance(r, Mapping):
                    raise InputError(f"{where}: a {field} span is {{start, end, label}}")
                rows.append({**r, "start": conv(_int(r.get("start"), where)),
                             "end": conv(_int(r.get("end"), where))})
            out[field] = rows
    except InputError as e:
        msg = e.message if e.message.startswith(where) else f"{where}: {e.message}"
        raise InputError(msg) from None
    return out


def corrections_to_page(corrections: Mapping[str, Any], texts: Mapping[str, str]
                        ) -> dict[str, Any]:
    """Corrections in code points (:func:`~dphub.review.corrections.load_corrections`) as the
    page holds them: UTF-16 units, ``"units": "utf-16"``."""
    notes = {k: _convert(c, utf16(texts[k]).to_units, f"corrections of {k}")
             for k, c in (corrections.get("notes") or {}).items()}
    return {"units": PAGE_UNITS, "notes": notes}


def corrections_from_page(payload: Any, texts: Mapping[str, str]) -> dict[str, Any]:
    """The page's corrections (UTF-16 units) in code points, for
    :func:`~dphub.review.corrections.save_corrections`.

    Refused (:class:`InputError`, naming keys and offsets, never text): a payload that does not
    say ``"units": "utf-16"`` (one made for code points would land on other characters), an
    offset outside its note or inside a surrogate pair. Notes not in ``texts`` are left for
    ``save_corrections`` to refuse.
    """
    check_payload(payload)
    notes: dict[str, Any] = {}
    for k, c in payload["notes"].items():
        if k in texts and isinstance(c, Mapping):
            notes[k] = _convert(c, utf16(texts[k]).to_code_points, f"corrections of {k}")
        else:
            notes[k] = c
    return {**payload, "notes": notes}
