"""The autoscaling chain with nothing injected: real engines and gateways for kwok pods, a real
Prometheus, the shipped adapter rules, the custom metrics API, the HPA controller.

    load -> gateway (glm-operator gateway, the pod's rendered args) -> llama-server (the pod's
    rendered argv, the tiny test model) ; Prometheus scrapes each gateway with the labels the
    operator's ServiceMonitor gives -> Bridge: the shipped prometheus-adapter rule's query for
    the target Deployment's pods, as prometheus-adapter evaluates it (e2e/adapter_rules.py),
    written to the custom metrics API (the upstream test adapter) -> the HPA controller

kwok runs no containers, so `PodRunner` plays the kubelet for each pod of the Deployment: it
starts the pod's two containers here as processes (the engine's argv with the tiny model and
one thread, the gateway's args with this machine's ports) and registers the gateway with
Prometheus as the pod; a pod that goes away takes its processes with it.

prometheus-adapter itself is not served by the Go module proxy; `Bridge` runs its rule the way
the adapter does on each request of the HPA: discover the series (its relist), fill in the
rule's query for the pods the HPA asks about (the Deployment's pods), and answer each pod's
sample. What the real adapter does per HPA request, the bridge does every `period` seconds.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from glm_operator.render.pod import ENGINE_CONTAINER, GATEWAY_CONTAINER, GATEWAY_PORT_NAME
from glm_operator.render.quantity import decimal_quantity

from e2e.adapter_rules import Rule, RuleError, per_pod_values
from e2e.custom_metrics import CustomMetricsAdapter, CustomMetricsError
from e2e.gateway_process import GatewayProcess
from e2e.kubectl import Kubectl, KubectlError
from e2e.llama import LlamaServer, local_socket
from e2e.pod_serving import loopback_pod_ip
from e2e.ports import free_port
from e2e.prometheus import PrometheusServer

ENGINE_THREADS = "1"  # the machine has two cores for every engine, gateway and the cluster


def _replace_value(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    at = out.index(flag) + 1  # the rendered argv has it: a ValueError says it does not
    out[at] = value
    return out


def live_pods(kubectl: Kubectl, ns: str, deployment: dict[str, Any]) -> list[dict[str, Any]]:
    """The Deployment's pods that are bound and not being deleted, oldest first."""
    labels = deployment["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{key}={value}" for key, value in labels.items())
    pods = [p for p in kubectl.items("pods", "-n", ns, "-l", selector)
            if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")]
    return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])


@dataclass(frozen=True)
class ScrapeLabels:
    """What the Prometheus Operator puts on a gateway's series for the operator's
    ServiceMonitor: the target's namespace, pod, service (the Service the monitor selects),
    container and endpoint (the port's name); honorLabels keeps the gateway's own service,
    model_version and pool over them."""

    namespace: str
    service: str

    @classmethod
    def of(cls, kubectl: Kubectl, ns: str, service_label: str) -> ScrapeLabels:
        monitors = kubectl.items("servicemonitor", "-n", ns, "-l", service_label)
        assert len(monitors) == 1, monitors
        spec = monitors[0]["spec"]
        metrics = next(e for e in spec["endpoints"] if e["path"] == "/metrics")
        # e2e/prometheus.py's job scrapes with honor_labels: true, as this endpoint says.
        assert metrics["honorLabels"] is True and metrics["port"] == GATEWAY_PORT_NAME, metrics
        wanted = spec["selector"]["matchLabels"]
        services = [s for s in kubectl.items("services", "-n", ns)
                    if wanted.items() <= (s["metadata"].get("labels") or {}).items()]
        assert len(services) == 1, [s["metadata"]["name"] for s in services]
        return cls(ns, services[0]["metadata"]["name"])

    def for_pod(self, pod: str) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": pod, "service": self.service,
                "container": GATEWAY_CONTAINER, "endpoint": GATEWAY_PORT_NAME}


class ServedPod:
    """A kwok pod's engine and gateway, run here with the pod's rendered command lines.

    By default the gateway listens on 127.0.0.1 at a free port (what reaches it is given its
    address). `at_pod_ip`: at the pod's own IP and rendered --port (8080) instead, so what
    finds the pod through the API server (the endpoint picker, the router) reaches it there;
    the pod must be on a `loopback` node (e2e/pod_serving.py)."""

    def __init__(self, pod: dict[str, Any], model: Path, work: Path,
                 at_pod_ip: bool = False) -> None:
        self.name: str = pod["metadata"]["name"]
        host = loopback_pod_ip(pod) if at_pod_ip else "127.0.0.1"
        containers = {c["name"]: c for c in pod["spec"]["containers"]}
        engine = containers[ENGINE_CONTAINER]
        argv = [*engine["command"], *engine["args"]]
        argv = _replace_value(argv, "--model", str(model))
        argv = _replace_value(argv, "--threads", ENGINE_THREADS)
        engine_port = free_port()
        self.engine = LlamaServer.start(argv, work / self.name, port=engine_port)
        try:
            gateway = containers[GATEWAY_CONTAINER]
            args = list(gateway["args"])
            assert args[0] == "gateway", args
            args = args[1:]
            self.service_name = args[args.index("--service-name") + 1]
            self.engine_slots = int(args[args.index("--engine-slots") + 1])
            port = int(args[args.index("--port") + 1]) if at_pod_ip else free_port()
            args = _replace_value(args, "--port", str(port))
            args = _replace_value(args, "--engine-url", self.engine.url)
            if "--engine-socket" in args:  # the engine's socket, named for this machine
                socket = args[args.index("--engine-socket") + 1]
                args = _replace_value(args, "--engine-socket", local_socket(socket, engine_port))
            self.gateway = GatewayProcess.start(self.engine.url, work / self.name, args,
                                                service_name=self.service_name, port=port,
                                                host=host)
        except BaseException:
            self.engine.stop()
            raise
        self.started = time.monotonic()

    @property
    def url(self) -> str:
        return self.gateway.url

    @property
    def address(self) -> str:
        return f"{self.gateway.host}:{self.gateway.port}"

    def stop(self) -> None:
        self.gateway.stop()
        self.engine.stop()


class PodRunner:
    """Plays the kubelet for the Deployment's pods: each bound pod gets a ServedPod, scraped
    by `prometheus` as that pod; a deleted pod's processes stop and its target goes."""

    def __init__(self, kubectl: Kubectl, ns: str, deployment: dict[str, Any],
                 prometheus: PrometheusServer, labels: ScrapeLabels, model: Path,
                 work: Path, period: float = 1.0) -> None:
        self.kubectl, self.ns, self.deployment = kubectl, ns, deployment
        self.prometheus, self.labels, self.model, self.work = prometheus, labels, model, work
        self.period = period
        self.served: dict[str, ServedPod] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-runner", daemon=True)

    def gateways(self) -> list[ServedPod]:
        """The pods served now, oldest first."""
        with self._lock:
            return list(self.served.values())

    def _target(self, pod: str) -> str:
        return f"{self.ns}-{pod}"

    def sync(self) -> None:
        try:
            pods = live_pods(self.kubectl, self.ns, self.deployment)
        except KubectlError as exc:
            self.errors.append(str(exc))
            return
        names = [p["metadata"]["name"] for p in pods]
        for gone in [name for name in self.served if name not in names]:
            with self._lock:
                served = self.served.pop(gone)
            self.prometheus.remove_target(self._target(gone))
            served.stop()
        for pod in pods:
            name = pod["metadata"]["name"]
            if name in self.served or self._stop.is_set():
                continue
            served = ServedPod(pod, self.model, self.work)
            self.prometheus.add_target(self._target(name), served.address,
                                       self.labels.for_pod(name))
            with self._lock:
                self.served[name] = served

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # reported by the test, which fails on it
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.period)

    def __enter__(self) -> PodRunner:
        self.sync()  # the first pod is served before the test goes on
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        for name, served in list(self.served.items()):
            self.prometheus.remove_target(self._target(name))
            served.stop()
        self.served.clear()


@dataclass
class Bridge:
    """prometheus-adapter's cycle for one metric: every `period` s, the rules' discovery over
    what Prometheus holds, the winning rule's query for the target Deployment's pods, and each
    pod's sample written to the custom metrics API. A pod without a sample gets nothing (the
    adapter leaves it out too); a discovery that finds no rule for the metric writes
    nothing."""

    prometheus: PrometheusServer
    rules: list[Rule]
    metric: str
    adapter: CustomMetricsAdapter
    kubectl: Kubectl
    ns: str
    deployment: dict[str, Any]
    period: float = 1.0
    written: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adapter-bridge", daemon=True)

    def cycle(self) -> None:
        pods = [p["metadata"]["name"] for p in live_pods(self.kubectl, self.ns,
                                                         self.deployment)]
        if not pods:
            return
        values = per_pod_values(self.prometheus, self.rules, self.metric, self.ns, pods)
        for pod, value in values.items():
            self.adapter.set_pod_metric(self.ns, pod, self.metric,
                                        decimal_quantity(max(value, 0.0)))
        self.written.append((time.monotonic(), values))

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.cycle()
            except (RuleError, CustomMetricsError, KubectlError) as exc:
                self.errors.append(str(exc))
            self._stop.wait(max(0.0, self.period - (time.monotonic() - started)))

    def last(self) -> dict[str, float]:
        return self.written[-1][1] if self.written else {}

    def __enter__(self) -> Bridge:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def chat(model: str, max_tokens: int, index: int) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"request {index}: count to ten"}]}


class QueueLoad:
    """`clients` clients, each holding one kept-alive connection to `gateway` (as a client
    of a Service stays on the pod its connection was balanced to), each sending long
    generations one after another: beyond the engine's slots they wait in its queue."""

    def __init__(self, gateway: ServedPod, clients: int, max_tokens: int) -> None:
        self.gateway, self.clients, self.max_tokens = gateway, clients, max_tokens
        self.statuses: list[int] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                         for i in range(clients)]

    def _client(self, index: int) -> None:
        with httpx.Client(base_url=self.gateway.url, timeout=300) as client:
            for n in itertools.count():
                if self._stop.is_set():
                    return
                try:
                    response = client.post("/v1/chat/completions", json=chat(
                        self.gateway.service_name, self.max_tokens, index * 10000 + n))
                    self.statuses.append(response.status_code)
                except httpx.HTTPError as exc:
                    if not self._stop.is_set():
                        self.failures.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> QueueLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        # A generation in flight ends within seconds; the daemon threads are not waited on
        # longer (the engines stop with their pods).
        for thread in self._threads:
            thread.join(timeout=60)


class RateLoad:
    """`rate` short requests a second in all, each sent to the next served pod in turn (a
    Service balancing requests over its endpoints), whatever pods there are at that moment.
    Open loop: the requests are due on a clock, answered by a pool of `workers` clients."""

    def __init__(self, runner: PodRunner, rate: float, max_tokens: int = 1,
                 workers: int = 8) -> None:
        self.runner, self.rate, self.max_tokens = runner, rate, max_tokens
        self.sent = 0
        self.statuses: list[int] = []
        self.failures: list[str] = []
        self.by_pod: dict[str, int] = {}
        self.max_backlog = 0  # requests due and not yet taken by a client
        self._stop = threading.Event()
        self._due: queue.Queue[tuple[ServedPod, int] | None] = queue.Queue()
        self._threads = [threading.Thread(target=self._clock, name="rate-load", daemon=True),
                         *(threading.Thread(target=self._worker, daemon=True)
                           for _ in range(workers))]

    def _worker(self) -> None:
        with httpx.Client(timeout=60) as client:
            while (item := self._due.get()) is not None:
                served, index = item
                try:
                    response = client.post(served.url + "/v1/chat/completions", json=chat(
                        served.service_name, self.max_tokens, index))
                    self.statuses.append(response.status_code)
                    self.by_pod[served.name] = self.by_pod.get(served.name, 0) + 1
                except httpx.HTTPError as exc:
                    self.failures.append(f"{served.name}: {type(exc).__name__}: {exc}")

    def _clock(self) -> None:
        started = time.monotonic()
        turn = itertools.count()
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            served = self.runner.gateways()
            while served and self.sent < due:
                self.sent += 1
                self._due.put((served[next(turn) % len(served)], self.sent))
            self.max_backlog = max(self.max_backlog, self._due.qsize())
            self._stop.wait(0.02)

    def __enter__(self) -> RateLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for _worker in self._threads[1:]:
            self._due.put(None)
        for thread in self._threads:
            thread.join(timeout=60)
