"""A long function is a sign of several jobs: no function of the product (command line,
operator, planner and replay) is longer than LONG_LINES unless a comment in its first lines
says why it must be one piece (a line containing 'one piece:')."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = [ROOT / "pdscale", ROOT / "operator", ROOT / "planner"]
LONG_LINES = 80


def long_functions(source: str, limit: int = LONG_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function longer than ``limit`` lines whose body's
    first ten lines carry no 'one piece:' comment."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            head = "\n".join(lines[node.lineno - 1: node.lineno + 10])
            if length > limit and "one piece:" not in head:
                found.append((node.name, node.lineno, length))
    return found


def product_files() -> list[Path]:
    # pdscale/ links the other folders in; read each real file once
    return sorted({p.resolve() for folder in PRODUCT for p in folder.rglob("*.py")
                   if "testbed" not in p.resolve().parts})


def test_no_long_function_in_the_product_without_a_reason():
    offenders = {str(p.relative_to(ROOT)): found for p in product_files()
                 if (found := long_functions(p.read_text()))}
    assert offenders == {}


def test_the_check_finds_a_long_function_and_accepts_a_reason():
    body = "".join(f"    x{i} = {i}\n" for i in range(LONG_LINES))
    assert long_functions(f"def f():\n{body}") == [("f", 1, LONG_LINES + 1)]
    assert long_functions(f"def f():\n    # one piece: a state machine reads best whole\n{body}") == []
