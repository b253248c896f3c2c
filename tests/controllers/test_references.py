"""decide_service on the Secrets a GLMService names (ResolvedRefs) and on who it serves
(OpenAccess): pure, from what the operator's watch of Secret names says."""

from __future__ import annotations

import copy
from typing import Any

from glm_operator.api import ADMITTED, API_VERSION, GLMService
from glm_operator.api.conversion import convert
from glm_operator.config import OperatorConfig
from glm_operator.decide.observed import ServiceObservation
from glm_operator.decide.references import (
    UNOBSERVED,
    SecretsObserved,
    resolve_references,
    secret_references,
)
from glm_operator.decide.service import ServiceDecision, decide_service
from glm_operator.render.service import Capabilities
from test_service_state import as_ready, cond, deployments, load, ready_mv

CONFIG = OperatorConfig()
STORE = {"redis": {"address": "redis.cache.svc:6379",
                   "passwordSecret": {"name": "redis-auth", "key": "password"}}}


def decide(svc: dict[str, Any], mvs: list[dict[str, Any]], secrets: SecretsObserved,
           live: list[dict[str, Any]] | None = None) -> ServiceDecision:
    service = GLMService.model_validate(svc, context={ADMITTED: True})
    return decide_service(ServiceObservation(
        service=service, model_versions={m["metadata"]["name"]: m for m in mvs},
        live=live or [], capabilities=Capabilities(), secrets=secrets), CONFIG, CONFIG.profiles)


def with_status(svc: dict[str, Any], decision: ServiceDecision) -> dict[str, Any]:
    """The service as the next reconcile reads it: with the status this one wrote."""
    out = copy.deepcopy(svc)
    out["status"] = decision.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    return out


def keyed_service() -> tuple[dict[str, Any], dict[str, Any]]:
    mv, svc = load("nvidia-a10-llamacpp")  # apiKeysSecret: glm-chat-api-keys
    return ready_mv(mv), svc


def test_a_missing_key_secret_is_named_with_its_namespace_and_the_fix() -> None:
    mv, svc = keyed_service()
    decision = decide(svc, [mv], SecretsObserved(known=True))
    refs = cond(decision, "ResolvedRefs")
    assert (refs.status, refs.reason) == ("False", "SecretNotFound")
    for part in ("Secret glm-chat-api-keys", "spec.gateway.apiKeysSecret", "namespace ns",
                 "kubectl create secret generic glm-chat-api-keys -n ns"):
        assert part in refs.message, refs.message
    # Nothing serves yet: Ready says why, with the same words.
    ready = cond(decision, "Ready")
    assert (ready.status, ready.reason, ready.message) == ("False", "SecretNotFound",
                                                           refs.message)
    # The pods are rendered all the same: the kubelet starts them once the Secret exists.
    assert len(deployments(decision.desired)) == 1
    assert [e for e in decision.events if e[1] == "SecretNotFound"] == [
        ("Warning", "SecretNotFound", refs.message)]


def test_the_warning_event_comes_once_and_the_condition_clears_when_the_secret_exists(
        ) -> None:
    mv, svc = keyed_service()
    first = decide(svc, [mv], SecretsObserved(known=True))
    again = decide(with_status(svc, first), [mv], SecretsObserved(known=True))
    assert cond(again, "ResolvedRefs").status == "False"
    assert not [e for e in again.events if e[1] == "SecretNotFound"]  # no Event per reconcile
    found = decide(with_status(svc, again), [mv],
                   SecretsObserved(known=True, present=frozenset({"glm-chat-api-keys"})))
    refs = cond(found, "ResolvedRefs")
    assert (refs.status, refs.reason) == ("True", "SecretsFound")
    assert "glm-chat-api-keys" in refs.message
    assert cond(found, "Ready").reason == "PodsNotReady"


def test_a_serving_version_stays_ready_while_its_secret_is_missing() -> None:
    mv, svc = keyed_service()
    [deployment] = deployments(decide(svc, [mv], SecretsObserved(known=True)).desired)
    decision = decide(svc, [mv], SecretsObserved(known=True), [as_ready(deployment)])
    assert cond(decision, "Ready").status == "True"  # running pods kept the mounted keys
    assert cond(decision, "ResolvedRefs").status == "False"


def test_unknown_while_the_operator_cannot_see_secrets() -> None:
    mv, svc = keyed_service()
    decision = decide(svc, [mv], UNOBSERVED)
    refs = cond(decision, "ResolvedRefs")
    assert (refs.status, refs.reason) == ("Unknown", "SecretsNotObserved")
    assert "glm-chat-api-keys" in refs.message
    assert cond(decision, "Ready").reason == "PodsNotReady"  # no guess either way


def test_the_rate_limit_stores_password_secret_counts_too() -> None:
    # The store is the cluster's (operator config), its password Secret the service's
    # namespace's, as the gateway pods read it.
    _, svc = keyed_service()
    config = OperatorConfig.model_validate({"rateLimitStore": STORE})
    service = GLMService.model_validate(svc)
    assert [r.name for r in secret_references(service, config)] == [
        "glm-chat-api-keys", "redis-auth"]
    assert [r.name for r in secret_references(service, OperatorConfig())] == [
        "glm-chat-api-keys"]
    verdict = resolve_references(service, SecretsObserved(
        known=True, present=frozenset({"glm-chat-api-keys"})), config)
    assert verdict.ok is False
    assert "Secret redis-auth" in verdict.message and "glm-chat-api-keys" not in verdict.message
    assert "--from-literal=password=<password>" in verdict.message
    assert "rateLimitStore.redis.passwordSecret" in verdict.message


def test_a_v1alpha1_services_own_store_is_kept_through_conversion() -> None:
    _, svc = keyed_service()
    spec = {k: v for k, v in svc["spec"].items() if k != "engine"}
    old = {**svc, "apiVersion": "serving.glm-operator.dev/v1alpha1",
           "spec": {**spec, "gateway": {**svc["spec"]["gateway"], "rateLimit": {
               **svc["spec"]["gateway"]["rateLimit"], "store": STORE}}}}
    service = GLMService.model_validate(convert(old, API_VERSION))
    assert [r.name for r in secret_references(service, OperatorConfig())] == [
        "glm-chat-api-keys", "redis-auth"]


def test_open_access_is_a_warning_condition_and_an_event_once() -> None:
    mv, svc = load("cpu-llamacpp")  # access: Open
    decision = decide(svc, [ready_mv(mv)], SecretsObserved(known=True))
    open_ = cond(decision, "OpenAccess")
    assert (open_.status, open_.reason) == ("True", "AccessOpen")
    assert "serves anyone" in open_.message and "apiKeysSecret" in open_.message
    assert ("Warning", "AccessOpen", open_.message) in decision.events
    refs = cond(decision, "ResolvedRefs")
    assert (refs.status, refs.reason) == ("True", "NoSecretReferences")
    again = decide(with_status(svc, decision), [ready_mv(mv)], SecretsObserved(known=True))
    assert not [e for e in again.events if e[0] == "Warning"]


def test_keys_close_the_endpoint() -> None:
    mv, svc = keyed_service()
    present = SecretsObserved(known=True, present=frozenset({"glm-chat-api-keys"}))
    open_ = cond(decide(svc, [mv], present), "OpenAccess")
    assert (open_.status, open_.reason) == ("False", "APIKeys")


def test_a_service_admitted_before_the_choice_was_required_is_open_and_told_so() -> None:
    mv, svc = load("cpu-llamacpp")
    del svc["spec"]["gateway"]  # as stored before spec.gateway.access existed
    decision = decide(svc, [ready_mv(mv)], SecretsObserved(known=True))
    open_ = cond(decision, "OpenAccess")
    assert (open_.status, open_.reason) == ("True", "AccessNotChosen")
    assert "refuses its next change" in open_.message
    assert len(deployments(decision.desired)) == 1  # it keeps serving as before


def test_while_the_view_of_secrets_is_listing_again_the_last_answer_stands() -> None:
    """A restart: the resume reconciles run before the first listing of Secret names; the
    condition must not flap to Unknown and back (two status writes per service)."""
    mv, svc = keyed_service()
    found = decide(svc, [mv], SecretsObserved(known=True,
                                              present=frozenset({"glm-chat-api-keys"})))
    restarted = decide(with_status(svc, found), [mv], UNOBSERVED)
    assert cond(restarted, "ResolvedRefs") == cond(found, "ResolvedRefs")
