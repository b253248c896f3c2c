"""The Gateway API Inference Extension's endpoint picker (EPP) of one GLMService (pure).

    <svc>-epp     Deployment (1 replica), Service, ConfigMap (its EndpointPickerConfig),
                  ServiceAccount, Role, RoleBinding: the EPP in standalone mode, selecting
                  the main pool's engine pods by label and scraping their gateways' /metrics.

The router (render/routing.py) asks it which pod serves each request over ext-proc (gRPC),
as an inference gateway would. Apart from the router's objects because the picker is the
ecosystem's, not ours: its flags and config follow the Inference Extension's release.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import yaml

from glm_operator.config import ContainerResources, OperatorConfig
from glm_operator.gateway.metrics import KV_CACHE_USAGE_RATIO, REQUESTS_QUEUED
from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.render.names import (
    COMPONENT_LABEL,
    POOL_LABEL,
    SERVICE_LABEL,
    common_labels,
    dns_name,
    label_value,
)
from glm_operator.render.node_architecture import component_affinity
from glm_operator.render.pod import (
    container_security_context,
    pod_security_context,
    pull_secrets,
)
from glm_operator.render.rbac import build_role, build_role_binding, build_service_account
from glm_operator.wellknown import CONFIG_HASH_ANNOTATION, MAIN_POOL

EPP_COMPONENT = "endpoint-picker"
EPP_CONTAINER = "epp"
# The EPP's ports, as its chart names them.
EPP_GRPC_PORT = 9002  # ext-proc: the router asks it for a pod here
EPP_HEALTH_PORT = 9003  # gRPC health
EPP_METRICS_PORT = 9090
EPP_CONFIG_DIR = "/etc/epp"
EPP_CONFIG_KEY = "config.yaml"
# The EPP with one replica answers its gRPC health under this service name (its chart's
# probes; with leader election there are `liveness` and `readiness` instead).
EPP_HEALTH_SERVICE = "inference-extension"
# A picker pod that stops ends its in-flight picks at once: a router retries elsewhere.
EPP_GRACE_SECONDS = 30


def epp_name(service: str) -> str:
    return dns_name(service, "epp")


def epp_selector(service: str) -> dict[str, str]:
    return {SERVICE_LABEL: label_value(service), COMPONENT_LABEL: EPP_COMPONENT}


def engine_pods_selector(service: str) -> str:
    """The main pool's engine pods, every version (the EPP's --endpoint-selector; the router
    watches the same pods and reads each one's version label)."""
    return f"{SERVICE_LABEL}={label_value(service)},{POOL_LABEL}={MAIN_POOL}"


# The engine type under which the picker reads our gateway's series (the core metrics
# extractor's engineConfigs). Every engine pod is scraped at its gateway sidecar's port (the
# pool's target port), whose /metrics carries the gateway's own names for every engine and
# accelerator, never the engine's (llama-server has no KV-usage gauge at all): so it is the
# default engine, for pods without the Inference Extension's engine-type label, which ours
# never carry. The extractor keeps its built-in vLLM, SGLang and TensorRT-LLM mappings beside
# it, but no pod of ours is read by them.
GATEWAY_ENGINE = "glm-gateway"
# The prefix index's block: 16 tokens of about 4 characters (the picker's own estimate, fixed
# in v1.5.0), 64 characters of the prompt, the block of the router's own index
# (router/prefix.py BLOCK_CHARS), whose predicted hits are read beside the engines' cache hits.
PREFIX_BLOCK_TOKENS = 16


def endpoint_picker_config() -> dict[str, Any]:
    """The EPP's EndpointPickerConfig (v1.5.0's schema: apix/config/v1alpha1 and each
    plugin's parameters; tests/render/test_epp_contract.py checks every key against the
    module's source), in one place to change.

    What it reads: each pod's /metrics (metrics-data-source, at the pool's target port: the
    gateway sidecar's), turned into a queue length and a KV-cache share by the
    core-metrics-extractor through `engineConfigs` (GATEWAY_ENGINE above). The running
    requests, LoRA and cache-info specs are left empty: no gateway exports them, and an empty
    spec is not scraped.

    How it scores: every pod gets a score per scorer, weighted; the picker takes the best.
    Prefix affinity weighs most (3): a pod holding a request's prompt prefix in its KV cache
    skips that prefill, the largest saving a pick can make for chats and agents that resend
    their history. Queue (2) and KV-cache use (2) keep a hot pod from being chosen for its
    prefix alone: a pod with waiting requests or a full cache would make the request wait or
    evict what it holds. These are the weights of the EPP's own default profile: a full prefix
    match outweighs either load signal alone, not both (every scorer gives 0..1).

    The prefix scorer reads what the approx-prefix-cache-producer matched (v1.5.0 split the
    two): its autoTune is off, since it would read the block size and GPU blocks from the
    cache-info metric, which our gateways do not export; blockSizeTokens 16 (64 characters),
    lruCapacityPerServer in blocks. The picker returns one pod: the router sends the request
    there. Flow control (queueing, priority bands, shedding) stays off: docs/routing.md says
    why.
    """
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "metrics-data-source",
             "parameters": {"scheme": "http", "path": "/metrics"}},
            {"type": "core-metrics-extractor",
             "parameters": {"defaultEngine": GATEWAY_ENGINE,
                            "engineConfigs": [{"name": GATEWAY_ENGINE,
                                               "queuedRequestsSpec": REQUESTS_QUEUED,
                                               "kvUsageSpec": KV_CACHE_USAGE_RATIO}]}},
            {"type": "approx-prefix-cache-producer",
             "parameters": {"autoTune": False, "blockSizeTokens": PREFIX_BLOCK_TOKENS,
                            "maxPrefixBlocksToMatch": 256, "lruCapacityPerServer": 31250}},
            {"type": "prefix-cache-scorer"},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": 1}},
            {"type": "single-profile-handler"},
        ],
        "schedulingProfiles": [{
            "name": "default",
            "plugins": [
                {"pluginRef": "prefix-cache-scorer", "weight": 3},
                {"pluginRef": "queue-scorer", "weight": 2},
                {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
                {"pluginRef": "max-score-picker"},
            ],
        }],
        "dataLayer": {"sources": [{"pluginRef": "metrics-data-source",
                                   "extractors": [{"pluginRef": "core-metrics-extractor"}]}]},
    }


def epp_args(service: str, namespace: str, config: OperatorConfig) -> list[str]:
    """The EPP's flags: standalone (no InferencePool: pods found by label, in
    --pool-namespace), plain gRPC inside the cluster; what it scrapes and scores on is in its
    config (endpoint_picker_config). No --pool-name: v1.5.0 refuses it beside
    --endpoint-selector (e2e/epp.py runs this release with these flags)."""
    return [
        "--pool-namespace", namespace,
        "--endpoint-selector", engine_pods_selector(service),
        "--endpoint-target-ports", str(config.gateway_port),
        *_serving_args(),
        # The router talks to it inside the cluster, over the pod network.
        "--secure-serving=false",
        *_scoring_args(),
    ]


def pool_epp_args(pool: str, namespace: str) -> list[str]:
    """The flags of a picker that serves one InferencePool (spec.routing.mode
    InferenceGateway): the pool names its pods and their port (--pool-name; v1.5.0 binds
    one picker to one pool and refuses --endpoint-selector beside it). It serves TLS with
    its own self-signed certificate (v1.5.0's default, --secure-serving): the gateways that
    implement the Inference Extension connect to it so, as to the picker of its chart."""
    return ["--pool-name", pool, "--pool-namespace", namespace, *_serving_args(),
            *_scoring_args()]


def _serving_args() -> list[str]:
    return ["--grpc-port", str(EPP_GRPC_PORT), "--grpc-health-port", str(EPP_HEALTH_PORT),
            "--metrics-port", str(EPP_METRICS_PORT)]


def _scoring_args() -> list[str]:
    """v1.5.0 takes the metric names and where to scrape them from its config only (the
    metric flags are refused, the scrape port and path flags deprecated): each pod is scraped
    at the pool's target port, the gateway's, as the router reaches it."""
    return [
        # Scraped inside the cluster without a token (the EPP would check one with a
        # TokenReview, which needs a ClusterRole).
        "--metrics-endpoint-auth=false",
        "--tracing=false",  # no OpenTelemetry collector to export to
        "--enable-pprof=false",
        "--config-file", f"{EPP_CONFIG_DIR}/{EPP_CONFIG_KEY}",
    ]


def _grpc_probe(period: int, failures: int, delay: int = 0) -> dict[str, Any]:
    probe: dict[str, Any] = {"grpc": {"port": EPP_HEALTH_PORT, "service": EPP_HEALTH_SERVICE},
                             "periodSeconds": period, "timeoutSeconds": 5,
                             "failureThreshold": failures}
    if delay:
        probe["initialDelaySeconds"] = delay
    return probe


def container_resources(r: ContainerResources) -> dict[str, dict[str, str]]:
    return {"requests": {"cpu": r.cpu_request, "memory": r.memory_request},
            "limits": {"cpu": r.cpu_limit, "memory": r.memory_limit}}


def _config_hash(text: str) -> str:
    """The EPP reads its config file once: a changed config rolls its pod."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Picker:
    """One picker Deployment and what sets it apart: its name, labels and selector, flags,
    Role and how its gRPC port is named on its Service."""

    name: str
    labels: dict[str, str]
    selector: dict[str, str]
    args: list[str]
    rules: list[dict[str, Any]]
    grpc_port: dict[str, Any]  # the Service's port entry for ext-proc


def epp_objects(service: str, namespace: str, config: OperatorConfig,
                owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The router's picker: every main-pool pod of the service, by label."""
    return picker_objects(Picker(
        name=epp_name(service), labels=common_labels(service, EPP_COMPONENT),
        selector=epp_selector(service), args=epp_args(service, namespace, config),
        rules=epp_rules(),
        grpc_port={"name": "grpc", "port": EPP_GRPC_PORT, "targetPort": "grpc",
                   "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"}),
        namespace, config, owner)


def picker_objects(picker: Picker, namespace: str, config: OperatorConfig,
                   owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    name, labels = picker.name, picker.labels
    config_text = yaml.safe_dump(endpoint_picker_config(), sort_keys=False)
    container = {
        "name": EPP_CONTAINER,
        "image": config.epp_image,
        "args": picker.args,
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"}],
        "resources": container_resources(config.epp_resources),
        "volumeMounts": [{"name": "config", "mountPath": EPP_CONFIG_DIR, "readOnly": True}],
        "startupProbe": _grpc_probe(2, 30),
        "readinessProbe": _grpc_probe(2, 3),
        "livenessProbe": _grpc_probe(10, 3, delay=5),
        "securityContext": container_security_context(config),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec = {
        "serviceAccountName": name,
        "automountServiceAccountToken": True,  # it watches the engine pods
        "enableServiceLinks": False,
        "securityContext": pod_security_context(config),
        **pull_secrets(config),
        "affinity": component_affinity(config.epp_image, config),
        "terminationGracePeriodSeconds": EPP_GRACE_SECONDS,
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": name}}],
    }
    # Its account, Role and config before the Deployment: a pod created before its
    # ServiceAccount is refused (FailedCreate) until the ReplicaSet retries.
    return [
        build_service_account(name, namespace, labels, owner),
        build_role(name, namespace, labels, owner, picker.rules),
        build_role_binding(name, namespace, labels, owner, name, name),
        render_object("configmap.yaml.j2", metadata=object_meta(name, namespace, labels, owner),
                      data={EPP_CONFIG_KEY: config_text}),
        render_object(
            "component-deployment.yaml.j2",
            metadata=object_meta(name, namespace, labels, owner),
            replicas=1,
            selector=picker.selector,
            # One picker at a time: its prefix index is its own, two would halve each one's
            # view (the EPP's chart does the same).
            strategy={"type": "Recreate"},
            pod_labels=dict(labels),
            pod_annotations={CONFIG_HASH_ANNOTATION: _config_hash(config_text)},
            pod_spec=pod_spec,
        ),
        render_object(
            "service.yaml.j2",
            metadata=object_meta(name, namespace, labels, owner),
            selector=picker.selector,
            ports=[picker.grpc_port,
                   {"name": "metrics", "port": EPP_METRICS_PORT, "targetPort": "metrics",
                    "protocol": "TCP"}],
        ),
    ]


def epp_rules() -> list[dict[str, Any]]:
    """The EPP watches the pods its selector names; label selectors cannot narrow RBAC."""
    return [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def pool_epp_rules(pool: str) -> list[dict[str, Any]]:
    """A pool's picker also watches its InferencePool (listed by name: RBAC matches the
    field selector against resourceNames) and, where their CRDs are served, the
    InferenceObjectives and InferenceModelRewrites of its namespace (v1.5.0 looks both up
    through discovery when it serves a pool, and watches each one it finds)."""
    return [*epp_rules(),
            {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
             "resourceNames": [pool], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["inference.networking.x-k8s.io"],
             "resources": ["inferenceobjectives", "inferencemodelrewrites"],
             "verbs": ["get", "list", "watch"]}]
