"""Imports flow one way (docs/operator.md): controllers -> render -> planning -> api, and
only controllers (and the CLIs that start them) reach `kube`. A shortcut fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import glm_operator
import pytest

PACKAGE = Path(glm_operator.__file__).parent

# package -> packages it must never import
FORBIDDEN = {
    "api": {"planning", "render", "controllers", "kube", "fetch", "gateway", "analysis"},
    "planning": {"render", "controllers", "kube", "fetch", "gateway"},
    "render": {"controllers", "kube", "fetch"},
    "fetch": {"planning", "render", "controllers"},
    "analysis": {"controllers", "kube", "render"},
}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_flow_one_way(package: str) -> None:
    bad = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        if path.name == "cli.py":  # a command line wires the parts together
            continue
        for module in _imports(path):
            parts = module.split(".")
            if parts[0] == "glm_operator" and len(parts) > 1 and parts[1] in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert bad == []
