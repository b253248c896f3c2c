"""The local Kubernetes control plane the e2e tests and the demo run against.

A real cluster without Docker: `kwokctl create cluster --runtime binary` starts the binaries
built by e2e/toolchain.py as plain processes on this machine:

    etcd v3.6 -> kube-apiserver -> kube-controller-manager (GC, ReplicaSet, PV binder, ...)
                                -> kube-scheduler
                                -> kwok (plays the kubelet for the fake nodes)

then this script creates the fake GPU/NPU/CPU nodes of e2e/nodes.yaml, a default StorageClass
with pre-provisioned PersistentVolumes and the real third-party CRDs (Istio, ServiceMonitor,
Argo CD Application, KEDA ScaledObject).

    python -m e2e.cluster up [--build]   start it (no-op when it is already up)
    python -m e2e.cluster status         say whether it is up, and its processes
    python -m e2e.cluster down           stop every process it started and remove its state
    python -m e2e.cluster recycle-volumes  make Released PersistentVolumes Available again

The kubeconfig is written to .e2e/kubeconfig (`export KUBECONFIG=$PWD/.e2e/kubeconfig`).
State lives under .e2e/ (GLM_E2E_STATE_DIR), kwokctl's own under .e2e/kwok (KWOK_WORKDIR).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e import toolchain
from e2e.kubectl import Kubectl, KubectlError, wait_for

E2E_DIR = Path(__file__).resolve().parent
REPO_ROOT = E2E_DIR.parent
NODES_FILE = E2E_DIR / "nodes.yaml"
CLUSTER_NAME = "glm-e2e"
CONTEXT_NAME = f"kwok-{CLUSTER_NAME}"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
VOLUME_LABEL = "glm-operator.dev/e2e-volume"
FIELD_MANAGER = "glm-e2e-cluster"

# Fixed ports, below the Linux ephemeral range (32768+) so an outgoing connection never holds
# one. `up` refuses to start, naming the port and its owner, when one is taken.
# GLM_E2E_PORT_OFFSET shifts them all, to run a second cluster (with its own state directory,
# see state_dir) next to the shared one.
_PORT_OFFSET = int(os.environ.get("GLM_E2E_PORT_OFFSET", "0"))
PORTS = {
    name: port + _PORT_OFFSET
    for name, port in {
        "kube-apiserver": 16443,
        "etcd": 12379,
        "etcd-peer": 12380,
        "kube-controller-manager": 10357,
        "kube-scheduler": 10359,
        "kwok-controller": 10347,
    }.items()
}

# The third-party CRDs installed into every cluster: (toolchain component, file in its cache).
THIRD_PARTY_CRDS = [
    ("istio", "istio-crds.yaml"),
    ("prometheus_operator", "servicemonitors.yaml"),
    ("argocd", "application-crd.yaml"),
    ("keda", "keda-scaledobjects.yaml"),
    # spec.routing.mode InferenceGateway: the pools, what each pool's picker watches, the route
    # and its parent.
    ("inference_extension", "inferencepools.yaml"),
    ("inference_extension", "inferenceobjectives.yaml"),
    ("gateway_api", "httproutes.yaml"),
    ("gateway_api", "gateways.yaml"),
]


class ClusterError(RuntimeError):
    """The cluster cannot be brought up or down; the message names the problem."""


def log(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


# --- where things live ---------------------------------------------------------------------


def state_dir() -> Path:
    """.e2e, or .e2e-<offset> for a second cluster (GLM_E2E_PORT_OFFSET), so two clusters
    started from one checkout never share kwokctl's directory (nor stop each other's
    processes, which `down` finds by it)."""
    configured = os.environ.get("GLM_E2E_STATE_DIR")
    if configured:
        return Path(configured).resolve()
    return REPO_ROOT / (f".e2e-{_PORT_OFFSET}" if _PORT_OFFSET else ".e2e")


def kubeconfig_path() -> Path:
    return state_dir() / "kubeconfig"


def kwok_workdir() -> Path:
    configured = os.environ.get("KWOK_WORKDIR")
    return Path(configured).resolve() if configured else state_dir() / "kwok"


def cluster_dir() -> Path:
    """kwokctl's directory for this cluster: pki, pids, logs, etcd data."""
    return kwok_workdir() / "clusters" / CLUSTER_NAME


def ready_marker() -> Path:
    """Written once nodes, volumes and CRDs exist; an `up` interrupted before that resumes."""
    return cluster_dir() / "glm-e2e-populated"


def _write_ready_marker() -> None:
    """The marker names the third-party CRD files installed, one a line."""
    ready_marker().write_text("".join(f"{c}/{n}\n" for c, n in THIRD_PARTY_CRDS))


def _crds_missing_from_marker() -> bool:
    installed = set(ready_marker().read_text().split())
    return any(f"{c}/{n}" not in installed for c, n in THIRD_PARTY_CRDS)


def kwokctl_config_path() -> Path:
    return state_dir() / "kwokctl.yaml"


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    etcd: Path
    kwok: Path
    kwokctl: Path

    @classmethod
    def from_cache(cls) -> Binaries:
        kube = toolchain.bin_dir("kubernetes")
        kwok = toolchain.bin_dir("kwok")
        return cls(
            kube_apiserver=kube / "kube-apiserver",
            kube_controller_manager=kube / "kube-controller-manager",
            kube_scheduler=kube / "kube-scheduler",
            kubectl=kube / "kubectl",
            etcd=toolchain.bin_dir("etcd") / "etcd",
            kwok=kwok / "kwok",
            kwokctl=kwok / "kwokctl",
        )

    def missing(self) -> list[Path]:
        return [p for p in vars(self).values() if not (p.is_file() and os.access(p, os.X_OK))]


def control_plane_components() -> list[str]:
    return ["kubernetes", "etcd", "kwok", *(component for component, _ in THIRD_PARTY_CRDS)]


def build_missing() -> None:
    """Build whatever the control plane needs and is not cached yet (minutes, once)."""
    for component in control_plane_components():
        toolchain.ensure(component)


def kubectl() -> Kubectl:
    return Kubectl(Binaries.from_cache().kubectl, kubeconfig_path())


# --- processes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Process:
    pid: int
    command: str


def cluster_processes() -> list[Process]:
    """The processes kwokctl started for this cluster: their command lines name its directory."""
    marker = str(cluster_dir())
    found: list[Process] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        command = " ".join(part.decode(errors="replace") for part in argv if part)
        if marker in command:
            found.append(Process(int(entry.name), command))
    return found


def _process_name(command: str) -> str:
    return Path(command.split(" ", 1)[0]).name


def _stop_processes(processes: Sequence[Process], grace_s: float = 10) -> None:
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = list(processes)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if Path(f"/proc/{p.pid}").exists() and not _is_zombie(p.pid)]
    for process in alive:
        log(f"pid {process.pid} ({_process_name(process.command)}) ignored SIGTERM; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
              "kwok-controller")


@dataclass(frozen=True)
class Command:
    """How kwokctl started one component: enough to start it again the same way."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]


def _pid_file(component: str) -> Path:
    return cluster_dir() / "pids" / f"{component}.pid"


def component_pid(component: str) -> int | None:
    """The live pid of a component, None when it is not running."""
    try:
        pid = int(_pid_file(component).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() and not _is_zombie(pid) else None


def component_commands() -> dict[str, Command]:
    """The command of every running component, read from /proc; taken before a fault so a
    component that dies of it (a controller that loses its leader lease while the API server
    is down exits) can be started again."""
    commands = {}
    for component in COMPONENTS:
        pid = component_pid(component)
        if pid is None:
            continue
        proc = Path(f"/proc/{pid}")
        argv = tuple(part.decode() for part in (proc / "cmdline").read_bytes().split(b"\0")
                     if part)
        if str(cluster_dir()) not in " ".join(argv):
            raise ClusterError(f"pid {pid} is not this cluster's {component}")
        env = dict(line.split("=", 1) for line in (proc / "environ").read_text().split("\0")
                   if "=" in line)
        commands[component] = Command(argv, os.readlink(proc / "cwd"), env)
    return commands


def start_component(component: str, command: Command) -> int:
    """Start a component as kwokctl did (same log file; its pid file updated, so `down`
    stops it); return the pid."""
    with (cluster_dir() / "logs" / f"{component}.log").open("ab") as log_file:
        started = subprocess.Popen(command.argv, cwd=command.cwd, env=command.env,
                                   stdin=subprocess.DEVNULL, stdout=log_file,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    _pid_file(component).write_text(str(started.pid))
    return started.pid


def restart_component(component: str, commands: dict[str, Command],
                      down_seconds: float = 0.0) -> int:
    """Kill one control-plane process (`etcd`, `kube-apiserver`, ...) with SIGKILL and start
    it again with the same command line, as a crash and a supervisor's restart would; return
    the new pid. The caller waits for the readiness it needs."""
    pid = component_pid(component)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: component_pid(component) is None, timeout=30, interval=0.1,
                 what=f"{component} (pid {pid}) gone")
    time.sleep(down_seconds)
    new_pid = start_component(component, commands[component])
    log(f"{component} restarted: pid {pid} -> {new_pid}")
    return new_pid


def ensure_components(commands: dict[str, Command]) -> list[str]:
    """Start again every component of `commands` that is not running; return their names."""
    restarted = [c for c in commands if component_pid(c) is None]
    for component in restarted:
        log(f"{component} had exited; starting it again")
        start_component(component, commands[component])
    return restarted


# --- ports ---------------------------------------------------------------------------------


def _port_owner(port: int) -> str:
    """Who listens on `port`, from `ss -ltnp` when it is installed."""
    try:
        out = subprocess.run(
            ["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=False
        ).stdout
    except FileNotFoundError:
        return "another process"
    match = re.search(r'users:\(\("([^"]+)",pid=(\d+)', out)
    return f"{match.group(1)} (pid {match.group(2)})" if match else "another process"


def check_ports_free() -> None:
    taken = []
    for name, port in PORTS.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            # As Go's listeners do: a TIME_WAIT left by a stopped cluster is no obstacle.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                taken.append(f"port {port} (for {name}) is in use by {_port_owner(port)}")
    if taken:
        raise ClusterError(
            "cannot start the local cluster: " + "; ".join(taken)
            + ". Stop what holds it, or `python -m e2e.cluster down` if it is a stale cluster."
        )


# --- kwokctl -------------------------------------------------------------------------------


SERVICE_CIDR = "10.96.0.0/16"

# How often kube-controller-manager's HPA controller reads metrics and resizes (default 15s).
# Shorter here so the autoscaling tests wait less; the figures in docs/performance.md say so.
HPA_SYNC_PERIOD = "5s"
# kwokctl signs every client certificate with one CA and gives the API server the admin
# certificate (CN kwok-admin) as its front-proxy client certificate (--proxy-client-*).
FRONT_PROXY_CLIENT_NAME = "kwok-admin"


def _aggregation_layer_args() -> list[dict[str, Any]]:
    """What the aggregation layer needs beyond kwokctl's defaults, so an extension API server
    (the custom metrics API of e2e/custom_metrics.py) is reached and trusts who is asking:
    the request-header CA and headers the API server publishes in kube-system's
    extension-apiserver-authentication ConfigMap, and routing to the Service's endpoint
    address rather than its ClusterIP (no kube-proxy here)."""
    pki = cluster_dir() / "pki"
    args = {
        "requestheader-client-ca-file": str(pki / "ca.crt"),
        "requestheader-allowed-names": FRONT_PROXY_CLIENT_NAME,
        "requestheader-username-headers": "X-Remote-User",
        "requestheader-group-headers": "X-Remote-Group",
        "requestheader-extra-headers-prefix": "X-Remote-Extra-",
        "enable-aggregator-routing": "true",
    }
    return [{"key": key, "value": value, "override": False} for key, value in args.items()]


def kwokctl_configuration(binaries: Binaries) -> dict[str, Any]:
    """Every binary given by path (kwokctl downloads nothing) and the real control plane on:
    authorization (RBAC) and admission plugins enabled, scheduler and controller-manager run."""
    versions = toolchain.versions()
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "kubeVersion": versions["kubernetes"],
            "etcdVersion": versions["etcd"].removeprefix("v"),
            "kwokVersion": versions["kwok"],
            "kubeApiserverBinary": str(binaries.kube_apiserver),
            "kubeControllerManagerBinary": str(binaries.kube_controller_manager),
            "kubeSchedulerBinary": str(binaries.kube_scheduler),
            "kubectlBinary": str(binaries.kubectl),
            "etcdBinary": str(binaries.etcd),
            "kwokControllerBinary": str(binaries.kwok),
            "cacheDir": str(kwok_workdir() / "cache"),
            "quietPull": True,
            "securePort": True,
            "kubeAuthorization": True,
            "kubeAdmission": True,
            "kubeApiserverPort": PORTS["kube-apiserver"],
            "etcdPort": PORTS["etcd"],
            "etcdPeerPort": PORTS["etcd-peer"],
            "kubeControllerManagerPort": PORTS["kube-controller-manager"],
            "kubeSchedulerPort": PORTS["kube-scheduler"],
            "kwokControllerPort": PORTS["kwok-controller"],
            "components": [
                "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                "kwok-controller",
            ],
        },
        # The API server's default Service range is a /24 (254 Services): too small for the
        # reconcile benchmark's 500 GLMServices. A /16 is what real clusters use.
        "componentsPatches": [
            {"name": "kube-apiserver", "extraArgs": [
                {"key": "service-cluster-ip-range", "value": SERVICE_CIDR, "override": False},
                *_aggregation_layer_args(),
            ]},
            {"name": "kube-controller-manager", "extraArgs": [
                {"key": "horizontal-pod-autoscaler-sync-period",
                 "value": HPA_SYNC_PERIOD, "override": False},
            ]},
        ],
    }


def _kwokctl(
    binaries: Binaries, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["KWOK_WORKDIR"] = str(kwok_workdir())
    # kwokctl reads KUBECONFIG as the default for --kubeconfig; never touch ~/.kube/config.
    env["KUBECONFIG"] = str(kubeconfig_path())
    return subprocess.run(
        [str(binaries.kwokctl), *args], env=env, capture_output=True, text=True, check=False,
        timeout=timeout,
    )


# --- state of the cluster ------------------------------------------------------------------


def api_ready(timeout: str = "5s") -> bool:
    if not kubeconfig_path().exists():
        return False
    try:
        result = Kubectl(Binaries.from_cache().kubectl, kubeconfig_path(), timeout).run(
            "get", "--raw=/readyz", check=False, timeout=15
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and result.stdout.strip() == "ok"


def is_up() -> bool:
    return api_ready() and bool(cluster_processes())


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One `up` or `down` at a time, even from concurrent pytest sessions."""
    state_dir().mkdir(parents=True, exist_ok=True)
    with (state_dir() / "cluster.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- what goes into the cluster ------------------------------------------------------------


def load_nodes_file(path: Path = NODES_FILE) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


# The second octet of the loopback pod networks: one per port offset, so two local clusters
# on this machine never hand out the same pod address (each binds <podIP>:8080 for real).
LOOPBACK_POD_NET_BASE = 77


def loopback_pod_cidr(index: int) -> str:
    """The pod network of the `index`th node of a `loopbackPodIPs` pool (nodes.yaml).

    kwok (v0.8.0, pkg/kwok/controllers/pod_controller.go funcPodIPsWith) takes a pod's IP from
    its node's spec.podCIDRs (else spec.podCIDR, else its own --cidr, 10.0.0.0/24 by default,
    which every other node uses); kube-controller-manager allocates none (kwokctl does not
    pass --allocate-node-cidrs), so the CIDR written here is the one used."""
    second = LOOPBACK_POD_NET_BASE + (_PORT_OFFSET // 100) % 100
    return f"127.{second}.{index}.0/24"


def node_manifests(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Node objects for every pool in nodes.yaml, capacity copied into allocatable."""
    nodes = []
    for pool in spec["pools"]:
        for index in range(1, int(pool["count"]) + 1):
            name = f"{pool['name']}-{index}"
            labels = {**spec.get("defaultLabels", {}), **pool.get("labels", {})}
            labels["kubernetes.io/hostname"] = name
            capacity = {key: str(value) for key, value in pool["capacity"].items()}
            node_spec: dict[str, Any] = {"taints": [dict(t) for t in pool.get("taints", [])]}
            if pool.get("loopbackPodIPs"):
                cidr = loopback_pod_cidr(index)
                node_spec.update(podCIDR=cidr, podCIDRs=[cidr])
            nodes.append({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {key: str(value) for key, value in labels.items()},
                    "annotations": {
                        FAKE_NODE_ANNOTATION: "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                },
                "spec": node_spec,
                "status": {"capacity": capacity, "allocatable": dict(capacity)},
            })
    return nodes


def storage_manifests(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A default StorageClass without a provisioner and the PersistentVolumes to bind to.

    hostPath volumes with every access mode, so a claim of any mode (a model cache shared
    read-many across replicas included) finds one; Retain, and recycle_released_volumes()
    makes them Available again after a test deletes its claim.
    """
    storage = spec["storage"]
    class_name = storage["storageClass"]
    objects: list[dict[str, Any]] = [{
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": class_name,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": "kubernetes.io/no-provisioner",
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
    }]
    for group in storage["volumes"]:
        size = str(group["size"])
        for index in range(1, int(group["count"]) + 1):
            name = f"pv-{size.lower()}-{index:02d}"
            objects.append({
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name, "labels": {VOLUME_LABEL: "true"}},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": class_name,
                    "hostPath": {"path": f"/var/lib/glm-e2e/{name}", "type": "DirectoryOrCreate"},
                },
            })
    return objects


def crd_files() -> list[Path]:
    return [toolchain.bin_dir(component) / name for component, name in THIRD_PARTY_CRDS]


def install_crds(client: Kubectl) -> list[str]:
    """Server-side apply (the Istio and Argo CD CRDs are too big for client-side apply's
    last-applied annotation) and wait until the API server serves each one."""
    output = client.apply_files(crd_files(), field_manager=FIELD_MANAGER)
    names = [
        line.split()[0].split("/", 1)[1]
        for line in output.splitlines()
        if line.startswith("customresourcedefinition")
    ]
    client.run(
        "wait", "--for=condition=Established", "--timeout=120s",
        *[f"crd/{name}" for name in names], timeout=150,
    )
    return names


def recycle_released_volumes(client: Kubectl | None = None) -> list[str]:
    """Released PVs of this cluster lose their claimRef, so the PV controller offers them again.

    This is what a static local-volume provisioner does after a claim is deleted; without it
    a cluster reused across test sessions would run out of volumes.
    """
    client = client or kubectl()
    recycled = []
    for pv in client.items("pv", "-l", f"{VOLUME_LABEL}=true"):
        if pv.get("status", {}).get("phase") in ("Released", "Failed"):
            name = pv["metadata"]["name"]
            client.run(
                "patch", "pv", name, "--type=json",
                "-p", '[{"op": "remove", "path": "/spec/claimRef"}]', check=False,
            )
            recycled.append(name)
    return recycled


def _node_is_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _nodes_missing(client: Kubectl) -> bool:
    wanted = {node["metadata"]["name"] for node in node_manifests(load_nodes_file())}
    return not wanted <= {node["metadata"]["name"] for node in client.items("nodes")}


def populate(client: Kubectl) -> None:
    spec = load_nodes_file()
    nodes = node_manifests(spec)
    started = time.monotonic()
    client.apply(nodes, field_manager=FIELD_MANAGER)
    for node in nodes:
        # The Node was created with its status; set it again in case kwok initialised it first.
        status = {"status": node["status"]}
        client.run("patch", "node", node["metadata"]["name"], "--subresource=status",
                   "--type=merge", "-p", json.dumps(status))
    names = {node["metadata"]["name"] for node in nodes}
    wait_for(
        lambda: names <= {n["metadata"]["name"] for n in client.items("nodes")
                          if _node_is_ready(n)},
        timeout=60, what=f"{len(names)} fake nodes to be Ready (kwok)",
    )
    log(f"{len(nodes)} fake nodes Ready ({time.monotonic() - started:.1f}s)")
    storage = storage_manifests(spec)
    client.apply(storage, field_manager=FIELD_MANAGER)
    log(f"default StorageClass {spec['storage']['storageClass']!r} and {len(storage) - 1} "
        "PersistentVolumes created")
    started = time.monotonic()
    names_installed = install_crds(client)
    log(f"{len(names_installed)} third-party CRDs Established ({time.monotonic() - started:.1f}s)")


def _wait_for_controllers(client: Kubectl) -> None:
    """kube-controller-manager and kube-scheduler hold their leader leases once they work."""
    for component in ("kube-controller-manager", "kube-scheduler"):

        def holds_lease(name: str = component) -> bool:
            return client.exists("lease", name, "-n", "kube-system")

        wait_for(holds_lease, timeout=90, what=f"{component} to take its leader lease")
    wait_for(
        lambda: client.exists("serviceaccount", "default", "-n", "default"),
        timeout=60, what="the service-account controller to create default/default",
    )


# --- the commands --------------------------------------------------------------------------


def up(build: bool = False) -> Kubectl:
    """Start the cluster unless it is up; return a kubectl for it."""
    with _locked():
        return _up_locked(build)


def _up_locked(build: bool) -> Kubectl:
    if build:
        build_missing()
    binaries = Binaries.from_cache()
    missing = binaries.missing()
    missing_crds = [path for path in crd_files() if not path.is_file()]
    if missing or missing_crds:
        raise ClusterError(
            "cannot start the local cluster, missing: "
            + ", ".join(str(path) for path in [*missing, *missing_crds])
            + ". Build them with `python -m e2e.toolchain build` (or `make toolchain`)."
        )
    client = Kubectl(binaries.kubectl, kubeconfig_path())
    if is_up():
        if ready_marker().exists():
            if _crds_missing_from_marker():
                # A cluster started before a third-party CRD was added to THIRD_PARTY_CRDS.
                log("up, but without some third-party CRDs added since; installing them")
                install_crds(client)
                _write_ready_marker()
            elif _nodes_missing(client):
                # A cluster started before a pool was added to nodes.yaml.
                log("up, but without some fake nodes added to nodes.yaml since; creating them")
                populate(client)
            else:
                log(f"already up; nothing to do. KUBECONFIG={kubeconfig_path()}")
            return client
        log("up, but its nodes, volumes or CRDs were not all created; creating them")
        populate(client)
        _write_ready_marker()
        return client
    if cluster_dir().exists() or cluster_processes():
        log("found a stopped or half-started cluster; removing it first")
        _down_locked(binaries)
    check_ports_free()

    started = time.monotonic()
    state_dir().mkdir(parents=True, exist_ok=True)
    config = kwokctl_config_path()
    config.write_text(yaml.safe_dump(kwokctl_configuration(binaries), sort_keys=False))
    versions = toolchain.versions()
    log(f"starting etcd {versions['etcd']}, kube-apiserver, kube-controller-manager, "
        f"kube-scheduler {versions['kubernetes']} and kwok {versions['kwok']} "
        f"(kwokctl --runtime binary, cluster {CLUSTER_NAME!r})")
    result = _kwokctl(
        binaries, "create", "cluster", "--name", CLUSTER_NAME, "--config", str(config),
        "--kubeconfig", str(kubeconfig_path()), "--wait", "120s",
    )
    if result.returncode != 0:
        logs = cluster_dir() / "logs"
        raise ClusterError(
            f"kwokctl create cluster failed (exit {result.returncode}):\n"
            f"{(result.stderr or result.stdout)[-3000:]}\ncomponent logs: {logs}"
        )
    if "Download" in result.stderr:
        raise ClusterError(f"kwokctl tried to download something:\n{result.stderr[-3000:]}")
    client.run("config", "use-context", CONTEXT_NAME)
    wait_for(api_ready, timeout=60, what="kube-apiserver /readyz")
    log(f"API server ready at https://127.0.0.1:{PORTS['kube-apiserver']} "
        f"({time.monotonic() - started:.1f}s)")
    _wait_for_controllers(client)
    log(f"controller-manager and scheduler running ({time.monotonic() - started:.1f}s)")
    populate(client)
    _write_ready_marker()
    log(f"cluster {CLUSTER_NAME!r} up in {time.monotonic() - started:.1f}s")
    log(f"KUBECONFIG={kubeconfig_path()}")
    return client


def down() -> list[Process]:
    """Stop every process of the cluster and remove its state; return what had to be killed."""
    with _locked():
        return _down_locked(Binaries.from_cache())


def _down_locked(binaries: Binaries) -> list[Process]:
    if binaries.kwokctl.exists() and cluster_dir().exists():
        log(f"stopping cluster {CLUSTER_NAME!r} (kwokctl delete cluster)")
        result = _kwokctl(binaries, "delete", "cluster", "--name", CLUSTER_NAME,
                          "--kubeconfig", str(kubeconfig_path()), timeout=120)
        if result.returncode != 0:
            log(f"kwokctl delete cluster failed, stopping the processes directly: "
                f"{result.stderr.strip()[-500:]}")
    leftovers = cluster_processes()
    if leftovers:
        log("stopping leftover processes: "
            + ", ".join(f"{p.pid} ({_process_name(p.command)})" for p in leftovers))
        _stop_processes(leftovers)
    remaining = cluster_processes()
    if remaining:
        raise ClusterError(
            "could not stop: " + ", ".join(f"{p.pid} {p.command}" for p in remaining)
        )
    for path in (cluster_dir(), kwok_workdir() / "cache"):
        if path.exists():
            subprocess.run(["rm", "-rf", str(path)], check=True)
    for path in (kubeconfig_path(), kwokctl_config_path()):
        path.unlink(missing_ok=True)
    log("down: no cluster process left, state removed")
    return leftovers


def status() -> int:
    processes = cluster_processes()
    if not processes and not cluster_dir().exists():
        print(f"cluster {CLUSTER_NAME!r}: down")
        return 1
    ready = api_ready()
    print(f"cluster {CLUSTER_NAME!r}: {'up' if ready else 'NOT READY'}")
    print(f"  kubeconfig: {kubeconfig_path()}")
    print(f"  api server: https://127.0.0.1:{PORTS['kube-apiserver']}")
    print(f"  state:      {cluster_dir()}")
    for process in processes:
        print(f"  pid {process.pid:>7}  {_process_name(process.command)}")
    if ready:
        client = kubectl()
        nodes = client.items("nodes")
        ready_nodes = sum(1 for node in nodes if _node_is_ready(node))
        print(f"  nodes:      {ready_nodes}/{len(nodes)} Ready")
    return 0 if ready else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.cluster", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up_parser = sub.add_parser("up", help="start the local cluster (no-op when up)")
    up_parser.add_argument("--build", action="store_true",
                           help="build missing binaries first (minutes, once)")
    sub.add_parser("down", help="stop the local cluster and remove its state")
    sub.add_parser("status", help="say whether the local cluster is up")
    sub.add_parser("recycle-volumes", help="make Released PersistentVolumes Available again")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            up(build=args.build)
            print(kubeconfig_path())
            return 0
        if args.command == "down":
            down()
            return 0
        if args.command == "recycle-volumes":
            print("\n".join(recycle_released_volumes()) or "nothing to recycle")
            return 0
        return status()
    except (ClusterError, toolchain.BuildError, KubectlError, AssertionError) as exc:
        log(f"ERROR: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
