"""Version rollouts on the local control plane, judged by a real Prometheus.

The operator runs as `glm-operator run` with a config that points canary analysis at a real
Prometheus. That Prometheus scrapes stand-ins for the stable and canary gateways: the
gateway's own metrics class, fed with the error rate and latency each test chooses (kwok
pods run no containers, so the real gateway cannot run in them). Everything else is real:
the Istio CRDs the VirtualService and DestinationRule are validated against, the
Deployment and ReplicaSet controllers, the scheduler and the garbage collector.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.decide.rollout import size_for_weight

from e2e.gateway_standin import GatewayStandIn, gateway_standins
from e2e.inference_crds import inference_crds
from e2e.kubectl import Kubectl, wait_for
from e2e.operator_fixtures import (
    OperatorProcess,
    glm_crds,
    prefixed_namespace,
    report_fetched,
)
from e2e.prometheus import PrometheusServer, prometheus
from e2e.test_operator import CPU_MV, CPU_SVC, condition

__all__ = ["gateway_standins", "glm_crds", "inference_crds", "prometheus"]  # fixtures by name

Wait = Callable[..., Any]
SERVICE = "chat"
VERSION_LABEL = "glm-operator.dev/version"
# A namespace prefix no other operator of the test session watches.
PREFIX = "canary-"


class RestartableOperator:
    """The operator of this module, killable and restartable with the same config."""

    def __init__(self, kubectl: Kubectl, prometheus_url: str) -> None:
        self.kubectl = kubectl
        config = {"prometheus": {"url": prometheus_url, "timeoutSeconds": 5},
                  "rollout": {"drainSeconds": 2}, "capabilityRecheckSeconds": 2}
        self.config = tempfile.NamedTemporaryFile(  # noqa: SIM115 (lives with the module)
            "w", prefix="glm-operator-canary-", suffix=".yaml", delete=False)
        self.config.write(yaml.safe_dump(config))
        self.config.close()
        self.process = self._start()

    def _start(self) -> OperatorProcess:
        process = OperatorProcess(self.kubectl, namespaces=(f"{PREFIX}*",),
                                  extra_args=("--config", self.config.name))
        wait_for(process.alive, timeout=60, what="glm-operator liveness endpoint")
        return process

    def kill(self) -> None:
        self.process.kill()

    def restart(self) -> None:
        self.process = self._start()


@pytest.fixture(scope="module")
def canary_operator(glm_crds: list[str], kubectl: Kubectl,
                    prometheus: PrometheusServer) -> Iterator[RestartableOperator]:
    operator = RestartableOperator(kubectl, prometheus.url)
    try:
        yield operator
    finally:
        operator.process.stop()
        Path(operator.config.name).unlink(missing_ok=True)


@pytest.fixture
def ns(request: pytest.FixtureRequest, kubectl: Kubectl,
       canary_operator: RestartableOperator) -> Iterator[str]:
    def explain(name: str) -> None:
        print(f"\n--- operator log ---\n{canary_operator.process.tail(120)}")
        print(json.dumps(glms_or_none(kubectl, name), indent=1)[:6000])

    with prefixed_namespace(request, kubectl, PREFIX, explain) as name:
        yield name


def glms_or_none(kubectl: Kubectl, ns: str) -> dict[str, Any] | None:
    found = kubectl.items("glmservices", "-n", ns)
    return found[0] if found else None


def glms(kubectl: Kubectl, ns: str) -> dict[str, Any]:
    return kubectl.get_json("glmservice", SERVICE, "-n", ns)


def model_version(name: str) -> dict[str, Any]:
    mv = json.loads(json.dumps(CPU_MV))
    mv["metadata"]["name"] = name
    return mv


def fetched(kubectl: Kubectl, ns: str, name: str) -> None:
    kubectl.apply(model_version(name), namespace=ns)
    selector = f"glm-operator.dev/model-version={name}"
    wait_for(lambda: kubectl.items("jobs", "-n", ns, "-l", selector), timeout=60,
             what=f"the fetch Job of {name}")
    report_fetched(kubectl, ns, name)


def service(version: str, **spec: Any) -> dict[str, Any]:
    svc = json.loads(json.dumps(CPU_SVC))
    svc["metadata"]["name"] = SERVICE
    svc["spec"]["modelVersion"] = version
    if "autoscaling" in spec:
        svc["spec"].pop("replicas", None)
    svc["spec"].update(spec)
    return svc


def serve(kubectl: Kubectl, ns: str, version: str, **spec: Any) -> dict[str, Any]:
    """`version` fetched and served, Ready and stable."""
    fetched(kubectl, ns, version)
    svc = service(version, **spec)
    kubectl.apply(svc, namespace=ns)
    wait_for(lambda: glms(kubectl, ns).get("status", {}).get("stableModelVersion") == version,
             timeout=90, what=f"{version} stable")
    return svc


def roll_to(kubectl: Kubectl, ns: str, svc: dict[str, Any], version: str,
            **changes: Any) -> None:
    svc["spec"]["modelVersion"] = version
    svc["spec"].update(changes)
    kubectl.apply(svc, namespace=ns)


def deployment(kubectl: Kubectl, ns: str, version: str) -> dict[str, Any] | None:
    found = kubectl.items("deployments", "-n", ns, "-l",
                          f"{VERSION_LABEL}={version},glm-operator.dev/pool=main")
    return found[0] if found else None


def live(kubectl: Kubectl, ns: str, version: str) -> dict[str, Any]:
    found = deployment(kubectl, ns, version)
    assert found is not None, f"no Deployment of {version}"
    return found


def vs_weights(kubectl: Kubectl, ns: str) -> dict[str, int] | None:
    found = kubectl.items("virtualservices.networking.istio.io", "-n", ns)
    if not found:
        return None
    route = found[0]["spec"]["http"][-1]["route"]
    return {r["destination"]["subset"]: r["weight"] for r in route}


def rollout(kubectl: Kubectl, ns: str) -> dict[str, Any]:
    return glms(kubectl, ns).get("status", {}).get("rollout") or {}


def standins(make: Callable[..., GatewayStandIn], ns: str) -> tuple[GatewayStandIn,
                                                                      GatewayStandIn]:
    return make(ns, SERVICE, "v1"), make(ns, SERVICE, "v2")


# Two CPU nodes hold six of the example's pods: two stable replicas and a canary that grows
# from 1 (25 %) to 2 (75 %, then 100 %) stay within them.
CANARY = {"strategy": "canary", "steps": [25, 75], "interval": "6s",
          "analysis": {"minRequestCount": 5, "failureThreshold": 2,
                       "maxErrorRatePercent": 5, "maxLatencyP99Ms": 500}}


def test_a_healthy_canary_walks_the_steps_and_promotes(
        kubectl: Kubectl, ns: str, gateway_standins: Callable[..., GatewayStandIn]) -> None:
    stable_gw, canary_gw = standins(gateway_standins, ns)
    stable_gw.set_traffic(10)
    canary_gw.set_traffic(10, latency_seconds=0.05)
    svc = serve(kubectl, ns, "v1", replicas=2, rollout=CANARY)
    assert vs_weights(kubectl, ns) == {"v1": 100}
    fetched(kubectl, ns, "v2")
    roll_to(kubectl, ns, svc, "v2")

    seen: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        weights = vs_weights(kubectl, ns) or {}
        canary, stable = deployment(kubectl, ns, "v2"), deployment(kubectl, ns, "v1")
        w = weights.get("v2", 0)
        if not seen or seen[-1] != w:
            seen.append(w)
        if 0 < w < 100:
            # the canary got traffic only once it had the pods for it
            assert canary is not None
            assert canary["status"].get("readyReplicas", 0) >= size_for_weight(2, w)
            # sized for this step, or already for the next one before its traffic moves
            assert canary["spec"]["replicas"] in (size_for_weight(2, w),
                                                  size_for_weight(2, 75))
        if stable is not None:
            assert stable["spec"]["replicas"] == 2  # the stable pool is never reduced
        else:  # the old pool went only after traffic left it (the VS read came first)
            assert weights.get("v1", 0) == 0 and weights["v2"] == 100, weights
        if glms(kubectl, ns)["status"].get("stableModelVersion") == "v2" and stable is None:
            break
        time.sleep(0.3)
    else:
        pytest.fail(f"no promotion in 120s; weights seen {seen}; rollout {rollout(kubectl, ns)}")
    assert [w for w in seen if w] == [25, 75, 100], seen
    status = glms(kubectl, ns)["status"]
    assert status["rollout"]["phase"] == "Succeeded"
    assert status["rolloutHistory"][0]["result"] == "Succeeded"
    analysis = status["rollout"]["lastAnalysis"]
    assert analysis["verdict"] == "Passed" and analysis["requestCount"] >= 5
    assert analysis["errorRatePercent"] == 0
    assert condition(glms(kubectl, ns), "CanaryProgressing")["reason"] == "Succeeded"
    assert vs_weights(kubectl, ns) == {"v2": 100}


def test_a_failing_canary_rolls_back_after_the_threshold(
        kubectl: Kubectl, ns: str, gateway_standins: Callable[..., GatewayStandIn]) -> None:
    stable_gw, canary_gw = standins(gateway_standins, ns)
    stable_gw.set_traffic(10)
    canary_gw.set_traffic(10, error_ratio=0.5, client_error_ratio=0.2)
    svc = serve(kubectl, ns, "v1", replicas=2, rollout=CANARY)
    fetched(kubectl, ns, "v2")
    roll_to(kubectl, ns, svc, "v2")
    wait_for(lambda: vs_weights(kubectl, ns) == {"v1": 75, "v2": 25}, timeout=60,
             what="the first canary step")
    cond = wait_for(lambda: (c := condition(glms(kubectl, ns), "CanaryProgressing"))
                    and c["reason"] == "RolledBack" and c, timeout=60, what="the rollback")
    assert cond["status"] == "False"
    assert vs_weights(kubectl, ns) == {"v1": 100}
    wait_for(lambda: deployment(kubectl, ns, "v2") is None, timeout=30,
             what="the canary pool removed")
    status = glms(kubectl, ns)["status"]
    assert status["stableModelVersion"] == "v1"
    assert status["rollout"]["phase"] == "RolledBack"
    assert status["rollout"]["failedChecks"] == 2
    last = status["rollout"]["lastAnalysis"]
    # 429s and 401s are the client's: only the 5xx count, half of the canary's requests
    assert 30 <= last["errorRatePercent"] <= 70, last
    assert any("failure rate" in gate for gate in last["failedGates"])
    assert condition(glms(kubectl, ns), "Ready")["status"] == "True"
    events = kubectl.items("events", "-n", ns, "--field-selector", "reason=RolledBack")
    assert events and events[0]["type"] == "Warning"
    assert live(kubectl, ns, "v1")["spec"]["replicas"] == 2


def test_no_traffic_holds_the_step_without_failing(
        kubectl: Kubectl, ns: str, gateway_standins: Callable[..., GatewayStandIn]) -> None:
    standins(gateway_standins, ns)  # scraped, but nobody sends requests
    svc = serve(kubectl, ns, "v1", replicas=2, rollout=CANARY)
    fetched(kubectl, ns, "v2")
    roll_to(kubectl, ns, svc, "v2")
    wait_for(lambda: condition(glms(kubectl, ns), "CanaryProgressing")
             and condition(glms(kubectl, ns), "CanaryProgressing")["reason"]
             == "InsufficientTraffic", timeout=60, what="InsufficientTraffic")
    time.sleep(13)  # two more intervals
    state = rollout(kubectl, ns)
    assert (state["step"], state["weight"], state["failedChecks"]) == (1, 25, 0)
    assert state["phase"] == "Progressing"
    assert vs_weights(kubectl, ns) == {"v1": 75, "v2": 25}


def test_the_operator_killed_mid_rollout_resumes_at_the_same_step(
        kubectl: Kubectl, ns: str, canary_operator: RestartableOperator,
        gateway_standins: Callable[..., GatewayStandIn]) -> None:
    stable_gw, canary_gw = standins(gateway_standins, ns)
    stable_gw.set_traffic(10)
    canary_gw.set_traffic(10)
    slow = {**CANARY, "steps": [20, 40, 60], "interval": "8s"}
    svc = serve(kubectl, ns, "v1", replicas=2, rollout=slow)
    fetched(kubectl, ns, "v2")
    roll_to(kubectl, ns, svc, "v2")
    wait_for(lambda: rollout(kubectl, ns).get("weight") == 40, timeout=60, what="step 2")
    canary_operator.kill()
    before = rollout(kubectl, ns)
    time.sleep(3)
    assert vs_weights(kubectl, ns) == {"v1": 60, "v2": 40}
    canary_operator.restart()
    seen = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        state = rollout(kubectl, ns)
        seen.append(state.get("step"))
        if state.get("phase") == "Succeeded":
            break
        time.sleep(0.5)
    assert min(s for s in seen if s) >= before["step"] == 2, seen
    assert glms(kubectl, ns)["status"]["stableModelVersion"] == "v2"
    assert glms(kubectl, ns)["status"]["rolloutHistory"][0]["result"] == "Succeeded"


def test_abort_and_promote_annotations(
        kubectl: Kubectl, ns: str, gateway_standins: Callable[..., GatewayStandIn]) -> None:
    standins(gateway_standins, ns)
    slow = {**CANARY, "interval": "10m"}
    svc = serve(kubectl, ns, "v1", replicas=2, rollout=slow)
    fetched(kubectl, ns, "v2")
    roll_to(kubectl, ns, svc, "v2")
    wait_for(lambda: rollout(kubectl, ns).get("weight") == 25, timeout=60, what="step 1")
    kubectl("annotate", "glmservice", SERVICE, "-n", ns, "rollout.glm-operator.dev/abort=v2")
    wait_for(lambda: rollout(kubectl, ns).get("phase") == "Aborted", timeout=30,
             what="Aborted")
    assert vs_weights(kubectl, ns) == {"v1": 100}
    wait_for(lambda: deployment(kubectl, ns, "v2") is None, timeout=30, what="canary removed")

    # a new version: the stale abort annotation names v2, so it does not touch v3
    fetched(kubectl, ns, "v3")
    roll_to(kubectl, ns, svc, "v3")
    wait_for(lambda: rollout(kubectl, ns).get("weight") == 25
             and rollout(kubectl, ns).get("modelVersion") == "v3", timeout=60,
             what="v3 at step 1")
    kubectl("annotate", "glmservice", SERVICE, "-n", ns, "rollout.glm-operator.dev/promote=v3")
    wait_for(lambda: glms(kubectl, ns)["status"].get("stableModelVersion") == "v3",
             timeout=60, what="v3 promoted")
    history = [(r["modelVersion"], r["result"])
               for r in glms(kubectl, ns)["status"]["rolloutHistory"]]
    assert history[:2] == [("v3", "Succeeded"), ("v2", "Aborted")]
    wait_for(lambda: deployment(kubectl, ns, "v1") is None, timeout=30, what="v1 removed")


def test_version_and_context_change_together_never_restart_the_stable_pods(
        kubectl: Kubectl, ns: str) -> None:
    svc = serve(kubectl, ns, "v1", replicas=2, contextLength=4096)
    pods_before = {p["metadata"]["uid"] for p in kubectl.items(
        "pods", "-n", ns, "-l", f"{VERSION_LABEL}=v1")}
    stable_before = deployment(kubectl, ns, "v1")
    assert stable_before is not None and len(pods_before) == 2
    roll_to(kubectl, ns, svc, "v2", contextLength=2048)  # v2 not fetched yet: stays waiting
    wait_for(lambda: rollout(kubectl, ns).get("modelVersion") == "v2", timeout=30,
             what="the rollout to start")
    time.sleep(3)
    stable_now = deployment(kubectl, ns, "v1")
    assert stable_now is not None
    assert stable_now["metadata"]["generation"] == stable_before["metadata"]["generation"]
    assert {p["metadata"]["uid"] for p in kubectl.items(
        "pods", "-n", ns, "-l", f"{VERSION_LABEL}=v1")} == pods_before
    fetched(kubectl, ns, "v2")
    wait_for(lambda: glms(kubectl, ns)["status"].get("stableModelVersion") == "v2",
             timeout=60, what="v2 stable")
    assert glms(kubectl, ns)["status"]["stableSpec"]["contextLength"] == 2048


def test_an_autoscaled_service_keeps_its_capacity_through_a_surge(
        kubectl: Kubectl, ns: str) -> None:
    # HPA asked for: this operator has a Prometheus address and the cluster serves KEDA's
    # CRD, so Auto would pick KEDA (e2e/test_keda.py covers that path).
    autoscaling = {"minReplicas": 1, "maxReplicas": 6, "targets": {"queueLength": 2},
                   "scaler": "HPA"}
    svc = serve(kubectl, ns, "v1", autoscaling=autoscaling)
    stable = live(kubectl, ns, "v1")
    # As if its HPA had scaled it: two above minReplicas (the two CPU nodes hold both pools).
    kubectl("scale", "deployment", stable["metadata"]["name"], "-n", ns, "--replicas=2")
    wait_for(lambda: live(kubectl, ns, "v1")["status"].get("readyReplicas") == 2,
             timeout=30, what="2 stable pods")
    fetched(kubectl, ns, "v2")
    roll_to(kubectl, ns, svc, "v2")
    new = wait_for(lambda: deployment(kubectl, ns, "v2"), timeout=30, what="the v2 pool")
    assert new["spec"]["replicas"] == 2  # starts at the stable pool's current size
    deadline = time.monotonic() + 90
    while deployment(kubectl, ns, "v1") is not None:
        ready = sum((deployment(kubectl, ns, v) or {}).get("status", {}).get("readyReplicas", 0)
                    for v in ("v1", "v2"))
        assert ready >= 2  # never below the capacity it had
        assert time.monotonic() < deadline, f"no promotion in 90s: {rollout(kubectl, ns)}"
        time.sleep(0.3)
    time.sleep(2)
    after = live(kubectl, ns, "v2")
    assert after["spec"]["replicas"] == 2  # the HPA's hand-over kept it (not reset to 1)
    hpas = kubectl.items("horizontalpodautoscalers", "-n", ns)
    assert [h["spec"]["scaleTargetRef"]["name"] for h in hpas] == [after["metadata"]["name"]]


def test_a_target_whose_fetch_fails_ends_at_the_deadline_with_stable_serving(
        kubectl: Kubectl, ns: str) -> None:
    svc = serve(kubectl, ns, "v1", replicas=2, rollout={"progressDeadline": "15s"})
    kubectl.apply(model_version("v2"), namespace=ns)  # never fetched
    roll_to(kubectl, ns, svc, "v2")
    # Progressing=False Stable is where it starts from: wait for the rollout's own verdict.
    cond = wait_for(lambda: (c := condition(glms(kubectl, ns), "Progressing"))
                    and c["status"] == "False" and c["reason"] != "Stable" and c,
                    timeout=60, what="Progressing=False")
    assert cond["reason"] == "ProgressDeadlineExceeded"
    assert "v2" in cond["message"]
    status = glms(kubectl, ns)["status"]
    assert status["stableModelVersion"] == "v1" and status["rollout"]["phase"] == "Failed"
    assert condition(glms(kubectl, ns), "Ready")["status"] == "True"
    assert live(kubectl, ns, "v1")["status"]["readyReplicas"] == 2


ISTIO_ROUTING_CRDS = ("virtualservices.networking.istio.io",
                      "destinationrules.networking.istio.io")


@pytest.fixture
def without_istio(kubectl: Kubectl) -> Iterator[None]:
    """Istio's routing CRDs removed for one test, and put back (Established) afterwards."""
    try:
        kubectl("delete", "crd", *ISTIO_ROUTING_CRDS, "--wait=true", "--timeout=60s")
        yield
    finally:
        from e2e.cluster import install_crds

        install_crds(kubectl)


def test_without_istio_the_split_follows_ready_pods_and_says_so(
        kubectl: Kubectl, ns: str, without_istio: None,
        gateway_standins: Callable[..., GatewayStandIn]) -> None:
    stable_gw, canary_gw = standins(gateway_standins, ns)
    stable_gw.set_traffic(5)
    canary_gw.set_traffic(5)
    # The operator looks for the CRDs again every 2 s here (capabilityRecheckSeconds).
    svc = serve(kubectl, ns, "v1", replicas=3, rollout={**CANARY, "interval": "10m"})
    split = wait_for(lambda: (c := condition(glms(kubectl, ns), "TrafficSplit"))
                     and c["reason"] == "ReplicaRatio" and c, timeout=30,
                     what="TrafficSplit=False ReplicaRatio")
    assert split["status"] == "False"
    fetched(kubectl, ns, "v2")
    roll_to(kubectl, ns, svc, "v2")
    wait_for(lambda: rollout(kubectl, ns).get("weight") == 25, timeout=60, what="step 1")
    split = wait_for(lambda: (c := condition(glms(kubectl, ns), "TrafficSplit"))
                     and "approximate" in c["message"] and c, timeout=30,
                     what="the ratio in the condition")
    assert "1 of 4 (25%)" in split["message"], split
    # both versions' pods sit behind the one Service: the ratio is the split
    selector = kubectl.get_json("service", SERVICE, "-n", ns)["spec"]["selector"]
    assert VERSION_LABEL not in selector
    assert live(kubectl, ns, "v1")["spec"]["replicas"] == 3
    assert live(kubectl, ns, "v2")["spec"]["replicas"] == 1


# --- the same canary through an inference gateway's HTTPRoute ----------------------------------

POOLS = "inferencepools.inference.networking.k8s.io"
ROUTES = "httproutes.gateway.networking.k8s.io"
GATEWAY = {"mode": "InferenceGateway", "gatewayRef": {"name": "inference-gw",
                                                       "namespace": "infra"}}


def pools(kubectl: Kubectl, ns: str) -> dict[str, str]:
    """The service's InferencePools: name -> version."""
    return {p["metadata"]["name"]: p["metadata"]["labels"][VERSION_LABEL]
            for p in kubectl.items(POOLS, "-n", ns)}


def route_weights(kubectl: Kubectl, ns: str) -> dict[str, int] | None:
    """The HTTPRoute's weighted rule, by version (its backends are the versions' pools)."""
    found = kubectl.items(ROUTES, "-n", ns)
    if not found:
        return None
    by_pool = {f"{SERVICE}-{v}": v for v in ("v1", "v2", "v3")}
    return {by_pool[b["name"]]: b["weight"]
            for b in found[0]["spec"]["rules"][-1]["backendRefs"]}


def test_a_healthy_canary_walks_the_httproute_weights_and_promotes(
        kubectl: Kubectl, ns: str, inference_crds: list[str],
        gateway_standins: Callable[..., GatewayStandIn]) -> None:
    stable_gw, canary_gw = standins(gateway_standins, ns)
    stable_gw.set_traffic(10)
    canary_gw.set_traffic(10, latency_seconds=0.05)
    svc = serve(kubectl, ns, "v1", replicas=2, rollout=CANARY, routing=GATEWAY)
    wait_for(lambda: route_weights(kubectl, ns) == {"v1": 100}, timeout=30,
             what="the HTTPRoute at v1 100")
    split = condition(glms(kubectl, ns), "TrafficSplit")
    assert (split["status"], split["reason"]) == ("True", "InferenceGateway"), split
    # Istio's CRDs are installed here too: the route is the one writer, no VirtualService.
    assert vs_weights(kubectl, ns) is None
    # Nobody runs Gateway infra/inference-gw: its word on the pool is still to come.
    accepted = condition(glms(kubectl, ns), "GatewayAccepted")
    assert (accepted["status"], accepted["reason"]) == ("Unknown", "Pending"), accepted
    fetched(kubectl, ns, "v2")
    roll_to(kubectl, ns, svc, "v2")

    seen: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        weights = route_weights(kubectl, ns) or {}
        w = weights.get("v2", 0)
        if not seen or seen[-1] != w:
            seen.append(w)
        if 0 < w < 100:
            assert sum(weights.values()) == 100, weights
            assert set(pools(kubectl, ns).values()) == {"v1", "v2"}
            canary = deployment(kubectl, ns, "v2")
            assert canary is not None
            assert canary["status"].get("readyReplicas", 0) >= size_for_weight(2, w)
        if (glms(kubectl, ns)["status"].get("stableModelVersion") == "v2"
                and deployment(kubectl, ns, "v1") is None):
            break
        time.sleep(0.3)
    else:
        pytest.fail(f"no promotion in 120s; weights seen {seen}; rollout {rollout(kubectl, ns)}")
    assert [w for w in seen if w] == [25, 75, 100], seen
    assert glms(kubectl, ns)["status"]["rollout"]["phase"] == "Succeeded"
    assert route_weights(kubectl, ns) == {"v2": 100}
    wait_for(lambda: pools(kubectl, ns) == {f"{SERVICE}-v2": "v2"}, timeout=30,
             what="the stable version's pool gone after the promotion")


def test_a_failing_canary_rolls_the_httproute_back_and_its_pool_is_deleted(
        kubectl: Kubectl, ns: str, inference_crds: list[str],
        gateway_standins: Callable[..., GatewayStandIn]) -> None:
    stable_gw, canary_gw = standins(gateway_standins, ns)
    stable_gw.set_traffic(10)
    canary_gw.set_traffic(10, error_ratio=0.5)
    svc = serve(kubectl, ns, "v1", replicas=2, rollout=CANARY, routing=GATEWAY)
    fetched(kubectl, ns, "v2")
    roll_to(kubectl, ns, svc, "v2")
    wait_for(lambda: route_weights(kubectl, ns) == {"v1": 75, "v2": 25}, timeout=60,
             what="the first canary step in the HTTPRoute")
    assert pools(kubectl, ns) == {f"{SERVICE}-v1": "v1", f"{SERVICE}-v2": "v2"}
    picker = f"{SERVICE}-epp-v2"
    assert kubectl.exists("deployment", picker, "-n", ns)
    cond = wait_for(lambda: (c := condition(glms(kubectl, ns), "CanaryProgressing"))
                    and c["reason"] == "RolledBack" and c, timeout=60, what="the rollback")
    assert cond["status"] == "False"
    assert route_weights(kubectl, ns) == {"v1": 100}
    wait_for(lambda: pools(kubectl, ns) == {f"{SERVICE}-v1": "v1"}, timeout=30,
             what="the canary's InferencePool deleted")
    wait_for(lambda: not kubectl.exists("deployment", picker, "-n", ns), timeout=30,
             what="the canary's picker deleted")
    assert glms(kubectl, ns)["status"]["stableModelVersion"] == "v1"
    assert vs_weights(kubectl, ns) is None


def gateway_says(kubectl: Kubectl, ns: str, pool: str, accepted: str, resolved: str,
                 message: str) -> None:
    """Write the pool's status as the Gateway's controller would."""
    now = "2026-01-01T00:00:00Z"
    status = {"parents": [{
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                      "name": "inference-gw", "namespace": "infra"},
        "controllerName": "istio.io/gateway-controller",
        "conditions": [
            {"type": "Accepted", "status": accepted, "reason": "Accepted",
             "message": "", "lastTransitionTime": now, "observedGeneration": 1},
            {"type": "ResolvedRefs", "status": resolved,
             "reason": "ResolvedRefs" if resolved == "True" else "InvalidExtensionRef",
             "message": message, "lastTransitionTime": now, "observedGeneration": 1}]}]}
    kubectl("patch", POOLS, pool, "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}))


def test_a_pool_the_gateway_refuses_is_a_condition_with_the_gateways_message(
        kubectl: Kubectl, ns: str, inference_crds: list[str]) -> None:
    serve(kubectl, ns, "v1", replicas=1, routing=GATEWAY)
    pool = f"{SERVICE}-v1"
    wait_for(lambda: pool in pools(kubectl, ns), timeout=30, what="the pool")
    gateway_says(kubectl, ns, pool, "True", "False",
                 f"Service {ns}/chat-epp-v1 has no endpoints ready")
    refused = wait_for(lambda: (c := condition(glms(kubectl, ns), "GatewayAccepted"))
                       and c["status"] == "False" and c, timeout=40,
                       what="GatewayAccepted=False")
    assert refused["reason"] == "InvalidExtensionRef"
    assert f"Service {ns}/chat-epp-v1 has no endpoints ready" in refused["message"]
    assert "Gateway infra/inference-gw" in refused["message"]
    # The control: once the gateway accepts it, so does the condition.
    gateway_says(kubectl, ns, pool, "True", "True", "")
    wait_for(lambda: condition(glms(kubectl, ns), "GatewayAccepted")["status"] == "True",
             timeout=40, what="GatewayAccepted=True")
