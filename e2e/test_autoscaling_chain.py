"""The autoscaling chain end to end, with no value injected anywhere.

Load on real gateways (`glm-operator gateway` with each kwok pod's rendered args) in front of
real llama-servers (each pod's rendered argv, on the tiny test model) -> the gateways' own
series -> a real Prometheus scraping each gateway with the labels the operator's
ServiceMonitor gives -> the shipped prometheus-adapter rule's query, evaluated as the adapter
evaluates it -> the custom metrics API (the upstream test adapter) -> kube-controller-manager's
HPA controller -> the Deployment the operator rendered. e2e/hpa_chain.py has the pieces.

Each pod the HPA adds gets its own engine and gateway as soon as it is bound (PodRunner plays
the kubelet), so the HPA reads every pod of the Deployment from the same chain.

Two signals move for real on two CPU cores:
- queueLength: clients beyond the engine's slots (llama.cpp --parallel, from the plan) wait in
  the engine's queue, and the gateway counts them (`--engine-slots`, rendered from the plan);
- requestsPerSecond: short requests at a fixed rate, spread over the pods' gateways; the
  rule's rate() over its 2 m window makes this signal ramp up over that window.

The times from the start of the load to each step (the gateway's own gauge, the Prometheus
sample, the bridge's write, the HPA's desiredReplicas, the Deployment's replicas, the new
pods served) are printed as `[figures]` lines (`pytest -s`). The control breaks the rule (a
wrong series name): the same load, and the HPA does not scale.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from glm_operator.gateway.metrics import REQUESTS_QUEUED, REQUESTS_TOTAL
from glm_operator.render import scaling_metrics
from glm_operator.wellknown import SERVICE_LABEL

from e2e.adapter_rules import Rule, load_rules
from e2e.cluster import HPA_SYNC_PERIOD
from e2e.custom_metrics import CustomMetricsAdapter, custom_metrics
from e2e.hpa_chain import Bridge, PodRunner, QueueLoad, RateLoad, ScrapeLabels
from e2e.kubectl import Kubectl, wait_for
from e2e.models import TinyLlamaSpec, write_tiny_llama
from e2e.operator_fixtures import OperatorProcess, glm_crds, prefixed_namespace
from e2e.prometheus import SCRAPE_INTERVAL, PrometheusServer, prometheus
from e2e.test_adapter_rules import RULES_FILE
from e2e.test_autoscaling import SERVICE, SYNC_SECONDS, desired, hpa_of, target_deployment
from e2e.test_autoscaling_signals import hpa_replicas, metric_of
from e2e.test_gateway import metric_value
from e2e.test_operator import CPU_MV, CPU_SVC, deploy_model, wait_ready

pytestmark = pytest.mark.llama

__all__ = ["custom_metrics", "glm_crds", "prometheus"]  # fixtures used by name

PREFIX = "hpac-"
MAX_REPLICAS = 4
BRIDGE_PERIOD = 1.0  # seconds between the bridge's cycles (the real adapter answers each
# HPA request with a fresh query: this is the delay the bridge adds, at most)
POLL = 0.5
# The HPA must not scale down during a test: the window outlasts it.
BEHAVIOR: dict[str, Any] = {
    "scaleUp": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": MAX_REPLICAS, "periodSeconds": 5}]},
    "scaleDown": {"stabilizationWindowSeconds": 600},
}

QUEUE_TARGET = 2
QUEUED = 5  # clients beyond the engine's slots: ceil(5 / 2) = 3 replicas
QUEUE_MAX_TOKENS = 1500  # a generation of about a second or more on the tiny model
RPS_TARGET = 2.5
RATE = 7.0  # requests a second in all: ceil(7 / 2.5) = 3 replicas once the window is full


@pytest.fixture(scope="module")
def chain_operator(glm_crds: list[str], kubectl: Kubectl) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kubectl, namespaces=(f"{PREFIX}*",))
    try:
        wait_for(process.alive, timeout=60, what="glm-operator liveness endpoint")
        yield process
    finally:
        process.stop()


@pytest.fixture
def ns(request: pytest.FixtureRequest, kubectl: Kubectl,
       chain_operator: OperatorProcess) -> Iterator[str]:
    def explain(name: str) -> None:
        dump = kubectl.run("get", "hpa,deployments,pods,events", "-n", name, "-o", "wide",
                           check=False)
        print(f"\n--- namespace {name} ---\n{dump.stdout}{dump.stderr}")
        hpa = kubectl.run("get", "hpa", "-n", name, "-o", "yaml", check=False)
        print(f"\n--- HPAs ---\n{hpa.stdout}")

    with prefixed_namespace(request, kubectl, PREFIX, explain) as name:
        yield name


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A trained context above the plan's per-slot context (8192), so llama-server keeps it.
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf",
                            TinyLlamaSpec(n_ctx_train=65536))


@pytest.fixture(scope="module")
def rules() -> list[Rule]:
    return load_rules(RULES_FILE)


def serve(kubectl: Kubectl, ns: str, targets: dict[str, float]) -> dict[str, Any]:
    mv, svc = copy.deepcopy(CPU_MV), copy.deepcopy(CPU_SVC)
    svc["metadata"]["name"] = SERVICE
    svc["spec"].pop("replicas", None)
    # A deleted pod holds its node's capacity for its grace period (kwok): keep it short.
    svc["spec"]["gateway"]["maxDrainSeconds"] = 1
    svc["spec"]["autoscaling"] = {"scaler": "HPA", "minReplicas": 1,
                                  "maxReplicas": MAX_REPLICAS, "targets": targets,
                                  "behavior": BEHAVIOR}
    deploy_model(kubectl, ns, mv, wait_for)
    kubectl.apply(svc, namespace=ns)
    wait_ready(kubectl, ns, SERVICE, wait_for)
    return hpa_of(kubectl, ns, "main")


def with_wrong_series(rules: list[Rule], series: str) -> list[Rule]:
    """The rules with `series` misspelt in the rule that reads it: discovery finds nothing
    for the metric, as with a rule written for another gateway version."""
    wrong = f"{series}_wrong"
    out = []
    for rule in rules:
        raw = copy.deepcopy(rule.raw)
        if raw["name"]["matches"] == f"^{series}$":
            raw["seriesQuery"] = raw["seriesQuery"].replace(series, wrong)
            raw["name"]["matches"] = f"^{wrong}$"
        out.append(Rule(rule.index, raw))
    assert [r.raw for r in out] != [r.raw for r in rules]
    return out


@dataclass
class Timeline:
    """When each step of the chain was first seen, in seconds since the load started."""

    started: float = field(default_factory=time.monotonic)
    seen: dict[str, float] = field(default_factory=dict)

    def mark(self, what: str, happened: bool) -> None:
        if happened and what not in self.seen:
            self.seen[what] = time.monotonic() - self.started

    def print(self, title: str, parts: str) -> None:
        for what, seconds in sorted(self.seen.items(), key=lambda item: item[1]):
            print(f"[figures] {title}: load start -> {what}: {seconds:.1f} s")
        print(f"[figures] {title}: parts: {parts}")


def parts() -> str:
    return (f"scrape interval {SCRAPE_INTERVAL}, rate window {scaling_metrics.RATE_WINDOW}, "
            f"bridge period {BRIDGE_PERIOD:g}s, HPA sync {HPA_SYNC_PERIOD}")


def watch(timeline: Timeline, until: Callable[[], bool], timeout: float,
          steps: Callable[[], None], what: str) -> None:
    """Mark the timeline's steps every POLL until `until()` (or fail after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        steps()
        if until():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; seen: "
                                 f"{timeline.seen}")
        time.sleep(POLL)


def hpa_condition(kubectl: Kubectl, ns: str, hpa: dict[str, Any], type_: str
                  ) -> dict[str, Any] | None:
    status = kubectl.get_json("hpa", hpa["metadata"]["name"], "-n", ns).get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


# --- queueLength ---------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["shipped", "wrong-series-name"])
def test_queued_requests_scale_the_deployment_through_the_whole_chain(
        rule: str, kubectl: Kubectl, ns: str, prometheus: PrometheusServer,
        custom_metrics: CustomMetricsAdapter, rules: list[Rule], tiny_model: Path,
        tmp_path: Path) -> None:
    hpa = serve(kubectl, ns, {"queueLength": QUEUE_TARGET})
    metric = metric_of(hpa, "queueLength")
    deployment = target_deployment(kubectl, ns, hpa)
    labels = ScrapeLabels.of(kubectl, ns, f"{SERVICE_LABEL}={SERVICE}")
    broken = rule != "shipped"
    used = with_wrong_series(rules, REQUESTS_QUEUED) if broken else rules
    with PodRunner(kubectl, ns, deployment, prometheus, labels, tiny_model,
                   tmp_path) as runner, \
            Bridge(prometheus, used, metric, custom_metrics, kubectl, ns, deployment,
                   BRIDGE_PERIOD) as bridge:
        (first,) = runner.gateways()
        series = f'{REQUESTS_QUEUED}{{namespace="{ns}",pod="{first.name}"}}'
        prometheus.wait_for_series(series, timeout=30)
        if not broken:  # idle: the HPA reads 0 through the chain
            wait_for(lambda: bridge.last().get(first.name) == 0.0 and
                     desired(kubectl, ns, hpa) == 1, timeout=30, what="the idle chain")
        clients = first.engine_slots + QUEUED
        expected = hpa_replicas(1, [QUEUED], QUEUE_TARGET, maximum=MAX_REPLICAS)
        assert 1 < expected < MAX_REPLICAS

        gauge, sample, written = (f"the gateway's own gauge {QUEUED}",
                                  f"the Prometheus sample {QUEUED}", f"the bridge's write {QUEUED}")
        steps_up = [f"HPA desiredReplicas {n}" for n in range(2, expected + 1)]
        scaled, serving = (f"Deployment spec.replicas {expected}",
                           f"{expected} pods served (engine + gateway up)")
        with QueueLoad(first, clients, QUEUE_MAX_TOKENS) as load:
            timeline = Timeline()

            def steps() -> None:
                timeline.mark(gauge, metric_value(first.gateway.metrics_text(),
                                                  REQUESTS_QUEUED) >= QUEUED)
                timeline.mark(sample, (prometheus.value(series) or 0) >= QUEUED)
                timeline.mark(written, bridge.last().get(first.name, 0) >= QUEUED)
                now = desired(kubectl, ns, hpa) or 0
                for n, step in enumerate(steps_up, start=2):
                    timeline.mark(step, now >= n)
                timeline.mark(scaled, target_deployment(kubectl, ns, hpa)["spec"]["replicas"]
                              >= expected)
                timeline.mark(serving, len(runner.gateways()) >= expected)

            if broken:
                # Six HPA syncs with the queue in Prometheus: nothing reaches the HPA.
                watch(timeline, lambda: time.monotonic() - timeline.started > 6 * SYNC_SECONDS,
                      timeout=60, steps=steps, what="six HPA syncs")
                timeline.print("queueLength chain, rule broken (control)", parts())
                assert sample in timeline.seen, timeline.seen
                assert not bridge.written and any("no rule serves" in e for e in bridge.errors)
                assert target_deployment(kubectl, ns, hpa)["spec"]["replicas"] == 1
                assert (desired(kubectl, ns, hpa) or 0) <= 1
                active = hpa_condition(kubectl, ns, hpa, "ScalingActive")
                assert active and active["status"] == "False", active
                assert active["reason"] == "FailedGetPodsMetric", active
                return

            everything = [gauge, sample, written, *steps_up, scaled, serving]
            watch(timeline, lambda: all(step in timeline.seen for step in everything),
                  timeout=90, steps=steps, what=f"the chain to {expected} replicas")
            timeline.print(f"queueLength chain ({clients} clients, {first.engine_slots} "
                           f"slots, target {QUEUE_TARGET}): 1 -> {expected}", parts())
            # The new pods report 0 through the same chain; the first pod keeps its queue:
            # the formula asks for no more than `expected` (fewer is held back by the
            # scale-down window), and the HPA stays there.
            wait_for(lambda: len(bridge.last()) == expected, timeout=30,
                     what="every pod's value through the chain")
            values = list(bridge.last().values())
            print(f"[figures] queueLength chain: per pod through the chain {bridge.last()}")
            assert hpa_replicas(expected, values, QUEUE_TARGET,
                                maximum=MAX_REPLICAS) <= expected, values
            deadline = time.monotonic() + 2 * SYNC_SECONDS
            while time.monotonic() < deadline:
                assert desired(kubectl, ns, hpa) == expected
                time.sleep(POLL)
        assert not load.failures, load.failures[:5]
        assert load.statuses and set(load.statuses) == {200}, set(load.statuses)
        assert not runner.errors, runner.errors


# --- requestsPerSecond -----------------------------------------------------------------------


def test_requests_per_second_scale_the_deployment_through_the_whole_chain(
        kubectl: Kubectl, ns: str, prometheus: PrometheusServer,
        custom_metrics: CustomMetricsAdapter, rules: list[Rule], tiny_model: Path,
        tmp_path: Path) -> None:
    hpa = serve(kubectl, ns, {"requestsPerSecond": RPS_TARGET})
    metric = metric_of(hpa, "requestsPerSecond")
    deployment = target_deployment(kubectl, ns, hpa)
    labels = ScrapeLabels.of(kubectl, ns, f"{SERVICE_LABEL}={SERVICE}")
    # Spread evenly, every pod serves RATE / n: the sum over pods is RATE whatever n is, so
    # the HPA asks ceil(RATE / target) once the rule's window has filled.
    expected = hpa_replicas(2, [RATE / 2] * 2, RPS_TARGET, maximum=MAX_REPLICAS)
    assert expected == hpa_replicas(expected, [RATE / expected] * expected, RPS_TARGET,
                                    maximum=MAX_REPLICAS)
    assert 1 < expected < MAX_REPLICAS
    window = scaling_metrics.RATE_WINDOW
    window_seconds = float(window.removesuffix("m")) * 60
    with PodRunner(kubectl, ns, deployment, prometheus, labels, tiny_model,
                   tmp_path) as runner, \
            Bridge(prometheus, rules, metric, custom_metrics, kubectl, ns, deployment,
                   BRIDGE_PERIOD) as bridge:
        assert len(runner.gateways()) == 1
        with RateLoad(runner, RATE) as load:
            timeline = Timeline()
            served = f'sum(rate({REQUESTS_TOTAL}{{namespace="{ns}",code="200"}}[{window}]))'

            def steps() -> None:
                total = sum(bridge.last().values())
                now = desired(kubectl, ns, hpa) or 0
                for n in range(1, expected):
                    # The HPA steps up when the sum passes n x target x (1 + tolerance).
                    level = n * RPS_TARGET * 1.1
                    timeline.mark(f"the bridge's sum over pods > {level:g}/s", total > level)
                for n in range(2, expected + 1):
                    timeline.mark(f"HPA desiredReplicas {n}", now >= n)
                    timeline.mark(f"Deployment spec.replicas {n}", target_deployment(
                        kubectl, ns, hpa)["spec"]["replicas"] >= n)
                    timeline.mark(f"{n} pods served", len(runner.gateways()) >= n)
                timeline.mark("the first request counted in Prometheus",
                              (prometheus.value(served) or 0) > 0)

            watch(timeline, lambda: f"{expected} pods served" in timeline.seen and
                  f"Deployment spec.replicas {expected}" in timeline.seen,
                  timeout=window_seconds + 120, steps=steps,
                  what=f"the chain to {expected} replicas")
            elapsed = time.monotonic() - timeline.started
            timeline.print(f"requestsPerSecond chain ({RATE:g}/s in all, target "
                           f"{RPS_TARGET:g}/s per pod): 1 -> {expected}", parts())
            # rate() over the window of a load that started t s ago reads about RATE x t /
            # window: the sum passes n x target x 1.1 after about window x n x target x 1.1 /
            # RATE seconds.
            for n in range(1, expected):
                print(f"[figures] requestsPerSecond chain: predicted from the window: sum > "
                      f"{n * RPS_TARGET * 1.1:g}/s after "
                      f"{window_seconds * n * RPS_TARGET * 1.1 / RATE:.0f} s")
            achieved = load.sent / elapsed
            print(f"[figures] requestsPerSecond chain: load sent {load.sent} requests in "
                  f"{elapsed:.0f} s ({achieved:.2f}/s), by pod {load.by_pod}, largest backlog "
                  f"{load.max_backlog}")
            assert achieved == pytest.approx(RATE, rel=0.1)
            deadline = time.monotonic() + 2 * SYNC_SECONDS
            while time.monotonic() < deadline:
                assert desired(kubectl, ns, hpa) == expected
                time.sleep(POLL)
            print(f"[figures] requestsPerSecond chain: per pod through the chain "
                  f"{bridge.last()}")
            assert not math.isnan(sum(bridge.last().values()))
        assert not load.failures, load.failures[:5]
        assert load.statuses and set(load.statuses) == {200}, set(load.statuses)
        assert not runner.errors, runner.errors
