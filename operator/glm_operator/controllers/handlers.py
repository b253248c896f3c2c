"""kopf handlers: thin glue from watch events to observe -> decide -> apply.

Everything the operator reads about its objects comes from kopf indexes (in-memory, fed by
one watch per kind); a reconcile reads from the API server only what cannot be watched
safely: whether optional CRDs (Istio, ServiceMonitor) are installed, cached for
capabilityRecheckSeconds, and optional children when their intent changed or at a resync.
It writes only what differs. Reconciles are
triggered by the object's own changes, by any change of its children or ModelVersion (so
status follows pods becoming ready, and a deleted child comes back at once), and by a slow
timer as a backstop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar, cast

import kopf

from glm_operator.analysis.canary import canary_queries, judge, unavailable
from glm_operator.analysis.prometheus import PrometheusError, query_scalar
from glm_operator.api import AnalysisResult, GLMService
from glm_operator.config import OperatorConfig
from glm_operator.controllers import metrics
from glm_operator.controllers.handling_watch import WATCH
from glm_operator.controllers.key_queue import KeyQueue
from glm_operator.controllers.relists import (
    WATCH_ID_SUFFIX,
    Ghost,
    RelistDetector,
    Sweeper,
    WatchedKind,
)
from glm_operator.controllers.scope import in_scope, list_namespaces
from glm_operator.controllers.wakeups import Wakeups
from glm_operator.decide.drift import (
    Drift,
    DriftReason,
    drift,
    merge_patch,
    with_intent_hash,
)
from glm_operator.decide.long_context import ActivityReading
from glm_operator.decide.model_version import decide_model_version, services_using
from glm_operator.decide.observed import ObservedChildren
from glm_operator.decide.rollout import analysis_window, gates
from glm_operator.decide.service import decide_service, long_context_reading_due
from glm_operator.kube.client import FIELD_MANAGER, KubeClient, KubeError
from glm_operator.kube.events import event_for
from glm_operator.kube.field_sets import merged_field_sets, without_replicas
from glm_operator.kube.resources import kind_by_plural, kind_of
from glm_operator.planning.accelerators import AcceleratorProfile
from glm_operator.render.deployment import INITIAL_REPLICAS_ANNOTATION
from glm_operator.render.groups import LEADER_WORKER_SET_CRD
from glm_operator.render.keda import SCALED_OBJECT_CRD
from glm_operator.render.long_context import activity_lease_name
from glm_operator.render.names import MANAGED_BY, MODEL_VERSION_LABEL, SERVICE_LABEL, label_value
from glm_operator.render.service import Capabilities
from glm_operator.wellknown import (
    API_VERSION,
    GROUP,
    MANAGED_BY_LABEL,
    PROMOTE_ANNOTATION,
    VERSION,
)

INITIAL_FIELD_MANAGER = "glm-operator-initial-replicas"
MANAGED = {MANAGED_BY_LABEL: MANAGED_BY}
SERVICE_CRD_CHILDREN = (
    ("apps", "v1", "deployments"),
    ("apps", "v1", "statefulsets"),  # multi-node groups
    ("networking.k8s.io", "v1", "networkpolicies"),  # multi-node groups
    ("", "v1", "services"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
)
# Children that are not watched: those whose CRDs may be missing, or come and go (Istio,
# the Prometheus Operator, KEDA; kopf stops the whole operator when a watched resource's CRD is
# deleted), and the long-context activity Lease (watching Leases would stream every node's
# heartbeat to the operator; its renewals are read only when an idle deadline passes). The
# operator remembers what it applied, reads them only when its intent changed, and reads
# them again at every resync to undo edits and deletions.
SCALED_OBJECT = ("keda.sh/v1alpha1", "ScaledObject")
LEADER_WORKER_SET = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
OPTIONAL_CHILD_KINDS = frozenset({
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("networking.istio.io/v1", "VirtualService"),
    ("networking.istio.io/v1", "DestinationRule"),
    SCALED_OBJECT,
    ("coordination.k8s.io/v1", "Lease"),
    LEADER_WORKER_SET,
})
# Applied after the watched children are pruned: KEDA's admission webhook refuses a
# ScaledObject for a Deployment that another HPA (ours, before a switch to KEDA) scales.
APPLIED_AFTER_PRUNE = frozenset({SCALED_OBJECT})
# Writes replicas of an idle long-context pool (scale subresource), apart from the applied
# intent, which never holds that pool's replicas.
IDLE_FIELD_MANAGER = "glm-operator-idle"
# Every kind render_model_version makes: one not indexed here would look missing at every
# reconcile, and be applied again each time.
MODEL_VERSION_CHILDREN = (
    ("batch", "v1", "jobs"),
    ("", "v1", "persistentvolumeclaims"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
)

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
    wakeups: Wakeups | None = None

    def capabilities(self) -> Capabilities:
        ttl = self.config.capability_recheck_seconds
        return Capabilities(
            service_monitor=self.kube.crd_established("servicemonitors.monitoring.coreos.com",
                                                      ttl),
            istio=(self.kube.crd_established("virtualservices.networking.istio.io", ttl)
                   and self.kube.crd_established("destinationrules.networking.istio.io", ttl)),
            keda=self.kube.crd_established(SCALED_OBJECT_CRD, ttl),
            leader_worker_set=self.kube.crd_established(LEADER_WORKER_SET_CRD, ttl),
        )


_runtime: Runtime | None = None


def configure(runtime: Runtime) -> None:
    """Set the runtime and start the thread that runs reconciles asked for later."""
    global _runtime
    _runtime = runtime
    runtime.wakeups = Wakeups(_wake)
    threading.Thread(target=runtime.wakeups.run, args=(threading.Event(),),
                     name="glm-wakeups", daemon=True).start()
    for kind, index in (("GLMService", "glmservices"), ("ModelVersion", "modelversions")):
        metrics.MANAGED_OBJECTS.labels(kind=kind).set_function(_index_size(index))


def _index_size(name: str) -> Callable[[], float]:
    return lambda: float(len(_latest_indexes.get(name) or ()))


MODEL_VERSION_KEY = "mv/"  # wakeup keys of ModelVersions: (namespace, "mv/<name>")


def _wake(key: Hashable) -> None:
    namespace, name = cast(Key, key)
    indexes = dict(_latest_indexes)
    if "glmservices" not in indexes:
        return
    kind = "ModelVersion" if name.startswith(MODEL_VERSION_KEY) else "GLMService"
    try:
        if kind == "ModelVersion":
            reconcile_model_version(namespace, name.removeprefix(MODEL_VERSION_KEY), indexes,
                                    coalesce=True)
        else:
            reconcile_service(namespace, name, indexes, coalesce=True)
    except kopf.TemporaryError as exc:
        runtime().wakeups.schedule(key, float(exc.delay or 5))  # type: ignore[union-attr]
    except Exception as exc:  # the thread must outlive one bad reconcile
        log.warning("scheduled reconcile of %s %s/%s failed: %s", kind, namespace, name, exc)


def _retry_later(key: Key, exc: KubeError) -> kopf.TemporaryError:
    """A failed API call (the API server restarting, a timeout, a 5xx): look again in a few
    seconds. kopf retries its own create/update handlers, but not a reconcile started by a
    child's or a ModelVersion's event, so the wakeup thread is asked as well."""
    delay = 5.0
    wakeups = runtime().wakeups
    if wakeups is not None:
        wakeups.schedule(key, delay)
    return kopf.TemporaryError(f"API error: {exc}", delay=delay)


def runtime() -> Runtime:
    if _runtime is None:
        raise RuntimeError("the operator runtime is not configured (run `glm-operator run`)")
    return _runtime


# --- indexes: the operator's read cache -------------------------------------------------------


def _plain(body: Mapping[str, Any]) -> Obj:
    """The object as a plain dict, every top-level field kept: not all kinds keep their
    content under spec (a Role's rules, a RoleBinding's roleRef, a ServiceAccount's
    automountServiceAccountToken), and a field missing here would look like drift.

    `metadata.managedFields` is cut to what a reconcile reads (who owns spec.replicas, see
    `_replicas_ours_alone`): it is 40 % of a Deployment's bytes, and the cache holds one
    copy of every child."""
    plain = {key: body[key] for key in body}
    meta = plain.get("metadata")
    if isinstance(meta, Mapping) and meta.get("managedFields"):
        plain["metadata"] = {**meta, "managedFields": _replicas_owners(meta["managedFields"])}
    return plain


class Cached(NamedTuple):
    """An index entry: who the object is, readable without parsing (the sweep for deleted
    objects reads every entry's), and the object itself as compact JSON (see _cached)."""

    namespace: str
    name: str
    uid: str
    json: bytes


def _cached(body: Mapping[str, Any]) -> Cached:
    """What the cache keeps of an object: `_plain(body)` as compact JSON. A dict of a
    Deployment is about 28 KB of Python objects, its JSON 5 KB; the cache holds one copy of
    every GLMService, ModelVersion and child, and a reconcile parses only its own few
    (`_lookup`), each a fresh copy it may change."""
    meta = body.get("metadata") or {}
    return Cached(meta.get("namespace") or "", meta.get("name") or "", meta.get("uid") or "",
                  json.dumps(_plain(body), separators=(",", ":")).encode())


def _thaw(entry: Cached) -> Obj:
    thawed: Obj = json.loads(entry.json)
    return thawed


def _replicas_owners(entries: list[Obj]) -> list[Obj]:
    """Who owns spec.replicas, and the create-time entry of an older operator's plain create
    (`_created_by_plain_create`) even when an autoscaler has since taken replicas from it."""
    kept: list[Obj] = []
    for entry in entries:
        marker = {"manager": entry.get("manager"), "operation": entry.get("operation")}
        if "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {}):
            kept.append({**marker, "fieldsV1": {"f:spec": {"f:replicas": {}}}})
        elif marker == {"manager": INITIAL_FIELD_MANAGER, "operation": "Update"}:
            kept.append({**marker, "fieldsV1": {}})
    return kept


@kopf.index(GROUP, VERSION, "glmservices", when=in_scope)
def glmservices(**kw: Any) -> dict[Key, Cached]:
    WATCH.indexed(kw["body"])
    return {(kw["namespace"], kw["name"]): _cached(kw["body"])}


@kopf.index(GROUP, VERSION, "modelversions", when=in_scope)
def modelversions(**kw: Any) -> dict[Key, Cached]:
    WATCH.indexed(kw["body"])
    return {(kw["namespace"], kw["name"]): _cached(kw["body"])}


def _child_index(labels: Mapping[str, str], namespace: str, body: kopf.Body,
                 label: str) -> dict[Key, Cached] | None:
    owner = labels.get(label)
    return {(namespace, owner): _cached(body)} if owner else None


def _register_child_index(group: str, version: str, plural: str, label: str, name: str) -> None:
    def index(**kw: Any) -> dict[Key, Cached] | None:
        return _child_index(kw["labels"], kw["namespace"], kw["body"], label)

    index.__name__ = name
    kopf.index(group, version, plural, labels=MANAGED, id=name, when=in_scope)(index)


SERVICE_CHILD_INDEXES = [f"service_{plural}" for _, _, plural in SERVICE_CRD_CHILDREN]
MODEL_CHILD_INDEXES = [f"model_{plural}" for _, _, plural in MODEL_VERSION_CHILDREN]
for (_g, _v, _p), _name in zip(SERVICE_CRD_CHILDREN, SERVICE_CHILD_INDEXES, strict=True):
    _register_child_index(_g, _v, _p, SERVICE_LABEL, _name)
for (_g, _v, _p), _name in zip(MODEL_VERSION_CHILDREN, MODEL_CHILD_INDEXES, strict=True):
    _register_child_index(_g, _v, _p, MODEL_VERSION_LABEL, _name)


COPY_ATTEMPTS = 100
_T = TypeVar("_T")


def _copied(source: Iterable[_T]) -> list[_T]:
    """A copy of a kopf index's keys or of one key's entries, taken in a worker thread while
    kopf's event loop may be changing them: iterating a dict that another thread resizes
    fails ("dictionary changed size during iteration"), so the copy is taken again until one
    goes through (the loop's changes are brief)."""
    for _ in range(COPY_ATTEMPTS - 1):
        try:
            return list(iter(source))
        except RuntimeError:
            continue
    return list(iter(source))


def _lookup(index: kopf.Index[Key, Cached] | None, key: Key) -> list[Obj]:
    if index is None:
        return []
    store = index.get(key)
    return [_thaw(entry) for entry in _copied(store)] if store is not None else []


def _children(indexes: Mapping[str, Any], names: Iterable[str], key: Key) -> list[Obj]:
    return [obj for name in names for obj in _lookup(indexes.get(name), key)]


def _model_versions_of(body: Obj, index: kopf.Index[Key, Cached],
                       namespace: str) -> dict[str, Obj]:
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


def _namespace_objects(index: kopf.Index[Key, Cached], namespace: str,
                       mentioning: str) -> dict[str, Obj]:
    """The namespace's objects whose JSON holds the string `mentioning` (a name their spec
    or status refers to): only those are parsed, however many the namespace holds."""
    needle = json.dumps(mentioning).encode()
    found = {}
    for ns, name in _copied(index):
        entries = _copied(index.get((ns, name)) or ()) if ns == namespace else []
        if entries and needle in entries[0].json:
            found[name] = _thaw(entries[0])
    return found


# --- the I/O half of a reconcile ----------------------------------------------------------------


def _ref(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _sync_children(kube: KubeClient, owner_uid: str, desired: list[Obj],
                   live: list[Obj], retained: frozenset[tuple[str, str]] = frozenset(),
                   corrected: list[str] | None = None) -> int:
    """Apply what differs, delete owned children neither desired nor retained; return writes
    made. Children restored after someone else's edit are named in `corrected`."""
    desired = [with_intent_hash(o) for o in desired]
    optional = [o for o in desired if (o["apiVersion"], o["kind"]) in OPTIONAL_CHILD_KINDS]
    desired = [o for o in desired if (o["apiVersion"], o["kind"]) not in OPTIONAL_CHILD_KINDS]
    late = [o for o in optional if (o["apiVersion"], o["kind"]) in APPLIED_AFTER_PRUNE]
    early = [o for o in optional if (o["apiVersion"], o["kind"]) not in APPLIED_AFTER_PRUNE]
    # Optional children that go are deleted first: a ScaledObject before the HPA that
    # replaces it is created (two HPAs on one Deployment fight).
    writes = _prune_optional_children(kube, owner_uid, optional)
    writes += _apply_optional_children(kube, owner_uid, early, corrected)
    live_by_ref = {_ref(o): o for o in live}
    for obj in desired:
        current = live_by_ref.get(_ref(obj))
        hands_off_replicas = INITIAL_REPLICAS_ANNOTATION in obj["metadata"].get(
            "annotations", {})
        if current is None and hands_off_replicas:
            # replicas belong to the HPA or the gateway, not to our applied intent. Create
            # with the starting count, then let another manager co-own it: later applies
            # (which omit replicas) then never reset it, and every other field stays ours
            # alone, so a field dropped from the intent is really removed.
            created = with_initial_replicas(obj)
            _apply(kube, created, Drift(DriftReason.MISSING, "."))
            kube.apply(_replicas_only(created), field_manager=INITIAL_FIELD_MANAGER)
            metrics.CHILD_WRITES.labels(kind=obj["kind"], action="handover").inc()
            writes += 2
            continue
        if hands_off_replicas and current is not None and _created_by_plain_create(current):
            writes += _retire_create_entry(kube, current)
            _apply(kube, obj, Drift(DriftReason.INTENT_CHANGED, "metadata.managedFields"))
            writes += 1
            continue
        if hands_off_replicas and current is not None and _replicas_ours_alone(current):
            # A pool whose size a rollout set is handed to its HPA: another manager takes
            # replicas at the live count first, else dropping the field from our apply
            # would reset the Deployment to 1 replica.
            kube.apply(_replicas_only(current), field_manager=INITIAL_FIELD_MANAGER)
            metrics.CHILD_WRITES.labels(kind=obj["kind"], action="handover").inc()
            writes += 1
        difference = drift(obj, current)
        if difference is not None:
            _apply(kube, obj, difference, corrected)
            writes += 1
    wanted = {_ref(o) for o in desired} | retained
    for obj in live:
        meta = obj.get("metadata", {})
        owned = any(r.get("uid") == owner_uid for r in meta.get("ownerReferences", []))
        if owned and _ref(obj) not in wanted and not meta.get("deletionTimestamp"):
            kube.delete(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
            metrics.CHILD_WRITES.labels(kind=obj["kind"], action="delete").inc()
            writes += 1
    return writes + _apply_optional_children(kube, owner_uid, late, corrected)


def _apply(kube: KubeClient, obj: Obj, why: Drift, corrected: list[str] | None = None) -> None:
    """Server-side apply, saying why: the log has the first differing field, the metrics
    count by reason, and an edit by someone else is reported to the owner's Events."""
    meta = obj["metadata"]
    log.info("applying %s %s/%s (%s)", obj["kind"], meta.get("namespace"), meta["name"], why)
    kube.apply(obj)
    metrics.CHILD_WRITES.labels(kind=obj["kind"], action="apply").inc()
    metrics.CHILD_DRIFT.labels(kind=obj["kind"], reason=why.reason.value).inc()
    if why.reason is DriftReason.LIVE_CHANGED and corrected is not None:
        corrected.append(f"{obj['kind']} {meta['name']}: {why.path}")


# Optional children as last applied or seen holding the intent: owner uid -> ref -> object.
OptionalRef = tuple[str, str, str, str]  # apiVersion, kind, namespace, name
_optional_applied: dict[str, dict[OptionalRef, Obj | None]] = {}
_scaled_objects_listed: set[str] = set()  # owners whose ScaledObjects were listed since start
_optional_lock = threading.Lock()


def _optional_ref(obj: Mapping[str, Any]) -> OptionalRef:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]


def _prune_optional_children(kube: KubeClient, owner_uid: str, desired: list[Obj]) -> int:
    """Delete the optional children applied (or found) before that are no longer desired."""
    wanted = {_optional_ref(o) for o in desired}
    with _optional_lock:
        gone = [ref for ref in _optional_applied.get(owner_uid, {}) if ref not in wanted]
    for api_version, kind, namespace, name in gone:
        kube.delete(api_version, kind, namespace, name)
        metrics.CHILD_WRITES.labels(kind=kind, action="delete").inc()
        with _optional_lock:
            _optional_applied.get(owner_uid, {}).pop((api_version, kind, namespace, name), None)
    return len(gone)


def _apply_optional_children(kube: KubeClient, owner_uid: str, desired: list[Obj],
                             corrected: list[str] | None = None) -> int:
    writes = 0
    for obj in desired:
        ref = _optional_ref(obj)
        with _optional_lock:
            if _optional_applied.get(owner_uid, {}).get(ref) == obj:
                continue  # unchanged intent, and it held when last looked at
        meta = obj["metadata"]
        live = kube.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        difference = drift(obj, live)
        if difference is not None:
            _apply(kube, obj, difference, corrected)
            writes += 1
        with _optional_lock:
            _optional_applied.setdefault(owner_uid, {})[ref] = obj
    return writes


def discover_scaled_objects(kube: KubeClient, owner_uid: str, namespace: str,
                            service: str) -> None:
    """Once per service after start (while KEDA's CRD is served): the ScaledObjects it owns
    join what the operator knows it applied. Their names change with the version, so one
    left by a scaler switch or a rollout the previous operator process did not finish would
    otherwise never be pruned, and its HPA would fight ours."""
    with _optional_lock:
        if owner_uid in _scaled_objects_listed:
            return
    found = kube.list(*SCALED_OBJECT, namespace,
                      f"{SERVICE_LABEL}={label_value(service)},{MANAGED_BY_LABEL}={MANAGED_BY}")
    with _optional_lock:
        known = _optional_applied.setdefault(owner_uid, {})
        for obj in found:
            if any(r.get("uid") == owner_uid for r in obj["metadata"].get("ownerReferences", [])):
                known.setdefault(_optional_ref(obj), None)
        _scaled_objects_listed.add(owner_uid)


def forget_optional_children(live_owners: set[str]) -> None:
    """Resync: the next reconciles read the optional children again (to undo edits and
    deletions), and owners that are gone are dropped."""
    with _optional_lock:
        for uid in list(_optional_applied):
            if uid in live_owners:
                _optional_applied[uid] = dict.fromkeys(_optional_applied[uid])
            else:
                del _optional_applied[uid]
        _scaled_objects_listed.intersection_update(live_owners)


def _replicas_ours_alone(live: Mapping[str, Any]) -> bool:
    """Whether our own applied intent is the only owner of spec.replicas of this object."""
    owners = {(entry.get("manager"), entry.get("operation"))
              for entry in live.get("metadata", {}).get("managedFields") or []
              if "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {})}
    return owners == {(FIELD_MANAGER, "Apply")}


def _created_by_plain_create(live: Mapping[str, Any]) -> bool:
    """Whether an older operator made this object with a plain create under the
    initial-replicas manager: that left an `Update` entry owning every field the object was
    created with, so a field later dropped from the intent would stay, co-owned by it."""
    return any(_is_create_entry(entry)
               for entry in live.get("metadata", {}).get("managedFields") or [])


def _retire_create_entry(kube: KubeClient, live: Mapping[str, Any]) -> int:
    """Bring an object from the plain-create path to today's ownership, once, the way
    kubectl's client-side-apply upgrade does: the initial-replicas manager applies replicas
    alone (at the live count, so nothing rescales), and the fields its create-time `Update`
    entry still owns move into the operator's own apply entry. The operator's next apply then
    drops what its intent no longer sets, as for any object it created itself. A patch that
    sets managedFields replaces the list (the API's documented way to edit ownership); the
    resourceVersion guards it against a concurrent write."""
    meta = live["metadata"]
    applied = kube.apply(_replicas_only(live), field_manager=INITIAL_FIELD_MANAGER)
    entries = applied.get("metadata", {}).get("managedFields") or []
    moved = [entry for entry in entries if _is_create_entry(entry)]
    kept = [entry for entry in entries if not _is_create_entry(entry)]
    ours = next((entry for entry in kept if entry.get("manager") == FIELD_MANAGER
                 and entry.get("operation") == "Apply" and not entry.get("subresource")), None)
    if ours is None:
        ours = {"manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": live["apiVersion"],
                "time": moved[0].get("time") if moved else None, "fieldsType": "FieldsV1",
                "fieldsV1": {}}
        kept.append(ours)
    for entry in moved:
        ours["fieldsV1"] = merged_field_sets(ours.get("fieldsV1") or {},
                                             without_replicas(entry.get("fieldsV1") or {}))
    kube.patch_merge(live["apiVersion"], live["kind"], meta.get("namespace"), meta["name"],
                     {"metadata": {"resourceVersion": applied["metadata"]["resourceVersion"],
                                   "managedFields": kept}})
    log.info("%s %s/%s: the fields an older operator's create owned are now the operator's "
             "applied fields (replicas stay the autoscaler's)", live["kind"],
             meta.get("namespace"), meta["name"])
    metrics.CHILD_WRITES.labels(kind=live["kind"], action="handover").inc()
    return 2


def _is_create_entry(entry: Mapping[str, Any]) -> bool:
    return entry.get("manager") == INITIAL_FIELD_MANAGER and entry.get("operation") == "Update"


def _replicas_only(live: Mapping[str, Any]) -> Obj:
    meta = live["metadata"]
    return {"apiVersion": live["apiVersion"], "kind": live["kind"],
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "spec": {"replicas": int(live.get("spec", {}).get("replicas") or 0)}}


def with_initial_replicas(obj: Mapping[str, Any]) -> Obj:
    created = {**obj, "spec": {**obj["spec"]}}
    created["spec"]["replicas"] = int(obj["metadata"]["annotations"][INITIAL_REPLICAS_ANNOTATION])
    return created


def _drift_events(corrected: list[str]) -> list[tuple[str, str, str]]:
    """One Event per reconcile that undid someone else's edits to the children."""
    if not corrected:
        return []
    shown = "; ".join(corrected[:5]) + (f"; and {len(corrected) - 5} more"
                                        if len(corrected) > 5 else "")
    return [("Warning", "DriftCorrected", f"restored what the operator sets: {shown}")]


def _emit(kube: KubeClient, body: Mapping[str, Any], events: list[tuple[str, str, str]]) -> None:
    for type_, reason, message in events:
        try:
            kube.create(event_for(body, type_, reason, message))
        except KubeError as exc:  # an Event is a courtesy; the status already says it
            log.warning("could not post Event %s on %s/%s: %s", reason,
                        body["metadata"].get("namespace"), body["metadata"]["name"], exc)


# The kopf indexes, as the last handler saw them (live views), for the resync thread.
_latest_indexes: dict[str, Any] = {}


def _remember_indexes(indexes: Mapping[str, Any]) -> None:
    if not _latest_indexes and "glmservices" in indexes:
        _latest_indexes.update({k: v for k, v in indexes.items() if isinstance(v, kopf.Index)})


def reconcile_service(namespace: str, name: str, indexes: Mapping[str, Any], *,
                      coalesce: bool = False) -> None:
    """Reconcile one GLMService; `coalesce` for events of its children and ModelVersions."""
    _remember_indexes(indexes)
    _in_turn("GLMService", (namespace, name),
             lambda: _reconcile_service(namespace, name, indexes), coalesce)


def _in_turn(kind: str, key: Key, work: Callable[[], None], coalesce: bool) -> None:
    if not runtime().queue.run(key, work, coalesce=coalesce):
        metrics.RECONCILES.labels(kind, "coalesced").inc()


# Status this operator wrote and the watch may not have delivered yet: key -> (the
# resourceVersion the write was based on, the one it produced, the status written). The
# write was guarded by the first, so an index still showing it is stale; any other version
# is at least as new as ours.
_written: dict[Key, tuple[str, str, Obj]] = {}
_written_lock = threading.Lock()


# Long-context Deployments this operator scaled to zero that the watch may not have shown
# yet: (namespace, name) -> the resourceVersion the scale was guarded by. An index still at
# that version is stale: without this, the next reconcile would take the pool for newly
# woken and record a deadline (and a last activity) for a pool that sleeps.
_scaled_to_zero: dict[Key, str] = {}


def _with_own_scales(namespace: str, children: list[Obj]) -> list[Obj]:
    with _written_lock:
        if not _scaled_to_zero:
            return children
        out = []
        for child in children:
            meta = child.get("metadata", {})
            ref = (namespace, meta.get("name", ""))
            base = _scaled_to_zero.get(ref) if child.get("kind") == "Deployment" else None
            if base is not None and meta.get("resourceVersion") == base:
                child = {**child, "spec": {**child.get("spec", {}), "replicas": 0}}
            elif base is not None:
                del _scaled_to_zero[ref]
            out.append(child)
        return out


def _with_own_writes(key: Key, body: Obj) -> Obj:
    with _written_lock:
        entry = _written.get(key)
        if entry is None:
            return body
        base, produced, status = entry
        if body["metadata"].get("resourceVersion") != base:
            del _written[key]
            return body
    return {**body, "status": status,
            "metadata": {**body["metadata"], "resourceVersion": produced}}


def _reconcile_service(namespace: str, name: str, indexes: Mapping[str, Any]) -> None:
    rt = runtime()
    key = (namespace, name)
    with metrics.RECONCILE_SECONDS.labels("GLMService").time():
        bodies = _lookup(indexes["glmservices"], key)
        if not bodies or bodies[0]["metadata"].get("deletionTimestamp"):
            return
        body = _with_own_writes(key, bodies[0])
        service = GLMService.model_validate(body)
        children = _with_own_scales(namespace, _children(indexes, SERVICE_CHILD_INDEXES, key))
        now = datetime.now(UTC)
        try:
            capabilities = rt.capabilities()
            if capabilities.keda:
                discover_scaled_objects(rt.kube, body["metadata"]["uid"], namespace, name)
            groups = (_live_leader_worker_sets(rt.kube, namespace, name)
                      if capabilities.leader_worker_set and _multi_node(body) else [])
            observed = ObservedChildren([*children, *groups])
            activity = (_read_activity(rt.kube, namespace, name)
                        if long_context_reading_due(service, observed, now) else None)
            decision = decide_service(
                service, _model_versions_of(body, indexes["modelversions"], namespace),
                observed, rt.config, rt.profiles, capabilities, now=now,
                analysis=_canary_analysis(rt.config, service, now),
                long_context_activity=activity)
            corrected: list[str] = []
            _sync_children(rt.kube, body["metadata"]["uid"], decision.desired, children,
                           decision.retained, corrected)
            for deployment, resource_version in decision.scale_to_zero:
                rt.kube.scale("apps/v1", "Deployment", namespace, deployment, 0,
                              resource_version, IDLE_FIELD_MANAGER)
                with _written_lock:
                    _scaled_to_zero[(namespace, deployment)] = resource_version
                metrics.CHILD_WRITES.labels(kind="Deployment", action="scale-to-zero").inc()
                log.info("long-context pool %s/%s idle: scaled to zero", namespace, deployment)
            new_status = decision.status.model_dump(by_alias=True, mode="json", exclude_none=True)
            old_status = service.status.model_dump(by_alias=True, mode="json",
                                                   exclude_none=True)
            if new_status != old_status:
                _write_status(rt.kube, body, new_status, merge_patch(old_status, new_status))
                _count_status_change(old_status, new_status)
            _emit(rt.kube, body, [*decision.events, *_drift_events(corrected)])
            if rt.wakeups is not None:
                settling = _groups_settling(groups, decision.desired)
                requeue = [t for t in (decision.requeue_after,
                                       GROUPS_POLL_SECONDS if settling else None)
                           if t is not None]
                if requeue:
                    rt.wakeups.schedule(key, min(requeue))
                else:
                    rt.wakeups.cancel(key)
        except KubeError as exc:
            metrics.RECONCILES.labels("GLMService", "error").inc()
            if _namespace_terminating(exc):
                return
            if exc.status == 409 and rt.wakeups is not None:
                rt.wakeups.schedule(key, 1.0)  # someone wrote first; look again at theirs
                return
            if exc.status == 404:
                SWEEPER.request()  # the index showed something the API server has not
            raise _retry_later(key, exc) from exc
        metrics.RECONCILES.labels("GLMService", "ok").inc()


# LeaderWorkerSets are not watched (an optional CRD, see OPTIONAL_CHILD_KINDS): while a
# service's groups are not all ready, its reconcile comes back this often to read them.
GROUPS_POLL_SECONDS = 10.0


def _multi_node(body: Mapping[str, Any]) -> bool:
    accelerator = body.get("spec", {}).get("accelerator") or {}
    return int(accelerator.get("nodes") or 1) > 1


def _live_leader_worker_sets(kube: KubeClient, namespace: str, service: str) -> list[Obj]:
    """The service's LeaderWorkerSets as they are now: their status (ready groups) is what
    Ready, rollouts and autoscaling count, and nothing else reports it."""
    return kube.list(*LEADER_WORKER_SET, namespace,
                     f"{SERVICE_LABEL}={label_value(service)},{MANAGED_BY_LABEL}={MANAGED_BY}")


def _groups_settling(live: list[Obj], desired: list[Obj]) -> bool:
    """A LeaderWorkerSet the operator wants has groups not yet created, updated or ready:
    judged against what this reconcile applied (`desired`), since `live` was read before."""
    by_name = {o["metadata"]["name"]: o for o in live}
    for want in desired:
        if want.get("kind") != LEADER_WORKER_SET[1]:
            continue
        lws = by_name.get(want["metadata"]["name"])
        if lws is None:
            return True  # created just now
        # An autoscaled set's replicas are the autoscaler's: the live spec says how many.
        wanted = want["spec"].get("replicas", lws.get("spec", {}).get("replicas", 1))
        status = lws.get("status") or {}
        if (status.get("readyReplicas", 0) < wanted or status.get("updatedReplicas", 0) < wanted
                or status.get("replicas", 0) != wanted):
            return True
    return False


def _read_activity(kube: KubeClient, namespace: str, service: str) -> ActivityReading:
    lease = kube.get("coordination.k8s.io/v1", "Lease", namespace, activity_lease_name(service))
    renewed = ((lease or {}).get("spec") or {}).get("renewTime")
    return ActivityReading(datetime.fromisoformat(renewed) if renewed else None)


def _write_status(kube: KubeClient, body: Obj, status: Obj, patch: Obj) -> None:
    """Status patch guarded by the resourceVersion it was decided from: rollout state must
    never be written from a stale read (409: a fresh event, or the retry, decides again)."""
    meta = body["metadata"]
    base = meta["resourceVersion"]
    written = kube.patch_merge(
        f"{GROUP}/{VERSION}", "GLMService", meta["namespace"], meta["name"],
        {"metadata": {"resourceVersion": base}, "status": patch}, "status")
    produced = written.get("metadata", {}).get("resourceVersion")
    if produced:
        with _written_lock:
            _written[(meta["namespace"], meta["name"])] = (base, produced, status)


def _count_status_change(old: Obj, new: Obj) -> None:
    for reason in {c["reason"] for c in new.get("conditions", [])
                   if c["type"] == "Planned" and c["status"] == "False"}:
        metrics.PLAN_FAILURES.labels(reason=reason).inc()
    for record in new.get("rolloutHistory") or []:
        if record in (old.get("rolloutHistory") or []):
            continue
        metrics.ROLLOUTS.labels(strategy=record.get("strategy", "surge"),
                                result=record.get("result", "")).inc()
    last = (new.get("rollout") or {}).get("lastAnalysis")
    if last and last != (old.get("rollout") or {}).get("lastAnalysis"):
        metrics.ANALYSIS_CHECKS.labels(verdict=last.get("verdict", "")).inc()


def _canary_analysis(config: OperatorConfig, service: GLMService,
                     now: datetime) -> AnalysisResult | None:
    """Query Prometheus when the canary's current step is due for a check, else None."""
    if service.status.rollout is None or service.status.rollout.strategy != "canary":
        return None
    policy, status = service.spec.rollout, service.status
    window = analysis_window(status.rollout, policy, status.stable_model_version,
                             service.spec.model_version, now)
    if window is None:
        return None
    url = config.prometheus.url
    if not url:
        return unavailable("no Prometheus to analyse the canary: set prometheus.url in the "
                           "operator config (helm value prometheus.url); promote with the "
                           f"{PROMOTE_ANNOTATION} annotation meanwhile", window, now)
    queries = canary_queries(service.metadata.namespace or "", service.metadata.name or "",
                             service.spec.model_version, window)
    try:
        values = {key: query_scalar(url, promql, config.prometheus.timeout_seconds)
                  for key, promql in queries.all().items()}
    except PrometheusError as exc:
        return unavailable(f"Prometheus did not answer, holding the step: {exc}"[:500],
                           window, now)
    return judge(gates(policy), values, window, now)


def reconcile_model_version(namespace: str, name: str, indexes: Mapping[str, Any], *,
                            coalesce: bool = False) -> None:
    """Reconcile one ModelVersion; `coalesce` for its own status events and its Jobs'."""
    _remember_indexes(indexes)
    _in_turn("ModelVersion", (namespace, f"{MODEL_VERSION_KEY}{name}"),
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
            corrected: list[str] = []
            _sync_children(rt.kube, body["metadata"]["uid"], decision.desired, children,
                           corrected=corrected)
            if decision.status_patch:
                # Guarded by resourceVersion: the fetch Job writes this status too.
                rt.kube.patch_merge(
                    f"{GROUP}/{VERSION}", "ModelVersion", namespace, name,
                    {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                     "status": decision.status_patch}, "status")
            _emit(rt.kube, body, [*decision.events, *_drift_events(corrected)])
        except KubeError as exc:
            metrics.RECONCILES.labels("ModelVersion", "error").inc()
            if exc.status == 409:
                return  # the fetcher wrote first; its write brings a fresh event
            if _namespace_terminating(exc):
                return
            if exc.status == 404:
                SWEEPER.request()  # the index showed something the API server has not
            raise _retry_later((namespace, f"{MODEL_VERSION_KEY}{name}"), exc) from exc
        metrics.RECONCILES.labels("ModelVersion", "ok").inc()


def _namespace_terminating(exc: KubeError) -> bool:
    """Writes into a namespace being deleted are refused; everything in it is going anyway."""
    return exc.status == 403 and "being terminated" in str(exc)


# --- objects deleted while a watch was cut off (relists.py) -----------------------------------


def _watched_kinds() -> tuple[WatchedKind, ...]:
    selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
    kinds = [WatchedKind(API_VERSION, "GLMService", "", ("glmservices",)),
             WatchedKind(API_VERSION, "ModelVersion", "", ("modelversions",))]
    children: dict[tuple[str, str], list[str]] = {}
    for (group, version, plural), name in [
            *zip(SERVICE_CRD_CHILDREN, SERVICE_CHILD_INDEXES, strict=True),
            *zip(MODEL_VERSION_CHILDREN, MODEL_CHILD_INDEXES, strict=True)]:
        children.setdefault((f"{group}/{version}" if group else version, plural), []).append(name)
    for (api_version, plural), names in children.items():
        kind = kind_by_plural(api_version, plural).kind
        kinds.append(WatchedKind(api_version, kind, selector, tuple(names)))
    return tuple(kinds)


def _live_uids(kind: WatchedKind) -> set[str]:
    return {uid for namespace in list_namespaces()
            for uid in runtime().kube.list_uids(kind.api_version, kind.kind, namespace,
                                                kind.label_selector)}


def _identity(entry: Cached) -> tuple[str, str, str]:
    return entry.namespace, entry.name, entry.uid


def _reconcile_owner(reconcile: Callable[..., None], namespace: str, name: str,
                     why: str) -> None:
    """An owner looks again after something its children did that no event said; a
    failure is logged (the next event or the resync looks again), never raised."""
    try:
        reconcile(namespace, name, dict(_latest_indexes), coalesce=True)
    except Exception as exc:
        log.warning("reconcile of %s/%s after %s failed: %s", namespace, name, why, exc)


def _ghosts_dropped(ghosts: list[Ghost]) -> None:
    """Counted and forgotten; the owners of dropped children look again, and what is missing
    is created again."""
    for ghost in ghosts:
        metrics.INDEX_GHOSTS.labels(kind=ghost.index).inc()
    RELISTS.forget({ghost.uid for ghost in ghosts})
    owners = {(g.index in MODEL_CHILD_INDEXES, g.key) for g in ghosts
              if g.index not in ("glmservices", "modelversions")}
    for of_model, (namespace, name) in sorted(owners):
        _reconcile_owner(reconcile_model_version if of_model else reconcile_service,
                         namespace, name, "dropping deleted children")


WATCHED_KINDS = _watched_kinds()
RELISTS = RelistDetector()
SWEEPER = Sweeper(WATCHED_KINDS, _live_uids, _identity, _ghosts_dropped)


def _register_relist_watch(kind: WatchedKind) -> None:
    group, _, version = kind.api_version.rpartition("/")
    plural = kind_of(kind.api_version, kind.kind).plural
    # A child listed again may have changed in the gap (a Deployment turned ready): its
    # owner looks again. The first listing is left to the owners' resume handlers.
    owners: list[tuple[str, Callable[..., None]]] = []
    if any(name in SERVICE_CHILD_INDEXES for name in kind.indexes):
        owners.append((SERVICE_LABEL, reconcile_service))
    if any(name in MODEL_CHILD_INDEXES for name in kind.indexes):
        owners.append((MODEL_VERSION_LABEL, reconcile_model_version))

    async def relist_watch(**kw: Any) -> None:
        _remember_indexes(kw)
        loop = asyncio.get_running_loop()
        SWEEPER.attach(loop, _latest_indexes)
        if not RELISTS.relisting(plural, kw["type"], kw["uid"]):
            return
        if SWEEPER.request():
            log.info("kopf lists %s again (its watch could not resume): looking for objects "
                     "deleted meanwhile", plural)
        for label, reconcile in owners:
            if owner := kw["labels"].get(label):
                loop.run_in_executor(None, _reconcile_owner, reconcile, kw["namespace"],
                                     owner, "a listing")

    labels = MANAGED if kind.label_selector else None
    kopf.on.event(group, version, plural, labels=labels, id=f"{plural}{WATCH_ID_SUFFIX}",
                  when=in_scope)(relist_watch)


for _kind in WATCHED_KINDS:
    _register_relist_watch(_kind)


# --- triggers -----------------------------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, "glmservices", when=in_scope)
@kopf.on.create(GROUP, VERSION, "glmservices", when=in_scope)
@kopf.on.update(GROUP, VERSION, "glmservices", when=in_scope)
def glmservice_changed(**kw: Any) -> None:
    WATCH.handled()
    reconcile_service(kw["namespace"], kw["name"], kw)


def resync_forever(interval: float, stop: threading.Event) -> None:
    """Backstop for anything a watch missed; writes nothing when nothing drifted.

    A plain thread instead of `kopf.timer`: kopf puts a finalizer on every object that has a
    timer, and a finalizer left behind by an uninstalled operator blocks namespace deletion.
    The GLMService needs none (its children go by ownerReferences).
    """
    while not stop.wait(interval):
        try:
            SWEEPER.sweep_from_thread(timeout=interval)
        except Exception as exc:  # the reconciles below still run on what is indexed
            log.warning("resync: the sweep for deleted objects failed: %s", exc)
        indexes = dict(_latest_indexes)
        services = indexes.get("glmservices")
        if services is None:
            continue
        keys = _copied(services)
        forget_optional_children({entry.uid for key in keys
                                  for entry in _copied(services.get(key) or ())})
        for namespace, name in keys:
            try:
                reconcile_service(namespace, name, indexes, coalesce=True)
            except Exception as exc:  # one bad object must not stop the resync of the rest
                log.warning("resync of GLMService %s/%s failed: %s", namespace, name, exc)


def _on_service_child(**kw: Any) -> None:
    owner = kw["labels"].get(SERVICE_LABEL)
    # Listing events (type None): the first listing is the owners' resume handlers' to
    # cover, a later one the relist watch's (above).
    if owner and kw["type"] is not None:
        reconcile_service(kw["namespace"], owner, kw, coalesce=True)


for _g, _v, _p in SERVICE_CRD_CHILDREN:
    kopf.on.event(_g, _v, _p, labels=MANAGED, id=f"{_p}-changed", when=in_scope)(
        _on_service_child)


@kopf.on.resume(GROUP, VERSION, "modelversions", when=in_scope)
@kopf.on.create(GROUP, VERSION, "modelversions", when=in_scope)
@kopf.on.update(GROUP, VERSION, "modelversions", when=in_scope)
def modelversion_changed(**kw: Any) -> None:
    WATCH.handled()
    reconcile_model_version(kw["namespace"], kw["name"], kw)


@kopf.on.event(GROUP, VERSION, "modelversions", when=in_scope)
def modelversion_event(**kw: Any) -> None:
    """A ModelVersion's status moved (the fetch Job reported): its services re-plan."""
    namespace, name = kw["namespace"], kw["name"]
    if kw["type"] is None:
        return
    if kw["type"] == "MODIFIED":
        reconcile_model_version(namespace, name, kw, coalesce=True)
    services = _namespace_objects(kw["glmservices"], namespace, mentioning=name)
    for service in services_using(name, services):
        reconcile_service(namespace, service, kw, coalesce=True)


@kopf.on.event("batch", "v1", "jobs", labels=MANAGED, when=in_scope)
def fetch_job_event(**kw: Any) -> None:
    owner = kw["labels"].get(MODEL_VERSION_LABEL)
    if owner and kw["type"] is not None:  # listing events: as for a service's children
        reconcile_model_version(kw["namespace"], owner, kw, coalesce=True)

