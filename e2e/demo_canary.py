"""`make demo`, last part: canaries from one ModelVersion to the next, step by step.

Two rollouts, each asserted: a healthy second version (answers like the stable one) is
promoted; a degraded third version (answers 200 ms slower) is rolled back, judged against
the stable version, with the reason in its rollout record. The demo fails when either ends
otherwise.

What is real and what stands in: the operator, its analysis and the Prometheus it queries
are real; kwok pods run no containers, so the traffic comes from stand-ins for the two
versions' gateways (e2e/gateway_standin.py: the gateway's own metrics registry, fed with the
rates and latencies chosen here), which that Prometheus scrapes. The demo prints each step as
the operator takes it: weight, pods per version, the VirtualService's routes, the check.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from e2e.gateway_standin import GatewayStandIn
from e2e.kubectl import Kubectl
from e2e.prometheus import PrometheusError, PrometheusServer

HEALTHY_VERSION = "tiny-llama-f32-v2"
DEGRADED_VERSION = "tiny-llama-f32-v3"
# Judged against the stable version (the default): the canary may not fail more often, nor
# be more than 50 % slower at p99 (a difference under 100 ms never fails).
ROLLOUT = {"strategy": "canary", "steps": [25, 50], "interval": "5s",
           "analysis": {"minRequestCount": 10, "failureThreshold": 2}}
REQUESTS_PER_SECOND = 20
STABLE_LATENCY_SECONDS = 0.05
DEGRADED_EXTRA_SECONDS = 0.2
ROLLOUT_TIMEOUT_SECONDS = 180


class DemoFailed(Exception):
    """The demo's story did not happen; the message says what happened instead."""


def start_prometheus() -> PrometheusServer:
    try:
        return PrometheusServer().start()
    except PrometheusError as exc:
        raise DemoFailed(f"the canary part needs Prometheus: {exc}; `make deps` installs "
                         "it") from exc


def operator_args(workdir: Path, prometheus: PrometheusServer) -> tuple[str, ...]:
    config = workdir / "operator-config.yaml"
    config.write_text(yaml.safe_dump({"prometheus": {"url": prometheus.url},
                                      "rollout": {"drainSeconds": 2}}))
    return ("--config", str(config))


def _line(kubectl: Kubectl, namespace: str, service: str) -> str:
    obj = kubectl.get_json("glmservice", service, "-n", namespace)
    rollout = obj.get("status", {}).get("rollout") or {}
    pods: dict[str, int] = {}
    for d in kubectl.items("deployments", "-n", namespace, "-l", "glm-operator.dev/pool=main"):
        version = d["metadata"]["labels"]["glm-operator.dev/version"]
        pods[version] = d.get("status", {}).get("readyReplicas", 0)
    routes = ""
    found = kubectl.items("virtualservices.networking.istio.io", "-n", namespace)
    if found:
        routes = " routes " + ", ".join(
            f"{r['destination']['subset']}={r['weight']}%"
            for r in found[0]["spec"]["http"][-1]["route"])
    check = (rollout.get("lastAnalysis") or {}).get("message", "")
    return (f"  {rollout.get('phase', '-'):11} step {rollout.get('step', 0)} weight "
            f"{rollout.get('weight', 0):3}% | ready pods {pods}{routes}"
            + (f" | check: {check}" if check else ""))


def run(kubectl: Kubectl, prometheus: PrometheusServer, namespace: str, service: str,
        fetch: Callable[[str], None], first_version: dict[str, Any]) -> None:
    """The two rollouts; raise DemoFailed when one ends other than its story says."""
    stable = first_version["metadata"]["name"]
    print(f"  stand-in gateways for each version ({REQUESTS_PER_SECOND} requests a second "
          "each), scraped by the real Prometheus; the operator's analysis queries it")
    print(f"\n  1. {HEALTHY_VERSION}: answers like {stable}, so it should be promoted")
    record = _roll(kubectl, prometheus, namespace, service, fetch, first_version, stable,
                   HEALTHY_VERSION, extra_latency=0.0)
    if record.get("result") != "Succeeded":
        raise DemoFailed(f"the healthy canary {HEALTHY_VERSION} ended {record.get('result')}: "
                         f"{record.get('message')}")
    print(f"  promoted: {HEALTHY_VERSION} is the stable version")

    print(f"\n  2. {DEGRADED_VERSION}: answers {DEGRADED_EXTRA_SECONDS * 1000:.0f} ms slower "
          f"than {HEALTHY_VERSION}, so it should be rolled back")
    record = _roll(kubectl, prometheus, namespace, service, fetch, first_version,
                   HEALTHY_VERSION, DEGRADED_VERSION, extra_latency=DEGRADED_EXTRA_SECONDS)
    status = kubectl.get_json("glmservice", service, "-n", namespace)["status"]
    if record.get("result") != "RolledBack" or "latency" not in (record.get("message") or ""):
        raise DemoFailed(f"the degraded canary {DEGRADED_VERSION} ended {record.get('result')}"
                         f" ({record.get('message')}), not rolled back on its latency")
    if status.get("stableModelVersion") != HEALTHY_VERSION:
        raise DemoFailed(f"after the rollback the stable version is "
                         f"{status.get('stableModelVersion')}, not {HEALTHY_VERSION}")
    print(f"  rolled back: {record['message']}")
    print(f"  {HEALTHY_VERSION} still serves; spec.modelVersion stays {DEGRADED_VERSION} "
          "(Git is the source of truth) until it changes again")
    history = status.get("rolloutHistory", [])
    print("  rollout history: " + "; ".join(
        f"{r['fromModelVersion']} -> {r['modelVersion']}: {r['result']}" for r in history))


def _roll(kubectl: Kubectl, prometheus: PrometheusServer, namespace: str, service: str,
          fetch: Callable[[str], None], template: dict[str, Any], stable: str, new: str,
          extra_latency: float) -> dict[str, Any]:
    """Roll from `stable` to `new` with stand-in traffic; the rollout's record once done."""
    stable_gw = GatewayStandIn(namespace, service, stable).register(prometheus)
    canary_gw = GatewayStandIn(namespace, service, new).register(prometheus)
    try:
        stable_gw.set_traffic(REQUESTS_PER_SECOND, latency_seconds=STABLE_LATENCY_SECONDS)
        canary_gw.set_traffic(REQUESTS_PER_SECOND,
                              latency_seconds=STABLE_LATENCY_SECONDS + extra_latency)
        mv = copy.deepcopy(template)
        mv["metadata"]["name"] = new
        kubectl.apply(mv)
        fetch(new)
        patch = {"spec": {"modelVersion": new, "rollout": ROLLOUT}}
        print(f"  $ kubectl patch glms {service} --type merge -p '{json.dumps(patch)}'")
        kubectl("patch", "glmservice", service, "-n", namespace, "--type", "merge",
                "-p", json.dumps(patch))
        last, deadline = "", time.monotonic() + ROLLOUT_TIMEOUT_SECONDS
        while True:
            line = _line(kubectl, namespace, service)
            if line != last:
                print(line, flush=True)
                last = line
            record = _finished(kubectl, namespace, service, stable, new)
            if record is not None:
                break
            if time.monotonic() > deadline:
                raise DemoFailed(f"the rollout {stable} -> {new} did not finish in "
                                 f"{ROLLOUT_TIMEOUT_SECONDS} s: {last.strip()}")
            time.sleep(0.5)
        print(kubectl("get", "glms", "-n", namespace, "-o", "wide").stdout)
        return record
    finally:
        stable_gw.close()
        canary_gw.close()


def _finished(kubectl: Kubectl, namespace: str, service: str, stable: str, new: str
              ) -> dict[str, Any] | None:
    """The record of the rollout `stable` -> `new` once it is done and one version's pods
    are left (the loser's Deployment deleted)."""
    status = kubectl.get_json("glmservice", service, "-n", namespace).get("status", {})
    record = next((r for r in reversed(status.get("rolloutHistory", []))
                   if r.get("modelVersion") == new and r.get("fromModelVersion") == stable),
                  None)
    if record is None:
        return None
    left = kubectl.items("deployments", "-n", namespace, "-l", "glm-operator.dev/pool=main")
    return record if len(left) == 1 else None
