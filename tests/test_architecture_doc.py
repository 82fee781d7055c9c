"""docs/architecture.md's layer table says what the import-linter contract enforces (issue 39)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _contract_layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (layers,) = [c["layers"] for c in config["tool"]["importlinter"]["contracts"]
                 if c["id"] == "layers"]
    return [{m.strip().strip("()") for m in row.split("|")} for row in layers]


def _documented_layers() -> list[set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text.split("| layer (top first) | modules | owns |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.strip().splitlines()[1:]:  # after the |---| line
        modules = line.split(" | ")[1]
        names = {n if n.startswith("dphub.") else f"dphub.{n}"
                 for n in re.findall(r"`([^`/]+)`", modules)}
        rows.append(names)
    return rows


def test_the_layer_table_lists_the_contract_s_layers_in_order() -> None:
    assert _documented_layers() == _contract_layers()


def test_no_contract_exempts_an_import_from_the_layers() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    layers = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers"]
    assert layers and not layers[0].get("ignore_imports")
