"""Children of a ModelVersion: the cache PVC, the fetch Job and the Job's narrow RBAC.

    render_model_version(mv, config) -> [PVC, ServiceAccount, Role, RoleBinding, Job]

The Job runs `glm-operator fetch` (our image) with the fetcher's own flags: download, verify
the sha256 and the GGUF architecture, write into the PVC and report into the
ModelVersion's status (hence the Role on that one ModelVersion's status subresource).
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

from glm_operator.api.base import GROUP
from glm_operator.api.modelversion import ModelVersion
from glm_operator.config import OperatorConfig
from glm_operator.planning import memory as mem
from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta, owner_reference
from glm_operator.render.names import MANAGED_BY, MODEL_VERSION_LABEL, dns_name, label_value
from glm_operator.render.node_architecture import component_affinity
from glm_operator.render.pod import (
    RenderInputError,
    cache_claim_name,
    container_security_context,
    pod_security_context,
    pull_secrets,
)
from glm_operator.render.quantity import memory_quantity
from glm_operator.render.rbac import (
    build_role,
    build_role_binding,
    build_service_account,
    model_version_status_rules,
)

CACHE_MOUNT = "/cache"
PVC_SOURCE_ROOT = "/mnt/pvc"  # the fetcher's default --pvc-root
CACHE_HEADROOM = 1.10  # file size + 10 % (filesystem overhead, partial download)


def fetch_job_name(name: str) -> str:
    return dns_name(name, "fetch")


def labels_for(model_version: ModelVersion, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "glm-operator-model-cache",
        "app.kubernetes.io/instance": label_value(model_version.metadata.name or ""),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        MODEL_VERSION_LABEL: label_value(model_version.metadata.name or ""),
    }


def cache_size(model_version: ModelVersion, config: OperatorConfig) -> str:
    """spec.cache.size, else the declared size + 10 % (rounded up to GiB), else the default.

    Never the measured size: it is known only after the PVC exists, and a PVC's size can
    only grow, so the intent must not depend on it.
    """
    if model_version.spec.cache.size is not None:
        return str(model_version.spec.cache.size)
    facts = model_version.spec.facts
    if facts is not None and facts.size_bytes:
        gib = math.ceil(facts.size_bytes * CACHE_HEADROOM / mem.GiB)
        return memory_quantity(gib * mem.GiB)
    return config.fetch.default_cache_size


def _expected_size(model_version: ModelVersion) -> int | None:
    # Declared only, like the PVC size: the intent must not change once the fetch reports.
    facts = model_version.spec.facts
    return facts.size_bytes if facts is not None and facts.size_bytes else None


def active_deadline_seconds(model_version: ModelVersion, config: OperatorConfig) -> int:
    """Every attempt may download the whole file at the slowest rate we still accept."""
    settings = config.fetch
    size = _expected_size(model_version)
    if size is None:
        return settings.unknown_size_deadline_seconds
    per_attempt = size / (settings.min_throughput_mib_per_second * mem.MiB)
    total = per_attempt * (settings.backoff_limit + 1)
    return max(settings.min_deadline_seconds, math.ceil(total))


def build_cache_pvc(
    model_version: ModelVersion,
    config: OperatorConfig,
    namespace: str,
    owner: dict[str, Any] | None,
) -> dict[str, Any]:
    cache = model_version.spec.cache
    return render_object(
        "persistentvolumeclaim.yaml.j2",
        metadata=object_meta(cache_claim_name(model_version), namespace,
                             labels_for(model_version, "cache"), owner),
        access_modes=[cache.access_mode],
        storage_class=cache.storage_class_name or config.default_storage_class,
        size=cache_size(model_version, config),
    )


def fetch_args(model_version: ModelVersion, namespace: str) -> list[str]:
    spec = model_version.spec
    name = model_version.metadata.name or ""
    args = [
        "fetch",
        "--source", spec.source.uri,
        "--dest", CACHE_MOUNT,
        "--format", str(spec.format),
        "--modelversion", name,
        "--namespace", namespace,
        "--cache-claim", cache_claim_name(model_version),
        # The result (size, sha256, GGUF facts) is also the pod's termination message.
        "--result-json", "/dev/termination-log",
    ]  # fmt: skip
    if spec.sha256:
        args += ["--sha256", spec.sha256]
    if spec.architecture:
        args += ["--architecture", spec.architecture]
    if spec.source.uri.startswith("pvc://"):
        args += ["--pvc-root", PVC_SOURCE_ROOT]
    return args


def _source_claim(model_version: ModelVersion) -> str | None:
    uri = model_version.spec.source.uri
    return urlsplit(uri).netloc if uri.startswith("pvc://") else None


def fetch_pod_spec(
    model_version: ModelVersion, config: OperatorConfig, namespace: str, service_account: str
) -> dict[str, Any]:
    res = config.fetch.resources
    mounts: list[dict[str, Any]] = [
        {"name": "cache", "mountPath": CACHE_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "cache", "persistentVolumeClaim": {"claimName": cache_claim_name(model_version)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
    ]
    source_claim = _source_claim(model_version)
    if source_claim:
        mounts.append({"name": "source", "mountPath": f"{PVC_SOURCE_ROOT}/{source_claim}",
                       "readOnly": True})
        volumes.append({"name": "source", "persistentVolumeClaim": {
            "claimName": source_claim, "readOnly": True}})
    container: dict[str, Any] = {
        "name": "fetch",
        "image": config.operator_image,
        "command": ["glm-operator"],
        "args": fetch_args(model_version, namespace),
        "env": [{"name": "HOME", "value": "/tmp"}],
    }
    secret = model_version.spec.source.credentials_secret
    if secret:
        # HF_TOKEN, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_ENDPOINT_URL, AUTHORIZATION:
        # the fetcher reads them from its environment (fetch/sources.py).
        container["envFrom"] = [{"secretRef": {"name": secret}}]
    container.update({
        "resources": {
            "requests": {"cpu": res.cpu_request, "memory": res.memory_request},
            "limits": {"cpu": res.cpu_limit, "memory": res.memory_limit},
        },
        "volumeMounts": mounts,
        "securityContext": container_security_context(config),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    })
    return {
        "serviceAccountName": service_account,
        "automountServiceAccountToken": True,  # it writes the ModelVersion's status
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "securityContext": pod_security_context(config),
        **pull_secrets(config),
        "affinity": component_affinity(config.operator_image, config),
        "containers": [container],
        "volumes": volumes,
    }


def render_model_version(
    mv: ModelVersion, config: OperatorConfig, *, with_owner_references: bool = True
) -> list[dict[str, Any]]:
    """The cache PVC, the fetch Job's ServiceAccount, Role, RoleBinding, and the Job.

    `with_owner_references=False` is for offline rendering, where there is no uid yet.
    """
    name, namespace = mv.metadata.name, mv.metadata.namespace
    if not name or not namespace:
        raise RenderInputError("ModelVersion: metadata.name and metadata.namespace are required")
    owner = owner_reference(mv) if with_owner_references else None
    account = fetch_job_name(name)
    rbac_labels = labels_for(mv, "fetch")
    job_labels = labels_for(mv, "fetch")
    return [
        build_cache_pvc(mv, config, namespace, owner),
        build_service_account(account, namespace, rbac_labels, owner),
        build_role(account, namespace, rbac_labels, owner,
                   model_version_status_rules(GROUP, name)),
        build_role_binding(account, namespace, rbac_labels, owner, account, account),
        render_object(
            "job.yaml.j2",
            metadata=object_meta(fetch_job_name(name), namespace, job_labels, owner),
            backoff_limit=config.fetch.backoff_limit,
            active_deadline_seconds=active_deadline_seconds(mv, config),
            pod_labels=job_labels,
            pod_spec=fetch_pod_spec(mv, config, namespace, account),
        ),
    ]
