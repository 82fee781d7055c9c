"""The review page as HTML: one Jinja2 template, plain CSS and JS inline, no external request.

Why one template for both uses: the served page and the self-contained file (``--html``) must
show the same thing; the file only lacks the save endpoint (it is read-only) and carries a
Content-Security-Policy that forbids any request, so opening it fetches nothing.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import jinja2

from dphub.io import atomic_write_text
from dphub.review.run import SHOWN_CATEGORIES, Review
from dphub.review.units import corrections_to_page, page_data

TEMPLATES = Path(__file__).parent / "templates"


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES),
                              autoescape=True, undefined=jinja2.StrictUndefined)


def script_json(obj: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: ``<``, ``>``, ``&`` escaped, so
    note text such as ``</script>`` cannot end the element."""
    return (json.dumps(obj, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def order_line(review: Review) -> str:
    """The sentence that says which order the notes are in, so a reviewer never reads an order
    of doubt into a list that has none (a one-member run cannot disagree; without thresholds or
    the inverse rule every doubt is 0 and the order is the run's)."""
    parts = []
    if len(review.members) <= 1:
        parts.append("one member: members cannot disagree, so a note's doubt comes only from "
                     "scores near a threshold and inverse-rule words")
    if all(n.doubt.total == 0 for n in review.notes):
        parts.append("every note's doubt is 0: the notes are in the run's order (its input "
                     "order), not in an order of doubt")
    else:
        parts.append("notes in order of doubt, most doubtful first (ties in the run's order)")
    return "; ".join(parts)


def render_page(review: Review, *, save_url: str | None = None, token: str | None = None,
                corrections: dict[str, Any] | None = None, nonce: str | None = None,
                revision: str | None = None, readonly: str | None = None) -> str:
    """The page; without ``save_url`` it is the read-only, self-contained file.

    ``corrections`` are in code points (as :func:`~dphub.review.corrections.load_corrections`
    returns them); the page gets every offset in UTF-16 units (:mod:`dphub.review.units`).
    ``readonly``: why corrections cannot be saved (the page says so at the top, before any
    work, and takes none); the file without ``save_url`` is read-only by itself. The file gets
    a nonce of its own for its meta Content-Security-Policy: no inline script but its own.
    """
    texts = {n.key: n.text for n in review.notes}
    static = save_url is None
    if static:
        readonly = ("this is the self-contained file: it cannot save corrections. Serve the "
                    "run with `dphub review DIR --notes NOTES` to correct it")
        nonce = nonce or secrets.token_urlsafe(16)
    config = {"save_url": save_url, "token": token, "revision": revision, "readonly": readonly,
              "corrections": corrections_to_page(corrections or {"notes": {}}, texts)}
    return _env().get_template("review.html.j2").render(
        run_name=review.run_dir.name, rule=review.rule or "?", categories=SHOWN_CATEGORIES,
        checked=review.checked, order=order_line(review), readonly=readonly,
        release=review.release,
        data_json=script_json(page_data(review.to_dict(), texts)),
        config_json=script_json(config),
        static=static, nonce=nonce)


def write_page(review: Review, path: Path) -> None:
    """The self-contained page, written atomically and 0600 (it holds note text)."""
    atomic_write_text(path, render_page(review))
    Path(path).chmod(0o600)
