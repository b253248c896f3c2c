"""Reconcile benchmark: N GLMServices at once, side by side with a plain client loop.

    python -m bench.reconcile [--services 100] [--idle-seconds 600]

On the local control plane (started if needed) it measures, in one run:
  1. floor: the children of N services (rendered offline by the same renderer) created
     directly by a plain kubernetes-client loop, until every Deployment has a ready pod;
  2. operator: N GLMServices applied at once, until every one reports Ready=True;
  3. the ratio operator / floor (target <= 1.5);
  4. API write requests the operator makes while nothing changes (target 0);
  5. the operator's peak RSS (target < 200 MiB at 500 services).
The figures go to docs/performance.md by hand; the script prints them.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from e2e import cluster as local_cluster
from e2e.kubectl import Kubectl, wait_for
from e2e.operator_fixtures import CRDS, OperatorProcess, report_fetched

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "cpu-llamacpp"
WRITE_VERBS = ("apply", "patch", "create", "delete", "update")
BENCH_NODES = 4


def bench_nodes(kubectl: Kubectl, pods_per_node: int) -> list[str]:
    """Fake CPU nodes big enough for every bench pod (kwok plays their kubelet)."""
    names = [f"bench-cpu-{i}" for i in range(BENCH_NODES)]
    capacity = {"cpu": "4000", "memory": "64Ti", "pods": str(pods_per_node)}
    nodes = [{
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/hostname": n, "type": "kwok",
                                "glm-operator.dev/bench": "true",
                                "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
        "status": {"capacity": capacity, "allocatable": capacity},
    } for n in names]
    kubectl.apply(nodes)
    return names


def services(n: int) -> list[dict[str, Any]]:
    svc = yaml.safe_load((EXAMPLE / "glmservice.yaml").read_text())
    out = []
    for i in range(n):
        s = copy.deepcopy(svc)
        s["metadata"]["name"] = f"bench-{i:04d}"
        out.append(s)
    return out


def ready_count(kubectl: Kubectl, namespace: str) -> int:
    items = kubectl.items("glmservices", "-n", namespace)
    return sum(1 for o in items if any(c["type"] == "Ready" and c["status"] == "True"
                                       for c in o.get("status", {}).get("conditions", [])))


def deployments_ready(kubectl: Kubectl, namespace: str) -> int:
    return sum(1 for d in kubectl.items("deployments", "-n", namespace)
               if d.get("status", {}).get("readyReplicas", 0) >= 1)


def prepare_namespace(kubectl: Kubectl, prefix: str, mv: dict[str, Any]) -> str:
    namespace = f"{prefix}-{uuid.uuid4().hex[:5]}"
    kubectl("create", "namespace", namespace)
    kubectl.apply(mv, namespace=namespace)
    return namespace


def run_floor(kubectl: Kubectl, mv: dict[str, Any], n: int) -> float:
    """Create the same children with a plain client loop (no operator) and time it."""
    from glm_operator.kube.client import KubeClient

    namespace = prepare_namespace(kubectl, "bench-floor", mv)
    report_fetched(kubectl, namespace, mv["metadata"]["name"])
    fetched = kubectl.get_json("modelversion", mv["metadata"]["name"], "-n", namespace)
    from glm_operator.api import ModelVersion
    from glm_operator.config import OperatorConfig
    from glm_operator.render.modelversion import render_model_version

    # The ModelVersion's own children (the cache PVC the pods mount) come first, as the
    # operator would create them.
    children = render_model_version(ModelVersion.model_validate(fetched), OperatorConfig())
    for svc in services(n):
        svc["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), generation=1)
        children += render_children(svc, fetched)
    client = KubeClient.from_environment(str(kubectl.kubeconfig))
    started = time.monotonic()
    for obj in children:
        obj["metadata"].pop("ownerReferences", None)  # the fake owners do not exist
        client.apply(obj, field_manager="bench-floor")
    wait_for(lambda: deployments_ready(kubectl, namespace) >= n, timeout=1800,
             interval=1, what="floor Deployments ready")
    elapsed = time.monotonic() - started
    kubectl("delete", "namespace", namespace, "--wait=false")
    return elapsed


def render_children(svc: dict[str, Any], mv: dict[str, Any]) -> list[dict[str, Any]]:
    from glm_operator.api import GLMService, ModelVersion
    from glm_operator.config import OperatorConfig
    from glm_operator.planning.from_api import plan_request_for
    from glm_operator.planning.planner import plan
    from glm_operator.render.service import Capabilities, ServiceInputs, render_service

    service, model = GLMService.model_validate(svc), ModelVersion.model_validate(mv)
    inputs = ServiceInputs(service=service, model_version=model,
                           plan=plan(plan_request_for(service, model)), long_context_plan=None,
                           config=OperatorConfig(), capabilities=Capabilities())
    return render_service(inputs)


def api_writes(operator: OperatorProcess) -> float:
    return sum(operator.metric("glm_operator_api_requests_total", verb=v) for v in WRITE_VERBS)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=100)
    parser.add_argument("--idle-seconds", type=int, default=600)
    args = parser.parse_args(argv)
    n = args.services

    kubectl = local_cluster.up()  # a no-op when the local control plane is already up
    kubectl.apply_files(CRDS, field_manager="bench")
    nodes = bench_nodes(kubectl, pods_per_node=max(110, 2 * n // BENCH_NODES + 10))
    mv = yaml.safe_load((EXAMPLE / "modelversion.yaml").read_text())

    floor = run_floor(kubectl, mv, n)
    print(f"floor: {n} services' children created directly, all pods ready in {floor:.1f}s",
          flush=True)

    from glm_operator.kube.client import KubeClient

    client = KubeClient.from_environment(str(kubectl.kubeconfig))
    operator = OperatorProcess(kubectl, namespaces=("bench-op-*",))
    try:
        wait_for(operator.alive, timeout=60, what="operator liveness")
        namespace = prepare_namespace(kubectl, "bench-op", mv)
        wait_for(lambda: kubectl.items("jobs", "-n", namespace), timeout=60,
                 what="fetch Job")
        report_fetched(kubectl, namespace, mv["metadata"]["name"])
        started = time.monotonic()
        for svc in services(n):  # the same plain client loop as the floor's
            svc["metadata"]["namespace"] = namespace
            client.apply(svc, field_manager="bench")
        wait_for(lambda: ready_count(kubectl, namespace) >= n, timeout=1800, interval=1,
                 what=f"{n} GLMServices Ready")
        elapsed = time.monotonic() - started
        print(f"operator: {n} GLMServices Ready in {elapsed:.1f}s", flush=True)
        print(f"ratio operator/floor: {elapsed / floor:.2f} (target <= 1.5)", flush=True)
        runs = {result: operator.metric("glm_operator_reconciles_total", kind="GLMService",
                                        result=result) for result in ("ok", "coalesced")}
        print(f"GLMService reconciles until Ready: {runs['ok']:.0f} run, "
              f"{runs['coalesced']:.0f} events collapsed into a waiting one", flush=True)

        time.sleep(10)  # the last readiness events settle
        before = api_writes(operator)
        time.sleep(args.idle_seconds)
        idle_writes = api_writes(operator) - before
        print(f"API writes during {args.idle_seconds}s idle: {idle_writes:.0f} (target 0)")
        rss = peak_rss_mib(operator.proc.pid)
        print(f"operator peak RSS: {rss:.0f} MiB at {n} services (target < 200 MiB at 500)")
        print(json.dumps({"services": n, "floor_s": round(floor, 1),
                          "operator_s": round(elapsed, 1), "ratio": round(elapsed / floor, 2),
                          "reconciles": runs["ok"], "coalesced": runs["coalesced"],
                          "idle_seconds": args.idle_seconds, "idle_writes": idle_writes,
                          "peak_rss_mib": round(rss)}))
        kubectl("delete", "namespace", namespace, "--wait=false")
    finally:
        operator.stop()
        kubectl("delete", "node", *nodes, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
