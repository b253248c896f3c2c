"""ServiceAccount, Role and RoleBinding builders: one narrow Role per need.

The main pool's gateway may scale exactly one Deployment (its long-context pool) and renew
one Lease (the pool's activity mark); the long-context pool's gateway may renew that Lease
and nothing else; the fetch Job may write exactly one ModelVersion's status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta


def build_service_account(
    name: str, namespace: str, labels: Mapping[str, str], owner: dict[str, Any] | None
) -> dict[str, Any]:
    return render_object(
        "serviceaccount.yaml.j2", metadata=object_meta(name, namespace, labels, owner)
    )


def build_role(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    owner: dict[str, Any] | None,
    rules: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    return render_object(
        "role.yaml.j2", metadata=object_meta(name, namespace, labels, owner),
        rules=[dict(r) for r in rules],
    )


def build_role_binding(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    owner: dict[str, Any] | None,
    role: str,
    service_account: str,
) -> dict[str, Any]:
    return render_object(
        "rolebinding.yaml.j2", metadata=object_meta(name, namespace, labels, owner),
        role=role, service_account=service_account, namespace=namespace,
    )


def scale_rules(deployment: str) -> list[dict[str, Any]]:
    """What the gateway's wake-up does: GET and PATCH one Deployment's scale subresource."""
    return [{
        "apiGroups": ["apps"],
        "resources": ["deployments/scale"],
        "resourceNames": [deployment],
        "verbs": ["get", "patch"],
    }]


def activity_lease_rules(lease: str) -> list[dict[str, Any]]:
    """What marking long-context activity does: a merge patch of one Lease's renewTime."""
    return [{
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": [lease],
        "verbs": ["patch"],
    }]


def model_version_status_rules(group: str, model_version: str) -> list[dict[str, Any]]:
    """What the fetch Job's status reporter does, for its own ModelVersion only."""
    return [
        {"apiGroups": [group], "resources": ["modelversions"],
         "resourceNames": [model_version], "verbs": ["get"]},
        {"apiGroups": [group], "resources": ["modelversions/status"],
         "resourceNames": [model_version], "verbs": ["get", "patch"]},
    ]
