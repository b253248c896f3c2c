"""kopf handlers: thin glue from watch events to observe -> decide -> apply.

Everything the operator reads comes from kopf indexes (in-memory, fed by one watch per
kind), so a reconcile makes no read requests; it writes only what differs. Reconciles are
triggered by the object's own changes, by any change of its children or ModelVersion (so
status follows pods becoming ready, and a deleted child comes back at once), and by a slow
timer as a backstop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from glm_operator.api import GLMServiceStatus
from glm_operator.config import OperatorConfig
from glm_operator.controllers import metrics
from glm_operator.controllers.drift import object_holds_intent
from glm_operator.controllers.key_queue import KeyQueue
from glm_operator.controllers.model_version_state import decide_model_version, services_using
from glm_operator.controllers.service_state import decide_service
from glm_operator.kube.client import KubeClient, KubeError
from glm_operator.planning.accelerators import AcceleratorProfile
from glm_operator.render.deployment import INITIAL_REPLICAS_ANNOTATION
from glm_operator.render.names import MANAGED_BY, MODEL_VERSION_LABEL, SERVICE_LABEL
from glm_operator.render.service import Capabilities

GROUP, VERSION = "serving.glm-operator.dev", "v1alpha1"
INITIAL_FIELD_MANAGER = "glm-operator-initial-replicas"
MANAGED = {"app.kubernetes.io/managed-by": MANAGED_BY}
SERVICE_CRD_CHILDREN = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("monitoring.coreos.com", "v1", "servicemonitors"),
)
MODEL_VERSION_CHILDREN = (("batch", "v1", "jobs"), ("", "v1", "persistentvolumeclaims"))

log = logging.getLogger("glm_operator")

Obj = dict[str, Any]
Key = tuple[str, str]


@dataclass
class Runtime:
    """What every handler needs; set once by the startup handler."""

    kube: KubeClient
    config: OperatorConfig
    profiles: Mapping[str, AcceleratorProfile]
    queue: KeyQueue = field(default_factory=KeyQueue)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            service_monitor=self.kube.crd_established("servicemonitors.monitoring.coreos.com"),
            istio=self.kube.crd_established("virtualservices.networking.istio.io"),
        )


_runtime: Runtime | None = None


def configure(runtime: Runtime) -> None:
    global _runtime
    _runtime = runtime


def runtime() -> Runtime:
    if _runtime is None:
        raise RuntimeError("the operator runtime is not configured (run `glm-operator run`)")
    return _runtime


# --- indexes: the operator's read cache -------------------------------------------------------


def _plain(body: Mapping[str, Any]) -> Obj:
    return {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in body}


@kopf.index(GROUP, VERSION, "glmservices")
def glmservices(**kw: Any) -> dict[Key, Obj]:
    return {(kw["namespace"], kw["name"]): _plain(kw["body"])}


@kopf.index(GROUP, VERSION, "modelversions")
def modelversions(**kw: Any) -> dict[Key, Obj]:
    return {(kw["namespace"], kw["name"]): _plain(kw["body"])}


def _child_index(labels: Mapping[str, str], namespace: str, body: kopf.Body,
                 label: str) -> dict[Key, Obj] | None:
    owner = labels.get(label)
    return {(namespace, owner): _plain(body)} if owner else None


def _register_child_index(group: str, version: str, plural: str, label: str, name: str) -> None:
    def index(**kw: Any) -> dict[Key, Obj] | None:
        return _child_index(kw["labels"], kw["namespace"], kw["body"], label)

    index.__name__ = name
    kopf.index(group, version, plural, labels=MANAGED, id=name)(index)


SERVICE_CHILD_INDEXES = [f"service_{plural}" for _, _, plural in SERVICE_CRD_CHILDREN]
MODEL_CHILD_INDEXES = [f"model_{plural}" for _, _, plural in MODEL_VERSION_CHILDREN]
for (_g, _v, _p), _name in zip(SERVICE_CRD_CHILDREN, SERVICE_CHILD_INDEXES, strict=True):
    _register_child_index(_g, _v, _p, SERVICE_LABEL, _name)
for (_g, _v, _p), _name in zip(MODEL_VERSION_CHILDREN, MODEL_CHILD_INDEXES, strict=True):
    _register_child_index(_g, _v, _p, MODEL_VERSION_LABEL, _name)


def _lookup(index: kopf.Index[Key, Obj] | None, key: Key) -> list[Obj]:
    if index is None:
        return []
    store = index.get(key)
    return list(store) if store is not None else []


def _children(indexes: Mapping[str, Any], names: Iterable[str], key: Key) -> list[Obj]:
    return [obj for name in names for obj in _lookup(indexes.get(name), key)]


def _model_versions_of(body: Obj, index: kopf.Index[Key, Obj], namespace: str) -> dict[str, Obj]:
    """The ModelVersions one service wants or serves, by key lookup: a reconcile stays O(1)
    however many ModelVersions the cluster holds."""
    names = {body.get("spec", {}).get("modelVersion"),
             (body.get("status") or {}).get("stableModelVersion")}
    found = {}
    for name in names - {None}:
        bodies = _lookup(index, (namespace, name))
        if bodies:
            found[name] = bodies[0]
    return found


def _namespace_objects(index: kopf.Index[Key, Obj], namespace: str) -> dict[str, Obj]:
    return {name: next(iter(store)) for (ns, name), store in index.items()
            if ns == namespace and store}


# --- the I/O half of a reconcile ----------------------------------------------------------------


def _ref(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _sync_children(kube: KubeClient, owner_uid: str, desired: list[Obj],
                   live: list[Obj]) -> int:
    """Apply what differs, delete owned children no longer desired; return writes made."""
    writes = 0
    live_by_ref = {_ref(o): o for o in live}
    for obj in desired:
        current = live_by_ref.get(_ref(obj))
        if current is None and INITIAL_REPLICAS_ANNOTATION in obj["metadata"].get(
                "annotations", {}):
            # replicas belong to the HPA or the gateway, not to our applied intent: set the
            # starting count once, by a plain create under another manager, so later applies
            # (which omit replicas) never reset it.
            kube.create(with_initial_replicas(obj), field_manager=INITIAL_FIELD_MANAGER)
            metrics.CHILD_WRITES.labels(kind=obj["kind"], action="create").inc()
            writes += 1
        elif not object_holds_intent(obj, current):
            kube.apply(obj)
            metrics.CHILD_WRITES.labels(kind=obj["kind"], action="apply").inc()
            writes += 1
    wanted = {_ref(o) for o in desired}
    for obj in live:
        meta = obj.get("metadata", {})
        owned = any(r.get("uid") == owner_uid for r in meta.get("ownerReferences", []))
        if owned and _ref(obj) not in wanted and not meta.get("deletionTimestamp"):
            kube.delete(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
            metrics.CHILD_WRITES.labels(kind=obj["kind"], action="delete").inc()
            writes += 1
    return writes


def with_initial_replicas(obj: Mapping[str, Any]) -> Obj:
    created = {**obj, "spec": {**obj["spec"]}}
    created["spec"]["replicas"] = int(obj["metadata"]["annotations"][INITIAL_REPLICAS_ANNOTATION])
    return created


def _emit(body: Mapping[str, Any], events: list[tuple[str, str, str]]) -> None:
    for type_, reason, message in events:
        kopf.event(cast(kopf.Body, dict(body)), type=type_, reason=reason, message=message[:1024])


# The kopf indexes, as the last handler saw them (live views), for the resync thread.
_latest_indexes: dict[str, Any] = {}


def reconcile_service(namespace: str, name: str, indexes: Mapping[str, Any], *,
                      coalesce: bool = False) -> None:
    """Reconcile one GLMService; `coalesce` for events of its children and ModelVersions."""
    if not _latest_indexes and "glmservices" in indexes:
        _latest_indexes.update({k: v for k, v in indexes.items() if isinstance(v, kopf.Index)})
    _in_turn("GLMService", (namespace, name),
             lambda: _reconcile_service(namespace, name, indexes), coalesce)


def _in_turn(kind: str, key: Key, work: Callable[[], None], coalesce: bool) -> None:
    if not runtime().queue.run(key, work, coalesce=coalesce):
        metrics.RECONCILES.labels(kind, "coalesced").inc()


def _reconcile_service(namespace: str, name: str, indexes: Mapping[str, Any]) -> None:
    rt = runtime()
    with metrics.RECONCILE_SECONDS.labels("GLMService").time():
        bodies = _lookup(indexes["glmservices"], (namespace, name))
        if not bodies or bodies[0]["metadata"].get("deletionTimestamp"):
            return
        body = bodies[0]
        children = _children(indexes, SERVICE_CHILD_INDEXES, (namespace, name))
        try:
            decision = decide_service(
                body, _model_versions_of(body, indexes["modelversions"], namespace), children,
                rt.config, rt.profiles, rt.capabilities())
            _sync_children(rt.kube, body["metadata"]["uid"], decision.desired, children)
            new_status = decision.status.model_dump(by_alias=True, mode="json", exclude_none=True)
            old_status = GLMServiceStatus.model_validate(body.get("status") or {}).model_dump(
                by_alias=True, mode="json", exclude_none=True)
            if new_status != old_status:
                rt.kube.patch_status(f"{GROUP}/{VERSION}", "GLMService", namespace, name,
                                     new_status)
            for reason in {c["reason"] for c in new_status.get("conditions", [])
                           if c["type"] == "Planned" and c["status"] == "False"}:
                if new_status != old_status:
                    metrics.PLAN_FAILURES.labels(reason=reason).inc()
            _emit(body, decision.events)
        except KubeError as exc:
            metrics.RECONCILES.labels("GLMService", "error").inc()
            if _namespace_terminating(exc):
                return
            raise kopf.TemporaryError(f"API error: {exc}", delay=5) from exc
        metrics.RECONCILES.labels("GLMService", "ok").inc()


def reconcile_model_version(namespace: str, name: str, indexes: Mapping[str, Any], *,
                            coalesce: bool = False) -> None:
    """Reconcile one ModelVersion; `coalesce` for its own status events and its Jobs'."""
    _in_turn("ModelVersion", (namespace, f"mv/{name}"),
             lambda: _reconcile_model_version(namespace, name, indexes), coalesce)


def _reconcile_model_version(namespace: str, name: str, indexes: Mapping[str, Any]) -> None:
    rt = runtime()
    with metrics.RECONCILE_SECONDS.labels("ModelVersion").time():
        bodies = _lookup(indexes["modelversions"], (namespace, name))
        if not bodies or bodies[0]["metadata"].get("deletionTimestamp"):
            return
        body = bodies[0]
        children = _children(indexes, MODEL_CHILD_INDEXES, (namespace, name))
        try:
            decision = decide_model_version(body, children, rt.config)
            _sync_children(rt.kube, body["metadata"]["uid"], decision.desired, children)
            if decision.status_patch:
                # Guarded by resourceVersion: the fetch Job writes this status too.
                rt.kube.patch_merge(
                    f"{GROUP}/{VERSION}", "ModelVersion", namespace, name,
                    {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                     "status": decision.status_patch}, "status")
            _emit(body, decision.events)
        except KubeError as exc:
            metrics.RECONCILES.labels("ModelVersion", "error").inc()
            if exc.status == 409:
                return  # the fetcher wrote first; its write brings a fresh event
            if _namespace_terminating(exc):
                return
            raise kopf.TemporaryError(f"API error: {exc}", delay=5) from exc
        metrics.RECONCILES.labels("ModelVersion", "ok").inc()


def _namespace_terminating(exc: KubeError) -> bool:
    """Writes into a namespace being deleted are refused; everything in it is going anyway."""
    return exc.status == 403 and "being terminated" in str(exc)


# --- triggers -----------------------------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, "glmservices")
@kopf.on.create(GROUP, VERSION, "glmservices")
@kopf.on.update(GROUP, VERSION, "glmservices")
def glmservice_changed(**kw: Any) -> None:
    reconcile_service(kw["namespace"], kw["name"], kw)


def resync_forever(interval: float, stop: threading.Event) -> None:
    """Backstop for anything a watch missed; writes nothing when nothing drifted.

    A plain thread instead of `kopf.timer`: kopf puts a finalizer on every object that has a
    timer, and a finalizer left behind by an uninstalled operator blocks namespace deletion.
    The GLMService needs none (its children go by ownerReferences).
    """
    while not stop.wait(interval):
        indexes = dict(_latest_indexes)
        services = indexes.get("glmservices")
        if services is None:
            continue
        for namespace, name in list(services.keys()):
            try:
                reconcile_service(namespace, name, indexes, coalesce=True)
            except Exception as exc:  # one bad object must not stop the resync of the rest
                log.warning("resync of GLMService %s/%s failed: %s", namespace, name, exc)


def _on_service_child(**kw: Any) -> None:
    owner = kw["labels"].get(SERVICE_LABEL)
    if owner and kw["type"] is not None:  # None: the initial listing, resume covers it
        reconcile_service(kw["namespace"], owner, kw, coalesce=True)


for _g, _v, _p in SERVICE_CRD_CHILDREN:
    kopf.on.event(_g, _v, _p, labels=MANAGED, id=f"{_p}-changed")(_on_service_child)


@kopf.on.resume(GROUP, VERSION, "modelversions")
@kopf.on.create(GROUP, VERSION, "modelversions")
@kopf.on.update(GROUP, VERSION, "modelversions")
def modelversion_changed(**kw: Any) -> None:
    reconcile_model_version(kw["namespace"], kw["name"], kw)


@kopf.on.event(GROUP, VERSION, "modelversions")
def modelversion_event(**kw: Any) -> None:
    """A ModelVersion's status moved (the fetch Job reported): its services re-plan."""
    namespace, name = kw["namespace"], kw["name"]
    if kw["type"] is None:
        return
    if kw["type"] == "MODIFIED":
        reconcile_model_version(namespace, name, kw, coalesce=True)
    services = _namespace_objects(kw["glmservices"], namespace)
    for service in services_using(name, services):
        reconcile_service(namespace, service, kw, coalesce=True)


@kopf.on.event("batch", "v1", "jobs", labels=MANAGED)
def fetch_job_event(**kw: Any) -> None:
    owner = kw["labels"].get(MODEL_VERSION_LABEL)
    if owner and kw["type"] is not None:
        reconcile_model_version(kw["namespace"], owner, kw, coalesce=True)

