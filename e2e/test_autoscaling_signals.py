"""Every autoscaling target, through kube-controller-manager's real HPA controller.

For each target the API offers (requestsPerSecond, queueLength, kvCacheUtilization, and the
device-memory guard acceleratorMemoryUtilization, which the operator keeps only above the
plan's steady device memory, so it is tested on a GPU profile), the operator renders the
HPA and the test writes per-pod values through the upstream custom-metrics test adapter
(e2e/custom_metrics.py), under the metric name read from the rendered HPA. The per-pod value
goes up, and the HPA must scale to exactly what the autoscaling/v2 replica calculator gives
(`hpa_replicas` below: desired = ceil(current * usage / target), unchanged within the 0.1
tolerance, clamped to the HPA's bounds); it goes down, and the HPA must hold until the
scale-down stabilisation window (shortened through spec.autoscaling.behavior) has passed.
With several targets the HPA must follow the largest recommendation, whichever target
makes it.

The values below are chosen so that the expectation is unambiguous (usage ratios far from
the tolerance band) and under maxReplicas; the test computes it from the formula.
Timings are printed as `[figures]` lines (`pytest -s`).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from glm_operator.render.quantity import decimal_quantity
from glm_operator.render.scaling_metrics import BY_TARGET_FIELD

from e2e.custom_metrics import CustomMetricsAdapter, custom_metrics
from e2e.kubectl import Kubectl, wait_for
from e2e.operator_fixtures import OperatorProcess, glm_crds, prefixed_namespace
from e2e.test_autoscaling import (
    POLL,
    SERVICE,
    SYNC_SECONDS,
    desired,
    hpa_of,
    pod_names,
    pods_metric_targets,
    scale_and_time,
    target_deployment,
)
from e2e.test_operator import CPU_MV, CPU_SVC, condition, deploy_model, example, wait_ready

__all__ = ["custom_metrics", "glm_crds"]  # fixtures used by name

PREFIX = "hpas-"  # namespaces no other operator of the session watches
MAX_REPLICAS = 5  # CPU pods request 8.25 cores: three fit on each 32-core CPU node
SCALE_DOWN_WINDOW = 15  # seconds; the operator's default is 900
TOLERANCE = 0.1  # kube-controller-manager's --horizontal-pod-autoscaler-tolerance default
UP, DOWN = 2.5, 0.2  # per-pod value as a multiple of the target: 1 -> 3 pods, 3 -> 1 pod

BEHAVIOR: dict[str, Any] = {
    # No scale-up window and a policy that allows the whole step at once: the HPA's first
    # recommendation is the one checked.
    "scaleUp": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": MAX_REPLICAS, "periodSeconds": 5}]},
    "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW,
                  "policies": [{"type": "Percent", "value": 100, "periodSeconds": 5}]},
}


def hpa_replicas(current: int, values: Sequence[float], target: float, minimum: int = 1,
                 maximum: int = MAX_REPLICAS) -> int:
    """What kube-controller-manager's replica calculator recommends for an AverageValue Pods
    metric when every pod reports (pkg/controller/podautoscaler/replica_calculator.go,
    calcPlainMetricReplicas): the usage ratio is the pods' average over the target; within
    the tolerance the count stays, else ceil(ratio * pods); then the HPA's bounds."""
    ratio = sum(values) / len(values) / target
    wanted = current if abs(1 - ratio) <= TOLERANCE else math.ceil(ratio * len(values))
    return max(minimum, min(maximum, wanted))


@dataclass(frozen=True)
class Signal:
    """One target as a test sets it: its value, and on which example it is served."""

    field: str  # spec.autoscaling.targets field
    target: float
    gpu: bool = False  # served on an A100 llama.cpp service (device memory exists there)

    def __str__(self) -> str:
        return self.field


# Targets in each signal's own unit; UP x target stays within it (percentages <= 100).
SIGNALS = (
    Signal("requestsPerSecond", 2.5),
    Signal("queueLength", 2),
    Signal("kvCacheUtilization", 40),
    # The plan's steady device memory is about 14 % of an 80 GB A100 for the example's
    # model (weights + KV cache + buffers, allocated at load): 30 % is a guard above it.
    Signal("acceleratorMemoryUtilization", 30, gpu=True),
)
BY_FIELD = {s.field: s for s in SIGNALS}


@pytest.fixture(scope="module")
def signals_operator(glm_crds: list[str], kubectl: Kubectl) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kubectl, namespaces=(f"{PREFIX}*",))
    try:
        wait_for(process.alive, timeout=60, what="glm-operator liveness endpoint")
        yield process
    finally:
        process.stop()


@pytest.fixture
def ns(request: pytest.FixtureRequest, kubectl: Kubectl,
       signals_operator: OperatorProcess) -> Iterator[str]:
    def explain(name: str) -> None:
        print(f"\n--- operator log ---\n{signals_operator.tail(60)}")
        dump = kubectl.run("get", "hpa,deployments,pods,events", "-n", name, "-o", "wide",
                           check=False)
        print(f"\n--- namespace {name} ---\n{dump.stdout}{dump.stderr}")
        hpa = kubectl.run("get", "hpa", "-n", name, "-o", "yaml", check=False)
        print(f"\n--- HPAs ---\n{hpa.stdout}")

    with prefixed_namespace(request, kubectl, PREFIX, explain) as name:
        yield name


# --- helpers -------------------------------------------------------------------------------


def serve(kubectl: Kubectl, ns: str, targets: Mapping[str, float],
          gpu: bool = False) -> dict[str, Any]:
    """A service autoscaled on `targets`, Ready; returns the HPA the operator rendered.

    CPU: the CPU example. GPU: the A10 example's model on an A100 80 GB with llama.cpp (two
    nodes of eight GPUs hold every replica), open access, no canary."""
    if gpu:
        mv, svc = example("nvidia-a10-llamacpp")
        svc["spec"]["accelerator"] = {"profile": "nvidia-a100-80gb", "count": 1}
        svc["spec"]["gateway"] = {"access": "Open"}
        svc["spec"].pop("rollout", None)
    else:
        mv, svc = copy.deepcopy(CPU_MV), copy.deepcopy(CPU_SVC)
    # Pods removed by a scale-down hold their node's capacity until their grace period ends
    # (kwok removes them then): short, or the next tests find the CPU nodes full.
    svc["spec"]["gateway"]["maxDrainSeconds"] = 1
    mv["spec"].setdefault("cache", {})["accessMode"] = "ReadWriteMany"
    svc["metadata"]["name"] = SERVICE
    svc["spec"].pop("replicas", None)
    svc["spec"]["autoscaling"] = {"scaler": "HPA", "minReplicas": 1,
                                  "maxReplicas": MAX_REPLICAS, "targets": dict(targets),
                                  "behavior": BEHAVIOR}
    deploy_model(kubectl, ns, mv, wait_for)
    kubectl.apply(svc, namespace=ns)
    wait_ready(kubectl, ns, SERVICE, wait_for)
    return hpa_of(kubectl, ns, "main")


def metric_of(hpa: dict[str, Any], field: str) -> str:
    """The Pods metric the rendered HPA asks for `field`, with the target the API was given:
    the name comes from the HPA object (its averageValue is the field's quantity)."""
    targets = pods_metric_targets(hpa)
    name = BY_TARGET_FIELD[field].hpa_metric
    assert name in targets, f"the HPA has no metric for {field}: {targets}"
    return name


def write_all(adapter: CustomMetricsAdapter, kubectl: Kubectl, ns: str, hpa: dict[str, Any],
              values: Mapping[str, float], replicas: int) -> list[str]:
    """Every pod of the target Deployment (once it has `replicas`) reports `values`
    (metric -> per-pod value); returns the pods."""
    def pods_now() -> list[str] | None:
        pods = pod_names(kubectl, ns, target_deployment(kubectl, ns, hpa))
        return pods if len(pods) == replicas else None

    pods: list[str] = wait_for(pods_now, timeout=30, interval=POLL,
                               what=f"{replicas} pods of the target Deployment")
    for pod in pods:
        for metric, value in values.items():
            adapter.set_pod_metric(ns, pod, metric, decimal_quantity(value))
    return pods


def seen_by_hpa(kubectl: Kubectl, ns: str, hpa: dict[str, Any]) -> dict[str, float]:
    """The HPA's status.currentMetrics: metric -> the per-pod average it last read."""
    status = kubectl.get_json("hpa", hpa["metadata"]["name"], "-n", ns).get("status", {})
    out: dict[str, float] = {}
    for metric in status.get("currentMetrics") or []:
        if metric.get("type") == "Pods":
            out[metric["pods"]["metric"]["name"]] = quantity(
                metric["pods"]["current"]["averageValue"])
    return out


def quantity(text: str) -> float:
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def holds(kubectl: Kubectl, ns: str, hpa: dict[str, Any], replicas: int, seconds: float) -> None:
    """desiredReplicas stays `replicas` for `seconds` (several HPA syncs)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if desired(kubectl, ns, hpa) != replicas:
            status = kubectl.get_json("hpa", hpa["metadata"]["name"], "-n", ns)["status"]
            raise AssertionError(f"the HPA left {replicas}: {status}")
        time.sleep(POLL)


# --- tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("signal", SIGNALS, ids=str)
def test_each_target_scales_up_by_the_formula_and_down_after_the_window(
        signal: Signal, kubectl: Kubectl, ns: str, custom_metrics: CustomMetricsAdapter) -> None:
    hpa = serve(kubectl, ns, {signal.field: signal.target}, gpu=signal.gpu)
    metric = metric_of(hpa, signal.field)
    assert [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == [metric]
    assert pods_metric_targets(hpa)[metric] == decimal_quantity(signal.target)
    if signal.gpu:  # the guard is kept because it is above the plan
        cond = condition(kubectl.get_json("glmservice", SERVICE, "-n", ns),
                         "AutoscalingTargetsValid")
        assert cond and (cond["status"], cond["reason"]) == ("True", "TargetsUsable"), cond
        assert "kept as a guard" in cond["message"], cond

    # Idle: the HPA reads the value (a metric it cannot read would leave desiredReplicas unset
    # and ScalingActive False).
    write_all(custom_metrics, kubectl, ns, hpa, {metric: 0}, replicas=1)
    wait_for(lambda: desired(kubectl, ns, hpa) == 1 and metric in seen_by_hpa(kubectl, ns, hpa),
             timeout=30, interval=POLL, what="the HPA to read the idle value")

    # Up: the one pod reports UP x the target.
    high = UP * signal.target
    up = hpa_replicas(1, [high], signal.target)
    assert 1 < up < MAX_REPLICAS, up
    write_all(custom_metrics, kubectl, ns, hpa, {metric: high}, replicas=1)
    scale_and_time(kubectl, ns, hpa, up, f"{signal.field} {high:g} per pod (target "
                   f"{signal.target:g}): 1 -> {up}", timeout=60)
    assert seen_by_hpa(kubectl, ns, hpa)[metric] == pytest.approx(high)

    # At the target on every pod: the formula holds the count, and so does the HPA.
    write_all(custom_metrics, kubectl, ns, hpa, {metric: signal.target}, replicas=up)
    assert hpa_replicas(up, [signal.target] * up, signal.target) == up
    holds(kubectl, ns, hpa, up, 2 * SYNC_SECONDS)

    # Down: DOWN x the target on every pod; the HPA recommends fewer at once, but keeps the
    # highest recommendation of the last SCALE_DOWN_WINDOW seconds.
    low = DOWN * signal.target
    down = hpa_replicas(up, [low] * up, signal.target)
    assert down < up, down
    write_all(custom_metrics, kubectl, ns, hpa, {metric: low}, replicas=up)
    took = scale_and_time(kubectl, ns, hpa, down, f"{signal.field} {low:g} per pod: {up} -> "
                          f"{down} (scale-down window {SCALE_DOWN_WINDOW} s)",
                          timeout=SCALE_DOWN_WINDOW + 45)
    # The last recommendation of `up` was made at most one sync (and a little jitter) before
    # the value changed.
    assert took >= SCALE_DOWN_WINDOW - SYNC_SECONDS - 1, took


def test_several_targets_follow_the_largest_recommendation(
        kubectl: Kubectl, ns: str, custom_metrics: CustomMetricsAdapter) -> None:
    queue, kv = BY_FIELD["queueLength"], BY_FIELD["kvCacheUtilization"]
    hpa = serve(kubectl, ns, {queue.field: queue.target, kv.field: kv.target})
    q, k = metric_of(hpa, queue.field), metric_of(hpa, kv.field)
    write_all(custom_metrics, kubectl, ns, hpa, {q: 0, k: 0}, replicas=1)
    wait_for(lambda: desired(kubectl, ns, hpa) == 1 and len(seen_by_hpa(kubectl, ns, hpa)) == 2,
             timeout=30, interval=POLL, what="the HPA to read both idle values")

    # 1 pod: the queue asks for 2, the KV cache for 3 -> 3.
    values = {q: 1.5 * queue.target, k: 2.5 * kv.target}
    by_queue = hpa_replicas(1, [values[q]], queue.target)
    by_kv = hpa_replicas(1, [values[k]], kv.target)
    assert (by_queue, by_kv) == (2, 3), (by_queue, by_kv)
    write_all(custom_metrics, kubectl, ns, hpa, values, replicas=1)
    first = max(by_queue, by_kv)
    scale_and_time(kubectl, ns, hpa, first, f"queue asks {by_queue}, KV cache {by_kv}: 1 -> "
                   f"{first}", timeout=60)

    # The other way round, from 3 pods: the queue asks for 4, the KV cache for 2 -> 4.
    values = {q: 1.25 * queue.target, k: 0.5 * kv.target}
    by_queue = hpa_replicas(first, [values[q]] * first, queue.target)
    by_kv = hpa_replicas(first, [values[k]] * first, kv.target)
    assert by_queue > first > by_kv, (by_queue, by_kv)
    second = max(by_queue, by_kv)
    assert second < MAX_REPLICAS
    write_all(custom_metrics, kubectl, ns, hpa, values, replicas=first)
    scale_and_time(kubectl, ns, hpa, second, f"queue asks {by_queue}, KV cache {by_kv}: "
                   f"{first} -> {second}", timeout=60)
    # Every pod at the queue target, the KV cache still low: the queue holds the count, the
    # KV cache's smaller recommendation does not pull it down.
    values = {q: queue.target, k: values[k]}
    assert hpa_replicas(second, [values[q]] * second, queue.target) == second
    assert hpa_replicas(second, [values[k]] * second, kv.target) < second
    write_all(custom_metrics, kubectl, ns, hpa, values, replicas=second)
    holds(kubectl, ns, hpa, second, 2 * SYNC_SECONDS)
    seen = seen_by_hpa(kubectl, ns, hpa)
    assert seen == {q: pytest.approx(values[q]), k: pytest.approx(values[k])}, seen


def plain_autoscaled(name: str, metric: str, target: int) -> list[dict[str, Any]]:
    """A Deployment of one kwok pod and an HPA of the test's own on one Pods metric."""
    labels = {"app.kubernetes.io/name": name}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "10m"}}}]}}}}
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": name},
                 "minReplicas": 1, "maxReplicas": 3, "behavior": BEHAVIOR,
                 "metrics": [{"type": "Pods", "pods": {
                     "metric": {"name": metric},
                     "target": {"type": "AverageValue", "averageValue": str(target)}}}]}}
    return [deployment, hpa]


def test_a_percentage_target_above_90_never_scales_so_the_operator_leaves_it_out(
        kubectl: Kubectl, ns: str, custom_metrics: CustomMetricsAdapter) -> None:
    """The HPA controller's tolerance: with every pod at 100 %, a target of 95 is within 10 %
    and never scales, 90 does. The operator leaves a kvCacheUtilization of 95 out of the HPA
    it renders and says so, instead of rendering a target that can never act."""
    kv = BY_TARGET_FIELD["kvCacheUtilization"].hpa_metric
    hpa = serve(kubectl, ns, {"kvCacheUtilization": 95, "queueLength": 2})
    assert list(pods_metric_targets(hpa)) == [BY_TARGET_FIELD["queueLength"].hpa_metric]
    cond = condition(kubectl.get_json("glmservice", SERVICE, "-n", ns),
                     "AutoscalingTargetsValid")
    assert cond and (cond["status"], cond["reason"]) == ("False", "KvCacheTargetUnreachable")
    assert "kvCacheUtilization 95 %" in cond["message"], cond

    # The premise, on HPAs of the test's own: every pod's KV cache full.
    reach = {"at-95": 95, "at-90": 90}
    for name, target in reach.items():
        kubectl.apply(plain_autoscaled(name, kv, target), namespace=ns)
    own = {name: {"metadata": {"name": name},
                  "spec": {"scaleTargetRef": {"name": name}}} for name in reach}
    for name in reach:
        write_all(custom_metrics, kubectl, ns, own[name], {kv: 100}, replicas=1)
    expected = {name: hpa_replicas(1, [100], target, maximum=3)
                for name, target in reach.items()}
    assert expected == {"at-95": 1, "at-90": 2}, expected
    scale_and_time(kubectl, ns, own["at-90"], expected["at-90"],
                   "kvCacheUtilization 100 % per pod, target 90: 1 -> 2", timeout=60)
    wait_for(lambda: seen_by_hpa(kubectl, ns, own["at-95"]).get(kv) == 100, timeout=30,
             interval=POLL, what="the target-95 HPA to read 100 %")
    holds(kubectl, ns, own["at-95"], expected["at-95"], 2 * SYNC_SECONDS)
