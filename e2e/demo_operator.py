"""The operator at work, for `make demo`, with real parts end to end:

1. a tiny GGUF model is written (no download) and a ModelVersion + CPU GLMService applied;
2. the operator (`glm-operator run`) plans it and creates the cache PVC, the fetch Job and
   its narrow RBAC;
3. kwok runs no containers, so the demo plays the fetch Job's pod: it runs the real
   `glm-operator fetch` with the Job's own argv and the Job's ServiceAccount token, which
   verifies the file, parses its GGUF header and reports into the ModelVersion's status;
4. the operator plans from the measured facts, creates the Deployment and Service, and
   the GLMService turns Ready; `kubectl get glms,mv -o wide` and the plan are printed;
5. the engine and gateway containers are played by real processes started with the argv
   the operator rendered into the Deployment, and one chat request goes through the gateway
   to llama-server; the gateway's metrics for it are shown;
6. canaries walk their steps, judged against the stable version by the operator's analysis
   through a real Prometheus that scrapes stand-ins for the versions' gateways: a healthy
   second ModelVersion is promoted, a degraded third one rolled back with the reason
   (e2e/demo_canary.py); the demo exits non-zero when either ends otherwise.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from e2e import cluster, demo_canary, toolchain
from e2e.kubectl import Kubectl, wait_for
from e2e.llama import LlamaServer, http_json
from e2e.models import TinyLlamaSpec, write_tiny_llama
from e2e.operator_fixtures import CRDS, OperatorProcess
from e2e.ports import free_port

NAMESPACE = "glm-demo"
MODEL_VERSION = "tiny-llama-f32"
SERVICE = "glm-demo"
MODEL_FILE = "tiny-llama.gguf"


def heading(text: str) -> None:
    print(f"\n== {text} ==", flush=True)


def manifests(sha256: str) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "ModelVersion",
         "metadata": {"name": MODEL_VERSION, "namespace": NAMESPACE},
         "spec": {"source": {"uri": f"pvc://demo-models/{MODEL_FILE}"}, "format": "gguf",
                  "quantization": "F32", "architecture": "llama", "sha256": sha256}},
        {"apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "GLMService",
         "metadata": {"name": SERVICE, "namespace": NAMESPACE},
         "spec": {"modelVersion": MODEL_VERSION, "accelerator": {"profile": "cpu"},
                  "contextLength": 2048, "concurrency": 2, "replicas": 1,
                  "gateway": {"access": "Open"}}},  # a local demo: no keys
    ]


def play_fetch_job(kubectl: Kubectl, workdir: Path, model_version: str = MODEL_VERSION) -> None:
    """Run the fetch Job's container command here, as its ServiceAccount."""
    job = wait_for(lambda: kubectl.items("jobs", "-n", NAMESPACE, "-l",
                                         f"glm-operator.dev/model-version={model_version}"),
                   timeout=60, what="the operator's fetch Job")[0]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    token = kubectl("create", "token", pod["serviceAccountName"], "-n", NAMESPACE).stdout.strip()
    token_file = workdir / "fetch-token"
    token_file.write_text(token)
    config = yaml.safe_load(Path(kubectl.kubeconfig).read_text())["clusters"][0]["cluster"]
    argv = [*container["args"],
            # where the pod's volumes are on this machine, and how it reaches the API server
            "--dest", str(workdir / "cache"), "--pvc-root", str(workdir / "pvc"),
            "--result-json", str(workdir / "fetch-result.json"),
            "--api-server", config["server"], "--token-file", str(token_file),
            "--api-ca-file", config["certificate-authority"]]
    print(f"  fetch Job {job['metadata']['name']} (ServiceAccount {pod['serviceAccountName']}):")
    print(f"  $ glm-operator {' '.join(container['args'])}")
    result = subprocess.run([sys.executable, "-m", "glm_operator.cli", *argv],
                            capture_output=True, text=True, check=False)
    for line in (result.stdout + result.stderr).strip().splitlines()[-6:]:
        print(f"    {line}")
    if result.returncode != 0:
        raise RuntimeError(f"the fetcher failed with {result.returncode}")


def show_plan(obj: dict[str, Any]) -> None:
    plan = obj["status"]["plan"]
    memory = plan.get("memory", {})
    mib = 2**20
    print(f"  {plan.get('reason', '')}")
    for key in ("weightsBytes", "kvBytes", "computeBytes", "overheadBytes", "totalBytes",
                "availableBytes"):
        if key in memory:
            print(f"    {key.removesuffix('Bytes'):10} {memory[key] / mib:10.1f} MiB")
    llama = plan.get("llamacpp", {})
    print("  llama.cpp: " + ", ".join(f"{k}={v}" for k, v in llama.items()))


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def serve_one_request(kubectl: Kubectl, workdir: Path, model_path: Path) -> None:
    deployment = kubectl.items("deployments", "-n", NAMESPACE, "-l",
                               f"glm-operator.dev/service={SERVICE}")[0]
    engine = container(deployment, "engine")
    argv = [str(toolchain.bin_dir("llama_cpp_python") / "llama-server"), *engine["args"],
            "--model", str(model_path)]  # the pod mounts the cache PVC at /models
    print("  engine: " + " ".join(engine["args"]))
    llama = LlamaServer.start(argv, workdir / "logs")
    gateway_port = free_port()
    gateway_args = [*container(deployment, "gateway")["args"],
                    "--host", "127.0.0.1", "--port", str(gateway_port),
                    "--engine-url", llama.url]
    if "--engine-socket" in gateway_args:  # the engine's socket, as named on this machine
        gateway_args += ["--engine-socket", llama.sockets[0]]
    print("  gateway: glm-operator " + " ".join(container(deployment, "gateway")["args"]))
    log = (workdir / "logs" / "gateway.log").open("wb")
    gateway = subprocess.Popen([sys.executable, "-m", "glm_operator.cli", *gateway_args],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{gateway_port}"

        def gateway_ready() -> bool:
            try:
                return http_json(url + "/readyz", timeout=2)[0] == 200
            except OSError:  # not listening yet
                return False
        wait_for(gateway_ready, timeout=120, what="gateway /readyz", interval=0.3)
        body = {"model": SERVICE, "max_tokens": 16,
                "messages": [{"role": "user", "content": "Say hello to the demo."}]}
        status, answer = http_json(url + "/v1/chat/completions", body, timeout=120)
        heading("One chat request through the gateway to llama-server")
        print(f"  POST /v1/chat/completions -> {status}")
        print("  " + json.dumps(answer)[:600])
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            metrics = response.read().decode()
        heading("Gateway metrics for it")
        for line in metrics.splitlines():
            name = line.split("{", 1)[0]
            if name.startswith("glm_gateway_") and not name.endswith(("_bucket", "_created")):
                print(f"  {line}")
    finally:
        gateway.terminate()
        gateway.wait(15)
        llama.stop()


def run(kubectl: Kubectl) -> int:
    workdir = cluster.state_dir() / "demo"
    (workdir / "pvc" / "demo-models").mkdir(parents=True, exist_ok=True)
    model = write_tiny_llama(workdir / "pvc" / "demo-models" / MODEL_FILE,
                             TinyLlamaSpec(n_ctx_train=4096, n_layer=2, n_embd=128, n_head=4,
                                           n_head_kv=2, n_ff=256, name="tiny-llama"))
    sha256 = hashlib.sha256(model.read_bytes()).hexdigest()

    heading("glm-operator: install the CRDs, start the operator, apply a GLMService")
    kubectl.apply_files(CRDS, field_manager="glm-demo")
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true",
            "--timeout=120s")
    try:
        prometheus = demo_canary.start_prometheus()
    except demo_canary.DemoFailed as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    operator = OperatorProcess(kubectl, namespaces=(NAMESPACE,),
                               extra_args=demo_canary.operator_args(workdir, prometheus))
    try:
        wait_for(operator.alive, timeout=60, what="operator liveness")
        print(f"  operator running (pid {operator.proc.pid}, log {operator.log.name})")
        kubectl.apply(manifests(sha256))
        print(yaml.safe_dump_all(manifests(sha256)[1:], sort_keys=False))

        heading("The ModelVersion's fetch Job, played here with the real fetcher")
        play_fetch_job(kubectl, workdir)

        def ready() -> dict[str, Any] | None:
            obj = kubectl.get_json("glmservice", SERVICE, "-n", NAMESPACE)
            conds = obj.get("status", {}).get("conditions", [])
            return obj if any(c["type"] == "Ready" and c["status"] == "True"
                              for c in conds) else None
        started = time.monotonic()
        obj = wait_for(ready, timeout=120, what=f"GLMService {SERVICE} Ready")
        heading(f"GLMService Ready after {time.monotonic() - started:.1f}s")
        print(kubectl("get", "glms,mv", "-n", NAMESPACE, "-o", "wide").stdout)
        print(kubectl("get", "deploy,svc,pods,pvc", "-n", NAMESPACE, "-o", "wide").stdout)
        heading("The capacity plan (status.plan)")
        show_plan(obj)

        mv = kubectl.get_json("modelversion", MODEL_VERSION, "-n", NAMESPACE)
        cached = workdir / "cache" / mv["status"].get("cache", {}).get("path", MODEL_FILE)
        heading("The rendered pod, played by real processes")
        serve_one_request(kubectl, workdir, cached)

        heading("Canaries to new ModelVersions, judged against the stable version")
        demo_canary.run(kubectl, prometheus, NAMESPACE, SERVICE,
                        lambda name: play_fetch_job(kubectl, workdir, name),
                        manifests(sha256)[1])
    except demo_canary.DemoFailed as exc:
        print(f"demo: {exc} (operator log: {operator.log.name})", file=sys.stderr)
        return 1
    finally:
        operator.stop()
        prometheus.stop()
    print(f"\nThe cluster stays up: export KUBECONFIG={kubectl.kubeconfig}; "
          f"kubectl get glms -n {NAMESPACE}. Stop it with `make cluster-down`.")
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        sys.exit(run(cluster.up()))
