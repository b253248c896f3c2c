"""The ScaledObject the operator renders, scaled by KEDA's real operator.

KEDA's operator and metrics API server run on the local control plane (e2e/keda_controller.py,
built by the toolchain component `keda_controller`); a real Prometheus (e2e/prometheus.py)
scrapes one stand-in gateway (e2e/gateway_standin.py) per kwok pod of the main Deployment,
with the labels the operator's ServiceMonitor gives a gateway's series (namespace and pod
from the target; service, model_version and pool the gateway's own). The operator is the real
`glm-operator run` with that Prometheus as `prometheus.url`. So everything between a queue
length and the Deployment's replicas is the real thing:

    stand-in /metrics -> Prometheus -> keda-operator (the ScaledObject's PromQL, over gRPC)
      -> keda-adapter (external.metrics.k8s.io) -> kube-controller-manager (KEDA's HPA,
      External AverageValue: pool sum / replicas vs the per-pod threshold) -> Deployment

Timings (metric change -> KEDA's HPA desired replicas -> the Deployment's replicas) are
printed as `[figures]` lines (`pytest -s`).
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.render.keda import keda_hpa_name
from glm_operator.wellknown import POOL_LABEL, SERVICE_LABEL

from e2e.cluster import HPA_SYNC_PERIOD
from e2e.gateway_standin import GatewayStandIn, gateway_standins
from e2e.keda_controller import KedaController, keda_controller
from e2e.kubectl import Kubectl, wait_for
from e2e.operator_fixtures import OperatorProcess, glm_crds, prefixed_namespace, report_fetched
from e2e.prometheus import PrometheusServer, prometheus
from e2e.test_operator import CPU_MV, CPU_SVC, condition

__all__ = ["gateway_standins", "glm_crds", "keda_controller", "prometheus"]  # by name

PREFIX = "kedac-"  # namespaces no other operator of the session watches
SERVICE = "chat"
VERSION_LABEL = "glm-operator.dev/version"
MAX_REPLICAS = 3  # the two CPU nodes hold them
QUEUE_TARGET = 2  # spec.autoscaling.targets.queueLength: the per-pod threshold
SCALE_DOWN_WINDOW = 15  # seconds; the operator's default is 900
RESYNC_SECONDS = 2
POLL = 0.2
SYNC_SECONDS = float(HPA_SYNC_PERIOD.removesuffix("s"))
MakeStandIn = Callable[..., GatewayStandIn]

AUTOSCALING: dict[str, Any] = {
    "scaler": "KEDA",
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
def keda_operator(glm_crds: list[str], kubectl: Kubectl, prometheus: PrometheusServer,
                  keda_controller: KedaController) -> Iterator[OperatorProcess]:
    with tempfile.NamedTemporaryFile("w", prefix="glm-operator-keda-", suffix=".yaml",
                                     delete=False) as handle:
        yaml.safe_dump({"prometheus": {"url": prometheus.url}, "rollout": {"drainSeconds": 2},
                        "capabilityRecheckSeconds": 2}, handle)
    process = OperatorProcess(kubectl, namespaces=(f"{PREFIX}*",),
                              extra_args=("--config", handle.name,
                                          "--resync-seconds", str(RESYNC_SECONDS)))
    try:
        wait_for(process.alive, timeout=60, what="glm-operator liveness endpoint")
        yield process
    finally:
        process.stop()
        Path(handle.name).unlink(missing_ok=True)


@pytest.fixture
def ns(request: pytest.FixtureRequest, kubectl: Kubectl, keda_operator: OperatorProcess,
       keda_controller: KedaController) -> Iterator[str]:
    def explain(name: str) -> None:
        print(f"\n--- glm-operator log ---\n{keda_operator.tail(80)}")
        print(keda_controller.log_tails(40))
        dump = kubectl.run("get", "scaledobjects.keda.sh,hpa,deployments,pods,events", "-n",
                           name, "-o", "wide", check=False)
        print(f"\n--- namespace {name} ---\n{dump.stdout}{dump.stderr}")

    with prefixed_namespace(request, kubectl, PREFIX, explain) as name:
        yield name


# --- helpers -------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def since(self) -> float:
        return time.monotonic() - self.start


def figure(what: str, seconds: float) -> None:
    print(f"[figures] KEDA {what}: {seconds:.1f} s (HPA sync period {HPA_SYNC_PERIOD})")


def model_version(name: str) -> dict[str, Any]:
    mv = copy.deepcopy(CPU_MV)
    mv["metadata"]["name"] = name
    return mv


def fetched(kubectl: Kubectl, ns: str, name: str) -> None:
    kubectl.apply(model_version(name), namespace=ns)
    wait_for(lambda: kubectl.items("jobs", "-n", ns, "-l",
                                   f"glm-operator.dev/model-version={name}"),
             timeout=60, what=f"the fetch Job of {name}")
    report_fetched(kubectl, ns, name)


def serve(kubectl: Kubectl, ns: str, version: str,
          autoscaling: dict[str, Any] | None = None) -> dict[str, Any]:
    """`version` fetched and served with KEDA scaling it, stable."""
    fetched(kubectl, ns, version)
    svc = copy.deepcopy(CPU_SVC)
    svc["metadata"]["name"] = SERVICE
    svc["spec"]["modelVersion"] = version
    svc["spec"].pop("replicas", None)
    svc["spec"]["autoscaling"] = copy.deepcopy(autoscaling or AUTOSCALING)
    kubectl.apply(svc, namespace=ns)
    wait_for(lambda: kubectl.get_json("glmservice", SERVICE, "-n", ns).get("status", {})
             .get("stableModelVersion") == version, timeout=90, what=f"{version} stable")
    return svc


def deployment(kubectl: Kubectl, ns: str, version: str) -> dict[str, Any] | None:
    found = kubectl.items("deployments", "-n", ns, "-l",
                          f"{SERVICE_LABEL}={SERVICE},{VERSION_LABEL}={version},"
                          f"{POOL_LABEL}=main")
    return found[0] if found else None


def live(kubectl: Kubectl, ns: str, version: str) -> dict[str, Any]:
    found = deployment(kubectl, ns, version)
    assert found is not None, f"no Deployment of {version}"
    return found


def scaled_objects(kubectl: Kubectl, ns: str) -> list[dict[str, Any]]:
    return kubectl.items("scaledobjects.keda.sh", "-n", ns)


def keda_hpa(kubectl: Kubectl, ns: str, scaled_object: str,
             timeout: float = 60) -> dict[str, Any]:
    """KEDA's HPA of `scaled_object`, once KEDA has created it."""
    name = keda_hpa_name(scaled_object)

    def created() -> dict[str, Any] | None:
        return kubectl.get_json("hpa", name, "-n", ns) if kubectl.exists(
            "hpa", name, "-n", ns) else None
    found: dict[str, Any] = wait_for(created, timeout=timeout, interval=POLL,
                                     what=f"KEDA's HPA {name}")
    return found


def desired(kubectl: Kubectl, ns: str, hpa: str) -> int | None:
    value = kubectl.get_json("hpa", hpa, "-n", ns).get("status", {}).get("desiredReplicas")
    return int(value) if value is not None else None


def pod_names(kubectl: Kubectl, ns: str, deploy: dict[str, Any]) -> list[str]:
    labels = deploy["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{key}={value}" for key, value in labels.items())
    return sorted(p["metadata"]["name"] for p in kubectl.items("pods", "-n", ns, "-l", selector)
                  if not p["metadata"].get("deletionTimestamp"))


class Gateways:
    """One stand-in gateway per current pod of a version's Deployment, scraped by Prometheus
    under the pod's name (as the ServiceMonitor would scrape the pod's gateway)."""

    def __init__(self, kubectl: Kubectl, make: MakeStandIn, prometheus: PrometheusServer,
                 ns: str, version: str) -> None:
        self.kubectl, self.make, self.prometheus = kubectl, make, prometheus
        self.ns, self.version = ns, version
        self.by_pod: dict[str, GatewayStandIn] = {}

    def set_queued(self, per_pod: int) -> list[str]:
        """Every current pod reports `per_pod` queued requests; gateways of gone pods are
        unregistered. Returns the pods."""
        pods = pod_names(self.kubectl, self.ns, live(self.kubectl, self.ns, self.version))
        for pod in list(self.by_pod):
            if pod not in pods:
                self.by_pod.pop(pod).close()
        for pod in pods:
            if pod not in self.by_pod:
                self.by_pod[pod] = self.make(self.ns, SERVICE, self.version, pod=pod)
            self.by_pod[pod].set_load(in_flight=0, queued=per_pod)
        return pods

    def wait_scraped(self, query: str, expected: float, timeout: float = 30) -> None:
        """Until the ScaledObject's own query answers `expected` in Prometheus."""
        wait_for(lambda: self.prometheus.value(query) == expected, timeout=timeout,
                 interval=POLL, what=f"Prometheus answering {expected} for {query}")


def trigger_query(kubectl: Kubectl, ns: str, so_name: str) -> str:
    scaled = kubectl.get_json("scaledobject.keda.sh", so_name, "-n", ns)
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue", trigger
    return str(trigger["metadata"]["query"])


def scale_and_time(kubectl: Kubectl, ns: str, hpa: str, deploy: str, replicas: int,
                   what: str, timeout: float, clock: Clock, scraped: float) -> float:
    wait_for(lambda: desired(kubectl, ns, hpa) == replicas, timeout=timeout, interval=POLL,
             what=f"KEDA's HPA desiredReplicas {replicas}")
    to_desired = clock.since()
    wait_for(lambda: kubectl.get_json("deployment", deploy, "-n", ns)["spec"]["replicas"]
             == replicas, timeout=30, interval=POLL, what=f"the Deployment's replicas {replicas}")
    figure(f"{what}: metric change -> Prometheus answers the trigger's query", scraped)
    figure(f"{what}: metric change -> HPA desiredReplicas {replicas}", to_desired)
    figure(f"{what}: metric change -> Deployment spec.replicas {replicas}", clock.since())
    return to_desired


def hpa_managers(hpa: dict[str, Any]) -> set[str]:
    return {entry["manager"] for entry in hpa["metadata"].get("managedFields", [])}


def child_writes(operator: OperatorProcess) -> dict[str, float]:
    """The operator's writes (applies, deletes, hand-overs) of the kinds KEDA also touches."""
    return {kind: operator.metric("glm_operator_child_writes_total", kind=kind)
            for kind in ("ScaledObject", "HorizontalPodAutoscaler", "Deployment")}


def reconciles(operator: OperatorProcess) -> float:
    return operator.metric("glm_operator_reconciles_total", kind="GLMService", result="ok")


# --- tests ---------------------------------------------------------------------------------


def test_keda_scales_the_pool_on_the_rendered_query_and_the_operator_keeps_out_of_its_way(
        kubectl: Kubectl, ns: str, keda_operator: OperatorProcess, prometheus: PrometheusServer,
        gateway_standins: MakeStandIn) -> None:
    serve(kubectl, ns, "v1")
    (scaled,) = scaled_objects(kubectl, ns)
    so_name = scaled["metadata"]["name"]
    deploy = live(kubectl, ns, "v1")
    deploy_name = deploy["metadata"]["name"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deploy_name
    assert deploy["spec"]["replicas"] == 1
    cond = condition(kubectl.get_json("glmservice", SERVICE, "-n", ns), "Autoscaling")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "KEDA"), cond

    # KEDA made its HPA from our ScaledObject: the trigger as one External AverageValue metric
    # at the per-pod threshold, the bounds and the (shortened) behaviour.
    hpa_obj = keda_hpa(kubectl, ns, so_name)
    hpa = hpa_obj["metadata"]["name"]
    assert hpa_obj["spec"]["scaleTargetRef"]["name"] == deploy_name
    assert (hpa_obj["spec"]["minReplicas"], hpa_obj["spec"]["maxReplicas"]) == (1, MAX_REPLICAS)
    (metric,) = hpa_obj["spec"]["metrics"]
    assert metric["type"] == "External", metric
    assert metric["external"]["target"] == {"type": "AverageValue",
                                            "averageValue": str(QUEUE_TARGET)}, metric
    assert (hpa_obj["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
            == SCALE_DOWN_WINDOW)
    # KEDA drops our managed-by label (the ScaledObject's hpa-excluded-labels) and puts its
    # own: the operator's index of its children never holds KEDA's HPA.
    assert hpa_obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "keda-operator"

    query = trigger_query(kubectl, ns, so_name)
    gateways = Gateways(kubectl, gateway_standins, prometheus, ns, "v1")
    gateways.set_queued(0)
    gateways.wait_scraped(query, 0)
    wait_for(lambda: any(c["type"] == "ScalingActive" and c["status"] == "True"
                         for c in kubectl.get_json("hpa", hpa, "-n", ns)
                         .get("status", {}).get("conditions", [])),
             timeout=60, interval=POLL, what="KEDA's HPA reading the metric (ScalingActive)")
    assert desired(kubectl, ns, hpa) == 1

    # A queue of 3 x the threshold on the one pod: ceil(6 / 1 / 2) = 3 replicas.
    queued = QUEUE_TARGET * MAX_REPLICAS
    clock = Clock()
    gateways.set_queued(queued)
    gateways.wait_scraped(query, queued)
    scraped = clock.since()
    expected = min(MAX_REPLICAS, math.ceil(queued / 1 / QUEUE_TARGET))
    scale_and_time(kubectl, ns, hpa, deploy_name, expected, "scale up", timeout=60,
                   clock=clock, scraped=scraped)
    wait_for(lambda: kubectl.get_json("deployment", deploy_name, "-n", ns)["status"]
             .get("readyReplicas") == MAX_REPLICAS, timeout=60, what=f"{MAX_REPLICAS} ready pods")

    # Each of the 3 pods at the threshold (sum 6 / 3 replicas = 2): KEDA's HPA holds 3. The
    # operator reconciles (annotations, its 2 s resync) and writes neither the Deployment's
    # replicas nor KEDA's HPA.
    gateways.set_queued(QUEUE_TARGET)
    gateways.wait_scraped(query, QUEUE_TARGET * MAX_REPLICAS)
    generation = kubectl.get_json("deployment", deploy_name, "-n", ns)["metadata"]["generation"]
    hpa_before = kubectl.get_json("hpa", hpa, "-n", ns)
    writes_before = child_writes(keda_operator)
    before = reconciles(keda_operator)
    for touch in range(3):
        kubectl("annotate", "glmservice", SERVICE, "-n", ns,
                f"e2e.glm-operator.dev/touch={touch}", "--overwrite")
        time.sleep(RESYNC_SECONDS)
    wait_for(lambda: reconciles(keda_operator) >= before + 3, timeout=30,
             what="three reconciles of the GLMService")
    after = kubectl.get_json("deployment", deploy_name, "-n", ns)
    assert after["spec"]["replicas"] == MAX_REPLICAS
    assert after["metadata"]["generation"] == generation, "the operator rewrote the Deployment"
    hpa_after = kubectl.get_json("hpa", hpa, "-n", ns)
    assert hpa_after["metadata"]["uid"] == hpa_before["metadata"]["uid"], "KEDA's HPA replaced"
    assert hpa_after["spec"] == hpa_before["spec"], "KEDA's HPA spec was edited"
    assert not {m for m in hpa_managers(hpa_after) if m.startswith("glm-operator")}, (
        hpa_managers(hpa_after))
    assert desired(kubectl, ns, hpa) == MAX_REPLICAS
    assert [s["metadata"]["name"] for s in scaled_objects(kubectl, ns)] == [so_name]
    # Nor does it write the ScaledObject again (KEDA adds its label, finalizer and status to
    # it), or any Deployment or HPA, in those reconciles.
    assert child_writes(keda_operator) == writes_before, (writes_before,
                                                          child_writes(keda_operator))

    # Quiet: down to minReplicas once the (shortened) stabilisation window has passed.
    clock = Clock()
    gateways.set_queued(0)
    gateways.wait_scraped(query, 0)
    scraped = clock.since()
    took = scale_and_time(kubectl, ns, hpa, deploy_name, 1, "scale down",
                          timeout=SCALE_DOWN_WINDOW + 45, clock=clock, scraped=scraped)
    # Not before the window: the HPA keeps the highest recommendation of the last 15 s.
    assert took >= SCALE_DOWN_WINDOW - SYNC_SECONDS - 1, took
    status = kubectl.get_json("hpa", hpa, "-n", ns)["status"]
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    assert conditions.get("ScalingActive") == "True", json.dumps(status)


def test_a_rollout_hands_the_replicas_over_to_the_new_versions_scaled_object(
        kubectl: Kubectl, ns: str, prometheus: PrometheusServer,
        gateway_standins: MakeStandIn) -> None:
    # Slow scale-down (the default 900 s window would do; 300 keeps the test's state clear):
    # what the pool has when the rollout starts is what KEDA asked for, not a window's lag.
    autoscaling = copy.deepcopy(AUTOSCALING)
    autoscaling["behavior"]["scaleDown"] = {"stabilizationWindowSeconds": 300}
    svc = serve(kubectl, ns, "v1", autoscaling)
    (scaled,) = scaled_objects(kubectl, ns)
    v1_name = live(kubectl, ns, "v1")["metadata"]["name"]
    v1_hpa = keda_hpa(kubectl, ns, scaled["metadata"]["name"])["metadata"]["name"]
    v1 = Gateways(kubectl, gateway_standins, prometheus, ns, "v1")
    # Queue 4 on the one pod: KEDA scales v1 to 2, and 2 x 2 holds it there.
    v1.set_queued(2 * QUEUE_TARGET)
    wait_for(lambda: desired(kubectl, ns, v1_hpa) == 2, timeout=60, interval=POLL,
             what="KEDA's HPA scaling v1 to 2")
    wait_for(lambda: live(kubectl, ns, "v1")["status"].get("readyReplicas") == 2, timeout=60,
             what="2 ready v1 pods")
    v1.set_queued(QUEUE_TARGET)

    fetched(kubectl, ns, "v2")
    clock = Clock()
    svc["spec"]["modelVersion"] = "v2"
    kubectl.apply(svc, namespace=ns)
    new = wait_for(lambda: deployment(kubectl, ns, "v2"), timeout=30, what="the v2 pool")
    assert new["spec"]["replicas"] == 2, "the new pool did not start at the old one's size"
    v2 = Gateways(kubectl, gateway_standins, prometheus, ns, "v2")

    def promoted() -> bool:
        v2.set_queued(QUEUE_TARGET)  # the new pods' gateways report as they come up
        return deployment(kubectl, ns, "v1") is None
    wait_for(promoted, timeout=120, interval=0.5, what="v2 promoted and v1's pool gone")
    figure("rollout: new version applied -> v1's Deployment gone", clock.since())

    # The ScaledObject now scales v2's Deployment, and KEDA's HPA for it runs at 2.
    (scaled_v2,) = wait_for(
        lambda: [s for s in scaled_objects(kubectl, ns)
                 if s["spec"]["scaleTargetRef"]["name"] != v1_name] or None,
        timeout=30, what="the ScaledObject of v2")
    v2_name = live(kubectl, ns, "v2")["metadata"]["name"]
    assert scaled_v2["spec"]["scaleTargetRef"]["name"] == v2_name
    assert [s["metadata"]["name"] for s in scaled_objects(kubectl, ns)] == [
        scaled_v2["metadata"]["name"]]
    v2_hpa = keda_hpa(kubectl, ns, scaled_v2["metadata"]["name"])
    figure("rollout: new version applied -> KEDA's HPA of v2 exists", clock.since())
    assert v2_hpa["spec"]["scaleTargetRef"]["name"] == v2_name
    v2.set_queued(QUEUE_TARGET)
    wait_for(lambda: desired(kubectl, ns, v2_hpa["metadata"]["name"]) == 2, timeout=60,
             interval=POLL, what="KEDA's HPA of v2 reading the v2 pods (desired 2)")
    figure("rollout: new version applied -> KEDA's HPA of v2 desiredReplicas 2", clock.since())
    assert live(kubectl, ns, "v2")["spec"]["replicas"] == 2
    wait_for(lambda: not kubectl.exists("hpa", v1_hpa, "-n", ns), timeout=60,
             what="KEDA's HPA of v1 gone with its ScaledObject")
    hpas = kubectl.items("horizontalpodautoscalers", "-n", ns)
    assert [h["spec"]["scaleTargetRef"]["name"] for h in hpas] == [v2_name]
