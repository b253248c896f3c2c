"""Checks every rendered object must pass, whatever the input (vexxhost-style invariants)."""

from __future__ import annotations

import re
from typing import Any

from glm_operator.render.groups import GROUP_ROLE_LABEL
from glm_operator.render.names import COMPONENT_LABEL, POOL_LABEL, SERVICE_LABEL, VERSION_LABEL
from glm_operator.render.pod import (
    ENGINE_CONTAINER,
    ENGINE_HEALTH_PATH,
    GATEWAY_CONTAINER,
    GATEWAY_PORT_NAME,
)
from glm_operator.render.routing import EPP_COMPONENT, ROUTER_COMPONENT

SERVICE_WIDE_COMPONENTS = (EPP_COMPONENT, ROUTER_COMPONENT)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "ash", "dash", "zsh"}
SECURE_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
}


def _pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] in ("Deployment", "Job", "StatefulSet"):
        return [obj["spec"]["template"]]
    if obj["kind"] == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        return [lwt["leaderTemplate"], lwt["workerTemplate"]]
    return []


def container_problems(where: str, c: dict[str, Any], pod_sc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    name = f"{where} container {c.get('name')}"
    image = c.get("image", "")
    tag = image.rpartition(":")[2] if ":" in image.rsplit("/", 1)[-1] else ""
    if "@sha256:" not in image and (not tag or tag == "latest"):
        out.append(f"{name}: image {image!r} is not pinned to a tag")
    for key in ("command", "args"):
        value = c.get(key, [])
        if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
            out.append(f"{name}: {key} must be a list of strings")
    argv = [*c.get("command", []), *c.get("args", [])]
    if argv and argv[0] in SHELLS:
        out.append(f"{name}: runs a shell ({argv[:2]})")
    if "-c" in argv and any(a in SHELLS for a in argv):
        out.append(f"{name}: shell string (sh -c)")
    resources = c.get("resources", {})
    for kind in ("requests", "limits"):
        for res in ("cpu", "memory"):
            if res not in resources.get(kind, {}):
                out.append(f"{name}: no {res} in resources.{kind}")
    for res, qty in resources.get("limits", {}).items():
        if "/" in res and resources.get("requests", {}).get(res) != qty:
            out.append(f"{name}: device {res} request must equal its limit")
    sc = c.get("securityContext", {})
    for key, want in SECURE_CONTAINER.items():
        if sc.get(key) != want:
            out.append(f"{name}: securityContext.{key} must be {want}")
    if sc.get("capabilities", {}).get("drop") != ["ALL"]:
        out.append(f"{name}: securityContext.capabilities.drop must be [ALL]")
    seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
    if seccomp.get("type") != "RuntimeDefault":
        out.append(f"{name}: seccompProfile must be RuntimeDefault")
    user = sc.get("runAsUser", pod_sc.get("runAsUser"))
    if not isinstance(user, int) or user == 0:
        out.append(f"{name}: runAsUser must be a numeric non-root uid")
    ports = {p["name"] for p in c.get("ports", [])}
    numbers = {p["containerPort"] for p in c.get("ports", [])}
    if ports:  # it serves: it must say when it is started, ready and alive
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe not in c:
                out.append(f"{name}: serves but has no {probe}")
            elif "grpc" in c[probe]:  # the endpoint picker's gRPC health (a port number)
                if c[probe]["grpc"].get("port") not in numbers:
                    out.append(f"{name}: {probe} targets a port the container does not "
                               "declare")
            elif c[probe].get("httpGet", {}).get("port") not in ports:
                out.append(f"{name}: {probe} targets a port the container does not declare")
    return out


LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}
ENGINE_PROBES = ("startupProbe", "livenessProbe")


def listen_hosts(argv: list[str]) -> list[str]:
    """Every `--host X` and `--host=X` an engine argv has (llama-server's X may be a list)."""
    hosts = [argv[i + 1] if i + 1 < len(argv) else "" for i, a in enumerate(argv)
             if a == "--host"]
    return hosts + [a.partition("=")[2] for a in argv if a.startswith("--host=")]


def pod_local(host: str) -> bool:
    """An address only the pod's own containers reach: loopback, or an abstract Unix socket
    (it lives in the pod's network namespace). A socket file would be reachable by whatever
    mounts its volume, so it does not count."""
    return host in LOOPBACK_HOSTS or (host.startswith("@") and host.endswith(".sock"))


def engine_pod_problems(where: str, pod: dict[str, Any]) -> list[str]:
    """The engine is reachable only through the gateway: it listens on loopback, declares no
    port a Service could target, and its probes go to the gateway's /enginez."""
    containers = {c["name"]: c for c in pod["containers"]}
    engine, gateway = containers.get(ENGINE_CONTAINER), containers.get(GATEWAY_CONTAINER)
    if engine is None:
        return []
    if gateway is None:
        return [f"{where}: an engine container without the gateway in front of it"]
    out: list[str] = []
    hosts = listen_hosts([*engine.get("command", []), *engine.get("args", [])])
    if len(hosts) != 1 or not all(pod_local(h) for h in hosts[0].split(",")):
        # vLLM listens on 0.0.0.0 without --host: the flag must be there, once, loopback.
        out.append(f"{where}: the engine must listen on loopback only, got --host {hosts}")
    if engine.get("ports"):
        out.append(f"{where}: the engine declares ports {engine['ports']}: keep it out of "
                   "Services")
    gateway_ports = {p["containerPort"] for p in gateway.get("ports", [])}
    for probe in ENGINE_PROBES:
        get = engine.get(probe, {}).get("httpGet", {})
        if get.get("path") != ENGINE_HEALTH_PATH or get.get("port") not in gateway_ports:
            out.append(f"{where}: engine {probe} must be the gateway's {ENGINE_HEALTH_PATH} "
                       f"on its port number {sorted(gateway_ports)}, got {get}")
    if "readinessProbe" in engine:
        out.append(f"{where}: the gateway's /readyz is the pod's readiness, not the engine's")
    out += stop_order_problems(where, pod, gateway, engine)
    return out


def _pre_stop_sleep(container: dict[str, Any]) -> int | None:
    seconds = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds")
    return seconds if isinstance(seconds, int) else None


def stop_order_problems(where: str, pod: dict[str, Any], gateway: dict[str, Any],
                        engine: dict[str, Any]) -> list[str]:
    """A stopping pod serves on while the endpoints drop it, drains, and only then loses its
    engine; SIGKILL comes after all of it."""
    out: list[str] = []
    gateway_wait, engine_wait = _pre_stop_sleep(gateway), _pre_stop_sleep(engine)
    if not gateway_wait:
        out.append(f"{where}: the gateway has no preStop sleep (it would stop accepting while "
                   "the endpoints still send it traffic)")
    if engine_wait is None or (gateway_wait and engine_wait <= gateway_wait):
        out.append(f"{where}: the engine's preStop sleep ({engine_wait}) must outlast the "
                   f"gateway's ({gateway_wait}) and its drain")
    grace = pod.get("terminationGracePeriodSeconds")
    if not isinstance(grace, int) or engine_wait is None or grace <= engine_wait:
        out.append(f"{where}: terminationGracePeriodSeconds {grace} must exceed the engine's "
                   f"preStop sleep {engine_wait}")
    return out


def architecture_problems(where: str, pod: dict[str, Any]) -> list[str]:
    """Every pod is pinned to the architectures its images have builds for: each required
    node selector term (they are ORed) has `kubernetes.io/arch In` some of ours."""
    required = (pod.get("affinity", {}).get("nodeAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution", {}))
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return [f"{where}: no required node affinity (the kubernetes.io/arch pin)"]
    out = []
    for index, term in enumerate(terms):
        pins = [e for e in term.get("matchExpressions", []) if e["key"] == "kubernetes.io/arch"]
        if (len(pins) != 1 or pins[0]["operator"] != "In" or not pins[0]["values"]
                or not set(pins[0]["values"]) <= {"amd64", "arm64"}):
            out.append(f"{where}: node selector term {index} lacks one kubernetes.io/arch In pin")
    return out


def object_problems(obj: dict[str, Any]) -> list[str]:
    out: list[str] = []
    meta = obj["metadata"]
    where = f"{obj['kind']} {meta.get('name')}"
    name = meta.get("name", "")
    if len(name) > 63 or not DNS_LABEL.match(name):
        out.append(f"{where}: name is not a DNS label of <= 63 characters")
    if not meta.get("namespace"):
        out.append(f"{where}: no namespace")
    labels = meta.get("labels", {})
    if labels.get("app.kubernetes.io/managed-by") != "glm-operator" or not (
        labels.get(SERVICE_LABEL) or labels.get("glm-operator.dev/model-version")
    ):
        out.append(f"{where}: missing managed-by / owner labels")
    owners = meta.get("ownerReferences", [])
    if len(owners) != 1 or not all(
        owners[0].get(k) for k in ("apiVersion", "kind", "name", "uid", "controller",
                                   "blockOwnerDeletion")
    ):
        out.append(f"{where}: needs one controller ownerReference with uid")
    for template in _pod_templates(obj):
        pod = template["spec"]
        pod_sc = pod.get("securityContext", {})
        if pod_sc.get("runAsNonRoot") is not True or not isinstance(pod_sc.get("runAsUser"), int):
            out.append(f"{where}: pod securityContext needs runAsNonRoot and a numeric runAsUser")
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            out += container_problems(where, c, pod_sc)
        mounted = {m["name"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
        declared = {v["name"] for v in pod.get("volumes", [])}
        if mounted - declared:
            out.append(f"{where}: mounts undeclared volumes {sorted(mounted - declared)}")
        out += engine_pod_problems(where, pod)
        out += architecture_problems(where, pod)
    if obj["kind"] == "Service" and obj["spec"].get("clusterIP") == "None":
        if obj["spec"].get("ports"):
            out.append(f"{where}: a headless Service names pods; it exposes no port")
    elif obj["kind"] == "Service" and labels.get(COMPONENT_LABEL) == EPP_COMPONENT:
        # The endpoint picker's own Service: its gRPC (the routers ask it) and metrics.
        targets = [p.get("targetPort") for p in obj["spec"].get("ports", [])]
        if targets != ["grpc", "metrics"]:
            out.append(f"{where}: the endpoint picker exposes grpc and metrics, got {targets}")
    elif obj["kind"] == "Service":
        targets = [p.get("targetPort") for p in obj["spec"].get("ports", [])]
        if any(t != GATEWAY_PORT_NAME for t in targets):
            out.append(f"{where}: targets {targets}; only the gateway port "
                       f"{GATEWAY_PORT_NAME!r} may be exposed")
    if obj["kind"] in ("Deployment", "StatefulSet"):
        selector = obj["spec"]["selector"]["matchLabels"]
        # The router and the endpoint picker serve every version: service and component.
        per_service = labels.get(COMPONENT_LABEL) in SERVICE_WIDE_COMPONENTS
        scope = (COMPONENT_LABEL,) if per_service else (VERSION_LABEL,)
        if SERVICE_LABEL not in selector or any(k not in selector for k in scope):
            out.append(f"{where}: selector must include the service and "
                       f"{'component' if per_service else 'version'} labels")
        pod_labels = obj["spec"]["template"]["metadata"]["labels"]
        if any(pod_labels.get(k) != v for k, v in selector.items()):
            out.append(f"{where}: pod labels do not match the selector")
    return out


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def group_problems(objects: list[dict[str, Any]]) -> list[str]:
    """Multi-node groups: workers serve no traffic (no pool Service selects them), one pod
    of a group per node, on the leader's kind of node, behind a NetworkPolicy (ggml-rpc-server
    and Ray authenticate nobody)."""
    out: list[str] = []
    templates = [(o, t) for o in objects for t in _pod_templates(o)]
    roles = {role: [(o, t) for o, t in templates
                    if t["metadata"]["labels"].get(GROUP_ROLE_LABEL) == role]
             for role in ("leader", "worker")}
    if not roles["worker"]:
        return out
    pool_services = [o["spec"]["selector"] for o in objects
                     if o["kind"] == "Service" and o["spec"].get("clusterIP") != "None"]
    policies = [o["spec"]["podSelector"]["matchLabels"] for o in objects
                if o["kind"] == "NetworkPolicy"]
    leader_affinity = [t["spec"].get("affinity", {}).get("nodeAffinity")
                       for _, t in roles["leader"]]
    for obj, t in roles["worker"]:
        where = f"{obj['kind']} {obj['metadata']['name']} worker"
        labels, pod = t["metadata"]["labels"], t["spec"]
        if any(_matches(sel, labels) for sel in pool_services):
            out.append(f"{where}: a pool Service selects it")
        if POOL_LABEL in labels:
            out.append(f"{where}: carries the pool label")
        if any(c["name"] == GATEWAY_CONTAINER for c in pod["containers"]):
            out.append(f"{where}: runs a gateway")
        terms = (pod.get("affinity", {}).get("podAntiAffinity", {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution", []))
        if not any(term.get("topologyKey") == "kubernetes.io/hostname" for term in terms):
            out.append(f"{where}: no required anti-affinity per node")
        if pod.get("affinity", {}).get("nodeAffinity") not in leader_affinity:
            out.append(f"{where}: node affinity differs from its leader's")
        if not any(_matches(sel, labels) for sel in policies):
            out.append(f"{where}: no NetworkPolicy guards it")
    return out


def problems(objects: list[dict[str, Any]]) -> list[str]:
    out = [p for obj in objects for p in object_problems(obj)]
    out += group_problems(objects)
    keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
    if len(keys) != len(set(keys)):
        out.append(f"two objects share a kind and name: {keys}")
    return out
