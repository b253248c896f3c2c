"""The long-context pool 0 -> 1 -> 0 with the real operator, the real gateways and real
llama-servers on the local control plane.

The operator (a process of its own, on a namespace no other operator watches) renders the
pool, its HPA, its activity Lease and the gateways' Roles. The gateways run as processes with
the flags the operator rendered into the Deployments and tokens of the ServiceAccounts it
created, so every API call they make passes the real RBAC. The pool's pods land on kwok's
nodes and run nothing: a watcher plays the kubelet, starting a large-context llama-server and
its long-context gateway when the Deployment wants a replica and stopping them when it goes
back to zero.

What it shows: short requests never touch the pool (no wake, no mark); a long request wakes it
(the Lease marked first, then the scale) and is answered whole by the pool; the HPA
controller leaves the Deployment at 0 alone (ScalingDisabled) and never drives it below 1;
the operator, restarted while the pool is awake, puts it to sleep no earlier than
idleSeconds after the last mark its gateways left, within one renewal interval plus a
reconcile after it. The figures (request -> scale -> ready endpoint -> engine ready -> answer)
are printed and recorded in docs/performance.md.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import openai
import pytest

from e2e.gateway_process import GatewayProcess
from e2e.kubectl import Kubectl
from e2e.llama import LlamaServer, llama_server_binary
from e2e.models import TinyLlamaSpec, prompt_of_tokens, write_tiny_llama
from e2e.operator_fixtures import OperatorProcess, glm_crds
from e2e.ports import free_port
from e2e.test_gateway_wake import api_server_and_ca
from e2e.test_operator import CPU_MV, CPU_SVC, deploy_model, glms, wait_ready

__all__ = ["glm_crds"]  # fixture used by name

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

IDLE_SECONDS = 30  # the API's minimum
RENEWAL_SECONDS = 15  # the gateways' renewal interval at that idleSeconds
Wait = Callable[..., Any]


def gateway_flags(deployment: dict[str, Any], keep: tuple[str, ...]) -> list[str]:
    """The flags the operator rendered for a Deployment's gateway container, those in `keep`."""
    pod = deployment["spec"]["template"]["spec"]
    args: list[str] = next(c for c in pod["containers"] if c["name"] == "gateway")["args"]
    out: list[str] = []
    for flag in keep:
        if flag in args:
            out += [flag, args[args.index(flag) + 1]]
    return out


def replica_owners(kubectl: Kubectl, namespace: str, deployment: str) -> list[str]:
    managed = kubectl.get_json("deployment", deployment, "-n", namespace,
                               "--show-managed-fields")["metadata"]["managedFields"]
    return [m["manager"] for m in managed
            if "f:replicas" in m.get("fieldsV1", {}).get("f:spec", {})]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text)


@dataclass
class Pool:
    """The kubelet of the long-context pool: real processes while the Deployment wants one."""

    kubectl: Kubectl
    namespace: str
    deployment: str
    service: str
    lease: str
    engine_argv: list[str]
    gateway_args: list[str]
    port: int
    tmp: Path
    events: dict[str, float] = field(default_factory=dict)  # first time each thing happened
    stop: threading.Event = field(default_factory=threading.Event)
    engine: LlamaServer | None = None
    gateway: GatewayProcess | None = None
    errors: list[BaseException] = field(default_factory=list)

    def replicas(self) -> int:
        obj = self.kubectl.get_json("deployment", self.deployment, "-n", self.namespace)
        return int(obj["spec"].get("replicas") or 0)

    def ready_endpoint(self) -> bool:
        slices = self.kubectl.items("endpointslices", "-n", self.namespace, "-l",
                                    f"kubernetes.io/service-name={self.service}")
        return any((e.get("conditions") or {}).get("ready")
                   for s in slices for e in (s.get("endpoints") or []))

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                wanted = self.replicas()
                if wanted and self.engine is None:
                    self.events.setdefault("scaled", time.time())
                    # What the waking gateway wrote before it scaled (the pool's own gateway
                    # has not started yet).
                    spec = self.kubectl.get_json("lease", self.lease, "-n",
                                                 self.namespace)["spec"]
                    if "renewTime" in spec:
                        self.events.setdefault("mark_before_scale",
                                               utc(spec["renewTime"]).timestamp())
                    threading.Thread(target=self._watch_endpoint, daemon=True).start()
                    started = time.time()
                    self.engine = LlamaServer.start(self.engine_argv, self.tmp)
                    self.events.setdefault("engine_loaded", time.time())
                    self.events.setdefault("load_seconds", time.time() - started)
                    self.gateway = GatewayProcess.start(
                        self.engine.url, self.tmp, self.gateway_args, service_name="glm-cpu",
                        port=self.port)
                    self.events.setdefault("gateway_ready", time.time())
                elif not wanted and self.engine is not None:
                    self.events.setdefault("stopped", time.time())
                    self._stop_processes()
                time.sleep(0.2)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def _watch_endpoint(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not self.stop.is_set():
            if self.ready_endpoint():
                self.events.setdefault("endpoint_ready", time.time())
                return
            time.sleep(0.2)

    def _stop_processes(self) -> None:
        for process in (self.gateway, self.engine):
            if process is not None:
                process.stop()
        self.gateway = self.engine = None


@pytest.fixture
def scene(glm_crds: list[str], kubectl: Kubectl, wait_for: Wait, tmp_path: Path
          ) -> Iterator[dict[str, Any]]:
    namespace = f"lcpool-{uuid.uuid4().hex[:6]}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    operator = OperatorProcess(kubectl, namespaces=(namespace,))
    state: dict[str, Any] = {"operator": operator}
    try:
        wait_for(operator.alive, timeout=60, what="the operator")
        wait_for(lambda: kubectl.exists("serviceaccount", "default", "-n", namespace),
                 timeout=30, what="the default ServiceAccount")
        deploy_model(kubectl, namespace, CPU_MV, wait_for)
        svc = copy.deepcopy(CPU_SVC)
        svc["spec"]["longContext"] = {
            "contextLength": 32768, "idleSeconds": IDLE_SECONDS,
            "autoscaling": {"minReplicas": 0, "maxReplicas": 3, "targets": {"queueLength": 1}}}
        kubectl.apply(svc, namespace=namespace)
        name = svc["metadata"]["name"]
        wait_ready(kubectl, namespace, name, wait_for)
        yield {"namespace": namespace, "name": name, "state": state}
    finally:
        if state.get("pool") is not None:
            state["pool"].stop.set()
        state["operator"].stop()
        print(state["operator"].tail(60))
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


def test_long_context_pool_wakes_on_a_long_request_and_sleeps_when_idle(
        scene: dict[str, Any], kubectl: Kubectl, wait_for: Wait, tmp_path: Path) -> None:
    namespace, name, state = scene["namespace"], scene["name"], scene["state"]
    deployments = {d["metadata"]["labels"]["glm-operator.dev/pool"]: d for d in
                   kubectl.items("deployments", "-n", namespace)}
    main, lc = deployments["main"], deployments["long-context"]
    lc_name = lc["metadata"]["name"]
    lease_name = f"{name}-lc"

    # --- what the operator rendered, as the API server holds it -------------------------------
    lease = kubectl.get_json("lease", lease_name, "-n", namespace)
    assert lease["spec"]["leaseDurationSeconds"] == IDLE_SECONDS
    assert "renewTime" not in lease["spec"]
    hpa = kubectl.get_json("hpa", lc_name, "-n", namespace)
    assert hpa["spec"]["scaleTargetRef"]["name"] == lc_name
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 3)
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "glm_gateway_requests_queued"
    # Created at 0 and co-owned by another manager from the start: the operator's later
    # applies (which omit replicas) never reset them; the wake, the HPA and the idle
    # scale-down set them.
    assert "glm-operator-initial-replicas" in replica_owners(kubectl, namespace, lc_name)
    # The real HPA controller leaves a Deployment at 0 replicas alone.

    def scaling_disabled() -> bool:
        conditions = kubectl.get_json("hpa", lc_name, "-n", namespace).get(
            "status", {}).get("conditions", [])
        return any(c["type"] == "ScalingActive" and c["status"] == "False"
                   and c["reason"] == "ScalingDisabled" for c in conditions)
    wait_for(scaling_disabled, timeout=45, what="the HPA controller's ScalingDisabled at 0")
    # Each gateway may renew the one Lease; the pool's own gateways may not scale anything.
    lc_account = f"system:serviceaccount:{namespace}:{name}-lc-gateway"
    for verb, resource, allowed in (("patch", f"leases/{lease_name}", "yes"),
                                    ("patch", "leases/other", "no"),
                                    ("patch", f"deployments/{lc_name}", "no")):
        answer = kubectl.run("auth", "can-i", verb, resource, "-n", namespace,
                             f"--as={lc_account}", check=False).stdout.strip()
        assert answer == allowed, (verb, resource, answer)
    for account, allowed in ((lc_account, "no"),
                             (f"system:serviceaccount:{namespace}:{name}-gateway", "yes")):
        scale = kubectl.run("auth", "can-i", "patch", f"deployments/{lc_name}",
                            "--subresource=scale", "-n", namespace, f"--as={account}",
                            check=False)
        assert scale.stdout.strip() == allowed, (account, scale.stdout, scale.stderr)

    # --- the gateways, with the operator's flags and the ServiceAccounts' tokens --------------
    server, ca = api_server_and_ca(kubectl, tmp_path)
    tokens = {}
    for account in (f"{name}-gateway", f"{name}-lc-gateway"):
        tokens[account] = tmp_path / f"{account}.token"
        tokens[account].write_text(kubectl.run("create", "token", account, "-n", namespace,
                                               "--duration", "1h").stdout.strip())
    kube = ["--kube-api-server", server, "--kube-ca-path", ca, "--namespace", namespace]
    binary = llama_server_binary()
    model = write_tiny_llama(tmp_path / "tiny.gguf", TinyLlamaSpec(n_ctx_train=16384))
    pool = Pool(
        kubectl, namespace, lc_name, f"{name}-lc", lease_name,
        engine_argv=[str(binary), "-m", str(model), "-c", "8192", "-np", "1", "-t", "1"],
        gateway_args=[*gateway_flags(lc, ("--pool", "--model-version", "--activity-lease")),
                      *kube, "--kube-token-path", str(tokens[f"{name}-lc-gateway"])],
        port=free_port(), tmp=tmp_path / "pool")
    state["pool"] = pool
    threading.Thread(target=pool.run, daemon=True).start()
    main_flags = gateway_flags(main, ("--pool", "--model-version", "--long-context-deployment",
                                      "--activity-lease", "--wake-timeout"))
    planned_wake_timeout = float(main_flags[main_flags.index("--wake-timeout") + 1])
    with LlamaServer.start([str(binary), "-m", str(model), "-c", "512", "-np", "1", "-t", "1"],
                           tmp_path) as small, \
            GatewayProcess.start(small.url, tmp_path, [
                *main_flags, *kube, "--kube-token-path", str(tokens[f"{name}-gateway"]),
                "--long-context-url", f"http://127.0.0.1:{pool.port}"],
                service_name=name) as main_gw:
        client = openai.OpenAI(base_url=main_gw.url + "/v1", api_key="none", max_retries=0,
                               timeout=240)

        def ask(tokens: int) -> Any:
            return client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": prompt_of_tokens(tokens)}],
                max_tokens=4)

        # Short requests never wake the pool, nor mark it as used.
        for _ in range(3):
            assert ask(50).choices
        time.sleep(1)
        assert pool.replicas() == 0
        assert "renewTime" not in kubectl.get_json("lease", lease_name, "-n",
                                                    namespace)["spec"]

        # A long request wakes it: the Lease is marked, then the pool scaled, then answered.
        sent = time.time()
        reply = ask(1500)
        answered = time.time()
        assert reply.usage is not None and reply.usage.prompt_tokens > 1500  # not truncated
        assert not pool.errors, pool.errors
        assert sent - 1 <= pool.events["mark_before_scale"] <= pool.events["scaled"]
        assert not {"glm-operator", "glm-operator-initial-replicas"} & set(
            replica_owners(kubectl, namespace, lc_name))  # the wake's now
        marked = utc(kubectl.get_json("lease", lease_name, "-n", namespace)["spec"]["renewTime"])
        woken = glms(kubectl, namespace, name)["status"]["longContext"]
        wait_for(lambda: "scaleToZeroTime" in (glms(kubectl, namespace, name)["status"].get(
            "longContext") or {}), timeout=20, what="the operator's idle deadline in status")

        # The operator dies while the pool is awake; a new one must decide from what the
        # cluster holds (status and the Lease), and a gateway restart loses nothing either.
        state["operator"].kill()
        time.sleep(2)
        assert ask(1500).usage is not None  # served by the pool, marked by its gateway
        state["operator"] = OperatorProcess(kubectl, namespaces=(namespace,))
        wait_for(state["operator"].alive, timeout=60, what="the restarted operator")

        def asleep() -> float | None:
            return pool.events.get("stopped")
        wait_for(asleep, timeout=IDLE_SECONDS + 2 * RENEWAL_SECONDS + 30,
                 what="the idle pool scaled to zero")
        slept = pool.events["stopped"]
        last_mark = utc(kubectl.get_json("lease", lease_name, "-n", namespace)["spec"][
            "renewTime"]).timestamp()
        assert last_mark > marked.timestamp()  # the pool's gateway renewed it
        # Never before idleSeconds after the last mark; within one renewal interval (the
        # mark's throttle) and a few seconds of reconcile and watch after it.
        assert slept >= last_mark + IDLE_SECONDS - 0.5, (slept, last_mark)
        assert slept <= last_mark + IDLE_SECONDS + RENEWAL_SECONDS + 10, (slept, last_mark)
        status = glms(kubectl, namespace, name)["status"]["longContext"]
        assert "scaleToZeroTime" not in status
        assert abs(utc(status["lastActivityTime"]).timestamp() - last_mark) < 0.01
        events = kubectl.items("events", "-n", namespace,
                               "--field-selector", "reason=LongContextIdle")
        assert events, "no LongContextIdle event"
        # The restarted operator scaled it, through the scale subresource (replicas 0 has no
        # owner in managedFields: the Scale object omits a zero).
        assert state["operator"].metric("glm_operator_child_writes_total",
                                        action="scale-to-zero") == 1
        assert replica_owners(kubectl, namespace, lc_name) == []
        # Neither the gateways' renewals nor the scale changes were drift to undo: the
        # restarted operator read the Lease back and left it (and the pool's size) alone.
        assert state["operator"].metric("glm_operator_child_writes_total", kind="Lease") == 0
        assert not kubectl.items("events", "-n", namespace,
                                 "--field-selector", "reason=DriftCorrected")

        # Asleep, short requests are still answered, and nothing wakes the pool.
        assert ask(50).choices
        time.sleep(3)
        assert pool.replicas() == 0
        assert "stopped" in pool.events and pool.engine is None

    figures = {
        "planned wake timeout (s)": planned_wake_timeout,
        "request -> scaled (s)": pool.events["scaled"] - sent,
        "request -> ready endpoint (s)": pool.events.get("endpoint_ready", float("nan")) - sent,
        "engine load (s)": pool.events["load_seconds"],
        "request -> pool gateway ready (s)": pool.events["gateway_ready"] - sent,
        "request -> answer (s)": answered - sent,
        "last mark -> scaled to zero (s)": slept - last_mark,
        "first status after wake": woken,
    }
    print("\nlong-context pool figures: " + ", ".join(f"{k}: {v:.2f}" if isinstance(v, float)
                                                       else f"{k}: {v}"
                                                       for k, v in figures.items()))
