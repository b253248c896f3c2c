"""pytest fixtures for the e2e tests: a real control plane, kubectl, a namespace per test.

Every test module under e2e/ is marked `e2e` automatically, so `pytest -m "not e2e"` runs the
unit tests only and `pytest e2e` the e2e tests only.

Fixtures
--------
cluster (session)
    The local control plane of e2e/cluster.py (a `LocalCluster`: `.kubectl`, `.kubeconfig`).
    - CI (CI=true): builds what is missing, brings the cluster up (reusing one already up)
      and stops it at the end of the session (GLM_E2E_KEEP=1 keeps it). If it cannot come up,
      every e2e test FAILS; nothing skips in CI.
    - Locally: reuses a running cluster (`make cluster-up`), else creates one and leaves it up
      for the next run (GLM_E2E_KEEP=0 stops it at the end). If it cannot come up, the e2e
      tests are skipped with the reason.
    - GLM_E2E_KIND=1 with Docker present: runs the same tests on a kind cluster through
      pytest-kind (`pip install -e '.[kind]'`), with kwok faking the GPU/NPU nodes of
      e2e/nodes.yaml next to kind's real node (docs/development.md, "The kind path").
kubeconfig (session)
    Path of the kubeconfig (.e2e/kubeconfig locally), for tools other than kubectl
    (`env={"KUBECONFIG": str(kubeconfig)}`, helm, the operator process).
kubectl (session)
    `kubectl(*args, input=None, check=True) -> subprocess.CompletedProcess[str]`, the real
    kubectl with the cluster's kubeconfig; raises KubectlError (with the API server's message)
    on a non-zero exit unless check=False. Also `.get_json(...)`, `.items(...)`,
    `.exists(...)`, `.apply(...)`.
namespace (function)
    A fresh namespace (`e2e-<test>-<random>`) with its default ServiceAccount ready, deleted
    after the test (without waiting). When the test fails, its pods, ReplicaSets, PVCs and
    events are printed. Released PVs of earlier tests are made Available first.
apply (session)
    `apply(manifest, namespace=None)`: server-side apply (field manager `glm-e2e`) of a dict,
    a list of dicts or YAML text. Returns the CompletedProcess.
wait_for (session)
    `wait_for(predicate, timeout=60, what="...", interval=0.5)`: polls until `predicate()` is
    truthy and returns its value; on timeout fails with "timed out after Ns waiting for
    <what>; last seen: ...". KubectlError and LookupError inside the predicate count as
    "not yet".
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e import cluster as local_cluster
from e2e import late_builds, toolchain
from e2e.kubectl import Kubectl, KubectlError, Manifest
from e2e.kubectl import wait_for as _wait_for
from e2e.operator_fixtures import OperatorProcess

E2E_DIR = Path(__file__).resolve().parent


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def in_ci() -> bool:
    return _env_flag("CI", False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if late_builds.is_e2e(item):
            item.add_marker(pytest.mark.e2e)
    late_builds.order(items, late_builds.is_e2e)


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """Before pytest-timeout's own wrapper starts the test's clock: wait for the components
    the background build of `make test` is still making (e2e/late_builds.py)."""
    late_builds.wait(item)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so `namespace` can dump state after a failure."""
    report = yield
    setattr(item, f"_e2e_report_{report.when}", report)
    if report.failed:
        # A test that waited on the operator and timed out is explained by the operator's log.
        funcargs = getattr(item, "funcargs", {})
        for value in funcargs.values():
            if isinstance(value, OperatorProcess):
                report.sections.append(("glm-operator log (last 150 lines)", value.tail(150)))
    return report


@dataclass
class LocalCluster:
    """What the `cluster` fixture yields."""

    kubectl: Kubectl
    kubeconfig: Path
    flavour: str  # "kwok" (the local control plane) or "kind"
    cleanup: list[Callable[[], object]] = field(default_factory=list)


def _start_kind() -> LocalCluster:
    """The opt-in kind path: a kind cluster from pytest-kind, plus our kwok for fake nodes."""
    # Optional dependency (pip install -e '.[kind]'), imported only on this path.
    kind = importlib.import_module("pytest_kind").KindCluster("glm-e2e")
    kind.create()
    kubeconfig = Path(str(kind.kubeconfig_path))
    client = Kubectl(local_cluster.Binaries.from_cache().kubectl, kubeconfig)
    kwok = subprocess.Popen(
        [
            str(local_cluster.Binaries.from_cache().kwok),
            f"--kubeconfig={kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={local_cluster.FAKE_NODE_ANNOTATION}=fake",
            "--node-lease-duration-seconds=40",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    local_cluster.populate(client)

    def stop() -> None:
        kwok.terminate()
        kwok.wait(timeout=30)
        kind.delete()

    return LocalCluster(client, kubeconfig, "kind", [stop])


def _start_local() -> LocalCluster:
    client = local_cluster.up(build=True)
    local_cluster.recycle_released_volumes(client)
    result = LocalCluster(client, local_cluster.kubeconfig_path(), "kwok")
    # CI leaves no process behind; locally the next run reuses the cluster.
    if not _env_flag("GLM_E2E_KEEP", not in_ci()):
        result.cleanup.append(local_cluster.down)
    return result


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    use_kind = _env_flag("GLM_E2E_KIND", False)
    try:
        if use_kind:
            if shutil.which("docker") is None:
                raise RuntimeError("GLM_E2E_KIND=1 needs Docker, and `docker` is not on PATH")
            started = _start_kind()
        else:
            started = _start_local()
    except (local_cluster.ClusterError, toolchain.BuildError, KubectlError, RuntimeError,
            AssertionError, ImportError) as exc:
        message = f"the e2e cluster could not come up: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield started
    finally:
        for step in started.cleanup:
            step()


@pytest.fixture(scope="session")
def kubeconfig(cluster: LocalCluster) -> Path:
    return cluster.kubeconfig


@pytest.fixture(scope="session")
def kubectl(cluster: LocalCluster) -> Kubectl:
    return cluster.kubectl


@pytest.fixture(scope="session")
def apply(kubectl: Kubectl) -> Callable[..., subprocess.CompletedProcess[str]]:
    def _apply(
        manifest: Manifest, namespace: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return kubectl.apply(manifest, namespace=namespace)

    return _apply


@pytest.fixture(scope="session")
def wait_for() -> Callable[..., Any]:
    return _wait_for


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"e2e-{slug}-{uuid.uuid4().hex[:5]}"


@pytest.fixture
def namespace(
    request: pytest.FixtureRequest, cluster: LocalCluster, kubectl: Kubectl
) -> Iterator[str]:
    name = _namespace_name(request.node.name.removeprefix("test_"))
    # Claims of earlier tests' deleted namespaces left their PVs Released; offer them again.
    if cluster.flavour == "kwok":
        local_cluster.recycle_released_volumes(kubectl)
    kubectl.apply(
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": name, "labels": {"glm-operator.dev/e2e": "true"}}}
    )
    # The ServiceAccount admission plugin refuses pods until the controller-manager has
    # created the namespace's default ServiceAccount.
    _wait_for(lambda: kubectl.exists("serviceaccount", "default", "-n", name),
              timeout=30, what=f"ServiceAccount default in namespace {name}")
    yield name
    report = getattr(request.node, "_e2e_report_call", None)
    if report is not None and report.failed:
        dump = kubectl.run("get", "pods,replicasets,pvc,events", "-n", name, "-o", "wide",
                           check=False)
        print(f"\n--- namespace {name} at failure ---\n{dump.stdout}{dump.stderr}")
    kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
