"""The `kubernetes.io/arch` pin of every pod the operator renders (pure).

A pod goes only to nodes of an architecture that its nodes (the accelerator profile's
`architectures`; any we know for the router, the picker and the fetch Job) and every one of
its images have (planning/architectures.py). The pin is rendered even when it lists both
architectures we build for: a ppc64le or s390x node has no build of any of our images.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from glm_operator.api.glmservice import GLMService
from glm_operator.config import OperatorConfig
from glm_operator.planning.architectures import (
    ARCH_LABEL,
    ARCHITECTURES,
    ArchitectureFit,
    pod_architectures,
)
from glm_operator.planning.planner import Plan

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def engine_image_of(service: GLMService, plan: Plan) -> str:
    """The engine container's image: spec.podOverrides.image, else the profile's for the
    engine."""
    overrides = service.spec.pod_overrides
    if overrides is not None and overrides.image:
        return overrides.image
    return plan.profile.images[plan.request.engine]


def pool_images(service: GLMService, plan: Plan, config: OperatorConfig) -> tuple[str, ...]:
    """The images of a pool's pods: the engine's, and ours (the gateway sidecar, a group
    leader's wait-tcp init)."""
    return (engine_image_of(service, plan), config.operator_image)


def pool_architectures(service: GLMService, plan: Plan, config: OperatorConfig) -> ArchitectureFit:
    return pod_architectures(plan.profile.architectures, pool_images(service, plan, config),
                             config.image_architecture_table,
                             nodes=f"the nodes of accelerator profile {plan.profile.name}")


def component_architectures(image: str, config: OperatorConfig) -> tuple[str, ...]:
    """A pod of one of our images that needs no accelerator (the router, the endpoint picker,
    the fetch Job): whichever architectures the image has a build for. Never empty:
    imageArchitectures lists at least one architecture we know for every image it names."""
    fit = pod_architectures(ARCHITECTURES, (image,), config.image_architecture_table,
                            nodes="the cluster's nodes")
    return fit.architectures


def arch_expression(architectures: Sequence[str]) -> dict[str, Any]:
    return {"key": ARCH_LABEL, "operator": "In", "values": list(architectures)}


def pin_architectures(affinity: dict[str, Any] | None,
                      architectures: Sequence[str]) -> dict[str, Any]:
    """`affinity` with `kubernetes.io/arch In architectures` ANDed into every required node
    selector term (terms are ORed: a term without it would let the pod onto a node that
    cannot run its images), or one term of it alone when nothing is required. A copy:
    the input (a user's spec.podOverrides.affinity) is never changed."""
    out = copy.deepcopy(affinity) if affinity else {}
    node = out.setdefault("nodeAffinity", {})
    required = node.get(REQUIRED) or {}
    terms = [dict(term) for term in required.get("nodeSelectorTerms") or []] or [{}]
    for term in terms:
        term["matchExpressions"] = [*(term.get("matchExpressions") or []),
                                    arch_expression(architectures)]
    node[REQUIRED] = {**required, "nodeSelectorTerms": terms}
    return out


def component_affinity(image: str, config: OperatorConfig) -> dict[str, Any]:
    """The affinity of a router, picker or fetch Job pod: its image's architectures."""
    return pin_architectures(None, component_architectures(image, config))
