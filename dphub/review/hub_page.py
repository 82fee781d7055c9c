"""The hub, readable (issue 40 #4): one HTML page listing a hub's models with their ε, unit,
labels, F1, lineage and their card rendered, so a data owner can choose what to pull.

Why markdown-it-py: a maintained CommonMark renderer, with raw HTML *off* (a card is text from
whoever published it: its HTML is escaped, never rendered). Cards are public, so the page holds
no note text; it is written atomically like every other output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from markdown_it import MarkdownIt

from dphub.hub.ops import list_models, open_hub
from dphub.io import atomic_write_text
from dphub.review.page import TEMPLATES

#: a card's front matter (YAML between --- lines) is shown as the summary, not rendered
_FRONT = "---"


def card_html(text: str) -> str:
    """A card's Markdown body as HTML (front matter dropped, raw HTML escaped, tables on)."""
    if text.startswith(_FRONT):
        end = text.find("\n---", len(_FRONT))
        if end != -1:
            text = text[end + 4 :]
    md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
    return md.render(text)


def hub_models(hub: str | None = None) -> list[dict[str, Any]]:
    """The latest revision of each hub model as the page's rows (card rendered where the backend
    serves files: the local hub)."""
    backend = open_hub(hub)
    rows = []
    for r in list_models(hub=hub):
        s = r.summary
        card = None
        reader = getattr(backend, "read_file", None)
        if reader is not None:
            raw = reader(r.repo, r.revision, "README.md")
            if raw is not None:
                card = card_html(raw.decode("utf-8", "replace"))
        rows.append({
            "repo": r.repo, "revision": r.revision[:12], "date": r.date, "tags": list(r.tags),
            "epsilon": s.epsilon, "delta": s.delta, "unit": s.unit, "verified": s.verified,
            "problem": s.problem, "public": s.public, "private": s.private,
            "labels": list(s.labels), "trained_labels": list(s.trained_labels), "f1": s.f1,
            "base_model": s.base_model, "patients": s.patients, "notes": s.notes, "card": card,
        })
    return rows


def write_hub_page(path: Path, hub: str | None = None) -> int:
    """Write the hub's page to ``path``; return how many models it lists."""
    rows = hub_models(hub)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    html = env.get_template("hub.html.j2").render(models=rows, hub=hub or "default hub")
    atomic_write_text(path, html)
    return len(rows)
