"""Operator configuration: images, ports, probe tuning, storage defaults, extra accelerators.

One pydantic model with sensible defaults, read from a YAML file (the Helm chart mounts it)
and a few environment overrides. A leaf module: it imports only planning's catalog loader,
so the renderers and the CLI can take an OperatorConfig without pulling in the controllers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from glm_operator import __version__
from glm_operator.api.rate_limit_store import RateLimitStore
from glm_operator.planning.accelerators import (
    DEFAULT_IMAGE_REGISTRY,
    AcceleratorProfile,
    check_pinned_image,
)
from glm_operator.planning.architectures import (
    Architecture,
    builtin_image_architectures,
    check_architectures,
    image_repository,
)
from glm_operator.planning.profile_config import load_profiles

CONFIG_FILE_ENV = "GLM_OPERATOR_CONFIG"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Environment overrides applied over the file (the Helm chart sets the image ones).
ENV_OVERRIDES: dict[str, str] = {
    "GLM_OPERATOR_IMAGE_REGISTRY": "image_registry",
    "GLM_OPERATOR_IMAGE_TAG": "image_tag",
    "GLM_OPERATOR_DEFAULT_STORAGE_CLASS": "default_storage_class",
    "GLM_OPERATOR_EPP_IMAGE": "epp_image",
}
# Nested overrides: environment variable -> (section, field).
NESTED_ENV_OVERRIDES: dict[str, tuple[str, str]] = {
    "GLM_OPERATOR_PROMETHEUS_URL": ("prometheus", "url"),
}

_MODEL = ConfigDict(
    alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
    protected_namespaces=(),
)


class ProbeTuning(BaseModel):
    """How long a model may take to load before its pod is restarted.

    The engine's startup probe allows size / loadThroughput + margin seconds: a 20 GB GGUF on
    a network volume read at 100 MiB/s needs ~200 s, far beyond the 30 s that killed pods
    in the field reports.
    """

    model_config = _MODEL

    load_throughput_mib_per_second: int = Field(default=100, ge=1)
    startup_margin_seconds: int = Field(default=120, ge=0)
    # vLLM also profiles memory, captures CUDA graphs and may compile: extra time on top.
    vllm_startup_extra_seconds: int = Field(default=300, ge=0)
    startup_period_seconds: int = Field(default=10, ge=1)
    min_startup_seconds: int = Field(default=300, ge=10)
    liveness_period_seconds: int = Field(default=30, ge=1)
    liveness_failure_threshold: int = Field(default=5, ge=1)
    readiness_period_seconds: int = Field(default=5, ge=1)
    timeout_seconds: int = Field(default=10, ge=1)


class TerminationTuning(BaseModel):
    """How a model pod stops without cutting the generations it is running.

    The kubelet runs each container's preStop hook, then sends it SIGTERM. The gateway's hook
    waits `endpointRemovalSeconds` while the pod, already marked not ready by the endpoints
    controller, leaves the Service's endpoints (kube-proxy, a mesh, a cloud load balancer
    follow within seconds) and keeps serving what still arrives; after SIGTERM it accepts
    nothing new and lets running requests finish for the drain: min(spec.gateway.
    maxDrainSeconds, context per request / the decode floor), the longest generation the
    pool allows. The engine (and a group's workers) wait out both, so they never stop under
    a generation. terminationGracePeriodSeconds adds `exitMarginSeconds` for the exits.
    """

    model_config = _MODEL

    endpoint_removal_seconds: int = Field(default=10, ge=1, le=300)
    # The slowest decode a request is assumed to get with every slot busy: tokens per
    # second per request. Prefill runs many times faster per token, so counting the whole
    # context at this rate bounds prompt and completion together.
    decode_tokens_per_second: float = Field(default=20.0, gt=0, le=10000)
    cpu_decode_tokens_per_second: float = Field(default=2.0, gt=0, le=10000)
    exit_margin_seconds: int = Field(default=5, ge=1, le=300)


class ContainerResources(BaseModel):
    """Fixed requests/limits for our own small containers (gateway, fetcher)."""

    model_config = _MODEL

    cpu_request: str = "100m"
    memory_request: str = "128Mi"
    cpu_limit: str = "1"
    memory_limit: str = "512Mi"


# The Gateway API Inference Extension's endpoint picker (spec.routing.mode EndpointPicker),
# built by runtime-images/epp from the release whose flags and EndpointPickerConfig
# render/routing.py writes, and published beside our other images: `<imageRegistry>/
# endpoint-picker:<imageTag>`, so one registry override (or mirror) covers every image.
EPP_IMAGE_NAME = "endpoint-picker"
# Upstream's build of the same release, for eppImage where our registry is not reachable: it
# serves the pickers of spec.routing.mode InferenceGateway (a pool each), not the router's,
# since v1.5.0 does not start on an endpoint selector without the patch our build carries
# (runtime-images/epp/patches).
UPSTREAM_EPP_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"


def _router_resources() -> ContainerResources:
    """The router: a proxy that holds no request body beyond --max-body-bytes per request."""
    return ContainerResources(cpu_request="100m", memory_request="128Mi", cpu_limit="1",
                              memory_limit="512Mi")


def _epp_resources() -> ContainerResources:
    """The endpoint picker: its prefix-cache index and the pods' scraped metrics are in
    memory, so it gets more than the router."""
    return ContainerResources(cpu_request="200m", memory_request="256Mi", cpu_limit="2",
                              memory_limit="1Gi")


class FetchSettings(BaseModel):
    """The ModelVersion fetch Job."""

    model_config = _MODEL

    backoff_limit: int = Field(default=3, ge=0, le=20)
    # Slowest download rate we still wait for; sizes activeDeadlineSeconds from the size.
    min_throughput_mib_per_second: int = Field(default=10, ge=1)
    min_deadline_seconds: int = Field(default=1800, ge=60)
    unknown_size_deadline_seconds: int = Field(default=6 * 3600, ge=60)
    default_cache_size: str = Field(default="100Gi", description="PVC size when nothing says.")
    resources: ContainerResources = Field(
        default_factory=lambda: ContainerResources(
            cpu_request="250m", memory_request="256Mi", cpu_limit="2", memory_limit="1Gi"
        )
    )


class PrometheusSettings(BaseModel):
    """Where canary analysis reads the gateways' metrics."""

    model_config = _MODEL

    url: str | None = Field(
        default=None, description="e.g. http://prometheus-operated.monitoring:9090; without "
        "it a canary holds at its first step (reason AnalysisUnavailable)."
    )
    timeout_seconds: float = Field(default=5.0, gt=0, le=60)


class RolloutSettings(BaseModel):
    """Timing of version rollouts that the GLMService does not choose."""

    model_config = _MODEL

    # After all traffic moved to the new version, the old pods stay this long so requests in
    # flight (and mesh proxies still on the old route) finish before they go.
    drain_seconds: float = Field(default=10.0, ge=0, le=3600)
    min_progress_deadline_seconds: int = Field(default=900, ge=10)
    progress_deadline_margin_seconds: int = Field(default=300, ge=0)


class AscendSettings(BaseModel):
    """How engine pods on Ascend NPUs reach the node's driver (render/ascend.py)."""

    model_config = _MODEL

    driver_mounts: Literal["HostPath", "Runtime"] = Field(
        default="HostPath", description="HostPath: the pod mounts the driver's libraries and "
        "tools from the node; Runtime: Ascend Docker Runtime mounts them (nothing rendered).")
    device_group: int = Field(
        default=1000, ge=0, description="gid of the driver's HwHiAiUser group, which owns the "
        "NPU device nodes (mode 0660): engine pods join it to open their devices as non-root.")


class OperatorConfig(BaseModel):
    """Everything the renderers need beyond the GLMService and ModelVersion themselves."""

    model_config = _MODEL

    image_registry: str = Field(default=DEFAULT_IMAGE_REGISTRY, min_length=1)
    image_tag: str = Field(default=__version__, min_length=1)
    gateway_port: int = Field(default=8080, ge=1, le=65535)
    engine_port: int = Field(default=8081, ge=1, le=65535)
    # Numeric, so `runAsNonRoot` can be checked by the kubelet without reading /etc/passwd.
    run_as_user: int = Field(default=65532, ge=1)
    run_as_group: int = Field(default=65532, ge=1)
    default_storage_class: str | None = None
    accelerator_profiles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    probes: ProbeTuning = Field(default_factory=ProbeTuning)
    termination: TerminationTuning = Field(default_factory=TerminationTuning)
    gateway_resources: ContainerResources = Field(default_factory=ContainerResources)
    # spec.routing.mode EndpointPicker: the router runs the operator's own image
    # (`glm-operator router`), the endpoint picker this one.
    # Empty: `<imageRegistry>/endpoint-picker:<imageTag>` (_derived_images).
    epp_image: str = Field(default="", min_length=1)
    router_resources: ContainerResources = Field(default_factory=_router_resources)
    epp_resources: ContainerResources = Field(default_factory=_epp_resources)
    # A private registry or mirror: Secrets (names; each must exist in the namespace of the
    # workload) that every pod the operator renders pulls its images with.
    image_pull_secrets: tuple[str, ...] = Field(default=(), max_length=16)
    # Image repository (no tag) -> the architectures it has builds for, merged over the
    # built-in tables (planning/architectures.py): a mirrored or rebuilt image adds its
    # builds, or narrows them (a mirror that copied one platform).
    image_architectures: dict[str, tuple[Architecture, ...]] = Field(
        default_factory=dict, max_length=256)
    fetch: FetchSettings = Field(default_factory=FetchSettings)
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    ascend: AscendSettings = Field(default_factory=AscendSettings)
    # The Redis every rate-limited service's gateways share their buckets in (Helm value
    # config.rateLimitStore); none: each gateway pod counts on its own.
    rate_limit_store: RateLimitStore | None = None
    cluster_domain: str = "cluster.local"
    # How often optional CRDs (Istio, ServiceMonitor) are looked up again, so ones installed
    # after the operator started are used without a restart.
    capability_recheck_seconds: float = Field(default=60.0, gt=0, le=3600)

    _profiles: Mapping[str, AcceleratorProfile] | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _derived_images(cls, data: Any) -> Any:
        """eppImage follows imageRegistry and imageTag unless it is set (field names or
        aliases: populate_by_name). Values of the wrong type are left to the fields'
        own errors."""
        if not isinstance(data, Mapping) or data.get("eppImage") or data.get("epp_image"):
            return data
        registry = data.get("imageRegistry", data.get("image_registry", DEFAULT_IMAGE_REGISTRY))
        tag = data.get("imageTag", data.get("image_tag", __version__))
        if not (isinstance(registry, str) and isinstance(tag, str)):
            return data
        rest = {k: v for k, v in data.items() if k not in ("eppImage", "epp_image")}
        return {**rest, "eppImage": f"{registry.rstrip('/')}/{EPP_IMAGE_NAME}:{tag}"}

    @field_validator("image_pull_secrets")
    @classmethod
    def _secret_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
                raise ValueError(f"imagePullSecrets: {name!r} is not a Secret name (lower-case "
                                 "letters, digits, '-' and '.', at most 253 characters)")
        if len(set(names)) != len(names):
            raise ValueError("imagePullSecrets: a Secret is named twice")
        return names

    @field_validator("image_architectures", mode="before")
    @classmethod
    def _architectures(cls, table: Any) -> Any:
        if not isinstance(table, Mapping):
            raise ValueError("imageArchitectures must map an image repository (e.g. "
                             "registry.example.com/team/llama-server-cann) to a list of "
                             f"architectures, not {table!r}")
        out: dict[str, tuple[Architecture, ...]] = {}
        for repository, architectures in table.items():
            if not isinstance(repository, str) or not repository:
                raise ValueError(f"imageArchitectures: {repository!r} is not an image "
                                 "repository")
            if "@" in repository or ":" in repository.rpartition("/")[2]:
                raise ValueError(f"imageArchitectures: key {repository!r} must be the image "
                                 "repository without its tag or digest ("
                                 f"{image_repository(repository)})")
            out[image_repository(repository)] = check_architectures(
                architectures, where=f"imageArchitectures[{repository}]")
        return out

    @field_validator("image_tag")
    @classmethod
    def _pinned(cls, tag: str) -> str:
        if tag == "latest":
            raise ValueError("imageTag must be a pinned version, never latest")
        return tag

    def model_post_init(self, _context: Any) -> None:
        if self.gateway_port == self.engine_port:
            raise ValueError("gatewayPort and enginePort must differ")
        check_pinned_image(self.operator_image, where="operator config")
        check_pinned_image(self.epp_image, where="operator config eppImage")
        # Validate the profiles now (a bad config fails at start-up, not at first reconcile).
        self._profiles = load_profiles(
            self.accelerator_profiles, registry=self.image_registry, tag=self.image_tag
        )

    @classmethod
    def load(cls, path: Path | str | None = None) -> OperatorConfig:
        """`load_config` as a constructor: the file (or $GLM_OPERATOR_CONFIG) + env."""
        return load_config(Path(path) if path is not None else None)

    @property
    def operator_image(self) -> str:
        """Our own image: `glm-operator gateway` and `glm-operator fetch` run from it."""
        return f"{self.image_registry.rstrip('/')}/glm-operator:{self.image_tag}"

    @property
    def image_architecture_table(self) -> dict[str, tuple[Architecture, ...]]:
        """Image repository -> architectures: our images under imageRegistry, the upstream
        ones, then imageArchitectures over both."""
        return {**builtin_image_architectures(self.image_registry), **self.image_architectures}

    @property
    def profiles(self) -> Mapping[str, AcceleratorProfile]:
        assert self._profiles is not None
        return self._profiles


def load_config(
    path: Path | None = None, environ: Mapping[str, str] | None = None
) -> OperatorConfig:
    """Read the config file (path, else $GLM_OPERATOR_CONFIG, else defaults) + env overrides."""
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    source = path or (Path(env[CONFIG_FILE_ENV]) if env.get(CONFIG_FILE_ENV) else None)
    if source is not None:
        loaded = yaml.safe_load(source.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{source}: operator config must be a mapping")
        data.update(loaded)
    for variable, field in ENV_OVERRIDES.items():
        if env.get(variable):
            data[to_camel(field)] = env[variable]
    for variable, (section, field) in NESTED_ENV_OVERRIDES.items():
        if env.get(variable):
            data.setdefault(section, {})[to_camel(field)] = env[variable]
    return OperatorConfig.model_validate(data)
