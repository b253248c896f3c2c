"""What the inference gateway said about a GLMService's InferencePools (pure).

A gateway that implements the Inference Extension writes, on each pool an HTTPRoute of its
sends to it, one status entry per parent Gateway with two conditions: `Accepted` (it takes
the pool as a backend) and `ResolvedRefs` (it found the pool's endpoint picker). The
operator reads its pools at every reconcile of such a service (they are not watched: their
CRD may come and go, controllers/apply.py) and reports the gateway's own words in the
GatewayAccepted condition; until every pool is accepted it looks again every
GATEWAY_POLL_SECONDS, since nothing else would tell it that the gateway has answered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from glm_operator.api import GLMServiceConditionType, get_condition
from glm_operator.api.conditions import Condition

GATEWAY_POLL_SECONDS = 15.0
POOL_CONDITIONS = ("Accepted", "ResolvedRefs")


@dataclass(frozen=True)
class GatewayFacts:
    """spec.routing.mode InferenceGateway, as one reconcile found it."""

    gateway: str  # namespace/name of spec.routing.gatewayRef
    missing_crds: tuple[str, ...]  # of INFERENCE_GATEWAY_CRDS, not served
    observed: tuple[Mapping[str, Any], ...]  # the service's InferencePools as read
    pools: tuple[str, ...] = ()  # the pools this reconcile wants (one per routed version)


def _our_parent(entry: Mapping[str, Any], gateway: str, namespace: str) -> bool:
    ref = entry.get("parentRef") or {}
    if ref.get("kind", "Gateway") != "Gateway":
        return False
    return f"{ref.get('namespace') or namespace}/{ref.get('name')}" == gateway


def pool_acceptance(facts: GatewayFacts) -> tuple[bool | None, str, str]:
    """GatewayAccepted: True when the gateway accepted every wanted pool and resolved its
    picker; False with the gateway's reason and message for the first pool it refused;
    Unknown while it has not written about one (a new pool, or no gateway of that name)."""
    by_name = {p["metadata"]["name"]: p for p in facts.observed}
    pending = []
    for name in facts.pools:
        pool = by_name.get(name)
        namespace = (pool or {}).get("metadata", {}).get("namespace", "")
        entries = [e for e in ((pool or {}).get("status") or {}).get("parents") or []
                   if _our_parent(e, facts.gateway, namespace)]
        conditions = {c.get("type"): c for e in entries for c in e.get("conditions") or []}
        for type_ in POOL_CONDITIONS:
            condition = conditions.get(type_)
            if condition is None or condition.get("status") == "Unknown":
                pending.append(name)
                break
            if condition.get("status") == "False":
                reason = condition.get("reason") or f"Not{type_}"
                return (False, reason, f"InferencePool {name}: Gateway {facts.gateway} "
                        f"says {type_}=False ({reason}): {condition.get('message') or ''}")
    if pending:
        return (None, "Pending", f"waiting for Gateway {facts.gateway} to accept "
                f"InferencePool {', '.join(pending)} (no Accepted and ResolvedRefs from it "
                "yet: is the Gateway there, and its inference extension on?)")
    return (True, "Accepted", f"Gateway {facts.gateway} accepted InferencePool "
            f"{', '.join(facts.pools)} and resolved their endpoint pickers")


def gateway_poll(conditions: Sequence[Condition], facts: GatewayFacts | None) -> float | None:
    """How soon to read the pools again: while the gateway has not accepted them all."""
    if facts is None or facts.missing_crds:
        return None
    accepted = get_condition(conditions, GLMServiceConditionType.GATEWAY_ACCEPTED)
    return None if accepted is not None and accepted.status == "True" else GATEWAY_POLL_SECONDS
