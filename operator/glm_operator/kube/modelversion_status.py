"""Read a ModelVersion and write its status, as the fetch Job's own ServiceAccount.

The fetch Job runs with a ServiceAccount whose Role allows `get` on its one ModelVersion and
`patch` on that ModelVersion's status subresource, nothing else. It talks to the API server
with the pod's projected token; tests point it at any API server with any token.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from glm_operator.kube.client import KubeClient, KubeError
from glm_operator.wellknown import API_VERSION

KIND = "ModelVersion"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class ServiceAccountAccess:
    """How to reach the API server as a ServiceAccount: URL, token file, CA bundle."""

    api_server: str
    token_file: Path
    ca_file: Path | None

    @classmethod
    def in_cluster(cls, api_server: str | None = None, token_file: str | None = None,
                   ca_file: str | None = None) -> ServiceAccountAccess:
        """The pod's own identity; each part can be overridden (tests, out-of-cluster runs)."""
        if api_server is None:
            host = os.environ.get("KUBERNETES_SERVICE_HOST")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise KubeError(
                    "not running in a pod (KUBERNETES_SERVICE_HOST unset) and no API server "
                    "given; pass --api-server")
            api_server = f"https://{f'[{host}]' if ':' in host else host}:{port}"
        default_ca = SERVICE_ACCOUNT_DIR / "ca.crt"
        ca = Path(ca_file) if ca_file else (default_ca if default_ca.exists() else None)
        return cls(api_server, Path(token_file or SERVICE_ACCOUNT_DIR / "token"), ca)

    def namespace(self) -> str | None:
        """The pod's namespace, from the mounted ServiceAccount files, if there."""
        path = self.token_file.parent / "namespace"
        return path.read_text().strip() if path.exists() else None

    def client(self) -> KubeClient:
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise KubeError(f"cannot read the ServiceAccount token {self.token_file}: {exc}") \
                from exc
        configuration = k8s.Configuration()
        configuration.host = self.api_server
        configuration.api_key = {"authorization": token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        if self.ca_file is not None:
            configuration.ssl_ca_cert = str(self.ca_file)
        return KubeClient(k8s.ApiClient(configuration))


def read_modelversion(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    found = client.get(API_VERSION, KIND, namespace, name)
    if found is None:
        raise KubeError(f"ModelVersion {namespace}/{name} not found", status=404)
    return found


def update_modelversion_status(
    client: KubeClient,
    namespace: str,
    name: str,
    compute_status: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Merge-patch `.status` with `compute_status(current object)`, guarded by resourceVersion.

    The patch carries the resourceVersion it was computed from, so a concurrent writer (the
    operator setting Ready) makes it fail with 409 and it is recomputed, never overwritten.
    """
    for _ in range(CONFLICT_RETRIES):
        current = read_modelversion(client, namespace, name)
        patch = {
            "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
            "status": compute_status(current),
        }
        try:
            return client.patch_merge(API_VERSION, KIND, namespace, name, patch, "status")
        except KubeError as exc:
            if exc.status != 409:
                raise
    raise KubeError(f"ModelVersion {namespace}/{name}: status kept changing under us "
                    f"({CONFLICT_RETRIES} conflicts)", status=409)


def patch_modelversion_status(client: KubeClient, namespace: str, name: str,
                              status: Mapping[str, Any]) -> dict[str, Any]:
    """Merge-patch fields of `.status` that only the caller writes (the download progress),
    without a resourceVersion: nothing it computes depends on what others wrote."""
    return client.patch_merge(API_VERSION, KIND, namespace, name, {"status": dict(status)},
                              "status")
