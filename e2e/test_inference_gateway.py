"""The InferencePools, pickers and HTTPRoute of spec.routing.mode InferenceGateway against the
real CRDs: the Inference Extension's InferencePool (v1.5.0) and Gateway API's HTTPRoute
(v1.4.1), server-side applied on the local control plane (not a dry run) and read back
unchanged; what their schemas refuse is refused, and what they admit but the operator must
never write (a weight over 100, a backend that is not a pool) is caught by check_route. And
a pool's picker, the real v1.5.0 `epp`, started here on its rendered flags as its rendered
ServiceAccount: it reads its pool (control: with the router picker's Role it cannot), with
the InferenceModelRewrite CRD served too, which it then watches.
"""

from __future__ import annotations

import contextlib
import copy
import socket
import socketserver
import ssl
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from glm_operator.api.glmservice import FailureMode, GatewayRef
from glm_operator.config import OperatorConfig
from glm_operator.render.endpoint_picker import epp_rules
from glm_operator.render.inference_pool import (
    GatewayInputs,
    build_http_route,
    build_inference_gateway,
    check_route,
)
from glm_operator.render.traffic import VersionRoute

from e2e.epp import POD_PORT, EndpointPicker, EndpointPickerError, epp_binary, pick
from e2e.inference_crds import inference_crds
from e2e.kubectl import Kubectl, KubectlError, to_yaml, wait_for
from e2e.pod_serving import LOOPBACK_PLACEMENT, loopback_pod_ip
from e2e.routing_rig import service_account_access

__all__ = ["epp_binary", "inference_crds"]  # fixtures, used by name

POOLS = "inferencepools.inference.networking.k8s.io"
ROUTES = "httproutes.gateway.networking.k8s.io"
RULES = "destinationrules.networking.istio.io"
CANARY = (VersionRoute("glm-4-9b-q4", 75), VersionRoute("glm-4.6-q4", 25))


def rendered(namespace: str, routes: tuple[VersionRoute, ...] = CANARY) -> list[dict[str, Any]]:
    # No owner: a reference to a GLMService that does not exist would be collected at once.
    return build_inference_gateway(GatewayInputs(
        service="chat", namespace=namespace,
        gateway=GatewayRef(name="inference-gw", namespace="infra", section_name="http"),
        hostnames=[f"chat.{namespace}.svc.cluster.local", "chat.example.com"], routes=routes,
        failure_mode=FailureMode.FAIL_OPEN, config=OperatorConfig(), owner=None, istio=True))


def refused(kubectl: Kubectl, obj: dict[str, Any], namespace: str) -> str:
    with pytest.raises(KubectlError) as caught:
        kubectl.apply(obj, namespace=namespace)
    return str(caught.value)


def admitted_by_dry_run(kubectl: Kubectl, obj: dict[str, Any], namespace: str) -> None:
    kubectl.run("apply", "--server-side", "--dry-run=server", "--field-manager=glm-e2e",
                "-n", namespace, "-f", "-", input=to_yaml(obj))


def test_every_pool_route_and_picker_rule_is_applied_and_read_back_unchanged(
        kubectl: Kubectl, namespace: str, inference_crds: list[str]) -> None:
    objects = rendered(namespace)
    kubectl.apply(objects, namespace=namespace)  # the pickers' Deployments and RBAC too
    checked = []
    for obj in objects:
        resource = {"InferencePool": POOLS, "HTTPRoute": ROUTES,
                    "DestinationRule": RULES}.get(obj["kind"])
        if resource is None:
            continue
        live = kubectl.get_json(resource, obj["metadata"]["name"], "-n", namespace)
        assert live["spec"] == obj["spec"], obj["metadata"]["name"]
        assert live["metadata"]["labels"] == obj["metadata"]["labels"]
        checked.append(obj["kind"])
    assert sorted(checked) == ["DestinationRule"] * 2 + ["HTTPRoute"] + ["InferencePool"] * 2
    # The pickers' Services are what the pools name.
    for pool in kubectl.items(POOLS, "-n", namespace):
        ref = pool["spec"]["endpointPickerRef"]
        service = kubectl.get_json("service", ref["name"], "-n", namespace)
        assert ref["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    # A rollback's route (one version at 100) applies over the canary's: the weights move.
    kubectl.apply(build_http_route_for(namespace, (VersionRoute("glm-4-9b-q4", 100),)),
                  namespace=namespace)
    route = kubectl.get_json(ROUTES, "chat", "-n", namespace)
    assert [b["weight"] for b in route["spec"]["rules"][-1]["backendRefs"]] == [100]


def build_http_route_for(namespace: str, routes: tuple[VersionRoute, ...]) -> dict[str, Any]:
    [route] = [o for o in rendered(namespace, routes) if o["kind"] == "HTTPRoute"]
    return route


def pool_of(namespace: str) -> dict[str, Any]:
    return next(o for o in rendered(namespace) if o["kind"] == "InferencePool")


def test_the_pool_schema_refuses_what_the_gateway_could_not_use(
        kubectl: Kubectl, namespace: str, inference_crds: list[str]) -> None:
    pool = pool_of(namespace)
    unknown_mode = copy.deepcopy(pool)
    unknown_mode["spec"]["endpointPickerRef"]["failureMode"] = "Sometimes"
    message = refused(kubectl, unknown_mode, namespace)
    assert "spec.endpointPickerRef.failureMode" in message and "Unsupported value" in message
    no_port = copy.deepcopy(pool)
    del no_port["spec"]["endpointPickerRef"]["port"]
    assert "port is required when kind is 'Service'" in refused(kubectl, no_port, namespace)
    twice = copy.deepcopy(pool)
    twice["spec"]["targetPorts"] *= 2
    assert "port number must be unique" in refused(kubectl, twice, namespace)
    # The control: the pool as rendered is admitted.
    kubectl.apply(pool, namespace=namespace)


def test_the_route_schema_refuses_its_bounds_and_check_route_what_it_admits(
        kubectl: Kubectl, namespace: str, inference_crds: list[str]) -> None:
    route = build_http_route(GatewayInputs(
        service="chat", namespace=namespace, gateway=GatewayRef(name="inference-gw"),
        hostnames=["chat.example.com"], routes=CANARY, failure_mode=FailureMode.FAIL_OPEN,
        config=OperatorConfig(), owner=None))
    huge = copy.deepcopy(route)
    huge["spec"]["rules"][-1]["backendRefs"][0]["weight"] = 1_000_001
    message = refused(kubectl, huge, namespace)
    assert "backendRefs[0].weight" in message and "1000000" in message
    crowded = copy.deepcopy(route)
    crowded["spec"]["rules"][-1]["backendRefs"] *= 9  # 18 > 16
    assert "spec.rules[2].backendRefs" in refused(kubectl, crowded, namespace)

    # What the CRD admits (a weight is not a percentage to it, any kind may be a backend)
    # and the operator must never write: check_route refuses both.
    over = copy.deepcopy(route)
    over["spec"]["rules"][-1]["backendRefs"][0]["weight"] = 101
    admitted_by_dry_run(kubectl, over, namespace)
    with pytest.raises(ValueError, match=r"weights must be 0\.\.100 and sum to 100"):
        check_route(over)
    foreign = copy.deepcopy(route)
    foreign["spec"]["rules"][0]["backendRefs"][0].update(group="example.com", kind="Foo")
    admitted_by_dry_run(kubectl, foreign, namespace)
    with pytest.raises(ValueError, match="not an InferencePool"):
        check_route(foreign)
    # The control: the route as rendered passes both and is stored unchanged.
    check_route(route)
    kubectl.apply(route, namespace=namespace)
    assert kubectl.get_json(ROUTES, "chat", "-n", namespace)["spec"] == route["spec"]


# --- a pool's picker, the real v1.5.0 binary, with its rendered flags and Role -----------------


class PoolPicker(EndpointPicker):
    """The rendered picker of one pool as a process here: its container's flags as rendered,
    with this machine's free ports and a local copy of its config file."""

    def __init__(self, binary: Path, kubeconfig: Path, deployment: dict[str, Any],
                 config_text: str, namespace: str, work: Path) -> None:
        super().__init__(binary, kubeconfig, deployment["metadata"]["name"], namespace, work,
                         config=config_text)
        self.rendered = deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    def argv(self) -> list[str]:
        config_file = self.work / f"{self.service}-config.yaml"
        config_file.write_text(self.config)
        ports = {"--grpc-port": self.grpc_port, "--grpc-health-port": self.health_port,
                 "--metrics-port": self.metrics_port, "--config-file": config_file}
        args = list(self.rendered)
        for flag, value in ports.items():
            args[args.index(flag) + 1] = str(value)
        return [str(self.binary), *args]


def account_kubeconfig(kubectl: Kubectl, namespace: str, account: str, work: Path) -> Path:
    """A kubeconfig that is the ServiceAccount (its token), as the picker's pod would be."""
    access = service_account_access(kubectl, namespace, account, work)
    path = work / f"kubeconfig-{account}"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "local", "cluster": {"server": access.server,
                                                   "certificate-authority": access.ca}}],
        "users": [{"name": "sa", "user": {"tokenFile": str(access.token)}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}]}))
    return path


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def test_a_pools_picker_starts_on_its_rendered_flags_and_reads_its_pool_with_its_role(
        kubectl: Kubectl, namespace: str, inference_crds: list[str], epp_binary: Path,
        tmp_path: Path) -> None:
    routes = (VersionRoute("v1", 100),)
    objects = [o for o in rendered(namespace, routes) if o["kind"] != "Deployment"]
    kubectl.apply(objects, namespace=namespace)  # account, Role, binding, config, pool, route
    deployment = named(rendered(namespace, routes), "Deployment", "chat-epp-v1")
    config = named(objects, "ConfigMap", "chat-epp-v1")["data"]["config.yaml"]
    kubeconfig = account_kubeconfig(kubectl, namespace, "chat-epp-v1", tmp_path)
    # SERVING is the picker's "pool synced": it read InferencePool chat-v1 (by name, the
    # Role's resourceNames) and watches the pods, InferenceObjectives and
    # InferenceModelRewrites its Role allows.
    with PoolPicker(epp_binary, kubeconfig, deployment, config, namespace,
                    tmp_path / "picker").start(timeout=45) as picker:
        assert picker.health()
        log = picker.log_tail(400)
        assert "forbidden" not in log.lower(), log

    # The control: the router's picker's Role (pods only) cannot read the pool; the same
    # flags never get to SERVING.
    narrow = copy.deepcopy(named(objects, "Role", "chat-epp-v1"))
    narrow["metadata"]["name"] = "narrow"
    narrow["rules"] = epp_rules()
    binding = copy.deepcopy(named(objects, "RoleBinding", "chat-epp-v1"))
    binding["metadata"]["name"] = "narrow"
    binding["roleRef"]["name"] = "narrow"
    binding["subjects"][0]["name"] = "narrow"
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "narrow"}}
    kubectl.apply([account, narrow, binding], namespace=namespace)
    narrow_picker = PoolPicker(
        epp_binary, account_kubeconfig(kubectl, namespace, "narrow", tmp_path), deployment,
        config, namespace, tmp_path / "narrow")
    with pytest.raises(EndpointPickerError, match="not SERVING"):
        narrow_picker.start(timeout=10)
    # The whole log, not the error's tail: the refusal is logged once, at the first list, and
    # "Pool is not initialized" lines repeat after it for the rest of the wait.
    log = narrow_picker.log_path.read_text(errors="replace")
    refusals = [line for line in log.splitlines()
                if "inferencepools" in line and "forbidden" in line]
    assert refusals, log[-4000:]


class TlsRelay:
    """Plain TCP here, TLS to the picker, verifying nothing: as the gateways reach a picker
    whose certificate is its own (self-signed, no names; Istio's DestinationRule says
    insecureSkipVerify). gRPC's own TLS cannot skip the check, so the client talks h2c to
    this relay and the relay speaks TLS with ALPN h2 to the picker."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(["h2"])
        self.context = context
        relay = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                relay._pipe(self.request)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def _pipe(self, client: socket.socket) -> None:
        with socket.create_connection(self.target, timeout=10) as raw, \
                self.context.wrap_socket(raw) as upstream:
            upstream.settimeout(None)

            def copy(src: socket.socket, dst: socket.socket) -> None:
                with contextlib.suppress(OSError):
                    while data := src.recv(65536):
                        dst.sendall(data)
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)

            back = threading.Thread(target=copy, args=(upstream, client), daemon=True)
            back.start()
            copy(client, upstream)
            back.join(timeout=10)

    def __enter__(self) -> TlsRelay:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def version_pod(name: str, version: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"glm-operator.dev/service": "chat",
                                                  "glm-operator.dev/pool": "main",
                                                  "glm-operator.dev/version": version}},
            "spec": {**LOOPBACK_PLACEMENT,
                     "containers": [{"name": "gateway", "image": "glm-operator:e2e",
                                     "ports": [{"name": "http", "containerPort": POD_PORT}]}]}}


def picked(channel: grpc.Channel) -> str | None:
    try:
        return pick(channel, "chat", "hello").endpoint
    except grpc.RpcError:
        return None


def test_a_pools_picker_answers_over_tls_with_its_own_versions_pods_only(
        kubectl: Kubectl, namespace: str, inference_crds: list[str], epp_binary: Path,
        tmp_path: Path) -> None:
    kubectl.apply([version_pod("v1-a", "v1"), version_pod("v1-b", "v1"),
                   version_pod("v2-a", "v2")], namespace=namespace)

    def ips() -> dict[str, str] | None:
        pods = {p["metadata"]["name"]: p for p in kubectl.items("pods", "-n", namespace)}
        ready = {n: p for n, p in pods.items()
                 if any(c["type"] == "Ready" and c["status"] == "True"
                        for c in (p.get("status") or {}).get("conditions") or [])}
        return ({n: loopback_pod_ip(p) for n, p in ready.items()}
                if {"v1-a", "v1-b", "v2-a"} <= set(ready) else None)

    pod_ips = wait_for(ips, timeout=30, what="three Ready pods with IPs")
    routes = (VersionRoute("v1", 75), VersionRoute("v2", 25))
    everything = rendered(namespace, routes)
    kubectl.apply([o for o in everything if o["kind"] != "Deployment"], namespace=namespace)
    picks: dict[str, set[str]] = {}
    for version in ("v1", "v2"):
        name = f"chat-epp-{version}"
        config = named(everything, "ConfigMap", name)["data"]["config.yaml"]
        kubeconfig = account_kubeconfig(kubectl, namespace, name, tmp_path)
        with PoolPicker(epp_binary, kubeconfig, named(everything, "Deployment", name),
                        config, namespace, tmp_path / name).start(timeout=45) as picker, \
                TlsRelay(("127.0.0.1", picker.grpc_port)) as relay, \
                grpc.insecure_channel(relay.address) as channel:
            # Its ext-proc port opens once its certificate is made (after SERVING), and it
            # learns the pool's pods from its watch: wait for the first answer.
            first = wait_for(lambda: picked(channel), timeout=30, what=f"{name}'s first pick")
            picks[version] = {first} | {pick(channel, "chat", f"hello {i}").endpoint or ""
                                        for i in range(12)}
    by_ip = {f"{ip}:{POD_PORT}": name for name, ip in pod_ips.items()}
    assert {by_ip[e] for e in picks["v1"]} <= {"v1-a", "v1-b"}, picks
    # The control: the other version's pod is Ready and a candidate of its own pool's picker.
    assert {by_ip[e] for e in picks["v2"]} == {"v2-a"}, picks
