"""The HPA the operator renders, driven by kube-controller-manager's real HPA controller.

The custom metrics API is served through the API server's aggregation layer by the upstream
custom-metrics-apiserver's test adapter (e2e/custom_metrics.py): the test writes a per-pod
value under the metric name the rendered HPA asks for (read from the HPA object, never
retyped), and the HPA controller reads it exactly as it would read prometheus-adapter's. The
operator is the real `glm-operator run`; pods run on kwok's CPU nodes. Two HPAs are driven:
the main pool's (1 -> 3 -> 1, and the operator keeping out of its way) and the long-context
pool's (woken to 1 as the gateway does, then grown on queued long requests).

Timings (metric change -> the HPA's desired replicas -> the Deployment's replicas) are printed
as `[figures]` lines (`pytest -s`); docs/performance.md records them.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from glm_operator.wellknown import LONG_CONTEXT_POOL, POOL_LABEL, SERVICE_LABEL

from e2e.cluster import HPA_SYNC_PERIOD
from e2e.custom_metrics import CustomMetricsAdapter, custom_metrics
from e2e.kubectl import Kubectl, wait_for
from e2e.operator_fixtures import OperatorProcess, glm_crds, prefixed_namespace
from e2e.test_operator import CPU_MV, CPU_SVC, deploy_model, wait_ready

__all__ = ["custom_metrics", "glm_crds"]  # fixtures used by name

PREFIX = "hpa-"  # namespaces no other operator of the session watches
SERVICE = "chat"
MAX_REPLICAS = 3  # the two CPU nodes hold them
SCALE_DOWN_WINDOW = 15  # seconds; the operator's default is 900
RESYNC_SECONDS = 2  # the operator reconciles every service this often, on top of events
QUEUE_TARGET = 2  # spec.autoscaling.targets.queueLength
POLL = 0.2
SYNC_SECONDS = float(HPA_SYNC_PERIOD.removesuffix("s"))

AUTOSCALING: dict[str, Any] = {
    "scaler": "HPA",  # not KEDA, even where its CRD is served
    "minReplicas": 1,
    "maxReplicas": MAX_REPLICAS,
    "targets": {"queueLength": QUEUE_TARGET},
    "behavior": {
        "scaleUp": {"stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": MAX_REPLICAS, "periodSeconds": 5}]},
        "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW,
                      "policies": [{"type": "Percent", "value": 100, "periodSeconds": 5}]},
    },
}


@pytest.fixture(scope="module")
def hpa_operator(glm_crds: list[str], kubectl: Kubectl) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kubectl, namespaces=(f"{PREFIX}*",),
                              extra_args=("--resync-seconds", str(RESYNC_SECONDS)))
    try:
        wait_for(process.alive, timeout=60, what="glm-operator liveness endpoint")
        yield process
    finally:
        process.stop()


@pytest.fixture
def ns(request: pytest.FixtureRequest, kubectl: Kubectl,
       hpa_operator: OperatorProcess) -> Iterator[str]:
    def explain(name: str) -> None:
        print(f"\n--- operator log ---\n{hpa_operator.tail(80)}")
        dump = kubectl.run("get", "hpa,deployments,pods,events", "-n", name, "-o", "wide",
                           check=False)
        print(f"\n--- namespace {name} ---\n{dump.stdout}{dump.stderr}")

    with prefixed_namespace(request, kubectl, PREFIX, explain) as name:
        yield name


# --- helpers -------------------------------------------------------------------------------


def serve_autoscaled(kubectl: Kubectl, ns: str) -> dict[str, Any]:
    """The CPU example with spec.autoscaling, Ready; returns the HPA the operator rendered."""
    deploy_model(kubectl, ns, CPU_MV, wait_for)
    svc = copy.deepcopy(CPU_SVC)
    svc["metadata"]["name"] = SERVICE
    svc["spec"].pop("replicas", None)
    svc["spec"]["autoscaling"] = AUTOSCALING
    kubectl.apply(svc, namespace=ns)
    wait_ready(kubectl, ns, SERVICE, wait_for)
    return hpa_of(kubectl, ns, "main")


def hpa_of(kubectl: Kubectl, ns: str, pool: str) -> dict[str, Any]:
    found = wait_for(lambda: kubectl.items("hpa", "-n", ns, "-l",
                                           f"{SERVICE_LABEL}={SERVICE},{POOL_LABEL}={pool}"),
                     timeout=30, what=f"the HPA of the {pool} pool")
    assert len(found) == 1, found
    return found[0]


def pods_metric_targets(hpa: dict[str, Any]) -> dict[str, str]:
    """metric name -> per-pod averageValue, as the rendered HPA asks the custom metrics API."""
    return {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"]
            for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}


def queue_metric(hpa: dict[str, Any]) -> str:
    """The metric the HPA compares with targets.queueLength (the one with its target)."""
    targets = pods_metric_targets(hpa)
    named = [name for name, value in targets.items() if value == str(QUEUE_TARGET)]
    assert len(named) == 1, f"one Pods metric with averageValue {QUEUE_TARGET}: {targets}"
    return named[0]


def target_deployment(kubectl: Kubectl, ns: str, hpa: dict[str, Any]) -> dict[str, Any]:
    return kubectl.get_json("deployment", hpa["spec"]["scaleTargetRef"]["name"], "-n", ns)


def pod_names(kubectl: Kubectl, ns: str, deployment: dict[str, Any]) -> list[str]:
    labels = deployment["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{key}={value}" for key, value in labels.items())
    return [p["metadata"]["name"] for p in kubectl.items("pods", "-n", ns, "-l", selector)
            if not p["metadata"].get("deletionTimestamp")]


def set_for_pods(adapter: CustomMetricsAdapter, kubectl: Kubectl, ns: str,
                 deployment: dict[str, Any], metrics: dict[str, str]) -> list[str]:
    """Every current pod of `deployment` reports `metrics` (name -> quantity)."""
    pods = pod_names(kubectl, ns, deployment)
    for pod in pods:
        for metric, value in metrics.items():
            adapter.set_pod_metric(ns, pod, metric, value)
    return pods


def desired(kubectl: Kubectl, ns: str, hpa: dict[str, Any]) -> int | None:
    status = kubectl.get_json("hpa", hpa["metadata"]["name"], "-n", ns).get("status", {})
    value = status.get("desiredReplicas")
    return int(value) if value is not None else None


class Clock:
    """Seconds since a metric change, for the printed figures."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def since(self) -> float:
        return time.monotonic() - self.start


def figure(what: str, seconds: float) -> None:
    print(f"[figures] {what}: {seconds:.1f} s (HPA sync period {HPA_SYNC_PERIOD})")


def scale_and_time(kubectl: Kubectl, ns: str, hpa: dict[str, Any], replicas: int,
                   direction: str, timeout: float, clock: Clock | None = None) -> float:
    """Wait for the HPA's desired replicas, then the Deployment's; print both times since
    `clock` started (the metric change; now by default) and return the first."""
    clock = clock or Clock()
    wait_for(lambda: desired(kubectl, ns, hpa) == replicas, timeout=timeout, interval=POLL,
             what=f"the HPA's desiredReplicas {replicas}")
    to_desired = clock.since()
    wait_for(lambda: target_deployment(kubectl, ns, hpa)["spec"]["replicas"] == replicas,
             timeout=30, interval=POLL, what=f"the Deployment's replicas {replicas}")
    figure(f"{direction}: metric change -> HPA desiredReplicas {replicas}", to_desired)
    figure(f"{direction}: metric change -> Deployment spec.replicas {replicas}", clock.since())
    return to_desired


def reconciles(operator: OperatorProcess) -> float:
    return operator.metric("glm_operator_reconciles_total", kind="GLMService", result="ok")


# --- tests ---------------------------------------------------------------------------------


def test_the_hpa_controller_scales_on_the_rendered_metric_and_the_operator_keeps_its_size(
        kubectl: Kubectl, ns: str, custom_metrics: CustomMetricsAdapter,
        hpa_operator: OperatorProcess) -> None:
    hpa = serve_autoscaled(kubectl, ns)
    assert hpa["spec"]["minReplicas"] == 1 and hpa["spec"]["maxReplicas"] == MAX_REPLICAS
    targets = pods_metric_targets(hpa)
    queue = queue_metric(hpa)
    quiet = {name: "0" for name in targets}
    deployment = target_deployment(kubectl, ns, hpa)
    assert deployment["spec"]["replicas"] == 1

    # Idle: every metric the HPA names at 0, and the HPA sees it through the aggregation
    # layer (a metric it cannot read would show as ScalingActive=False).
    pods = set_for_pods(custom_metrics, kubectl, ns, deployment, quiet)
    assert custom_metrics.pod_metrics(ns, queue) == {pods[0]: "0"}
    wait_for(lambda: desired(kubectl, ns, hpa) == 1, timeout=30, interval=POLL,
             what="the HPA to read the idle metrics")

    # A queue of 3 x the target on the one pod: 3 replicas (the most the HPA allows).
    set_for_pods(custom_metrics, kubectl, ns, deployment,
                 {**quiet, queue: str(QUEUE_TARGET * MAX_REPLICAS)})
    scale_and_time(kubectl, ns, hpa, MAX_REPLICAS, "scale up", timeout=60)
    wait_for(lambda: target_deployment(kubectl, ns, hpa)["status"].get("readyReplicas")
             == MAX_REPLICAS, timeout=60, what=f"{MAX_REPLICAS} ready pods")

    # Every pod still queued at the target: the HPA holds 3. The operator reconciles (events,
    # an edit of the GLMService, its 2 s resync) and never writes the Deployment's replicas.
    deployment = target_deployment(kubectl, ns, hpa)
    set_for_pods(custom_metrics, kubectl, ns, deployment, {**quiet, queue: str(QUEUE_TARGET)})
    generation = deployment["metadata"]["generation"]
    before = reconciles(hpa_operator)
    for touch in range(3):
        kubectl("annotate", "glmservice", SERVICE, "-n", ns, f"e2e.glm-operator.dev/touch={touch}",
                "--overwrite")
        time.sleep(RESYNC_SECONDS)
    wait_for(lambda: reconciles(hpa_operator) >= before + 3, timeout=30,
             what="three reconciles of the GLMService")
    after = target_deployment(kubectl, ns, hpa)
    assert after["spec"]["replicas"] == MAX_REPLICAS
    assert after["metadata"]["generation"] == generation, "the operator rewrote the Deployment"
    assert desired(kubectl, ns, hpa) == MAX_REPLICAS

    # Quiet again: down to minReplicas, once the (shortened) stabilisation window has passed.
    set_for_pods(custom_metrics, kubectl, ns, after, quiet)
    took = scale_and_time(kubectl, ns, hpa, 1, "scale down", timeout=SCALE_DOWN_WINDOW + 45)
    # Not before the window: the HPA keeps the highest recommendation of the last 15 s, and
    # the last high one was made at most one sync period (and a little jitter) before.
    assert took >= SCALE_DOWN_WINDOW - SYNC_SECONDS - 1, took
    status = kubectl.get_json("hpa", hpa["metadata"]["name"], "-n", ns)["status"]
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    assert conditions.get("ScalingActive") == "True", json.dumps(status)


LONG_CONTEXT_MAX = 2  # with the main pool's pod, three pods on the two CPU nodes


def test_the_long_context_pools_hpa_grows_a_woken_pool_on_queued_long_requests(
        kubectl: Kubectl, ns: str, custom_metrics: CustomMetricsAdapter) -> None:
    deploy_model(kubectl, ns, CPU_MV, wait_for)
    svc = copy.deepcopy(CPU_SVC)
    svc["metadata"]["name"] = SERVICE
    # idleSeconds far beyond the test: the operator's idle scale-down stays out of it.
    svc["spec"]["longContext"] = {
        "contextLength": 32768, "idleSeconds": 3600,
        "autoscaling": {"minReplicas": 0, "maxReplicas": LONG_CONTEXT_MAX,
                        "targets": {"queueLength": 1}}}
    kubectl.apply(svc, namespace=ns)
    wait_ready(kubectl, ns, SERVICE, wait_for)
    hpa = hpa_of(kubectl, ns, LONG_CONTEXT_POOL)
    assert hpa["spec"]["maxReplicas"] == LONG_CONTEXT_MAX
    (queue, target), = pods_metric_targets(hpa).items()
    pool = target_deployment(kubectl, ns, hpa)
    assert pool["spec"]["replicas"] == 0  # asleep until a long request comes

    # The gateway's wake: the pool's scale subresource set to 1.
    kubectl("scale", "deployment", pool["metadata"]["name"], "-n", ns, "--replicas=1")
    wait_for(lambda: target_deployment(kubectl, ns, hpa)["status"].get("readyReplicas") == 1,
             timeout=60, what="the woken pool's pod ready")
    # Long requests queued at the pool's one pod: LONG_CONTEXT_MAX x the per-replica target.
    quantity = str(int(float(target) * LONG_CONTEXT_MAX))
    set_for_pods(custom_metrics, kubectl, ns, pool, {queue: quantity})
    changed = Clock()
    # The pool's HPA keeps the slow-start defaults: it reads the queue, then holds the scale-up
    # until its stabilisation window has passed.
    window = hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"]
    wait_for(lambda: any(c["type"] == "AbleToScale" and c["reason"] == "ScaleUpStabilized"
                         for c in kubectl.get_json("hpa", hpa["metadata"]["name"], "-n", ns)
                         .get("status", {}).get("conditions", [])),
             timeout=30, interval=POLL, what="the pool's HPA holding the scale-up (its window)")
    scale_and_time(kubectl, ns, hpa, LONG_CONTEXT_MAX,
                   f"long-context pool 1 -> N (scale-up window {window} s)", timeout=window + 60,
                   clock=changed)
