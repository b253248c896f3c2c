"""One ModelVersion's reconcile: observe -> decide (decide/model_version.py) -> apply ->
status. The fetch Job writes this status too: the operator's patch is guarded by the
resourceVersion it decided from, and a conflict waits for the Job's write to come back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from glm_operator.controllers import metrics
from glm_operator.controllers.apply import drift_events, sync_children
from glm_operator.controllers.indexes import MODEL_CHILD_INDEXES, children, lookup
from glm_operator.controllers.reconcile import (
    MODEL_VERSION_KEY,
    emit,
    in_turn,
    namespace_terminating,
    retry_later,
)
from glm_operator.controllers.runtime import runtime
from glm_operator.decide.model_version import decide_model_version
from glm_operator.kube.client import KubeError
from glm_operator.wellknown import GROUP, VERSION


def reconcile_model_version(namespace: str, name: str, indexes: Mapping[str, Any], *,
                            coalesce: bool = False) -> None:
    """Reconcile one ModelVersion; `coalesce` for its own status events and its Jobs'."""
    runtime().remember_indexes(indexes)
    in_turn("ModelVersion", (namespace, f"{MODEL_VERSION_KEY}{name}"),
            lambda: _reconcile_model_version(namespace, name, indexes), coalesce)


def _reconcile_model_version(namespace: str, name: str, indexes: Mapping[str, Any]) -> None:
    rt = runtime()
    with metrics.RECONCILE_SECONDS.labels("ModelVersion").time():
        bodies = lookup(indexes["modelversions"], (namespace, name))
        if not bodies or bodies[0]["metadata"].get("deletionTimestamp"):
            return
        body = bodies[0]
        live = children(indexes, MODEL_CHILD_INDEXES, (namespace, name))
        try:
            decision = decide_model_version(body, live, rt.config)
            corrected: list[str] = []
            sync_children(rt.kube, body["metadata"]["uid"], decision.desired, live, rt.optional,
                          corrected=corrected)
            if decision.status_patch:
                rt.kube.patch_merge(
                    f"{GROUP}/{VERSION}", "ModelVersion", namespace, name,
                    {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                     "status": decision.status_patch}, "status")
            emit(rt.kube, body, [*decision.events, *drift_events(corrected)])
        except KubeError as exc:
            metrics.RECONCILES.labels("ModelVersion", "error").inc()
            if exc.status == 409:
                return  # the fetcher wrote first; its write brings a fresh event
            if namespace_terminating(exc):
                return
            if exc.status == 404:
                rt.sweeper.request()  # the index showed something the API server has not
            raise retry_later((namespace, f"{MODEL_VERSION_KEY}{name}"), exc) from exc
        metrics.RECONCILES.labels("ModelVersion", "ok").inc()
