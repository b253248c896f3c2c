"""A multi-node GLMService as a LeaderWorkerSet, run by LeaderWorkerSet's own controller.

On a local control plane of its own (the real LeaderWorkerSet CRD and its pod webhook change
what every operator on a cluster renders): the real lws-manager (sigs.k8s.io/lws, built by
e2e/toolchain.py; e2e/lws_controller.py) serves its webhooks through a Service endpoint in a
network namespace, and the operator, seeing the CRD served, renders the replica groups as a
LeaderWorkerSet. lws-manager makes the leader StatefulSet and one worker StatefulSet per
group, the real scheduler places them on the fake L4 nodes, and the operator must read the
LeaderWorkerSet's own status (it is not watched) to call the service Ready, scale it by whole
groups and have it garbage-collected.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import in_ci
from e2e.kubectl import Kubectl, wait_for
from e2e.lws_controller import LwsController
from e2e.netns import VethNamespace
from e2e.operator_fixtures import CRDS, OperatorProcess, report_fetched
from e2e.test_multinode import L4, MODEL_VERSION, NAME, SERVICE, SET, VERSION, group_pods
from e2e.test_operator import glms, node_labels

REPO = Path(__file__).resolve().parent.parent
PORT_OFFSET = 300  # this cluster's ports (and its veth pair): the shared cluster's plus this
PREFIX = "glm-lws-"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


@pytest.fixture(scope="module")
def lws_cluster(kubectl: Kubectl) -> Iterator[Kubectl]:
    """A second local control plane (the shared one's binaries, ports shifted)."""
    state = Path(tempfile.mkdtemp(prefix="glm-e2e-lws-cluster-"))
    env = {**os.environ, "GLM_E2E_STATE_DIR": str(state),
           "GLM_E2E_PORT_OFFSET": str(PORT_OFFSET)}

    def cluster(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "e2e.cluster", command], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=300, check=False)

    up = cluster("up")
    try:
        if up.returncode != 0:
            message = f"the LeaderWorkerSet cluster could not come up:\n{up.stderr[-3000:]}"
            if in_ci():
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        client = Kubectl(kubectl.binary, state / "kubeconfig")
        client.apply_files(CRDS, field_manager="glm-e2e-crds")
        yield client
    finally:
        cluster("down")
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def lws(lws_cluster: Kubectl) -> Iterator[LwsController]:
    controller = LwsController(lws_cluster, VethNamespace.for_cluster(offset=PORT_OFFSET))
    try:
        yield controller.start()
    except BaseException:
        print(f"\n--- lws-manager log ---\n{controller.log_tail()}")
        raise
    finally:
        controller.stop()


@pytest.fixture(scope="module")
def lws_operator(lws_cluster: Kubectl, lws: LwsController) -> Iterator[OperatorProcess]:
    process = OperatorProcess(lws_cluster, namespaces=(f"{PREFIX}*",))
    try:
        wait_for(process.alive, timeout=60, what="glm-operator liveness endpoint")
        yield process
    finally:
        process.stop()


def leader_worker_sets(kubectl: Kubectl, ns: str) -> list[dict[str, Any]]:
    return kubectl.items("leaderworkersets.leaderworkerset.x-k8s.io", "-n", ns)


def ready_groups(kubectl: Kubectl, ns: str, groups: int) -> list[dict[str, Any]] | None:
    """The pods of `groups` groups, once all run and the GLMService counts them ready."""
    pods = [p for p in group_pods(kubectl, ns) if not p["metadata"].get("deletionTimestamp")]
    status = glms(kubectl, ns, NAME).get("status", {})
    running = all(p.get("status", {}).get("phase") == "Running" for p in pods)
    if (len(pods) == groups * 3 and running and status.get("readyReplicas") == groups
            and status.get("replicas") == groups):
        return pods
    return None


def test_leader_worker_set_groups_run_and_the_service_counts_them(
        lws_cluster: Kubectl, lws: LwsController, lws_operator: OperatorProcess) -> None:
    kubectl = lws_cluster
    ns = f"{PREFIX}{uuid.uuid4().hex[:5]}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    wait_for(lambda: kubectl.exists("serviceaccount", "default", "-n", ns), timeout=30,
             what=f"ServiceAccount default in {ns}")
    try:
        kubectl.apply(MODEL_VERSION, namespace=ns)
        wait_for(lambda: kubectl.items("jobs", "-n", ns), timeout=60,
                 what=f"the fetch Job of {VERSION}")
        report_fetched(kubectl, ns, VERSION, size=MODEL_VERSION["spec"]["facts"]["sizeBytes"])
        service = json.loads(json.dumps(SERVICE))
        service["spec"]["accelerator"] = {"profile": "nvidia-l4", "count": 4, "nodes": 3}
        kubectl.apply(service, namespace=ns)

        # The operator renders a LeaderWorkerSet (no StatefulSet of its own) ...
        (lws_object,) = wait_for(lambda: leader_worker_sets(kubectl, ns), timeout=60,
                                 what="the LeaderWorkerSet")
        assert lws_object["metadata"]["name"] == SET
        assert lws_object["spec"]["leaderWorkerTemplate"]["size"] == 3
        # ... which lws-manager runs: a leader set and one worker set per group, its pods
        # labelled by its webhook, placed by the scheduler on three L4 nodes.
        pods = wait_for(lambda: ready_groups(kubectl, ns, 1), timeout=120,
                        what="one group of 3 running pods and the GLMService counting it")
        sets = {s["metadata"]["name"]: s for s in kubectl.items("statefulsets", "-n", ns)}
        assert set(sets) == {SET, f"{SET}-0"}
        assert all(s["metadata"]["labels"][LWS_NAME_LABEL] == SET for s in sets.values())
        nodes = {p["spec"]["nodeName"] for p in pods}
        assert len(nodes) == 3
        assert {node_labels(kubectl, n)["nvidia.com/gpu.product"] for n in nodes} == {L4}
        by_name = {p["metadata"]["name"]: p for p in pods}
        assert sorted(by_name) == [SET + "-0", SET + "-0-1", SET + "-0-2"]
        assert [by_name[n]["metadata"]["labels"][WORKER_INDEX_LABEL]
                for n in sorted(by_name)] == ["0", "1", "2"]
        for pod in pods:  # the stable names the leader's --rpc argv uses
            assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (
                pod["metadata"]["name"], SET)
        ready = next(c for c in glms(kubectl, ns, NAME)["status"]["conditions"]
                     if c["type"] == "Ready")
        assert ready["status"] == "True", ready

        # Scaled by whole groups through the LeaderWorkerSet's replicas.
        kubectl("patch", "glmservice", NAME, "-n", ns, "--type=merge",
                "-p", json.dumps({"spec": {"replicas": 2}}))
        wait_for(lambda: ready_groups(kubectl, ns, 2), timeout=120,
                 what="two groups of 3 running pods, counted ready")
        assert leader_worker_sets(kubectl, ns)[0]["spec"]["replicas"] == 2

        # Deleting the service takes the LeaderWorkerSet, its sets and pods with it.
        kubectl("delete", "glmservice", NAME, "-n", ns, "--wait=true", "--timeout=60s")
        wait_for(lambda: not leader_worker_sets(kubectl, ns)
                 and not kubectl.items("statefulsets", "-n", ns), timeout=90,
                 what="the LeaderWorkerSet and its StatefulSets garbage-collected")
    except BaseException:
        print(f"\n--- glm-operator log ---\n{lws_operator.tail(60)}")
        print(f"\n--- lws-manager log ---\n{lws.log_tail()}")
        print(kubectl.run("get", "lws,sts,pods", "-n", ns, "-o", "wide", check=False).stdout)
        raise
    finally:
        kubectl.run("delete", "namespace", ns, "--wait=false", check=False)
