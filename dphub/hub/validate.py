"""Validating a model card together with the files next to it, as the publish gate does.

The card layer (:mod:`dphub.card`) checks front matter alone; agreement with the weights, the
training config and the declared base needs the gate (:mod:`dphub.hub.gate`), so it lives here.
"""

from __future__ import annotations

from pathlib import Path

from dphub.card import ModelCard, load_card, meta_problems
from dphub.card.validation import join_problems
from dphub.errors import CardError
from dphub.hub.gate import model_dir_problems


def validate_card(
    path: Path, *, require_private: bool = False, check_accounting: bool = True,
    check_files: bool = True,
) -> ModelCard:
    """Load and validate the card of ``path`` (a model dir or README.md); return it.

    When the card sits in a model directory (next to ``model.safetensors`` or
    ``training_config.json``) and ``check_files`` is true, the directory is checked against the
    card as the publish gate does: only allow-listed files and training-config keys, the weights'
    SHA-256 and tensor layout, the training config's accounting fields equal to the card's, a
    public-synthetic claim's record, and the encoder against the declared base where this machine
    has it (:func:`dphub.hub.gate.base_unresolved` says when it has not).
    Raises :class:`CardError` with every problem on one line.
    """
    card = load_card(path)
    problems = meta_problems(card.meta, require_private=require_private,
                             check_accounting=check_accounting)
    model_dir = card.path.parent if card.path is not None else None
    if check_files and model_dir is not None and any(
        (model_dir / n).is_file() for n in ("model.safetensors", "training_config.json")
    ):
        problems += [p for p in model_dir_problems(model_dir, card.meta) if p not in problems]
    if problems:
        raise CardError(join_problems(problems))
    return card
