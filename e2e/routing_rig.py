"""The pieces of a routed service on this machine, shared by e2e/test_routing.py and
bench/routing.py: the router as its own process (`glm-operator router`) with a
ServiceAccount token against the local API server, and an engine pod served at its own
loopback IP (a real llama-server behind a real gateway, e2e/pod_serving.py).

What is real here: the API server (the router's watches, its Role, the scale subresource),
kwok's scheduling and pod IPs, the endpoint picker (e2e/epp.py), the gateways and the engines.
What this module plays is the kubelet: it starts each pod's processes at the pod's IP.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.gateway_process import GatewayProcess
from e2e.kubectl import Kubectl
from e2e.llama import LlamaServer
from e2e.ports import free_port
from e2e.test_gateway_wake import api_server_and_ca

ROUTER_ROLE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["apps"], "resources": ["deployments/scale"],
     "verbs": ["get", "patch", "update"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["get", "patch", "update"]},
]


@dataclass(frozen=True)
class ApiAccess:
    """Where and as whom a process here calls the API server (a ServiceAccount's token)."""

    server: str
    ca: str
    token: Path

    def args(self) -> list[str]:
        return ["--kube-api-server", self.server, "--kube-token-path", str(self.token),
                "--kube-ca-path", self.ca]


def service_account_access(kubectl: Kubectl, namespace: str, account: str, work: Path
                           ) -> ApiAccess:
    work.mkdir(parents=True, exist_ok=True)
    token = work / f"token-{account}"
    token.write_text(kubectl.run("create", "token", account, "-n", namespace,
                                 "--duration", "2h").stdout.strip())
    server, ca = api_server_and_ca(kubectl, work)
    return ApiAccess(server, ca, token)


def router_rbac(namespace: str, account: str) -> list[dict[str, Any]]:
    """A ServiceAccount and the Role the router needs (as the operator renders it)."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": account}, "rules": ROUTER_ROLE_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": account},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
    ]


class RouterProcess(GatewayProcess):
    """`glm-operator router` as its own process: the gateway's process handling
    (its log, /metrics, the SIGTERM stop), started with the router's flags."""

    @classmethod
    def launch(cls, args: Sequence[str], access: ApiAccess, log_dir: Path,
               host: str = "127.0.0.1", port: int | None = None,
               timeout: float = 60.0) -> RouterProcess:
        """`args`: the router's flags (the rendered ones, or a bench's); the listen address
        and the API access are this machine's. Returns once /readyz answers 200."""
        port = port or free_port()
        argv = [sys.executable, "-m", "glm_operator.cli", "router", *args,
                "--host", host, "--port", str(port), *access.args()]
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"router-{host}-{port}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True,
                                       env={**os.environ, "HOSTNAME": f"router-{port}"})
        router = cls(process, port, log_path, host)
        try:
            router.wait("/readyz", timeout)
        except BaseException:
            router.stop()
            raise
        return router


class EngineAtPodIP:
    """A real llama-server (on a free loopback port) behind a real gateway bound at the pod's
    own IP and port, where the picker and the router reach it."""

    def __init__(self, name: str, pod_ip: str, engine_argv: Sequence[str],
                 gateway_args: Sequence[str], service: str, work: Path,
                 pod_port: int = 8080) -> None:
        self.name, self.pod_ip, self.pod_port = name, pod_ip, pod_port
        self.engine = LlamaServer.start(list(engine_argv), work / name)
        try:
            self.gateway = GatewayProcess.start(self.engine.url, work / name, gateway_args,
                                                service_name=service, port=pod_port,
                                                host=pod_ip)
        except BaseException:
            self.engine.stop()
            raise

    @property
    def address(self) -> str:
        return f"{self.pod_ip}:{self.pod_port}"

    @property
    def url(self) -> str:
        return self.gateway.url

    def stop(self) -> None:
        self.gateway.stop()
        self.engine.stop()
