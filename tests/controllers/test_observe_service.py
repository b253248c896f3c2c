"""The GLMService reconcile observes once (controllers/reconcile_service.py `observe_service`):
every API read happens while the observation is built, the namespace's ModelVersions are read
only when the wanted plan does not fit, and the pure decision then reads that value alone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from glm_operator.api import GLMService
from glm_operator.config import OperatorConfig
from glm_operator.controllers.indexes import cached
from glm_operator.controllers.reconcile_service import observe_service
from glm_operator.controllers.runtime import Runtime
from glm_operator.decide.service import decide_service, namespace_model_versions_needed
from test_service_state import CONFIG, load, ready_mv  # tests/controllers is on sys.path

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
Obj = dict[str, Any]


class RecordingKube:
    """Answers like a cluster serving no optional CRD and holding no optional child, and
    records every read."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, ...]] = []

    def crd_established(self, name: str, ttl_seconds: float = 60.0) -> bool:
        self.reads.append(("crd", name))
        return False

    def list(self, api_version: str, kind: str, namespace: str | None,
             selector: str | None = None) -> list[Obj]:
        self.reads.append(("list", kind))
        return []

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        self.reads.append(("get", kind, name))
        return None


def _runtime(kube: RecordingKube, config: OperatorConfig = CONFIG) -> Runtime:
    return Runtime(kube=kube, config=config, profiles=config.profiles,  # type: ignore[arg-type]
                   wakeups=None, sweeper=None)  # type: ignore[arg-type]


def _indexes(*model_versions: Obj) -> dict[str, Any]:
    by_key: dict[tuple[str, str], list[Any]] = {}
    for mv in model_versions:
        meta = mv["metadata"]
        by_key.setdefault((meta["namespace"], meta["name"]), []).append(cached(mv))
    return {"modelversions": by_key}


def _sibling(mv: Obj, name: str, namespace: str = "ns") -> Obj:
    other = ready_mv(mv, name)
    other["metadata"]["namespace"] = namespace
    return other


def _observe(svc: Obj, indexes: dict[str, Any]) -> tuple[Any, RecordingKube]:
    kube = RecordingKube()
    service = GLMService.model_validate(svc)
    key = (svc["metadata"]["namespace"], svc["metadata"]["name"])
    return observe_service(_runtime(kube), key, svc, service, [], indexes, NOW), kube


def test_a_fitting_service_is_observed_without_the_namespaces_model_versions() -> None:
    mv, svc = load("cpu-llamacpp")
    indexes = _indexes(ready_mv(mv), _sibling(mv, "other"))
    observation, kube = _observe(svc, indexes)
    assert set(observation.model_versions) == {mv["metadata"]["name"]}
    assert observation.namespace_model_versions is None
    assert observation.now == NOW and observation.service.metadata.name == svc["metadata"]["name"]
    reads = len(kube.reads)
    decision = decide_service(observation, CONFIG, CONFIG.profiles)
    assert decision.desired  # it fits and renders
    assert len(kube.reads) == reads  # the decision reads nothing


def test_an_infeasible_plan_observes_the_namespaces_model_versions_for_its_advice() -> None:
    mv, svc = load("nvidia-a10-llamacpp")
    svc["spec"].update(contextLength=131072, concurrency=16)
    service = GLMService.model_validate(svc)
    wanted = {mv["metadata"]["name"]: ready_mv(mv)}
    assert namespace_model_versions_needed(service, wanted, CONFIG.profiles, CONFIG)
    indexes = _indexes(ready_mv(mv), _sibling(mv, "other"), _sibling(mv, "elsewhere", "ns2"))
    observation, _ = _observe(svc, indexes)
    assert set(observation.namespace_model_versions or {}) == {mv["metadata"]["name"], "other"}
    planned = next(c for c in decide_service(observation, CONFIG, CONFIG.profiles).status.conditions
                   if c.type == "Planned")
    assert planned.status == "False" and planned.reason == "Infeasible"


def test_a_fitting_plan_needs_no_other_model_version() -> None:
    mv, svc = load("cpu-llamacpp")
    service = GLMService.model_validate(svc)
    assert not namespace_model_versions_needed(service, {mv["metadata"]["name"]: ready_mv(mv)},
                                               CONFIG.profiles, CONFIG)
    assert not namespace_model_versions_needed(service, {}, CONFIG.profiles, CONFIG)
