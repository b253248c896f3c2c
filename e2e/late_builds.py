"""Tests that need a component `make test` builds in the background, run last and wait for it
outside their timeout.

`make test` builds only what every e2e test needs first (toolchain.FIRST: the control plane,
the CRDs, helm), then starts the rest in a detached build at nice 19 and runs the suite at
once: the unit tests and the e2e tests that need nothing more use the time llama-server,
MinIO, LeaderWorkerSet, the endpoint picker, KEDA and the vLLM venv take to build. Here:

- `needs(item)` says which of those a test needs, from its fixtures and the `llama` marker
  (no test module lists them by hand);
- `order(items)` moves whole modules that need one after the rest, in the order the
  background build finishes them (llama-server, the longest, last), so module fixtures are
  set up once;
- `wait(item)`, called before the test's timeout starts (conftest's runtest hook), builds or
  waits for what it needs: each component's build lock (e2e/cache.py) makes that a wait for
  the background build, never a second build. A failed build is left for the test to report
  (its own ensure raises with the build's error).

Run without `make test` (pytest alone), nothing is built in the background: `wait` builds what
a test needs, still outside its timeout.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from e2e import toolchain

VLLM = "vllm"  # not a toolchain component: the venv of e2e/vllm_cli.py

# Fixture name -> what its setup builds (names no unit test uses as a parameter: pytest lists
# parametrize arguments among an item's fixtures too). A fixture that starts to need another
# late component is added here; a test needing one unlisted still works, it only waits inside
# its timeout.
BY_FIXTURE: dict[str, tuple[str, ...]] = {
    "llama_binary": ("llama_cpp_python",),
    "custom_metrics": ("custom_metrics_apiserver",),
    "keda_controller": ("keda_controller",),
    "epp_binary": ("epp",),
    "minio": ("minio",),
    "lws_crd": ("lws",),
    "lws_cluster": ("lws",),
    "vllm_python": (VLLM,),
    "vllm_lists": (VLLM,),
    "vllm_engine": (VLLM,),
    "release_tools": ("crane", "syft", "epp_arm64"),
    "arm64_llama": ("epp_arm64",),
}
BY_MARKER: dict[str, tuple[str, ...]] = {
    "llama": ("llama_cpp_python",),
}
# The order the background build finishes them in (two at a time, llama-server alongside the
# Go builds and longest); tests run in this order too. The vLLM venv is mostly download.
LATE_ORDER: tuple[str, ...] = (
    VLLM, "minio", "lws", "epp", "epp_arm64", "keda_controller", "custom_metrics_apiserver",
    "crane", "syft", "llama_cpp_python",
)
# (LeaderWorkerSet and KEDA before the HPA modules: their waits are outside the tests'
# timeouts, and KEDA's module then runs on nodes the HPA tests' pods have not used yet.)


E2E_DIR = Path(__file__).resolve().parent


def is_e2e(item: pytest.Item) -> bool:
    return E2E_DIR in Path(str(item.fspath)).resolve().parents


def needs(item: pytest.Item) -> tuple[str, ...]:
    """The late components an e2e test needs (none for a unit test)."""
    if not is_e2e(item):
        return ()
    found: list[str] = []
    for name in getattr(item, "fixturenames", ()):
        found += BY_FIXTURE.get(name, ())
    for marker, components in BY_MARKER.items():
        if item.get_closest_marker(marker) is not None:
            found += components
    return tuple(dict.fromkeys(found))


def _rank(components: tuple[str, ...]) -> int:
    """0 for none; else 1 + the latest position in LATE_ORDER (unknown names last)."""
    if not components:
        return 0
    return 1 + max(LATE_ORDER.index(c) if c in LATE_ORDER else len(LATE_ORDER)
                   for c in components)


def order(items: list[pytest.Item], is_e2e: Callable[[pytest.Item], bool]) -> None:
    """Stable reorder in place: unit tests and e2e modules needing nothing late first, then
    e2e modules by the latest component any of their tests needs."""
    module_rank: dict[Path, int] = {}
    for item in items:
        if is_e2e(item):
            path = Path(str(item.fspath))
            module_rank[path] = max(module_rank.get(path, 0), _rank(needs(item)))
    items.sort(key=lambda item: module_rank.get(Path(str(item.fspath)), 0))


def _ensure(component: str) -> None:
    if component == VLLM:
        from e2e.vllm_cli import ensure_vllm

        ensure_vllm()
    else:
        toolchain.ensure(component)


_failed: set[str] = set()  # tried once this session: not again for every test


def wait(item: pytest.Item) -> None:
    for component in needs(item):
        if component in _failed:
            continue
        started = time.monotonic()
        try:
            _ensure(component)
        except Exception as exc:  # the test's own ensure reports it, in the test
            _failed.add(component)
            print(f"[late builds] {component} is not available: {exc}", file=sys.stderr)
            continue
        waited = time.monotonic() - started
        if waited >= 1:
            print(f"\n[late builds] {item.nodeid}: waited {waited:.0f} s for {component} "
                  "(outside the test's timeout)", file=sys.stderr, flush=True)
