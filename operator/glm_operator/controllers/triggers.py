"""Every kopf registration of the operator: its indexes and the events that start a reconcile.
Importing this module registers them (controllers/cli.py does); the handler ids are
persisted by kopf (progress annotations) and pinned by the chart's RBAC tests.

A reconcile is started by the object's own changes, by any change of its children or
ModelVersion (so status follows pods becoming ready, and a deleted child comes back at
once), by a later listing of a kind whose watch could not resume (relists.py), and by the
threads of scheduled.py: wakeups and a slow resync as a backstop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import kopf

from glm_operator.controllers.handling_watch import WATCH
from glm_operator.controllers.indexes import (
    MANAGED,
    MODEL_CHILD_INDEXES,
    MODEL_VERSION_CHILDREN,
    SERVICE_CHILD_INDEXES,
    SERVICE_CRD_CHILDREN,
    WATCHED_KINDS,
    Cached,
    Key,
    cached,
    child_entry,
    namespace_objects,
)
from glm_operator.controllers.reconcile_model_version import reconcile_model_version
from glm_operator.controllers.reconcile_service import reconcile_service
from glm_operator.controllers.relists import WATCH_ID_SUFFIX, WatchedKind
from glm_operator.controllers.runtime import runtime
from glm_operator.controllers.scheduled import reconcile_owner
from glm_operator.controllers.scope import in_scope
from glm_operator.decide.model_version import services_using
from glm_operator.kube.resources import kind_of
from glm_operator.render.names import MODEL_VERSION_LABEL, SERVICE_LABEL
from glm_operator.wellknown import GROUP, VERSION

log = logging.getLogger("glm_operator")

_Handler = Callable[..., None]


# --- indexes (indexes.py) -----------------------------------------------------------------------


@kopf.index(GROUP, VERSION, "glmservices", when=in_scope)
def glmservices(**kw: Any) -> dict[Key, Cached]:
    WATCH.indexed(kw["body"])
    return {(kw["namespace"], kw["name"]): cached(kw["body"])}


@kopf.index(GROUP, VERSION, "modelversions", when=in_scope)
def modelversions(**kw: Any) -> dict[Key, Cached]:
    WATCH.indexed(kw["body"])
    return {(kw["namespace"], kw["name"]): cached(kw["body"])}


def _register_child_index(group: str, version: str, plural: str, label: str, name: str) -> None:
    def index(**kw: Any) -> dict[Key, Cached] | None:
        return child_entry(kw["labels"], kw["namespace"], kw["body"], label)

    index.__name__ = name
    kopf.index(group, version, plural, labels=MANAGED, id=name, when=in_scope)(index)


for (_g, _v, _p), _name in zip(SERVICE_CRD_CHILDREN, SERVICE_CHILD_INDEXES, strict=True):
    _register_child_index(_g, _v, _p, SERVICE_LABEL, _name)
for (_g, _v, _p), _name in zip(MODEL_VERSION_CHILDREN, MODEL_CHILD_INDEXES, strict=True):
    _register_child_index(_g, _v, _p, MODEL_VERSION_LABEL, _name)


# --- objects deleted while a watch was cut off (relists.py) -----------------------------------


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
        rt = runtime()
        rt.remember_indexes(kw)
        loop = asyncio.get_running_loop()
        rt.sweeper.attach(loop, rt.indexes)
        if not rt.relists.relisting(plural, kw["type"], kw["uid"]):
            return
        if rt.sweeper.request():
            log.info("kopf lists %s again (its watch could not resume): looking for objects "
                     "deleted meanwhile", plural)
        for label, reconcile in owners:
            if owner := kw["labels"].get(label):
                loop.run_in_executor(None, reconcile_owner, reconcile, kw["namespace"],
                                     owner, "a listing")

    labels = MANAGED if kind.label_selector else None
    kopf.on.event(group, version, plural, labels=labels, id=f"{plural}{WATCH_ID_SUFFIX}",
                  when=in_scope)(relist_watch)


for _kind in WATCHED_KINDS:
    _register_relist_watch(_kind)


# --- reconciles ---------------------------------------------------------------------------------


def _on_change(plural: str) -> Callable[[_Handler], _Handler]:
    """`on.resume`, `on.create` and `on.update` of one of our kinds, stacked on one function
    (level-triggered: each runs the whole reconcile)."""
    def register(handler: _Handler) -> _Handler:
        for on in (kopf.on.update, kopf.on.create, kopf.on.resume):
            on(GROUP, VERSION, plural, when=in_scope)(handler)  # returns the handler as is
        return handler
    return register


@_on_change("glmservices")
def glmservice_changed(**kw: Any) -> None:
    WATCH.handled()
    reconcile_service(kw["namespace"], kw["name"], kw)


def _on_service_child(**kw: Any) -> None:
    owner = kw["labels"].get(SERVICE_LABEL)
    # Listing events (type None): the first listing is the owners' resume handlers' to
    # cover, a later one the relist watch's (above).
    if owner and kw["type"] is not None:
        reconcile_service(kw["namespace"], owner, kw, coalesce=True)


for _g, _v, _p in SERVICE_CRD_CHILDREN:
    kopf.on.event(_g, _v, _p, labels=MANAGED, id=f"{_p}-changed", when=in_scope)(
        _on_service_child)


@_on_change("modelversions")
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
    services = namespace_objects(kw["glmservices"], namespace, mentioning=name)
    for service in services_using(name, services):
        reconcile_service(namespace, service, kw, coalesce=True)


@kopf.on.event("batch", "v1", "jobs", labels=MANAGED, when=in_scope)
def fetch_job_event(**kw: Any) -> None:
    owner = kw["labels"].get(MODEL_VERSION_LABEL)
    if owner and kw["type"] is not None:  # listing events: as for a service's children
        reconcile_model_version(kw["namespace"], owner, kw, coalesce=True)
