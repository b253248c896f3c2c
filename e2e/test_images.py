"""The runtime images, built here (e2e/images.py) and run under the pod specs the operator renders.

One flow, every part real:

1. the glm-operator image runs `glm-operator run` (podman, host network, read-only root, no
   capabilities, uid 65532) against the local control plane, for the CPU example's GLMService
   with a tiny GGUF on a `model-store` volume (the example's pvc:// source);
2. the fetch Job it creates is played by `podman kube play` from the Job's own pod template,
   with the same image: it verifies the GGUF into the cache volume and reports the facts into
   the ModelVersion's status;
3. the Deployment it then creates is played by `podman kube play` as it is, with the built
   images (tagged as the operator renders them): both containers run as uid 65532 on a
   read-only root with no capabilities, every probe it declares passes when called as the
   kubelet calls it, a chat request through the gateway port is answered, and the engine's
   port cannot be reached from outside the pod, and the gateway sends the answer over the
   engine's abstract Unix socket, which only the pod's containers share;
4. the GLMService turns Ready;
5. switched to `spec.routing.mode: EndpointPicker`, the endpoint picker Deployment it renders is
   played with the picker image built for it (runtime-images/epp): its gRPC probes pass, it runs
   locked down as uid 65532, and with its own ServiceAccount token it finds the service's engine
   pod in the cluster and answers an ext-proc pick with that pod's address.

What the test adds is only what a kubelet adds to a pod: the ServiceAccount token mount and the
KUBERNETES_SERVICE_* variables (automountServiceAccountToken), the /dev/termination-log file,
ConfigMap volumes written out as files, the downward API's values,
the volumes' group ownership (fsGroup; podman ignores it), and the probe calls (podman runs
only some probes, through curl inside the container, and only with systemd timers).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from glm_operator.render.engine_args import ENGINE_SOCKET, RPC_SERVER
from glm_operator.wellknown import COMPONENT_LABEL, MAIN_POOL, POOL_LABEL

from e2e import images
from e2e.conftest import in_ci
from e2e.epp import pick
from e2e.kubectl import Kubectl, WaitTimeout, wait_for
from e2e.models import TinyLlamaSpec, write_tiny_llama
from e2e.operator_fixtures import glm_crds  # noqa: F401 (fixture)
from e2e.ports import free_port

# The llama.cpp image carries the toolchain's llama-server. A cold run builds three images first
# (about 7 minutes on a busy two-core machine): more than the suite's 900 s default must fit.
pytestmark = [pytest.mark.llama, pytest.mark.timeout(1800)]

MODEL_STORE = "model-store"
MODEL_FILE = "glm/tiny-llama.gguf"
FS_GROUP = 65532
# The CPU example (examples/cpu-llamacpp/glmservice.yaml) with a tiny model instead of GLM-4-9B.
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu-llamacpp" / "glmservice.yaml"


def require_image_tools(what: str) -> None:
    """Fail in CI, skip elsewhere, where this machine cannot build and run images."""
    problem = None
    if os.geteuid() != 0:
        problem = "needs root (rootful podman and buildah)"
    elif images.missing_tools():
        problem = f"needs {', '.join(images.missing_tools())} (make deps)"
    if problem:
        if in_ci():
            pytest.fail(f"{what}: {problem}")
        pytest.skip(f"{what}: {problem}")


@pytest.fixture(scope="module")
def built() -> dict[str, images.Built]:
    require_image_tools("image tests")
    return {image.name: image for image in images.build_all()}


@dataclass
class Podman:
    store: images.Store
    names: list[str]  # pods and containers to remove at the end
    volumes: list[str]

    def __call__(self, *args: str, check: bool = True, timeout: float = 300) -> str:
        return self.store.run(self.store.podman(*args), f"podman {args[0]}", timeout=timeout,
                              check=check).stdout

    def volume(self, name: str) -> Path:
        """A named volume (what a claimName resolves to), group-owned as fsGroup makes it."""
        self("volume", "rm", "--force", name, check=False)
        self("volume", "create", name)
        self.volumes.append(name)
        path = Path(self("volume", "inspect", "--format", "{{.Mountpoint}}", name).strip())
        os.chown(path, 0, FS_GROUP)
        path.chmod(0o2775)
        return path

    def play(self, manifest: dict[str, Any], workdir: Path, *flags: str) -> str:
        """`podman kube play`; returns the name of the pod it made."""
        path = workdir / f"{manifest['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(manifest))
        self("kube", "down", str(path), check=False)  # what an interrupted run left behind
        lines = self("kube", "play", *flags, str(path), timeout=120).splitlines()
        pod_id = lines[lines.index("Pod:") + 1].strip()
        name = self("pod", "inspect", "--format", "{{.Name}}", pod_id).strip()
        self.names.append(name)
        return name

    def logs(self, container: str, tail: int | None = 80) -> str:
        last = ["--tail", str(tail)] if tail is not None else []
        result = self.store.run(self.store.podman("logs", *last, container), "logs",
                                check=False)
        return result.stdout + result.stderr

    def inspect(self, container: str, template: str) -> str:
        return self("inspect", "--format", template, container).strip()


@pytest.fixture
def podman(built: dict[str, images.Built]) -> Iterator[Podman]:
    runner = Podman(images.Store.default(), [], [])
    try:
        yield runner
    finally:
        for name in reversed(runner.names):
            runner("pod", "rm", "--force", "--time", "5", name, check=False)
            runner("rm", "--force", "--time", "5", name, check=False)
        for volume in runner.volumes:
            runner("volume", "rm", "--force", volume, check=False)


@pytest.fixture
def own_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A namespace only this test's operator watches (the session operator watches e2e-*)."""
    name = f"images-{uuid.uuid4().hex[:6]}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(lambda: kubectl.exists("serviceaccount", "default", "-n", name), timeout=30,
             what=f"ServiceAccount default in namespace {name}")
    try:
        yield name
    finally:
        kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found",
                    check=False)


def manifests(namespace: str, sha256: str) -> list[dict[str, Any]]:
    service = yaml.safe_load(EXAMPLE.read_text())
    service["metadata"]["namespace"] = namespace
    version = {"apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "ModelVersion",
               "metadata": {"name": service["spec"]["modelVersion"], "namespace": namespace},
               "spec": {"source": {"uri": f"pvc://{MODEL_STORE}/{MODEL_FILE}"},
                        "format": "gguf", "quantization": "F32", "architecture": "llama",
                        "sha256": sha256}}
    return [version, service]


def flat_kubeconfig(kubectl: Kubectl, directory: Path) -> Path:
    """The cluster's kubeconfig with its certificates inline, readable by uid 65532."""
    text = kubectl("config", "view", "--raw", "--flatten", "--minify").stdout
    path = directory / "kubeconfig"
    path.write_text(text)
    path.chmod(0o644)
    return path


def run_operator(podman: Podman, kubeconfig: Path, namespace: str) -> tuple[str, int]:
    """`glm-operator run` from the image, on the host network, as the chart runs it."""
    name = f"glm-operator-{namespace}"
    liveness = free_port()
    podman.names.append(name)
    podman("run", "--detach", "--name", name, "--network", "host", "--read-only",
           "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--user", "65532:65532",
           "--volume", f"{kubeconfig}:/etc/glm-operator/kubeconfig:ro",
           images.python_spec().reference,
           "run", "--namespace", namespace, "--kubeconfig", "/etc/glm-operator/kubeconfig",
           "--liveness", f"http://127.0.0.1:{liveness}/healthz",
           "--metrics-port", str(free_port()))
    return name, liveness


def http_status(url: str, timeout: float, body: dict[str, Any] | None = None
                ) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def grpc_health(port: int, service: str, timeout: float) -> bool:
    """grpc.health.v1 Check as the kubelet's grpc probe sends it: SERVING is `08 01`."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        request = b"\x0a" + bytes([len(service)]) + service.encode() if service else b""
        try:
            return bool(check(request, timeout=timeout) == b"\x08\x01")
        except grpc.RpcError:
            return False


def kubelet_probe(pod_ip: str, container: dict[str, Any], probe: dict[str, Any]) -> None:
    """An httpGet or grpc probe as the kubelet runs it: the pod IP, the port (a name resolves
    among the container's own ports), success on 200-399 (grpc: SERVING for the probe's
    service) within timeoutSeconds; failureThreshold tries periodSeconds apart before it
    counts as failed."""
    kind = "grpc" if "grpc" in probe else "httpGet"
    port = probe[kind]["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in container.get("ports", []) if p["name"] == port)
    timeout = probe.get("timeoutSeconds", 1)
    period, tries = probe.get("periodSeconds", 10), probe.get("failureThreshold", 3)
    if kind == "grpc":
        # A kubelet dials the pod IP; the pods here run on the host network.
        what = f"{container['name']} grpc probe :{port} {probe['grpc'].get('service', '')!r}"

        def passes() -> bool:
            return grpc_health(port, probe["grpc"].get("service", ""), timeout)
    else:
        url = f"http://{pod_ip}:{port}{probe['httpGet']['path']}"
        what = f"{container['name']} probe {url}"

        def passes() -> bool:
            try:
                return 200 <= http_status(url, timeout)[0] < 400
            except OSError:
                return False
    # Polled faster than periodSeconds (the test waits less), never longer than the kubelet.
    wait_for(passes, timeout=period * tries, interval=min(period, 1.0), what=what)


@dataclass(frozen=True)
class ProcessFacts:
    uid: str
    gid: str
    cap_eff: str
    no_new_privs: str
    root_options: list[str]


def process_facts(podman: Podman, container: str) -> ProcessFacts:
    """What the kernel says about the container's main process (not what podman was asked)."""
    pid = podman.inspect(container, "{{.State.Pid}}")
    status = dict(line.split(":\t", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    root = next(line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                if line.split()[4] == "/")
    return ProcessFacts(uid=status["Uid"].split()[0], gid=status["Gid"].split()[0],
                        cap_eff=status["CapEff"].strip(), no_new_privs=status["NoNewPrivs"],
                        root_options=root[5].split(","))


def assert_locked_down(podman: Podman, container: str) -> None:
    facts = process_facts(podman, container)
    assert (facts.uid, facts.gid) == ("65532", "65532"), (container, facts)
    assert facts.cap_eff == "0000000000000000", (container, facts)
    assert facts.no_new_privs.strip() == "1", (container, facts)
    assert "ro" in facts.root_options, (container, facts)


def kubelet_additions(pod: dict[str, Any], workdir: Path, kubectl: Kubectl,
                      namespace: str) -> dict[str, Any]:
    """The fetch Job's pod template as a Pod, plus what a kubelet mounts into every pod: the
    ServiceAccount token (automountServiceAccountToken) and /dev/termination-log."""
    spec = json.loads(json.dumps(pod["spec"]))
    secrets = workdir / "serviceaccount"
    secrets.mkdir()
    token = kubectl("create", "token", spec["serviceAccountName"], "-n", namespace).stdout
    (secrets / "token").write_text(token.strip())
    (secrets / "namespace").write_text(namespace)
    config = yaml.safe_load(kubectl("config", "view", "--raw", "--minify").stdout)
    cluster = config["clusters"][0]["cluster"]
    shutil.copy(cluster["certificate-authority"], secrets / "ca.crt")
    for path in secrets.iterdir():
        path.chmod(0o644)
    termination = workdir / "termination-log"
    termination.touch()
    termination.chmod(0o666)
    spec["volumes"] += [
        {"name": "kube-api-access", "hostPath": {"path": str(secrets), "type": "Directory"}},
        {"name": "termination-log", "hostPath": {"path": str(termination), "type": "File"}}]
    host, port = cluster["server"].removeprefix("https://").rsplit(":", 1)
    for container in spec["containers"]:
        container.setdefault("env", []).extend([
            {"name": "KUBERNETES_SERVICE_HOST", "value": host},
            {"name": "KUBERNETES_SERVICE_PORT", "value": port}])
        container["volumeMounts"] += [
            {"name": "kube-api-access", "readOnly": True,
             "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
            {"name": "termination-log", "mountPath": "/dev/termination-log"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod["metadata"]["name"]}, "spec": spec}


def without_host_ports(manifest: dict[str, Any]) -> dict[str, Any]:
    """containerPorts only inform a kubelet; `podman kube play` publishes each on the host,
    which fails where another process holds the port (and the host network refuses it). The
    probes still resolve port names from the rendered containers."""
    manifest = json.loads(json.dumps(manifest))
    spec = manifest["spec"].get("template", manifest)["spec"]
    for container in spec["containers"]:
        container.pop("ports", None)
    return manifest


def project_config_maps(pod: dict[str, Any], workdir: Path, kubectl: Kubectl,
                        namespace: str) -> dict[str, Any]:
    """The pod with each configMap volume written out as a kubelet projects it (one file per
    key, readable by the pod's user) and mounted from there."""
    pod = json.loads(json.dumps(pod))
    for volume in pod["spec"].get("volumes", []):
        if "configMap" not in volume:
            continue
        data = kubectl.get_json("configmap", volume["configMap"]["name"], "-n",
                                namespace).get("data", {})
        folder = workdir / f"configmap-{volume['name']}"
        folder.mkdir()
        for key, value in data.items():
            (folder / key).write_text(value)
            (folder / key).chmod(0o644)
        del volume["configMap"]
        volume["hostPath"] = {"path": str(folder), "type": "Directory"}
    return pod


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind),
                {})


def test_rendered_pods_run_the_built_images(
    built: dict[str, images.Built], podman: Podman, kubectl: Kubectl,
    glm_crds: list[str], own_namespace: str, tmp_path: Path,  # noqa: F811
) -> None:
    namespace = own_namespace
    workdir = tmp_path
    model = write_tiny_llama(podman.volume(MODEL_STORE) / MODEL_FILE,
                             TinyLlamaSpec(n_ctx_train=8192))
    sha256 = images.file_sha256(model)
    kubectl.apply(manifests(namespace, sha256))
    service_name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]

    # 1. The operator, from its image.
    operator, liveness = run_operator(podman, flat_kubeconfig(kubectl, workdir), namespace)

    def operator_live() -> bool:
        assert podman.inspect(operator, "{{.State.Running}}") == "true", \
            podman.logs(operator)
        try:
            return http_status(f"http://127.0.0.1:{liveness}/healthz", 2)[0] == 200
        except OSError:
            return False
    wait_for(operator_live, timeout=60, what="the operator container's liveness endpoint")
    assert_locked_down(podman, operator)
    # The fetcher verifies https sources (Hugging Face, S3) against the image's CA store.
    cas = podman("run", "--rm", "--entrypoint", "python3", images.python_spec().reference, "-c",
                 "import ssl; print(ssl.create_default_context().cert_store_stats()['x509_ca'])")
    assert int(cas) > 100, f"the glm-operator image trusts {cas.strip()} CAs"
    # Its wheels were resolved for this exact Python (environment markers).
    python = podman("run", "--rm", "--entrypoint", "python3", images.python_spec().reference,
                     "-c", "import platform; print(platform.python_version())").strip()
    assert python == images.IMAGE_PYTHON, (python, images.IMAGE_PYTHON)
    # A multi-node group's workers run the llama.cpp image with the renderer's worker command
    # instead of the entrypoint: on the image's PATH, its libraries present, as its user.
    ran = podman.store.run(podman.store.podman(
        "run", "--rm", "--read-only", "--entrypoint", RPC_SERVER,
        images.llama_cpu_spec().reference, "--help"), "podman run", timeout=120)
    assert "--port PORT" in ran.stdout + ran.stderr, ran

    # 2. The fetch Job's pod, from the same image, into the cache volume.
    job = wait_for(lambda: kubectl.items("jobs", "-n", namespace), timeout=60,
                   what="the fetch Job")[0]
    pod = job["spec"]["template"]
    pod["metadata"]["name"] = job["metadata"]["name"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
              for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}
    cache = podman.volume(claims["cache"])
    # Host network: the pod reaches the API server as the ServiceAccount, at the address its
    # certificate names (a cluster gives pods the kubernetes Service's IP instead).
    fetch_pod = podman.play(kubelet_additions(pod, workdir, kubectl, namespace), workdir,
                            "--network", "host")
    fetch = f"{fetch_pod}-fetch"
    exit_code = podman("wait", fetch, timeout=180).strip()
    assert exit_code == "0", podman.logs(fetch)
    assert images.file_sha256(cache / Path(MODEL_FILE).name) == sha256
    result = json.loads((workdir / "termination-log").read_text())
    assert result["sha256"] == sha256, result
    version_name = job["metadata"]["labels"]["glm-operator.dev/model-version"]

    def version_ready() -> dict[str, Any] | None:
        found = kubectl.get_json("modelversion", version_name, "-n", namespace)
        return found if condition(found, "Ready").get("status") == "True" else None
    version = wait_for(version_ready, timeout=60,
                       what="ModelVersion Ready from the fetch pod's report")
    assert version["status"]["facts"]["blockCount"] == TinyLlamaSpec().n_layer

    # 3. The Deployment, as the operator rendered it, with the built images.
    deployment = wait_for(lambda: kubectl.items("deployments", "-n", namespace), timeout=60,
                          what="the engine Deployment")[0]
    template = deployment["spec"]["template"]["spec"]
    assert {c["image"] for c in template["containers"]} == {
        built["llamacpp-cpu"].reference, built["glm-operator"].reference}
    rendered = {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": deployment["metadata"]["name"],
                             "labels": deployment["metadata"]["labels"]},
                "spec": {k: deployment["spec"][k] for k in ("replicas", "selector", "template")}}
    pod_name = podman.play(without_host_ports(rendered), workdir)
    pod_ip = podman.inspect(
        podman("pod", "inspect", "--format", "{{.InfraContainerID}}", pod_name).strip(),
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
    assert pod_ip, "the pod has no IP on podman's bridge"
    containers = {c["name"]: c for c in template["containers"]}
    for name in containers:
        assert podman.inspect(f"{pod_name}-{name}", "{{.State.Running}}") == "true", \
            podman.logs(f"{pod_name}-{name}")
    for container in containers.values():
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind in container:
                kubelet_probe(pod_ip, container, container[kind])
    for name in containers:
        assert_locked_down(podman, f"{pod_name}-{name}")

    status, body = http_status(
        f"http://{pod_ip}:8080/v1/chat/completions", 120,
        {"model": service_name, "max_tokens": 8,
         "messages": [{"role": "user", "content": "Hello from a podman pod."}]})
    assert status == 200, body
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["content"] is not None
    # The answer came over the engine's abstract Unix socket, shared within the pod only:
    # the engine listens there, and the gateway never had to fall back to TCP.
    engine_socket = ENGINE_SOCKET
    engine_log = podman.logs(f"{pod_name}-engine", tail=None)
    assert f"listening on unix://{engine_socket}" in engine_log, engine_log[-3000:]
    gateway_log = podman.logs(f"{pod_name}-gateway", tail=None)
    assert f"answers over unix socket {engine_socket}" in gateway_log, gateway_log[-3000:]
    assert f"socket {engine_socket} refused" not in gateway_log, gateway_log[-3000:]

    engine_port = int(containers["engine"]["args"][containers["engine"]["args"].index(
        "--port") + 1])
    with pytest.raises(ConnectionRefusedError), socket.create_connection(
            (pod_ip, engine_port), timeout=5):
        pass

    # 4. The operator sees the Deployment (kwok runs its pods in the cluster) and turns Ready.
    wait_for(lambda: condition(kubectl.get_json("glmservice", service_name, "-n", namespace),
                               "Ready").get("status") == "True",
             timeout=120, what=f"GLMService {service_name} Ready")
    assert podman.inspect(operator, "{{.State.Running}}") == "true"

    # 5. The endpoint picker the operator renders for spec.routing.mode EndpointPicker, from
    # the image built for it: it finds the service's engine pod with its own ServiceAccount
    # and answers a pick with that pod's address.
    (workdir / "epp").mkdir()
    run_endpoint_picker(podman, kubectl, namespace, service_name, workdir / "epp",
                        built["epp"].reference)


EPP_COMPONENT = "endpoint-picker"
# The ports the rendered picker listens on (its chart's), taken on the host network here.
EPP_PORTS = (9002, 9003, 9090)


def run_endpoint_picker(podman: Podman, kubectl: Kubectl, namespace: str, service: str,
                        workdir: Path, image: str) -> None:
    kubectl("patch", "glmservice", service, "-n", namespace, "--type", "merge",
            "-p", json.dumps({"spec": {"routing": {"mode": "EndpointPicker"}}}))

    def rendered() -> dict[str, Any] | None:
        found = kubectl.items("deployments", "-n", namespace, "-l",
                              f"{COMPONENT_LABEL}={EPP_COMPONENT}")
        return found[0] if found else None
    deployment = wait_for(rendered, timeout=60, what="the endpoint picker Deployment")
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert container["image"] == image
    for port in EPP_PORTS:  # a clear failure, not a picker that cannot bind
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, \
                f"port {port} is taken on this host: the picker runs on the host network"
    pod = project_config_maps({"metadata": {"name": deployment["metadata"]["name"]},
                               "spec": template["spec"]}, workdir, kubectl, namespace)
    pod = kubelet_additions(pod, workdir, kubectl, namespace)
    # The downward API, as the kubelet resolves it for the Deployment's pod in the cluster
    # (the picker derives its Deployment's name from its pod's).
    cluster_pod = wait_for(lambda: kubectl.items("pods", "-n", namespace, "-l",
                                                 f"{COMPONENT_LABEL}={EPP_COMPONENT}"),
                           timeout=60, what="the endpoint picker's pod")[0]["metadata"]
    fields = {"metadata.name": cluster_pod["name"], "metadata.namespace": namespace}
    pod["spec"]["containers"][0]["env"] = [
        {"name": e["name"], "value": fields[e["valueFrom"]["fieldRef"]["fieldPath"]]}
        if "valueFrom" in e else e for e in pod["spec"]["containers"][0]["env"]]
    picker = f"{podman.play(without_host_ports(pod), workdir, '--network', 'host')}-" \
             f"{container['name']}"
    try:
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            kubelet_probe("127.0.0.1", container, container[kind])
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}\npicker log:\n{podman.logs(picker)[-3000:]}") from exc
    assert_locked_down(podman, picker)

    engines = [p for p in kubectl.items("pods", "-n", namespace, "-l",
                                        f"{POOL_LABEL}={MAIN_POOL}")
               if p["status"].get("podIP")]
    assert engines, "no engine pod with an IP in the cluster"
    expected = {f"{p['status']['podIP']}:8080" for p in engines}

    def picked() -> str | None:
        with grpc.insecure_channel(f"127.0.0.1:{EPP_PORTS[0]}") as channel:
            endpoint = pick(channel, service, "Hello from the picker's image.").endpoint
        return endpoint if endpoint in expected else None
    try:
        wait_for(picked, timeout=30, interval=1.0, what=f"a pick of one of {sorted(expected)}")
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}\npicker log:\n{podman.logs(picker)[-3000:]}") from exc
