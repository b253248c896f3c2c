"""LeaderWorkerSet's real controller, next to a local control plane of its own.

    the operator applies a LeaderWorkerSet
      -> API server -> lws-mutating/validating webhooks -> Service lws-system/lws-webhook-service
      -> EndpointSlice -> lws-manager on 10.250.a.b+2:9443 in a network namespace (e2e/netns.py)
    lws-manager creates the leader StatefulSet, its pod webhook labels the pods, and it creates
    one worker StatefulSet per group; kube-controller-manager, kube-scheduler and kwok do the rest.

`lws-manager` is the sigs.k8s.io/lws module's own `cmd` (built by e2e/toolchain.py, with its
CRD and webhook manifests), run with the configuration its Helm chart gives it: internal
certificate management (it makes its CA, fills the Secret and patches the webhooks' caBundle),
no leader election. In a pod the kubelet mounts that Secret where the webhook server reads its
certificate; here `start()` copies it there once filled, as the Secret volume would.

The pod webhook (objectSelector: LeaderWorkerSet pods) and the real CRD change what every
operator on a cluster renders, so the tests run this on a cluster of their own.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from e2e import toolchain
from e2e.kubectl import Kubectl, wait_for
from e2e.netns import NetnsError, VethNamespace

NAMESPACE = "lws-system"  # where lws-manager looks for its Secret and webhook Service
SERVICE = "lws-webhook-service"
SECRET = "lws-webhook-server-cert"
WEBHOOK_PORT = 9443
HEALTH_PORT = 8081
POD_SELECTOR = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name",
                                      "operator": "Exists"}]}
FIELD_MANAGER = "glm-e2e-lws"


class LwsController:
    def __init__(self, kubectl: Kubectl, netns: VethNamespace) -> None:
        self.kubectl = kubectl
        self.netns = netns
        self.workdir = Path(tempfile.mkdtemp(prefix="glm-e2e-lws-"))
        self.certs = self.workdir / "certs"
        self.log_path = self.workdir / "lws-manager.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LwsController:
        bin_dir = toolchain.ensure("lws")
        self.netns.create()
        crd = yaml.safe_load((bin_dir / "lws-leaderworkersets.yaml").read_text())
        self.kubectl.apply([crd, *self._objects(bin_dir)], field_manager=FIELD_MANAGER)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.netns.exec_argv([
                str(bin_dir / "lws-manager"), f"--config={self._config()}",
                f"--kubeconfig={self._kubeconfig()}"]),
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        self._mount_certificate()
        wait_for(self._ready, timeout=90, what="lws-manager ready (webhooks serving)")
        return self

    def _objects(self, bin_dir: Path) -> list[dict[str, Any]]:
        objects: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            # Filled by lws-manager's certificate rotation.
            {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": SECRET, "namespace": NAMESPACE}},
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": SERVICE, "namespace": NAMESPACE},
             "spec": {"ports": [{"name": "https", "port": 443, "targetPort": WEBHOOK_PORT,
                                 "protocol": "TCP"}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": {
                 "kubernetes.io/service-name": SERVICE,
                 "endpointslice.kubernetes.io/managed-by": FIELD_MANAGER}},
             "addressType": "IPv4",
             "ports": [{"name": "https", "port": WEBHOOK_PORT, "protocol": "TCP"}],
             "endpoints": [{"addresses": [self.netns.inner_ip], "conditions": {"ready": True}}]},
        ]
        # The module's webhooks, named and pointed as its kustomize overlay does (lws- prefix,
        # lws-system), the pod webhooks limited to LeaderWorkerSet pods as its overlay patches.
        for doc in yaml.safe_load_all((bin_dir / "lws-webhooks.yaml").read_text()):
            if not doc:
                continue
            doc["metadata"]["name"] = f"lws-{doc['metadata']['name']}"
            for hook in doc["webhooks"]:
                hook["clientConfig"]["service"].update(name=SERVICE, namespace=NAMESPACE,
                                                       port=443)
                if any("pods" in rule["resources"] for rule in hook["rules"]):
                    hook["objectSelector"] = POD_SELECTOR
            objects.append(doc)
        return objects

    def _config(self) -> Path:
        path = self.workdir / "config.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "config.lws.x-k8s.io/v1alpha1", "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE,
                                       "webhookSecretName": SECRET},
            "webhook": {"port": WEBHOOK_PORT, "host": self.netns.inner_ip,
                        "certDir": str(self.certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"{self.netns.inner_ip}:{HEALTH_PORT}"},
        }))
        return path

    def _kubeconfig(self) -> Path:
        return self.netns.kubeconfig_inside(self.kubectl.kubeconfig, self.workdir / "kubeconfig")

    def _mount_certificate(self) -> None:
        def filled() -> dict[str, str] | None:
            self._check_running()
            data = self.kubectl.get_json("secret", SECRET, "-n", NAMESPACE).get("data") or {}
            return data if {"tls.crt", "tls.key"} <= set(data) else None

        data = wait_for(filled, timeout=60, what=f"lws-manager to fill Secret {SECRET}")
        self.certs.mkdir(exist_ok=True)
        for name, value in data.items():
            (self.certs / name).write_bytes(base64.b64decode(value))

    def _ready(self) -> bool:
        """Its readiness endpoint answers and its webhook server accepts connections (it
        starts only once the certificate is in place)."""
        self._check_running()
        with contextlib.suppress(OSError):
            url = f"http://{self.netns.inner_ip}:{HEALTH_PORT}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status != 200:
                    return False
            with socket.create_connection((self.netns.inner_ip, WEBHOOK_PORT), timeout=2):
                return True
        return False

    def _check_running(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"lws-manager exited with {self.proc.returncode}:\n"
                                 f"{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        with contextlib.suppress(NetnsError):
            self.netns.remove()
        subprocess.run(["rm", "-rf", str(self.workdir)], check=False)
