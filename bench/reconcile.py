"""Reconcile benchmark: N GLMServices at once, side by side with a plain client loop.

    python -m bench.reconcile [--services 100,500,1000,2000] [--idle-seconds 60]
                              [--baseline GIT_REF[,GIT_REF]]

On the local control plane (started if needed) it measures, for each N of the curve, in one
run:
  1. floor: the children of N services (decided offline by the operator's own code, with
     the cluster's optional CRDs, so Istio routing and ServiceMonitors included) created
     directly by a plain kubernetes-client loop, until every Deployment has a ready pod;
  2. operator: N GLMServices applied at once, until every one reports Ready=True;
  3. the ratio operator / floor (target <= 1.2);
  4. API requests per reconcile while converging (every verb, reads included);
  5. API write requests the operator makes while nothing changes (target 0);
  6. the time for one changed service to be re-reconciled while the others are idle
     (median of a few changes; it must not grow with N);
  7. the operator's peak RSS (target < 300 MiB at 2,000 services).
Each N gets a fresh operator process and fresh namespaces, deleted (and waited for) before
the next N. `--baseline REF` adds, per N, an operator run from the package as of git REF
before this tree's, against the same floor: a change measured against the code before it, in
one run on one machine. The figures go to docs/performance.md by hand; the script prints
them, and one JSON line per N and operator.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from bench.baseline import export_operator
from e2e import cluster as local_cluster
from e2e.kubectl import Kubectl, wait_for
from e2e.operator_fixtures import CRDS, OperatorProcess, report_fetched

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "cpu-llamacpp"
WRITE_VERBS = ("apply", "patch", "create", "delete", "update")
ALL_VERBS = (*WRITE_VERBS, "get", "list")
BENCH_NODES = 4
SINGLE_CHANGES = 5


def bench_nodes(kubectl: Kubectl, pods_per_node: int) -> list[str]:
    """Fake CPU nodes big enough for every bench pod (kwok plays their kubelet)."""
    names = [f"bench-cpu-{i}" for i in range(BENCH_NODES)]
    capacity = {"cpu": "40000", "memory": "640Ti", "pods": str(pods_per_node)}
    nodes: list[dict[str, Any]] = [{
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/hostname": n, "type": "kwok",
                                "glm-operator.dev/bench": "true",
                                "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
        "status": {"capacity": capacity, "allocatable": capacity},
    } for n in names]
    kubectl.apply(nodes)
    for node in nodes:  # kwok may have initialised the status first: set it again
        kubectl("patch", "node", node["metadata"]["name"], "--subresource=status",
                "--type=merge", "-p", json.dumps({"status": node["status"]}))
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


def delete_namespace(kubectl: Kubectl, namespace: str) -> None:
    """Delete and wait until it is gone, so its garbage collection does not load the next
    measurement."""
    kubectl("delete", "namespace", namespace, "--wait=false")
    wait_for(lambda: not kubectl.exists("namespace", namespace), timeout=1800, interval=2,
             what=f"namespace {namespace} deleted")


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
    capabilities = cluster_capabilities(str(kubectl.kubeconfig))
    for svc in services(n):
        svc["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), generation=1)
        children += render_children(svc, fetched, capabilities)
    client = KubeClient.from_environment(str(kubectl.kubeconfig))
    started = time.monotonic()
    for obj in children:
        obj["metadata"].pop("ownerReferences", None)  # the fake owners do not exist
        client.apply(obj, field_manager="bench-floor")
    wait_for(lambda: deployments_ready(kubectl, namespace) >= n, timeout=3600,
             interval=1, what="floor Deployments ready")
    elapsed = time.monotonic() - started
    delete_namespace(kubectl, namespace)
    return elapsed


def render_children(svc: dict[str, Any], mv: dict[str, Any],
                    capabilities: Any = None) -> list[dict[str, Any]]:
    """What the operator would hold for this service, decided offline by the operator's own
    code with the cluster's optional CRDs (Istio, ServiceMonitor): the floor creates the
    same objects the operator does."""
    from glm_operator.api import GLMService
    from glm_operator.config import OperatorConfig
    from glm_operator.decide.observed import ServiceObservation
    from glm_operator.decide.service import decide_service
    from glm_operator.render.service import Capabilities

    config = OperatorConfig()
    decision = decide_service(ServiceObservation(
        service=GLMService.model_validate(svc), model_versions={mv["metadata"]["name"]: mv},
        capabilities=capabilities or Capabilities()), config, config.profiles)
    return decision.desired


def cluster_capabilities(kubeconfig: str) -> Any:
    from glm_operator.kube.client import KubeClient
    from glm_operator.render.service import Capabilities

    kube = KubeClient.from_environment(kubeconfig)
    return Capabilities(
        service_monitor=kube.crd_established("servicemonitors.monitoring.coreos.com"),
        istio=(kube.crd_established("virtualservices.networking.istio.io")
               and kube.crd_established("destinationrules.networking.istio.io")))


def api_requests(operator: OperatorProcess, verbs: tuple[str, ...]) -> float:
    text = operator.metrics()
    return sum(_sample_sum(text, "glm_operator_api_requests_total", verb=v) for v in verbs)


def _sample_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def reconciles(operator: OperatorProcess) -> float:
    return operator.metric("glm_operator_reconciles_total", kind="GLMService", result="ok")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def single_change_seconds(client: Any, namespace: str, name: str, version: str,
                          context: int) -> float:
    """Change one service's spec and time until the operator has re-rendered it: the
    Deployment's engine arguments carry the new context length and the status observed the
    generation. Polled with one client every 50 ms (two GETs by name per poll, so the poll
    costs the same at any N)."""
    from glm_operator.render.deployment import deployment_name
    from glm_operator.wellknown import GROUP, MAIN_POOL, VERSION

    api = f"{GROUP}/{VERSION}"
    started = time.monotonic()
    written = client.patch_merge(api, "GLMService", namespace, name,
                                 {"spec": {"contextLength": context}})
    generation = written["metadata"]["generation"]
    deadline = started + 300
    while time.monotonic() < deadline:
        body = client.get(api, "GLMService", namespace, name) or {}
        if (body.get("status") or {}).get("observedGeneration") == generation:
            deployment = client.get("apps/v1", "Deployment", namespace,
                                    deployment_name(name, version, MAIN_POOL)) or {}
            if str(context) in json.dumps(deployment.get("spec", {}).get("template", {})):
                return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError(f"GLMService {name} not re-reconciled within 300 s")


def measure(kubectl: Kubectl, mv: dict[str, Any], n: int, idle_seconds: int,
            baselines: dict[str, Path]) -> list[dict[str, Any]]:
    """The floor once, then each arm: the baselines' operators, then this tree's."""
    floor = run_floor(kubectl, mv, n)
    print(f"[{n}] floor: children created directly, all pods ready in {floor:.1f}s", flush=True)
    arms: list[tuple[str, Path | None]] = [*baselines.items(), ("this tree", None)]
    return [measure_operator(kubectl, mv, n, idle_seconds, floor, arm, package)
            for arm, package in arms]


def measure_operator(kubectl: Kubectl, mv: dict[str, Any], n: int, idle_seconds: int,
                     floor: float, arm: str, package: Path | None) -> dict[str, Any]:
    from glm_operator.kube.client import KubeClient

    client = KubeClient.from_environment(str(kubectl.kubeconfig))
    operator = OperatorProcess(kubectl, namespaces=("bench-op-*",), package=package)
    n_arm = f"{n} {arm}"
    try:
        wait_for(operator.alive, timeout=60, what="operator liveness")
        namespace = prepare_namespace(kubectl, "bench-op", mv)
        wait_for(lambda: kubectl.items("jobs", "-n", namespace), timeout=60,
                 what="fetch Job")
        report_fetched(kubectl, namespace, mv["metadata"]["name"])
        requests_before = api_requests(operator, ALL_VERBS)
        reconciles_before = reconciles(operator)
        started = time.monotonic()
        for svc in services(n):  # the same plain client loop as the floor's
            svc["metadata"]["namespace"] = namespace
            client.apply(svc, field_manager="bench")
        wait_for(lambda: ready_count(kubectl, namespace) >= n, timeout=3600, interval=1,
                 what=f"{n} GLMServices Ready")
        elapsed = time.monotonic() - started
        runs = reconciles(operator) - reconciles_before
        per_reconcile = (api_requests(operator, ALL_VERBS) - requests_before) / max(runs, 1)
        coalesced = operator.metric("glm_operator_reconciles_total", kind="GLMService",
                                    result="coalesced")
        print(f"[{n_arm}] operator: GLMServices Ready in {elapsed:.1f}s; ratio "
              f"{elapsed / floor:.2f} (target <= 1.2); {runs:.0f} reconciles, {coalesced:.0f} "
              f"events collapsed, {per_reconcile:.2f} API requests per reconcile", flush=True)

        time.sleep(10)  # the last readiness events settle
        before = api_requests(operator, WRITE_VERBS)
        time.sleep(idle_seconds)
        idle_writes = api_requests(operator, WRITE_VERBS) - before
        print(f"[{n_arm}] API writes during {idle_seconds}s idle: {idle_writes:.0f} (target 0)",
              flush=True)

        step = max(1, n // SINGLE_CHANGES)
        changes = [single_change_seconds(client, namespace, f"bench-{i * step:04d}",
                                         mv["metadata"]["name"], 4096)
                   for i in range(min(SINGLE_CHANGES, n))]
        single = statistics.median(changes)
        print(f"[{n_arm}] one changed service re-reconciled in {single:.2f}s (median of "
              f"{len(changes)}: {', '.join(f'{c:.2f}' for c in changes)})", flush=True)
        rss = peak_rss_mib(operator.proc.pid)
        print(f"[{n_arm}] operator peak RSS: {rss:.0f} MiB", flush=True)
        result = {"services": n, "arm": arm, "floor_s": round(floor, 1),
                  "operator_s": round(elapsed, 1),
                  "ratio": round(elapsed / floor, 2), "reconciles": runs,
                  "coalesced": coalesced, "requests_per_reconcile": round(per_reconcile, 2),
                  "idle_seconds": idle_seconds, "idle_writes": idle_writes,
                  "single_change_s": round(single, 2), "peak_rss_mib": round(rss)}
        print(json.dumps(result), flush=True)
    except BaseException:
        print(f"[{n_arm}] operator log:\n{operator.tail(60)}", flush=True)
        raise
    finally:
        operator.stop()
    delete_namespace(kubectl, namespace)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", default="100",
                        help="comma-separated counts, measured in this order (the curve)")
    parser.add_argument("--idle-seconds", type=int, default=60)
    parser.add_argument("--baseline", metavar="GIT_REF[,GIT_REF]", default="",
                        help="also run the operator as of these git revisions, side by side")
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.services.split(",")]

    kubectl = local_cluster.up()  # a no-op when the local control plane is already up
    kubectl.apply_files(CRDS, field_manager="bench")
    nodes = bench_nodes(kubectl, pods_per_node=max(110, 2 * max(counts) // BENCH_NODES + 10))
    mv = yaml.safe_load((EXAMPLE / "modelversion.yaml").read_text())
    work = Path(tempfile.mkdtemp(prefix="bench-reconcile-"))
    baselines = {f"baseline {ref}": export_operator(ref, work / ref)
                 for ref in filter(None, args.baseline.split(","))}
    try:
        results = [r for n in counts for r in measure(kubectl, mv, n, args.idle_seconds,
                                                      baselines)]
    finally:
        kubectl("delete", "node", *nodes, check=False)
        shutil.rmtree(work, ignore_errors=True)
    print("\n| N | operator | floor | operator | ratio | requests/reconcile | idle writes | "
          "single change | peak RSS |")
    for r in results:
        print(f"| {r['services']} | {r['arm']} | {r['floor_s']} s | {r['operator_s']} s | "
              f"{r['ratio']} | "
              f"{r['requests_per_reconcile']} | {r['idle_writes']:.0f} in {r['idle_seconds']} s "
              f"| {r['single_change_s']} s | {r['peak_rss_mib']} MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
