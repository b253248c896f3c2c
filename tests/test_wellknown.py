"""The API group, label keys and pool names are written once, in glm_operator.wellknown."""

from __future__ import annotations

import ast
from pathlib import Path

import glm_operator
from glm_operator import wellknown
from glm_operator.gateway.config import POOLS as GATEWAY_POOLS

PACKAGE = Path(glm_operator.__file__).parent
SPELLED_ONCE = (wellknown.GROUP, f"{wellknown.PREFIX}/")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _code_strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in skip]


def test_group_and_label_prefix_are_spelled_only_in_wellknown() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{line}: {value!r}"
        for path in sorted(PACKAGE.rglob("*.py")) if path.name != "wellknown.py"
        for line, value in _code_strings(path)
        if any(spelled in value for spelled in SPELLED_ONCE)
    ]
    assert offenders == [], "import these from glm_operator.wellknown:\n" + "\n".join(offenders)


def test_the_gateway_knows_the_same_pools() -> None:
    assert tuple(GATEWAY_POOLS) == wellknown.POOLS
