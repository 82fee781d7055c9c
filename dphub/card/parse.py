"""Loading a card: size-capped README text, the YAML front matter without aliases or anchors.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from dphub.card.front_matter import read_front_matter
from dphub.card.model import CARD_FILE, ModelCard, plain_meta
from dphub.errors import CardError

# --------------------------------------------------------------------------- loading

#: A README larger than this is refused before it is parsed (cards are a few kB).
MAX_CARD_BYTES = 1_000_000
#: Front matter larger than this is refused before YAML sees it.
MAX_FRONT_MATTER_BYTES = 256_000
#: Deepest nesting of YAML collections a card may use (dphub's cards use 5).
MAX_YAML_DEPTH = 32
#: The front-matter block as Hugging Face's RepoCard finds it (``---`` lines around YAML).
_YAML_BLOCK = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")


class _YamlRefused(yaml.YAMLError):
    """A YAML construct cards may not use; ``mark`` says where."""

    def __init__(self, what: str, mark: Any) -> None:
        super().__init__(what)
        self.what = what
        self.problem_mark = mark


class _PlainYamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without anchors/aliases and with a nesting limit.

    Safe loading constructs no Python objects, but it still expands aliases: a 1 kB
    "billion laughs" card references one list 9 levels deep and grows to gigabytes in whatever
    walks it (ModelCardData, JSON Schema, ``plain_meta``). Cards are written by dphub and need
    neither anchors nor deep nesting, so both are refused while composing, before anything grows.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _YamlRefused("a YAML alias", event.start_mark)
        if getattr(event, "anchor", None) is not None:
            raise _YamlRefused("a YAML anchor", event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _YamlRefused(f"nesting deeper than {MAX_YAML_DEPTH} levels",
                                   event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_front_matter_yaml(block: str, *, where: str) -> dict[str, Any]:
    """Parse a card's YAML front matter with limits (size, no aliases/anchors, nesting depth).

    Every card reader goes through here (``card show|validate``, publish, pull, hub listings), so
    a hostile card costs at most a 256 kB parse. Error messages give a line, never content.
    """
    if len(block) > MAX_FRONT_MATTER_BYTES or len(block.encode("utf-8", "replace")) > \
            MAX_FRONT_MATTER_BYTES:
        raise CardError(f"{where}: front matter is larger than {MAX_FRONT_MATTER_BYTES // 1000} kB; "
                        "dphub cards are a few kB")
    try:
        data = yaml.load(block, Loader=_PlainYamlLoader)  # noqa: S506 - safe loader subclass
    except _YamlRefused as e:
        line = e.problem_mark.line + 2 if e.problem_mark is not None else None
        raise CardError(
            f"{where}: front matter uses {e.what}" + (f" at line {line}" if line else "")
            + "; cards must be plain YAML (aliases and anchors can expand without bound)"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 2}, column {mark.column + 1}" if mark else ""
        raise CardError(f"{where}: front matter is not valid YAML{at}") from None
    except (ValueError, OverflowError, RecursionError, MemoryError) as e:
        raise CardError(f"{where}: front matter cannot be read ({type(e).__name__})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CardError(f"{where}: front matter is not a mapping")
    return data


def split_front_matter(text: str, *, where: str) -> tuple[dict[str, Any], str]:
    """(front-matter dict, Markdown body) of README text, parsed with the limits above."""
    if len(text) > MAX_CARD_BYTES:
        raise CardError(f"{where}: model card is larger than {MAX_CARD_BYTES // 1_000_000} MB")
    if not re.match(r"\s*---(\r\n|\r|\n)", text):
        raise CardError(f"{where}: no YAML front matter (the card must start with '---')")
    m = _YAML_BLOCK.search(text)
    if not m:
        raise CardError(f"{where}: front matter is not closed by a '---' line")
    return load_front_matter_yaml(m.group(2), where=where), text[m.end():]


def _card_path(path: Path) -> Path:
    path = Path(path)
    return path / CARD_FILE if path.is_dir() else path


def parse_card(text: str, *, where: str = "model card") -> ModelCard:
    """Split README text into front matter and body; the front matter goes through
    ``huggingface_hub.ModelCardData`` (as the Hub reads it) after the limited YAML parse."""
    data, body = split_front_matter(text, where=where)
    meta = plain_meta(read_front_matter(data, where=where))
    return ModelCard(meta=meta, body=body)


def read_card_text(card_path: Path) -> str:
    """The README's text, refused above :data:`MAX_CARD_BYTES` before it is read whole."""
    try:
        with open(card_path, "rb") as fh:
            raw = fh.read(MAX_CARD_BYTES + 1)
    except OSError as e:
        raise CardError(f"{card_path}: cannot read the model card ({e.strerror})") from None
    if len(raw) > MAX_CARD_BYTES:
        raise CardError(f"{card_path}: model card is larger than {MAX_CARD_BYTES // 1_000_000} MB")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise CardError(f"{card_path}: model card is not UTF-8 text") from None


def load_card(path: Path) -> ModelCard:
    """Load a card from a model directory or a README.md path."""
    card_path = _card_path(Path(path))
    if not card_path.is_file():
        raise CardError(f"{card_path}: no model card found")
    card = parse_card(read_card_text(card_path), where=str(card_path))
    card.path = card_path
    return card
