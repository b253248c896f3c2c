"""Wake-from-zero on the local control plane: the gateway scales the long-context Deployment
from 0 to 1 with its own ServiceAccount token (a Role that allows only `deployments/scale` on
that one Deployment), holds the long request until the pool answers, and is denied for any
other Deployment.

The Deployment's pods land on kwok's fake nodes and run nothing, so a watcher plays the
kubelet's part: when the Deployment asks for a replica it starts a real large-context
llama-server at the long-context URL. Everything the gateway does is real: the API call, the
RBAC decision, the polling, the routing.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from e2e.gateway_process import GatewayProcess
from e2e.kubectl import Kubectl
from e2e.llama import LlamaServer, llama_server_binary
from e2e.models import TinyLlamaSpec, prompt_of_tokens, write_tiny_llama
from e2e.ports import free_port
from e2e.test_gateway import metric_value

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

LONG = "glm-v1-long-context"
OTHER = "some-other-deployment"
SA = "glm-gateway"


def deployment(name: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {
            "replicas": 0, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "containers": [{"name": "engine", "image": "registry.invalid/llama-server:1"}],
            }},
        },
    }


def rbac(namespace: str) -> list[dict[str, Any]]:
    """What the renderer gives the gateway: scale the one long-context Deployment, nothing else."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": SA},
         "rules": [{"apiGroups": ["apps"], "resources": ["deployments/scale"],
                    "resourceNames": [LONG], "verbs": ["get", "patch", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": SA},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SA},
         "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": namespace}]},
    ]


def api_server_and_ca(kubectl: Kubectl, tmp_path: Path) -> tuple[str, str]:
    config = json.loads(kubectl.run("config", "view", "--raw", "--minify", "-o", "json").stdout)
    cluster = config["clusters"][0]["cluster"]
    if "certificate-authority-data" in cluster:
        ca = tmp_path / "ca.crt"
        ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        return cluster["server"], str(ca)
    return cluster["server"], cluster.get("certificate-authority", "")


def replicas(kubectl: Kubectl, namespace: str, name: str) -> int:
    obj = kubectl.get_json("deployment", name, "-n", namespace)
    return int(obj["spec"].get("replicas", 0))


@pytest.fixture
def scene(kubectl: Kubectl, namespace: str, apply: Callable[..., Any], tmp_path: Path
          ) -> Iterator[dict[str, Any]]:
    apply([deployment(LONG), deployment(OTHER), *rbac(namespace)], namespace=namespace)
    token = tmp_path / "token"
    token.write_text(kubectl.run("create", "token", SA, "-n", namespace,
                                 "--duration", "1h").stdout.strip())
    server, ca = api_server_and_ca(kubectl, tmp_path)
    binary = llama_server_binary()
    model = write_tiny_llama(tmp_path / "tiny.gguf", TinyLlamaSpec(n_ctx_train=16384))
    long_port = free_port()
    started: list[LlamaServer] = []
    stop = threading.Event()

    def kubelet() -> None:  # start the pool's engine once the Deployment wants a replica
        while not stop.is_set():
            if replicas(kubectl, namespace, LONG) >= 1:
                started.append(LlamaServer.start(
                    [str(binary), "-m", str(model), "-c", "8192", "-np", "1", "-t", "1"],
                    tmp_path, port=long_port))
                return
            time.sleep(0.3)

    watcher = threading.Thread(target=kubelet, daemon=True)
    watcher.start()
    with LlamaServer.start([str(binary), "-m", str(model), "-c", "512", "-np", "1", "-t", "1"],
                           tmp_path) as small:
        yield {"namespace": namespace, "token": token, "server": server, "ca": ca,
               "small": small, "long_url": f"http://127.0.0.1:{long_port}", "tmp": tmp_path,
               "started": started}
    stop.set()
    watcher.join(timeout=200)
    for engine in started:
        engine.stop()


def gateway_args(scene: dict[str, Any], deployment_name: str, wake_timeout: int) -> list[str]:
    return ["--model-version", "v1", "--long-context-url", scene["long_url"],
            "--long-context-deployment", deployment_name, "--namespace", scene["namespace"],
            "--kube-api-server", scene["server"], "--kube-token-path", str(scene["token"]),
            "--kube-ca-path", scene["ca"], "--long-context-health-path", "/health",
            "--wake-timeout", str(wake_timeout)]


def test_wake_from_zero_with_the_gateways_service_account(
    scene: dict[str, Any], kubectl: Kubectl
) -> None:
    namespace = scene["namespace"]
    with GatewayProcess.start(scene["small"].url, scene["tmp"],
                              gateway_args(scene, LONG, 180), service_name="glm") as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0,
                               timeout=240)
        result: dict[str, Any] = {}

        def long_request() -> None:
            try:
                result["reply"] = client.chat.completions.create(
                    model="glm", messages=[{"role": "user", "content": prompt_of_tokens(1500)}],
                    max_tokens=4)
            except Exception as exc:  # reported by the assertion below
                result["error"] = exc

        thread = threading.Thread(target=long_request)
        thread.start()
        deadline = time.monotonic() + 30
        while replicas(kubectl, namespace, LONG) == 0:
            assert time.monotonic() < deadline, "the gateway did not scale the pool"
            time.sleep(0.2)
        # While the long request waits for the pool, short ones are answered at once.
        started = time.monotonic()
        short = client.chat.completions.create(
            model="glm", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert short.choices and time.monotonic() - started < 10
        thread.join(timeout=240)
        assert "error" not in result, result.get("error")
        reply = result["reply"]
        assert reply.usage.prompt_tokens > 1500  # answered whole by the long-context engine
        assert replicas(kubectl, namespace, LONG) == 1
        assert replicas(kubectl, namespace, OTHER) == 0
        metrics = gw.metrics_text()
        assert metric_value(metrics, "glm_gateway_long_context_wakes_total") == 1
        assert metric_value(metrics, "glm_gateway_overflow_total", outcome="routed") == 1


def test_the_token_cannot_scale_any_other_deployment(scene: dict[str, Any]) -> None:
    url = (f"{scene['server']}/apis/apps/v1/namespaces/{scene['namespace']}/deployments/"
           f"{OTHER}/scale")
    request = urllib.request.Request(
        url, data=b'{"spec":{"replicas":1}}', method="PATCH",
        headers={"Authorization": f"Bearer {scene['token'].read_text()}",
                 "Content-Type": "application/merge-patch+json"})
    import ssl

    context = ssl.create_default_context(cafile=scene["ca"]) if scene["ca"] else \
        ssl._create_unverified_context()
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(request, context=context, timeout=10)
    assert denied.value.code == 403
    # and a gateway pointed at that Deployment answers 503 saying why, without hanging
    with GatewayProcess.start(scene["small"].url, scene["tmp"],
                              gateway_args(scene, OTHER, 10), service_name="glm") as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0,
                               timeout=60)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(
                model="glm", messages=[{"role": "user", "content": prompt_of_tokens(1500)}],
                max_tokens=4)
        assert refused.value.status_code == 503
        assert "403" in refused.value.message
        assert refused.value.response.headers["retry-after"]
