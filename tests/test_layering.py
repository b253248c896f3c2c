"""Imports flow one way (docs/operator.md): controllers -> decide -> render -> planning -> api,
and only the parts that must talk to the API server reach `kube`. A shortcut fails here.

Inside the two proxies too: the gateway's layers (wire -> openai -> policy -> pipeline) and the
router's (http2 -> grpc -> picker -> routing -> forwarding -> dispatch -> app), each importing
only its own layer and those below; the router imports the gateway (its wire layer, its front
door), never the other way round, and its modules form no import cycle, not even one made of
imports for type checking alone.

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
    "api": {"planning", "render", "decide", "controllers", "kube", "fetch", "gateway", "analysis",
            "router"},
    "planning": {"render", "decide", "controllers", "kube", "fetch", "gateway", "router"},
    "render": {"decide", "controllers", "kube", "fetch", "router"},
    "decide": {"controllers", "kube", "fetch", "gateway", "router"},
    "fetch": {"planning", "render", "decide", "controllers", "router"},
    "analysis": {"decide", "controllers", "kube", "render", "router"},
    "gateway": {"planning", "render", "decide", "controllers", "fetch", "analysis", "router"},
    # The router: the gateway's wire layer and front door under it, the API client for its
    # watches and wakes; nothing of the operator's own.
    "router": {"planning", "render", "decide", "controllers", "fetch", "analysis", "webhook"},
    # The conversion webhook: HTTPS around api/conversion.py, nothing else of the operator.
    "webhook": {"planning", "render", "decide", "controllers", "kube", "fetch", "gateway",
                "analysis", "router"},
}

# Who may talk to the API server: the controllers, the gateway's long-context pool (it wakes
# the pool and renews its activity Lease with the pod's own token), the router (it follows
# its route table and the service's pods, wakes pools and renews their Leases, with its own
# token) and the fetch Job's status reporter (with the command that runs it). Paths relative
# to the package.
KUBE_CALLERS = ("controllers/", "gateway/pools/", "router/", "fetch/reporter.py",
                "fetch/cli.py", "kube/")

# Each proxy's layers, lowest first: a module (a path relative to the package's folder, without
# .py, or a sub-package's folder) imports only from its own layer and those below.
INTERNAL_LAYERS: dict[str, list[tuple[str, set[str]]]] = {
    "gateway": [
        # Bytes, framing, connections; the flags and settings they are sized by.
        ("wire", {"wire", "flags", "config", "metrics", "coalesce"}),
        ("openai", {"openai"}),  # the protocol's semantics: requests, errors, events, usage
        ("policy", {"policy", "call"}),  # keys, limits, audit, metrics; a request's books
        # Composed once: the upstreams, the pools' fallback and wake-up, the pipeline, the app.
        ("pipeline", {"upstream", "pools", "proxy", "app", "cli"}),
    ],
    "router": [
        ("http2", {"http2_frames", "http2_connection"}),  # knows nothing of gRPC
        ("grpc", {"grpc_call", "grpc_wire"}),
        ("picker", {"picker"}),  # the endpoint picker's ext-proc call
        # What a request is routed by: the table, the pods, prefixes, the body, the wake-up.
        ("routing", {"table", "pods", "prefix", "body", "metrics", "config", "wake"}),
        ("forwarding", {"forward", "unframed"}),  # to the pod, over the gateway's wire layer
        ("dispatch", {"dispatch"}),
        ("app", {"app", "cli"}),
    ],
}

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


def _unit(package: str, module: str) -> str | None:
    """The name INTERNAL_LAYERS gives `module` (dotted, under glm_operator) inside `package`:
    its sub-package, or its module; None outside `package`."""
    parts = module.split(".")
    if parts[:2] != ["glm_operator", package] or len(parts) < 3:
        return None
    return parts[2]


@pytest.mark.parametrize("package", sorted(INTERNAL_LAYERS))
def test_each_proxys_layers_import_downwards(package: str) -> None:
    layers = INTERNAL_LAYERS[package]
    rank = {unit: index for index, (_, units) in enumerate(layers) for unit in units}
    names = {index: name for index, (name, _) in enumerate(layers)}
    bad, unplaced = [], []
    for path in _modules(package):
        relative = path.relative_to(PACKAGE / package)
        if relative.name == "__init__.py" and len(relative.parts) == 1:
            continue
        unit = relative.parts[0].removesuffix(".py")
        if unit not in rank:
            unplaced.append(str(relative))
            continue
        for module in _imports(path):
            other = _unit(package, module)
            if other is None:
                continue
            if other not in rank:
                unplaced.append(f"{module} (imported by {relative})")
            elif rank[other] > rank[unit]:
                bad.append(f"{relative} ({names[rank[unit]]}) imports {module} "
                           f"({names[rank[other]]})")
    assert unplaced == [], "modules in no layer of INTERNAL_LAYERS"
    assert bad == []


def test_the_routers_modules_form_no_cycle() -> None:
    """Every import counts, those under `if TYPE_CHECKING:` too: a cycle of them is two
    layers that know each other (as the HTTP/2 connection and the gRPC call once did)."""
    graph: dict[str, set[str]] = {}
    for path in _modules("router"):
        name = "glm_operator.router." + path.relative_to(PACKAGE / "router").with_suffix(
            "").as_posix().replace("/", ".")
        graph[name] = {m for m in _imports(path) if m.startswith("glm_operator.router.")}
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> list[str] | None:
        if node in trail:
            return [*trail[trail.index(node):], node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            cycle = visit(target, [*trail, node])
            if cycle is not None:
                return cycle
        done.add(node)
        return None

    cycles = [cycle for node in sorted(graph) if (cycle := visit(node, [])) is not None]
    assert cycles == []
