"""The CLI (``dphub/cli/``) is inside the import contracts, and the contracts bite (issue 39).

``lint-imports`` reads the package ``dphub`` through grimp; the CLI lives in ``dphub/cli/`` so it
is part of that graph (imports inside functions count too). The tests run ``lint-imports`` with
the project's own contracts on a copy of ``dphub/`` into which one bad import has been written,
and check that it is reported: a CLI left outside the graph would let each of them through.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"

_LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _contracts() -> dict[str, dict]:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def test_the_cli_is_the_top_layer_and_in_the_graph() -> None:
    assert _contracts()["layers"]["layers"][0] == "dphub.cli"  # not "(dphub.cli)": optional
    graph = grimp.build_graph("dphub", cache_dir=None)
    cli = {m for m in graph.modules if m.startswith("dphub.cli.")}
    assert {"dphub.cli.main", "dphub.cli.train", "dphub.cli.audit",
            "dphub.cli.ensemble.deid"} <= cli
    # an import inside a function is an edge of the graph (cli.main imports its groups lazily)
    assert graph.direct_import_exists(importer="dphub.cli.main", imported="dphub.cli.train")


def _cycles(graph: grimp.ImportGraph, modules: list[str]) -> list[list[str]]:
    """The strongly connected components (more than one module) of ``modules``' imports."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(m: str) -> None:
        order[m] = low[m] = len(order)
        stack.append(m)
        for n in graph.find_modules_directly_imported_by(m):
            if n not in low:
                if n in modules:
                    visit(n)
                    low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], order[n])
        if low[m] == order[m]:
            component = []
            while True:
                n = stack.pop()
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in modules:
        if m not in order:
            visit(m)
    return found


def test_no_import_cycle_between_any_two_modules() -> None:
    """Stricter than the acyclic_siblings contract: no two modules of dphub (the CLI included)
    reach each other, counting imports inside functions and a package's ``__init__``."""
    graph = grimp.build_graph("dphub", cache_dir=None)
    modules = sorted(m for m in graph.modules if m.startswith("dphub"))
    assert "dphub.cli.train" in modules
    assert _cycles(graph, modules) == []


def test_no_contract_ignores_an_import() -> None:
    assert all(not c.get("ignore_imports") for c in _contracts().values())


def _lint(tmp_path: Path, edit: tuple[str, str] | None) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's contracts on a copy of ``dphub/`` (``edit``: a line
    appended to one module, at the end of a new function so the import is function-local)."""
    pkg = tmp_path / "dphub"
    shutil.copytree(ROOT / "dphub", pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if edit is not None:
        module, line = edit
        path = pkg / module
        path.write_text(path.read_text(encoding="utf-8")
                        + f"\n\ndef _added_by_the_test():\n    {line}\n", encoding="utf-8")
    return subprocess.run([sys.executable, "-c", _LINT, "--config", str(PYPROJECT), "--no-cache"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})


def test_the_copy_holds_the_cli_and_keeps_every_contract(tmp_path: Path) -> None:
    done = _lint(tmp_path, None)
    assert (tmp_path / "dphub" / "cli" / "main.py").is_file()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in done.stdout


@pytest.mark.parametrize(("edit", "contract"), [
    # a library module reaching up into the CLI
    (("runner/state.py", "import dphub.cli.options"), "dphub layers"),
    # two CLI modules importing each other (cli.audit imports cli.train at its top)
    (("cli/train.py", "from dphub.cli import audit"), "no import cycle"),
    (("cli/ensemble/_common.py", "from dphub.cli.ensemble import deid"), "no import cycle"),
    # huggingface_hub below the hub, outside the card's front matter
    (("card/model.py", "import huggingface_hub"), "only the hub"),
])
def test_lint_imports_reports_a_bad_import(tmp_path: Path, edit: tuple[str, str],
                                           contract: str) -> None:
    done = _lint(tmp_path, edit)
    assert done.returncode != 0
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(line.startswith(contract) for line in broken), done.stdout[-3000:]
