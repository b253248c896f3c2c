"""Imports flow one way (docs/operator.md): controllers -> decide -> render -> planning -> api,
and only the parts that must talk to the API server reach `kube`. A shortcut fails here.

Command lines are held to the same rules: a command that wires two layers lives above both
(`glm_operator/generate.py`, `glm_operator/cli.py`)."""

from __future__ import annotations

import ast
from pathlib import Path

import glm_operator
import pytest

PACKAGE = Path(glm_operator.__file__).parent

# package -> packages of glm_operator it must never import
FORBIDDEN = {
    "api": {"planning", "render", "decide", "controllers", "kube", "fetch", "gateway", "analysis"},
    "planning": {"render", "decide", "controllers", "kube", "fetch", "gateway"},
    "render": {"decide", "controllers", "kube", "fetch"},
    "decide": {"controllers", "kube", "fetch", "gateway"},
    "fetch": {"planning", "render", "decide", "controllers"},
    "analysis": {"decide", "controllers", "kube", "render"},
    "gateway": {"planning", "render", "decide", "controllers", "fetch", "analysis"},
    # The conversion webhook: HTTPS around api/conversion.py, nothing else of the operator.
    "webhook": {"planning", "render", "decide", "controllers", "kube", "fetch", "gateway",
                "analysis"},
}

# Who may talk to the API server: the controllers, the gateway's long-context pool (it wakes
# the pool and renews its activity Lease with the pod's own token), the router (it follows
# its route table and the service's pods, wakes pools and renews their Leases, with its own
# token) and the fetch Job's status reporter (with the command that runs it). Paths relative
# to the package.
KUBE_CALLERS = ("controllers/", "gateway/pools/", "gateway/router/", "fetch/reporter.py",
                "fetch/cli.py", "kube/")

# The pure decisions: no operator framework, no API client, no threads, no sleeping.
DECIDE_FORBIDS_MODULES = {"kopf", "kubernetes", "threading", "asyncio", "aiohttp"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _modules(package: str) -> list[Path]:
    return sorted((PACKAGE / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_flow_one_way(package: str) -> None:
    bad = []
    for path in _modules(package):
        for module in _imports(path):
            parts = module.split(".")
            if parts[0] == "glm_operator" and len(parts) > 1 and parts[1] in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert bad == []


def test_only_the_api_callers_reach_kube() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(KUBE_CALLERS):
            continue
        bad += [f"{relative} imports {module}" for module in _imports(path)
                if module == "glm_operator.kube" or module.startswith("glm_operator.kube.")]
    assert bad == []


def _is_sleep(node: ast.AST) -> bool:
    """`time.sleep` (or `from time import sleep`): a decision never waits."""
    if isinstance(node, ast.Attribute):
        return (node.attr == "sleep" and isinstance(node.value, ast.Name)
                and node.value.id == "time")
    return isinstance(node, ast.ImportFrom) and node.module == "time" and any(
        alias.name == "sleep" for alias in node.names)


def test_decisions_are_pure() -> None:
    bad = []
    for path in _modules("decide"):
        tree = ast.parse(path.read_text())
        bad += [f"{path.relative_to(PACKAGE)} imports {module}" for module in _imports(path)
                if module.split(".")[0] in DECIDE_FORBIDS_MODULES]
        bad += [f"{path.relative_to(PACKAGE)}:{node.lineno} sleeps" for node in ast.walk(tree)
                if _is_sleep(node)]
    assert _modules("decide"), "glm_operator/decide/ holds the pure decisions"
    assert bad == []
