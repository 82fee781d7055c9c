"""Model-card assets (installed as ``dphub.cards``): the DP-metadata JSON Schema and the template."""

from importlib.resources import files
from pathlib import Path


def asset(name: str) -> Path:
    """Path of a file shipped in this package (schema, template)."""
    return Path(str(files(__name__).joinpath(name)))
