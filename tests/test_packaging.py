"""The wheel holds every package: pyproject's explicit list misses none of the source tree's."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _source_packages() -> set[str]:
    """Every folder with an ``__init__.py`` under the mapped package directories."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    found: set[str] = set()
    for name, folder in cfg["tool"]["setuptools"]["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base).parts
            found.add(".".join((name, *rel)))
    return found


def test_every_package_of_the_source_tree_is_listed() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(cfg["tool"]["setuptools"]["packages"])
    source = _source_packages()
    assert "dphub.ensemble" in source and "dphub.cli.ensemble" in source  # the scan sees nested
    assert source - listed == set(), "add these to [tool.setuptools] packages"
