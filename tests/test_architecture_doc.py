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


def _diagram(layers: list[str]) -> str:
    """The mermaid picture of the contract's layers: one box per row, top layer first."""
    def short(name: str) -> str:
        name = name.strip()
        inner = name.strip("()").removeprefix("dphub.")
        return f"({inner})" if name.startswith("(") else inner

    lines = ["```mermaid", "flowchart TD"]
    lines += [f'  L{i}["{" · ".join(short(m) for m in row.split("|"))}"]'
              for i, row in enumerate(layers)]
    lines += ["  " + " --> ".join(f"L{i}" for i in range(len(layers))), "```"]
    return "\n".join(lines)


def test_the_layer_diagram_is_the_contract_s_layers() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (layers,) = [c["layers"] for c in config["tool"]["importlinter"]["contracts"]
                 if c["id"] == "layers"]
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert layers[0] == "dphub.cli"  # the CLI is a layer of the contract, not an optional name
    assert _diagram(layers) in text
