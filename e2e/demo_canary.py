"""`make demo`, last part: a canary from one ModelVersion to the next, step by step.

A real Prometheus scrapes stand-ins for the stable and canary gateways (kwok pods run no
containers), and the operator's analysis reads it at every step; the demo prints each step
as the operator takes it: weight, pods per version, the VirtualService's routes, the check.
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

NEW_VERSION = "tiny-llama-f32-v2"
ROLLOUT = {"strategy": "canary", "steps": [25, 50], "interval": "5s",
           "analysis": {"minRequestCount": 10, "maxErrorRatePercent": 1,
                        "maxLatencyP99Ms": 1000}}


def start_prometheus() -> PrometheusServer | None:
    try:
        return PrometheusServer().start()
    except PrometheusError as exc:
        print(f"  (no canary part: {exc}; `make deps` installs Prometheus)")
        return None


def operator_args(workdir: Path, prometheus: PrometheusServer | None) -> tuple[str, ...]:
    if prometheus is None:
        return ()
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
    old = first_version["metadata"]["name"]
    stable_gw = GatewayStandIn(namespace, service, old).register(prometheus)
    canary_gw = GatewayStandIn(namespace, service, NEW_VERSION).register(prometheus)
    try:
        stable_gw.set_traffic(20)
        canary_gw.set_traffic(20, latency_seconds=0.2)
        mv = copy.deepcopy(first_version)
        mv["metadata"]["name"] = NEW_VERSION
        kubectl.apply(mv)
        fetch(NEW_VERSION)
        patch = {"spec": {"modelVersion": NEW_VERSION, "rollout": ROLLOUT}}
        print(f"  $ kubectl patch glms {service} --type merge -p '{json.dumps(patch)}'")
        kubectl("patch", "glmservice", service, "-n", namespace, "--type", "merge",
                "-p", json.dumps(patch))
        last, deadline = "", time.monotonic() + 180
        while time.monotonic() < deadline:
            line = _line(kubectl, namespace, service)
            if line != last:
                print(line, flush=True)
                last = line
            status = kubectl.get_json("glmservice", service, "-n", namespace)["status"]
            if status.get("stableModelVersion") == NEW_VERSION and len(
                    kubectl.items("deployments", "-n", namespace, "-l",
                                  "glm-operator.dev/pool=main")) == 1:
                break
            time.sleep(0.5)
        print(kubectl("get", "glms", "-n", namespace, "-o", "wide").stdout)
        history = kubectl.get_json("glmservice", service, "-n", namespace)["status"].get(
            "rolloutHistory", [])
        print("  rollout history: " + "; ".join(
            f"{r['fromModelVersion']} -> {r['modelVersion']}: {r['result']}" for r in history))
    finally:
        stable_gw.close()
        canary_gw.close()
