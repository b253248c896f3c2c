"""What both reconciles share: one reconcile per key at a time, retries, Events."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from glm_operator.controllers import metrics
from glm_operator.controllers.runtime import runtime
from glm_operator.kube.client import KubeClient, KubeError
from glm_operator.kube.events import event_for

MODEL_VERSION_KEY = "mv/"  # wakeup keys of ModelVersions: (namespace, "mv/<name>")

log = logging.getLogger("glm_operator")

Key = tuple[str, str]
Event = tuple[str, str, str]  # (type, reason, message)


def in_turn(kind: str, key: Key, work: Callable[[], None], coalesce: bool) -> None:
    """Run `work` for `key` unless one runs already; `coalesce`: fold into the one queued."""
    if not runtime().queue.run(key, work, coalesce=coalesce):
        metrics.RECONCILES.labels(kind, "coalesced").inc()


def retry_later(key: Key, exc: KubeError) -> kopf.TemporaryError:
    """A failed API call (the API server restarting, a timeout, a 5xx): look again in a few
    seconds. kopf retries its own create/update handlers, but not a reconcile started by a
    child's or a ModelVersion's event, so the wakeup thread is asked as well."""
    delay = 5.0
    runtime().wakeups.schedule(key, delay)
    return kopf.TemporaryError(f"API error: {exc}", delay=delay)


def namespace_terminating(exc: KubeError) -> bool:
    """Writes into a namespace being deleted are refused; everything in it is going anyway."""
    return exc.status == 403 and "being terminated" in str(exc)


def emit(kube: KubeClient, body: Mapping[str, Any], events: list[Event]) -> None:
    for type_, reason, message in events:
        try:
            kube.create(event_for(body, type_, reason, message))
        except KubeError as exc:  # an Event is a courtesy; the status already says it
            log.warning("could not post Event %s on %s/%s: %s", reason,
                        body["metadata"].get("namespace"), body["metadata"]["name"], exc)
