"""docs/guarantees.md names the test behind each promise: every name it gives must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PAGE = TESTS.parent / "docs" / "guarantees.md"


def _defined(path: Path) -> set[str]:
    """Every function and class name defined in a test module, at any depth."""
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {node.name for node in ast.walk(tree) if isinstance(node, kinds)}


def test_every_test_the_page_names_exists() -> None:
    text = PAGE.read_text()
    refs = re.findall(r"(test_\w+\.py)((?:::\w+)*)", text)
    assert len(refs) > 30  # the pattern still finds the page's references
    missing = []
    for module, names in refs:
        path = TESTS / module
        if not path.exists():
            missing.append(module)
            continue
        defined = _defined(path)
        missing += [f"{module}::{n}" for n in names.split("::")[1:] if n not in defined]
    # bare names in backticks (`test_x`) must be defined in some test module
    everything = set().union(*(_defined(p) for p in TESTS.glob("*.py")))
    bare = set(re.findall(r"`(test_\w+)`", text))
    missing += sorted(n for n in bare if n not in everything)
    assert missing == []
