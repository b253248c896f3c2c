"""Reconciles that no watch event starts: asked for later (wakeups), the slow resync
backstop, and the owners of objects the sweep found deleted (relists.py). Each runs in a
thread of its own, outside kopf's handlers; `start` builds the runtime they share."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import cast

import kopf

from glm_operator.config import OperatorConfig
from glm_operator.controllers import metrics
from glm_operator.controllers.indexes import (
    MODEL_CHILD_INDEXES,
    OWNER_INDEXES,
    WATCHED_KINDS,
    copied,
    identity,
)
from glm_operator.controllers.reconcile import MODEL_VERSION_KEY
from glm_operator.controllers.reconcile_model_version import reconcile_model_version
from glm_operator.controllers.reconcile_service import reconcile_service
from glm_operator.controllers.relists import Ghost, Sweeper, WatchedKind
from glm_operator.controllers.runtime import Runtime, configure, runtime
from glm_operator.controllers.scope import list_namespaces
from glm_operator.controllers.secrets import watch_secrets
from glm_operator.controllers.wakeups import Wakeups
from glm_operator.kube.client import KubeClient
from glm_operator.planning.accelerators import AcceleratorProfile

log = logging.getLogger("glm_operator")

Key = tuple[str, str]


def start(kube: KubeClient, config: OperatorConfig,
          profiles: Mapping[str, AcceleratorProfile]) -> Runtime:
    """Build the runtime, make it the one the handlers use, and start the wakeup thread."""
    rt = Runtime(kube=kube, config=config, profiles=profiles, wakeups=Wakeups(_wake),
                 sweeper=Sweeper(WATCHED_KINDS, _live_uids, identity, _ghosts_dropped))
    configure(rt)
    threading.Thread(target=rt.wakeups.run, args=(threading.Event(),),
                     name="glm-wakeups", daemon=True).start()
    for kind, index in (("GLMService", "glmservices"), ("ModelVersion", "modelversions")):
        metrics.MANAGED_OBJECTS.labels(kind=kind).set_function(_index_size(rt, index))
    return rt


def _index_size(rt: Runtime, name: str) -> Callable[[], float]:
    return lambda: float(len(rt.indexes.get(name) or ()))


def _wake(key: Hashable) -> None:
    namespace, name = cast(Key, key)
    indexes = runtime().latest_indexes()
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
        runtime().wakeups.schedule(key, float(exc.delay or 5))
    except Exception as exc:  # the thread must outlive one bad reconcile
        log.warning("scheduled reconcile of %s %s/%s failed: %s", kind, namespace, name, exc)


def watch_secret_names(stop: threading.Event) -> None:
    """One thread per watch scope of Secret names (secrets.py), as kopf's own watches."""
    rt = runtime()
    for scope in list_namespaces():
        threading.Thread(target=watch_secrets,
                         args=(rt.kube, rt.secrets, scope, _secrets_changed, stop),
                         name=f"glm-secrets-{scope or 'all'}", daemon=True).start()


def _secrets_changed(namespace: str | None, names: frozenset[str] | None) -> None:
    """Secrets appeared or went (`names`), or a namespace's became known (None): the services
    that name them look again, through the wakeups (coalesced, off the watch's thread)."""
    services = runtime().latest_indexes().get("glmservices")
    if services is None:
        return  # nothing indexed yet: the resume handlers will look
    needles = ([json.dumps(n).encode() for n in names] if names is not None
               else [b'"apiKeysSecret"', b'"passwordSecret"'])
    for key in copied(services):
        if namespace is not None and key[0] != namespace:
            continue
        entries = copied(services.get(key) or ())
        if entries and any(needle in entries[0].json for needle in needles):
            runtime().wakeups.schedule(key, 0.0)


def resync_forever(interval: float, stop: threading.Event) -> None:
    """Backstop for anything a watch missed; writes nothing when nothing drifted.

    A plain thread instead of `kopf.timer`: kopf puts a finalizer on every object that has a
    timer, and a finalizer left behind by an uninstalled operator blocks namespace deletion.
    The GLMService needs none (its children go by ownerReferences).
    """
    while not stop.wait(interval):
        rt = runtime()
        try:
            rt.sweeper.sweep_from_thread(timeout=interval)
        except TimeoutError:  # it goes on in the operator's loop; the next one waits for it
            log.info("resync: the sweep for deleted objects takes longer than the %g s "
                     "resync interval; not waiting for it", interval)
        except Exception as exc:  # the reconciles below still run on what is indexed
            log.warning("resync: the sweep for deleted objects failed: %s: %s",
                        type(exc).__name__, exc)
        indexes = rt.latest_indexes()
        services = indexes.get("glmservices")
        if services is None:
            continue
        keys = copied(services)
        rt.optional.forget({entry.uid for key in keys
                            for entry in copied(services.get(key) or ())})
        for namespace, name in keys:
            try:
                reconcile_service(namespace, name, indexes, coalesce=True)
            except Exception as exc:  # one bad object must not stop the resync of the rest
                log.warning("resync of GLMService %s/%s failed: %s", namespace, name, exc)


def reconcile_owner(reconcile: Callable[..., None], namespace: str, name: str,
                    why: str) -> None:
    """An owner looks again after something its children did that no event said; a
    failure is logged (the next event or the resync looks again), never raised."""
    try:
        reconcile(namespace, name, runtime().latest_indexes(), coalesce=True)
    except Exception as exc:
        log.warning("reconcile of %s/%s after %s failed: %s", namespace, name, why, exc)


def _live_uids(kind: WatchedKind) -> set[str]:
    kube = runtime().kube
    return {uid for namespace in list_namespaces()
            for uid in kube.list_uids(kind.api_version, kind.kind, namespace,
                                      kind.label_selector)}


def _ghosts_dropped(ghosts: list[Ghost]) -> None:
    """Counted and forgotten; the owners of dropped children look again, and what is missing
    is created again."""
    for ghost in ghosts:
        metrics.INDEX_GHOSTS.labels(kind=ghost.index).inc()
    runtime().relists.forget({ghost.uid for ghost in ghosts})
    owners = {(g.index in MODEL_CHILD_INDEXES, g.key) for g in ghosts
              if g.index not in OWNER_INDEXES}
    for of_model, (namespace, name) in sorted(owners):
        reconcile_owner(reconcile_model_version if of_model else reconcile_service,
                        namespace, name, "dropping deleted children")
