"""The CLI (``cli/``, installed as ``dphub.cli``) is checked like the library (issue 39).

import-linter and grimp read ``dphub/`` only (``cli/`` is mapped onto ``dphub.cli`` by
``package-dir``, and grimp takes top-level packages): so the test lays the two out as one
package in a temporary directory, builds grimp's graph of it (imports inside functions count
too) and checks that no two CLI modules import each other, directly or through others."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CYCLES = """
import json, grimp
g = grimp.build_graph("dphub", cache_dir=None)
mods = sorted(m for m in g.modules if m == "dphub.cli" or m.startswith("dphub.cli."))
print(json.dumps({"modules": mods, "cycles": [[a, b] for a in mods for b in mods
                  if a < b and g.chain_exists(a, b) and g.chain_exists(b, a)]}))
"""


def test_no_import_cycle_among_the_cli_modules(tmp_path: Path) -> None:
    pkg = tmp_path / "dphub"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "dphub", pkg, ignore=skip)
    shutil.copytree(ROOT / "cli", pkg / "cli", ignore=skip)
    out = subprocess.run([sys.executable, "-c", _CYCLES], cwd=tmp_path, capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(tmp_path)}).stdout
    found = json.loads(out)
    assert {"dphub.cli.train", "dphub.cli.audit"} <= set(found["modules"])
    assert found["cycles"] == []
