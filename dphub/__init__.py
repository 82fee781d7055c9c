"""dphub: share differentially private de-identification models without sharing patients.

The library never prints and never exits; the CLI (`dphub.cli`) does both. Every stage speaks
:class:`~dphub.notes.Note` and :class:`~dphub.notes.Span` in character offsets, so models with
different tokenizers (and rule members with none) combine on characters.
"""

from dphub.notes import Note, Span

__version__ = "0.1.0"
__all__ = ["Note", "Span", "__version__"]
