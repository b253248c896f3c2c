"""The kubelet for a routed service's pods (spec.routing.mode EndpointPicker) on this machine,
each pod's processes started from what the operator rendered for it.

kwok binds the pods and marks them Ready but runs nothing. `RoutingKubelet` watches the
namespace's pods and, for each bound one, starts what its containers would run:

- an engine pod (component `engine`, main or long-context pool, on a `loopback` node):
  its rendered llama-server argv and gateway args, the gateway at `<podIP>:8080`
  (e2e/hpa_chain.py ServedPod(at_pod_ip=True)), where the picker and the router reach it,
  with a token of the pod's ServiceAccount where the kubelet would mount one;
- the endpoint picker's pod (component `endpoint-picker`): the EPP binary with the pod's
  rendered args and the rendered EndpointPickerConfig (its ConfigMap volume), only what
  cannot work here replaced: its three ports by free ones, the config file's path, a
  kubeconfig (KUBECONFIG) carrying a token of the pod's own ServiceAccount (so the rendered
  Role is what allows its pod watch), POD_NAME and NAMESPACE as the Downward API would set
  them;
- a router pod (component `router`): `glm-operator router` with the pod's rendered
  args, only --port (RouterProcess binds a free port on 127.0.0.1), the API access (a token
  of the pod's own ServiceAccount: the rendered Role decides every watch and wake) and
  --picker-address (the picker process of the same service) replaced.

A pod that goes away takes its processes with it. A process that dies stays dead (a test
kills the picker on purpose); `restart_picker` starts it again on the same ports.
"""

from __future__ import annotations

import copy
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from glm_operator.render.pod import GATEWAY_CONTAINER

from e2e import procstat
from e2e.epp import EndpointPickerError, picker_env
from e2e.hpa_chain import ServedPod
from e2e.kubectl import Kubectl, KubectlError
from e2e.ports import free_port
from e2e.routing_rig import ApiAccess, RouterProcess, service_account_access

COMPONENT_LABEL = "app.kubernetes.io/component"
SERVICE_LABEL = "glm-operator.dev/service"
POOL_LABEL = "glm-operator.dev/pool"
VERSION_LABEL = "glm-operator.dev/version"
ENGINE, PICKER, ROUTER = "engine", "endpoint-picker", "router"
PERIOD = 0.3


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]  # the rendered args have it: a ValueError says not


def _replaced(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


def _without(args: list[str], flag: str) -> list[str]:
    at = args.index(flag)
    return args[:at] + args[at + 2:]


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def account_kubeconfig(access: ApiAccess, path: Path) -> Path:
    """A kubeconfig that calls the API server as the ServiceAccount whose token `access` has."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{"name": "local", "cluster": {"server": access.server,
                                                   "certificate-authority": access.ca}}],
        "users": [{"name": "pod", "user": {"tokenFile": str(access.token)}}],
        "contexts": [{"name": "pod", "context": {"cluster": "local", "user": "pod"}}],
    }))
    return path


class RenderedPicker:
    """The EPP of one pod, from its rendered container (module docstring)."""

    def __init__(self, binary: Path, pod: dict[str, Any], config_text: str, kubeconfig: Path,
                 work: Path) -> None:
        self.pod_name: str = pod["metadata"]["name"]
        self.namespace: str = pod["metadata"]["namespace"]
        container = _container(pod, "epp")
        self.rendered: list[str] = list(container["args"])
        probe = container.get("readinessProbe", {}).get("grpc", {})
        self.health_service: str = probe.get("service", "")
        self.binary, self.kubeconfig, self.work = binary, kubeconfig, work
        work.mkdir(parents=True, exist_ok=True)
        self.config_file = work / "config.yaml"
        self.config_file.write_text(config_text)
        self.grpc_port, self.health_port, self.metrics_port = (free_port() for _ in range(3))
        self.log_path = work / "epp.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def argv(self) -> list[str]:
        args = self.rendered
        for flag, port in (("--grpc-port", self.grpc_port),
                           ("--grpc-health-port", self.health_port),
                           ("--metrics-port", self.metrics_port)):
            args = _replaced(args, flag, str(port))
        args = _replaced(args, "--config-file", str(self.config_file))
        return [str(self.binary), *args]

    def start(self, timeout: float = 30.0) -> RenderedPicker:
        env = picker_env(self.kubeconfig, self.pod_name, self.namespace)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EndpointPickerError(f"epp exited ({self.process.returncode}):\n"
                                          f"{self.log_tail()}")
            if self.serving(self.health_service):
                return self
            time.sleep(0.1)
        self.stop()
        raise EndpointPickerError(f"epp not SERVING (health service "
                                  f"{self.health_service!r}) after {timeout:g} s:\n"
                                  f"{self.log_tail()}")

    def serving(self, service: str) -> bool:
        """grpc.health.v1 Check for `service` answers SERVING (the rendered probe's)."""
        request = b"" if not service else b"\x0a" + bytes([len(service)]) + service.encode()
        with grpc.insecure_channel(f"127.0.0.1:{self.health_port}") as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
            try:
                return bool(check(request, timeout=1) == b"\x08\x01")
            except grpc.RpcError:
                return False

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crashed or OOM-killed picker."""
        if self.alive():
            assert self.process is not None
            self.process.kill()
            self.process.wait(10)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.alive():
            assert self.process is not None
            procstat.stop(self.process)


@dataclass
class RouterPod:
    pod_name: str
    service: str
    rendered: list[str]  # the pod's rendered args
    process: RouterProcess

    @property
    def url(self) -> str:
        return self.process.url


@dataclass
class EnginePod:
    pod_name: str
    service: str
    version: str
    pool: str
    served: ServedPod

    @property
    def url(self) -> str:
        return self.served.url

    def log_text(self) -> str:
        return self.served.gateway.log_path.read_text(errors="replace")


class RoutingKubelet:
    def __init__(self, kubectl: Kubectl, namespace: str, model: Path, epp_binary: Path,
                 work: Path) -> None:
        self.kubectl, self.ns, self.model, self.epp_binary = kubectl, namespace, model, epp_binary
        self.work = work
        self.engines: dict[str, EnginePod] = {}
        self.pickers: dict[str, RenderedPicker] = {}  # by pod
        self.routers: dict[str, RouterPod] = {}
        self.errors: list[str] = []
        self._starting: dict[str, Future[None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="kubelet")
        self._thread = threading.Thread(target=self._run, name="routing-kubelet", daemon=True)

    # --- what runs ---------------------------------------------------------------------------

    def engines_of(self, service: str, pool: str = "main",
                   version: str | None = None) -> list[EnginePod]:
        with self._lock:
            return sorted((e for e in self.engines.values() if e.service == service
                           and e.pool == pool and (version is None or e.version == version)),
                          key=lambda e: e.pod_name)

    def routers_of(self, service: str) -> list[RouterPod]:
        with self._lock:
            return sorted((r for r in self.routers.values() if r.service == service),
                          key=lambda r: r.pod_name)

    def picker_of(self, service: str) -> RenderedPicker | None:
        with self._lock:
            for name, picker in self.pickers.items():
                if name.startswith(f"{service}-epp-"):
                    return picker
        return None

    def restart_picker(self, service: str) -> RenderedPicker:
        """Start a killed picker again, on its ports (the routers' --picker-address)."""
        picker = self.picker_of(service)
        assert picker is not None, f"no picker pod of {service} served"
        if not picker.alive():
            picker.start()
        return picker

    # --- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # reported by the tests, which fail on it
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(PERIOD)

    def sync(self) -> None:
        try:
            pods = self.kubectl.items("pods", "-n", self.ns)
        except KubectlError as exc:
            self.errors.append(str(exc))
            return
        live = {p["metadata"]["name"]: p for p in pods
                if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")
                and (p.get("status") or {}).get("podIP")}
        self._stop_gone(set(live))
        # Pickers first: a router is started with its service's picker address.
        order = {PICKER: 0, ENGINE: 1, ROUTER: 2}
        for pod in sorted(live.values(), key=lambda p: order.get(
                p["metadata"].get("labels", {}).get(COMPONENT_LABEL, ""), 9)):
            self._maybe_start(pod)

    def _stop_gone(self, live: set[str]) -> None:
        with self._lock:
            gone_engines = [self.engines.pop(n) for n in list(self.engines) if n not in live]
            gone_routers = [self.routers.pop(n) for n in list(self.routers) if n not in live]
            gone_pickers = [self.pickers.pop(n) for n in list(self.pickers) if n not in live]
        for engine in gone_engines:
            engine.served.stop()
        for router in gone_routers:
            router.process.stop()
        for picker in gone_pickers:
            picker.stop()

    def _maybe_start(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        labels = pod["metadata"].get("labels", {})
        component = labels.get(COMPONENT_LABEL)
        service = labels.get(SERVICE_LABEL, "")
        with self._lock:
            if name in self.engines or name in self.routers or name in self.pickers:
                return
        running = self._starting.get(name)
        if running is not None:
            if not running.done():
                return
            del self._starting[name]
            error = running.exception()
            if error is not None:
                self.errors.append(f"pod {name}: {type(error).__name__}: {error}")
                return  # not again: the test reports it
        if component == ENGINE:
            self._starting[name] = self._pool.submit(self._start_engine, pod, service)
        elif component == PICKER:
            self._starting[name] = self._pool.submit(self._start_picker, pod)
        elif component == ROUTER and self.picker_of(service) is not None:
            self._starting[name] = self._pool.submit(self._start_router, pod, service)

    def _start_engine(self, pod: dict[str, Any], service: str) -> None:
        labels = pod["metadata"]["labels"]
        # The pod's token, as the kubelet mounts it: the gateway's wake of the long-context
        # pool and its activity Lease call the API server as the pod's own ServiceAccount.
        pod = copy.deepcopy(pod)
        gateway = _container(pod, GATEWAY_CONTAINER)
        gateway["args"] = [*gateway["args"], *self._access(pod).args()]
        served = ServedPod(pod, self.model, self.work / "pods", at_pod_ip=True)
        engine = EnginePod(served.name, service, labels.get(VERSION_LABEL, ""),
                           labels.get(POOL_LABEL, ""), served)
        with self._lock:
            self.engines[served.name] = engine
        if self._stop.is_set():
            served.stop()

    def _access(self, pod: dict[str, Any]) -> ApiAccess:
        account = pod["spec"]["serviceAccountName"]
        return service_account_access(self.kubectl, self.ns, account,
                                      self.work / "accounts" / pod["metadata"]["name"])

    def _start_picker(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "config")
        configmap = self.kubectl.get_json("configmap", volume["configMap"]["name"], "-n",
                                          self.ns)
        mount = next(m for m in _container(pod, "epp")["volumeMounts"]
                     if m["name"] == "config")
        rendered_file = _value(_container(pod, "epp")["args"], "--config-file")
        key = Path(rendered_file).relative_to(mount["mountPath"]).as_posix()
        access = self._access(pod)
        kubeconfig = account_kubeconfig(access, access.token.parent / "kubeconfig")
        picker = RenderedPicker(self.epp_binary, pod, configmap["data"][key], kubeconfig,
                                self.work / "pods" / name).start()
        with self._lock:
            self.pickers[name] = picker

    def _start_router(self, pod: dict[str, Any], service: str) -> None:
        name = pod["metadata"]["name"]
        rendered = list(_container(pod, "router")["args"])
        assert rendered[:1] == ["router"], rendered
        picker = self.picker_of(service)
        assert picker is not None
        args = _without(rendered[1:], "--port")
        args = _replaced(args, "--picker-address", picker.address)
        process = RouterProcess.launch(args, self._access(pod), self.work / "pods" / name)
        with self._lock:
            self.routers[name] = RouterPod(name, service, rendered, process)

    def __enter__(self) -> RoutingKubelet:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            routers, engines, pickers = (list(self.routers.values()),
                                         list(self.engines.values()),
                                         list(self.pickers.values()))
            self.routers.clear()
            self.engines.clear()
            self.pickers.clear()
        for router in routers:
            router.process.stop()
        for engine in engines:
            engine.served.stop()
        for picker in pickers:
            picker.stop()
