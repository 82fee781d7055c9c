"""The card's YAML front matter as the Hub writes and reads it: ``huggingface_hub.ModelCardData``.

The one module of the card layer that imports ``huggingface_hub`` (a data class, no network; the
import contract ``hf-hub-in-hub`` in pyproject.toml names it), so a card's front matter is
byte-for-byte what the Hub would write and is read back the way the Hub reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dphub.errors import CardError


def render_readme(meta: Mapping[str, Any], body: str) -> str:
    """README text: ``---``, the front matter as ``ModelCardData`` dumps it, ``---``, the body."""
    from huggingface_hub import ModelCardData  # heavy: loaded when a card is written, not before

    try:
        data = ModelCardData(**dict(meta))
    except ValueError as e:  # malformed model-index
        raise CardError(f"model-index: cannot be represented ({type(e).__name__})") from None
    return f"---\n{data.to_yaml()}\n---\n{body}"


def read_front_matter(data: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """The front matter mapping as the Hub reads it (``ModelCardData(**data).to_dict()``)."""
    from huggingface_hub import ModelCardData  # heavy: loaded when a card is read, not before

    try:
        hf = ModelCardData(**dict(data))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise CardError(
            f"{where}: front matter cannot be read ({type(e).__name__}: malformed "
            "model-index or a non-mapping block)"
        ) from None
    return hf.to_dict()
