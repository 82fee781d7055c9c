"""Issue 39 item 5: no function of dphub (CLI included) runs over 100 lines of code."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "dphub"
MAX_LINES = 100


def _long_functions(root: Path) -> list[str]:
    """``path:name (lines)`` of each function whose body, docstring aside, is too long."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            if (len(body) > 1 and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                body = body[1:]
            lines = (node.end_lineno or node.lineno) - body[0].lineno + 1
            if lines > MAX_LINES:
                found.append(f"{path.relative_to(root.parent)}:{node.name} ({lines})")
    return found


def test_the_scan_sees_a_long_function(tmp_path: Path) -> None:
    pkg = tmp_path / "dphub"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES + 1))
    (pkg / "m.py").write_text(f'def f():\n    """doc"""\n{body}\n', encoding="utf-8")
    assert _long_functions(pkg) == [f"dphub/m.py:f ({MAX_LINES + 1})"]


def test_no_function_over_100_lines() -> None:
    assert _long_functions(ROOT) == []
