"""The real endpoint picker (the `[epp]` pin, v1.5.0; e2e/epp.py) choosing among real kwok
pods by the metrics real servers at the pods' own IPs export.

Pods labelled as an engine pool's (glm-operator.dev/service=<svc>, glm-operator.dev/pool=main)
sit on the `loopback` nodes (e2e/nodes.yaml), so their IPs are 127.x addresses; at each one a
small HTTP server (e2e/pod_serving.py MetricsStandIn) exports the gateway's
glm_gateway_requests_queued and glm_gateway_kv_cache_usage_ratio with values the test sets.
The EPP runs with the router's picker's rendered flags and EndpointPickerConfig (the
gateway's names in its engineConfigs) and a ServiceAccount token whose
Role grants pods get/list/watch and nothing else; it finds the pods through the API server and
scrapes them at the IPs it reads. The test talks ext-proc to it as the router does
(e2e/epp.py pick):

- a pod with a long queue is not picked while the others are, and the picks follow the
  metrics when they change;
- the subset hint restricts the pick (a long-queued pod is picked when it is the only one
  allowed); a subset of no known pod is answered 503; a body without a model 400;
- the real gateway bound at a pod's IP is scraped and picked;
- control: the same pods with the EPP reading the engines' own names (the config without our
  engineConfigs: vLLM's, its default) -- the long queue is invisible and that pod is picked
  too;
- a pod whose metrics cannot be read is not dropped: it looks idle and draws every pick.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.epp import (
    POD_PORT,
    POOL_LABEL,
    SERVICE_LABEL,
    EndpointPicker,
    engine_names_config,
    epp_binary,
    pick,
)
from e2e.gateway_process import GatewayProcess
from e2e.kubectl import Kubectl
from e2e.pod_serving import LOOPBACK_PLACEMENT, MetricsStandIn, loopback_pod_ip
from e2e.ports import free_port
from e2e.test_chart import service_account_kubeconfig

__all__ = ["epp_binary"]  # fixture used by name

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

SERVICE = "chat"
PICKS = 24
Wait = Callable[..., Any]


def engine_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {SERVICE_LABEL: SERVICE, POOL_LABEL: "main",
                                              "glm-operator.dev/version": "v1"}},
        "spec": {**LOOPBACK_PLACEMENT,
                 "containers": [{"name": "gateway", "image": "glm-operator:e2e",
                                 "ports": [{"name": "http", "containerPort": POD_PORT}]}]},
    }


def ready_pod_ips(kubectl: Kubectl, ns: str, names: list[str], wait_for: Wait) -> dict[str, str]:
    kubectl.apply([engine_pod(n) for n in names], namespace=ns)

    def ips() -> dict[str, str] | None:
        pods = {p["metadata"]["name"]: p for p in kubectl.items("pods", "-n", ns)}
        ready = {name: pod for name, pod in pods.items()
                 if any(c["type"] == "Ready" and c["status"] == "True"
                        for c in (pod.get("status") or {}).get("conditions") or [])}
        if set(names) - set(ready):
            return None
        return {name: loopback_pod_ip(ready[name]) for name in names}

    found: dict[str, str] = wait_for(ips, timeout=30, what=f"pods {names} Ready with an IP")
    return found


def picker_kubeconfig(kubectl: Kubectl, ns: str, path: Path) -> Path:
    """A token of a ServiceAccount whose only grant is pods get/list/watch in `ns`."""
    kubectl.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "epp"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "epp"},
         "rules": [{"apiGroups": [""], "resources": ["pods"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "epp"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "epp"},
         "subjects": [{"kind": "ServiceAccount", "name": "epp", "namespace": ns}]},
    ], namespace=ns)
    token = kubectl("create", "token", "epp", "-n", ns, "--duration=600s").stdout.strip()
    return service_account_kubeconfig(kubectl.kubeconfig, token, path)


@contextlib.contextmanager
def stand_ins(ips: dict[str, str], names: tuple[str, str] | None = None
              ) -> Iterator[dict[str, MetricsStandIn]]:
    servers: dict[str, MetricsStandIn] = {}
    try:
        for pod, ip in ips.items():
            kwargs = {"names": names} if names else {}
            servers[pod] = MetricsStandIn(ip, POD_PORT, SERVICE, **kwargs)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def endpoint(ip: str) -> str:
    return f"{ip}:{POD_PORT}"


def wait_known(epp: EndpointPicker, ips: dict[str, str], wait_for: Wait) -> None:
    """Each pod picked when it is the only one allowed: the EPP has it (its health says
    SERVING before it has listed any pod)."""
    for ip in ips.values():
        wait_for(lambda ip=ip: pick(epp.channel(), SERVICE, "warm up",
                                    subset=[endpoint(ip)]).endpoint == endpoint(ip),
                 timeout=20, what=f"the EPP to know the pod at {ip}",
                 interval=0.2)


def settle(servers: dict[str, MetricsStandIn], scrapes: int = 3) -> None:
    """Until every server has been scraped `scrapes` more times (every 50 ms)."""
    start = {pod: s.scrapes() for pod, s in servers.items()}
    deadline = time.monotonic() + 10
    while any(s.scrapes() < start[p] + scrapes for p, s in servers.items()):
        assert time.monotonic() < deadline, {p: s.scrapes() for p, s in servers.items()}
        time.sleep(0.05)


def picks(epp: EndpointPicker, ips: dict[str, str], count: int = PICKS,
          tag: str = "") -> Counter[str]:
    """`count` picks with distinct short prompts (no prefix-cache affinity), by pod name."""
    by_ip = {endpoint(ip): pod for pod, ip in ips.items()}
    seen: Counter[str] = Counter()
    for index in range(count):
        result = pick(epp.channel(), SERVICE, f"{tag} question {index}")
        assert result.endpoint in by_ip, result
        assert result.metadata_endpoint == result.endpoint, result
        assert result.responses == ["request_headers", "request_body"], result
        assert result.body_end_of_stream, result
        seen[by_ip[result.endpoint]] += 1
    return seen


def epp_metric(epp: EndpointPicker, name: str) -> dict[str, float]:
    """The EPP's own /metrics: `name`'s samples by their label text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{epp.metrics_port}/metrics",
                                timeout=5) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if match:
            found[match.group(1) or ""] = float(match.group(2))
    return found


def test_the_picker_avoids_a_long_queue_follows_the_metrics_and_keeps_to_the_subset_hint(
        kubectl: Kubectl, namespace: str, wait_for: Wait, epp_binary: Path,
        tmp_path: Path) -> None:
    ips = ready_pod_ips(kubectl, namespace, ["pod-a", "pod-b", "pod-c"], wait_for)
    assert len(set(ips.values())) == 3, ips
    config = picker_kubeconfig(kubectl, namespace, tmp_path / "epp.kubeconfig")
    epp = EndpointPicker(epp_binary, config, SERVICE, namespace, tmp_path,
                         extra_args=("--refresh-prometheus-metrics-interval=200ms",))
    with stand_ins(ips) as servers, epp.start():
        servers["pod-a"].set(queued=10, kv_cache_usage=0.2)
        servers["pod-b"].set(queued=0, kv_cache_usage=0.2)
        servers["pod-c"].set(queued=0, kv_cache_usage=0.2)
        try:
            wait_known(epp, ips, wait_for)
            settle(servers)
            # What the EPP read: the queues the servers export, per pod (<pod>-rank-0).
            queues = wait_for(lambda: (q := epp_metric(epp, "inference_pool_per_pod_queue_size"))
                              and len(q) == 3 and q, timeout=10, what="the EPP's per-pod queues")
            assert sorted(queues.values()) == [0.0, 0.0, 10.0], queues
            assert any("pod-a-rank-0" in labels and value == 10.0
                       for labels, value in queues.items()), queues

            seen = picks(epp, ips, tag="first")
            assert seen["pod-a"] == 0, seen
            assert seen["pod-b"] and seen["pod-c"], seen

            # The picks follow the metrics: now pod-b's queue is the long one.
            servers["pod-a"].set(queued=0, kv_cache_usage=0.2)
            servers["pod-b"].set(queued=10, kv_cache_usage=0.2)
            settle(servers)
            seen = picks(epp, ips, tag="second")
            assert seen["pod-b"] == 0, seen
            assert seen["pod-a"] and seen["pod-c"], seen
            # With equal queues the emptier KV cache wins.
            servers["pod-b"].set(queued=0, kv_cache_usage=0.9)
            servers["pod-c"].set(queued=0, kv_cache_usage=0.0)
            settle(servers)
            assert picks(epp, ips, count=8, tag="third") == Counter({"pod-c": 8})

            # The subset hint: the one pod allowed is picked, whatever its load.
            b = endpoint(ips["pod-b"])
            for index in range(5):
                assert pick(epp.channel(), SERVICE, f"hint {index}", subset=[b]).endpoint == b
            pair = {endpoint(ips["pod-a"]), b}
            assert {pick(epp.channel(), SERVICE, f"pair {i}", subset=sorted(pair)).endpoint
                    for i in range(8)} <= pair
            # The hint is read from the body's message: on the headers' alone it is lost
            # (pod-c, the emptiest, is picked), on the body's alone it holds.
            assert pick(epp.channel(), SERVICE, "on headers", subset=[b],
                        hint_on=("headers",)).endpoint == endpoint(ips["pod-c"])
            assert pick(epp.channel(), SERVICE, "on body", subset=[b],
                        hint_on=("body",)).endpoint == b
            # Only the address counts (the port is not compared: requestcontrol's endpoint
            # candidates filter on the hint's addresses).
            assert pick(epp.channel(), SERVICE, "port", subset=[f"{ips['pod-b']}:1"]
                        ).endpoint == b

            # No candidate: an ImmediateResponse 503, and nothing else on the stream.
            for subset in (["127.0.0.99:8080"], []):
                none = pick(epp.channel(), SERVICE, "nobody", subset=subset)
                assert (none.status, none.endpoint, none.responses) == (
                    503, None, ["immediate_response"]), none
                assert b"failed to find endpoint candidates" in none.body, none
            # Of the headers only :path is read (no :method, content-type or x-request-id):
            # it says which OpenAI request the body is (v1.5.0's parser: without it a chat
            # body is refused as a completions request without a prompt; the router always
            # sends the client's path) ...
            bare = pick(epp.channel(), SERVICE, "bare", headers=[(":path", "/v1/chat/completions")])
            assert bare.endpoint in {endpoint(ip) for ip in ips.values()}, bare
            pathless = pick(epp.channel(), SERVICE, "pathless", headers=[])
            assert (pathless.status, pathless.endpoint) == (400, None), pathless
            assert b"must have prompt" in pathless.body, pathless
            # ... and a model in the body.
            no_model = pick(epp.channel(), SERVICE, "", body=json.dumps(
                {"messages": [{"role": "user", "content": "no model"}]}).encode())
            assert (no_model.status, no_model.endpoint) == (400, None), no_model
            assert b"model not found" in no_model.body, no_model
        except BaseException:
            print(f"\n--- epp log ---\n{epp.log_tail()}")
            raise


def test_the_real_gateway_at_a_pod_ip_is_scraped_and_picked(
        kubectl: Kubectl, namespace: str, wait_for: Wait, epp_binary: Path,
        tmp_path: Path) -> None:
    ips = ready_pod_ips(kubectl, namespace, ["pod-g"], wait_for)
    ip = ips["pod-g"]
    # No engine behind it: the gateway's /metrics answers all the same.
    gateway = GatewayProcess.start(f"http://127.0.0.1:{free_port()}", tmp_path, (),
                                   service_name=SERVICE, wait_ready=False, host=ip,
                                   port=POD_PORT)
    epp = EndpointPicker(epp_binary, picker_kubeconfig(kubectl, namespace, tmp_path / "kc"),
                         SERVICE, namespace, tmp_path,
                         extra_args=("--refresh-prometheus-metrics-interval=200ms",))
    with gateway, epp.start():
        try:
            wait_for(lambda: pick(epp.channel(), SERVICE, "hello").endpoint == endpoint(ip),
                     timeout=20, what="the EPP to pick the gateway's pod", interval=0.2)
            # Fresh metrics (parsed within the staleness threshold) make a pod "ready" here:
            # the gateway's exposition parses in the EPP's scraper. The pool's `name` label is
            # the picker's Deployment, parsed from POD_NAME (`chat-epp-0-local`): what our
            # patch names the standalone pool (runtime-images/epp/patches/v1.5.0).
            wait_for(lambda: epp_metric(epp, "inference_pool_ready_pods").get(
                         f'{{name="{SERVICE}-epp"}}') == 1.0,
                     timeout=10, what="the EPP to count the gateway's pod as fresh")
        except BaseException:
            print(f"\n--- epp log ---\n{epp.log_tail()}\n--- gateway log ---\n"
                  f"{gateway.log_text()[-3000:]}")
            raise


def test_control_a_picker_reading_other_metric_names_does_not_see_the_long_queue(
        kubectl: Kubectl, namespace: str, wait_for: Wait, epp_binary: Path,
        tmp_path: Path) -> None:
    ips = ready_pod_ips(kubectl, namespace, ["pod-a", "pod-b", "pod-c"], wait_for)
    epp = EndpointPicker(epp_binary, picker_kubeconfig(kubectl, namespace, tmp_path / "kc"),
                         SERVICE, namespace, tmp_path, config=engine_names_config())
    with stand_ins(ips) as servers, epp.start():
        servers["pod-a"].set(queued=10, kv_cache_usage=0.2)
        for pod in ("pod-b", "pod-c"):
            servers[pod].set(queued=0, kv_cache_usage=0.2)
        try:
            wait_known(epp, ips, wait_for)
            settle(servers)
            # All three look alike: pod-a is picked about a third of the time (never, with
            # probability (2/3)^30 ~ 5e-6).
            seen = picks(epp, ips, count=30, tag="control")
            assert seen["pod-a"] > 0, seen
        except BaseException:
            print(f"\n--- epp log ---\n{epp.log_tail()}")
            raise



def test_a_pod_whose_metrics_cannot_be_read_looks_idle_and_draws_every_pick(
        kubectl: Kubectl, namespace: str, wait_for: Wait, epp_binary: Path,
        tmp_path: Path) -> None:
    """The picker keeps a Ready pod a candidate whatever its scrapes do (v1.2.0 and v1.5.0
    alike: staleness only gates sheddable requests, through the saturation detector): a pod
    never scraped reads queue 0 and KV cache 0 and wins every pick. The router cannot count
    on the picker to avoid a pod whose gateway does not answer; only the pod's readiness
    takes it out."""
    ips = ready_pod_ips(kubectl, namespace, ["pod-a", "pod-silent"], wait_for)
    epp = EndpointPicker(epp_binary, picker_kubeconfig(kubectl, namespace, tmp_path / "kc"),
                         SERVICE, namespace, tmp_path)
    with stand_ins({"pod-a": ips["pod-a"]}) as servers, epp.start():
        servers["pod-a"].set(queued=1, kv_cache_usage=0.5)
        try:
            wait_known(epp, ips, wait_for)
            settle(servers)
            assert picks(epp, ips, count=12, tag="silent") == Counter({"pod-silent": 12})
        except BaseException:
            print(f"\n--- epp log ---\n{epp.log_tail()}")
            raise
