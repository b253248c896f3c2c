"""The resource kinds glm-operator reads and writes, with their REST paths.

A static table instead of API discovery: the operator only ever touches these kinds, and
skipping discovery keeps start-up and every reconcile free of extra round trips.
"""

from __future__ import annotations

from dataclasses import dataclass

from glm_operator.wellknown import API_VERSION


@dataclass(frozen=True)
class ResourceKind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0] if "/" in self.api_version else ""

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        base = f"/apis/{self.api_version}" if self.group else f"/api/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


_KINDS = [
    ResourceKind("v1", "Service", "services"),
    ResourceKind("v1", "ServiceAccount", "serviceaccounts"),
    ResourceKind("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    ResourceKind("v1", "Secret", "secrets"),
    ResourceKind("v1", "ConfigMap", "configmaps"),
    ResourceKind("v1", "Pod", "pods"),
    ResourceKind("v1", "Event", "events"),
    ResourceKind("v1", "Namespace", "namespaces", namespaced=False),
    ResourceKind("v1", "Node", "nodes", namespaced=False),
    ResourceKind("apps/v1", "Deployment", "deployments"),
    ResourceKind("apps/v1", "StatefulSet", "statefulsets"),
    ResourceKind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    ResourceKind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets"),
    ResourceKind("batch/v1", "Job", "jobs"),
    ResourceKind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
    ResourceKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    ResourceKind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    ResourceKind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    ResourceKind("coordination.k8s.io/v1", "Lease", "leases"),
    ResourceKind("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors"),
    ResourceKind("networking.istio.io/v1", "VirtualService", "virtualservices"),
    ResourceKind("networking.istio.io/v1", "DestinationRule", "destinationrules"),
    ResourceKind("keda.sh/v1alpha1", "ScaledObject", "scaledobjects"),
    ResourceKind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools"),
    ResourceKind("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes"),
    ResourceKind(API_VERSION, "GLMService", "glmservices"),
    ResourceKind(API_VERSION, "ModelVersion", "modelversions"),
    ResourceKind("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                 "customresourcedefinitions", namespaced=False),
]

KINDS: dict[tuple[str, str], ResourceKind] = {(k.api_version, k.kind): k for k in _KINDS}


def kind_of(api_version: str, kind: str) -> ResourceKind:
    try:
        return KINDS[(api_version, kind)]
    except KeyError:
        raise KeyError(
            f"glm-operator does not manage {kind} ({api_version}); add it to kube/resources.py"
        ) from None


def kind_by_plural(api_version: str, plural: str) -> ResourceKind:
    """The kind a watch names by its plural (`apps/v1`, `deployments`)."""
    for kind in _KINDS:
        if (kind.api_version, kind.plural) == (api_version, plural):
            return kind
    raise KeyError(f"glm-operator does not manage {plural} ({api_version}); add it to "
                   "kube/resources.py")


def kind_for(obj: dict[str, object]) -> ResourceKind:
    return kind_of(str(obj["apiVersion"]), str(obj["kind"]))
