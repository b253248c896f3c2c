"""The operator's namespace globs: one cluster-wide watch per kind, filtered in the operator.

With kopf matching the globs itself, it ran one watch per matching namespace and kind, and a
namespace deleted while its watches first listed left the operator alive but deaf (seen in
CI). Here an operator on `scope-*,!scope-skip-*` starts while matching namespaces are created
and deleted around it; it must reconcile, hold no namespace-scoped watch, and leave alone what
its patterns exclude: another namespace, and one its `!` excludes.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from e2e.kubectl import Kubectl, wait_for
from e2e.operator_fixtures import OperatorProcess, glm_crds, wait_serving

__all__ = ["glm_crds"]  # fixtures used by name

PATTERN = "scope-*,!scope-skip-*"
CHURN_SECONDS = 25.0
MODEL_VERSION_LABEL = "glm-operator.dev/model-version"


def watches(kubectl: Kubectl, resource: str, scope: str) -> int:
    """Open WATCH requests on `resource` at `scope` (cluster or namespace), by the API
    server's own gauge."""
    metrics = kubectl("get", "--raw", "/metrics").stdout
    total = 0
    for line in metrics.splitlines():
        if not line.startswith("apiserver_longrunning_requests{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if (labels.get("verb"), labels.get("resource"), labels.get("scope")) == (
                "WATCH", resource, scope):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


class Churn:
    """Creates namespaces the glob matches and deletes each at once, in a loop."""

    def __init__(self, kubectl: Kubectl) -> None:
        self.kubectl = kubectl
        self.stop = threading.Event()
        self.cycles = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        run = uuid.uuid4().hex[:4]
        while not self.stop.is_set():
            name = f"scope-churn-{run}-{self.cycles}"
            self.kubectl.run("create", "namespace", name, check=False)
            self.kubectl.run("delete", "namespace", name, "--wait=false", check=False)
            self.cycles += 1


def model_version(namespace: str, name: str) -> dict[str, object]:
    return {"apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "ModelVersion",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"source": {"uri": "pvc://model-store/scope.gguf"}, "format": "gguf"}}


@pytest.fixture(scope="module")
def namespaces(kubectl: Kubectl) -> Iterator[dict[str, str]]:
    suffix = uuid.uuid4().hex[:5]
    names = {"inside": f"scope-in-{suffix}", "excluded": f"scope-skip-{suffix}",
             "elsewhere": f"elsewhere-{suffix}"}
    for name in names.values():
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield names
    for name in names.values():
        kubectl.run("delete", "namespace", name, "--wait=false", check=False)


def test_globs_watch_cluster_wide_and_survive_namespaces_coming_and_going(
        glm_crds: list[str], kubectl: Kubectl, namespaces: dict[str, str]) -> None:
    # The objects outside the patterns exist before the operator starts: they are in its
    # first listing, and must not be touched then either.
    for key in ("excluded", "elsewhere"):
        kubectl.apply(model_version(namespaces[key], "outside"))
    namespaced_before = watches(kubectl, "modelversions", "namespace")
    cluster_before = watches(kubectl, "modelversions", "cluster")

    churn = Churn(kubectl)
    churn.thread.start()
    time.sleep(2)  # namespaces are already coming and going when the operator starts
    process = OperatorProcess(kubectl, namespaces=(PATTERN,))
    try:
        wait_for(process.alive, timeout=60, what="glm-operator liveness endpoint")
        time.sleep(max(0.0, CHURN_SECONDS - 2))
        churn.stop.set()
        churn.thread.join(timeout=30)
        print(f"[scope] {churn.cycles} namespaces created and deleted around the start")
        assert churn.cycles >= 5, "the churn did not run"

        # It reconciles what its patterns match, namespaces deleted under it or not.
        wait_serving(process, kubectl, namespaces["inside"], timeout=90)

        # One cluster-wide watch per kind, none per namespace.
        assert watches(kubectl, "modelversions", "cluster") >= cluster_before + 1
        assert watches(kubectl, "modelversions", "namespace") <= namespaced_before

        # Nothing outside the patterns: no fetch Job, no kopf bookkeeping, no status.
        kubectl.apply(model_version(namespaces["elsewhere"], "after-start"))
        kubectl.apply(model_version(namespaces["inside"], "after-start"))
        wait_for(lambda: kubectl.items("jobs", "-n", namespaces["inside"], "-l",
                                       f"{MODEL_VERSION_LABEL}=after-start"),
                 timeout=60, what="the fetch Job of the ModelVersion inside the patterns")
        for key, name in (("excluded", "outside"), ("elsewhere", "outside"),
                          ("elsewhere", "after-start")):
            namespace = namespaces[key]
            assert not kubectl.items("jobs", "-n", namespace), namespace
            body = kubectl.get_json("modelversion", name, "-n", namespace)
            assert "status" not in body, (namespace, body.get("status"))
            annotations = body["metadata"].get("annotations") or {}
            assert not [a for a in annotations if a.startswith("glm-operator.dev/")], (
                namespace, annotations)
            assert not body["metadata"].get("finalizers"), namespace
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nglm-operator log:\n{process.tail(120)}") from exc
    finally:
        churn.stop.set()
        process.stop()
