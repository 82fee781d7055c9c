"""dphub: share differentially private de-identification models without sharing patients.

The library never prints and never exits; the CLI (`dphub.cli`) does both. Every stage speaks
:class:`~dphub.notes.Note` and :class:`~dphub.notes.Span` in character offsets, so models with
different tokenizers (and rule members with none) combine on characters.

The Python API (:mod:`dphub.api`, loaded on first use)::

    import dphub
    deid = dphub.load("dphub-ensemble.toml")     # once: the ensemble's members and rule
    deid("Seen by Dr. Kowalczyk.").render("redact")
"""

from __future__ import annotations

import importlib
from typing import Any

from dphub.notes import Note, Span

__version__ = "0.1.0"
__all__ = ["DeidResult", "Deidentifier", "Note", "PhiSpan", "Span", "__version__", "load"]

#: the Python API (:mod:`dphub.api`), imported on first use: ``import dphub`` stays light (no
#: torch, no ensemble) for the CLI's ``--help`` and for code that only needs notes and spans
_API = frozenset(("DeidResult", "Deidentifier", "PhiSpan", "load"))


def __getattr__(name: str) -> Any:
    if name in _API:
        # by name, not an import statement: the root package is imported by every layer (any
        # `from dphub.x import ...` runs it), and an import of the API (the top of the library)
        # written here would read to import-linter as every layer importing everything above it
        return getattr(importlib.import_module("dphub.api"), name)
    raise AttributeError(f"module 'dphub' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _API)
