"""The only place glm-operator talks to the Kubernetes API server.

Thin and synchronous on purpose: kopf runs sync handlers in its thread pool, and the official
client gives us auth (kubeconfig, in-cluster token) and connection pooling. Objects go in and
come out as plain dicts, the same shape the pure renderers produce.

Every write is server-side apply with one field manager, so the operator owns exactly the
fields it renders and nothing else (an HPA's replicas, a user's annotations stay theirs).
Every request is counted by verb and kind: the idle benchmark reads these counters to prove
the operator makes no writes when nothing changed.
"""

from __future__ import annotations

import builtins
import json
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

import kopf
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter

from glm_operator.kube.resources import ResourceKind, kind_for, kind_of

FIELD_MANAGER = "glm-operator"
REQUEST_TIMEOUT = (10.0, 60.0)  # seconds: connect, then read
# A LIST answered as names, uids and labels only (the API server's PartialObjectMetadata).
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
# A WATCH whose events carry the objects' metadata only.
METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
WATCH_SECONDS = 300  # the API server ends a watch after this; the caller starts the next

API_REQUESTS = Counter(
    "glm_operator_api_requests_total",
    "Requests glm-operator made to the Kubernetes API server.",
    ["verb", "kind"],
)

Obj = dict[str, Any]


class KubeError(RuntimeError):
    """An API call failed; the message says which object and why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _describe(kind: ResourceKind, namespace: str | None, name: str | None) -> str:
    where = f"{namespace}/" if namespace else ""
    return f"{kind.kind} {where}{name or '*'}"


def kubeconfig_connection(kubeconfig: str) -> kopf.ConnectionInfo:
    """kopf's credentials from a kubeconfig file, as kopf's own client login extracts them."""
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    header = (configuration.get_api_key_with_prefix("BearerToken")
              or configuration.get_api_key_with_prefix("authorization"))
    scheme, _, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


class KubeClient:
    """API access for the operator, the fetch Job and the gateway (scale only)."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._api = api_client
        self._crd_cache: dict[str, tuple[bool, float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None) -> KubeClient:
        """In-cluster config when running in a pod, else the kubeconfig (KUBECONFIG or given)."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        # Many services reconcile at once on start-up; the default pool of 4 serialises them.
        configuration.connection_pool_maxsize = 32
        return cls(k8s.ApiClient(configuration))

    # --- raw request ---------------------------------------------------------------------

    def _call(
        self,
        verb: str,
        kind: ResourceKind,
        path: str,
        *,
        body: object = None,
        query: Iterable[tuple[str, str]] = (),
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Obj:
        API_REQUESTS.labels(verb=verb, kind=kind.kind).inc()
        method = {"get": "GET", "list": "GET", "apply": "PATCH", "patch": "PATCH",
                  "create": "POST", "delete": "DELETE", "update": "PUT"}[verb]
        try:
            data = self._api.call_api(
                path, method,
                query_params=list(query),
                header_params={"Content-Type": content_type, "Accept": accept},
                body=body,
                response_type="object",
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=True,
                # Without a timeout a request on a half-open connection blocks its reconcile
                # thread forever; with one it fails like any other call and is retried.
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as exc:
            raise KubeError(_api_message(exc), status=exc.status) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # The API server restarting or unreachable: a KubeError like any other failed
            # call, so the reconcile is retried soon rather than treated as a crash.
            raise KubeError(f"cannot reach the API server ({method} {path}): {exc}") from exc
        return cast(Obj, data or {})

    # --- reads -----------------------------------------------------------------------------

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        resource = kind_of(api_version, kind)
        try:
            return self._call("get", resource, resource.path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str | None,
             label_selector: str = "") -> list[Obj]:
        resource = kind_of(api_version, kind)
        query = [("labelSelector", label_selector)] if label_selector else []
        items: list[Obj] = []
        cont = ""
        while True:
            paging = [("limit", "500"), *([("continue", cont)] if cont else [])]
            page = self._call("list", resource, resource.path(namespace), query=[*query, *paging])
            for item in page.get("items", []):
                # List items carry no apiVersion/kind; add them so callers can re-apply or delete.
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                items.append(item)
            cont = page.get("metadata", {}).get("continue", "")
            if not cont:
                return items

    def list_uids(self, api_version: str, kind: str, namespace: str | None,
                  label_selector: str = "") -> set[str]:
        """The uids of a kind's objects, read consistently (from etcd, not a cache) and as
        metadata only: what is left of a kind, at a fraction of a full LIST's bytes."""
        resource = kind_of(api_version, kind)
        query = [("labelSelector", label_selector)] if label_selector else []
        uids: set[str] = set()
        cont = ""
        while True:
            paging = [("limit", "500"), *([("continue", cont)] if cont else [])]
            page = self._call("list", resource, resource.path(namespace),
                              query=[*query, *paging], accept=METADATA_LIST)
            # An empty PartialObjectMetadataList says "items": null.
            uids.update(item["metadata"]["uid"] for item in page.get("items") or ())
            cont = page.get("metadata", {}).get("continue", "")
            if not cont:
                return uids

    def list_metadata(self, api_version: str, kind: str, namespace: str | None
                      ) -> tuple[tuple[Obj, ...], str]:
        """A kind's objects as metadata only (no Secret data ever comes back), and the
        list's resourceVersion to watch from."""
        resource = kind_of(api_version, kind)
        items: builtins.list[Obj] = []
        cont, version = "", ""
        while True:
            paging = [("limit", "500"), *([("continue", cont)] if cont else [])]
            page = self._call("list", resource, resource.path(namespace), query=paging,
                              accept=METADATA_LIST)
            items.extend(page.get("items") or ())
            meta = page.get("metadata", {})
            version = meta.get("resourceVersion", version)
            cont = meta.get("continue", "")
            if not cont:
                return tuple(items), version

    def watch_metadata(self, api_version: str, kind: str, namespace: str | None,
                       resource_version: str, timeout_seconds: int = WATCH_SECONDS
                       ) -> Iterator[tuple[str, Obj]]:
        """(type, metadata-only object) events from `resource_version` on, with bookmarks,
        until the API server ends the watch. An ERROR event raises KubeError with its code
        (410: the version is too old, list again)."""
        resource = kind_of(api_version, kind)
        API_REQUESTS.labels(verb="watch", kind=resource.kind).inc()
        query = [("watch", "true"), ("resourceVersion", resource_version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(timeout_seconds))]
        try:
            response = self._api.call_api(
                resource.path(namespace), "GET", query_params=query,
                header_params={"Accept": METADATA_WATCH}, auth_settings=["BearerToken"],
                _return_http_data_only=True, _preload_content=False,
                _request_timeout=(REQUEST_TIMEOUT[0], timeout_seconds + 30.0))
        except ApiException as exc:
            raise KubeError(_api_message(exc), status=exc.status) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(f"cannot reach the API server (watch {resource.plural}): {exc}"
                            ) from exc
        try:
            pending = b""
            for chunk in response.stream(amt=None, decode_content=False):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        raise KubeError(f"watch {resource.plural}: {obj.get('message')}",
                                        status=obj.get("code"))
                    yield event.get("type", ""), obj
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(f"watch {resource.plural} cut off: {exc}") from exc
        finally:
            response.release_conn()

    def crd_established(self, name: str, ttl_seconds: float = 60.0) -> bool:
        """Whether a CRD (`servicemonitors.monitoring.coreos.com`) is established; cached."""
        now = time.monotonic()
        with self._lock:
            cached = self._crd_cache.get(name)
            if cached and now - cached[1] < ttl_seconds:
                return cached[0]
        crd = self.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", None, name)
        present = bool(crd) and any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (crd or {}).get("status", {}).get("conditions", [])
        )
        with self._lock:
            self._crd_cache[name] = (present, now)
        return present

    # --- writes ----------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any], field_manager: str = FIELD_MANAGER) -> Obj:
        """Server-side apply `obj` (force: the operator's intent wins on the fields it owns)."""
        resource = kind_for(dict(obj))
        meta = obj["metadata"]
        path = resource.path(meta.get("namespace"), meta["name"])
        return self._call(
            "apply", resource, path, body=dict(obj),
            query=[("fieldManager", field_manager), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str,
                     status: Mapping[str, Any]) -> Obj:
        """JSON merge patch of `.status` through the status subresource."""
        resource = kind_of(api_version, kind)
        return self._call(
            "patch", resource, resource.path(namespace, name, "status"),
            body={"status": dict(status)}, content_type="application/merge-patch+json",
        )

    def patch_merge(self, api_version: str, kind: str, namespace: str | None, name: str,
                    patch: Mapping[str, Any], subresource: str | None = None) -> Obj:
        resource = kind_of(api_version, kind)
        return self._call(
            "patch", resource, resource.path(namespace, name, subresource),
            body=dict(patch), content_type="application/merge-patch+json",
        )

    def scale(self, api_version: str, kind: str, namespace: str, name: str, replicas: int,
              resource_version: str | None, field_manager: str) -> Obj:
        """Set replicas through the scale subresource (the way an HPA does), guarded by the
        resourceVersion the decision was made from (409 when the object moved since)."""
        resource = kind_of(api_version, kind)
        patch: Obj = {"spec": {"replicas": replicas}}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        return self._call(
            "patch", resource, resource.path(namespace, name, "scale"), body=patch,
            query=[("fieldManager", field_manager)],
            content_type="application/merge-patch+json",
        )

    def create(self, obj: Mapping[str, Any], field_manager: str = FIELD_MANAGER) -> Obj:
        resource = kind_for(dict(obj))
        return self._call("create", resource, resource.path(obj["metadata"].get("namespace")),
                          body=dict(obj), query=[("fieldManager", field_manager)])

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """Delete with background propagation; False when it was already gone."""
        resource = kind_of(api_version, kind)
        try:
            self._call("delete", resource, resource.path(namespace, name),
                       body={"propagationPolicy": "Background"})
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _api_message(exc: ApiException) -> str:
    """The API server's own message (it names the field), not the client's wrapper text."""
    try:
        body = json.loads(exc.body or "{}")
        message = body.get("message") or exc.reason
    except (TypeError, ValueError):
        message = exc.body or exc.reason
    return f"{exc.status} {message}"
