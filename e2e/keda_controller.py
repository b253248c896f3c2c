"""KEDA's real operator and metrics API server on the local control plane.

Both are built from the KEDA module (e2e/keda_build.py: the toolchain component
`keda_controller`, trimmed to the prometheus/cpu/memory triggers) and run as processes on this
machine with the cluster's admin kubeconfig, so no RBAC is needed:

    keda-operator (this machine)          reconciles ScaledObjects into the HPA keda-hpa-<name>,
      |                                   runs their Prometheus queries, serves the values
      | gRPC + mutual TLS on              over gRPC
      | 10.251.a.b+1:9666 (veth host end)
    keda-adapter (network namespace)      external.metrics.k8s.io, asks the operator
      ^ 10.251.a.b+2:6443
    kube-apiserver: APIService v1beta1.external.metrics.k8s.io -> Service -> EndpointSlice
      ^
    kube-controller-manager: KEDA's HPA, External metrics of type AverageValue

The metrics API server sits in a network namespace of its own (e2e/netns.py, link "k": not
the custom metrics adapter's, so both can run on one cluster), because an EndpointSlice
refuses a loopback address and there is no kube-proxy (the API server dials the endpoint
address: --enable-aggregator-routing, e2e/cluster.py).

Certificates: KEDA's own rotation (`--enable-cert-rotation`) writes a Secret and patches the
APIService and webhooks for an in-cluster install; it is off here. Instead one CA signs one
certificate (serverAuth and clientAuth; the Services' DNS names and both veth addresses) laid
out as KEDA's cert dir expects it (`ca.crt`, `tls.crt`, `tls.key`): the operator's gRPC server
and the adapter's gRPC client authenticate each other with it (KEDA's mutual TLS), the adapter
serves the aggregation layer with it, and the CA is the APIService's caBundle.

Besides ScaledObject (installed by e2e/cluster.py), the operator's controllers watch
ScaledJob, TriggerAuthentication, ClusterTriggerAuthentication, CloudEventSource and
ClusterCloudEventSource and stop when one is not served: those CRDs, from the same module,
are applied here and left installed (they are inert without KEDA).

    with KedaController(kubectl, kubeconfig).start() as keda:
        ...   # ScaledObjects are scaled from here on

Fixture
-------
keda_controller (module)
    A started `KedaController`, stopped at the end of the module; its APIService is always
    unregistered (an unavailable APIService holds up every namespace deletion). KEDA watches
    every namespace while it runs. Needs root for the network namespace: in CI (CI=true) the
    test FAILS when it cannot start; locally it is skipped with the reason.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import yaml

from e2e import toolchain
from e2e.conftest import LocalCluster, in_ci
from e2e.custom_metrics import _check_aggregation_flags
from e2e.kubectl import Kubectl, KubectlError, wait_for
from e2e.netns import NetnsError, VethNamespace
from e2e.ports import free_port

GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"
APISERVICE = f"{VERSION}.{GROUP}"
NAMESPACE = "glm-e2e-keda"  # KEDA's own namespace (its Secrets informer, its Services)
OPERATOR_SERVICE = "keda-operator"
METRICS_SERVICE = "keda-metrics-apiserver"
SECURE_PORT = 6443
GRPC_PORT = 9666
ADAPTER_METRICS_PORT = 8080  # inside the network namespace: clashes with nothing
FIELD_MANAGER = "glm-e2e-keda"
START_TIMEOUT = 120.0
LOG_TAIL_LINES = 60
# Installed by e2e/cluster.py (THIRD_PARTY_CRDS) from the `keda` component already.
CLUSTER_INSTALLED_CRD = "keda.sh_scaledobjects.yaml"
KEDA_FINALIZER = "finalizer.keda.sh"


class KedaError(RuntimeError):
    """KEDA's operator or metrics API server did not start or register."""


def bin_dir() -> Path:
    return toolchain.bin_dir("keda_controller")


class KedaController:
    def __init__(self, kubectl: Kubectl, kubeconfig: Path,
                 netns: VethNamespace | None = None) -> None:
        self.kubectl = kubectl
        self.kubeconfig = kubeconfig
        self.netns = netns or VethNamespace.for_cluster(link="k")
        self.workdir = Path(tempfile.mkdtemp(prefix="glm-e2e-keda-"))
        self.cert_dir = self.workdir / "certs"
        self.operator_log = self.workdir / "keda-operator.log"
        self.adapter_log = self.workdir / "keda-adapter.log"
        self.operator: subprocess.Popen[bytes] | None = None
        self.adapter: subprocess.Popen[bytes] | None = None
        self.probe_port = 0

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> KedaController:
        _check_aggregation_flags()
        try:
            toolchain.ensure("keda_controller")
            self._install_crds()
            self.kubectl.apply({"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": NAMESPACE,
                                             "labels": {"glm-operator.dev/e2e": "true"}}},
                               field_manager=FIELD_MANAGER)
            self.netns.create()
            self._certificates()
            self._start_operator()
            self._start_adapter()
            self._register()
            self._wait_available()
        except BaseException:
            self.stop(failed=True)
            raise
        return self

    def _install_crds(self) -> None:
        files = sorted(p for p in bin_dir().glob("*.yaml") if p.name != CLUSTER_INSTALLED_CRD)
        self.kubectl.apply_files(files, field_manager=FIELD_MANAGER)
        for path in files:
            name = yaml.safe_load(path.read_text())["metadata"]["name"]
            self.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")

    def _env(self, kubeconfig: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": NAMESPACE,
                    "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE, "WATCH_NAMESPACE": ""})
        return env

    def _start_operator(self) -> None:
        self.probe_port = free_port()
        with self.operator_log.open("wb") as log:
            self.operator = subprocess.Popen([
                str(bin_dir() / "keda-operator"),
                "--leader-elect=false",
                "--enable-cert-rotation=false",
                f"--cert-dir={self.cert_dir}",
                f"--ca-dir={self.cert_dir}",
                f"--metrics-service-bind-address={self.netns.host_ip}:{GRPC_PORT}",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
                "--enable-webhook-patching=false",
                "--enable-apiservice-patching=false",
                "--zap-log-level=info", "--zap-encoder=console",
            ], stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                env=self._env(self.kubeconfig))

    def _start_adapter(self) -> None:
        kubeconfig = self.netns.kubeconfig_inside(self.kubeconfig, self.workdir / "kubeconfig")
        with self.adapter_log.open("wb") as log:
            self.adapter = subprocess.Popen(self.netns.exec_argv([
                str(bin_dir() / "keda-adapter"),
                f"--secure-port={SECURE_PORT}",
                f"--bind-address={self.netns.inner_ip}",
                f"--cert-dir={self.cert_dir}",
                f"--tls-cert-file={self.cert_dir / 'tls.crt'}",
                f"--tls-private-key-file={self.cert_dir / 'tls.key'}",
                f"--lister-kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--metrics-service-address={self.netns.host_ip}:{GRPC_PORT}",
                f"--port={ADAPTER_METRICS_PORT}",
                "--zap-log-level=info", "--zap-encoder=console",
            ]), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, env=self._env(kubeconfig))

    def _certificates(self) -> None:
        """One CA and one certificate for both ends (KEDA's cert dir layout)."""
        self.cert_dir.mkdir()
        ca_key, ca = self.cert_dir / "ca.key", self.cert_dir / "ca.crt"
        key, csr, cert = (self.cert_dir / n for n in ("tls.key", "tls.csr", "tls.crt"))
        names = [f"DNS:{svc}.{NAMESPACE}.svc{suffix}" for svc in (OPERATOR_SERVICE, METRICS_SERVICE)
                 for suffix in ("", ".cluster.local")]
        names += ["DNS:localhost", f"IP:{self.netns.host_ip}", f"IP:{self.netns.inner_ip}"]
        extensions = self.workdir / "leaf.ext"
        extensions.write_text(
            f"subjectAltName={','.join(names)}\nextendedKeyUsage=serverAuth,clientAuth\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n")
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        for argv in (
            ["openssl", "req", "-x509", *ec, "-days", "2", "-subj", "/CN=glm-e2e-keda-ca",
             "-keyout", str(ca_key), "-out", str(ca)],
            ["openssl", "req", "-new", *ec, "-subj", f"/CN={METRICS_SERVICE}.{NAMESPACE}.svc",
             "-keyout", str(key), "-out", str(csr)],
            ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "2", "-extfile", str(extensions), "-out", str(cert)],
        ):
            result = subprocess.run(argv, capture_output=True, text=True, check=False,
                                    timeout=30)
            if result.returncode != 0:
                raise KedaError(f"`{' '.join(argv[:3])}` failed: {result.stderr.strip()}")

    def _objects(self, ca_bundle: str) -> list[dict[str, Any]]:
        labels = {"app.kubernetes.io/name": METRICS_SERVICE, "glm-operator.dev/e2e": "true"}
        return [
            # No selector: its one endpoint is the adapter's address in the network namespace.
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE, "labels": labels},
             "spec": {"ports": [{"name": "https", "port": 443, "targetPort": SECURE_PORT,
                                 "protocol": "TCP"}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE, "labels": {
                 **labels, "kubernetes.io/service-name": METRICS_SERVICE,
                 "endpointslice.kubernetes.io/managed-by": FIELD_MANAGER}},
             "addressType": "IPv4",
             "ports": [{"name": "https", "port": SECURE_PORT, "protocol": "TCP"}],
             "endpoints": [{"addresses": [self.netns.inner_ip],
                            "conditions": {"ready": True}}]},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": APISERVICE, "labels": labels},
             "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 100,
                      "versionPriority": 100, "caBundle": ca_bundle,
                      "service": {"name": METRICS_SERVICE, "namespace": NAMESPACE,
                                  "port": 443}}},
        ]

    def _register(self) -> None:
        ca_bundle = base64.b64encode((self.cert_dir / "ca.crt").read_bytes()).decode()
        self.kubectl.apply(self._objects(ca_bundle), field_manager=FIELD_MANAGER)

    def _check_running(self) -> None:
        for name, proc, log in (("keda-operator", self.operator, self.operator_log),
                                ("keda-adapter", self.adapter, self.adapter_log)):
            if proc is not None and proc.poll() is not None:
                raise KedaError(f"{name} exited with {proc.returncode}:\n{_tail(log)}")

    def operator_ready(self) -> bool:
        self._check_running()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}/readyz",
                                        timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def _wait_available(self) -> None:
        def available() -> bool:
            if not self.operator_ready():
                return False
            service = self.kubectl.get_json("apiservice", APISERVICE)
            return any(c["type"] == "Available" and c["status"] == "True"
                       for c in service.get("status", {}).get("conditions", []))

        try:
            wait_for(available, timeout=START_TIMEOUT,
                     what=f"keda-operator ready and APIService {APISERVICE} Available")
        except AssertionError as exc:
            status = self.kubectl.run("get", "apiservice", APISERVICE, "-o",
                                      "jsonpath={.status}", check=False).stdout
            raise KedaError(f"{exc}\nAPIService status: {status}\n{self.log_tails()}") from None

    def stop(self, failed: bool = False) -> None:
        """Unregister first (an APIService without a server breaks discovery and namespace
        deletion), then stop both processes and remove the network namespace."""
        self.kubectl.run("delete", "apiservice", APISERVICE, "--ignore-not-found",
                         "--wait=true", "--timeout=30s", check=False)
        self.kubectl.run("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true",
                         "--timeout=60s", check=False)
        self._release_finalizers()
        for attr in ("adapter", "operator"):
            proc = getattr(self, attr)
            setattr(self, attr, None)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        if failed:
            print(f"\n{self.log_tails()}")
        with contextlib.suppress(NetnsError):
            self.netns.remove()
        subprocess.run(["rm", "-rf", str(self.workdir)], check=False)

    def _release_finalizers(self) -> None:
        """KEDA puts its finalizer on every ScaledObject it sees; once it stops, nothing would
        remove it, and a namespace deleted later (the tests' own, deleted without waiting)
        would stay Terminating. Take it off what KEDA leaves behind."""
        try:
            scaled = self.kubectl.items("scaledobjects.keda.sh", "-A")
        except KubectlError:
            return
        for obj in scaled:
            finalizers = obj["metadata"].get("finalizers", [])
            if KEDA_FINALIZER not in finalizers:
                continue
            kept = [f for f in finalizers if f != KEDA_FINALIZER]
            self.kubectl.run("patch", "scaledobject.keda.sh", obj["metadata"]["name"], "-n",
                             obj["metadata"]["namespace"], "--type=merge", "-p",
                             json.dumps({"metadata": {"finalizers": kept or None}}), check=False)

    def log_tails(self, lines: int = LOG_TAIL_LINES) -> str:
        return (f"--- keda-operator log tail ({self.operator_log}) ---\n"
                f"{_tail(self.operator_log, lines)}\n"
                f"--- keda-adapter log tail ({self.adapter_log}) ---\n"
                f"{_tail(self.adapter_log, lines)}")

    def __enter__(self) -> KedaController:
        return self if self.operator is not None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop(failed=exc_type is not None)

    # --- what the HPA controller reads -----------------------------------------------------

    def external_metric(self, namespace: str, metric: str, scaled_object: str) -> list[str]:
        """The values the API server answers for `metric` (KEDA's `s<i>-prometheus` name) of
        `scaled_object`, through the aggregation layer, as the HPA controller asks."""
        path = (f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{metric}"
                f"?labelSelector=scaledobject.keda.sh%2Fname%3D{scaled_object}")
        body = json.loads(self.kubectl("get", "--raw", path).stdout)
        return [str(item["value"]) for item in body.get("items", [])]


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@pytest.fixture(scope="module")
def keda_controller(cluster: LocalCluster, kubectl: Kubectl) -> Iterator[KedaController]:
    try:
        if cluster.flavour != "kwok":
            raise KedaError("KEDA's controller runs on the local control plane only "
                            "(GLM_E2E_KIND is set)")
        keda = KedaController(kubectl, cluster.kubeconfig).start()
    except (KedaError, NetnsError, toolchain.BuildError, KubectlError) as exc:
        message = f"KEDA's operator and metrics API server could not start: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield keda
    finally:
        keda.stop()
