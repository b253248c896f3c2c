"""The custom metrics API (custom.metrics.k8s.io) on the local control plane, served through
the API server's aggregation layer by the upstream custom-metrics-apiserver's `test-adapter`.

prometheus-adapter is built on the same library (sigs.k8s.io/custom-metrics-apiserver); its
test adapter serves whatever value a test POSTs for an object, instead of a PromQL answer. So
everything between the HPA controller and a metric value is the real thing:

    kube-controller-manager (HPA controller)
      -> kube-apiserver: GET /apis/custom.metrics.k8s.io/v1beta2/namespaces/NS/pods/*/METRIC
      -> aggregation layer: APIService v1beta2.custom.metrics.k8s.io -> Service -> EndpointSlice
      -> test-adapter on 10.250.a.b+2:6443 (TLS, its CA in the APIService's caBundle), which
         authenticates the proxied request by the front-proxy certificate and the X-Remote-*
         headers, and asks the API server whether that user may read it (SubjectAccessReview)

The adapter runs in a network namespace (e2e/netns.py), because an EndpointSlice refuses a
loopback address and there is no kube-proxy to route a ClusterIP: the API server dials the
endpoint address (--enable-aggregator-routing, e2e/cluster.py). It reaches the API server back
on the veth pair's host end.

    with CustomMetricsAdapter(kubectl, kubeconfig).start() as adapter:
        adapter.set_pod_metric("ns", "pod-a", "glm_gateway_requests_queued", "6")

Fixture
-------
custom_metrics (module)
    A started `CustomMetricsAdapter`, registered until the end of the module (an unavailable
    APIService would hold up namespace deletion for everyone, so it is never left behind).
    Needs root for the network namespace: in CI (CI=true) the test FAILS when it cannot start;
    locally it is skipped with the reason.
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from e2e import cluster as local_cluster
from e2e import toolchain
from e2e.conftest import LocalCluster, in_ci
from e2e.kubectl import Kubectl, KubectlError, wait_for
from e2e.netns import NetnsError, VethNamespace

GROUP = "custom.metrics.k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # the HPA controller prefers the newest
NAMESPACE = "glm-e2e-custom-metrics"
SERVICE = "custom-metrics-apiserver"
SECURE_PORT = 6443
WRITE_PORT = 8080  # fixed in the test adapter's main.go; its own namespace keeps it apart
FIELD_MANAGER = "glm-e2e-custom-metrics"
START_TIMEOUT = 90.0
LOG_TAIL_LINES = 40


class CustomMetricsError(RuntimeError):
    """The adapter did not start or register, or refused a value."""


def binary() -> Path:
    return toolchain.bin_dir("custom_metrics_apiserver") / "test-adapter"


class CustomMetricsAdapter:
    def __init__(self, kubectl: Kubectl, kubeconfig: Path,
                 netns: VethNamespace | None = None) -> None:
        self.kubectl = kubectl
        self.kubeconfig = kubeconfig
        self.netns = netns or VethNamespace.for_cluster()
        self.workdir = Path(tempfile.mkdtemp(prefix="glm-e2e-custom-metrics-"))
        self.log_path = self.workdir / "adapter.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def write_url(self) -> str:
        return f"http://{self.netns.inner_ip}:{WRITE_PORT}/write-metrics"

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> CustomMetricsAdapter:
        _check_aggregation_flags()
        try:
            toolchain.ensure("custom_metrics_apiserver")
            self.netns.create()
            cert, key = self._serving_certificate()
            kubeconfig = self._adapter_kubeconfig()
            with self.log_path.open("wb") as log:
                self.proc = subprocess.Popen(self.netns.exec_argv([
                    str(binary()),
                    f"--secure-port={SECURE_PORT}",
                    f"--bind-address={self.netns.inner_ip}",
                    f"--tls-cert-file={cert}", f"--tls-private-key-file={key}",
                    f"--lister-kubeconfig={kubeconfig}",
                    f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}",
                    "--v=2",
                ]), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
            self._register(cert)
            self._wait_available()
        except BaseException:
            self.stop(failed=True)
            raise
        return self

    def _serving_certificate(self) -> tuple[Path, Path]:
        """A self-signed certificate for the name the aggregation layer verifies
        (<service>.<namespace>.svc); it is its own CA in the APIService's caBundle."""
        cert, key = self.workdir / "serving.crt", self.workdir / "serving.key"
        dns = f"{SERVICE}.{NAMESPACE}.svc"
        result = subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", f"/CN={dns}",
             "-addext", f"subjectAltName=DNS:{dns}", "-keyout", str(key), "-out", str(cert)],
            capture_output=True, text=True, check=False, timeout=30)
        if result.returncode != 0:
            raise CustomMetricsError(f"openssl could not make the serving certificate: "
                                     f"{result.stderr.strip()}")
        return cert, key

    def _adapter_kubeconfig(self) -> Path:
        return self.netns.kubeconfig_inside(self.kubeconfig, self.workdir / "kubeconfig")

    def _objects(self, ca_bundle: str) -> list[dict[str, Any]]:
        labels = {"app.kubernetes.io/name": SERVICE, "glm-operator.dev/e2e": "true"}
        objects: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": NAMESPACE, "labels": labels}},
            # No selector: its one endpoint is the address in the network namespace.
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": labels},
             "spec": {"ports": [{"name": "https", "port": 443, "targetPort": SECURE_PORT,
                                 "protocol": "TCP"}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": {
                 **labels, "kubernetes.io/service-name": SERVICE,
                 "endpointslice.kubernetes.io/managed-by": FIELD_MANAGER}},
             "addressType": "IPv4",
             "ports": [{"name": "https", "port": SECURE_PORT, "protocol": "TCP"}],
             "endpoints": [{"addresses": [self.netns.inner_ip],
                            "conditions": {"ready": True}}]},
        ]
        for priority, version in zip((200, 100), VERSIONS, strict=True):
            objects.append({
                "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": {"name": f"{version}.{GROUP}", "labels": labels},
                "spec": {"group": GROUP, "version": version, "groupPriorityMinimum": 100,
                         "versionPriority": priority, "caBundle": ca_bundle,
                         "service": {"name": SERVICE, "namespace": NAMESPACE, "port": 443}},
            })
        return objects

    def _register(self, cert: Path) -> None:
        ca_bundle = base64.b64encode(cert.read_bytes()).decode()
        self.kubectl.apply(self._objects(ca_bundle), field_manager=FIELD_MANAGER)

    def _wait_available(self) -> None:
        def available() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise CustomMetricsError(f"test-adapter exited with {self.proc.returncode}:\n"
                                         f"{self.log_tail()}")
            for version in VERSIONS:
                service = self.kubectl.get_json("apiservice", f"{version}.{GROUP}")
                conditions = service.get("status", {}).get("conditions", [])
                if not any(c["type"] == "Available" and c["status"] == "True"
                           for c in conditions):
                    return False
            return True

        try:
            wait_for(available, timeout=START_TIMEOUT,
                     what=f"APIServices {', '.join(VERSIONS)} of {GROUP} Available")
        except AssertionError as exc:
            statuses = self.kubectl.run("get", "apiservice", f"{VERSIONS[0]}.{GROUP}", "-o",
                                        "jsonpath={.status}", check=False).stdout
            raise CustomMetricsError(f"{exc}\nAPIService status: {statuses}\nadapter log:\n"
                                     f"{self.log_tail()}") from None

    def stop(self, failed: bool = False) -> None:
        """Unregister first (an APIService without a server breaks discovery and namespace
        deletion), then stop the adapter and remove the network namespace."""
        for version in VERSIONS:
            self.kubectl.run("delete", "apiservice", f"{version}.{GROUP}", "--ignore-not-found",
                             "--wait=true", "--timeout=30s", check=False)
        # Waited for, so a later start does not meet it Terminating.
        self.kubectl.run("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true",
                         "--timeout=60s", check=False)
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            if failed:
                print(f"\n--- test-adapter log tail ({self.log_path}) ---\n{self.log_tail()}")
        with contextlib.suppress(NetnsError):
            self.netns.remove()
        subprocess.run(["rm", "-rf", str(self.workdir)], check=False)

    def __enter__(self) -> CustomMetricsAdapter:
        return self if self.proc is not None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop(failed=exc_type is not None)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- values ----------------------------------------------------------------------------

    def set_pod_metric(self, namespace: str, pod: str, metric: str, value: str) -> None:
        """From now on the custom metrics API answers `value` (a Kubernetes quantity) for
        `metric` of `pod`."""
        url = f"{self.write_url}/namespaces/{namespace}/pods/{pod}/{metric}"
        request = urllib.request.Request(url, data=json.dumps(value).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
        except urllib.error.HTTPError as err:
            raise CustomMetricsError(f"the adapter refused {metric}={value!r} for pod "
                                     f"{namespace}/{pod}: HTTP {err.code} "
                                     f"{err.read().decode(errors='replace')}") from None

    def pod_metrics(self, namespace: str, metric: str,
                    selector: str | None = None) -> dict[str, str]:
        """What the API server answers for `metric` of the pods (pod name -> quantity): the
        request the HPA controller makes, through the aggregation layer."""
        path = f"/apis/{GROUP}/{VERSIONS[0]}/namespaces/{namespace}/pods/*/{metric}"
        if selector:
            path += f"?labelSelector={urllib.parse.quote(selector)}"
        try:
            body = json.loads(self.kubectl("get", "--raw", path).stdout)
        except KubectlError as exc:
            raise CustomMetricsError(f"GET {path} failed: {exc}") from None
        return {item["describedObject"]["name"]: item["value"] for item in body["items"]}


def _check_aggregation_flags() -> None:
    """A local cluster started before e2e/cluster.py passed the aggregation-layer flags cannot
    reach the adapter; say so instead of timing out."""
    servers = [p.command for p in local_cluster.cluster_processes()
               if "kube-apiserver" in p.command.split(" ", 1)[0]]
    if servers and "--enable-aggregator-routing=true" not in servers[0]:
        raise CustomMetricsError(
            "the local kube-apiserver runs without --enable-aggregator-routing and the "
            "request-header flags (started by an older e2e/cluster.py): restart it with "
            "`python -m e2e.cluster down && python -m e2e.cluster up`")


@pytest.fixture(scope="module")
def custom_metrics(cluster: LocalCluster, kubectl: Kubectl) -> Iterator[CustomMetricsAdapter]:
    try:
        if cluster.flavour != "kwok":
            raise CustomMetricsError("the custom metrics adapter runs on the local control "
                                     "plane only (GLM_E2E_KIND is set)")
        adapter = CustomMetricsAdapter(kubectl, cluster.kubeconfig).start()
    except (CustomMetricsError, NetnsError, toolchain.BuildError, KubectlError) as exc:
        message = f"the custom metrics API could not start: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield adapter
    finally:
        adapter.stop()
