"""High availability: operator replicas on one Lease, the real processes on the real API server.

Two `glm-operator run --leader-elect` processes share a Lease, as the chart's replicas do.
Only the holder reconciles; the other makes no request but the Lease's. SIGKILL the leader
and the other takes over once the Lease expires and reconciles what was created meanwhile;
what the first one reconciled is not written again. A leader that stops gracefully hands the
Lease over at once; one whose Lease is taken exits at once. The measured times go to
docs/ha.md (run with `-s` to see them).
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from e2e import cluster as local_cluster
from e2e.kubectl import Kubectl
from e2e.operator_fixtures import REPO, OperatorProcess, glm_crds
from e2e.ports import free_port
from e2e.test_operator import CPU_MV, CPU_SVC, condition, deploy_model, wait_ready

__all__ = ["glm_crds"]  # fixture used by name

Wait = Callable[..., Any]
# The chart's defaults (values.yaml leaderElection).
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 15.0, 10.0, 2.0


class OperatorReplica(OperatorProcess):
    """`glm-operator run --leader-elect`, with any kubeconfig (admin, or a ServiceAccount's)."""

    def __init__(self, kubeconfig: Path, namespaces: Sequence[str], *, lease: str,
                 lease_namespace: str, identity: str, extra: Sequence[str] = ()) -> None:
        self.identity = identity
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (lives as long as the process)
            prefix=f"glm-operator-{identity}-", suffix=".log", delete=False)
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
        env.pop("POD_NAME", None)
        env.pop("POD_NAMESPACE", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "glm_operator.cli", "run",
             *(arg for ns in namespaces for arg in ("--namespace", ns)),
             "--kubeconfig", str(kubeconfig),
             "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
             "--metrics-port", str(self.metrics_port),
             "--leader-elect", "--leader-elect-lease", lease,
             "--leader-elect-namespace", lease_namespace,
             "--leader-elect-identity", identity,
             "--leader-elect-lease-duration", str(LEASE_DURATION),
             "--leader-elect-renew-deadline", str(RENEW_DEADLINE),
             "--leader-elect-retry-period", str(RETRY_PERIOD),
             *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
        )

    def requests_except_lease(self) -> float:
        """API requests other than the Lease's (the operator's own client)."""
        return (self.metric("glm_operator_api_requests_total")
                - self.metric("glm_operator_api_requests_total", kind="Lease"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            super().stop()


def make_namespace(kubectl: Kubectl, prefix: str) -> str:
    """A fresh namespace `<prefix>-<random>`, with its default ServiceAccount ready."""
    # Claims of earlier tests' deleted namespaces left their PVs Released; offer them again.
    local_cluster.recycle_released_volumes(kubectl)
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    deadline = time.monotonic() + 30
    while not kubectl.exists("serviceaccount", "default", "-n", name):
        assert time.monotonic() < deadline, f"no default ServiceAccount in {name}"
        time.sleep(0.3)
    return name


@pytest.fixture
def ha_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A namespace no other operator watches (the session operator watches e2e-*)."""
    name = make_namespace(kubectl, "glmha")
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def lease_holder(kubectl: Kubectl, namespace: str, name: str) -> str:
    lease = kubectl.get_json("lease", name, "-n", namespace)
    return str(lease.get("spec", {}).get("holderIdentity") or "")


def operator_managed_times(kubectl: Kubectl, namespace: str, service: str) -> dict[str, str]:
    """kind/name -> when the operator's field manager last wrote each child of a service."""
    times = {}
    for kind in ("deployments", "services", "serviceaccounts", "roles", "rolebindings", "hpa"):
        for obj in kubectl.items(kind, "-n", namespace, "-l",
                                 f"glm-operator.dev/service={service}",
                                 "--show-managed-fields"):
            for entry in obj["metadata"].get("managedFields", []):
                if entry["manager"] == "glm-operator":
                    times[f"{obj['kind']}/{obj['metadata']['name']}"] = entry["time"]
    return times


def start_pair(kubectl: Kubectl, namespace: str, wait_for: Wait,
               lease: str) -> tuple[OperatorReplica, OperatorReplica]:
    first = OperatorReplica(kubectl.kubeconfig, (f"{namespace}",), lease=lease,
                            lease_namespace=namespace, identity="replica-a")
    wait_for(first.alive, timeout=60, what="replica-a's liveness endpoint")
    wait_for(lambda: lease_holder(kubectl, namespace, lease) == "replica-a", timeout=30,
             what="replica-a holding the Lease")
    second = OperatorReplica(kubectl.kubeconfig, (f"{namespace}",), lease=lease,
                             lease_namespace=namespace, identity="replica-b")
    wait_for(second.alive, timeout=60, what="replica-b's liveness endpoint (as a follower)")
    return first, second


def test_only_the_leader_reconciles_and_a_follower_takes_over_after_sigkill(
        glm_crds: list[str], kubectl: Kubectl, ha_namespace: str, wait_for: Wait) -> None:
    ns, lease = ha_namespace, "glm-operator"
    leader, follower = start_pair(kubectl, ns, wait_for, lease)
    try:
        # The leader serves a model; the follower only watches the Lease.
        deploy_model(kubectl, ns, CPU_MV, wait_for)
        kubectl.apply(CPU_SVC, namespace=ns)
        first = CPU_SVC["metadata"]["name"]
        wait_ready(kubectl, ns, first, wait_for)
        assert lease_holder(kubectl, ns, lease) == "replica-a"
        assert leader.metric("glm_operator_leader", lease=lease) == 1
        assert follower.metric("glm_operator_leader", lease=lease) == 0
        assert leader.metric("glm_operator_reconciles_total", result="ok") > 0
        assert leader.metric("glm_operator_api_requests_total", verb="apply") > 0
        assert follower.metric("glm_operator_reconciles_total") == 0
        assert follower.requests_except_lease() == 0
        assert follower.metric("glm_operator_api_requests_total", kind="Lease", verb="patch") == 0
        written_before = operator_managed_times(kubectl, ns, first)
        assert written_before, "the leader wrote the children"
        transitions = kubectl.get_json("lease", lease, "-n", ns)["spec"]["leaseTransitions"]

        # SIGKILL: no hand-over. A new GLMService arrives while nobody leads.
        killed = time.monotonic()
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait(timeout=10)
        second = copy.deepcopy(CPU_SVC)
        second["metadata"]["name"] = "glm-chat-cpu-2"
        kubectl.apply(second, namespace=ns)

        wait_for(lambda: lease_holder(kubectl, ns, lease) == "replica-b",
                 timeout=LEASE_DURATION + 4 * RETRY_PERIOD + 10, interval=0.1,
                 what="replica-b taking the Lease")
        took_over = time.monotonic() - killed
        wait_for(lambda: condition(kubectl.get_json("glmservice", "glm-chat-cpu-2", "-n", ns),
                                   "Planned"), timeout=60, interval=0.2,
                 what="the new GLMService reconciled by replica-b")
        reconciled = time.monotonic() - killed
        wait_ready(kubectl, ns, "glm-chat-cpu-2", wait_for)
        ready = time.monotonic() - killed
        print(f"\nfailover after SIGKILL: Lease taken {took_over:.1f}s, new GLMService "
              f"reconciled {reconciled:.1f}s, Ready {ready:.1f}s after the kill "
              f"(lease {LEASE_DURATION:g}s, retry {RETRY_PERIOD:g}s)")

        # Within the Lease duration (as the follower observed it) plus one retry period.
        assert took_over <= LEASE_DURATION + 2 * RETRY_PERIOD + 2, took_over
        assert took_over >= LEASE_DURATION - RETRY_PERIOD - 1, "taken before it expired"
        spec = kubectl.get_json("lease", lease, "-n", ns)["spec"]
        assert spec["leaseTransitions"] == transitions + 1
        assert follower.metric("glm_operator_leader", lease=lease) == 1
        # Nothing the first leader reconciled is written again: resume finds no drift.
        time.sleep(2)
        assert operator_managed_times(kubectl, ns, first) == written_before
        svc = kubectl.get_json("glmservice", first, "-n", ns)
        assert condition(svc, "Ready")["status"] == "True"  # type: ignore[index]
    except BaseException:
        print(f"--- replica-a ---\n{leader.tail()}\n--- replica-b ---\n{follower.tail()}")
        raise
    finally:
        leader.stop()
        follower.stop()


def test_a_stopping_leader_hands_the_lease_over_at_once(
        glm_crds: list[str], kubectl: Kubectl, ha_namespace: str, wait_for: Wait) -> None:
    ns, lease = ha_namespace, "glm-operator"
    leader, follower = start_pair(kubectl, ns, wait_for, lease)
    try:
        stopped = time.monotonic()
        leader.proc.send_signal(signal.SIGTERM)  # a rolling update, a drain
        wait_for(lambda: lease_holder(kubectl, ns, lease) == "replica-b", timeout=30,
                 interval=0.1, what="replica-b taking the released Lease")
        handed_over = time.monotonic() - stopped
        assert leader.proc.wait(timeout=30) == 0
        print(f"\nhand-over on SIGTERM: {handed_over:.1f}s")
        assert handed_over < LEASE_DURATION / 2, handed_over
        assert "released the Lease" in Path(leader.log.name).read_text()
    finally:
        leader.stop()
        follower.stop()


def test_a_leader_whose_lease_is_taken_exits_at_once(
        glm_crds: list[str], kubectl: Kubectl, ha_namespace: str, wait_for: Wait) -> None:
    ns, lease = ha_namespace, "glm-operator"
    leader = OperatorReplica(kubectl.kubeconfig, (ns,), lease=lease, lease_namespace=ns,
                             identity="replica-a")
    try:
        wait_for(lambda: lease_holder(kubectl, ns, lease) == "replica-a", timeout=60,
                 what="replica-a holding the Lease")
        wait_for(leader.alive, timeout=60, what="replica-a's liveness endpoint")
        kubectl("patch", "lease", lease, "-n", ns, "--type=merge",
                "-p", '{"spec": {"holderIdentity": "someone-else"}}')
        code = leader.proc.wait(timeout=RETRY_PERIOD + 10)
        assert code == 3, leader.tail()  # LOST_LEASE_EXIT: the pod restarts as a follower
        assert "lost the Lease" in leader.tail()
        assert lease_holder(kubectl, ns, lease) == "someone-else"  # and it did not fight back
    finally:
        leader.stop()
